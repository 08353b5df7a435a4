"""The ``math`` task: word problems and exercises with a final answer, verified with math-verify (docs/tasks.md).

Rows are read in the formats the public sets have, by :meth:`MathTask.load` (JSONL, Parquet, or a
``datasets`` dataset saved with ``save_to_disk``; :func:`rlcr.tasks.base.read_rows`):

* **GSM8K**: ``question`` and ``answer``, the answer being the worked rationale then a last ``#### <final>``;
* **MATH / Big-Math**: ``problem`` with an ``answer`` (the final answer), or with a ``solution`` whose last
  top-level ``\\boxed{...}`` holds it; an optional ``level`` (MATH's ``Level 1`` … ``Level 5``).

``fields`` maps these names to a file's own columns (``{"question": "prompt", "level": "difficulty"}``).
Without a file the task generates problems (:mod:`rlcr.tasks.math_data`); ``rlcr/tasks/data`` ships a
small generated set in both formats. Answers are compared by :func:`rlcr.tasks.math_verifier.equivalent`,
bounded in size, nesting and time, in any thread.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Hashable, Iterator, Mapping

from rlcr.tasks import math_data
from rlcr.tasks.base import (
    Task,
    TaskFormatError,
    WarmStart,
    check_text,
    extract_answer,
    mapped_field,
    problems_of,
    register_task,
)
from rlcr.tasks.math_verifier import MAX_ANSWER_CHARS, answer_problem, batch, equivalent
from rlcr.untrusted import printable

__all__ = ["MathProblem", "MathTask", "last_boxed", "split_gsm8k", "NO_LEVEL", "MAX_QUESTION_CHARS",
           "MAX_SOLUTION_CHARS", "MAX_FLOAT_DIGITS", "SYSTEM_PROMPT", "SINGLE_TURN_SYSTEM_PROMPT", "FIELDS"]

MAX_QUESTION_CHARS = 8_000
"""Longest question accepted from a file (GSM8K's and MATH's are under 5,000)."""
MAX_SOLUTION_CHARS = 32_000
"""Longest worked solution (or GSM8K answer with its rationale) accepted from a file."""
MAX_FLOAT_DIGITS = 15
"""Most significant digits of a gold answer stored as a float (more is binary noise: ``0.1 + 0.2``)."""
NO_LEVEL = "all"
"""The stratum of a problem without a level."""
FIELDS = ("question", "answer", "solution", "level")
"""The task's field names, which ``fields`` may map to a file's columns."""
_ANNOTATION = re.compile(r"<<[^<>\n]{0,200}>>")

SYSTEM_PROMPT = (
    "Solve the math problem. Think step by step inside <think> </think>, "
    "then write only the final answer inside <answer> </answer>."
)
SINGLE_TURN_SYSTEM_PROMPT = (
    "Solve the math problem. Think step by step inside <think> </think>, "
    "then write only the final answer inside <answer> </answer>, "
    "then say how likely your answer is to be correct: optionally check it inside <analysis> </analysis>, "
    "then give a probability between 0 and 1 inside <confidence> </confidence>."
)


@dataclass(frozen=True)
class MathProblem:
    """One math problem: the ``question``, its final ``answer`` (LaTeX or a number, one line), the worked
    ``solution`` when the data has one, and its ``level`` (None when the data has none)."""

    question: str
    answer: str
    solution: str | None = None
    level: str | None = None


def last_boxed(text: str) -> str | None:
    """Content of the last top-level ``\\boxed{...}`` (or ``\\fbox{...}``) of ``text``, balanced braces
    (``\\{`` and ``\\}`` are literal braces), stripped; None if there is none or it is not closed. Linear."""
    found, pos = None, 0
    while True:
        starts = [i for i in (text.find("\\boxed{", pos), text.find("\\fbox{", pos)) if i >= 0]
        if not starts:
            return found
        i = text.index("{", min(starts))
        depth, j = 0, i
        while j < len(text):
            ch = text[j]
            if ch == "\\":
                j += 2
                continue
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                break
            j += 1
        if depth:
            return found  # not closed: nothing after it can be a complete box either
        found, pos = text[i + 1:j].strip(), j + 1


def split_gsm8k(answer: str) -> tuple[str, str] | None:
    """A GSM8K ``answer`` → (rationale, final answer after the last ``####``), or None without ``####``."""
    if "####" not in answer:
        return None
    rationale, final = answer.rsplit("####", 1)
    return rationale.strip(), final.strip()


def _numeric_gold(value: Any, where: str, column: str) -> Any:
    """A gold answer stored as a number, written as text: an integer (``42.0`` too) in digits, any other
    float in positional notation with its shortest round-trip digits (``1e-05`` → ``0.00001``); NaN (a
    missing value), infinities and floats of over :data:`MAX_FLOAT_DIGITS` significant digits are refused.
    Anything else is returned as is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, int):
        return str(value)
    field = f"{where}: field '{printable(column, 60)}'"
    if not math.isfinite(value):
        raise TaskFormatError(f"{field}: the gold answer is " + ("missing (NaN)" if math.isnan(value) else
                                                                 f"not a finite number ({value})"))
    if value.is_integer():
        return str(int(value))
    decimal = Decimal(repr(value))
    if len(decimal.as_tuple().digits) > MAX_FLOAT_DIGITS:
        raise TaskFormatError(f"{field}: the gold answer {value!r} has over {MAX_FLOAT_DIGITS} significant digits "
                              "(binary float noise): store it as text")
    return format(decimal, "f")


def _final(text: str, where: str, column: str) -> str:
    """A final answer on one line, within the verifier's bounds (else a one-line TaskFormatError)."""
    final = " ".join(text.split())
    if not final:
        raise TaskFormatError(f"{where}: field '{printable(column, 60)}': the final answer is empty")
    if final.lower().lstrip("+-") == "nan":
        raise TaskFormatError(f"{where}: field '{printable(column, 60)}': the final answer is NaN "
                              "(a missing value written as text)")
    problem = answer_problem(final)
    if problem is not None:
        raise TaskFormatError(f"{where}: field '{printable(column, 60)}': the final answer is {problem} "
                              f"(at most {MAX_ANSWER_CHARS} characters; the verifier reads no other)")
    return final


def _problem(row: Mapping[str, Any], where: str, fields: Mapping[str, str]) -> MathProblem:
    if "question" not in fields and row.get("question") is None and row.get("problem") is None:
        raise TaskFormatError(f"{where}: field 'question' (or 'problem') is missing")
    qname = "question" if "question" in fields or row.get("question") is not None else "problem"
    qcol, question = mapped_field(row, qname, fields)
    question = check_text(question, where, printable(qcol, 60), MAX_QUESTION_CHARS)
    acol, answer = mapped_field(row, "answer", fields)
    scol, solution = mapped_field(row, "solution", fields)
    solution = check_text(solution, where, printable(scol, 60), MAX_SOLUTION_CHARS, required=False)
    if answer is not None:
        answer = check_text(_numeric_gold(answer, where, acol), where, printable(acol, 60), MAX_SOLUTION_CHARS)
        gsm8k = split_gsm8k(answer)
        if gsm8k is not None:
            rationale, answer = gsm8k
            solution = solution or _ANNOTATION.sub("", rationale) or None
        final = _final(answer, where, acol)
    elif solution is not None:
        boxed = last_boxed(solution)
        if boxed is None:
            raise TaskFormatError(f"{where}: field '{printable(scol, 60)}' holds no closed \\boxed{{...}} answer "
                                  f"(and field '{printable(acol, 60)}' is missing)")
        final = _final(boxed, where, scol)
    else:
        raise TaskFormatError(f"{where}: field '{printable(acol, 60)}' is missing (and no field "
                              f"'{printable(scol, 60)}' with a \\boxed{{...}} answer)")
    lcol, level = mapped_field(row, "level", fields)
    level = check_text(level, where, printable(lcol, 60), 64, required=False)
    return MathProblem(question=question, answer=final, solution=solution, level=level)


def _null(value: Any) -> bool:
    """None, NaN or ``pandas.NA`` — how a missing level comes back from a Ray Data batch of rows with and without
    one (``pandas.NA`` has no truth value: ``NA != NA`` cannot be tested)."""
    if value is None or type(value).__name__ == "NAType":
        return True
    return isinstance(value, float) and math.isnan(value)


@register_task("math")
class MathTask(Task):
    """Math word problems and exercises; the answer is right when math-verify finds it equal to the gold."""

    system_prompt = SYSTEM_PROMPT
    single_turn_system_prompt = SINGLE_TURN_SYSTEM_PROMPT
    stratum_label = "level"

    def load(self, path: str, fields: Mapping[str, str] | None = None) -> list[MathProblem]:
        fields = dict(fields or {})
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise ValueError(f"task 'math': unknown field {printable(unknown[0], 60)!r} in the field mapping "
                             f"(fields: {', '.join(FIELDS)})")
        for name, column in fields.items():
            if not isinstance(column, str) or not column:
                raise ValueError(f"task 'math': field mapping {name!r} must name a column, got "
                                 f"{printable(repr(column), 60)}")
        return problems_of(path, lambda row, where: _problem(row, where, fields))

    def candidates(self, seed: int, cfg: Any = None) -> Iterator[MathProblem | None]:
        for row in math_data.rows_stream(seed):
            yield _problem(row, "generated math problem", {})

    def strata(self, cfg: Any = None) -> list[Hashable]:
        return [f"Level {k}" for k in range(1, 6)]

    def identity(self, problem: MathProblem) -> Hashable:
        """The question with its whitespace collapsed: two rows asking the same question are one problem."""
        return " ".join(problem.question.split())

    def stratum(self, problem: MathProblem) -> Hashable:
        return problem.level if problem.level else NO_LEVEL

    def to_record(self, problem: MathProblem) -> dict[str, Any]:
        return {"question": problem.question, "answer": problem.answer, "level": problem.level}

    def from_record(self, record: Mapping[str, Any]) -> MathProblem:
        level = record.get("level")
        return MathProblem(question=str(record["question"]), answer=str(record["answer"]),
                           level=None if _null(level) else str(level))

    def record_fields(self) -> list[Any]:
        import pyarrow as pa

        return [pa.field("question", pa.string(), nullable=False), pa.field("answer", pa.string(), nullable=False),
                pa.field("level", pa.string(), nullable=True)]

    def user_text(self, problem: MathProblem) -> str:
        return (f"{problem.question}\n\nReason in <think> </think>, then give only the final answer (a number or "
                "an expression, no units) in <answer> </answer> on the last line, e.g. <answer>\\frac{3}{4}</answer>.")

    def score(self, completion: Any, problem: MathProblem, *, format_score: float, score: float = 1.0) -> float:
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        return score if equivalent(problem.answer, answer) else format_score

    def scoring(self, n: int) -> Any:
        """The math verifier's :func:`~rlcr.tasks.math_verifier.batch`: ``n`` answers share a time budget."""
        return batch(n)

    def warm_start(self, problem: MathProblem, rng: random.Random) -> WarmStart | None:
        """The data's worked solution (GSM8K's rationale without its ``<<…>>`` annotations, or MATH's solution)
        and the final answer; None without a solution or when the verifier cannot read the gold answer."""
        if not problem.solution:
            return None
        trace = WarmStart(reasoning=problem.solution, answer=problem.answer)
        if self.score(self.warm_start_completion(trace), problem, format_score=0.0) != 1.0:
            return None
        return trace
