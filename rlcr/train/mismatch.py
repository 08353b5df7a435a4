"""The engine–trainer log-prob mismatch of an iteration (docs/design.md §11): how far the log-probs the engine
sampled with (μ, the rows' ``completion_logprobs``) are from the trainer's π_θ_old at the same weights.

Per masked token (the tokens that carry loss) Δ = log π_trainer − log μ; per sample type (``answer``,
``confidence``) and over all: the mean and max of |Δ| and the fraction of tokens whose ratio e^Δ lies outside
:data:`BAND`. Both sides are the untempered model's log-probs (vLLM's ``raw_logprobs``, the trainer's log-softmax),
so Δ is the numerics gap (precision, kernels) plus, in one-step-off mode, the staleness. Under truncated sampling
(``rollout.top_p`` < 1) both stay the untruncated model's: vLLM takes ``raw_logprobs`` before the nucleus is cut
and renormalised (:func:`rlcr.rollout.sampling.check_raw_logprobs` refuses an engine in another mode), so Δ holds no
−log(kept mass) term; the truncation itself is not measured here. The correction below (``loss.tis_cap``,
``loss.seq_mask_band``) weighs the same Δ.

:class:`MismatchStats` accumulates sums, counts and maxima on one rank; :meth:`MismatchStats.reduce` all-reduces
them over the ranks (sums and maxima), so the figures do not depend on how the samples were split.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["BAND", "WARN_MEAN_ABS", "MismatchStats", "mismatch_warning", "check_behaviour_logprobs",
           "correction_summary"]

BAND = (0.5, 2.0)
"""A token's ratio π_trainer/μ outside [0.5, 2] counts in ``out_of_band``."""
WARN_MEAN_ABS = 0.01
"""Mean |Δ| (nats) over an iteration's masked tokens above which the flow logs a warning: verl treats a mean gap
above 0.01 as a bug to investigate (a wrong dtype, chat template, weight sync or temperature)."""
_TYPES = ("answer", "confidence")


class MismatchStats:
    """Σ|Δ|, max |Δ|, out-of-band and token counts per sample type, on this rank."""

    def __init__(self) -> None:
        self.sums = {t: [0.0, 0.0, 0.0] for t in _TYPES}  # Σ|Δ|, out-of-band tokens, tokens
        self.maxima = {t: 0.0 for t in _TYPES}

    def add(self, trainer_logp: torch.Tensor, engine_logp: Sequence[float] | torch.Tensor | None,
            mask: Sequence[int] | torch.Tensor, is_confidence: bool) -> None:
        """One sample: its completion's trainer log-probs ``[n]`` (or longer: padding is cut), the engine's
        (None: not recorded, the sample is left out) and its loss mask."""
        if engine_logp is None:
            return
        engine = torch.as_tensor(engine_logp, dtype=torch.float64)
        n = engine.numel()
        sel = torch.as_tensor(mask, dtype=torch.bool)[:n]
        delta = (trainer_logp.detach().reshape(-1)[:n].cpu().double() - engine)[sel]
        delta = torch.nan_to_num(delta, nan=20.0).clamp(-20.0, 20.0)  # as the loss clamps its log-ratios
        if delta.numel() == 0:
            return
        absd = delta.abs()
        lo, hi = math.log(BAND[0]), math.log(BAND[1])
        acc = self.sums["confidence" if is_confidence else "answer"]
        acc[0] += float(absd.sum())
        acc[1] += float(((delta < lo) | (delta > hi)).sum())
        acc[2] += float(delta.numel())
        key = "confidence" if is_confidence else "answer"
        self.maxima[key] = max(self.maxima[key], float(absd.max()))

    def add_cache(self, cache: dict[int, torch.Tensor], samples: Sequence) -> None:
        """``samples`` against the trainer's log-probs ``cache`` (sample index → completion log-probs)."""
        for s in samples:
            self.add(cache[s.index], s.rollout_logprobs, s.loss_mask, s.is_confidence)

    def add_micro_batch(self, samples: Sequence, mb, logp: torch.Tensor) -> None:
        """The samples of a micro-batch (``mb.indices`` order may differ from ``samples``') and its
        completion-aligned trainer log-probs ``[B, L]``; dummy rows (index < 0) are skipped."""
        by_index = {s.index: s for s in samples}
        for row, idx in enumerate(mb.indices):
            if idx >= 0:
                s = by_index[idx]
                self.add(logp[row], s.rollout_logprobs, s.loss_mask, s.is_confidence)

    def reduce(self, reduce_fn, device) -> dict[str, float]:
        """``mismatch/<type>/…`` and ``mismatch/…`` (all tokens) over all ranks: ``mean_abs``, ``max_abs``,
        ``out_of_band`` (a fraction) and ``tokens``; only ``mismatch/tokens`` (0) where no token had the
        engine's log-probs. ``reduce_fn(values, device, op)``: the update's all-reduce."""
        sums = reduce_fn([v for t in _TYPES for v in self.sums[t]], device, "sum")
        maxima = reduce_fn([self.maxima[t] for t in _TYPES], device, "max")
        per = {t: (sums[3 * i:3 * i + 3], maxima[i]) for i, t in enumerate(_TYPES)}
        total = [sum(per[t][0][j] for t in _TYPES) for j in range(3)]
        out: dict[str, float] = {"mismatch/tokens": total[2]}
        for prefix, (s, m) in [("mismatch/", (total, max(maxima)))] + [(f"mismatch/{t}/", per[t]) for t in _TYPES]:
            if s[2] > 0:
                out.update({f"{prefix}mean_abs": s[0] / s[2], f"{prefix}max_abs": m,
                            f"{prefix}out_of_band": s[1] / s[2], f"{prefix}tokens": s[2]})
        return out


def mismatch_warning(update: dict, staleness: float = 0.0) -> str | None:
    """One line when an update's mean |Δ| over all measured tokens exceeds :data:`WARN_MEAN_ABS`, else None.
    ``staleness``: updates between the sampling policy and the trainer's (one-step-off mode: 1), whose own change
    is then part of the gap, which the line says."""
    mean = update.get("mismatch/mean_abs")
    if mean is None or not mean > WARN_MEAN_ABS:
        return None
    per = ", ".join(f"{t} {update[f'mismatch/{t}/mean_abs']:.3g}" for t in _TYPES if f"mismatch/{t}/mean_abs" in update)
    cause = ("the rollouts are one update stale, so this includes that update's change; correct it with "
             "loss.tis_cap (docs/design.md §8)" if staleness else
             "check the engine's dtype, chat template and weight sync (docs/design.md §11)")
    return (f"engine–trainer log-prob mismatch: mean |Δ log π| {mean:.3g} nats > {WARN_MEAN_ABS} ({per}; max "
            f"{update.get('mismatch/max_abs', math.nan):.3g}): {cause}")


# ----------------------------------------------------------------------------- the correction (loss.tis_cap, …)


def check_behaviour_logprobs(samples: Sequence, cfg, uses_old_logp: bool) -> None:
    """Before any work: ``loss.tis_cap`` / ``loss.seq_mask_band`` need every row's engine log-probs (the same
    samples on every rank, so every rank raises alike)."""
    on = cfg.loss.tis_cap is not None or cfg.loss.seq_mask_band is not None
    if on and uses_old_logp and any(s.rollout_logprobs is None for s in samples):
        raise ValueError("loss.tis_cap / loss.seq_mask_band need the engine's log-probs, but some rows have null "
                         "completion_logprobs")


def correction_summary(steps: Sequence[dict]) -> dict[str, float]:
    """The update's ``is/capped`` and ``is/weight_mean`` (token-weighted over the non-empty ``steps``) and
    ``is/masked_samples`` (samples masked / samples, over the steps); {} when the correction is off."""
    if not steps or "is/capped" not in steps[0]:
        return {}
    w = [s["global_tokens"] for s in steps]
    out = {key: sum(s[key] * wi for s, wi in zip(steps, w)) / max(sum(w), 1.0)
           for key in ("is/capped", "is/weight_mean")}
    out["is/masked_samples"] = sum(s["is/masked_sequences"] for s in steps) / max(
        sum(s["global_sequences"] for s in steps), 1)
    return out
