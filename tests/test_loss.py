"""Masked GRPO loss (docs/design.md §8): hand-computed values and properties."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rlcr.core.loss import aggregate, kl_penalty, policy_loss, token_logprobs


def test_ratio_one_gives_minus_advantage():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m = policy_loss(logp, logp.clone(), torch.tensor([2.0]), mask)
    assert loss.item() == pytest.approx(-2.0)
    assert m["clipfrac_high"] == 0 and m["approx_kl"] == 0 and m["tokens"] == 2


def test_clipping_hand_computed():
    old = torch.zeros(1, 4)
    # ratios 1.5, 0.5, 1.1, 5.0
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 5.0]]))
    mask = torch.ones(1, 4)
    # A = +1: max(-r, -clip(r)) → -min(r, clip(r)) = -[1.2, 0.5, 1.1, 1.2]
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), mask, agg="seq-mean-token-sum")
    assert loss.item() == pytest.approx(-(1.2 + 0.5 + 1.1 + 1.2))
    assert m["clipfrac_high"] == pytest.approx(0.5)
    # A = -1: max(r, clip(r)) = [1.5, 0.8, 1.1, 5.0]; dual clip caps at c=3 → 3.0
    loss, m = policy_loss(logp, old, torch.tensor([-1.0]), mask, agg="seq-mean-token-sum")
    assert loss.item() == pytest.approx(1.5 + 0.8 + 1.1 + 3.0)
    assert m["clipfrac_low"] == pytest.approx(0.25) and m["clipfrac_dual"] == pytest.approx(0.25)
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0]), mask, agg="seq-mean-token-sum", clip_c=None)
    assert loss.item() == pytest.approx(1.5 + 0.8 + 1.1 + 5.0)
    # asymmetric clip-higher
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), mask, agg="seq-mean-token-sum", clip_high=0.28)
    assert loss.item() == pytest.approx(-(1.28 + 0.5 + 1.1 + 1.28))


def test_aggregations_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(loss, mask, "token-mean", global_tokens=8).item() == pytest.approx(10 / 8)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(10 / (2 * 4))
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_response_len=10).item() == pytest.approx(10 / 20)
    with pytest.raises(ValueError, match="unknown mode"):
        aggregate(loss, mask, "mean")


def test_kl_estimators_hand_computed():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    d = math.log(0.25) - math.log(0.5)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(d) - d - 1)
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-100.0]), "k3").item() == pytest.approx(math.exp(-20) + 20 - 1)
    loss, m = policy_loss(logp[None], logp[None], torch.tensor([0.0]), torch.ones(1, 1), ref_logp=ref[None],
                          kl_coef=0.1, kl_type="k1")
    assert loss.item() == pytest.approx(0.1 * math.log(2)) and m["ref_kl"] == pytest.approx(math.log(2))


def test_entropy_bonus_and_per_type_metrics():
    logp = torch.zeros(2, 2)
    ent = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    loss, m = policy_loss(logp, logp, torch.tensor([0.0, 0.0]), torch.ones(2, 2), entropy=ent, entropy_coef=0.5,
                          is_confidence=torch.tensor([False, True]))
    assert loss.item() == pytest.approx(-0.5 * 1.5)
    assert m["answer/entropy"] == 1.0 and m["confidence/entropy"] == 2.0 and m["confidence/tokens"] == 2


def test_token_logprobs_match_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.bfloat16)
    labels = torch.randint(0, 11, (3, 5))
    logp, ent = token_logprobs(logits, labels, return_entropy=True, chunk_rows=4)
    ref = torch.log_softmax(logits.float(), -1)
    assert torch.allclose(logp, ref.gather(-1, labels[..., None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-5)
    assert logp.dtype == torch.float32


def test_context_tokens_get_no_gradient():
    logp = torch.randn(2, 6, requires_grad=True)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.float32)
    loss, _ = policy_loss(logp, logp.detach() + 0.05, torch.tensor([1.0, -0.5]), mask)
    loss.backward()
    assert (logp.grad[mask == 0] == 0).all() and (logp.grad[mask == 1] != 0).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(1, 4), st.data())
def test_token_mean_sums_over_micro_batches(b, t, k, data):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 10**6)))
    logp = torch.randn(b, t, generator=g) * 0.1
    old = logp + torch.randn(b, t, generator=g) * 0.1
    adv = torch.randn(b, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[0, 0] = 1.0
    agg = data.draw(st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                     "seq-mean-token-sum-norm"]))
    whole, _ = policy_loss(logp, old, adv, mask, agg=agg)
    total = torch.tensor(0.0)
    for idx in torch.arange(b).chunk(k):
        part, _ = policy_loss(logp[idx], old[idx], adv[idx], mask[idx], agg=agg, global_tokens=mask.sum(),
                              global_sequences=b, max_response_len=t)
        total = total + part
    assert total.item() == pytest.approx(whole.item(), rel=1e-5, abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.floats(-2.0, 2.0), st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3))
def test_gradient_sign_and_clipping(log_ratio, a):
    logp = torch.tensor([[log_ratio]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([a]), torch.ones(1, 1), clip_c=3.0)
    loss.backward()
    grad = logp.grad.item()
    r = math.exp(log_ratio)
    in_range = 0.8 + 1e-6 < r < 1.2 - 1e-6
    clipped = (a > 0 and r > 1.2 + 1e-6) or (a < 0 and (r < 0.8 - 1e-6 or r > 3.0 + 1e-6))
    if in_range:
        # descending the loss moves log π in the direction of the advantage
        assert grad != 0 and math.copysign(1, -grad) == math.copysign(1, a)
    if clipped:
        assert grad == 0
    if a < 0:  # dual clip caps the loss of negative advantages
        assert loss.item() <= -a * 3.0 + 1e-6


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape mismatch"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))


def test_log_prob_blocks_fit_a_cpu_cache_and_are_large_on_a_gpu():
    """The CPU keeps its cache-sized blocks (2^19 logits: 3 rows of a 152k vocabulary, 10 of SmolLM2's 49k); a GPU,
    launch-bound with blocks that small, takes 2^26 logits (441 rows of Qwen2.5's vocabulary), both capped by
    ``chunk_rows`` and at least one row."""
    from rlcr.core.loss import block_rows

    assert block_rows(151_936, "cpu", 1024) == 3 and block_rows(49_152, "cpu", 1024) == 10
    assert block_rows(151_936, "cuda", 1024) == 441 and block_rows(49_152, "cuda", 1024) == 1024
    assert block_rows(151_936, "cuda", 64) == 64 and block_rows(10**9, "cuda", 1024) == 1
