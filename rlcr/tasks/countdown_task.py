"""The registered ``countdown`` task (docs/tasks.md): Countdown behind the task interface.

Every method delegates to the Countdown modules (:mod:`rlcr.tasks.countdown`: files, scoring, prompts;
:mod:`rlcr.tasks.countdown_solver`: problems, solver, generator; :mod:`rlcr.tasks.countdown_sft`: warm-start
traces), so a run on ``task: countdown`` is the run of before the interface, bit for bit
(tests/test_task_port_reference.py).
"""

from __future__ import annotations

import functools
import random
from typing import Any, Hashable, Iterator, Mapping, Sequence

from pydantic import Field, model_validator

from rlcr.tasks import countdown_sft
from rlcr.tasks.base import Task, TaskOptions, WarmStart, register_task
from rlcr.tasks.countdown import FIELDS, SINGLE_TURN_SYSTEM_PROMPT, SYSTEM_PROMPT, compute_score, load_tasks, task_text
from rlcr.tasks.countdown_solver import CountdownTask, generate_tasks, solve, task_candidates, unreachable_targets
from rlcr.tasks.limits import MAX_TASK_NUMBER
from rlcr.untrusted import printable

__all__ = ["Countdown", "CountdownOptions", "generation_settings"]


class CountdownOptions(TaskOptions):
    """Countdown's own settings (``tasks.options``): how problems are generated when there is no task file."""

    min_count: int = Field(3, ge=2, le=6)
    """Fewest numbers in a generated task."""
    max_count: int = Field(4, ge=2, le=6)
    """Most numbers in a generated task."""
    num_range: tuple[int, int] = (1, 20)
    """Inclusive range of the numbers of generated tasks."""
    target_range: tuple[int, int] = (1, 100)
    """Inclusive range of the targets of generated tasks."""

    @model_validator(mode="after")
    def _check_ranges(self) -> "CountdownOptions":
        if self.min_count > self.max_count:
            raise ValueError("tasks.options.min_count must be <= tasks.options.max_count")
        for name in ("num_range", "target_range"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"tasks.options.{name} must be (low, high) with low <= high, got {(lo, hi)}")
        if self.num_range[0] < 1:
            raise ValueError("tasks.options.num_range must hold positive numbers")
        if self.num_range[1] > MAX_TASK_NUMBER or max(map(abs, self.target_range)) > MAX_TASK_NUMBER:
            raise ValueError(f"tasks.options.num_range and tasks.options.target_range must lie within "
                             f"±{MAX_TASK_NUMBER} (the longest number the scorer reads)")
        reason = _unsolvable(self.min_count, self.max_count, tuple(self.num_range), tuple(self.target_range))
        if reason is not None:
            raise ValueError(f"tasks.options.num_range and tasks.options.target_range: {reason}")
        return self


PROBE_MAX_COUNT = 4
"""Options of at most this many numbers are tried with a few draws when validated (each draw takes well under a
millisecond); larger counts are checked by the bound alone, and by the candidate stream when drawn."""


@functools.lru_cache(maxsize=64)
def _unsolvable(min_count: int, max_count: int, num_range: tuple[int, int], target_range: tuple[int, int]
                ) -> str | None:
    """Why these generation settings give no task (no target within reach, or none in the first
    :data:`~rlcr.tasks.countdown_solver.FIRST_DRAWS` draws of a seeded stream), or None. Bounded: a second
    or so where nothing is found, the first draw where something is."""
    reason = unreachable_targets(min_count, max_count, num_range, target_range)
    if reason is not None or max_count > PROBE_MAX_COUNT:
        return reason
    try:
        next(t for t in task_candidates(0, min_count=min_count, max_count=max_count, num_range=num_range,
                                        target_range=target_range) if t is not None)
    except ValueError as e:
        return str(e)
    return None


def generation_settings(cfg: Any = None) -> dict[str, Any]:
    """The generator's keyword arguments from a config's ``tasks.options`` (defaults without one)."""
    if cfg is None:
        return {}
    o = Countdown().options(cfg)
    return dict(min_count=o.min_count, max_count=o.max_count, num_range=tuple(o.num_range),
                target_range=tuple(o.target_range))


@register_task("countdown")
class Countdown(Task):
    """Countdown: ``nums`` and a ``target``; the stratum is the count of numbers; the record its ``nums``/``target``."""

    system_prompt = SYSTEM_PROMPT
    single_turn_system_prompt = SINGLE_TURN_SYSTEM_PROMPT
    stratum_label = "number count"
    Options = CountdownOptions

    def load(self, path: str, fields: Mapping[str, str] | None = None) -> list[CountdownTask]:
        unknown = sorted(set(fields or {}) - set(FIELDS))
        if unknown:
            raise ValueError(f"task 'countdown': unknown field {printable(unknown[0], 60)!r} in the field mapping "
                             f"(fields: {', '.join(FIELDS)})")
        return load_tasks(path, fields)

    def candidates(self, seed: int, cfg: Any = None) -> Iterator[CountdownTask | None]:
        return task_candidates(seed, **generation_settings(cfg))

    def generate(self, n: int, seed: int, cfg: Any = None) -> list[CountdownTask]:
        return generate_tasks(n, seed, **generation_settings(cfg))

    def strata(self, cfg: Any = None) -> list[Hashable]:
        """The number counts ``tasks.options.min_count..tasks.options.max_count``."""
        s = generation_settings(cfg)
        return list(range(s.get("min_count", 3), s.get("max_count", 4) + 1))

    def identity(self, problem: CountdownTask) -> Hashable:
        return problem.identity

    def stratum(self, problem: CountdownTask) -> Hashable:
        """The count of numbers."""
        return len(problem.nums)

    def to_record(self, problem: CountdownTask) -> dict[str, Any]:
        """The rollouts' ``nums``/``target`` columns (as before the interface: stored runs still read)."""
        return {"nums": [int(x) for x in problem.nums], "target": int(problem.target)}

    def from_record(self, record: Mapping[str, Any]) -> CountdownTask:
        return CountdownTask([int(x) for x in record["nums"]], int(record["target"]))

    def record_fields(self) -> list:
        import pyarrow as pa

        return [pa.field("nums", pa.list_(pa.int64()), nullable=False), pa.field("target", pa.int64(), nullable=False)]

    def user_text(self, problem: CountdownTask) -> str:
        return task_text(problem)

    def score(self, completion: Any, problem: CountdownTask, *, format_score: float, score: float = 1.0) -> float:
        return compute_score(completion, problem.ground_truth, format_score=format_score, score=score)

    def accuracy(self, completion: Any, problem: CountdownTask | Mapping[str, Any]) -> float:
        """The accuracy reward; ``problem`` may also be given as its ``ground_truth`` dict ``{"target", "numbers"}``
        (:func:`~rlcr.tasks.countdown.compute_score`'s form)."""
        if isinstance(problem, Mapping):
            problem = self.from_record({"nums": problem["numbers"], "target": problem["target"]})
        return super().accuracy(completion, problem)

    def sft_problem(self, problem: CountdownTask) -> CountdownTask | None:
        """The problem with a checked reference solution (the given one if it scores, else the solver's), or
        None when it has none (unsolvable)."""
        if problem.solution and compute_score(f"<answer>{problem.solution}</answer>", problem.ground_truth) == 1.0:
            return problem
        solution = solve(problem.nums, problem.target)
        return None if solution is None else CountdownTask(list(problem.nums), problem.target, solution, problem.meta)

    def warm_start(self, problem: CountdownTask, rng: random.Random) -> WarmStart | None:
        """A solver trace (:mod:`rlcr.tasks.countdown_sft`): 0–2 missed attempts, then the solution."""
        problem = self.sft_problem(problem)
        if problem is None:
            return None
        misses = countdown_sft.missed_attempts(problem, rng, rng.randrange(countdown_sft.MAX_ATTEMPTS))
        trace = countdown_sft.answer_trace(problem, problem.solution, failed=misses)
        return WarmStart(reasoning=trace[len("<think>"):trace.index("</think>")], answer=problem.solution)

    def warm_start_examples(self, problems: Sequence[CountdownTask], seed: int, *, single_turn: bool = False
                            ) -> list[dict[str, Any]]:
        """Today's warm-start examples (rlcr.tasks.countdown_sft.sft_examples): solver traces, exact checks,
        wrong answers and their confidences."""
        return countdown_sft.sft_examples(len(problems), seed, tasks=list(problems), single_turn=single_turn)
