"""LoRA on the trainer's side (``lora.enabled``, docs/design.md §11.1): ``peft`` wraps the policy, only the adapters
train, the frozen base is the KL reference, and the engines get the adapters
(:class:`rlcr.models.adapters.AdapterUpdate`).

:func:`wrap_lora` injects the adapters into the causal LM itself (``get_peft_model``; the model the update sees is
the same Hugging Face module, its targeted linears now LoRA layers, so :class:`rlcr.train.logprobs.CompletionLogProbs`
and DDP wrap it as before); ``make_optimizer`` then finds only the adapters trainable. :class:`AdapterOff` runs the
policy with the adapters disabled: the base model's log-probs, the π_ref of β > 0, without a second copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlcr.models.adapters import ADAPTER_WEIGHTS, AdapterUpdate

__all__ = ["wrap_lora", "AdapterOff", "adapter_update", "load_adapter_state", "lora_layers"]


def wrap_lora(lm: nn.Module, cfg):
    """``lm`` with LoRA adapters of ``cfg.lora`` injected (a ``peft.PeftModel`` around it; ``lm`` itself now holds
    the LoRA layers). A is initialised from torch's RNG (seed it first), B with zeros: the policy starts as the base."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                        target_modules=list(cfg.lora.target_modules), bias="none", task_type="CAUSAL_LM")
    try:
        peft_model = get_peft_model(lm, config)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"lora.target_modules: {str(e).splitlines()[0][:300]}") from None
    if cfg.lora.dropout > 0:  # the LM is in eval mode (no other dropout); only the adapters' dropout is on
        for name, module in peft_model.named_modules():
            if ".lora_dropout." in f".{name}." and isinstance(module, nn.Dropout):
                module.train()
    return peft_model


def lora_layers(model: nn.Module) -> dict[str, Any]:
    """The LoRA layers of a wrapped LM by the HF name of the weight each replaces (``…q_proj.weight``)."""
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            out[f"{name.removeprefix(prefix)}.weight"] = module
    return out


def adapter_update(peft_model) -> AdapterUpdate:
    """The adapters, checked finite, packed for the engines (:class:`~rlcr.models.adapters.AdapterUpdate`)."""
    from rlcr.models.weights import pack_weights
    from rlcr.train.checkpoint import NonFiniteError

    tensors, scales = {}, set()
    for name, layer in lora_layers(peft_model).items():
        a, b = layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach()
        for t, part in ((a, "lora_A"), (b, "lora_B")):
            if not torch.isfinite(t).all():
                raise NonFiniteError(f"adapter {name!r} {part} has non-finite values; the engines keep the "
                                     f"previous weights")
        tensors[f"{name}.lora_A"], tensors[f"{name}.lora_B"] = a.float().cpu(), b.float().cpu()
        scales.add(float(layer.scaling["default"]))
    if len(scales) != 1:
        raise ValueError(f"adapters with several scales {sorted(scales)}: one alpha / r expected")
    return AdapterUpdate(tensors=pack_weights(tensors), scale=scales.pop())


def load_adapter_state(peft_model, local_dir: str | Path) -> None:
    """Load an adapter checkpoint's A and B into the wrapped model (a resume); every adapter must be there."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(local_dir) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"{local_dir}: no {ADAPTER_WEIGHTS} (not an adapter checkpoint)")
    state = load_file(str(path))
    result = set_peft_model_state_dict(peft_model, state)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"{path}: does not match lora's settings (missing {missing[:3]}, unexpected "
                         f"{list(result.unexpected_keys)[:3]})")


class AdapterOff(nn.Module):
    """The policy's forward with its adapters disabled: the base model's log-probs (π_ref), no second copy.
    Holds the modules without registering them (never trained, wrapped or saved through this)."""

    def __init__(self, policy: nn.Module, peft_model):
        super().__init__()
        self.__dict__["_policy"], self.__dict__["_peft"] = policy, peft_model

    def forward(self, *args, **kwargs):
        with self._peft.disable_adapter():
            return self._policy(*args, **kwargs)
