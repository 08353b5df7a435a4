"""Countdown problems, their exact solver and the seeded generator (docs/design.md §2).

A problem (:class:`CountdownTask`) is a few positive integers ``nums`` and an integer ``target``; the solver
searches every expression over the numbers with exact rationals; the generator draws numbers and a target
the numbers reach, so every generated problem has a reference solution. The task itself (files, scoring,
prompts, the registered ``countdown`` task) is :mod:`rlcr.tasks.countdown`.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations
from math import gcd
from typing import Any, Iterable, Iterator, Sequence

__all__ = ["CountdownTask", "solve", "task_candidates", "generate_tasks", "magnitude_bound", "unreachable_targets",
           "FIRST_DRAWS", "strip_outer"]


# --------------------------------------------------------------------------- tasks


@dataclass
class CountdownTask:
    """One Countdown problem. ``solution`` is a reference expression (or None when unknown)."""

    nums: list[int]
    target: int
    solution: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ground_truth(self) -> dict[str, Any]:
        """The ``ground_truth`` dict that :func:`compute_score` takes."""
        return {"target": self.target, "numbers": list(self.nums)}

    @property
    def identity(self) -> tuple[tuple[int, ...], int]:
        """What makes two tasks the same problem: the multiset of ``nums`` (sorted) and the ``target``.

        Order of the numbers and the reference solution do not count. The training pool, the
        held-out set and an iteration's prompts are kept distinct by this key (``rlcr.runs.task_sets``).
        """
        return tuple(sorted(self.nums)), self.target

    def to_row(self) -> dict[str, Any]:
        return {"nums": list(self.nums), "target": self.target, "solution": self.solution}


# --------------------------------------------------------------------------- solver

_OPS = ("+", "-", "*", "/")


def _combine(a: Fraction, b: Fraction) -> Iterable[tuple[str, Fraction]]:
    yield "+", a + b
    yield "-", a - b
    yield "*", a * b
    if b != 0:
        yield "/", a / b


def _reachable(nums: Sequence[int]) -> dict[Fraction, str]:
    """All values reachable using every number exactly once, with one expression each.

    Depth-first over "pick an ordered pair, combine it, recurse" with exact rationals.
    """
    found: dict[Fraction, str] = {}
    seen: set[tuple] = set()

    def rec(items: list[tuple[Fraction, str]]) -> None:
        key = tuple(sorted(v for v, _ in items))
        if key in seen:
            return
        seen.add(key)
        if len(items) == 1:
            value, expr = items[0]
            found.setdefault(value, expr)
            return
        for i, j in combinations(range(len(items)), 2):
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            for (va, ea), (vb, eb) in (((items[i]), (items[j])), ((items[j]), (items[i]))):
                for op, value in _combine(va, vb):
                    rec(rest + [(value, f"({ea} {op} {eb})")])

    rec([(Fraction(n), str(n)) for n in nums])
    return {v: strip_outer(e) for v, e in found.items()}


def _values(nums: Sequence[int]) -> set[tuple[int, int]]:
    """The keys of :func:`_reachable` without building expressions, as reduced ``(numerator,
    denominator > 0)`` pairs (exact; hashing a Fraction costs a modular inverse): the values of each
    sub-multiset, from the values of the two parts of each of its splits (memoised)."""
    memo: dict[tuple[int, ...], set[tuple[int, int]]] = {}

    def frac(n: int, d: int) -> tuple[int, int]:
        if d < 0:
            n, d = -n, -d
        g = gcd(n, d)
        return (n // g, d // g) if g > 1 else (n, d)

    def values(ms: tuple[int, ...]) -> set[tuple[int, int]]:
        if ms in memo:
            return memo[ms]
        if len(ms) == 1:
            out = {(ms[0], 1)}
        else:
            out = set()
            splits = set()
            for mask in range(1, 2 ** len(ms) - 1, 2):  # the part holding ms[0], never all of ms
                a = tuple(x for k, x in enumerate(ms) if mask >> k & 1)
                b = tuple(x for k, x in enumerate(ms) if not mask >> k & 1)
                if (a, b) in splits:
                    continue
                splits.add((a, b))
                for xn, xd in values(a):
                    for yn, yd in values(b):
                        d = xd * yd
                        out.add(frac(xn * yd + yn * xd, d))
                        out.add(frac(xn * yd - yn * xd, d))
                        out.add(frac(yn * xd - xn * yd, d))
                        out.add(frac(xn * yn, d))
                        if yn:
                            out.add(frac(xn * yd, xd * yn))
                        if xn:
                            out.add(frac(yn * xd, yd * xn))
        memo[ms] = out
        return out

    return values(tuple(sorted(nums)))


def strip_outer(expr: str) -> str:
    if expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for i, ch in enumerate(expr):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(expr) - 1:
                return expr
        return expr[1:-1]
    return expr


def solve(nums: Sequence[int], target: int) -> str | None:
    """An expression using every number in ``nums`` once that equals ``target``, or None.

    Exhaustive exact-rational search over pairs combined with ``+ - * /``: the depth-first search of
    :func:`_reachable`, stopped at the first expression with that value (so the same expression).
    """
    goal = Fraction(target)
    seen: set[tuple] = set()

    def rec(items: list[tuple[Fraction, str]]) -> str | None:
        key = tuple(sorted(v for v, _ in items))
        if key in seen:
            return None
        seen.add(key)
        if len(items) == 1:
            value, expr = items[0]
            return expr if value == goal else None
        for i, j in combinations(range(len(items)), 2):
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            for (va, ea), (vb, eb) in (((items[i]), (items[j])), ((items[j]), (items[i]))):
                for op, value in _combine(va, vb):
                    found = rec(rest + [(value, f"({ea} {op} {eb})")])
                    if found is not None:
                        return found
        return None

    found = rec([(Fraction(n), str(n)) for n in nums])
    return None if found is None else strip_outer(found)


def task_candidates(
    seed: int,
    *,
    min_count: int = 3,
    max_count: int = 4,
    num_range: tuple[int, int] = (1, 20),
    target_range: tuple[int, int] = (1, 100),
) -> Iterator[CountdownTask | None]:
    """Endless seeded stream of generation attempts (see :func:`generate_tasks` for the draw).

    Each item is a solvable task, or None where the drawn numbers reach no integer target in
    ``target_range`` (so a consumer can bound its attempts). ``generate_tasks(n, seed)`` is the
    first ``n`` tasks of this stream. The ranges are checked here, before the first item, and so is
    whether any target is within reach (:func:`unreachable_targets`); a ValueError while drawing when
    the first :data:`FIRST_DRAWS` draws give no solvable task.
    """
    if not 2 <= min_count <= max_count <= 6:
        raise ValueError(f"need 2 <= min_count <= max_count <= 6, got {min_count}, {max_count}")
    lo, hi = num_range
    tlo, thi = target_range
    if not 0 < lo <= hi:
        raise ValueError(f"num_range must be positive and ordered, got {num_range}")
    if tlo > thi:
        raise ValueError(f"target_range must be ordered, got {target_range}")
    reason = unreachable_targets(min_count, max_count, (lo, hi), (tlo, thi))
    if reason is not None:
        raise ValueError(reason)
    return _candidates(random.Random(seed), min_count, max_count, lo, hi, tlo, thi)


FIRST_DRAWS = 1000
"""Draws a candidate stream makes before its first solvable task at most: options whose numbers reach no target
in range (or so rarely that no task set could be drawn) are refused within a second or so, not after the
thousands of draws per task that its consumers allow."""


def magnitude_bound(max_count: int, hi: int) -> int:
    """The largest absolute value (numerator, in lowest terms) an expression over at most ``max_count``
    numbers of at most ``hi`` can take: ``2**(count-1) * hi**count`` (by induction: a sum at most doubles the
    product of the parts' bounds, a product, difference or quotient of fractions does not exceed it)."""
    return 2 ** (max_count - 1) * max(hi, 1) ** max_count


def unreachable_targets(min_count: int, max_count: int, num_range: tuple[int, int], target_range: tuple[int, int]
                        ) -> str | None:
    """Why no task can be drawn with these settings, or None where some may be: every target lies beyond
    what the numbers can reach (:func:`magnitude_bound`). A cheap check made before any draw."""
    bound = magnitude_bound(max_count, num_range[1])
    if target_range[0] > bound or target_range[1] < -bound:
        return (f"target_range {tuple(target_range)} lies beyond ±{bound:,}, the most {max_count} numbers of at "
                f"most {num_range[1]} can reach: no task can be drawn")
    return None


def _candidates(rng: random.Random, min_count: int, max_count: int, lo: int, hi: int, tlo: int, thi: int
                ) -> Iterator[CountdownTask | None]:
    first = True
    for draw in itertools.count(1):
        count = rng.randint(min_count, max_count)
        nums = [rng.randint(lo, hi) for _ in range(count)]
        targets = sorted(n for n, d in _values(nums) if d == 1 and tlo <= n <= thi)
        if not targets:
            if first and draw >= FIRST_DRAWS:
                raise ValueError(f"no solvable task in the first {FIRST_DRAWS:,} draws of {min_count}-{max_count} "
                                 f"numbers in {(lo, hi)}: targets in {(tlo, thi)} are out of their reach (or too "
                                 "rarely in it); widen num_range or target_range")
            yield None
            continue
        first = False
        target = rng.choice(targets)
        yield CountdownTask(nums=nums, target=target, solution=solve(nums, target))


def generate_tasks(
    n: int,
    seed: int,
    *,
    min_count: int = 3,
    max_count: int = 4,
    num_range: tuple[int, int] = (1, 20),
    target_range: tuple[int, int] = (1, 100),
) -> list[CountdownTask]:
    """``n`` solvable tasks, reproducible from ``seed``.

    Each task draws ``min_count..max_count`` numbers uniformly from ``num_range``
    (inclusive) and a target uniformly among the *integers in target_range that
    the numbers can reach*, so every task has a reference solution by construction.
    Tasks are not deduplicated here: two draws can be the same problem (see
    :attr:`CountdownTask.identity` and ``rlcr.runs.task_sets``).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    tasks: list[CountdownTask] = []
    stream = task_candidates(seed, min_count=min_count, max_count=max_count, num_range=num_range,
                             target_range=target_range)
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 1000 * max(n, 1):
            raise RuntimeError("could not generate solvable tasks with these ranges")
        task = next(stream)
        if task is not None:
            tasks.append(task)
    return tasks
