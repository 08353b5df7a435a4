"""Probe-specific metrics (docs/design.md §15): early-answering curves, AOC, verbalized-vs-Monte-Carlo gap.

Pure numpy. A *curve* is one trace's points ``(x, y)``: x = share of the
reasoning tokens shown (0 … 1, increasing, first 0 and last 1), y = the
Monte-Carlo success rate of the forced answer at that point (correct / N).
The calibration metrics (docs/design.md §13) are :func:`rlcr.core.metrics.calibration_metrics`,
the same implementation the training flow's evaluation uses.

AOC, exactly (after Lanham et al. 2023, "early answering"):

    AUC_i = ∫₀¹ y_i(x) dx     (trapezoid rule over trace i's own points)
    AOC_L = mean over the n_L traces with L truncation points of (1 − AUC_i)
    AOC   = Σ_L (n_L / n) · AOC_L

i.e. each trace length L (number of truncation points: sentences + 2, or 11
fixed fractions) contributes in proportion to how many traces have it. Because
the AUC is linear in the curve, this equals the plain mean of 1 − AUC_i over
traces; ``aoc_by_length`` is reported too. Note the curve here is the success
rate, not agreement with the final answer as in Lanham et al.: AOC is 1 for a
model that is never right and 0 for one that is right even with no reasoning;
compare it with the success rate at 100% (``mc_full``) to read how much the
answer depends on the reasoning.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

import numpy as np

__all__ = ["Curve", "check_curve", "curve_auc", "curve_aoc", "aoc", "mean_curve", "verbalized_gap", "GRID"]

Curve = tuple[Sequence[float], Sequence[float]]
GRID = tuple(i / 20 for i in range(21))


def check_curve(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Validate one curve: same length ≥ 1, x non-decreasing in [0, 1], y in [0, 1]."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.shape != ys.shape or xs.ndim != 1 or xs.size == 0:
        raise ValueError(f"a curve needs matching 1-d x and y with at least one point, got {xs.shape} and {ys.shape}")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError("curve values must be finite")
    if np.any(np.diff(xs) < 0) or xs[0] < 0 or xs[-1] > 1:
        raise ValueError(f"curve x must be non-decreasing in [0, 1], got {xs.tolist()}")
    if np.any((ys < 0) | (ys > 1)):
        raise ValueError(f"curve y must be in [0, 1], got {ys.tolist()}")
    return xs, ys


def curve_auc(x: Sequence[float], y: Sequence[float]) -> float:
    """∫₀¹ y dx by the trapezoid rule; a single point (or all x equal) counts as a flat curve."""
    xs, ys = check_curve(x, y)
    if xs[-1] - xs[0] == 0:
        return float(ys.mean())
    # extend flat to 0 and 1 if the curve does not span them (it always does in the probe)
    xs = np.concatenate([[0.0], xs, [1.0]])
    ys = np.concatenate([[ys[0]], ys, [ys[-1]]])
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2))


def curve_aoc(x: Sequence[float], y: Sequence[float]) -> float:
    """1 − AUC of one trace."""
    return 1.0 - curve_auc(x, y)


def aoc(curves: Sequence[Curve]) -> dict:
    """Length-weighted AOC over traces (module doc): ``{"aoc", "n_traces", "aoc_by_length"}``."""
    groups: dict[int, list[float]] = defaultdict(list)
    for x, y in curves:
        groups[len(x)].append(curve_aoc(x, y))
    n = sum(len(v) for v in groups.values())
    if n == 0:
        return {"aoc": math.nan, "n_traces": 0, "aoc_by_length": {}}
    by_length = {str(L): {"n": len(v), "aoc": float(np.mean(v))} for L, v in sorted(groups.items())}
    total = sum(g["n"] / n * g["aoc"] for g in by_length.values())
    return {"aoc": float(total), "n_traces": n, "aoc_by_length": by_length}


def mean_curve(curves: Sequence[Curve], grid: Sequence[float] = GRID) -> dict:
    """Curves interpolated (piecewise linearly) onto ``grid`` and summarised per grid point.

    Returns lists over the grid: ``mean``, ``std`` (population), ``p10``, ``p90``,
    plus ``n`` traces. Linear interpolation keeps the mean curve's AUC equal to
    the mean of the traces' AUCs (on a grid that contains their points).
    """
    g = np.asarray(grid, dtype=float)
    if not curves:
        nan = [math.nan] * len(g)
        return {"x": g.tolist(), "mean": nan, "std": nan, "p10": nan, "p90": nan, "n": 0}
    m = np.stack([np.interp(g, *check_curve(x, y)) for x, y in curves])
    return {
        "x": g.tolist(),
        "mean": m.mean(0).tolist(),
        "std": m.std(0).tolist(),
        "p10": np.percentile(m, 10, axis=0).tolist(),
        "p90": np.percentile(m, 90, axis=0).tolist(),
        "n": int(m.shape[0]),
    }


def verbalized_gap(verbalized: Sequence[float | None], mc_full: Sequence[float]) -> dict:
    """Verbalized confidence (turn 2) minus the Monte-Carlo success rate at 100% reasoning, per task.

    Tasks whose verbalized confidence did not parse (None) are left out and
    counted in ``n_unparsed``. ``mean`` is the signed gap (> 0: over-confident
    relative to the model's own forced-answer success rate), ``mean_abs`` its
    magnitude, ``rmse`` the root mean square; NaN when no task has both.
    """
    if len(verbalized) != len(mc_full):
        raise ValueError(f"{len(verbalized)} verbalized confidences but {len(mc_full)} Monte-Carlo rates")
    gaps = np.array([c - p for c, p in zip(verbalized, mc_full) if c is not None], dtype=float)
    n = int(gaps.size)
    return {
        "n": n,
        "n_unparsed": len(verbalized) - n,
        "mean": float(gaps.mean()) if n else math.nan,
        "mean_abs": float(np.abs(gaps).mean()) if n else math.nan,
        "rmse": float(np.sqrt(np.mean(gaps**2))) if n else math.nan,
    }
