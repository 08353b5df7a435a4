"""Post-hoc recalibration maps, each fitted on one set of answers (a calibration split) and applied to another.
Pure numpy; the baselines of the pre-registered comparison (:mod:`rlcr.evaluation.protocol_stats`, docs/results.md).

- temperature scaling: σ(logit(c) / T), T by golden-section search on the log loss (:func:`fit_temperature`);
- isotonic regression by pool-adjacent-violators (:func:`fit_isotonic`);
- Platt scaling: σ(a + b·logit(c)) by Newton's method (:func:`fit_platt`);
- any of them per stratum, with the pooled map as the fallback (:func:`fit_per_stratum`).

Each ``fit_*`` ignores answers without a parsed confidence; each ``apply_*`` keeps a NaN confidence NaN.
bench/protocol.yaml and bench/protocol-2.yaml, committed before this module was split out of
rlcr/protocol_stats.py (2026-11-29, the code unchanged; that module is now rlcr/evaluation/protocol_stats.py), name
these functions there.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

__all__ = ["fit_temperature", "apply_temperature", "fit_isotonic", "apply_isotonic", "fit_platt", "apply_platt",
           "fit_per_stratum", "apply_per_stratum"]

_EPS = 1e-6
"""Confidences are clipped to [ε, 1 − ε] before taking their logit."""


def _logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, _EPS, 1 - _EPS)
    return np.log(c) - np.log1p(-c)


def _log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, _EPS, 1 - _EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def apply_temperature(conf: Sequence[float], temperature: float) -> np.ndarray:
    """σ(logit(c) / T); NaN confidences stay NaN."""
    c = np.asarray(conf, dtype=float)
    return 1.0 / (1.0 + np.exp(-_logit(c) / temperature))


def fit_temperature(conf: Sequence[float], correct: Sequence[float], *, lo: float = 0.05,
                    hi: float = 20.0, iterations: int = 80) -> float:
    """The temperature T ∈ [lo, hi] minimising the log loss of σ(logit(c)/T), by golden-section search on
    log T (the loss is unimodal in T for fixed data). Answers without a confidence are ignored."""
    c, y = np.asarray(conf, dtype=float), np.asarray(correct, dtype=float)
    has = np.isfinite(c)
    c, y = c[has], y[has]
    if not c.size:
        raise ValueError("no parsed confidence to fit a temperature on")
    loss = lambda log_t: _log_loss(apply_temperature(c, math.exp(log_t)), y)  # noqa: E731
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = loss(x1), loss(x2)
    for _ in range(iterations):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = loss(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = loss(x2)
    return float(math.exp((a + b) / 2))


def fit_isotonic(conf: Sequence[float], correct: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Isotonic (non-decreasing) regression of correctness on confidence by pool-adjacent-violators.
    Returns ``(knots, values)``: the fitted value at each distinct calibration confidence."""
    c, y = np.asarray(conf, dtype=float), np.asarray(correct, dtype=float)
    has = np.isfinite(c)
    if not has.any():
        raise ValueError("no parsed confidence to fit an isotonic map on")
    knots, inverse = np.unique(c[has], return_inverse=True)
    sums = np.bincount(inverse, weights=y[has])
    counts = np.bincount(inverse).astype(float)
    blocks: list[list[float]] = []  # [sum, count, number of knots]
    for s, n in zip(sums, counts):
        blocks.append([s, n, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s2, n2, k2 = blocks.pop()
            blocks[-1][0] += s2
            blocks[-1][1] += n2
            blocks[-1][2] += k2
    values = np.concatenate([np.full(int(k), s / n) for s, n, k in blocks])
    return knots, values


def apply_isotonic(conf: Sequence[float], fitted: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The isotonic map at ``conf``, linear between knots and flat outside them; NaN stays NaN."""
    c = np.asarray(conf, dtype=float)
    knots, values = fitted
    out = np.interp(np.nan_to_num(c, nan=0.0), knots, values)
    return np.where(np.isnan(c), math.nan, out)


def fit_platt(conf: Sequence[float], correct: Sequence[float], *, ridge: float = 1e-8,
              iterations: int = 50) -> tuple[float, float]:
    """Platt scaling: the logistic regression P(correct) = σ(a + b·logit(c)) by Newton's method (IRLS), with a
    ridge of ``ridge``·N on (a, b) so that a separable or constant-confidence fit stays finite (a constant
    confidence gives σ(a + b·x) = the fitted rate). Answers without a confidence are ignored. Returns (a, b)."""
    c, y = np.asarray(conf, dtype=float), np.asarray(correct, dtype=float)
    has = np.isfinite(c)
    if not has.any():
        raise ValueError("no parsed confidence to fit a Platt map on")
    x = np.column_stack([np.ones(int(has.sum())), _logit(c[has])])
    y = y[has]
    lam = ridge * y.size
    w = np.zeros(2)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        grad = x.T @ (p - y) + lam * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + lam * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w = w - step
        if np.max(np.abs(step)) < 1e-10:
            break
    return float(w[0]), float(w[1])


def apply_platt(conf: Sequence[float], fitted: tuple[float, float]) -> np.ndarray:
    """σ(a + b·logit(c)); NaN confidences stay NaN."""
    a, b = fitted
    return 1.0 / (1.0 + np.exp(-(a + b * _logit(np.asarray(conf, dtype=float)))))


def fit_per_stratum(fit: Callable, conf: Sequence[float], correct: Sequence[float],
                    strata: Sequence[str]) -> dict[str, object]:
    """``fit`` (e.g. :func:`fit_platt`, :func:`fit_isotonic`) on each stratum's answers alone, and on all of
    them under ``""`` (the map of a stratum with no parsed confidence to fit on)."""
    c, y, s = np.asarray(conf, dtype=float), np.asarray(correct, dtype=float), np.asarray(strata).astype(str)
    out = {"": fit(c, y)}
    for k in np.unique(s):
        if np.isfinite(c[s == k]).any():
            out[str(k)] = fit(c[s == k], y[s == k])
    return out


def apply_per_stratum(apply: Callable, conf: Sequence[float], strata: Sequence[str],
                      fitted: Mapping[str, object]) -> np.ndarray:
    """Each answer's confidence through its stratum's map of :func:`fit_per_stratum` (the pooled one where its
    stratum had none)."""
    c, s = np.asarray(conf, dtype=float), np.asarray(strata).astype(str)
    out = np.full(c.shape, math.nan)
    for k in np.unique(s):
        out[s == k] = apply(c[s == k], fitted.get(str(k), fitted[""]))
    return out
