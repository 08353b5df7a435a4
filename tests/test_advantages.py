"""Two-level advantages (docs/design.md §7): hand-computed cases and properties."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rlcr.core.advantages import answer_advantages, confidence_advantages, spread_to_tokens


def test_answer_hand_computed():
    adv = answer_advantages([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]], eps=0.0)
    assert adv[0].tolist() == pytest.approx([1, -1, -1, 1])
    # mean .25, population std sqrt(3)/4
    s = math.sqrt(3) / 4
    assert adv[1].tolist() == pytest.approx([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s])
    adv = answer_advantages([[1.0, 0.0, 0.0, 0.0]], scale_by_std=False)
    assert adv[0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_eps_in_denominator():
    adv = answer_advantages([[1.0, 0.0]], eps=0.5)  # std 0.5
    assert adv[0].tolist() == pytest.approx([0.5 / 1.0, -0.5 / 1.0])


def test_all_equal_groups_are_exactly_zero():
    r = torch.full((3, 5), 0.1)
    assert torch.equal(answer_advantages(r), torch.zeros(3, 5))
    c = torch.full((2, 3, 4), 0.7321)
    for mode in ("answer", "answer_then_prompt"):
        assert torch.equal(confidence_advantages(c, mode=mode), torch.zeros(2, 3, 4))


def test_confidence_per_answer_hand_computed():
    r = torch.tensor([[[0.96, 0.64], [1.0, 1.0]]])  # answer 0 has two different confidences
    adv = confidence_advantages(r, eps=0.0)
    assert adv[0, 0].tolist() == pytest.approx([1.0, -1.0])
    assert adv[0, 1].tolist() == [0.0, 0.0]


def test_confidence_not_normalised_across_answers():
    # same confidence rewards for answer 0; changing answer 1's must not change answer 0's advantages
    a = confidence_advantages(torch.tensor([[[0.9, 0.5, 0.7], [0.1, 0.2, 0.3]]]))
    b = confidence_advantages(torch.tensor([[[0.9, 0.5, 0.7], [1.0, 0.0, 0.5]]]))
    assert torch.allclose(a[0, 0], b[0, 0])


def test_answer_then_prompt_hand_computed():
    r = torch.tensor([[[1.0, 0.0], [0.5, 0.5], [0.75, 0.25]]])
    centred = torch.tensor([[0.5, -0.5], [0.0, 0.0], [0.25, -0.25]])
    std = centred.flatten().std(unbiased=False)
    adv = confidence_advantages(r, mode="answer_then_prompt", eps=0.0)
    assert torch.allclose(adv[0], centred / std)
    # per-answer mode would blow every non-flat pair up to ±1
    per_answer = confidence_advantages(r, mode="answer", eps=0.0)
    assert per_answer[0, 2].tolist() == pytest.approx([1.0, -1.0])


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="non-finite"):
        answer_advantages([[1.0, float("nan")]])
    with pytest.raises(ValueError, match="non-finite"):
        confidence_advantages(torch.tensor([[[0.5, float("inf")]]]))
    with pytest.raises(ValueError, match="G_c >= 2"):
        confidence_advantages(torch.zeros(1, 2, 1))
    with pytest.raises(ValueError, match="2-d"):
        answer_advantages([1.0, 0.0])
    with pytest.raises(ValueError, match="unknown mode"):
        confidence_advantages(torch.rand(1, 2, 3), mode="prompt")


def test_spread_to_tokens():
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    out = spread_to_tokens(adv, mask, [False, True], lambda_ans=0.5, lambda_conf=3.0)
    assert out.tolist() == [[0.0, 1.0, 1.0], [-3.0, -3.0, 0.0]]


rewards_2d = st.integers(1, 4).flatmap(
    lambda p: st.integers(2, 6).flatmap(
        lambda g: st.lists(st.lists(st.sampled_from([0.0, 1.0]) | st.floats(0, 1), min_size=g, max_size=g),
                           min_size=p, max_size=p)
    )
)


@settings(max_examples=100, deadline=None)
@given(rewards_2d, st.booleans())
def test_answer_groups_sum_to_zero(rows, scale):
    adv = answer_advantages(rows, scale_by_std=scale)
    assert torch.allclose(adv.sum(1).double(), torch.zeros(len(rows), dtype=torch.float64), atol=1e-4)
    if scale:  # unit population std (up to eps) unless the group is flat
        for r, a in zip(rows, adv):
            if max(r) - min(r) > 1e-3:
                assert a.double().std(unbiased=False).item() == pytest.approx(1.0, rel=1e-2)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(2, 5), st.sampled_from(["answer", "answer_then_prompt"]),
       st.data())
def test_confidence_groups_sum_to_zero(p, ga, gc, mode, data):
    r = torch.tensor(data.draw(st.lists(st.floats(0, 1), min_size=p * ga * gc,
                                        max_size=p * ga * gc))).reshape(p, ga, gc)
    adv = confidence_advantages(r, mode=mode)
    assert torch.isfinite(adv).all()
    assert torch.allclose(adv.sum(2).double(), torch.zeros(p, ga, dtype=torch.float64), atol=1e-3)
