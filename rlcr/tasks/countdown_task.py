"""The registered ``countdown`` task (docs/tasks.md): Countdown behind the task interface.

Every method delegates to the Countdown modules (:mod:`rlcr.tasks.countdown`: files, scoring, prompts;
:mod:`rlcr.tasks.countdown_solver`: problems, solver, generator; :mod:`rlcr.tasks.countdown_sft`: warm-start
traces), so a run on ``task: countdown`` is the run of before the interface, bit for bit
(tests/test_task_port_reference.py).
"""

from __future__ import annotations

import random
from typing import Any, Hashable, Iterator, Mapping, Sequence

from rlcr.tasks import countdown_sft
from rlcr.tasks.base import Task, WarmStart, register_task
from rlcr.tasks.countdown import (FIELDS, SINGLE_TURN_SYSTEM_PROMPT, SYSTEM_PROMPT, _task_text, compute_score,
                                  load_tasks)
from rlcr.tasks.countdown_solver import CountdownTask, generate_tasks, solve, task_candidates
from rlcr.untrusted import printable

__all__ = ["Countdown", "generation_settings"]


def generation_settings(cfg: Any = None) -> dict[str, Any]:
    """The generator's keyword arguments from a config's ``task_*`` settings (defaults without one)."""
    if cfg is None:
        return {}
    return dict(min_count=cfg.tasks.min_count, max_count=cfg.tasks.max_count,
                num_range=tuple(cfg.tasks.num_range), target_range=tuple(cfg.tasks.target_range))


@register_task("countdown")
class Countdown(Task):
    """Countdown: ``nums`` and a ``target``; the stratum is the count of numbers; the record its ``nums``/``target``."""

    system_prompt = SYSTEM_PROMPT
    single_turn_system_prompt = SINGLE_TURN_SYSTEM_PROMPT
    stratum_label = "number count"

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
        """The number counts ``tasks.min_count..tasks.max_count``."""
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
        return _task_text(problem)

    def score(self, completion: Any, problem: CountdownTask, *, format_score: float, score: float = 1.0) -> float:
        return compute_score(completion, problem.ground_truth, format_score=format_score, score=score)

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
