"""Statistics of the pre-registered methods comparison (bench/protocol.yaml, docs/results.md). Pure numpy.

The protocol asks for figures that knowing a task's difficulty cannot earn, for baselines that know exactly
that, and for intervals over training seeds as well as tasks:

1. metrics — accuracy, ECE with equal-width and equal-mass bins, Brier, the Brier skill over a difficulty
   prior, AUROC within each stratum and their mean, pooled AUROC (:func:`protocol_metrics`);
2. baselines — the difficulty prior (a stratum's accuracy on the calibration split); the post-hoc
   recalibration maps (temperature, isotonic, Platt, per stratum) live in :mod:`rlcr.evaluation.recalibration`, each
   fitted on the calibration split and applied to the test answers;
3. the hierarchical bootstrap — resample seeds, then tasks within each drawn seed, scoring every method on the
   same draw so paired differences cancel what the draw shares (:func:`hierarchical_bootstrap`);
4. the decision rules, each goal met or not by its interval (:func:`decide`);
5. the seed level: each figure's per-seed values, their mean and t-interval over seeds (df = n − 1), the
   unit being the training seed (:func:`seed_level`), to which the same rules can be applied.

An evaluation of one method at one seed is an :class:`Answers`: one entry per evaluated answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from rlcr.core.metrics import binned_calibration_error, equal_width_bins, scored_arrays

__all__ = ["Answers", "ece_equal_mass", "within_stratum_auroc", "difficulty_prior", "protocol_metrics",
           "hierarchical_bootstrap", "goals_statistic", "decide", "PROTOCOL_METRICS", "t_quantile",
           "seed_t_interval", "seed_level", "difference_statistic"]


@dataclass
class Answers:
    """The evaluated answers of one method at one training seed (one entry per answer).

    ``confidence`` is NaN where none was parsed; ``prior`` is the difficulty prior's confidence for the
    answer's stratum (NaN until :func:`difficulty_prior` was applied).
    """

    task: np.ndarray
    stratum: np.ndarray
    correct: np.ndarray
    confidence: np.ndarray
    prior: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        # names as strings; integer codes (the bootstrap's, :func:`hierarchical_bootstrap`) kept as they are
        self.task, self.stratum = (x if (x := np.asarray(v)).dtype.kind in "iu" else x.astype(str)
                                   for v in (self.task, self.stratum))
        self.correct = np.asarray(self.correct, dtype=float)
        self.confidence = np.asarray(self.confidence, dtype=float)
        n = self.task.shape[0]
        self.prior = np.full(n, math.nan) if self.prior is None else np.asarray(self.prior, dtype=float)
        for name in ("stratum", "correct", "confidence", "prior"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"Answers.{name} has shape {getattr(self, name).shape}, expected ({n},)")
        if not np.all((self.correct == 0) | (self.correct == 1)):
            raise ValueError("Answers.correct must be 0 or 1")
        ok = np.isnan(self.confidence) | ((self.confidence >= 0) & (self.confidence <= 1))
        if not np.all(ok):
            raise ValueError("Answers.confidence must be NaN or in [0, 1]")

    _codes = None  # not annotated: not a dataclass field
    """A :class:`_Codes`, set only inside :func:`hierarchical_bootstrap`: the strata's number and each
    confidence's tie group, coded once for all its draws. Answers made anew (``with_confidence``, a
    recalibration inside a statistic) have none."""

    @classmethod
    def _trusted(cls, task, stratum, correct, confidence, prior) -> "Answers":
        """Answers from arrays taken out of already checked Answers (rows, concatenations): no second check —
        the bootstrap builds hundreds of thousands of these."""
        a = object.__new__(cls)
        a.task, a.stratum, a.correct, a.confidence, a.prior = task, stratum, correct, confidence, prior
        return a

    def take(self, rows: np.ndarray) -> "Answers":
        a = Answers._trusted(self.task[rows], self.stratum[rows], self.correct[rows], self.confidence[rows],
                             self.prior[rows])
        if self._codes is not None and self._codes.describe(self):
            a._codes = self._codes.of(a, self._codes.confidence[rows])
        return a

    def with_confidence(self, confidence: np.ndarray) -> "Answers":
        return Answers(self.task, self.stratum, self.correct, confidence, self.prior)

    def unparsed_as_zero(self) -> "Answers":
        """The RLCR paper's protocol: an answer without a parsed confidence counts as confidence 0."""
        return self.with_confidence(np.where(np.isnan(self.confidence), 0.0, self.confidence))


# ----------------------------------------------------------------------------------------------- 1. metrics
def _tie_groups(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each confidence's tie group (the distinct values in increasing order) and the size of each group: the one
    sort the equal-mass ECE and the AUROCs of :func:`protocol_metrics` share."""
    _, group, counts = np.unique(c, return_inverse=True, return_counts=True)
    return group.reshape(-1), counts


def _ece_equal_mass(c: np.ndarray, y: np.ndarray, group: np.ndarray, counts: np.ndarray, n_bins: int) -> float:
    ends = np.cumsum(counts)  # where each tie group ends, in the sorted order
    centre = (ends - counts / 2.0)[group]  # centre of each answer's tie group, in [0, N]
    bins = np.minimum((centre * n_bins / c.size).astype(int), n_bins - 1)
    return binned_calibration_error(c, y, bins, n_bins)


def ece_equal_mass(conf: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> float:
    """ECE over ``n_bins`` bins of equal mass: Σ_b (n_b / N)·|mean c_b − acc_b|. An answer goes to bin
    ⌊n_bins · (centre of its confidence's tie group in the sorted order) / N⌋, so equal confidences always share
    a bin and the value does not depend on the answers' order (stated confidences are few distinct values; a
    difficulty prior has one per stratum). A bin holds about N / n_bins answers unless one tie group is larger;
    with fewer distinct confidences than bins there are fewer bins. Unlike equal-width bins, none is empty."""
    c = np.asarray(conf, dtype=float)
    y = np.asarray(correct, dtype=float)
    if not c.size:
        return math.nan
    return _ece_equal_mass(c, y, *_tie_groups(c), n_bins)


def _auroc_from_counts(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mann–Whitney AUROC from the positives and negatives in each tie group (groups in increasing confidence):
    U = Σ_g pos_g · (negatives in lower groups + ½ neg_g). The same integer sums as
    :func:`rlcr.core.metrics.mann_whitney_auroc`'s binary searches, so the same value bit for bit."""
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    if not n_pos or not n_neg:
        return math.nan
    below = np.cumsum(neg) - neg
    return float(((pos * below).sum() + (pos * neg).sum() / 2) / (n_pos * n_neg))


def _aurocs(y: np.ndarray, group: np.ndarray, n_groups: int, code: np.ndarray,
            n_strata: int) -> tuple[float, list[float]]:
    """The pooled AUROC and each stratum's (``code``: each answer's stratum, 0 … n_strata − 1), from counts per
    (stratum, tie group): no sort beyond :func:`_tie_groups`'s."""
    if n_strata * n_groups > 4 * y.size + 1024:  # many strata × many distinct confidences: count what occurs only
        pooled = _auroc_from_counts(*(np.bincount(group[sel], minlength=n_groups) for sel in (y == 1, y == 0)))
        per = []
        for i in range(n_strata):
            inside = code == i
            g, counts = _tie_groups(group[inside])  # the stratum's own tie groups, in the same order
            per.append(_auroc_from_counts(*(np.bincount(g[sel], minlength=counts.size)
                                            for sel in (y[inside] == 1, y[inside] == 0))))
        return pooled, per
    right = y == 1
    cell = code * n_groups + group
    pos = np.bincount(cell[right], minlength=n_strata * n_groups).reshape(n_strata, n_groups)
    neg = np.bincount(cell[~right], minlength=n_strata * n_groups).reshape(n_strata, n_groups)
    return _auroc_from_counts(pos.sum(axis=0), neg.sum(axis=0)), [_auroc_from_counts(p, n) for p, n in zip(pos, neg)]


def within_stratum_auroc(conf: Sequence[float], correct: Sequence[float],
                         strata: Sequence[str]) -> dict[str, object]:
    """AUROC of confidence against correctness inside each stratum, and their unweighted mean over the strata
    where it is defined (both classes present). A confidence that only knows the stratum scores 0.5 here."""
    c, y = scored_arrays(conf, correct)
    keys, code = np.unique(np.asarray(strata).astype(str), return_inverse=True)  # keys sorted
    if code.shape != c.shape:
        raise ValueError(f"strata {code.shape} and confidences {c.shape} must have the same length")
    group, counts = _tie_groups(c)
    per = dict(zip(map(str, keys), _aurocs(y, group, counts.size, code, keys.size)[1]))
    return {"per_stratum": per, "mean": _defined_mean(per.values())}


def _defined_mean(values) -> float:
    defined = [v for v in values if not math.isnan(v)]
    return float(np.mean(defined)) if defined else math.nan


PROTOCOL_METRICS = ("accuracy", "ece", "ece_equal_mass", "brier", "brier_skill", "auroc_within", "auroc")
"""What :func:`protocol_metrics` returns (``auroc_within`` is the mean within-stratum AUROC)."""


def protocol_metrics(a: Answers, n_bins: int = 10) -> dict[str, float]:
    """The protocol's metrics of one set of answers. Accuracy is over every answer; the calibration metrics
    over those with a parsed confidence. ``brier_skill`` = 1 − Brier / Brier(prior) on the same answers
    (NaN until a prior is applied, or when the prior is perfect). ``a`` is checked :class:`Answers`: the
    bootstrap calls this hundreds of thousands of times, so its values are not checked again and the
    confidences are sorted once."""
    out = {"accuracy": float(a.correct.mean()) if a.correct.size else math.nan}
    has = np.isfinite(a.confidence)
    c, y = a.confidence[has], a.correct[has]
    if not c.size:
        return {**out, **{m: math.nan for m in PROTOCOL_METRICS if m != "accuracy"}}
    b = float(np.mean((c - y) ** 2))
    prior = a.prior[has]
    b_prior = float(np.mean((prior - y) ** 2)) if np.all(np.isfinite(prior)) else math.nan
    codes = a._codes
    if codes is not None and codes.describe(a) and codes.n_confidences <= 2 * c.size:  # no sort per draw
        group, code, n_strata = codes.confidence[has], a.stratum[has], codes.n_strata
        counts = np.bincount(group, minlength=codes.n_confidences)  # empty tie groups add nothing
    else:
        group, counts = _tie_groups(c)
        keys, code = np.unique(a.stratum[has], return_inverse=True)
        code, n_strata = code.reshape(-1), keys.size
    pooled, per_stratum = _aurocs(y, group, counts.size, code, n_strata)  # absent strata: NaN, not averaged
    out.update({"ece": binned_calibration_error(c, y, equal_width_bins(c, n_bins), n_bins),
                "ece_equal_mass": _ece_equal_mass(c, y, group, counts, n_bins), "brier": b,
                "brier_skill": 1 - b / b_prior if b_prior > 0 else math.nan,
                "auroc_within": _defined_mean(per_stratum), "auroc": pooled})
    return out


# ----------------------------------------------------------------------------------------------- 2. baselines
def difficulty_prior(calibration: Answers, test: Answers) -> Answers:
    """``test`` with ``prior`` set to the accuracy of each answer's stratum on ``calibration`` (the same
    policy's answers to the calibration tasks). A test stratum absent from calibration gets the overall
    calibration accuracy."""
    if not calibration.correct.size:
        raise ValueError("the calibration answers are empty: no difficulty prior can be fitted")
    overall = float(calibration.correct.mean())
    rates = {k: float(calibration.correct[calibration.stratum == k].mean())
             for k in set(calibration.stratum.tolist())}
    prior = np.asarray([rates.get(k, overall) for k in test.stratum], dtype=float)
    return Answers(test.task, test.stratum, test.correct, test.confidence, prior)


# ----------------------------------------------------------------------------------------------- 3. bootstrap
Statistic = Callable[[Mapping[str, Answers]], Mapping[str, float]]
"""Scores the answers of every method on one draw: ``{method: Answers}`` → ``{name: value}``. Inside
:func:`hierarchical_bootstrap` each answer's stratum and task are integer codes (numbered in the sorted order of
the names), not names: a statistic groups by them (as :func:`protocol_metrics` does) but must not look a name up;
fit anything that needs names (a difficulty prior, a recalibration map) before the bootstrap."""


class _TaskRows:
    """Where each task's answers are in one set of answers: the rows sorted by task (stably, so each task's
    rows stay in their order), and each task's start and count in that order."""

    def __init__(self, a: Answers, tasks: np.ndarray):
        order = np.argsort(a.task, kind="stable")
        sorted_tasks = a.task[order]
        starts = np.searchsorted(sorted_tasks, tasks, side="left")
        self.order, self.starts = order, starts
        self.counts = np.searchsorted(sorted_tasks, tasks, side="right") - starts

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """The rows of tasks ``idx`` (positions in ``tasks``, repeats allowed), task after task: the same as
        concatenating ``flatnonzero(a.task == tasks[i])`` for i in idx, without a Python loop."""
        counts = self.counts[idx]
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        return self.order[np.repeat(self.starts[idx], counts) + within]


def hierarchical_bootstrap(runs: Mapping[str, Mapping[int, Answers]], statistic: Statistic, *,
                           n_resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, object]:
    """Percentile intervals of ``statistic`` from a two-level bootstrap: resample the training seeds with
    replacement, then the test tasks within each drawn seed (all of a task's answers together), and score
    every method on that same draw — so a statistic that is a difference between methods is paired by seed
    and task.

    ``runs``: ``{method: {seed: Answers}}``; every method must have every seed, and within a seed the methods
    are paired on the tasks all of them evaluated. Returns ``{"point", "ci", "per_seed", "n_seeds",
    "n_tasks"}``: the statistic on all the data, its interval, and its value on each seed alone.

    ``statistic`` sees each answer's stratum and task as integer codes numbered in the sorted order of their
    names (so grouping by stratum, and the order of the groups, are as with the names): the bootstrap builds
    hundreds of thousands of answer sets, and copying and sorting strings was most of their cost.
    """
    if not 0 < level < 1 or n_resamples < 1:
        raise ValueError(f"need 0 < level < 1 and n_resamples >= 1, got {level}, {n_resamples}")
    methods = sorted(runs)
    seeds = sorted(set.intersection(*(set(runs[m]) for m in methods))) if methods else []
    if not seeds or any(set(runs[m]) != set(seeds) for m in methods):
        raise ValueError("every method needs answers for the same training seeds")
    tasks = {s: np.asarray(sorted(set.intersection(*(set(runs[m][s].task.tolist()) for m in methods))))
             for s in seeds}
    if any(not t.size for t in tasks.values()):
        raise ValueError("at some seed the methods share no evaluated task: nothing to pair")
    members = {(m, s): _TaskRows(runs[m][s], tasks[s]) for m in methods for s in seeds}
    coded = _coded(runs)

    def score(draw: Sequence[tuple[int, np.ndarray]]) -> Mapping[str, float]:
        return statistic({m: _concat([coded[m][s].take(members[m, s].rows(idx)) for s, idx in draw])
                          for m in methods})

    point = dict(score([(s, np.arange(tasks[s].size)) for s in seeds]))
    per_seed = {s: dict(score([(s, np.arange(tasks[s].size))])) for s in seeds}
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {k: [] for k in point}
    for _ in range(n_resamples):
        picked = rng.choice(seeds, size=len(seeds), replace=True)
        value = score([(s, rng.integers(0, tasks[s].size, size=tasks[s].size)) for s in picked])
        for k in draws:
            draws[k].append(value[k])
    tail = (1 - level) / 2 * 100
    ci = {}
    for k, vals in draws.items():
        v = np.asarray([x for x in vals if not math.isnan(x)], dtype=float)
        ci[k] = [float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))] if v.size else None
    return {"point": point, "ci": ci, "per_seed": per_seed, "n_seeds": len(seeds),
            "n_tasks": {s: int(tasks[s].size) for s in seeds}, "level": level, "n_resamples": n_resamples}


def _coded(runs: Mapping[str, Mapping[int, Answers]]) -> dict[str, dict[int, Answers]]:
    """``runs`` with each answer's stratum and task as integer codes, numbered in the sorted order of the names
    over all of ``runs`` (order-preserving: ``np.unique`` groups and orders the codes as it would the names)."""
    every = [a for by_seed in runs.values() for a in by_seed.values()]
    names = {f: np.unique(np.concatenate([getattr(a, f) for a in every])) for f in ("stratum", "task")}

    def coded(a: Answers, stated: np.ndarray) -> Answers:
        out = Answers._trusted(np.searchsorted(names["task"], a.task), np.searchsorted(names["stratum"], a.stratum),
                               a.correct, a.confidence, a.prior)
        tie = np.searchsorted(stated, np.where(np.isfinite(a.confidence), a.confidence, 0.0))  # NaN: never read
        out._codes = _Codes(names["stratum"].size, stated, tie, out.confidence, out.stratum)
        return out

    out = {}
    for m, by_seed in runs.items():  # a draw scores each method on its own seeds' answers: its own tie groups
        stated = np.unique(np.concatenate([a.confidence[np.isfinite(a.confidence)] for a in by_seed.values()]))
        out[m] = {s: coded(a, stated) for s, a in by_seed.items()}
    return out


@dataclass(frozen=True, eq=False)
class _Codes:
    """What :func:`protocol_metrics` would otherwise sort out of every draw: the number of strata (the answers'
    ``stratum`` are codes below it) and each answer's confidence tie group among ``stated``, the distinct parsed
    confidences of the method's answers at every seed, in increasing order (the same groups, in the same order,
    as sorting one draw's confidences: a group absent from a draw is empty and counts for nothing).

    The codes describe the very arrays ``for_confidence`` and ``for_stratum``: answers whose confidences or strata
    were replaced since (a statistic that rebuilds or reassigns them) are sorted afresh."""

    n_strata: int
    stated: np.ndarray
    confidence: np.ndarray
    for_confidence: np.ndarray
    for_stratum: np.ndarray

    @property
    def n_confidences(self) -> int:
        return self.stated.size

    def describe(self, a: Answers) -> bool:
        return self.for_confidence is a.confidence and self.for_stratum is a.stratum

    def of(self, a: Answers, confidence_codes: np.ndarray) -> "_Codes":
        """The same code space, for ``a``'s arrays (rows of, or a concatenation of, coded answers)."""
        return _Codes(self.n_strata, self.stated, confidence_codes, a.confidence, a.stratum)


def _concat(parts: Sequence[Answers]) -> Answers:
    a = Answers._trusted(*(np.concatenate([getattr(p, f) for p in parts])
                           for f in ("task", "stratum", "correct", "confidence", "prior")))
    first = parts[0]._codes
    if first is not None and all(p._codes is not None and p._codes.stated is first.stated and p._codes.describe(p)
                                 for p in parts):  # one method's seeds: one code space
        a._codes = first.of(a, np.concatenate([p._codes.confidence for p in parts]))
    return a


# ----------------------------------------------------------------------------------------------- 4. decisions
def goals_statistic(methods: Mapping[str, Answers], n_bins: int = 10) -> dict[str, float]:
    """The figures the goals are decided on, for :func:`hierarchical_bootstrap`: RLCR's Brier skill over its
    difficulty prior, and RLCR minus RLVR (and minus recalibrated RLVR, ``rlvr_recalibrated``) in mean
    within-stratum AUROC, ECE and accuracy. ``methods`` needs ``rlcr``, ``rlvr`` and ``rlvr_recalibrated``."""
    m = {k: protocol_metrics(methods[k], n_bins) for k in ("rlcr", "rlvr", "rlvr_recalibrated")}
    return {"brier_skill": m["rlcr"]["brier_skill"],
            "auroc_within_vs_rlvr": m["rlcr"]["auroc_within"] - m["rlvr"]["auroc_within"],
            "auroc_within_vs_recalibrated": m["rlcr"]["auroc_within"] - m["rlvr_recalibrated"]["auroc_within"],
            "ece_vs_rlvr": m["rlcr"]["ece"] - m["rlvr"]["ece"],
            "accuracy_vs_rlvr": m["rlcr"]["accuracy"] - m["rlvr"]["accuracy"]}


NON_INFERIORITY_MARGIN = 0.03
"""Accuracy non-inferiority: the lower bound of RLCR − RLVR must lie above −this (bench/protocol.yaml)."""


def decide(result: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """The protocol's four goals, each met or not by its pre-registered rule (bench/protocol.yaml ``goals``).

    ``result`` is :func:`hierarchical_bootstrap`'s output for a statistic that returns the keys
    ``brier_skill`` (RLCR), ``auroc_within_vs_rlvr``, ``auroc_within_vs_recalibrated``, ``ece_vs_rlvr`` and
    ``accuracy_vs_rlvr`` (RLCR minus the other). A goal whose interval is undefined is not met.
    """
    point, ci = result["point"], result["ci"]

    def rule(key: str, holds: Callable[[list[float]], bool]) -> dict[str, object]:
        interval = ci.get(key)
        return {"figure": point.get(key), "ci": interval, "met": bool(interval is not None and holds(interval))}

    auroc_goal = [rule("auroc_within_vs_rlvr", lambda i: i[0] > 0),
                  rule("auroc_within_vs_recalibrated", lambda i: i[0] > 0)]
    return {
        "brier_skill": rule("brier_skill", lambda i: i[0] > 0),
        "within_stratum_auroc": {"parts": auroc_goal, "met": all(p["met"] for p in auroc_goal)},
        "ece": rule("ece_vs_rlvr", lambda i: i[1] < 0),
        "accuracy_non_inferior": rule("accuracy_vs_rlvr", lambda i: i[0] > -NON_INFERIORITY_MARGIN),
    }


# ----------------------------------------------------------------------------------------------- 5. seed level
T_QUANTILES = {0.975: (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281),
               0.95: (6.3138, 2.9200, 2.3534, 2.1318, 2.0150, 1.9432, 1.8946, 1.8595, 1.8331, 1.8125)}
"""Student's t quantiles for df = 1 … 10 (tests/test_protocol_stats.py checks them against scipy)."""


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile at ``p`` ∈ {0.95, 0.975} for ``df`` = 1 … 10 (3 to 11 training seeds)."""
    if p not in T_QUANTILES or not 1 <= df <= len(T_QUANTILES[p]):
        raise ValueError(f"no t quantile for p = {p}, df = {df} (p in {sorted(T_QUANTILES)}, df 1–10)")
    return T_QUANTILES[p][df - 1]


def seed_t_interval(values: Sequence[float], level: float = 0.95) -> dict[str, object]:
    """The seed-level reading of one figure: the mean of its per-seed values and the t-interval mean ± t·s/√n
    (df = n − 1), the seeds being the units. ``ci`` is None with fewer than two finite values."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    mean = float(v.mean()) if v.size else math.nan
    if v.size < 2:
        return {"mean": mean, "ci": None, "n": int(v.size), "df": max(int(v.size) - 1, 0)}
    half = t_quantile(round(1 - (1 - level) / 2, 6), v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return {"mean": mean, "ci": [mean - half, mean + half], "n": int(v.size), "df": int(v.size) - 1}


def seed_level(result: Mapping[str, object], level: float = 0.95) -> dict[str, object]:
    """:func:`hierarchical_bootstrap`'s ``result`` read at the seed level: per figure, the mean of its per-seed
    values as ``point`` and its t-interval as ``ci`` — the shape :func:`decide` reads, so the same rules can
    be applied to seed-level intervals."""
    per_seed = result["per_seed"]
    keys = list(result["point"])
    read = {k: seed_t_interval([v.get(k) for v in per_seed.values()], level) for k in keys}
    return {"point": {k: r["mean"] for k, r in read.items()}, "ci": {k: r["ci"] for k, r in read.items()},
            "df": {k: r["df"] for k, r in read.items()}}


def difference_statistic(pairs: Mapping[str, tuple[str, str]],
                         metrics: Sequence[str] = ("brier", "ece", "auroc_within"), n_bins: int = 10) -> Statistic:
    """A :data:`Statistic` of paired differences: for each ``name: (a, b)`` of ``pairs`` and each metric,
    ``"name:metric"`` = metric(a) − metric(b), a and b being keys of the bootstrap's ``runs``."""
    def statistic(methods: Mapping[str, Answers]) -> dict[str, float]:
        scores = {k: protocol_metrics(v, n_bins) for k, v in methods.items()}
        return {f"{name}:{m}": scores[a][m] - scores[b][m] for name, (a, b) in pairs.items() for m in metrics}
    return statistic
