"""Verifier functions for tests/test_task_plugins.py, run by rlcr.tasks.verify.BoundedVerifier's worker: a
well-behaved one and hostile ones (never returns, allocates without bound, slow only the first time)."""

import os
import time


def same(answer, gold):
    return str(answer).strip() == str(gold)


def sleep_forever(answer, gold):
    while True:
        time.sleep(3600)


def spin_in_c(answer, gold):
    return sum(range(10**15))  # one C-level loop that checks no signals: its timer cannot stop it, only the kill


def allocate(answer, gold):
    blocks = []
    while True:
        blocks.append(bytearray(64 * 1024**2))


def slow_once(flag, gold):
    """Sleeps forever while the file ``flag`` does not exist, then answers: a timeout must not be cached."""
    if not os.path.exists(flag):
        sleep_forever(flag, gold)
    return True


def raises(answer, gold):
    raise RuntimeError("a bug in the verifier")
