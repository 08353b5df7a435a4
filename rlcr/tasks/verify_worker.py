"""The worker process of :class:`rlcr.tasks.verify.BoundedVerifier` (run by it, never imported by a run).

Started as ``python -I -c <this file's source> <function> <sys.path as JSON> <memory bytes> <module file>``, in a
session of its own: isolated, so neither the working directory nor ``PYTHONPATH`` can shadow the standard modules it
runs on (a ``resource.py`` in the working directory cannot lift its memory limit). It imports only the standard
library, then the verifier function (``module:name``) from the caller's ``sys.path`` with the standard library's
directories first — or, where ``<module file>`` is given (a task file the caller loaded by path, whose folder is on
no ``sys.path``), from that file — under an address-space limit.

The channel (:mod:`rlcr.tasks.worker_process`): its first line of input is the parent's nonce; it then moves the
pipes off file descriptors 0 and 1 (``/dev/null`` from then on), so nothing the function prints, writes to fd 1
from C or starts as a child process reaches the parent or reads a request. Protocol, one line each way per call:
the parent writes ``{"args": [...], "deadline": seconds}``; the worker answers ``<nonce> <n> <payload>`` (``n``
counts the requests, 0 for the first line) with ``{"r": <result>}``, ``t`` (its timer fired: out of time, nothing
decided) or ``e`` (the function raised, or its result is not JSON). It starts by answering ``ready`` (or ``e``
when the function cannot be imported). Its own real-time timer raises an exception that is not an
``Exception``, so a library's ``except Exception`` does not swallow it; the parent's deadline and kill bound what
the timer cannot stop. At end of input it kills its process group (what the function started) and itself.
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


def _end_group() -> None:
    """Kill this worker's process group (itself and what it started) when it leads one."""
    if os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)


def _serve(requests, replies, nonce: str) -> None:
    logging.disable(logging.CRITICAL)
    target, path, limit = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    file = sys.argv[4] if len(sys.argv) > 4 else ""
    stdlib = [p for p in sys.path if os.path.basename(p) not in ("site-packages", "dist-packages")]
    sys.path[:] = stdlib + [p for p in path if isinstance(p, str) and p not in stdlib]
    _limit_memory(limit)
    try:
        module, _, name = target.partition(":")
        if file:  # a task file given by path: loaded from that file, as the parent loaded it
            from importlib.util import module_from_spec, spec_from_file_location

            spec = spec_from_file_location(module, file)
            function = module_from_spec(spec)
            sys.modules[module] = function
            spec.loader.exec_module(function)
        else:
            function = importlib.import_module(module)
        for part in name.split("."):
            function = getattr(function, part)
    except BaseException:  # noqa: BLE001  (the parent says the function cannot be imported)
        replies.write(f"{nonce} 0 e\n")
        return
    signal.signal(signal.SIGALRM, _alarm)
    replies.write(f"{nonce} 0 ready\n")
    for n, line in enumerate(requests, start=1):
        try:
            request = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, max(float(request["deadline"]), MIN_DEADLINE_S))
            try:
                result = function(*request["args"])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            reply = json.dumps({"r": result})
        except Deadline:
            reply = "t"
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001  (MemoryError, RecursionError, whatever the function raises)
            reply = "e"
        replies.write(f"{nonce} {n} {reply}\n")


def main() -> None:
    requests, replies, nonce = _channel()
    try:
        _serve(requests, replies, nonce)
    finally:
        _end_group()


if __name__ == "__main__":
    main()
