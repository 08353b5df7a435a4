"""The update's objectives, registered by name (docs/design.md §8, §11): ``cfg.update.objective`` names one.

:func:`register_objective` adds ``fn(inputs: LossInputs, cfg) -> (loss, metrics)`` to :data:`OBJECTIVES`, as
verl registers its policy losses: ``grpo`` (the masked clipped policy gradient, :func:`rlcr.core.loss.policy_loss`)
and ``sft`` (the warm-start's token-mean NLL); a new method is one more decorated function. An objective sees
one micro-batch (:class:`LossInputs`) and returns its share of the mini-batch loss, normalised by the global
counts the step loop (:mod:`rlcr.train.update`) all-reduced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rlcr.config import RLCRConfig
from rlcr.core.advantages import spread_to_tokens
from rlcr.core.loss import importance_weights, policy_loss
from rlcr.train.batching import MicroBatch

__all__ = ["LossInputs", "Objective", "OBJECTIVES", "register_objective", "get_objective"]


@dataclass
class LossInputs:
    """What an objective sees of one micro-batch; tensors are completion-aligned ``[B, L]``."""

    logp: torch.Tensor
    """log π at the masked tokens (0 elsewhere), with gradient."""
    entropy: torch.Tensor | None
    """Per-token entropy (with gradient when ``entropy_coef`` > 0), or None."""
    mb: MicroBatch
    """The micro-batch: ``loss_mask``, ``advantages``, ``is_confidence``."""
    old_logp: torch.Tensor | None
    """π_old, or None for "the current log-probs, detached" (exactly on-policy)."""
    ref_logp: torch.Tensor | None
    """π_ref of the frozen reference model (β > 0), or None."""
    global_tokens: float
    """Masked tokens of the whole mini-batch, over all micro-batches and ranks."""
    global_sequences: int
    """Sequences of the whole mini-batch, over all ranks."""
    max_response_len: int | None
    """Dr. GRPO normaliser (``seq-mean-token-sum-norm``)."""


ObjectiveFn = Callable[[LossInputs, RLCRConfig], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class Objective:
    """A registered objective: ``loss(inputs, cfg) → (loss, metrics)``.

    ``loss`` is this micro-batch's share of the mini-batch loss (normalised by the
    global counts); ``metrics`` holds at least ``tokens``, ``answer/tokens`` and
    ``confidence/tokens`` (the weights of the per-token means in :class:`StepMetrics`).
    ``uses_old_logp``: whether the update provides π_old (pre-pass or rollout log-probs).
    """

    name: str
    loss: ObjectiveFn
    uses_old_logp: bool = True


OBJECTIVES: dict[str, Objective] = {}
"""The objectives ``cfg.update.objective`` may name, by name."""


def register_objective(name: str, *, uses_old_logp: bool = True) -> Callable[[ObjectiveFn], ObjectiveFn]:
    """Decorator registering ``fn(inputs: LossInputs, cfg) -> (loss, metrics)`` as objective ``name``."""

    def decorate(fn: ObjectiveFn) -> ObjectiveFn:
        if name in OBJECTIVES:
            raise ValueError(f"objective {name!r} is already registered")
        OBJECTIVES[name] = Objective(name, fn, uses_old_logp)
        return fn

    return decorate


def get_objective(name: str) -> Objective:
    """The objective registered as ``name``; ValueError naming the registered ones otherwise."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; registered: {sorted(OBJECTIVES)}") from None


@register_objective("grpo")
def grpo_objective(x: LossInputs, cfg: RLCRConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Masked clipped policy gradient over answer and confidence samples together (docs/design.md §8).

    Token advantages are λ_ans·A_ans·M_ans and λ_conf·A_conf·M_conf (docs/design.md §7, masks
    docs/design.md §6); ratio ρ = exp(logπ − logπ_old) with the (dual) clip, optional KL to
    π_ref and entropy bonus, aggregated by ``loss_agg``: :func:`rlcr.core.loss.policy_loss`.
    """
    mb, mask = x.mb, x.mb.loss_mask
    device = mb.input_ids.device
    old = x.logp.detach() if x.old_logp is None else x.old_logp.to(device) * mask
    ref = x.ref_logp.to(device) * mask if x.ref_logp is not None else None
    token_adv = spread_to_tokens(
        mb.advantages, mask, mb.is_confidence, lambda_ans=cfg.method.lambda_ans, lambda_conf=cfg.method.lambda_conf
    ).to(device)
    weights, is_stats = behaviour_correction(x, old, cfg)
    loss, metrics = policy_loss(
        x.logp, old, token_adv, mask,
        clip_low=cfg.loss.clip_low, clip_high=cfg.loss.clip_high, clip_c=cfg.loss.clip_c, agg=cfg.loss.agg,
        ref_logp=ref, kl_coef=cfg.loss.kl_coef, kl_type=cfg.loss.kl_type,
        global_tokens=x.global_tokens, global_sequences=x.global_sequences, max_response_len=x.max_response_len,
        entropy=x.entropy, entropy_coef=cfg.loss.entropy_coef, is_confidence=mb.is_confidence, is_weights=weights,
    )
    metrics.update(is_stats)
    return loss, metrics


def behaviour_correction(x: LossInputs, old: torch.Tensor, cfg: RLCRConfig) -> tuple[torch.Tensor | None, dict]:
    """The importance weights of ``loss.tis_cap`` / ``loss.seq_mask_band`` (docs/design.md §8): π_old (``old``,
    the ratio's denominator) against the behaviour policy μ, the engine's sampling log-probs of the rows
    (``completion_logprobs``); None when both are off or the micro-batch has no masked token."""
    band = tuple(cfg.loss.seq_mask_band) if cfg.loss.seq_mask_band is not None else None
    mb, mask = x.mb, x.mb.loss_mask
    if (cfg.loss.tis_cap is None and band is None) or float(mask.sum()) == 0:
        return None, {}
    if mb.rollout_logprobs is None:
        raise ValueError("loss.tis_cap / loss.seq_mask_band need the engine's log-probs, but some rows have null "
                         "completion_logprobs")
    behaviour = mb.rollout_logprobs.to(old.device) * mask
    return importance_weights(old, behaviour, mask, tis_cap=cfg.loss.tis_cap, seq_band=band)


@register_objective("sft", uses_old_logp=False)
def sft_objective(x: LossInputs, cfg: RLCRConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Supervised warm-start: token-mean negative log-likelihood of the masked completion tokens over
    the global batch (no ratio, no advantages).

    SmolLM2 writes the answer format 0% of the time out of the box, so RL needs a
    warm-start on solver traces first (docs/design.md §17; the methods compared share it,
    docs/design.md §9). ``pg_loss`` reports the NLL per token, overall and per sample type.
    """
    mb, logp, mask = x.mb, x.logp, x.mb.loss_mask
    nll = -(logp * mask).sum() / x.global_tokens
    with torch.no_grad():
        metrics = {"tokens": float(mask.sum())}
        metrics["pg_loss"] = float(-(logp * mask).sum()) / max(metrics["tokens"], 1.0)
        conf = mb.is_confidence.to(mb.input_ids.device)[:, None].to(mask.dtype)
        for name, sel in (("answer", mask * (1 - conf)), ("confidence", mask * conf)):
            metrics[f"{name}/tokens"] = float(sel.sum())
            metrics[f"{name}/pg_loss"] = float(-(logp * sel).sum()) / max(metrics[f"{name}/tokens"], 1.0)
    return nll, metrics
