"""The math verifier's worker process (run by ``rlcr.tasks.math_verifier``, never imported by a run).

Started as ``python -I -c <this file's source>``, in a session of its own: isolated, so neither the working
directory nor ``PYTHONPATH`` can shadow a module (``rlcr/tasks/math.py`` would shadow the standard ``math``). It
imports only the standard library and ``math_verify``. The channel (:mod:`rlcr.tasks.worker_process`): its first
line of input is the parent's nonce; it then moves the pipes off file descriptors 0 and 1 (``/dev/null`` from then
on), so nothing a library prints or writes to fd 1 from C reaches the parent. Protocol, one line each way per
request:

* the parent writes ``{"gold": str, "answer": str, "deadline": seconds}`` as one JSON line;
* the worker answers ``<nonce> <n> <payload>`` (``n`` counts the requests, 0 for its first line) with ``1``
  (equivalent), ``0`` (not, or unparseable), ``t`` (its timer fired: out of time, nothing decided) or ``e``
  (an error in the worker).

It starts by answering ``ready``. It runs on its own main thread with its own real-time timer
(``setitimer``) over the whole request: the gold's parse, the answer's parse and their comparison.
The timer raises an exception that is not an ``Exception``, which math-verify's handlers (they turn
its own timeouts into ``[]`` and ``False``, indistinguishable from "parsed to nothing") do not catch;
math-verify's own timeouts are off. A gold parse is cached only when it finished. The parent's deadline
and kill bound a computation the timer cannot stop, and an address-space limit bounds its memory.
Logging is off: math-verify logs the text it failed on, and model output must not reach a log
unfiltered. At end of input (the parent closed the pipe or died) it kills its process group and itself.
"""

import json
import logging
import os
import resource
import signal
import sys

MEMORY_LIMIT_BYTES = 2 * 1024**3
GOLD_CACHE = 2048
MIN_DEADLINE_S = 0.001


class Deadline(BaseException):
    """The request's timer fired (a BaseException: library ``except Exception`` handlers let it through)."""


def _alarm(signum, frame):
    raise Deadline


def _limit_memory() -> None:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass


def _channel():
    """(requests, replies, nonce): the parent's pipes moved to descriptors no child inherits, 0 and 1 on
    ``/dev/null``, and the nonce every reply line starts with."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")  # os.dup: not inheritable
    replies = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    sys.stdout = sys.stderr  # /dev/null as well (the parent's stderr=DEVNULL)
    return requests, replies, requests.readline().strip()


def main() -> None:
    requests, replies, nonce = _channel()
    try:
        _serve(requests, replies, nonce)
    finally:
        if os.getpgid(0) == os.getpid():  # what a library started dies with the worker
            os.killpg(0, signal.SIGKILL)


def _serve(requests, replies, nonce: str) -> None:
    logging.disable(logging.CRITICAL)
    _limit_memory()
    from math_verify import parse, verify  # noqa: PLC0415

    def parsed(text):
        return parse("$" + text + "$", parsing_timeout=None)

    golds = {}

    def decide(request):
        gold = golds.get(request["gold"])
        if gold is None:
            gold = parsed(request["gold"])  # kept below only once it finished
            if len(golds) >= GOLD_CACHE:
                golds.clear()
            golds[request["gold"]] = gold
        answer = parsed(request["answer"])
        return bool(gold) and bool(answer) and verify(gold, answer, timeout_seconds=None)

    verify(parsed("\\frac{1}{2}"), parsed("0.5"), timeout_seconds=None)  # lazy set-up before any deadline runs
    signal.signal(signal.SIGALRM, _alarm)
    replies.write(f"{nonce} 0 ready\n")
    for n, line in enumerate(requests, start=1):
        try:
            request = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, max(float(request["deadline"]), MIN_DEADLINE_S))
            try:
                reply = "1" if decide(request) else "0"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except Deadline:
            reply = "t"
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001  (MemoryError, whatever sympy raises)
            reply = "e"
        replies.write(f"{nonce} {n} {reply}\n")


if __name__ == "__main__":
    main()
