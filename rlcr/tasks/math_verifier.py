"""Bounded math-answer equivalence with Hugging Face ``math-verify``, safe in any thread (docs/tasks.md).

``math_verify.parse``/``verify`` bound their work with ``signal.alarm``: that raises ``ValueError`` off the
main thread (Ray Data actors, Ray Train workers, thread pools), and even on it a C-level computation such
as ``10**(10**10)`` is not interrupted by a signal. So model answers never reach sympy in this process:

1. cheap checks first, here: at most :data:`MAX_ANSWER_CHARS` characters, brackets nested at most
   :data:`MAX_ANSWER_DEPTH` deep, no power tower (an exponent holding an exponent) and no exponent
   literal over :data:`MAX_EXPONENT_DIGITS` digits; anything else is "not equivalent" without parsing;
2. the rest goes to one worker process per process (``rlcr/tasks/math_worker.py``: math-verify's own
   timeouts on its main thread, an address-space limit) and waits at most :data:`DEADLINE_S`; past it
   the worker is killed (and restarted on the next call) and the answer is not equivalent.

Results are cached per (gold, answer). Pure standard library here; ``math_verify`` is imported by the worker.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

__all__ = ["equivalent", "answer_problem", "MAX_ANSWER_CHARS", "MAX_ANSWER_DEPTH", "MAX_EXPONENT_DIGITS",
           "DEADLINE_S", "STARTUP_DEADLINE_S"]

MAX_ANSWER_CHARS = 256
"""An answer (or gold answer) longer than this is refused unparsed."""
MAX_ANSWER_DEPTH = 12
"""Deepest nesting of ``{ ( [`` accepted in an answer."""
MAX_EXPONENT_DIGITS = 4
"""Longest integer literal accepted in an exponent (``2^{2005}`` is fine, ``10^{100000}`` is not)."""
DEADLINE_S = 3.0
"""Longest wait for one verification in the worker; past it the worker is killed."""
STARTUP_DEADLINE_S = 120.0
"""Longest wait for a worker to import math-verify and say it is ready."""
_CACHE_SIZE = 8192
_DOLLAR = re.compile(r"(?<!\\)\$")
_DIGITS = re.compile(r"\d+")


def answer_problem(text: str) -> str | None:
    """Why ``text`` is refused before parsing (one short phrase), or None when it may be verified."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    depth = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            if depth > MAX_ANSWER_DEPTH:
                return f"nested deeper than {MAX_ANSWER_DEPTH} levels"
        elif ch in "})]":
            depth -= 1
    spaced = text.replace("**", "^")
    for i, ch in enumerate(spaced):
        if ch == "^":
            exponent = _exponent(spaced, i + 1)
            if "^" in exponent:
                return "a power tower"
            if any(len(d) > MAX_EXPONENT_DIGITS for d in _DIGITS.findall(exponent)):
                return f"an exponent over {MAX_EXPONENT_DIGITS} digits"
    return None


def _exponent(text: str, start: int) -> str:
    """The exponent after a ``^`` at ``start - 1``: a braced or parenthesised group, else the next token."""
    i = start
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] in "{(":
        opening, closing, depth = text[i], "})"["{(".index(text[i])], 0
        for j in range(i, len(text)):
            depth += (text[j] == opening) - (text[j] == closing)
            if depth == 0:
                return text[i + 1:j]
        return text[i + 1:]
    j = i
    while j < len(text) and (text[j].isalnum() or text[j] in "\\."):
        j += 1
    return text[i:j]


class _Worker:
    """One verifier process, used by one thread at a time (a lock), restarted after a timeout or a crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()

    def _start(self) -> subprocess.Popen:
        source = Path(__file__).with_name("math_worker.py").read_text(encoding="utf-8")
        proc = subprocess.Popen([sys.executable, "-I", "-c", source], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        self._proc, self._buffer = proc, b""
        if self._readline(time.monotonic() + STARTUP_DEADLINE_S) != b"ready":
            self._stop()
            raise RuntimeError("the math verifier worker did not start (is math-verify installed? "
                               "pip install math-verify)")
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass

    def _readline(self, deadline: float) -> bytes | None:
        """One line from the worker, or None at the deadline or end of output."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.strip()

    def equivalent(self, gold: str, answer: str, deadline_s: float) -> bool:
        key = (gold, answer)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
            try:
                proc.stdin.write(json.dumps({"gold": gold, "answer": answer}).encode() + b"\n")
                proc.stdin.flush()
            except OSError:  # the worker died: count as not equivalent, restart next time
                self._stop()
                return False
            reply = self._readline(time.monotonic() + deadline_s)
            if reply is None:  # past the deadline (or the worker died): kill it, restart next time
                self._stop()
                return False
            result = reply == b"1"
            self._cache[key] = result
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
            return result


_WORKER = _Worker()
atexit.register(_WORKER._stop)


def equivalent(gold: str, answer: str, *, deadline_s: float = DEADLINE_S) -> bool:
    """Whether ``answer`` is mathematically the gold answer (math-verify: ``1/2``, ``0.5`` and ``\\frac{1}{2}``
    are one answer). False for anything refused by :func:`answer_problem`, unparseable, or not decided
    within ``deadline_s``. Bounded in time and memory, callable from any thread; never raises on the answer."""
    if not isinstance(answer, str) or not isinstance(gold, str) or max(len(answer), len(gold)) > MAX_ANSWER_CHARS:
        return False
    gold, answer = _DOLLAR.sub("", gold).strip(), _DOLLAR.sub("", answer).strip()
    if not answer or not gold or answer_problem(answer) is not None or answer_problem(gold) is not None:
        return False
    return _WORKER.equivalent(gold, answer, deadline_s)
