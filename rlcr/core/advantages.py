"""Two-level GRPO advantages for answers and confidences (docs/design.md §7), and each method's choice (§11).

Answers are normalised per prompt over their G_a siblings; confidences per
answer over the G_c confidences conditioned on that same answer — never against
confidences of a different answer. Pure PyTorch; statistics in float64.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence

import torch

__all__ = [
    "answer_advantages",
    "confidence_advantages",
    "spread_to_tokens",
    "check_finite",
    "METHOD_ADVANTAGES",
    "method_advantages",
]

ConfMode = Literal["answer", "answer_then_prompt"]


def check_finite(rewards: torch.Tensor, name: str) -> None:
    """Raise ValueError naming the first non-finite reward (NaN would poison a whole group)."""
    bad = ~torch.isfinite(rewards)
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}: non-finite reward {rewards[index].item()} at index {index}")


def _as_tensor(rewards, ndim: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(rewards, dtype=torch.float64)
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d array of rewards, got shape {tuple(t.shape)}")
    check_finite(t, name)
    return t


def _flat(r: torch.Tensor, dim) -> torch.Tensor:
    """True for groups whose rewards are all equal (broadcastable over ``dim``)."""
    return r.amax(dim=dim, keepdim=True) == r.amin(dim=dim, keepdim=True)


def _centre(r: torch.Tensor, dim) -> torch.Tensor:
    """r − mean over ``dim``; groups whose rewards are all equal give exactly 0."""
    centred = r - r.mean(dim=dim, keepdim=True)
    return torch.where(_flat(r, dim), torch.zeros_like(centred), centred)


def _scale(centred: torch.Tensor, std: torch.Tensor, eps: float) -> torch.Tensor:
    """centred / (std + ε), with exact zeros kept (a flat group stays 0 even when ε = 0)."""
    return torch.where(centred == 0, torch.zeros_like(centred), centred / (std + eps))


def answer_advantages(rewards, *, eps: float = 1e-6, scale_by_std: bool = True) -> torch.Tensor:
    """A_ans[j,k] = (r[j,k] − mean_k r[j,·]) / (std_k r[j,·] + ε), population std (÷G_a).

    ``rewards``: ``[P, G_a]``. With ``scale_by_std=False`` only the mean is removed.
    Returns float32 ``[P, G_a]``.
    """
    r = _as_tensor(rewards, 2, "answer rewards")
    adv = _centre(r, dim=1)
    if scale_by_std:
        adv = _scale(adv, r.std(dim=1, unbiased=False, keepdim=True), eps)
    return adv.float()


def confidence_advantages(
    rewards, *, eps: float = 1e-6, scale_by_std: bool = True, mode: ConfMode = "answer"
) -> torch.Tensor:
    """Confidence advantages, ``rewards``: ``[P, G_a, G_c]`` (docs/design.md §7).

    ``mode="answer"``: A[j,k,h] = (c[j,k,h] − mean_h c[j,k,·]) / (std_h c[j,k,·] + ε).
    ``mode="answer_then_prompt"``: centre within the answer, then divide by the
    population std of all G_a·G_c centred values of prompt j.
    Returns float32 ``[P, G_a, G_c]``.
    """
    r = _as_tensor(rewards, 3, "confidence rewards")
    if r.shape[2] < 2:
        raise ValueError(f"confidence rewards: need G_c >= 2 confidences per answer, got {r.shape[2]}")
    centred = _centre(r, dim=2)
    if not scale_by_std:
        return centred.float()
    if mode == "answer":
        std = r.std(dim=2, unbiased=False, keepdim=True)
    elif mode == "answer_then_prompt":
        std = centred.flatten(1).std(dim=1, unbiased=False)[:, None, None]
    else:
        raise ValueError(f"confidence advantages: unknown mode {mode!r} (answer | answer_then_prompt)")
    return _scale(centred, std, eps).float()


def spread_to_tokens(
    advantages: torch.Tensor,
    mask: torch.Tensor,
    is_confidence: torch.Tensor | Sequence[bool],
    *,
    lambda_ans: float = 1.0,
    lambda_conf: float = 1.0,
) -> torch.Tensor:
    """Token advantages ``λ_ans·A_ans·M_ans`` / ``λ_conf·A_conf·M_conf`` (docs/design.md §7).

    ``advantages``: ``[B]`` sequence advantages; ``mask``: ``[B, T]`` loss mask;
    ``is_confidence``: ``[B]`` sample type. Returns float32 ``[B, T]``.
    """
    is_conf = torch.as_tensor(is_confidence, dtype=torch.bool)
    weight = torch.where(is_conf, torch.tensor(float(lambda_conf)), torch.tensor(float(lambda_ans)))
    seq = advantages.float() * weight
    return seq[:, None] * mask.float()


# --------------------------------------------------------------------------- per-method advantages (docs/design.md §9)

MethodAdvantages = Callable[..., "tuple[torch.Tensor, torch.Tensor | None]"]
METHOD_ADVANTAGES: dict[str, MethodAdvantages] = {}
"""method → ``fn(answer_rewards [P, G_a], confidence_rewards [P, G_a, G_c] | None, *, eps, scale_by_std,
conf_mode) -> (A_ans, A_conf | None)``."""


def _register(*methods: str):
    def register(fn: MethodAdvantages) -> MethodAdvantages:
        for method in methods:
            METHOD_ADVANTAGES[method] = fn
        return fn

    return register


@_register("rlcr")
def two_level(answer_rewards, confidence_rewards, *, eps: float = 1e-6, scale_by_std: bool = True,
              conf_mode: ConfMode = "answer") -> tuple[torch.Tensor, torch.Tensor]:
    """Two-turn RLCR: answers per prompt, confidences per answer (docs/design.md §7)."""
    if confidence_rewards is None:
        raise ValueError("method rlcr: the rollouts hold no confidences (G_c = 0)")
    return (answer_advantages(answer_rewards, eps=eps, scale_by_std=scale_by_std),
            confidence_advantages(confidence_rewards, eps=eps, scale_by_std=scale_by_std, mode=conf_mode))


@_register("rlcr_single", "rlvr")
def per_prompt_only(answer_rewards, confidence_rewards, *, eps: float = 1e-6, scale_by_std: bool = True,
                    conf_mode: ConfMode = "answer") -> tuple[torch.Tensor, None]:
    """One sample kind, normalised per prompt over its G samples as A_ans (``rlcr_single``: the reward already
    holds the Brier term; ``rlvr``: accuracy only). Confidence samples have no place in these methods."""
    if confidence_rewards is not None and torch.as_tensor(confidence_rewards).numel():
        raise ValueError("this method trains no confidence samples, but the rollouts hold some")
    return answer_advantages(answer_rewards, eps=eps, scale_by_std=scale_by_std), None


def method_advantages(method: str) -> MethodAdvantages:
    """The registered advantage function of ``method``."""
    try:
        return METHOD_ADVANTAGES[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r} (one of {', '.join(sorted(METHOD_ADVANTAGES))})") from None
