"""The masked GRPO update, in-process (SPEC §7): log-probs, steps, checkpoints.

Nothing here needs Ray. :func:`train_update` runs one iteration's optimizer
steps on whatever ranks exist (``torch.distributed`` when initialised, else a
single process); :mod:`rlcr.train.trainer` calls it inside Ray Train workers,
the tests and ``bench/update.py`` call it directly.

One optimizer step (= one mini-batch), on every rank:

1. the global masked-token and sequence counts of the mini-batch are
   all-reduced, so every micro-batch's loss is normalised by the *whole* batch's
   count (``loss_agg`` token-mean: Σ ℓ·M / Σ M over all micro-batches and workers);
2. each micro-batch: log π at the masked completion tokens only (backbone →
   hidden states at the positions that predict them → ``lm_head`` on those rows
   alone → :func:`rlcr.loss.token_logprobs`), :func:`rlcr.loss.policy_loss` with
   token advantages λ·A·M, backward of ``loss × world_size`` (DDP averages
   gradients over ranks, so the accumulated gradient is the whole-batch gradient);
   ranks with fewer micro-batches run zero-loss dummies, so DDP's collectives match;
3. a non-finite loss or gradient norm on any rank skips the step on every rank
   (gradients zeroed, no optimizer step, counted in ``skipped_steps``); else the
   gradient norm is clipped and AdamW steps.

π_old (``old_logp_source``): ``recompute`` (default) is the on-policy-exact one —
the trainer's own model and numerics, so the first step's ratio is exactly 1
(with a single optimizer step the current log-probs themselves are detached and
used, which saves a forward pass); ``rollout`` uses vLLM's sampling log-probs
(raw model log-probs, no temperature), whose numerics differ slightly.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from rlcr.advantages import spread_to_tokens
from rlcr.loss import policy_loss, token_logprobs
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

__all__ = [
    "CompletionLogProbs",
    "NonFiniteError",
    "make_optimizer",
    "set_lr",
    "micro_batch_loss",
    "optimizer_step",
    "train_update",
    "check_finite_parameters",
    "save_checkpoint",
]


class NonFiniteError(RuntimeError):
    """Weights are not finite: no checkpoint may be written from them."""


# ----------------------------------------------------------------------------- log-probs


class CompletionLogProbs(nn.Module):
    """A causal LM whose forward returns log π of selected tokens only.

    ``forward(input_ids [R,T], sel_seq [N], sel_pos [N], sel_label [N], position_ids,
    attention_mask)`` runs the backbone once (optionally on a packed prefix tree:
    depth position ids and a ``[R,1,T,T]`` tree mask), applies the output head to
    the N hidden states that predict the selected tokens (not to all R·T
    positions) and returns ``(logp [N], entropy [N] | None)``. Wrapping the whole computation in one module lets DDP
    see one forward per micro-batch. Logits are taken as they are (temperature 1),
    like vLLM's default raw sampling log-probs.
    """

    def __init__(self, lm: nn.Module, *, chunk_rows: int = 1024):
        super().__init__()
        self.lm = lm
        self.chunk_rows = chunk_rows

    def forward(self, input_ids, sel_seq, sel_pos, sel_label, *, position_ids=None, attention_mask=None,
                entropy: str = "none"):
        backbone = self.lm.base_model
        hidden = backbone(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                          use_cache=False).last_hidden_state
        logits = self.lm.get_output_embeddings()(hidden[sel_seq, sel_pos])
        if entropy == "none":
            return token_logprobs(logits, sel_label, chunk_rows=self.chunk_rows)
        return token_logprobs(logits, sel_label, return_entropy=True, entropy_grad=entropy == "grad",
                              chunk_rows=self.chunk_rows)


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


def _autocast(device: torch.device):
    """bf16 autocast on GPU (fp32 master weights); plain fp32 on CPU."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------- optimizer


def make_optimizer(model: nn.Module, cfg) -> torch.optim.Optimizer:
    """AdamW(lr, weight_decay, betas) over the trainable parameters (fresh each update)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, betas=tuple(cfg.adam_betas))


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
    raise ValueError(f"lr_schedule: unknown schedule {schedule!r}")


def set_lr(optimizer, cfg, step: int, total_steps: int) -> float:
    """Set the LR of optimizer step ``step`` (the schedule follows planned steps, skipped ones included)."""
    lr = cfg.learning_rate * lr_factor(step, total=total_steps, warmup=cfg.warmup_steps, schedule=cfg.lr_schedule)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def optimizer_step(model: nn.Module, optimizer, *, grad_clip: float, local_ok: bool = True) -> tuple[float, bool]:
    """Clip and step, unless the loss or the gradient is non-finite on any rank.

    Returns ``(grad_norm, stepped)``. On a skip the gradients are zeroed and the
    weights (and the optimizer state) are left untouched.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if hasattr(model, "clip_grad_norm_"):  # FSDP computes the norm over the shards
        norm = model.clip_grad_norm_(grad_clip)
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    norm = float(norm)
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
    cfg,
    *,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None = None,
    global_tokens: float,
    global_sequences: int,
    max_response_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """Loss of one micro-batch, normalised by the global counts (SPEC §7).

    ``old_logp``: ``[B, L]`` π_old, or None for "the current log-probs, detached"
    (exactly on-policy). Returns ``(loss, metrics, logp [B, L] detached)``.
    """
    device = mb.input_ids.device
    ent_mode = "grad" if cfg.entropy_coef > 0 else "metric"
    with _autocast(device):
        logp_sel, ent_sel = policy(**mb.model_inputs(), entropy=ent_mode)
    logp = _scatter(logp_sel, mb)
    entropy = _scatter(ent_sel, mb) if ent_sel is not None else None
    mask = mb.loss_mask
    if getattr(cfg, "objective", "grpo") == "sft":
        # Supervised warm-start: token-mean negative log-likelihood over the global batch.
        nll = -(logp * mask).sum() / global_tokens
        with torch.no_grad():
            metrics = {"tokens": float(mask.sum())}
            metrics["pg_loss"] = float(-(logp * mask).sum()) / max(metrics["tokens"], 1.0)
            conf = mb.is_confidence.to(device)[:, None].to(mask.dtype)
            for name, sel in (("answer", mask * (1 - conf)), ("confidence", mask * conf)):
                metrics[f"{name}/tokens"] = float(sel.sum())
                metrics[f"{name}/pg_loss"] = float(-(logp * sel).sum()) / max(metrics[f"{name}/tokens"], 1.0)
        return nll, metrics, logp.detach()
    old = logp.detach() if old_logp is None else old_logp.to(device) * mask
    ref = ref_logp.to(device) * mask if ref_logp is not None else None
    token_adv = spread_to_tokens(
        mb.advantages, mask, mb.is_confidence, lambda_ans=cfg.lambda_ans, lambda_conf=cfg.lambda_conf
    ).to(device)
    loss, metrics = policy_loss(
        logp, old, token_adv, mask,
        clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_c=cfg.clip_c, agg=cfg.loss_agg,
        ref_logp=ref, kl_coef=cfg.kl_coef, kl_type=cfg.kl_type,
        global_tokens=global_tokens, global_sequences=global_sequences, max_response_len=max_response_len,
        entropy=entropy, entropy_coef=cfg.entropy_coef, is_confidence=mb.is_confidence,
    )
    return loss, metrics, logp.detach()


# ----------------------------------------------------------------------------- π_old / π_ref pre-pass


@torch.no_grad()
def _logprob_cache(module: nn.Module, groups: list[list[Sample]], pad_id: int, device,
                   collate_fn=collate) -> dict[int, torch.Tensor]:
    """sample index → completion-aligned log-probs (masked positions), one forward per group."""
    cache: dict[int, torch.Tensor] = {}
    for group in groups:
        mb = collate_fn(group, pad_id).to(device)
        with _autocast(device):
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


def packing(cfg):
    """``(pack, collate)`` functions of the config: prefix trees (``share_prefixes``) or padded rows."""
    if getattr(cfg, "share_prefixes", False):
        return pack_prefix_trees, collate_prefix_tree
    return pack_micro_batches, collate


def _pad_groups(groups: list[list[Sample]], pad_id: int, device) -> list[list[Sample]]:
    """Pad to the largest number of micro-batches over ranks with zero-loss dummies
    (every rank must make the same number of DDP forward/backward calls)."""
    n = int(_reduce([float(len(groups))], device, "max")[0])
    return groups + [[dummy_sample(pad_id)] for _ in range(n - len(groups))]


# ----------------------------------------------------------------------------- the update


_METRIC_KEYS = ("pg_loss", "clipfrac_high", "clipfrac_low", "clipfrac_dual", "approx_kl", "ratio_mean", "entropy", "ref_kl")
_TYPE_KEYS = ("pg_loss", "clipfrac", "approx_kl", "entropy")


def train_update(
    policy: nn.Module,
    samples: Sequence[Sample],
    cfg,
    *,
    pad_id: int,
    ref: nn.Module | None = None,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Run ``epochs_per_iteration × mini_batches_per_epoch`` optimizer steps over ``samples``.

    ``policy``: a :class:`CompletionLogProbs`, possibly DDP/FSDP-wrapped;
    ``samples``: ALL of the iteration's samples, in the global order of
    :func:`prepare_samples` (each rank picks its rows per mini-batch). Returns
    metrics (rank-independent: every sum is all-reduced).
    """
    device = _device_of(policy)
    epochs, per_epoch = cfg.epochs_per_iteration, cfg.mini_batches_per_epoch
    total_steps = epochs * per_epoch
    max_response_len = getattr(cfg, "max_response_len", None) or max(cfg.max_answer_tokens, cfg.max_confidence_tokens)
    optimizer = make_optimizer(policy, cfg)
    optimizer.zero_grad(set_to_none=True)

    plan = plan_mini_batches(len(samples), epochs=epochs, mini_batches=per_epoch, seed=seed)
    local = [[[samples[i] for i in shard_rows(mb, samples, rank, world_size)] for mb in ep] for ep in plan]
    pack, collate_fn = packing(cfg)
    packed = [[pack(rows, cfg.micro_batch_tokens) for rows in ep] for ep in local]

    # π_old / π_ref: one no-grad pass before the first step, packed like epoch 0's micro-batches
    # (identical shapes → identical numerics → the first step's ratio is exactly 1).
    t0 = time.perf_counter()
    first = [g for mb in packed[0] for g in mb]
    seen = {s.index for g in first for s in g}
    later = [s for ep in local[1:] for rows in ep for s in rows if s.index not in seen]
    later = list({s.index: s for s in later}.values())
    groups = first + pack(later, cfg.micro_batch_tokens)
    old_cache = ref_cache = None
    sft = getattr(cfg, "objective", "grpo") == "sft"
    if cfg.old_logp_source == "recompute" and total_steps > 1 and not sft:
        old_cache = _logprob_cache(policy, _pad_groups(groups, pad_id, device), pad_id, device, collate_fn)
    if ref is not None and cfg.kl_coef > 0:
        ref_cache = _logprob_cache(ref, groups, pad_id, device, collate_fn)
    prepass_s = time.perf_counter() - t0

    steps: list[dict[str, float]] = []
    t_train = time.perf_counter()
    for epoch in range(epochs):
        for k in range(per_epoch):
            lr = set_lr(optimizer, cfg, epoch * per_epoch + k, total_steps)
            rows = local[epoch][k]
            g_tokens, g_seqs = _reduce([float(sum(s.masked_tokens for s in rows)), float(len(rows))], device)
            g_seqs = int(g_seqs)
            info: dict[str, float] = {"epoch": epoch, "mini_batch": k, "lr": lr, "global_tokens": g_tokens,
                                      "global_sequences": g_seqs}
            if g_tokens == 0:  # nothing to learn from on any rank: no forward, no step
                info.update(empty=1.0, stepped=0.0)
                steps.append(info)
                continue
            groups_k = _pad_groups(packed[epoch][k], pad_id, device)
            sums = {key: 0.0 for key in _METRIC_KEYS}
            sums.update({f"{t}/{key}": 0.0 for t in ("answer", "confidence") for key in _TYPE_KEYS})
            weights = {"tokens": 0.0, "answer/tokens": 0.0, "confidence/tokens": 0.0}
            loss_sum, local_ok, padded = 0.0, True, 0
            for j, group in enumerate(groups_k):
                mb = collate_fn(group, pad_id).to(device)
                padded += mb.padded_tokens if group[0].index >= 0 else 0
                if sft:
                    old = None
                elif cfg.old_logp_source == "rollout":
                    if mb.rollout_logprobs is None:
                        raise ValueError("old_logp_source='rollout' but some rows have null completion_logprobs")
                    old = mb.rollout_logprobs
                else:
                    old = _stack(old_cache, mb) if old_cache is not None else None
                ref_lp = _stack(ref_cache, mb) if ref_cache is not None else None
                last = j == len(groups_k) - 1
                sync = contextlib.nullcontext() if last or not hasattr(policy, "no_sync") else policy.no_sync()
                with sync:
                    loss, m, _ = micro_batch_loss(
                        policy, mb, cfg, old_logp=old, ref_logp=ref_lp, global_tokens=g_tokens,
                        global_sequences=g_seqs, max_response_len=max_response_len,
                    )
                    (loss * world_size).backward()
                lv = float(loss.detach())
                local_ok &= math.isfinite(lv)
                loss_sum += lv
                for key in _METRIC_KEYS:
                    if key in m:
                        sums[key] += m[key] * m["tokens"]
                weights["tokens"] += m["tokens"]
                for t in ("answer", "confidence"):
                    weights[f"{t}/tokens"] += m[f"{t}/tokens"]
                    for key in _TYPE_KEYS:
                        if f"{t}/{key}" in m:
                            sums[f"{t}/{key}"] += m[f"{t}/{key}"] * m[f"{t}/tokens"]
            grad_norm, stepped = optimizer_step(policy, optimizer, grad_clip=cfg.grad_clip, local_ok=local_ok)
            keys = list(sums) + list(weights) + ["loss", "padded_tokens"]
            red = dict(zip(keys, _reduce([*sums.values(), *weights.values(), loss_sum, float(padded)], device)))
            for key in _METRIC_KEYS:
                info[key] = red[key] / max(red["tokens"], 1.0)
            for t in ("answer", "confidence"):
                for key in _TYPE_KEYS:
                    info[f"{t}/{key}"] = red[f"{t}/{key}"] / max(red[f"{t}/tokens"], 1.0)
            info.update(loss=red["loss"], grad_norm=grad_norm, stepped=float(stepped), empty=0.0,
                        padded_tokens=red["padded_tokens"])
            steps.append(info)
    train_s = time.perf_counter() - t_train

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
        for key in ("loss", "grad_norm", *_METRIC_KEYS,
                    *(f"{t}/{k}" for t in ("answer", "confidence") for k in _TYPE_KEYS)):
            out[key] = sum(s[key] * wi for s, wi in zip(done, w)) / sum(w)
        out["grad_norm_last"] = done[-1]["grad_norm"]
        out["loss_first"] = done[0]["loss"]
        out["ratio_mean_first"] = done[0]["ratio_mean"]
    if ref_cache is None:
        out.pop("ref_kl", None)
    out["lr_last"] = steps[-1]["lr"] if steps else cfg.learning_rate
    out.update(type_stats(samples))
    out["history"] = steps
    return out


# ----------------------------------------------------------------------------- checkpoints


def check_finite_parameters(model: nn.Module) -> None:
    """Raise :class:`NonFiniteError` naming the first parameter holding NaN/inf."""
    for name, p in model.named_parameters():
        if not torch.isfinite(p.detach()).all():
            bad = int((~torch.isfinite(p.detach())).sum())
            raise NonFiniteError(f"refusing to write a checkpoint: parameter {name!r} has {bad} non-finite values")


def save_checkpoint(lm: nn.Module, tokenizer, store, rel: str, *, state_dict: dict | None = None,
                    extra: dict | None = None) -> str:
    """Write ``lm`` (safetensors, float32), its config and ``tokenizer`` to ``store`` at ``rel``.

    Refuses non-finite weights. The directory is written locally, then uploaded
    and sealed by :meth:`rlcr.storage.Store.put_dir` (``_COMPLETE`` written last),
    so readers never see a partial checkpoint. Returns the checkpoint's URI.
    """
    import json
    import tempfile

    if state_dict is None:
        check_finite_parameters(lm)
    else:
        for name, t in state_dict.items():
            if torch.is_floating_point(t) and not torch.isfinite(t).all():
                raise NonFiniteError(f"refusing to write a checkpoint: parameter {name!r} has non-finite values")
    with tempfile.TemporaryDirectory(prefix="rlcr-ckpt-") as d:
        lm.save_pretrained(d, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(d)
        if extra is not None:
            with open(f"{d}/rlcr_update.json", "w") as f:
                json.dump(extra, f, indent=2, sort_keys=True, default=str)
        return store.put_dir(d, rel)
