"""The sumlist task: problems, prompts, options and a bounded verifier."""

import random

import pyarrow as pa
from pydantic import Field, model_validator

from rlcr.tasks.base import Task, TaskOptions, extract_answer, problems_of
from rlcr.tasks.verify import BoundedVerifier

VERIFY = BoundedVerifier("rlcr_sumlist.check:same_number", timeout_s=1.0, memory_bytes=256 * 1024**2)


class SumListOptions(TaskOptions):
    min_len: int = Field(2, ge=1, le=20)
    """Fewest numbers in a generated list."""
    max_len: int = Field(4, ge=1, le=20)
    """Most numbers in a generated list."""
    max_value: int = Field(20, ge=1, le=10**6)
    """Numbers are drawn from 1 … max_value."""

    @model_validator(mode="after")
    def _lengths(self):
        if self.min_len > self.max_len:
            raise ValueError("tasks.options.min_len must be <= tasks.options.max_len")
        return self


class SumList(Task):
    """Problems are lists of integers; the answer is their sum; the stratum is the list's length."""

    system_prompt = "Think inside <think> </think>, then write only the final answer inside <answer> </answer>."
    Options = SumListOptions

    def load(self, path, fields=None):
        return problems_of(path, lambda row, where: [int(x) for x in row["nums"]])

    def candidates(self, seed, cfg=None):
        o, rng = self.options(cfg), random.Random(seed)
        while True:
            yield [rng.randint(1, o.max_value) for _ in range(rng.randint(o.min_len, o.max_len))]

    def strata(self, cfg=None):
        return list(range(self.options(cfg).min_len, self.options(cfg).max_len + 1))

    def identity(self, problem):
        return tuple(problem)

    def stratum(self, problem):
        return len(problem)

    def to_record(self, problem):
        return {"nums": list(problem)}

    def from_record(self, record):
        return [int(x) for x in record["nums"]]

    def record_fields(self):
        return [pa.field("nums", pa.list_(pa.int64()), nullable=False)]

    def user_text(self, problem):
        return f"What is {' + '.join(map(str, problem))}? Put only the number in <answer> </answer>."

    def score(self, completion, problem, *, format_score, score=1.0):
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        return score if VERIFY(answer, sum(problem)) is True else format_score

    def scoring(self, n):
        return VERIFY.scoring(n)
