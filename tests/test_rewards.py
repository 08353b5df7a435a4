"""RLCR rewards (docs/design.md §5): the scorers and the production path the rollouts score rows with
(:func:`rlcr.rollout.records.answer_scores`, :func:`~rlcr.rollout.records.confidence_scores`)."""

import math

import pytest
from hypothesis import given, strategies as st

from rlcr.core.rewards import accuracy_reward, brier_reward, parse_confidence
from rlcr.rollout.records import answer_scores, confidence_scores
from rlcr.tasks.countdown import CountdownTask
from rlcr.tasks.registry import get_task

COUNTDOWN = get_task("countdown")


@pytest.mark.parametrize(
    "text, value",
    [
        ("<confidence>0.8</confidence>", 0.8),
        ("<analysis>hm</analysis><confidence> .25 </confidence>", 0.25),
        ("<confidence>1</confidence>", 1.0),
        ("<confidence>0</confidence>", 0.0),
        ("<confidence>0.3</confidence> then <confidence>0.9</confidence>", 0.9),
        ("<confidence>7e-1</confidence>", 0.7),
        ("<confidence>nan</confidence>", None),
        ("<confidence>NaN</confidence>", None),
        ("<confidence>inf</confidence>", None),
        ("<confidence>1.5</confidence>", None),
        ("<confidence>-0.1</confidence>", None),
        ("<confidence>80%</confidence>", None),
        ("<confidence></confidence>", None),
        ("<confidence>0.8", None),
        ("confidence: 0.8", None),
        ("<confidence>0.8 or 0.9</confidence>", None),
        ("<confidence>1e400</confidence>", None),
    ],
)
def test_parse_confidence(text, value):
    assert parse_confidence(text) == value


def test_brier():
    assert brier_reward("<confidence>0.8</confidence>", 1) == pytest.approx(1 - 0.2**2)
    assert brier_reward("<confidence>0.8</confidence>", 0) == pytest.approx(1 - 0.8**2)
    assert brier_reward("<confidence>nan</confidence>", 1) == 0.0
    assert brier_reward("nothing", 0) == 0.0
    # a turn-2 row's scores, as the confidence stage computes them
    assert confidence_scores("<confidence>1</confidence>", 1) == {"confidence": 1.0, "reward": 1.0}
    assert confidence_scores("<confidence>0</confidence>", 1) == {"confidence": 0.0, "reward": 0.0}
    assert confidence_scores("<confidence>0.8</confidence>", 0) == {"confidence": 0.8,
                                                                    "reward": pytest.approx(1 - 0.8**2)}
    assert confidence_scores("no tag", 0) == {"confidence": None, "reward": 0.0}
    with pytest.raises(ValueError):
        brier_reward("<confidence>0.5</confidence>", 0.5)


def test_accuracy():
    t = CountdownTask([3, 5, 16], 24)
    assert accuracy_reward("<answer>16 + 5 + 3</answer>", t, COUNTDOWN) == 1.0
    assert accuracy_reward("<answer>16 + 5 - 3</answer>", t, COUNTDOWN) == 0.0
    assert accuracy_reward("nope", t.ground_truth, COUNTDOWN) == 0.0
    # a turn-1 row's scores, as the answer stage computes them with the run's format_score: the raw score
    # keeps the format credit, the reward (= correct) is the accuracy whatever the format_score
    def scores(text, format_score):
        return answer_scores(text, t, format_score=format_score, task_name="countdown")

    assert scores("<answer>16+5+3</answer>", 0.1) == {"score": 1.0, "correct": 1.0, "reward": 1.0, "confidence": None}
    assert scores("", 0.1) == {"score": 0.0, "correct": 0.0, "reward": 0.0, "confidence": None}
    assert scores("<answer>16 + 5 - 3</answer>", 0.25) == {"score": 0.25, "correct": 0.0, "reward": 0.0,
                                                           "confidence": None}
    assert scores("<answer>16 + 5 - 3</answer>", 1.0)["reward"] == 0.0


@given(st.text(max_size=300), st.sampled_from([0, 1]))
def test_brier_always_in_unit_interval(text, y):
    r = brier_reward(text, y)
    assert 0.0 <= r <= 1.0 and math.isfinite(r)
    if parse_confidence(text) is None:
        assert r == 0.0


@given(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1]))
def test_brier_of_any_float(x, y):
    c = parse_confidence(f"<confidence>{x}</confidence>")
    r = brier_reward(f"<confidence>{x}</confidence>", y)
    assert math.isfinite(r) and 0.0 <= r <= 1.0
    if c is not None:
        assert 0.0 <= c <= 1.0 and r == pytest.approx(1 - (y - c) ** 2)
    else:
        assert r == 0.0 and not (0.0 <= x <= 1.0)
