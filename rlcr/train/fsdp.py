"""FSDP2 for the update (docs/design.md §11): the policy and the frozen reference sharded with
``torch.distributed.fsdp.fully_shard`` over the Ray Train workers' process group (gloo on CPU, NCCL on GPU).

:func:`shard` wraps each decoder layer of a Hugging Face causal LM, then the root (the
:class:`~rlcr.train.logprobs.CompletionLogProbs` around it, which holds the embedding, the final norm and the
output head): each worker keeps 1/N of every parameter, its gradient and AdamW's moments (DTensors sharded on
dim 0), and a layer's full weights exist only while that layer runs (all-gathered before its forward and its
backward, freed after). The update itself (:mod:`rlcr.train.update`) is the DDP one: the same objective, masks,
micro-batches (every micro-batch's gradient is reduce-scattered into the sharded gradient layer by layer as it is
made, so the model's full gradient is never held; :func:`gradient_sync`), ``torch.nn.utils.clip_grad_norm_`` over
the DTensor gradients (the global norm) and AdamW on the shards.

``update.fsdp_param_dtype: bfloat16`` adds ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the
layers are gathered and run in bf16, the gradients reduced in fp32 into fp32 shards; AdamW keeps fp32 master
weights. :func:`local_state_bytes` counts what a worker holds (the benchmark's memory figure).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch import nn

__all__ = ["decoder_layers", "shard", "is_sharded", "gradient_sync", "local_state_bytes", "mixed_precision",
           "optimizer_state_by_name", "optimizer_state_by_index"]

LAYER_PATHS = ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers", "transformer.blocks")
"""Where Hugging Face causal LMs keep their decoder layers (Llama, Qwen2, Mistral, SmolLM2: ``model.layers``)."""


def decoder_layers(lm: nn.Module) -> nn.ModuleList:
    """The decoder layers of a Hugging Face causal LM (a ``ModuleList`` at one of :data:`LAYER_PATHS`)."""
    for path in LAYER_PATHS:
        obj: Any = lm
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList) and len(obj) > 0:
            return obj
    raise ValueError(f"update.fsdp: no decoder layers found in {type(lm).__name__} (looked for a non-empty "
                     f"ModuleList at {', '.join(LAYER_PATHS)}); this model cannot be sharded per layer")


def mixed_precision(param_dtype: str):
    """The ``MixedPrecisionPolicy`` of ``update.fsdp_param_dtype``: None for float32 (fp32 throughout), else
    bf16 parameters in forward/backward with fp32 gradient reduction."""
    if param_dtype == "float32":
        return None
    if param_dtype != "bfloat16":
        raise ValueError(f"update.fsdp_param_dtype: unknown dtype {param_dtype!r}")
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard(module: nn.Module, lm: nn.Module, *, param_dtype: str = "float32") -> nn.Module:
    """``fully_shard`` each decoder layer of ``lm`` and then ``module`` (the root that holds ``lm``) over the default
    process group, on the device ``lm``'s parameters are on. Returns ``module`` (sharded in place: its parameters are
    now DTensors). A frozen module (the KL reference) is sharded the same way and only ever runs forward."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(lm.parameters()).device
    if device.type == "cuda":  # the mesh's device is the current one: this rank's GPU
        torch.cuda.set_device(device)
    world = dist.get_world_size() if dist.is_initialized() else 1
    # CompletionLogProbs returns a view (its log-probs reshaped); FSDP2 warns that an in-place op on it would skip
    # the backward's all-gather. The update only reads it (rlcr.train.update._scatter copies it out of place).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    mesh = init_device_mesh(device.type, (world,))
    kwargs: dict[str, Any] = {"mesh": mesh}
    policy = mixed_precision(param_dtype)
    if policy is not None:
        kwargs["mp_policy"] = policy
    for layer in decoder_layers(lm):
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)
    return module


def is_sharded(module: nn.Module | None) -> bool:
    """Whether ``module`` is an FSDP2 root (its forward is a collective: every rank must call it equally often)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def gradient_sync(module: nn.Module, last: bool):
    """The context of one micro-batch's backward. DDP: ``no_sync()`` but for the last micro-batch (the gradient is
    all-reduced once, accumulated locally before). FSDP2 (no ``no_sync``): every micro-batch's gradient is
    reduce-scattered as it is made and accumulated in the sharded gradient (its default) — skipping the sync would
    accumulate full, unsharded gradients on every rank, the memory FSDP exists to save; the sum is the same either
    way up to float order."""
    if last or is_sharded(module) or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def local_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds of the parameters, their gradients and the optimizer's state (local shards of DTensors;
    a tied parameter once): ``{"params", "grads", "optimizer", "total"}``."""
    params = {id(p): p for p in model.parameters()}.values()
    out = {"params": sum(_local(p).nbytes for p in params),
           "grads": sum(_local(p.grad).nbytes for p in params if p.grad is not None), "optimizer": 0}
    if optimizer is not None:
        for state in optimizer.state.values():
            out["optimizer"] += sum(_local(t).nbytes for t in state.values() if isinstance(t, torch.Tensor))
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def optimizer_state_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A ``torch.optim.Optimizer.state_dict()`` (DDP's training state: parameters by position) keyed by parameter
    name instead, as ``torch.distributed.checkpoint.state_dict`` writes and reads it (FSDP's); ``names``: the
    trainable parameters' names in the optimizer's order."""
    groups = state["param_groups"]
    count = sum(len(g["params"]) for g in groups)
    if count != len(names):
        raise ValueError(f"the saved AdamW state holds {count} parameters, the model {len(names)} trainable ones")
    return {"state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups]}


def optimizer_state_by_index(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """:func:`optimizer_state_by_name` undone: parameters by position, as ``Optimizer.load_state_dict`` takes them."""
    index = {n: i for i, n in enumerate(names)}
    groups = state["param_groups"]
    missing = [n for g in groups for n in g["params"] if n not in index]
    if missing or sum(len(g["params"]) for g in groups) != len(names):
        raise ValueError(f"the saved AdamW state does not match the model's trainable parameters "
                         f"({len(missing)} unknown names, e.g. {missing[:1]})")
    return {"state": {index[n]: v for n, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in groups]}
