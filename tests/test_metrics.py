"""Calibration metrics (docs/design.md §13) against hand-computed values, degenerate cases included."""

import math

import pytest
from hypothesis import given, strategies as st

from rlcr.core.metrics import auroc, brier, calibration_metrics, ece, reliability_bins


def test_hand_computed():
    c = [0.9, 0.8, 0.3, 0.15, 0.95]
    y = [1, 0, 0, 1, 1]
    assert brier(c, y) == pytest.approx((0.01 + 0.64 + 0.09 + 0.7225 + 0.0025) / 5)
    # bins: .15→1, .3→3, .8→8, .9→9, .95→9
    # ece = 1/5|.15-1| + 1/5|.3-0| + 1/5|.8-0| + 2/5|.925-1|
    assert ece(c, y) == pytest.approx((0.85 + 0.3 + 0.8 + 2 * 0.075) / 5)
    # positives {.9,.15,.95}, negatives {.8,.3}: pairs won 2+2+... = (.9>.8,.9>.3)+(.15<both)+(.95>both) = 4 of 6
    assert auroc(c, y) == pytest.approx(4 / 6)


def test_ties_and_boundaries():
    assert auroc([0.5, 0.5], [1, 0]) == 0.5
    assert auroc([0.2, 0.7, 0.7, 0.9], [0, 1, 0, 1]) == pytest.approx((1 + 0.5 + 1 + 1) / 4)
    bins = reliability_bins([0.0, 0.1, 0.999, 1.0], [0, 0, 1, 1])
    assert [b["count"] for b in bins] == [1, 1, 0, 0, 0, 0, 0, 0, 0, 2]


def test_degenerate_cases():
    # all correct, fully confident: perfect calibration, AUROC undefined
    m = calibration_metrics([1.0, 1.0, 1.0], [1, 1, 1])
    assert m["accuracy"] == 1 and m["brier"] == 0 and m["ece"] == 0 and math.isnan(m["auroc"])
    # all wrong with constant confidence .7
    m = calibration_metrics([0.7] * 4, [0, 0, 0, 0])
    assert m["brier"] == pytest.approx(0.49) and m["ece"] == pytest.approx(0.7) and math.isnan(m["auroc"])
    # constant confidence with mixed labels: no ranking ability
    m = calibration_metrics([0.5] * 4, [1, 0, 1, 0])
    assert m["auroc"] == 0.5 and m["ece"] == 0.0 and m["brier"] == 0.25
    # single example
    m = calibration_metrics([0.25], [1])
    assert m["accuracy"] == 1 and m["brier"] == pytest.approx(0.5625) and m["ece"] == pytest.approx(0.75)
    # empty
    m = calibration_metrics([], [])
    assert m["n"] == 0 and math.isnan(m["accuracy"]) and math.isnan(m["ece"]) and math.isnan(m["brier"])
    # empty bins are skipped, not counted as zero-accuracy bins
    assert sum(b["count"] == 0 for b in m["reliability"]) == 10


def test_bad_inputs():
    with pytest.raises(ValueError):
        brier([0.5, float("nan")], [1, 0])
    with pytest.raises(ValueError):
        ece([1.2], [1])
    with pytest.raises(ValueError):
        auroc([0.5], [2])


@given(st.lists(st.tuples(st.integers(0, 1000).map(lambda k: k / 1000), st.sampled_from([0, 1])), min_size=1,
                max_size=60))
def test_properties(pairs):
    c, y = map(list, zip(*pairs))
    m = calibration_metrics(c, y)
    assert 0 <= m["brier"] <= 1 and 0 <= m["ece"] <= 1
    assert sum(b["count"] for b in m["reliability"]) == len(c)
    if not math.isnan(m["auroc"]):
        assert 0 <= m["auroc"] <= 1
        # AUROC of the flipped score is 1 − AUROC
        assert auroc([1 - x for x in c], y) == pytest.approx(1 - m["auroc"])
    # a brute-force pair count agrees
    pos = [a for a, b in zip(c, y) if b == 1]
    neg = [a for a, b in zip(c, y) if b == 0]
    if pos and neg:
        wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
        assert m["auroc"] == pytest.approx(wins / (len(pos) * len(neg)))
