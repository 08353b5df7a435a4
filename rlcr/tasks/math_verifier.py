"""Bounded math-answer equivalence with Hugging Face ``math-verify``, safe in any thread (docs/tasks.md).

``math_verify.parse``/``verify`` bound their work with ``signal.alarm``: that raises ``ValueError`` off the
main thread (Ray Data actors, Ray Train workers, thread pools), and even on it a C-level computation such
as ``10**(10**10)`` is not interrupted by a signal. So model answers never reach sympy in this process:

1. cheap checks first (:func:`answer_problem`): size, nesting, brackets, power towers, powers of powers,
   long exponent, factorial and binomial literals; anything refused is "not equivalent" without parsing;
2. the rest goes to one worker process per process (``rlcr/tasks/math_worker.py``, its own timer on its
   own main thread, an address-space limit). One *attempt* has a deadline (at most
   :data:`ANSWER_DEADLINE_S`) for the gold's parse, the answer's parse and their comparison; the worker
   replies ``t`` when its timer fires, and past the deadline plus :data:`KILL_GRACE_S` it is killed.

The timeout rule: an attempt that times out (a stalled, paused or starved worker, or a slow answer) is
retried once with a fresh deadline; a second timeout scores that one answer "not equivalent" and counts
it (:class:`Batch`'s ``timeouts``, the rollouts' ``verifier/timeouts``). Nothing obtained through a
timeout is cached: only a decided 1 or 0 is kept, per (gold, answer), and the worker keeps only gold
parses that finished. Inside :func:`batch` the answers share a time budget
(:data:`BATCH_BASE_S` + :data:`BATCH_PER_ANSWER_S` per answer): no attempt runs past it, and an answer
reached with the budget spent scores "not equivalent" and is counted the same way. Pure standard library
here; ``math_verify`` is imported by the worker.
"""

from __future__ import annotations

import atexit
import json
import re
import sys
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rlcr.tasks.worker_process import WorkerProcess

__all__ = ["equivalent", "answer_problem", "read_as_answer", "batch", "Batch", "MAX_ANSWER_CHARS", "MAX_ANSWER_DEPTH",
           "MAX_EXPONENT_DIGITS", "MAX_SYMBOLIC_EXPONENT", "MAX_BOUND_DIGITS", "ANSWER_DEADLINE_S", "KILL_GRACE_S",
           "BATCH_BASE_S", "BATCH_PER_ANSWER_S", "STARTUP_DEADLINE_S"]

MAX_ANSWER_CHARS = 256
"""An answer (or gold answer) longer than this is refused unparsed."""
MAX_ANSWER_DEPTH = 12
"""Deepest nesting of ``{ ( [`` accepted in an answer."""
MAX_EXPONENT_DIGITS = 4
"""Longest integer literal accepted in an exponent, a factorial or a binomial (``2^{2005}`` is fine,
``10^{100000}`` is not); a power of a power must keep its combined exponent under ``10**4`` too."""
MAX_SYMBOLIC_EXPONENT = 100
"""Largest exponent of a power whose base is an expression rather than a number (``(x+1)^{100}`` is fine,
``(x+1)^{999}`` is refused: sympy expands it for seconds)."""
MAX_BOUND_DIGITS = 2
"""Longest literal accepted in a sum or product (``\\sum_{k=1}^{99}``): more terms are refused unparsed."""
ANSWER_DEADLINE_S = 2.0
"""Longest attempt at one verification (gold parse, answer parse, comparison) on the worker's timer."""
KILL_GRACE_S = 0.5
"""How long past an attempt's deadline the worker may still answer before it is killed."""
BATCH_BASE_S = 1.5
BATCH_PER_ANSWER_S = 0.04
"""A :func:`batch` of ``n`` answers has ``BATCH_BASE_S + n * BATCH_PER_ANSWER_S`` seconds (64: 4.06 s)."""
STARTUP_DEADLINE_S = 120.0
"""Longest wait for a worker to import math-verify and say it is ready."""
_MIN_ATTEMPT_S = 0.01
_CACHE_SIZE = 8192
_DOLLAR = re.compile(r"(?<!\\)\$")
_DIGITS = re.compile(r"\d+")
_CLOSING = {"}": "{", ")": "(", "]": "["}
_NUMBER = re.compile(r"\s*[\d.,]*\s*")
_RELATION = re.compile(r"=|<|>|≤|≥|≠|≈|∨|∧|¬|→|⇒|⇔|∈|\\(?:le|leq|ge|geq|ne|neq|approx|sim|simeq|cong|equiv|lor|land|"
                       r"vee|wedge|lnot|neg|to|implies|impliedby|iff|Rightarrow|Leftarrow|Leftrightarrow|rightarrow|leftarrow|"
                       r"in|notin|gt|lt|mid|propto)(?![A-Za-z])")
_NAMED = re.compile(r"\s*[A-Za-z](?:_\{?\w+\}?)?\s*(?:=|\\in(?![A-Za-z]))(.*)", re.S)
_PERCENT = re.compile(r"\\text\{\s*\\?%\s*\}|\\?%|\\percent(?![A-Za-z])")


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
            if depth < 0:
                return "a closing bracket before its opening one"
    spaced = text.replace("**", "^")
    if "binom" in spaced or "choose" in spaced:
        if _longest_literal(spaced) > MAX_EXPONENT_DIGITS:
            return f"a binomial of a number over {MAX_EXPONENT_DIGITS} digits"
        if "^" in spaced or "!" in spaced:  # \binom{10^{999}}{10^{998}}
            return "a binomial with a power or a factorial"
    if ("\\sum" in spaced or "\\prod" in spaced) and _longest_literal(spaced) > MAX_BOUND_DIGITS:
        return f"a sum or product with a number over {MAX_BOUND_DIGITS} digits"  # \prod_{n=1}^{9999} n^{9999}
    for i, ch in enumerate(spaced):
        if ch == "^":
            problem = _power_problem(spaced, i)
        elif ch == "!" and (i == 0 or spaced[i - 1] != "\\"):
            problem = _factorial_problem(spaced, i)
        else:
            continue
        if problem is not None:
            return problem
    return None


def _power_problem(text: str, i: int) -> str | None:
    """Why the power whose ``^`` is at ``i`` is refused, or None."""
    exponent, end = _exponent(text, i + 1)
    if "^" in exponent or text[end:].lstrip().startswith("^"):
        return "a power tower"  # a^{b^c}, a^{b}^{c}, a^b^c
    if _longest_literal(exponent) > MAX_EXPONENT_DIGITS:
        return f"an exponent over {MAX_EXPONENT_DIGITS} digits"
    base = _group_before(text, i)
    if base is not None and "^" in base:  # (a^{m})^{n}: the exponent is m·n; ((a^{m})^{n})^{k}: m·n·k
        combined = _largest_literal(exponent)
        for j, c in enumerate(base):
            if c == "^":
                combined *= _largest_literal(_exponent(base, j + 1)[0])
        if combined >= 10 ** MAX_EXPONENT_DIGITS:
            return f"a power of a power over {MAX_EXPONENT_DIGITS} digits"
    if base is not None and not _NUMBER.fullmatch(base) and _largest_literal(exponent) > MAX_SYMBOLIC_EXPONENT:
        return f"a power of an expression with an exponent over {MAX_SYMBOLIC_EXPONENT}"  # (x+1)^{999}
    return None


def _factorial_problem(text: str, i: int) -> str | None:
    """Why the factorial whose ``!`` is at ``i`` is refused, or None."""
    base = _group_before(text, i)
    if base is not None and ("!" in base or "^" in base):
        return "a factorial of a factorial or a power"
    j = i
    while j > 0 and text[j - 1].isdigit():
        j -= 1
    if i - j > MAX_EXPONENT_DIGITS or (j > 0 and text[j - 1] == "!"):
        return f"a factorial of a number over {MAX_EXPONENT_DIGITS} digits, or of a factorial"
    return None


def read_as_answer(gold: str, answer: str) -> str | None:
    """The part of ``answer`` compared with ``gold`` under rlcr's semantics (docs/tasks.md), or None when it
    cannot match whatever math-verify would say:

    * a relation or connective (``=``, ``<``, ``\\le``, ``\\approx``, ``\\lor``, ``\\land``, ``\\in``, …) in an
      answer whose gold has none: only ``x = value`` (one variable named on the left) is read, as its value;
      ``2 = 3``, ``2 \\lor 3`` and ``3 \\approx 4`` match nothing (math-verify reads the last side);
    * a percent sign is a label: ``25\\%`` is read as ``25``, in the gold too, so ``300\\%`` is not ``3``."""
    if _RELATION.search(answer) and not _RELATION.search(gold):
        named = _NAMED.fullmatch(answer)
        if named is None or _RELATION.search(named.group(1)):
            return None
        answer = named.group(1).strip()
    return _PERCENT.sub("", answer).strip() or None


def _longest_literal(text: str) -> int:
    return max((len(d) for d in _DIGITS.findall(text)), default=0)


def _largest_literal(text: str) -> int:
    return max((int(d) for d in _DIGITS.findall(text) if len(d) <= 2 * MAX_EXPONENT_DIGITS), default=1)


def _exponent(text: str, start: int) -> tuple[str, int]:
    """The exponent after a ``^`` at ``start - 1`` (a braced or parenthesised group, else the next token)
    and the index just after it."""
    i = start
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] in "{(":
        opening, closing, depth = text[i], "})"["{(".index(text[i])], 0
        for j in range(i, len(text)):
            depth += (text[j] == opening) - (text[j] == closing)
            if depth == 0:
                return text[i + 1:j], j + 1
        return text[i + 1:], len(text)
    j = i
    while j < len(text) and (text[j].isalnum() or text[j] in "\\."):
        j += 1
    return text[i:j], j


def _group_before(text: str, i: int) -> str | None:
    """The content of the bracketed group that ends just before index ``i`` (spaces skipped), or None."""
    j = i - 1
    while j >= 0 and text[j] == " ":
        j -= 1
    if j < 0 or text[j] not in _CLOSING:
        return None
    depth = 0
    for k in range(j, -1, -1):
        depth += (text[k] in _CLOSING) - (text[k] in "{([")
        if depth == 0:
            return text[k + 1:j]
    return text[:j]


class Batch:
    """A run of answers sharing one time budget (:func:`batch`); ``timeouts`` counts the answers scored
    "not equivalent" because their verification ran out of time (or of the budget)."""

    def __init__(self, n: int, budget_s: float | None = None) -> None:
        self.budget_s = BATCH_BASE_S + BATCH_PER_ANSWER_S * max(n, 0) if budget_s is None else budget_s
        self.end = time.monotonic() + self.budget_s
        self.timeouts = 0
        self.retries = 0  # attempts that timed out and were tried again
        self.timed_out: set[tuple[str, str]] = set()  # this batch only: each such answer costs once
        self.n, self.reached = max(n, 0), set()  # the answers begun: those not yet begun keep their share
        self.share_s = min(BATCH_PER_ANSWER_S, self.budget_s / max(self.n, 1))

    def until(self, key: tuple[str, str]) -> float:
        """When the attempts at ``key`` must be over: the batch's end less the shares of the answers not yet
        begun (a slow answer spends the slack and its own share, never that of an answer after it)."""
        self.reached.add(key)
        return self.end - self.share_s * max(self.n - len(self.reached), 0)

    def left(self) -> float:
        return self.end - time.monotonic()


_LOCAL = threading.local()


@contextmanager
def batch(n: int, *, budget_s: float | None = None) -> Iterator[Batch]:
    """Score ``n`` answers in this thread as one batch: the worker is started first (outside the budget),
    then every :func:`equivalent` call of this thread shares ``budget_s`` (default
    ``BATCH_BASE_S + n * BATCH_PER_ANSWER_S``). Yields the :class:`Batch`, whose ``timeouts`` it counts."""
    _WORKER.warm()
    outer, current = getattr(_LOCAL, "batch", None), Batch(n, budget_s)
    _LOCAL.batch = current
    try:
        yield current
    finally:
        _LOCAL.batch = outer


class _Worker(WorkerProcess):
    """One verifier process, used by one thread at a time (a lock), restarted after a timeout or a crash."""

    startup_deadline_s = STARTUP_DEADLINE_S

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()

    def _argv(self) -> list[str]:
        # isolated (-I): neither the working directory nor PYTHONPATH can shadow a module of the worker's
        return [sys.executable, "-I", "-c", Path(__file__).with_name("math_worker.py").read_text(encoding="utf-8")]

    def _not_started(self) -> str:
        return "the math verifier worker did not start (is math-verify installed? pip install math-verify)"

    def warm(self) -> None:
        with self._lock:
            self._wait_ready(time.monotonic() + STARTUP_DEADLINE_S)

    def _attempt(self, gold: str, answer: str, deadline_s: float, until: float) -> bytes:
        """One attempt: ``1``, ``0``, ``e`` (an error in the worker) or ``t`` (out of time: the worker's
        timer fired, it was killed past the deadline, it died, or it was not ready by ``until``)."""
        if not self._wait_ready(until):
            return b"t"
        deadline_s = min(deadline_s, until - time.monotonic())
        if deadline_s < _MIN_ATTEMPT_S:
            return b"t"
        if not self._send(json.dumps({"gold": gold, "answer": answer, "deadline": deadline_s}).encode()):
            return b"t"  # the worker died: restarted by the next attempt
        reply = self._readline(time.monotonic() + deadline_s + KILL_GRACE_S)
        if reply is None:  # past the deadline (a computation the timer cannot stop) or dead: kill it
            self._stop()
            return b"t"
        return reply

    def equivalent(self, gold: str, answer: str, deadline_s: float, current: Batch | None) -> bool:
        key = (gold, answer)
        if current is not None and key in current.timed_out:
            return False
        until = current.until(key) if current is not None else time.monotonic() + STARTUP_DEADLINE_S
        if not self._lock.acquire(timeout=max(until - time.monotonic(), 0.0)):
            return _timed_out(current, key)
        try:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            for attempt in range(2):  # the rule: a timed-out attempt is retried once, with a fresh deadline
                if until - time.monotonic() < _MIN_ATTEMPT_S:
                    break
                if attempt and current is not None:
                    current.retries += 1
                reply = self._attempt(gold, answer, deadline_s, until)
                if reply in (b"1", b"0"):
                    self._cache[key] = reply == b"1"
                    if len(self._cache) > _CACHE_SIZE:
                        self._cache.popitem(last=False)
                    return reply == b"1"
                if reply != b"t":
                    return False  # an error in the worker: not equivalent, not cached
            return _timed_out(current, key)
        finally:
            self._lock.release()


def _timed_out(current: Batch | None, key: tuple[str, str]) -> bool:
    """An answer out of time: not equivalent, counted in the batch (and not retried in it), never cached."""
    if current is not None:
        current.timeouts += 1
        current.timed_out.add(key)
    return False


_WORKER = _Worker()
atexit.register(_WORKER._stop)


def equivalent(gold: str, answer: str, *, deadline_s: float = ANSWER_DEADLINE_S) -> bool:
    """Whether ``answer`` is mathematically the gold answer (math-verify: ``1/2``, ``0.5`` and ``\\frac{1}{2}``
    are one answer). False for anything refused by :func:`answer_problem`, unparseable, or out of time by
    the module's timeout rule (``deadline_s``: one attempt's deadline). Bounded in time and memory,
    callable from any thread; never raises on the answer."""
    if not isinstance(answer, str) or not isinstance(gold, str) or max(len(answer), len(gold)) > MAX_ANSWER_CHARS:
        return False
    gold, answer = _DOLLAR.sub("", gold).strip(), _DOLLAR.sub("", answer).strip()
    if not answer or not gold or answer_problem(answer) is not None or answer_problem(gold) is not None:
        return False
    answer, gold = read_as_answer(gold, answer), _PERCENT.sub("", gold).strip()
    if not answer or not gold:
        return False
    return _WORKER.equivalent(gold, answer, deadline_s, getattr(_LOCAL, "batch", None))
