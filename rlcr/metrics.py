"""Calibration metrics (SPEC §9), shared by the training flow's evaluation and the probe.

Inputs are confidences c ∈ [0, 1] and correctness labels y ∈ {0, 1}. Pure numpy.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["accuracy", "brier", "ece", "auroc", "reliability_bins", "calibration_metrics"]


def _arrays(conf: Sequence[float], correct: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(conf, dtype=float)
    y = np.asarray(correct, dtype=float)
    if c.shape != y.shape or c.ndim != 1:
        raise ValueError(f"confidences {c.shape} and labels {y.shape} must be 1-d of the same length")
    if not np.all(np.isfinite(c)) or np.any((c < 0) | (c > 1)):
        raise ValueError("confidences must be finite and in [0, 1]")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 0 or 1")
    return c, y


def accuracy(correct: Sequence[float]) -> float:
    y = np.asarray(correct, dtype=float)
    return float(y.mean()) if y.size else math.nan


def brier(conf: Sequence[float], correct: Sequence[float]) -> float:
    """mean((c − y)²)."""
    c, y = _arrays(conf, correct)
    return float(np.mean((c - y) ** 2)) if c.size else math.nan


def _bin_index(c: np.ndarray, n_bins: int) -> np.ndarray:
    # equal-width bins [0, .1), [.1, .2), …, [.9, 1.0]; c = 1 falls in the last one
    return np.minimum((c * n_bins).astype(int), n_bins - 1)


def reliability_bins(conf: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> list[dict]:
    """Per equal-width bin: range, count, mean confidence and accuracy (None for empty bins)."""
    c, y = _arrays(conf, correct)
    idx = _bin_index(c, n_bins)
    out = []
    for b in range(n_bins):
        sel = idx == b
        n = int(sel.sum())
        out.append({
            "lo": b / n_bins, "hi": (b + 1) / n_bins, "count": n,
            "mean_confidence": float(c[sel].mean()) if n else None,
            "accuracy": float(y[sel].mean()) if n else None,
        })
    return out


def ece(conf: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> float:
    """Expected calibration error: Σ_b (n_b / N)·|mean c_b − acc_b| over non-empty equal-width bins."""
    c, _ = _arrays(conf, correct)
    if not c.size:
        return math.nan
    return float(sum(b["count"] / c.size * abs(b["mean_confidence"] - b["accuracy"])
                     for b in reliability_bins(conf, correct, n_bins) if b["count"]))


def auroc(conf: Sequence[float], correct: Sequence[float]) -> float:
    """Area under the ROC curve of c as a score for y = 1 (Mann–Whitney U, ties count ½).

    NaN when only one class is present (the AUROC is undefined).
    """
    c, y = _arrays(conf, correct)
    n_pos, n_neg = int(y.sum()), int((1 - y).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(c, kind="mergesort")
    ranks = np.empty(c.size, dtype=float)
    sorted_c = c[order]
    i = 0
    while i < c.size:  # average ranks over ties
        j = i
        while j + 1 < c.size and sorted_c[j + 1] == sorted_c[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def calibration_metrics(conf: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> dict:
    """Accuracy, mean confidence, Brier, ECE, AUROC and the reliability bins of one evaluation."""
    c, y = _arrays(conf, correct)
    return {
        "n": int(c.size),
        "accuracy": accuracy(y),
        "mean_confidence": float(c.mean()) if c.size else math.nan,
        "brier": brier(c, y),
        "ece": ece(c, y, n_bins),
        "auroc": auroc(c, y),
        "reliability": reliability_bins(c, y, n_bins),
    }
