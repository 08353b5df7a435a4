"""The math verifier's worker process (run by ``rlcr.tasks.math_verifier``, never imported by a run).

Started as ``python -I -c <this file's source>``: isolated, so neither the working directory nor
``PYTHONPATH`` can shadow a module (``rlcr/tasks/math.py`` would shadow the standard ``math``). It imports
only the standard library and ``math_verify``. Protocol, one line each way per request:

* the parent writes ``{"gold": str, "answer": str}`` as one JSON line;
* the worker answers ``1`` (equivalent), ``0`` (not, or unparseable) or ``e`` (an error in the worker).

It starts by writing ``ready``. It runs on its own main thread, so math-verify's signal-based timeouts
work here (they raise off the main thread); the parent's deadline and kill bound it anyway, and an
address-space limit bounds its memory. Logging is off: math-verify logs the text it failed on, and model
output must not reach a log unfiltered. It exits at end of input (the parent closed the pipe or died).
"""

import json
import logging
import os
import resource
import sys

MEMORY_LIMIT_BYTES = 2 * 1024**3
PARSE_TIMEOUT_S = 1
VERIFY_TIMEOUT_S = 1
GOLD_CACHE = 2048


def _limit_memory() -> None:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout = sys.stderr  # library prints cannot corrupt the protocol
    logging.disable(logging.CRITICAL)
    _limit_memory()
    from math_verify import parse, verify  # noqa: PLC0415

    def parsed(text):
        return parse("$" + text + "$", parsing_timeout=PARSE_TIMEOUT_S)

    golds = {}
    out.write("ready\n")
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold = golds.get(request["gold"])
            if gold is None:
                if len(golds) >= GOLD_CACHE:
                    golds.clear()
                gold = golds[request["gold"]] = parsed(request["gold"])
            answer = parsed(request["answer"])
            ok = bool(gold) and bool(answer) and verify(gold, answer, timeout_seconds=VERIFY_TIMEOUT_S)
            out.write("1\n" if ok else "0\n")
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001  (MemoryError, math-verify's TimeoutException, whatever sympy raises)
            out.write("e\n")


if __name__ == "__main__":
    main()
