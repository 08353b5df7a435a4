"""The pre-registered comparison's statistics (rlcr/protocol_stats.py): each test checks a property a wrong
implementation would break."""

import math

import numpy as np
import pytest

from rlcr.protocol_stats import (Answers, apply_isotonic, apply_temperature, decide, difficulty_prior,
                             ece_equal_mass, fit_isotonic, fit_temperature, goals_statistic,
                             hierarchical_bootstrap, protocol_metrics, within_stratum_auroc)
from rlcr.metrics import auroc


def _answers(rng, n_tasks=60, per_task=4, *, skill=1.0, prefix="t", conf_noise=0.0):
    """Two strata (easy p=0.7, hard p=0.2); a confidence that knows each answer's correctness with ``skill``."""
    task, stratum, correct, conf = [], [], [], []
    for t in range(n_tasks):
        s = "2" if t % 2 == 0 else "3"
        p = 0.7 if s == "2" else 0.2
        for _ in range(per_task):
            y = float(rng.random() < p)
            task.append(f"{prefix}{t}")
            stratum.append(s)
            correct.append(y)
            c = p + skill * (0.25 if y else -0.15) + conf_noise * rng.normal()
            conf.append(float(np.clip(c, 0.01, 0.99)))
    return Answers(task, stratum, correct, conf)


def test_equal_mass_ece_is_zero_when_each_bin_is_calibrated_and_positive_otherwise():
    c = np.repeat([0.1, 0.5, 0.9], 10)
    y = np.concatenate([[1] + [0] * 9, [1] * 5 + [0] * 5, [1] * 9 + [0]])
    assert ece_equal_mass(c, y, n_bins=3) == pytest.approx(0.0)
    assert ece_equal_mass(np.full(30, 0.9), y, n_bins=3) > 0.3


def test_equal_mass_ece_keeps_ties_in_one_bin_whatever_the_answers_order():
    """Stated confidences are a few distinct values: were ties split by row order, the answers' order (e.g.
    tasks sorted by id, which tracks difficulty) would change the ECE of the same answers."""
    rng = np.random.default_rng(3)
    c = rng.choice([0.2, 0.5, 0.8], size=3000)
    y = np.zeros(c.size)
    for v in (0.2, 0.5, 0.8):  # within each tie group, in row order: the first answers right, the rest wrong
        rows = np.flatnonzero(c == v)
        y[rows[: int(round(v * rows.size))]] = 1.0
    base = ece_equal_mass(c, y)
    for _ in range(5):
        p = rng.permutation(c.size)
        assert ece_equal_mass(c[p], y[p]) == pytest.approx(base, abs=1e-12)
    # each value calibrated on its own answers: zero (split by row order, its bins would be all right or all wrong)
    assert base == pytest.approx(0.0, abs=1e-3)
    # one constant confidence: one bin, |c − overall accuracy|
    assert ece_equal_mass(np.full(3000, 0.9), y) == pytest.approx(abs(0.9 - y.mean()))


def test_the_fast_auroc_and_equal_mass_bins_equal_their_rank_definitions_bit_for_bit():
    """The bootstrap scores ~10⁵ draws, so AUROC counts negatives below each positive and the equal-mass bins
    find tie groups in one sort; both must give exactly what the textbook definitions give (average ranks;
    tie-group centres from ``np.unique``), so a table rebuilt from the records does not move."""
    from rlcr.metrics import binned_calibration_error

    rng = np.random.default_rng(11)
    for case in range(300):
        n = int(rng.integers(1, 400))
        c = rng.choice(np.round(rng.random(int(rng.integers(1, 12))), 2), size=n) if case % 2 else rng.random(n)
        y = (rng.random(n) < rng.random()).astype(float)
        _, inverse, counts = np.unique(c, return_inverse=True, return_counts=True)
        ends = np.cumsum(counts)
        ranks = ((ends - counts + 1 + ends) / 2.0)[inverse]
        n_pos, n_neg = int(y.sum()), int((1 - y).sum())
        if n_pos and n_neg:
            assert auroc(c, y) == float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
        else:
            assert math.isnan(auroc(c, y))
        centre = (ends - counts / 2.0)[inverse]
        bins = np.minimum((centre * 10 / n).astype(int), 9)
        assert ece_equal_mass(c, y) == binned_calibration_error(c, y, bins, 10)


def test_a_confidence_that_only_knows_the_stratum_has_within_auroc_one_half():
    rng = np.random.default_rng(0)
    a = _answers(rng, skill=0.0)                       # confidence = the stratum's rate, nothing else
    assert auroc(a.confidence, a.correct) > 0.7        # pooled AUROC rewards knowing the difficulty
    w = within_stratum_auroc(a.confidence, a.correct, a.stratum)
    assert w["mean"] == pytest.approx(0.5) and set(w["per_stratum"]) == {"2", "3"}
    assert within_stratum_auroc(_answers(rng, skill=1.0).confidence, a.correct, a.stratum)["mean"] != 0.5


def test_the_difficulty_prior_has_zero_skill_over_itself_and_a_better_confidence_has_positive_skill():
    rng = np.random.default_rng(1)
    calibration, test = _answers(rng, prefix="c"), _answers(rng)
    test = difficulty_prior(calibration, test)
    rates = {s: calibration.correct[calibration.stratum == s].mean() for s in ("2", "3")}
    assert all(test.prior[i] == rates[test.stratum[i]] for i in range(test.task.size))
    assert protocol_metrics(test.with_confidence(test.prior))["brier_skill"] == pytest.approx(0.0)
    assert protocol_metrics(test)["brier_skill"] > 0.1


def test_temperature_scaling_recovers_the_overconfidence_it_was_given():
    rng = np.random.default_rng(2)
    z = rng.normal(0, 1.5, 20000)
    y = (rng.random(z.size) < 1 / (1 + np.exp(-z))).astype(float)
    stated = 1 / (1 + np.exp(-3 * z))                  # three times too sharp
    t = fit_temperature(stated, y)
    assert t == pytest.approx(3.0, rel=0.1)
    fixed = apply_temperature(stated, t)
    assert ece_equal_mass(fixed, y) < ece_equal_mass(stated, y) / 3


def test_isotonic_regression_pools_adjacent_violators_and_stays_monotone():
    knots, values = fit_isotonic([0.1, 0.2, 0.3, 0.3], [1, 0, 1, 1])
    assert knots.tolist() == [0.1, 0.2, 0.3] and values.tolist() == [0.5, 0.5, 1.0]
    rng = np.random.default_rng(3)
    c = rng.random(500)
    fitted = fit_isotonic(c, (rng.random(500) < c).astype(float))
    assert np.all(np.diff(fitted[1]) >= 0)
    out = apply_isotonic([math.nan, -1.0, 2.0], fitted)
    assert math.isnan(out[0]) and out[1] == fitted[1][0] and out[2] == fitted[1][-1]


def test_the_paper_protocol_counts_an_unparsed_confidence_as_zero():
    a = Answers(["a", "b"], ["2", "2"], [1, 0], [math.nan, 0.2])
    assert protocol_metrics(a)["brier"] == pytest.approx(0.04)
    assert protocol_metrics(a.unparsed_as_zero())["brier"] == pytest.approx((1 + 0.04) / 2)


def _runs(seed_effects, n_tasks=40):
    rng = np.random.default_rng(4)
    runs = {"rlcr": {}, "rlvr": {}, "rlvr_recalibrated": {}}
    for s, effect in enumerate(seed_effects):
        cal = _answers(rng, prefix="c")
        runs["rlcr"][s] = difficulty_prior(cal, _answers(rng, n_tasks, skill=effect))
        rlvr = difficulty_prior(cal, _answers(rng, n_tasks))
        rlvr = rlvr.with_confidence(np.clip(0.9 + 0.05 * rng.normal(size=rlvr.task.size), 0, 1))  # overconfident
        runs["rlvr"][s] = rlvr
        runs["rlvr_recalibrated"][s] = rlvr.with_confidence(apply_temperature(rlvr.confidence, 2.0))
    return runs


def test_identical_methods_differ_by_exactly_zero_on_every_paired_draw():
    runs = _runs([1.0, 1.0, 1.0])
    same = {"a": runs["rlcr"], "b": {s: a for s, a in runs["rlcr"].items()}}
    out = hierarchical_bootstrap(same, lambda m: {"d": protocol_metrics(m["a"])["ece"] - protocol_metrics(m["b"])["ece"]},
                                 n_resamples=50)
    assert out["point"]["d"] == 0 and out["ci"]["d"] == [0.0, 0.0]


def test_seed_spread_widens_the_interval_and_a_clear_effect_meets_the_goals():
    steady = hierarchical_bootstrap(_runs([1.0, 1.0, 1.0]), goals_statistic, n_resamples=200)
    spread = hierarchical_bootstrap(_runs([0.2, 1.0, 1.8]), goals_statistic, n_resamples=200)
    width = lambda r, k: r["ci"][k][1] - r["ci"][k][0]  # noqa: E731
    assert width(spread, "brier_skill") > width(steady, "brier_skill")
    assert set(steady["per_seed"]) == {0, 1, 2} and steady["n_tasks"] == {0: 40, 1: 40, 2: 40}
    goals = decide(steady)
    assert goals["brier_skill"]["met"] and goals["within_stratum_auroc"]["met"] and goals["ece"]["met"]
    assert goals["accuracy_non_inferior"]["ci"][0] < 0.03


def test_no_effect_meets_no_calibration_goal():
    runs = _runs([0.0, 0.0, 0.0])
    runs["rlcr"] = {s: a.with_confidence(a.prior) for s, a in runs["rlvr"].items()}  # RLCR = the prior
    goals = decide(hierarchical_bootstrap(runs, goals_statistic, n_resamples=200))
    assert not goals["brier_skill"]["met"] and not goals["within_stratum_auroc"]["met"]


def test_the_bootstrap_refuses_unpaired_inputs():
    runs = _runs([1.0, 1.0])
    del runs["rlvr"][1]
    with pytest.raises(ValueError, match="same training seeds"):
        hierarchical_bootstrap(runs, goals_statistic)
    with pytest.raises(ValueError, match="Answers.confidence"):
        Answers(["a"], ["2"], [1], [1.5])
