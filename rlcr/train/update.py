"""The masked GRPO update, in-process (docs/design.md §8): the optimizer, the step loop, the metrics.

Nothing here needs Ray or the artifact store. :func:`train_update` runs one
iteration's optimizer steps on whatever ranks exist (``torch.distributed`` when
initialised, else a single process); :mod:`rlcr.train.trainer` calls it inside
Ray Train workers and writes the checkpoint (:mod:`rlcr.train.checkpoint`), the
tests and ``bench/perf/update.py`` call it directly. It reads in order:

* the plan: seeded mini-batches, this rank's rows of each, packed into micro-batches;
* :func:`_prepass`: π_old / π_ref, once, before the first step;
* :func:`_step`, once per mini-batch (= one optimizer step), on every rank:

  1. the global masked-token and sequence counts of the mini-batch are
     all-reduced, so every micro-batch's loss is normalised by the *whole* batch's
     count (``loss_agg`` token-mean: Σ ℓ·M / Σ M over all micro-batches and workers);
  2. each micro-batch (:func:`micro_batch_loss`): log π at the masked completion
     tokens only (:class:`rlcr.train.logprobs.CompletionLogProbs`: backbone → hidden states at the
     positions that predict them → ``lm_head`` on those rows alone), the loss
     of the configured objective, backward of ``loss × world_size`` (DDP averages
     gradients over ranks, and so does FSDP's reduce-scatter, :mod:`rlcr.train.fsdp`, so the
     accumulated gradient is the whole-batch gradient); ranks with fewer micro-batches run
     zero-loss dummies, so DDP's (FSDP's) collectives match;
  3. a non-finite loss or gradient norm on any rank skips the step on every rank
     (gradients zeroed, no optimizer step, counted in ``skipped_steps``); else the
     gradient norm is clipped and AdamW steps;
  4. the micro-batches' metrics (:class:`StepMetrics`) are all-reduced into the step's;

* :func:`_summary`: the update's metrics from the steps'.

Objectives (``cfg.update.objective``) are registered by name in :mod:`rlcr.train.objectives`
(``grpo``, docs/design.md §8, and ``sft``, the warm-start); this loop looks them up.

π_old (``old_logp_source``): ``recompute`` (default) is the on-policy-exact one —
the trainer's own model and numerics, so the first step's ratio is exactly 1
(with a single optimizer step the current log-probs themselves are detached and
used, which saves a forward pass); ``rollout`` uses vLLM's sampling log-probs
(raw model log-probs, no temperature), whose numerics differ slightly. How far they are from the trainer's π_θ_old
is measured every update (:mod:`rlcr.train.mismatch`, ``mismatch/…``).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from rlcr.config import RLCRConfig
from rlcr.train.batching import (
    MicroBatch,
    Sample,
    collate,
    collate_prefix_tree,
    dummy_sample,
    pack_micro_batches,
    pack_prefix_trees,
    plan_mini_batches,
    shard_rows,
    type_stats,
)
from rlcr.train.fsdp import gradient_sync, is_sharded
from rlcr.train.mismatch import MismatchStats, check_behaviour_logprobs, correction_summary
from rlcr.train.objectives import LossInputs, Objective, get_objective

__all__ = [
    "make_optimizer",
    "Schedule",
    "set_lr",
    "micro_batch_loss",
    "optimizer_step",
    "StepMetrics",
    "train_update",
]


def _scatter(values: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """Selected-token values [N] → completion-aligned [B, L] (zeros elsewhere; differentiable)."""
    out = torch.zeros(mb.loss_mask.shape, dtype=torch.float32, device=values.device)
    return out.index_put((mb.sel_row, mb.sel_col), values.float())


# ----------------------------------------------------------------------------- distributed helpers


def _dist() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """All-reduce a few numbers over ranks (identity in a single process).
    float64 on the model's device (NCCL needs CUDA tensors; gloo takes CPU ones)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if _dist():
        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.cpu().tolist()


def autocast_dtype(device: torch.device, mode: str = "auto") -> torch.dtype:
    """The dtype the update's matmuls run in under ``update.autocast`` = ``mode`` on ``device``: ``auto`` is bf16 on
    a CUDA device that supports it and fp32 on CPU; ``bfloat16`` is bf16 on either; ``off`` is fp32."""
    if mode == "bfloat16" or (mode == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return torch.float32


def _autocast(device: torch.device, mode: str = "auto"):
    """The forward's precision (``update.autocast``, :func:`autocast_dtype`): bf16 autocast over fp32 master
    weights, or plain fp32 (on CPU ``torch.autocast("cpu")``: the matmuls in bf16; RMSNorm and the log-probs,
    upcast per block by :func:`rlcr.core.loss.token_logprobs`, in fp32; the prefix-tree attention in fp32 too,
    :func:`rlcr.train.logprobs.tree_sdpa_attention`)."""
    if autocast_dtype(device, mode) != torch.bfloat16:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


# ----------------------------------------------------------------------------- optimizer


def make_optimizer(model: nn.Module, cfg: RLCRConfig) -> torch.optim.Optimizer:
    """AdamW(lr, weight_decay, betas) over the trainable parameters. A training run keeps ONE for all its
    iterations (:mod:`rlcr.train.trainer`): the moments carry over, so iteration k's steps are not Adam's first."""
    params = [p for p in model.parameters() if p.requires_grad]
    # on CPU the fused kernel (one pass over each parameter) instead of the per-parameter loop of ~10 passes:
    # ~4× faster on SmolLM2-135M (docs/update-performance.md); the same AdamW up to float rounding
    fused = bool(params) and all(p.device.type == "cpu" and p.dtype.is_floating_point for p in params)
    return torch.optim.AdamW(params, lr=cfg.update.learning_rate, weight_decay=cfg.update.weight_decay,
                             betas=tuple(cfg.update.adam_betas), fused=fused or None)


def lr_factor(step: int, *, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the base LR at optimizer step ``step`` (0-based): linear warm-up
    ``(step+1)/warmup``, then constant / linear / cosine decay over the remaining steps."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"update.lr_schedule: unknown schedule {schedule!r}")


@dataclass
class Schedule:
    """Where a run stands in its LR schedule: optimizer steps planned so far (``done``, skipped ones included)
    out of ``total`` (``iterations × epochs_per_iteration × mini_batches_per_epoch``, fixed when the run starts
    and saved with the training state, so a resume follows the same curve)."""

    done: int
    total: int

    @classmethod
    def for_run(cls, cfg: RLCRConfig) -> "Schedule":
        return cls(0, cfg.run.iterations * cfg.update.epochs_per_iteration * cfg.update.mini_batches_per_epoch)


def set_lr(optimizer, cfg: RLCRConfig, step: int, total_steps: int) -> float:
    """Set the LR of optimizer step ``step`` (the schedule follows planned steps, skipped ones included)."""
    lr = cfg.update.learning_rate * lr_factor(step, total=total_steps, warmup=cfg.update.warmup_steps,
                                              schedule=cfg.update.lr_schedule)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def optimizer_step(model: nn.Module, optimizer, *, grad_clip: float, local_ok: bool = True) -> tuple[float, bool]:
    """Clip and step, unless the loss or the gradient is non-finite on any rank.

    Returns ``(grad_norm, stepped)``. On a skip the gradients are zeroed and the
    weights (and the optimizer state) are left untouched.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    # FSDP2 (rlcr.train.fsdp): the gradients are DTensor shards and the norm a DTensor over all of them, the same
    # global norm as DDP's (full_tensor: the sum of the shards' squares over the ranks)
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    ok = _reduce([1.0 if (local_ok and math.isfinite(norm)) else 0.0], _device_of(model), "min")[0]
    stepped = ok > 0
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, stepped


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


# ----------------------------------------------------------------------------- one micro-batch


def micro_batch_loss(
    policy: nn.Module,
    mb: MicroBatch,
    cfg: RLCRConfig,
    *,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None = None,
    global_tokens: float,
    global_sequences: int,
    max_response_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """Loss of one micro-batch under ``cfg.update.objective``, normalised by the global counts (docs/design.md §8).

    ``old_logp``: ``[B, L]`` π_old, or None for "the current log-probs, detached"
    (exactly on-policy). Returns ``(loss, metrics, logp [B, L] detached)``.
    """
    device = mb.input_ids.device
    ent_mode = "grad" if cfg.loss.entropy_coef > 0 else "metric"
    with _autocast(device, cfg.update.autocast):
        logp_sel, ent_sel = policy(**mb.model_inputs(), entropy=ent_mode)
    logp = _scatter(logp_sel, mb)
    entropy = _scatter(ent_sel, mb) if ent_sel is not None else None
    inputs = LossInputs(logp=logp, entropy=entropy, mb=mb, old_logp=old_logp, ref_logp=ref_logp,
                        global_tokens=global_tokens, global_sequences=global_sequences,
                        max_response_len=max_response_len)
    loss, metrics = get_objective(cfg.update.objective).loss(inputs, cfg)
    return loss, metrics, logp.detach()


# ----------------------------------------------------------------------------- π_old / π_ref pre-pass


@torch.no_grad()
def _logprob_cache(module: nn.Module, groups: list[list[Sample]], pad_id: int, device,
                   collate_fn=collate, autocast: str = "auto") -> dict[int, torch.Tensor]:
    """sample index → completion-aligned log-probs (masked positions), one forward per group."""
    cache: dict[int, torch.Tensor] = {}
    for group in groups:
        mb = collate_fn(group, pad_id).to(device)
        with _autocast(device, autocast):
            logp_sel, _ = module(**mb.model_inputs())
        full = (_scatter(logp_sel, mb) * mb.loss_mask).cpu()
        for row, s in enumerate(group):
            if s.index >= 0:
                cache[s.index] = full[row, : len(s.completion_ids)].clone()
    return cache


def _stack(cache: dict[int, torch.Tensor], mb: MicroBatch) -> torch.Tensor:
    out = torch.zeros(mb.loss_mask.shape)
    for row, idx in enumerate(mb.indices):
        if idx >= 0:
            v = cache[idx]
            out[row, : v.numel()] = v
    return out


def packing(cfg: RLCRConfig):
    """``(pack, collate)`` functions of the config: prefix trees (``share_prefixes``) or padded rows."""
    if cfg.update.share_prefixes:
        return pack_prefix_trees, collate_prefix_tree
    return pack_micro_batches, collate


def _pad_groups(groups: list[list[Sample]], pad_id: int, device) -> list[list[Sample]]:
    """Pad to the largest number of micro-batches over ranks with zero-loss dummies
    (every rank must make the same number of DDP forward/backward calls)."""
    n = int(_reduce([float(len(groups))], device, "max")[0])
    return groups + [[dummy_sample(pad_id)] for _ in range(n - len(groups))]


def _prepass(policy: nn.Module, ref: nn.Module | None, cfg: RLCRConfig, objective: Objective,
             local: list[list[list[Sample]]], packed: list[list[list[list[Sample]]]], *, total_steps: int,
             pad_id: int, device) -> tuple[dict[int, torch.Tensor] | None, dict[int, torch.Tensor] | None]:
    """π_old and π_ref caches (sample index → log-probs), each None where the update does not need it.

    One no-grad pass before the first step, packed like epoch 0's micro-batches (identical
    shapes → identical numerics → the first step's ratio is exactly 1), then the samples only
    later epochs hold. π_old is recomputed only for an objective with a ratio, with
    ``old_logp_source="recompute"`` and more than one step (one step uses the current
    log-probs, detached); π_ref only for β > 0.
    """
    need_old = objective.uses_old_logp and cfg.update.old_logp_source == "recompute" and total_steps > 1
    need_ref = ref is not None and cfg.loss.kl_coef > 0
    if not (need_old or need_ref):
        return None, None
    pack, collate_fn = packing(cfg)
    first = [g for mb in packed[0] for g in mb]
    seen = {s.index for g in first for s in g}
    later = [s for ep in local[1:] for rows in ep for s in rows if s.index not in seen]
    later = list({s.index: s for s in later}.values())
    groups = first + pack(later, cfg.update.micro_batch_tokens)
    old_cache = (_logprob_cache(policy, _pad_groups(groups, pad_id, device), pad_id, device, collate_fn,
                                cfg.update.autocast) if need_old else None)
    # a sharded reference's forward is a collective (rlcr.train.fsdp): every rank runs as many (dummies skipped)
    ref_groups = _pad_groups(groups, pad_id, device) if need_ref and is_sharded(ref) else groups
    ref_cache = (_logprob_cache(ref, ref_groups, pad_id, device, collate_fn, cfg.update.autocast)
                 if need_ref else None)
    return old_cache, ref_cache


def _old_logp(mb: MicroBatch, cfg: RLCRConfig, objective: Objective,
              old_cache: dict[int, torch.Tensor] | None) -> torch.Tensor | None:
    """π_old of a micro-batch: vLLM's sampling log-probs (``rollout``), the pre-pass's, or None (no
    ratio in the objective, or a single on-policy step: the current log-probs, detached)."""
    if not objective.uses_old_logp:
        return None
    if cfg.update.old_logp_source == "rollout":
        if mb.rollout_logprobs is None:
            raise ValueError("update.old_logp_source='rollout' but some rows have null completion_logprobs")
        return mb.rollout_logprobs
    return _stack(old_cache, mb) if old_cache is not None else None


# ----------------------------------------------------------------------------- one optimizer step


_METRIC_KEYS = ("pg_loss", "clipfrac_high", "clipfrac_low", "clipfrac_dual", "approx_kl", "ratio_mean", "entropy",
                "ref_kl")
_TYPE_KEYS = ("pg_loss", "clipfrac", "approx_kl", "entropy")
_TYPES = ("answer", "confidence")
_IS_COUNTS = ("is/capped", "is/masked_sequences", "is/weight_sum")  # rlcr.core.loss.importance_weights's counts


class StepMetrics:
    """The micro-batch metrics of one optimizer step on this rank, summed with their token weights.

    :meth:`add` takes each micro-batch's metrics (per-token means, weighted by its
    ``tokens``; per-type means by ``answer/tokens`` / ``confidence/tokens``), loss and
    padded size; :meth:`reduce` all-reduces everything in one collective and returns the
    step's per-token means (rank-independent), the summed loss and the padded tokens.
    """

    def __init__(self) -> None:
        self.sums = {key: 0.0 for key in _METRIC_KEYS}
        self.sums.update({f"{t}/{key}": 0.0 for t in _TYPES for key in _TYPE_KEYS})
        self.weights = {"tokens": 0.0, "answer/tokens": 0.0, "confidence/tokens": 0.0}
        self.counts = {key: 0.0 for key in _IS_COUNTS}
        self.loss = 0.0
        self.padded = 0
        self.finite = True  # every loss on this rank so far is finite

    def add(self, metrics: dict[str, float], loss: float, padded_tokens: int) -> None:
        self.padded += padded_tokens
        self.finite &= math.isfinite(loss)
        self.loss += loss
        for key in _METRIC_KEYS:
            if key in metrics:
                self.sums[key] += metrics[key] * metrics["tokens"]
        self.weights["tokens"] += metrics["tokens"]
        for key in _IS_COUNTS:
            self.counts[key] += metrics.get(key, 0.0)
        for t in _TYPES:
            self.weights[f"{t}/tokens"] += metrics[f"{t}/tokens"]
            for key in _TYPE_KEYS:
                if f"{t}/{key}" in metrics:
                    self.sums[f"{t}/{key}"] += metrics[f"{t}/{key}"] * metrics[f"{t}/tokens"]

    def reduce(self, device) -> tuple[dict[str, float], float, float]:
        """``(per-token means, loss, padded_tokens)`` over all ranks."""
        keys = list(self.sums) + list(self.weights) + list(self.counts) + ["loss", "padded_tokens"]
        red = dict(zip(keys, _reduce([*self.sums.values(), *self.weights.values(), *self.counts.values(), self.loss,
                                      float(self.padded)], device)))
        means = {key: red[key] / max(red["tokens"], 1.0) for key in _METRIC_KEYS}
        means.update({"is/capped": red["is/capped"] / max(red["tokens"], 1.0), "is/masked_sequences":
                      red["is/masked_sequences"], "is/weight_mean": red["is/weight_sum"] / max(red["tokens"], 1.0)})
        for t in _TYPES:
            for key in _TYPE_KEYS:
                means[f"{t}/{key}"] = red[f"{t}/{key}"] / max(red[f"{t}/tokens"], 1.0)
        return means, red["loss"], red["padded_tokens"]


def _step(policy: nn.Module, optimizer, cfg: RLCRConfig, objective: Objective, rows: list[Sample],
          groups: list[list[Sample]], *, old_cache, ref_cache, pad_id: int, world_size: int, device,
          mismatch: MismatchStats | None = None) -> dict[str, float]:
    """One optimizer step over one mini-batch: this rank's ``rows``, packed into micro-batch ``groups``.

    Returns the step's metrics (``empty`` when no rank has a masked token: no forward, no step). ``mismatch``:
    where the step's current log-probs (before its optimizer step: π_θ_old) are compared with the engine's.
    """
    g_tokens, g_seqs = _reduce([float(sum(s.masked_tokens for s in rows)), float(len(rows))], device)
    g_seqs = int(g_seqs)
    info: dict[str, float] = {"global_tokens": g_tokens, "global_sequences": g_seqs}
    if g_tokens == 0:  # nothing to learn from on any rank: no forward, no step
        info.update(empty=1.0, stepped=0.0)
        return info
    _, collate_fn = packing(cfg)
    max_response_len = (cfg.loss.max_response_len
                        or max(cfg.rollout.max_answer_tokens, cfg.rollout.max_confidence_tokens))
    groups = _pad_groups(groups, pad_id, device)
    acc = StepMetrics()
    for j, group in enumerate(groups):
        mb = collate_fn(group, pad_id).to(device)
        padded = mb.padded_tokens if group[0].index >= 0 else 0
        old = _old_logp(mb, cfg, objective, old_cache)
        ref_lp = _stack(ref_cache, mb) if ref_cache is not None else None
        last = j == len(groups) - 1
        with gradient_sync(policy, last):
            loss, m, logp = micro_batch_loss(
                policy, mb, cfg, old_logp=old, ref_logp=ref_lp, global_tokens=g_tokens,
                global_sequences=g_seqs, max_response_len=max_response_len,
            )
            (loss * world_size).backward()
        acc.add(m, float(loss.detach()), padded)
        if mismatch is not None:
            mismatch.add_micro_batch(group, mb, logp)
    grad_norm, stepped = optimizer_step(policy, optimizer, grad_clip=cfg.update.grad_clip, local_ok=acc.finite)
    means, loss_sum, padded_tokens = acc.reduce(device)
    if cfg.loss.tis_cap is None and cfg.loss.seq_mask_band is None:
        means = {k: v for k, v in means.items() if not k.startswith("is/")}
    info.update(means)
    info.update(loss=loss_sum, grad_norm=grad_norm, stepped=float(stepped), empty=0.0, padded_tokens=padded_tokens)
    return info


# ----------------------------------------------------------------------------- the update


def train_update(
    policy: nn.Module,
    samples: Sequence[Sample],
    cfg: RLCRConfig,
    *,
    pad_id: int,
    ref: nn.Module | None = None,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    schedule: Schedule | None = None,
) -> dict[str, Any]:
    """Run ``epochs_per_iteration × mini_batches_per_epoch`` optimizer steps over ``samples``.

    ``optimizer``/``schedule``: the run's AdamW and LR-schedule position, carried from iteration to
    iteration (``schedule.done`` advances by this call's steps); None: a fresh AdamW and a schedule over
    this call's steps alone (a standalone update such as the warm-start).
    ``policy``: a :class:`~rlcr.train.logprobs.CompletionLogProbs`, possibly DDP/FSDP-wrapped;
    ``samples``: ALL of the iteration's samples, in the global order of
    :func:`prepare_samples` (each rank picks its rows per mini-batch); ``seed``:
    the mini-batch plan's (:func:`rlcr.seeds.update_seed`). Returns metrics
    (rank-independent: every sum is all-reduced).
    """
    if not isinstance(cfg, RLCRConfig):
        raise TypeError(f"train_update takes an RLCRConfig, got {type(cfg).__name__}")
    objective = get_objective(cfg.update.objective)
    device = _device_of(policy)
    epochs, per_epoch = cfg.update.epochs_per_iteration, cfg.update.mini_batches_per_epoch
    total_steps = epochs * per_epoch
    check_behaviour_logprobs(samples, cfg, objective.uses_old_logp)
    if optimizer is None:
        optimizer = make_optimizer(policy, cfg)
    if schedule is None:
        schedule = Schedule(0, total_steps)
    optimizer.zero_grad(set_to_none=True)

    # the plan: [epoch][mini-batch] → this rank's rows → its micro-batches
    plan = plan_mini_batches(len(samples), epochs=epochs, mini_batches=per_epoch, seed=seed)
    local = [[[samples[i] for i in shard_rows(mb, samples, rank, world_size)] for mb in ep] for ep in plan]
    pack, _ = packing(cfg)
    packed = [[pack(rows, cfg.update.micro_batch_tokens) for rows in ep] for ep in local]

    t0 = time.perf_counter()
    old_cache, ref_cache = _prepass(policy, ref, cfg, objective, local, packed, total_steps=total_steps,
                                    pad_id=pad_id, device=device)
    prepass_s = time.perf_counter() - t0
    mismatch = MismatchStats()  # π_θ_old vs the engine: from the pre-pass's π_old, else in the first step
    if old_cache is not None:  # epoch 0 holds every sample once, over the ranks
        mismatch.add_cache(old_cache, [s for rows in local[0] for s in rows])

    steps: list[dict[str, float]] = []
    t_train = time.perf_counter()
    for epoch in range(epochs):
        for k in range(per_epoch):
            lr = set_lr(optimizer, cfg, schedule.done, schedule.total)
            schedule.done += 1
            info: dict[str, float] = {"epoch": epoch, "mini_batch": k, "lr": lr}
            info.update(_step(policy, optimizer, cfg, objective, local[epoch][k], packed[epoch][k],
                              old_cache=old_cache, ref_cache=ref_cache, pad_id=pad_id, world_size=world_size,
                              device=device, mismatch=mismatch if old_cache is None and not steps else None))
            steps.append(info)
    train_s = time.perf_counter() - t_train
    out = _summary(steps, samples, cfg, train_s=train_s, prepass_s=prepass_s, world_size=world_size,
                   has_ref=ref_cache is not None)
    out.update(mismatch.reduce(_reduce, device))
    return out


def _summary(steps: list[dict[str, float]], samples: Sequence[Sample], cfg: RLCRConfig, *, train_s: float,
             prepass_s: float, world_size: int, has_ref: bool) -> dict[str, Any]:
    """The update's metrics: counts and throughput, token-weighted means of the non-empty steps'
    metrics, first/last values, the samples' per-type stats, and the per-step ``history``."""
    done = [s for s in steps if not s["empty"]]
    tokens = sum(s["global_tokens"] for s in done)
    out: dict[str, Any] = {
        "steps": len(steps),
        "optimizer_steps": int(sum(s["stepped"] for s in steps)),
        "skipped_steps": int(sum(1 for s in done if not s["stepped"])),
        "empty_steps": int(sum(s["empty"] for s in steps)),
        "masked_tokens": tokens,
        "padded_tokens": sum(s.get("padded_tokens", 0.0) for s in done),
        "tokens_per_s": tokens / train_s if train_s > 0 else 0.0,
        "train_s": train_s,
        "prepass_s": prepass_s,
        "world_size": world_size,
    }
    if done:
        w = [s["global_tokens"] for s in done]
        for key in ("loss", "grad_norm", *_METRIC_KEYS, *(f"{t}/{k}" for t in _TYPES for k in _TYPE_KEYS)):
            out[key] = sum(s[key] * wi for s, wi in zip(done, w)) / sum(w)
        out["grad_norm_last"] = done[-1]["grad_norm"]
        out["loss_first"] = done[0]["loss"]
        out["ratio_mean_first"] = done[0]["ratio_mean"]
        out.update(correction_summary(done))
    if not has_ref:
        out.pop("ref_kl", None)
    out["lr_last"] = steps[-1]["lr"] if steps else cfg.update.learning_rate
    out.update(type_stats(samples))
    out["history"] = steps
    return out
