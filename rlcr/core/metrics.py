"""Calibration metrics (docs/design.md §13), shared by the training flow's evaluation and the probe.

Inputs are confidences c ∈ [0, 1] and correctness labels y ∈ {0, 1}. Pure numpy.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["accuracy", "brier", "ece", "auroc", "reliability_bins", "calibration_metrics", "bootstrap_intervals",
           "paired_bootstrap_differences", "CI_METRICS"]


def scored_arrays(conf: Sequence[float], correct: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """``conf`` and ``correct`` as float arrays, checked: 1-d, the same length, confidences finite in [0, 1],
    labels 0 or 1."""
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
    c, y = scored_arrays(conf, correct)
    return float(np.mean((c - y) ** 2)) if c.size else math.nan


def equal_width_bins(c: np.ndarray, n_bins: int) -> np.ndarray:
    """Each confidence's equal-width bin, 0 … n_bins − 1."""
    # equal-width bins [0, .1), [.1, .2), …, [.9, 1.0]; c = 1 falls in the last one
    return np.minimum((c * n_bins).astype(int), n_bins - 1)


def reliability_bins(conf: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> list[dict]:
    """Per equal-width bin: range, count, mean confidence and accuracy (None for empty bins)."""
    c, y = scored_arrays(conf, correct)
    idx = equal_width_bins(c, n_bins)
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
    c, y = scored_arrays(conf, correct)
    if not c.size:
        return math.nan
    return binned_calibration_error(c, y, equal_width_bins(c, n_bins), n_bins)


def binned_calibration_error(c: np.ndarray, y: np.ndarray, bins: np.ndarray, n_bins: int) -> float:
    """Σ_b (n_b / N)·|mean c_b − acc_b| over the non-empty bins, given each answer's bin (0 … n_bins − 1): the
    per-bin counts and sums in one pass each (``np.bincount``), the bins summed in order."""
    n = np.bincount(bins, minlength=n_bins)
    has = n > 0
    n, sum_c, sum_y = n[has], np.bincount(bins, c, n_bins)[has], np.bincount(bins, y, n_bins)[has]
    return float(sum((n / c.size * np.abs(sum_c / n - sum_y / n)).tolist()))


def auroc(conf: Sequence[float], correct: Sequence[float]) -> float:
    """Area under the ROC curve of c as a score for y = 1 (Mann–Whitney U, ties count ½).

    NaN when only one class is present (the AUROC is undefined).
    """
    c, y = scored_arrays(conf, correct)
    return mann_whitney_auroc(c[y == 1], c[y == 0])


def mann_whitney_auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    """U / (n_pos · n_neg) with U = Σ over positives of #(negatives below) + ½ · #(negatives equal): one sort of
    the negatives and two binary searches, no ranks. U is a sum of halves, exact in floating point, so the value
    is the same bit for bit as from the rank sum. NaN when either class is empty."""
    if not pos.size or not neg.size:
        return math.nan
    neg = np.sort(neg)
    below, upto = np.searchsorted(neg, pos, side="left"), np.searchsorted(neg, pos, side="right")
    return float((below.sum() + (upto - below).sum() / 2) / (pos.size * neg.size))


def calibration_metrics(conf: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> dict:
    """Accuracy, mean confidence, Brier, ECE, AUROC and the reliability bins of one evaluation."""
    c, y = scored_arrays(conf, correct)
    return {
        "n": int(c.size),
        "accuracy": accuracy(y),
        "mean_confidence": float(c.mean()) if c.size else math.nan,
        "brier": brier(c, y),
        "ece": ece(c, y, n_bins),
        "auroc": auroc(c, y),
        "reliability": reliability_bins(c, y, n_bins),
    }


CI_METRICS = ("accuracy", "ece", "brier", "auroc")
"""The metrics :func:`bootstrap_intervals` gives intervals for."""


def bootstrap_intervals(
    conf: Sequence[float],
    correct: Sequence[float],
    groups: Sequence[object],
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    n_bins: int = 10,
) -> dict[str, list[float] | None]:
    """Percentile bootstrap intervals of accuracy, ECE, Brier and AUROC, resampling *groups* (docs/design.md §9).

    One entry per evaluated answer: ``conf`` its stated confidence (NaN where none parsed), ``correct``
    its label, ``groups`` its task. Each resample draws as many tasks as there are, with replacement, and
    keeps all answers of each drawn task (answers of one task are not independent). Accuracy is over all
    answers of the resample, the calibration metrics over those with a confidence, as in the point
    estimates. Returns ``{metric: [low, high]}`` (``None`` where no resample defines it: AUROC needs both
    classes).
    """
    _check_level(level, n_resamples)
    c = np.asarray(conf, dtype=float)
    y = np.asarray(correct, dtype=float)
    if not (c.shape == y.shape == (len(groups),)):
        raise ValueError(f"conf {c.shape}, correct {y.shape} and groups ({len(groups)}) must be 1-d of one length")
    has_conf = np.isfinite(c)
    scored_arrays(c[has_conf], y[has_conf])  # the same checks as the point estimates
    keys, group_index = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    members = [np.flatnonzero(group_index == g) for g in range(len(keys))]
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {m: [] for m in CI_METRICS}
    for _ in range(n_resamples if len(keys) else 0):
        rows = np.concatenate([members[g] for g in rng.integers(0, len(keys), size=len(keys))])
        for m, v in _subset_metrics(c, y, rows, n_bins).items():
            draws[m].append(v)
    return {m: _percentile_interval(draws[m], level) for m in CI_METRICS}


def _check_level(level: float, n_resamples: int) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")


def _subset_metrics(c: np.ndarray, y: np.ndarray, rows: np.ndarray, n_bins: int) -> dict[str, float]:
    """Accuracy over the answers ``rows``; Brier, ECE and AUROC over those of them with a confidence (NaN
    where none has one)."""
    out = {"accuracy": float(y[rows].mean()) if rows.size else math.nan}
    rows = rows[np.isfinite(c[rows])]
    cs, ys = c[rows], y[rows]
    out.update({"brier": float(np.mean((cs - ys) ** 2)) if rows.size else math.nan,
                "ece": ece(cs, ys, n_bins) if rows.size else math.nan,
                "auroc": auroc(cs, ys) if rows.size else math.nan})
    return out


def _percentile_interval(values: Sequence[float], level: float) -> list[float] | None:
    vals = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    tail = (1 - level) / 2 * 100
    return [float(np.percentile(vals, tail)), float(np.percentile(vals, 100 - tail))] if vals.size else None


def paired_bootstrap_differences(
    a: Sequence[tuple[object, float, float]],
    b: Sequence[tuple[object, float, float]],
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    n_bins: int = 10,
) -> dict[str, object]:
    """Metric of ``a`` minus metric of ``b`` on the tasks both evaluated, with a paired percentile bootstrap
    interval (docs/design.md §9): each resample draws tasks with replacement and scores *both* evaluations on the same
    draw, so the variation that comes from which tasks are easy cancels out of the difference.

    ``a``/``b``: one ``(task, correct, confidence or NaN)`` per evaluated answer. Tasks that only one side
    evaluated are left out (``n_tasks`` counts the shared ones). Returns ``{"n_tasks", "level",
    "differences": {metric: {"difference", "ci"}}}``; a difference whose interval excludes 0 is resolved at
    ``level``. Raises ``ValueError`` when the two share no task.
    """
    _check_level(level, n_resamples)

    def arrays(side):
        groups = [str(g) for g, _, _ in side]
        y = np.asarray([float(v) for _, v, _ in side], dtype=float)
        c = np.asarray([math.nan if v is None else float(v) for _, _, v in side], dtype=float)
        scored_arrays(c[np.isfinite(c)], y[np.isfinite(c)])
        return groups, y, c

    ga, ya, ca = arrays(a)
    gb, yb, cb = arrays(b)
    shared = sorted(set(ga) & set(gb))
    if not shared:
        raise ValueError("the two evaluations share no task: nothing to pair")
    index = {k: i for i, k in enumerate(shared)}
    members_a, members_b = [[] for _ in shared], [[] for _ in shared]
    for i, g in enumerate(ga):
        if g in index:
            members_a[index[g]].append(i)
    for i, g in enumerate(gb):
        if g in index:
            members_b[index[g]].append(i)
    members_a = [np.asarray(m, dtype=int) for m in members_a]
    members_b = [np.asarray(m, dtype=int) for m in members_b]

    def difference(draw) -> dict[str, float]:
        ma = _subset_metrics(ca, ya, np.concatenate([members_a[g] for g in draw]), n_bins)
        mb = _subset_metrics(cb, yb, np.concatenate([members_b[g] for g in draw]), n_bins)
        return {m: ma[m] - mb[m] for m in CI_METRICS}

    point = difference(range(len(shared)))
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {m: [] for m in CI_METRICS}
    for _ in range(n_resamples):
        for m, v in difference(rng.integers(0, len(shared), size=len(shared))).items():
            draws[m].append(v)
    return {"n_tasks": len(shared), "level": level,
            "differences": {m: {"difference": None if math.isnan(point[m]) else point[m],
                                "ci": _percentile_interval(draws[m], level)} for m in CI_METRICS}}
