"""RLCR rewards (SPEC §4): accuracy for answers, Brier for confidences.

Pure Python: the same functions score training rollouts, evaluation and the probe.
"""

from __future__ import annotations

import math
import re
from typing import Any

from rlcr.tasks.countdown import CountdownTask, compute_score

__all__ = [
    "accuracy_reward",
    "parse_confidence",
    "brier_reward",
]

# A plain decimal number: "0.7", ".7", "1", "0.70", "7e-1". No sign other than
# "+"/"-" (range-checked after), no "%", no nan/inf spellings.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_MAX_CONFIDENCE_CHARS = 32


def _ground_truth(task: CountdownTask | dict[str, Any]) -> dict[str, Any]:
    return task.ground_truth if isinstance(task, CountdownTask) else task


def accuracy_reward(completion: str, task: CountdownTask | dict[str, Any]) -> float:
    """1.0 iff :func:`compute_score` gives the full ``score`` for this completion, else 0.0 (whatever the
    config's ``format_score``: a formatted but wrong answer earns no accuracy)."""
    return 1.0 if compute_score(completion, _ground_truth(task), format_score=0.0, score=1.0) == 1.0 else 0.0


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
    """``1 − (correct − c)²`` for a parseable confidence c, else 0 (SPEC §4).

    ``correct`` is the parent answer's accuracy reward, 0 or 1.
    """
    if correct not in (0, 1):
        raise ValueError(f"correct must be 0 or 1, got {correct!r}")
    c = parse_confidence(confidence_text)
    if c is None:
        return 0.0
    return 1.0 - (float(correct) - c) ** 2
