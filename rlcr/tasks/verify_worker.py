"""The worker process of :class:`rlcr.tasks.verify.BoundedVerifier` (run by it, never imported by a run).

Started as ``python -c <this file's source> <function> <sys.path as JSON> <memory bytes>``: it imports only the
standard library and the verifier function (``module:name``), under an address-space limit. Protocol, one line
each way per call: the parent writes ``{"args": [...], "deadline": seconds}``; the worker answers
``{"r": <result>}``, ``t`` (its timer fired: out of time, nothing decided) or ``e`` (the function raised, or its
result is not JSON). It starts by writing ``ready`` (or ``e`` when the function cannot be imported). Its own
real-time timer raises an exception that is not an ``Exception``, so a library's ``except Exception`` does not
swallow it; the parent's deadline and kill bound what the timer cannot stop. It exits at end of input.
"""

import importlib
import json
import logging
import os
import resource
import signal
import sys

MIN_DEADLINE_S = 0.001


class Deadline(BaseException):
    """The call's timer fired."""


def _alarm(signum, frame):
    raise Deadline


def _limit_memory(limit: int) -> None:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout = sys.stderr  # the function's prints cannot corrupt the protocol
    logging.disable(logging.CRITICAL)
    target, path, limit = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    sys.path[:] = [p for p in path if isinstance(p, str)]
    _limit_memory(limit)
    try:
        module, _, name = target.partition(":")
        function = importlib.import_module(module)
        for part in name.split("."):
            function = getattr(function, part)
    except BaseException:  # noqa: BLE001  (the parent says the function cannot be imported)
        out.write("e\n")
        return
    signal.signal(signal.SIGALRM, _alarm)
    out.write("ready\n")
    for line in sys.stdin:
        try:
            request = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, max(float(request["deadline"]), MIN_DEADLINE_S))
            try:
                result = function(*request["args"])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            reply = json.dumps({"r": result}) + "\n"
        except Deadline:
            reply = "t\n"
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001  (MemoryError, RecursionError, whatever the function raises)
            reply = "e\n"
        out.write(reply)


if __name__ == "__main__":
    main()
