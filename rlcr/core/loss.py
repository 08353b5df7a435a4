"""Masked GRPO policy loss (docs/design.md §8) and memory-aware completion log-probs.

Each KL estimator and each aggregation mode is a small registered function
holding its formula. Pure PyTorch.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

__all__ = [
    "policy_loss",
    "token_logprobs",
    "kl_penalty",
    "aggregate",
    "truncated_is_weights",
    "sequence_band_mask",
    "importance_weights",
    "KL_ESTIMATORS",
    "AGGREGATIONS",
]

# ----------------------------------------------------------------------------- log-probs


_BLOCK_ELEMENTS = 1 << 19
"""Logit elements per block of :class:`_LabelLogProb` on a CPU (2 MiB of float32): a block's passes
(logsumexp, exp, scale, scatter) then run in cache instead of streaming the whole ``[N, V]`` logits through
memory once per pass."""
_BLOCK_ELEMENTS_GPU = 1 << 26
"""Logit elements per block on a GPU (256 MiB of float32; 441 rows of Qwen2.5's 151,936-token vocabulary).
A GPU has no such cache to fit and pays a kernel launch per pass per block: with the CPU's block (3 rows of
that vocabulary) a bf16 update on an H100 was launch-bound, and this block made the step 1.7× faster for
0.7 GiB more memory (docs/update-performance.md, "On a GPU")."""


def block_rows(n_vocab: int, device_type: str, chunk_rows: int) -> int:
    """Rows of ``[N, V]`` logits per block of :func:`token_logprobs`: at most ``chunk_rows``, and at most
    :data:`_BLOCK_ELEMENTS` (CPU) or :data:`_BLOCK_ELEMENTS_GPU` (``cuda``) logits; at least one row."""
    budget = _BLOCK_ELEMENTS_GPU if device_type == "cuda" else _BLOCK_ELEMENTS
    return max(1, min(chunk_rows, budget // max(1, n_vocab)))


class _LabelLogProb(torch.autograd.Function):
    """``log π(y) = z_y − logsumexp(z)`` per row of ``[N, V]`` logits, and optionally the entropy (no
    gradient), in row blocks of ``block`` rows; saves the logits and the logsumexp, not a float32 copy.

    Backward, per block: ``∂/∂z = g·(onehot(y) − exp(z − lse))``, written straight into the gradient —
    the same floats autograd's logsumexp + gather backward give, in one buffer instead of four.
    """

    @staticmethod
    def forward(ctx, logits, labels, block: int, with_entropy: bool):
        n = logits.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        ent = torch.empty(n, dtype=torch.float32, device=logits.device) if with_entropy else None
        for s in range(0, n, block):
            z = logits[s:s + block].float()
            l_ = torch.logsumexp(z, dim=-1)
            lse[s:s + block] = l_
            logp[s:s + block] = z.gather(-1, labels[s:s + block, None]).squeeze(-1) - l_
            if with_entropy:  # H = lse − Σ softmax·z, sharing the logsumexp
                ent[s:s + block] = l_ - (torch.exp(z - l_[:, None]) * z).sum(-1)
        ctx.save_for_backward(logits, labels, lse)
        ctx.block = block
        if with_entropy:
            ctx.mark_non_differentiable(ent)
            return logp, ent
        return logp, logp.new_zeros(0)

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], ctx.block):
            g = grad_logp[s:s + ctx.block, None].float()
            z = logits[s:s + ctx.block].float()
            out = grad[s:s + ctx.block] if grad.dtype == torch.float32 else torch.empty_like(z)
            torch.sub(z, lse[s:s + ctx.block, None], out=out)
            out.exp_().mul_(-g)  # logsumexp's share: −g·softmax(z)
            out.scatter_add_(1, labels[s:s + ctx.block, None], g)  # gather's share: +g at the label
            if out.data_ptr() != grad[s:s + ctx.block].data_ptr():
                grad[s:s + ctx.block] = out
        return grad, None, None, None


def token_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    return_entropy: bool = False,
    entropy_grad: bool = True,
    chunk_rows: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(label) and (optionally) the entropy per position.

    ``logits``: ``[..., V]`` (any dtype), ``labels``: ``[...]``. Rows are processed in
    blocks of at most ``chunk_rows`` (and at most :data:`_BLOCK_ELEMENTS` logits on a CPU, so each
    block's passes stay in cache; :func:`block_rows`), each upcast to float32 on its own, so at most one
    block's full-vocab float32 copy exists outside autograd's saved tensors (which hold
    the logits themselves and the logsumexp, :class:`_LabelLogProb`).
    ``log π(y) = z_y − logsumexp(z)``; ``H = logsumexp(z) − Σ softmax(z)·z``.
    ``entropy_grad=False`` keeps the entropy out of autograd (a metric only).
    """
    shape = labels.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1)
    if return_entropy and entropy_grad and torch.is_grad_enabled() and flat_logits.requires_grad:
        return _token_logprobs_autograd(flat_logits, flat_labels, shape, chunk_rows)
    if flat_logits.shape[0] == 0:
        empty = flat_logits.new_zeros(shape, dtype=torch.float32)
        return empty, (empty.clone() if return_entropy else None)
    block = block_rows(flat_logits.shape[-1], flat_logits.device.type, chunk_rows)
    logp, ent = _LabelLogProb.apply(flat_logits, flat_labels, block, return_entropy)
    return logp.reshape(shape), (ent.reshape(shape) if return_entropy else None)


def _token_logprobs_autograd(flat_logits, flat_labels, shape, chunk_rows):
    """:func:`token_logprobs` with the entropy in autograd (an entropy bonus): plain autograd ops."""
    logps, ents = [], []
    for start in range(0, flat_logits.shape[0], chunk_rows):
        z = flat_logits[start:start + chunk_rows].float()
        y = flat_labels[start:start + chunk_rows]
        lse = torch.logsumexp(z, dim=-1)
        logps.append(z.gather(-1, y[:, None]).squeeze(-1) - lse)
        ents.append(lse - (torch.exp(z - lse[:, None]) * z).sum(-1))
    logp = torch.cat(logps).reshape(shape) if logps else flat_logits.new_zeros(shape, dtype=torch.float32)
    ent = torch.cat(ents).reshape(shape) if ents else flat_logits.new_zeros(shape, dtype=torch.float32)
    return logp, ent


# ----------------------------------------------------------------------------- KL to reference


def _kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = logπ − logπ_ref."""
    return logp - ref_logp


def _kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (logπ − logπ_ref)²."""
    return 0.5 * (logp - ref_logp) ** 2


def _kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(d) − d − 1, d = logπ_ref − logπ clamped to ±20 (unbiased, non-negative)."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _kl_k1,
    "k2": _kl_k2,
    "k3": _kl_k3,
}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kl_type: str = "k3") -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference model."""
    try:
        return KL_ESTIMATORS[kl_type](logp, ref_logp)
    except KeyError:
        raise ValueError(f"kl_type: unknown estimator {kl_type!r} (one of {sorted(KL_ESTIMATORS)})") from None


# ----------------------------------------------------------------------------- aggregation


def _agg_token_mean(loss, mask, *, global_tokens, global_sequences, max_response_len):
    """Σ ℓ·M / Σ M, the denominator being the global masked-token count when given."""
    denom = global_tokens if global_tokens is not None else mask.sum().clamp(min=1.0)
    return (loss * mask).sum() / denom


def _agg_seq_mean_token_mean(loss, mask, *, global_tokens, global_sequences, max_response_len):
    """mean over sequences of (Σ_t ℓ·M / Σ_t M) — original GRPO. Empty sequences add 0."""
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    n = global_sequences if global_sequences is not None else loss.shape[0]
    return per_seq.sum() / max(n, 1)


def _agg_seq_mean_token_sum(loss, mask, *, global_tokens, global_sequences, max_response_len):
    """mean over sequences of Σ_t ℓ·M."""
    n = global_sequences if global_sequences is not None else loss.shape[0]
    return (loss * mask).sum() / max(n, 1)


def _agg_seq_mean_token_sum_norm(loss, mask, *, global_tokens, global_sequences, max_response_len):
    """Σ ℓ·M / (num_sequences · max_response_len) — Dr. GRPO."""
    n = global_sequences if global_sequences is not None else loss.shape[0]
    t_max = max_response_len if max_response_len is not None else loss.shape[-1]
    return (loss * mask).sum() / (max(n, 1) * t_max)


AGGREGATIONS = {
    "token-mean": _agg_token_mean,
    "seq-mean-token-mean": _agg_seq_mean_token_mean,
    "seq-mean-token-sum": _agg_seq_mean_token_sum,
    "seq-mean-token-sum-norm": _agg_seq_mean_token_sum_norm,
}


def aggregate(loss, mask, agg="token-mean", *, global_tokens=None, global_sequences=None, max_response_len=None):
    """Reduce per-token losses ``[B, T]`` under ``mask`` with one of :data:`AGGREGATIONS`."""
    try:
        fn = AGGREGATIONS[agg]
    except KeyError:
        raise ValueError(f"loss_agg: unknown mode {agg!r} (one of {sorted(AGGREGATIONS)})") from None
    return fn(
        loss, mask, global_tokens=global_tokens, global_sequences=global_sequences, max_response_len=max_response_len
    )


# ----------------------------------------------------------------------------- behaviour-policy correction


def truncated_is_weights(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                         cap: float) -> torch.Tensor:
    """Token-level truncated importance weights (TIS), no gradient:

        w_t = min(π_old(y_t) / μ(y_t), C) = min(exp(logπ_old − logμ), C)   on masked tokens, 1 elsewhere

    μ is the behaviour policy (the engine's sampling log-probs), π_old the policy of the PPO ratio's
    denominator. ``[B, T]`` in, ``[B, T]`` out; the log-ratio is clamped to ±20 like the PPO ratio's.
    """
    if cap < 1.0:
        raise ValueError(f"loss.tis_cap must be >= 1 (an on-policy token has weight 1), got {cap}")
    log_w = (old_logp.detach() - behaviour_logp.detach()).clamp(-20.0, 20.0)
    w = torch.exp(log_w).clamp(max=cap)
    return torch.where(mask > 0, w, torch.ones_like(w))


def sequence_band_mask(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                       band: tuple[float, float]) -> torch.Tensor:
    """Sequence-level masking, no gradient: per row ``i`` the geometric mean of its masked tokens' ratios

        r_i = exp( Σ_t M_it·(logπ_old − logμ) / Σ_t M_it )

    and ``keep_i = 1`` if lo ≤ r_i ≤ hi, else 0 (a row without masked tokens is kept). ``[B, T]`` in, ``[B]``
    (float 0/1) out. The geometric mean, not the product, so the band does not depend on the length.
    """
    lo, hi = band
    if not 0.0 < lo <= 1.0 <= hi:
        raise ValueError(f"loss.seq_mask_band must be [lo, hi] with 0 < lo <= 1 <= hi, got {list(band)}")
    m = mask.to(torch.float32)
    n = m.sum(-1)
    mean_log = ((old_logp.detach() - behaviour_logp.detach()).float() * m).sum(-1) / n.clamp(min=1.0)
    keep = (mean_log >= math.log(lo)) & (mean_log <= math.log(hi))
    return (keep | (n == 0)).to(torch.float32)


def importance_weights(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, *,
                       tis_cap: float | None = None, seq_band: tuple[float, float] | None = None,
                       ) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The per-token weights of the policy-gradient term, ``w_t = TIS_t · keep_i`` (docs/design.md §8), or None
    when both corrections are off. Metrics: ``is/capped`` (masked tokens whose weight was capped, a count),
    ``is/masked_sequences`` (rows masked out), ``is/weight_sum`` (Σ w over masked tokens)."""
    if tis_cap is None and seq_band is None:
        return None, {}
    m = mask.to(torch.float32)
    w = torch.ones_like(m)
    stats = {"is/capped": 0.0, "is/masked_sequences": 0.0}
    if tis_cap is not None:
        w = truncated_is_weights(old_logp, behaviour_logp, mask, tis_cap)
        raw = (old_logp.detach() - behaviour_logp.detach()).clamp(-20.0, 20.0)
        stats["is/capped"] = float(((raw > math.log(tis_cap)).float() * m).sum())
    if seq_band is not None:
        keep = sequence_band_mask(old_logp, behaviour_logp, mask, seq_band)
        w = w * keep[:, None]
        stats["is/masked_sequences"] = float(((keep == 0) & (m.sum(-1) > 0)).sum())
    stats["is/weight_sum"] = float((w * m).sum())
    return w, stats


# ----------------------------------------------------------------------------- policy loss


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else 0.0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = 3.0,
    agg: str = "token-mean",
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
    global_tokens: float | None = None,
    max_response_len: int | None = None,
    global_sequences: int | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    is_confidence: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Dual-clip PPO/GRPO loss over masked tokens (docs/design.md §8).

    Per token, ρ = exp(logπ − logπ_old) and
        ℓ = max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high));  where A < 0: ℓ = min(ℓ, −A·c)
    plus β·KL(π‖π_ref) per token when ``ref_logp`` is given and β > 0, minus
    ``entropy_coef``·H when ``entropy`` is given. Reduced with ``agg``. ``is_weights`` (``[B, T]``, no
    gradient; :func:`importance_weights`) multiplies the policy-gradient term ℓ only: w·ℓ + β·KL − coef·H.

    ``logp``/``old_logp``/``mask``: ``[B, T]``; ``advantages``: ``[B]`` or ``[B, T]``.
    With ``agg="token-mean"`` and ``global_tokens`` (the masked-token count of the
    whole global batch), summing the losses of micro-batches/workers gives the
    loss of the whole batch. ``is_confidence`` (``[B]`` bool) adds per-type metrics.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, "
                         f"mask {tuple(mask.shape)}")
    if clip_c is not None and clip_c <= 1.0:
        raise ValueError(f"clip_c must be > 1 (or None), got {clip_c}")
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)
    if adv.ndim == 1:
        adv = adv[:, None].expand_as(logp)

    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(loss_unclipped, loss_clipped)
    if clip_c is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * clip_c), pg)
    if is_weights is not None:
        pg = pg * is_weights.detach().to(pg.dtype)
    per_token = pg

    kl = None
    if ref_logp is not None and kl_coef > 0:
        kl = kl_penalty(logp, ref_logp, kl_type)
        per_token = per_token + kl_coef * kl
    if entropy is not None and entropy_coef > 0:
        per_token = per_token - entropy_coef * entropy

    loss = aggregate(
        per_token, mask, agg,
        global_tokens=global_tokens, global_sequences=global_sequences, max_response_len=max_response_len,
    )

    metrics = _loss_metrics(pg, ratio, log_ratio, adv, mask, clip_low, clip_high, clip_c, kl, entropy, is_confidence)
    return loss, metrics


@torch.no_grad()
def _loss_metrics(pg, ratio, log_ratio, adv, mask, clip_low, clip_high, clip_c, kl, entropy,
                  is_confidence) -> dict[str, float]:
    """What :func:`policy_loss` reports over the masked tokens: the policy-gradient term, the fraction clipped
    on each side (and by the dual clip), the approximate KL to π_old, the ratio, the KL to π_ref and the entropy
    when given; with ``is_confidence``, the same per sample type (``answer/…``, ``confidence/…``)."""
    pos, neg = (adv > 0).to(mask.dtype), (adv < 0).to(mask.dtype)
    clipped_high = (ratio > 1.0 + clip_high).to(mask.dtype) * pos
    clipped_low = (ratio < 1.0 - clip_low).to(mask.dtype) * neg
    dual = (ratio > clip_c).to(mask.dtype) * neg if clip_c is not None else torch.zeros_like(mask)
    metrics: dict[str, float] = {
        "tokens": float(mask.sum()),
        "pg_loss": _masked_mean(pg, mask),
        "clipfrac_high": _masked_mean(clipped_high, mask),
        "clipfrac_low": _masked_mean(clipped_low, mask),
        "clipfrac_dual": _masked_mean(dual, mask),
        "approx_kl": _masked_mean(-log_ratio, mask),
        "ratio_mean": _masked_mean(ratio, mask),
    }
    if kl is not None:
        metrics["ref_kl"] = _masked_mean(kl, mask)
    if entropy is not None:
        metrics["entropy"] = _masked_mean(entropy, mask)
    if is_confidence is not None:
        is_conf = torch.as_tensor(is_confidence, dtype=torch.bool, device=mask.device)
        for name, sel in (("answer", ~is_conf), ("confidence", is_conf)):
            m = mask * sel[:, None].to(mask.dtype)
            metrics[f"{name}/tokens"] = float(m.sum())
            metrics[f"{name}/pg_loss"] = _masked_mean(pg, m)
            metrics[f"{name}/clipfrac"] = _masked_mean(clipped_high + clipped_low, m)
            metrics[f"{name}/approx_kl"] = _masked_mean(-log_ratio, m)
            if entropy is not None:
                metrics[f"{name}/entropy"] = _masked_mean(entropy, m)
    return metrics
