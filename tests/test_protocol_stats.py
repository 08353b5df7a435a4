"""The pre-registered comparison's statistics (rlcr/evaluation/protocol_stats.py): each test checks a property a wrong
implementation would break."""

import math

import numpy as np
import pytest

from rlcr.core.metrics import auroc
from rlcr.evaluation.protocol_stats import (
    Answers,
    decide,
    difficulty_prior,
    ece_equal_mass,
    goals_statistic,
    hierarchical_bootstrap,
    protocol_metrics,
    within_stratum_auroc,
)
from rlcr.evaluation.recalibration import apply_isotonic, apply_temperature, fit_isotonic, fit_temperature


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
    from rlcr.core.metrics import binned_calibration_error

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
    out = hierarchical_bootstrap(same,
                                 lambda m: {"d": protocol_metrics(m["a"])["ece"] - protocol_metrics(m["b"])["ece"]},
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


# ----------------------------------------------------------------------------------------------- round 2
def test_platt_scaling_is_the_maximum_likelihood_logistic_fit_on_the_logit():
    """Against an independent fit: scipy's optimiser on the same log-likelihood."""
    from scipy.optimize import minimize

    from rlcr.evaluation.recalibration import apply_platt, fit_platt

    rng = np.random.default_rng(5)
    c = np.clip(rng.beta(2, 3, 800), 0.01, 0.99)
    y = (rng.random(c.size) < 1 / (1 + np.exp(-(0.4 + 0.6 * np.log(c / (1 - c)))))).astype(float)
    c_nan = np.append(c, math.nan)
    a, b = fit_platt(c_nan, np.append(y, 1.0))  # an unparsed confidence is left out of the fit

    def nll(w):
        z = w[0] + w[1] * np.log(c / (1 - c))
        return float(np.sum(np.logaddexp(0, z) - y * z))

    ref = minimize(nll, np.zeros(2), method="BFGS", options={"gtol": 1e-10}).x
    assert (a, b) == pytest.approx(tuple(ref), abs=1e-4)
    out = apply_platt(c_nan, (a, b))
    assert math.isnan(out[-1]) and out[:-1] == pytest.approx(1 / (1 + np.exp(-(ref[0] + ref[1] * np.log(c / (1 - c))))),
                                                            abs=1e-5)
    # a constant confidence (greedy RLCR states few values) or a separable stratum stays finite: the rate
    a, b = fit_platt(np.full(10, 0.7), [1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    assert apply_platt([0.7], (a, b))[0] == pytest.approx(0.3, abs=1e-3)
    assert np.all(np.isfinite(fit_platt([0.2, 0.3, 0.8, 0.9], [0, 0, 1, 1])))


def test_per_stratum_maps_are_fitted_on_each_stratum_alone_and_keep_within_stratum_ranking():
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    from rlcr.evaluation.recalibration import apply_per_stratum, apply_platt, fit_per_stratum, fit_platt

    rng = np.random.default_rng(6)
    cal = _answers(rng, 80, prefix="c", skill=0.3, conf_noise=0.1)  # not separable: the fit is unique
    test = _answers(rng, 80, skill=0.3, conf_noise=0.1)
    platt = fit_per_stratum(fit_platt, cal.confidence, cal.correct, cal.stratum)
    out = apply_per_stratum(apply_platt, test.confidence, test.stratum, platt)
    logit = lambda c: np.log(c / (1 - c)).reshape(-1, 1)  # noqa: E731
    for k in ("2", "3"):  # independent: sklearn's unpenalised logistic regression on that stratum only
        ref = LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(logit(cal.confidence[cal.stratum == k]),
                                                                             cal.correct[cal.stratum == k])
        assert out[test.stratum == k] == pytest.approx(
            ref.predict_proba(logit(test.confidence[test.stratum == k]))[:, 1], abs=1e-4)
        iso = fit_per_stratum(fit_isotonic, cal.confidence, cal.correct, cal.stratum)
        ref = IsotonicRegression(out_of_bounds="clip").fit(cal.confidence[cal.stratum == k],
                                                           cal.correct[cal.stratum == k])
        mapped = apply_per_stratum(apply_isotonic, test.confidence, test.stratum, iso)
        assert mapped[test.stratum == k] == pytest.approx(ref.predict(test.confidence[test.stratum == k]), abs=1e-9)
    # a monotone map per stratum leaves the within-stratum AUROC as it was (the temperature sub-goal's point)
    assert within_stratum_auroc(out, test.correct, test.stratum)["mean"] == pytest.approx(
        within_stratum_auroc(test.confidence, test.correct, test.stratum)["mean"])
    # a test stratum the calibration split lacks gets the pooled map
    lone = apply_per_stratum(apply_platt, [0.5], ["4"], platt)
    assert lone[0] == pytest.approx(apply_platt([0.5], fit_platt(cal.confidence, cal.correct))[0])


def test_the_t_table_and_seed_level_interval_match_scipy():
    from scipy import stats

    from rlcr.evaluation.protocol_stats import seed_level, seed_t_interval, t_quantile

    for p in (0.95, 0.975):
        for df in range(1, 11):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), abs=1e-4)
    with pytest.raises(ValueError, match="no t quantile"):
        t_quantile(0.975, 11)
    rng = np.random.default_rng(7)
    for n in (2, 3, 5, 8):
        v = rng.normal(0.05, 0.04, n)
        ref = stats.t.interval(0.95, n - 1, loc=v.mean(), scale=stats.sem(v))
        got = seed_t_interval(v)
        assert got["mean"] == pytest.approx(v.mean()) and got["ci"] == pytest.approx(list(ref), abs=1e-4)
        assert seed_t_interval(v, level=0.90)["ci"] == pytest.approx(
            list(stats.t.interval(0.90, n - 1, loc=v.mean(), scale=stats.sem(v))), abs=1e-4)
    assert seed_t_interval([0.1])["ci"] is None and seed_t_interval([0.1, math.nan])["ci"] is None
    # the reviewer's reading of the within-stratum AUROC difference, seeds 1–3: [-0.033, 0.193]
    result = {"point": {"auroc_within_vs_rlvr": 0.083},
              "per_seed": {1: {"auroc_within_vs_rlvr": 0.129}, 2: {"auroc_within_vs_rlvr": 0.073},
                           3: {"auroc_within_vs_rlvr": 0.039}}}
    read = seed_level(result)
    assert read["point"]["auroc_within_vs_rlvr"] == pytest.approx(0.0803, abs=1e-4) and read["df"] == {
        "auroc_within_vs_rlvr": 2}
    assert [round(x, 3) for x in read["ci"]["auroc_within_vs_rlvr"]] == [-0.033, 0.193]


def test_seed_level_rules_fail_where_the_seeds_disagree_though_the_bootstrap_passes():
    """Three seeds, one near 0: the bootstrap's interval (resting on the tasks) excludes 0, the t-interval over
    seeds does not — the reading the decision rule alone would hide."""
    from rlcr.evaluation.protocol_stats import difference_statistic, seed_level

    runs = _runs([0.15, 1.0, 1.8])
    result = hierarchical_bootstrap(runs, goals_statistic, n_resamples=200)
    assert decide(result)["brier_skill"]["met"]
    read = seed_level(result)
    per = [v["brier_skill"] for v in result["per_seed"].values()]
    assert read["point"]["brier_skill"] == pytest.approx(np.mean(per))
    assert read["ci"]["brier_skill"][0] < 0 and not decide(read)["brier_skill"]["met"]
    # paired differences of any two runs, per metric
    stat = difference_statistic({"d": ("rlcr", "rlvr")}, ("brier", "ece"))
    one = {k: v[0] for k, v in runs.items()}
    want = protocol_metrics(one["rlcr"])["brier"] - protocol_metrics(one["rlvr"])["brier"]
    assert stat(one) == pytest.approx({"d:brier": want, "d:ece": protocol_metrics(one["rlcr"])["ece"]
                                       - protocol_metrics(one["rlvr"])["ece"]})


def _ece_equal_mass_by_search(c, y, n_bins=10):
    """The equal-mass ECE by its definition, independently of rlcr's tie-group counting: each answer's tie group
    found by binary search in the sorted confidences, the bin from the group's centre."""
    from rlcr.core.metrics import binned_calibration_error

    ordered = np.sort(c)
    ends = np.append(np.flatnonzero(np.diff(ordered)) + 1, c.size)
    counts = np.diff(ends, prepend=0)
    centre = (ends - counts / 2.0)[np.searchsorted(ordered[ends - 1], c)]
    return binned_calibration_error(c, y, np.minimum((centre * n_bins / c.size).astype(int), n_bins - 1), n_bins)


def test_protocol_metrics_equal_the_reference_metrics_bit_for_bit():
    """protocol_metrics shares one sort between the equal-mass ECE and the AUROCs (counts per tie group): on
    answers with many ties, unparsed confidences and uneven strata, every figure equals the one-metric-at-a-time
    reference (rlcr.core.metrics; AUROC per stratum by its own binary searches) exactly, and the bootstrap's
    integer-coded strata give the same point values as the names."""
    from rlcr.core.metrics import brier, ece, mann_whitney_auroc

    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(1, 200))
        levels = int(rng.integers(1, 12))
        conf = np.round(rng.random(n) * levels) / levels if trial % 3 else rng.random(n)
        conf[rng.random(n) < 0.1] = np.nan
        correct = (rng.random(n) < rng.random()).astype(float)
        strata = rng.choice(["10", "2", "3"][:int(rng.integers(1, 4))], size=n)
        a = Answers([f"t{i // 2:04d}" for i in range(n)], strata, correct, conf, rng.random(n))  # rows in task order
        got = protocol_metrics(a)
        has = np.isfinite(conf)
        c, y, s = conf[has], correct[has], strata[has]
        if not c.size:
            assert math.isnan(got["auroc"]) and got["accuracy"] == correct.mean()
            continue
        per = [mann_whitney_auroc(c[(s == k) & (y == 1)], c[(s == k) & (y == 0)]) for k in sorted(set(s))]
        defined = [v for v in per if not math.isnan(v)]
        want = {"accuracy": correct.mean(), "ece": ece(c, y), "brier": brier(c, y), "auroc": auroc(c, y),
                "auroc_within": float(np.mean(defined)) if defined else math.nan,
                "ece_equal_mass": _ece_equal_mass_by_search(c, y),
                "brier_skill": 1 - brier(c, y) / float(np.mean((a.prior[has] - y) ** 2))}
        for k, v in want.items():
            assert (math.isnan(v) and math.isnan(got[k])) or got[k] == v, (trial, k, got[k], v)
        boot = hierarchical_bootstrap({"m": {0: a}}, lambda d: protocol_metrics(d["m"]), n_resamples=1)
        assert all((math.isnan(v) and math.isnan(got[k])) or boot["point"][k] == got[k]
                   for k, v in boot["point"].items())


def test_integer_coded_answers_stay_codes():
    """Inside the bootstrap strata and tasks are integer codes; a statistic that rebuilds answers (a new
    confidence) keeps them codes, so grouping and its order stay those of the names (as strings, "10" < "2")."""
    a = Answers(np.array([0, 1, 11]), np.array([2, 10, 3]), [1, 0, 1], [0.2, 0.5, 0.9])
    b = a.with_confidence(np.array([0.3, 0.4, 0.5]))
    assert a.stratum.dtype.kind == b.stratum.dtype.kind == b.task.dtype.kind == "i"
    assert Answers(["t"], ["2"], [1], [0.5]).stratum.dtype.kind == "U"


def test_a_draws_figures_are_the_same_with_the_bootstraps_codes_as_without():
    """Inside the bootstrap the confidences' tie groups and the number of strata are coded once for every draw;
    a draw lacks some tie groups and strata. Each draw's figures equal those of the same answers without the
    codes (sorted afresh), bit for bit, over draws with ties, unparsed confidences and several seeds; a draw
    whose confidences a statistic replaced is sorted afresh, not read through the old codes."""
    import copy

    from rlcr.evaluation.protocol_stats import Answers as A

    rng = np.random.default_rng(11)
    checked = 0

    def statistic(draw):
        nonlocal checked
        out = {}
        for name, a in draw.items():
            assert a._codes is not None
            plain = A._trusted(a.task, a.stratum, a.correct, a.confidence, a.prior)  # the same rows, no codes
            coded, fresh = protocol_metrics(a), protocol_metrics(plain)
            assert all((math.isnan(v) and math.isnan(fresh[k])) or v == fresh[k] for k, v in coded.items()), \
                (coded, fresh)
            out.update({f"{name}/{k}": v for k, v in coded.items()})
            moved = copy.copy(a)  # a statistic that reassigns a draw's confidences: its old codes no longer apply
            moved.confidence = np.where(np.isnan(a.confidence), np.nan, 1 - a.confidence)
            again, fresh = protocol_metrics(moved), protocol_metrics(A._trusted(a.task, a.stratum, a.correct,
                                                                               moved.confidence, a.prior))
            assert all((math.isnan(v) and math.isnan(fresh[k])) or v == fresh[k] for k, v in again.items())
        checked += 1
        return out

    for trial in range(20):
        runs = {}
        for m in ("rlcr", "rlvr"):
            runs[m] = {}
            for seed in range(1 + trial % 3):
                n = int(rng.integers(4, 60))
                levels = int(rng.integers(1, 12))
                conf = np.round(rng.random(n) * levels) / levels if trial % 2 else rng.random(n)
                conf[rng.random(n) < 0.15] = np.nan
                runs[m][seed] = A([f"t{i // 3:03d}" for i in range(n)], rng.choice(["10", "2", "3", "40"], size=n),
                                  (rng.random(n) < 0.4).astype(float), conf, rng.random(n))
        # pair on the tasks both evaluated: the same task names at every seed
        hierarchical_bootstrap(runs, statistic, n_resamples=15, seed=trial)
    assert checked > 300
