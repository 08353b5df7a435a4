"""The ``qa`` task: short-answer questions over generated fictional entities, with supporting paragraphs
missing at random, so that missing evidence should lower the stated confidence (docs/tasks.md, "The QA task").

The problems come from :mod:`rlcr.tasks.qa_data` (a seeded generator; no file needed) or from a JSONL /
Parquet / ``save_to_disk`` file of the same fields (:meth:`QATask.load`). An answer is right when it equals
the gold after SQuAD's normalisation (:func:`~rlcr.tasks.qa_data.exact_match`); token F1
(:func:`answer_f1`) is a metric computed from the answer and the gold, which the per-answer records hold.
The stratum is the evidence state, ``full`` / ``partial`` / ``none``, so the evaluation's per-stratum
figures show the confidence against the missing evidence.
"""

from __future__ import annotations

import random
from typing import Any, Hashable, Iterator, Literal, Mapping

from pydantic import Field

from rlcr.tasks import qa_data
from rlcr.tasks.base import (
    Task,
    TaskFormatError,
    TaskOptions,
    WarmStart,
    check_text,
    extract_answer,
    mapped_field,
    problems_of,
    register_task,
)
from rlcr.tasks.qa_data import EVIDENCE_STATES, QAProblem, exact_match, token_f1
from rlcr.untrusted import printable

__all__ = ["QATask", "Options", "answer_f1", "SYSTEM_PROMPT", "SINGLE_TURN_SYSTEM_PROMPT", "FIELDS",
           "MAX_ANSWER_CHARS"]

MAX_ANSWER_CHARS = 200
"""Longest answer compared (a model's answer or a gold from a file): a longer one scores ``format_score``."""
MAX_QUESTION_CHARS = 2_000
MAX_PARAGRAPH_CHARS = 4_000
MAX_PARAGRAPHS = 32
FIELDS = ("question", "answer", "paragraphs", "support", "evidence", "hops")
"""The task's field names, which ``fields`` may map to a file's columns."""

SYSTEM_PROMPT = (
    "Answer the question from the paragraphs. Think briefly inside <think> </think>, "
    "then write only the answer, a name, inside <answer> </answer>."
)
SINGLE_TURN_SYSTEM_PROMPT = (
    "Answer the question from the paragraphs. Think briefly inside <think> </think>, "
    "then write only the answer, a name, inside <answer> </answer>, "
    "then say how likely your answer is to be correct: optionally check it inside <analysis> </analysis>, "
    "then give a probability between 0 and 1 inside <confidence> </confidence>."
)


class Options(TaskOptions):
    """The ``qa`` task's settings (``tasks.options``): how problems are generated."""

    paragraphs: int = Field(4, ge=2, le=8)
    """Paragraphs in each context: the kept supporting ones plus distractors (a removed supporting paragraph is
    replaced by a distractor, so the count says nothing about the evidence)."""
    evidence: tuple[Literal["full", "partial", "none"], ...] = Field(EVIDENCE_STATES, min_length=1)
    """The evidence states generated, in equal shares, in this order (also the held-out set's strata):
    ``full`` every supporting paragraph, ``partial`` one of a 2-hop question's two missing, ``none`` all missing."""
    two_hop_share: float = Field(0.5, ge=0.0, le=1.0)
    """Share of 2-hop (bridge) questions among the ``full`` and ``none`` ones (``partial`` ones are all 2-hop)."""
    gold_in_distractors: bool = True
    """Whether the distractor paragraphs' objects may name the gold answer: True, a guess among the context's names
    can be right with evidence missing (the right confidence then is low, not 0); False, the gold is in the context
    only through its supporting paragraphs, so with all of them missing a right answer is a blind guess."""


def answer_f1(completion: Any, problem: QAProblem) -> float:
    """Token F1 of the extracted answer against the gold (0.0 without an answer or over the length bound)."""
    answer = extract_answer(completion)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    return token_f1(problem.answer, answer)


def _strings(value: Any) -> tuple[str, ...]:
    """A record's list of strings (a list, a NumPy array of a pandas row, or None / NaN for a null) as a tuple."""
    if value is None or isinstance(value, float):
        return ()
    return tuple(str(p) for p in (value.tolist() if hasattr(value, "tolist") else value))


def _text_list(value: Any, where: str, name: str, *, required: bool) -> tuple[str, ...]:
    if value is None and not required:
        return ()
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise TaskFormatError(f"{where}: field '{name}' must be a list of strings, got {type(value).__name__}")
    if not value and required:
        raise TaskFormatError(f"{where}: field '{name}' is empty")
    if len(value) > MAX_PARAGRAPHS:
        raise TaskFormatError(f"{where}: field '{name}' holds over {MAX_PARAGRAPHS} paragraphs ({len(value)})")
    return tuple(check_text(v, f"{where}: field '{name}' item {i}", "paragraph", MAX_PARAGRAPH_CHARS)
                 for i, v in enumerate(value))


def _problem(row: Mapping[str, Any], where: str, fields: Mapping[str, str]) -> QAProblem:
    def column(name: str) -> tuple[str, Any]:
        col, value = mapped_field(row, name, fields)
        return printable(col, 60), value

    q_col, question = column("question")
    a_col, answer = column("answer")
    p_col, paragraphs = column("paragraphs")
    s_col, support = column("support")
    e_col, evidence = column("evidence")
    h_col, hops = column("hops")
    question = check_text(question, where, q_col, MAX_QUESTION_CHARS)
    answer = check_text(answer, where, a_col, MAX_ANSWER_CHARS)
    if not qa_data.normalize_answer(answer):
        raise TaskFormatError(f"{where}: field '{a_col}' is empty after normalisation")
    evidence = check_text(evidence, where, e_col, 16, required=False) or "full"
    if evidence not in EVIDENCE_STATES:
        raise TaskFormatError(f"{where}: field '{e_col}' must be one of {', '.join(EVIDENCE_STATES)}")
    if hops is None:
        hops = 1
    if isinstance(hops, bool) or not isinstance(hops, int) or hops not in (1, 2):
        raise TaskFormatError(f"{where}: field '{h_col}' must be 1 or 2")
    return QAProblem(question=question, answer=answer, paragraphs=_text_list(paragraphs, where, p_col, required=True),
                     support=_text_list(support, where, s_col, required=False), evidence=evidence, hops=hops)


@register_task("qa")
class QATask(Task):
    """Short-answer QA over generated fictional entities; right when the answer matches the gold after
    SQuAD's normalisation; stratum: the evidence state."""

    Options = Options
    system_prompt = SYSTEM_PROMPT
    single_turn_system_prompt = SINGLE_TURN_SYSTEM_PROMPT

    def load(self, path: str, fields: Mapping[str, str] | None = None) -> list[QAProblem]:
        fields = dict(fields or {})
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise ValueError(f"task 'qa': unknown field {printable(unknown[0], 60)!r} in the field mapping "
                             f"(fields: {', '.join(FIELDS)})")
        return problems_of(path, lambda row, where: _problem(row, where, fields))

    def candidates(self, seed: int, cfg: Any = None) -> Iterator[QAProblem | None]:
        o = self.options(cfg)
        return qa_data.problem_stream(seed, n_paragraphs=o.paragraphs, evidence=o.evidence,
                                      two_hop_share=o.two_hop_share, gold_in_distractors=o.gold_in_distractors)

    def strata(self, cfg: Any = None) -> list[Hashable]:
        """The evidence states generated (``Options.evidence``)."""
        return list(self.options(cfg).evidence)

    def identity(self, problem: QAProblem) -> Hashable:
        """The question and its answer: the same fact asked with other evidence is one problem, so a training
        problem never gives away a held-out answer."""
        return (" ".join(problem.question.split()), qa_data.normalize_answer(problem.answer))

    def stratum(self, problem: QAProblem) -> Hashable:
        return problem.evidence

    def to_record(self, problem: QAProblem) -> dict[str, Any]:
        return {"question": problem.question, "answer": problem.answer, "paragraphs": list(problem.paragraphs),
                "support": list(problem.support), "evidence": problem.evidence, "hops": int(problem.hops)}

    def from_record(self, record: Mapping[str, Any]) -> QAProblem:
        return QAProblem(question=str(record["question"]), answer=str(record["answer"]),
                         paragraphs=_strings(record["paragraphs"]), support=_strings(record.get("support")),
                         evidence=str(record["evidence"]), hops=int(record["hops"]))

    def record_fields(self) -> list[Any]:
        import pyarrow as pa

        return [pa.field("question", pa.string(), nullable=False), pa.field("answer", pa.string(), nullable=False),
                pa.field("paragraphs", pa.list_(pa.string()), nullable=False),
                pa.field("support", pa.list_(pa.string()), nullable=True),
                pa.field("evidence", pa.string(), nullable=False), pa.field("hops", pa.int64(), nullable=False)]

    def user_text(self, problem: QAProblem) -> str:
        numbered = "\n".join(f"{i}. {p}" for i, p in enumerate(problem.paragraphs, 1))
        return (f"Paragraphs:\n{numbered}\n\nQuestion: {problem.question}\n\nReason in <think> </think>, then give "
                "only the answer (a name) in <answer> </answer> on the last line. If the paragraphs do not say, give "
                "your best guess.")

    def score(self, completion: Any, problem: QAProblem, *, format_score: float, score: float = 1.0) -> float:
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        if len(answer) > MAX_ANSWER_CHARS:
            return format_score
        return score if exact_match(problem.answer, answer) else format_score

    def warm_start(self, problem: QAProblem, rng: random.Random) -> WarmStart | None:
        """With every supporting paragraph in the context (``full``): the question's subject, the supporting
        paragraphs quoted with their numbers, then the answer. None otherwise: a trace that named the gold
        without the evidence would teach guessing it."""
        if (problem.evidence != "full" or not problem.support
                or any(p not in problem.paragraphs for p in problem.support)):
            return None
        quotes = " ".join(f"Paragraph {problem.paragraphs.index(p) + 1}: {p}" for p in problem.support)
        return WarmStart(reasoning=f"{quotes} So the answer is {problem.answer}.", answer=problem.answer)
