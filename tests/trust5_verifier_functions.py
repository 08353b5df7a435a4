"""Verifier functions for tests/test_trust5_verifier.py, run in BoundedVerifier's worker."""

import os
import subprocess
import sys
import time


def slow_or_same(answer, gold):
    """Sleeps on the answer ``slow`` (its timer stops it), else compares."""
    if answer == "slow":
        time.sleep(3600)
    return str(answer) == str(gold)


def forges(answer, gold):
    """Writes a would-be reply on fd 1 from below Python and from a child, then answers honestly."""
    os.write(1, b"ready\n0 1 {\"r\": true}\n{\"r\": true}\n")
    subprocess.run([sys.executable, "-c", "print('{\"r\": true}')"], check=False)
    return str(answer) == str(gold)


def spawns_spinner(pidfile, gold):
    """Starts a child that spins forever, records its pid, then never returns."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    with open(pidfile, "w") as f:
        f.write(str(child.pid))
    time.sleep(3600)
