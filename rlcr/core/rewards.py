"""RLCR rewards (docs/design.md §5): accuracy for answers, Brier for confidences; one answer reward per method (§11).

Pure Python: the same functions score training rollouts, evaluation and the probe.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from rlcr.core.methods import METHODS
from rlcr.tasks.base import Task

__all__ = [
    "accuracy_reward",
    "parse_confidence",
    "brier_reward",
    "METHODS",
    "ANSWER_REWARDS",
    "register_answer_reward",
    "answer_reward",
    "split_single_turn",
]


# A plain decimal number: "0.7", ".7", "1", "0.70", "7e-1". No sign other than
# "+"/"-" (range-checked after), no "%", no nan/inf spellings.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_MAX_CONFIDENCE_CHARS = 32


def accuracy_reward(completion: str, task: Any, kind: Task) -> float:
    """1.0 iff the task's :meth:`~rlcr.tasks.base.Task.score` gives the full ``score`` for this completion, else
    0.0 (whatever the config's ``format_score``: a formatted but wrong answer earns no accuracy). ``task`` is a
    problem of the task ``kind`` (:meth:`~rlcr.tasks.base.Task.accuracy`: whatever form of a problem ``kind``
    takes there)."""
    return kind.accuracy(completion, task)


def parse_confidence(text: str) -> float | None:
    """The stated confidence: content of the last ``<confidence>…</confidence>``.

    Returns a finite float in [0, 1], or None when the tag is missing or its
    content is empty, not a plain number, NaN/inf, a percentage, or out of range.
    """
    if not isinstance(text, str):
        return None
    end = text.rfind("</confidence>")
    if end < 0:
        return None
    start = text.rfind("<confidence>", 0, end)
    if start < 0:
        return None
    content = text[start + len("<confidence>"):end].strip()
    if not content or len(content) > _MAX_CONFIDENCE_CHARS or not _NUMBER.fullmatch(content):
        return None
    value = float(content)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return None
    return value + 0.0  # normalise -0.0


def brier_reward(confidence_text: str, correct: float) -> float:
    """``1 − (correct − c)²`` for a parseable confidence c, else 0 (docs/design.md §5).

    ``correct`` is the parent answer's accuracy reward, 0 or 1.
    """
    if correct not in (0, 1):
        raise ValueError(f"correct must be 0 or 1, got {correct!r}")
    c = parse_confidence(confidence_text)
    if c is None:
        return 0.0
    return 1.0 - (float(correct) - c) ** 2


# -------------------------------------------------------------------- per-method answer rewards (docs/design.md §9)

AnswerReward = Callable[..., float]
ANSWER_REWARDS: dict[str, AnswerReward] = {}
"""method → reward of one answer-turn completion: ``fn(completion, task, *, lambda_conf, kind) -> float``
(``task``: a problem of the task ``kind``)."""


def register_answer_reward(*methods: str) -> Callable[[AnswerReward], AnswerReward]:
    """Register the decorated function as the answer reward of ``methods``."""

    def register(fn: AnswerReward) -> AnswerReward:
        for method in methods:
            if method not in METHODS:
                raise ValueError(f"unknown method {method!r} (one of {', '.join(METHODS)})")
            ANSWER_REWARDS[method] = fn
        return fn

    return register


def split_single_turn(completion: str) -> tuple[str, str]:
    """A one-turn response → (answer part, confidence part), split where the confidence section starts (the
    first ``<analysis>`` or ``<confidence>``). The answer part is scored exactly like a turn-1 answer (the
    extraction reads its last line, docs/design.md §2–§4), so text after it cannot hide the answer or change its
    score."""
    cuts = [i for i in (completion.find("<analysis>"), completion.find("<confidence>")) if i >= 0]
    cut = min(cuts) if cuts else len(completion)
    return completion[:cut].rstrip(), completion[cut:]


@register_answer_reward("rlcr", "rlvr")
def accuracy_only(completion: str, task: Any, *, lambda_conf: float, kind: Task) -> float:
    """``acc``: two-turn RLCR trains the confidence in its own turn; RLVR does not train it at all."""
    return accuracy_reward(completion, task, kind)


@register_answer_reward("rlcr_single")
def accuracy_plus_brier(completion: str, task: Any, *, lambda_conf: float, kind: Task) -> float:
    """``acc + λ_conf·(1 − (acc − c)²)`` for the one response that holds the answer *and* its confidence;
    the Brier part is 0 when no confidence parses (docs/design.md §9). ``acc`` is that of the answer part
    (:func:`split_single_turn`), ``c`` the confidence stated after it."""
    answer, confidence = split_single_turn(completion)
    acc = accuracy_reward(answer, task, kind)
    return acc + lambda_conf * brier_reward(confidence, acc)


def answer_reward(method: str) -> AnswerReward:
    """The registered answer reward of ``method``."""
    try:
        return ANSWER_REWARDS[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r} (one of {', '.join(sorted(ANSWER_REWARDS))})") from None
