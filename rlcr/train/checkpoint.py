"""Writing a policy checkpoint to the artifact store (docs/design.md §1: checkpoint → storage).

The update (:mod:`rlcr.train.update`) only changes weights; the trainer's worker
(:mod:`rlcr.train.worker`) writes them here, sealed, and never when they are not finite.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from rlcr.models.weights import TRAINING_STATE_FILE

__all__ = ["NonFiniteError", "check_finite_parameters", "check_finite_weights", "save_checkpoint",
           "write_checkpoint_files", "save_adapter_checkpoint", "TRAINING_STATE_FILE"]



class NonFiniteError(RuntimeError):
    """Weights are not finite: no checkpoint may be written from them."""


def check_finite_parameters(model: nn.Module) -> None:
    """Raise :class:`NonFiniteError` naming the first parameter holding NaN/inf."""
    for name, p in model.named_parameters():
        if not torch.isfinite(p.detach()).all():
            bad = int((~torch.isfinite(p.detach())).sum())
            raise NonFiniteError(f"refusing to write a checkpoint: parameter {name!r} has {bad} non-finite values")


def save_checkpoint(lm: nn.Module, tokenizer, store, rel: str, *, state_dict: dict | None = None,
                    extra: dict | None = None, training_state: dict | None = None) -> str:
    """Write ``lm`` (safetensors, float32), its config and ``tokenizer`` to ``store`` at ``rel``
    (with ``training_state``: also :data:`TRAINING_STATE_FILE`, sealed with the weights).

    Refuses non-finite weights. The files are written into :meth:`rlcr.storage.Store.writing_dir` (a local
    store: the checkpoint's own temp sibling, renamed into place, so nothing is copied; S3: a temporary directory,
    uploaded) and sealed (``_COMPLETE`` written last), so readers never see a partial checkpoint. Returns the
    checkpoint's URI.
    """
    check_finite_weights(lm, state_dict)
    with store.writing_dir(rel) as d:
        write_checkpoint_files(d, lm, tokenizer, state_dict=state_dict, extra=extra, training_state=training_state)
    return store.url(rel)


def check_finite_weights(lm: nn.Module, state_dict: dict | None = None) -> None:
    """Raise :class:`NonFiniteError` naming the first weight of ``state_dict`` (None: ``lm``'s parameters) holding
    NaN/inf."""
    if state_dict is None:
        check_finite_parameters(lm)
        return
    for name, t in state_dict.items():
        if torch.is_floating_point(t) and not torch.isfinite(t).all():
            raise NonFiniteError(f"refusing to write a checkpoint: parameter {name!r} has non-finite values")


def write_checkpoint_files(d, lm: nn.Module, tokenizer, *, state_dict: dict | None = None, extra: dict | None = None,
                           training_state: dict | None = None) -> None:
    """A checkpoint's files into the local folder ``d``: the weights (``state_dict``, else ``lm``'s) as a Hugging
    Face model, the tokenizer, the update's record and the training state (unsealed: the caller seals)."""
    lm.save_pretrained(d, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(d)
    _write_extras(d, extra, training_state)


def _write_extras(d: str, extra: dict | None, training_state: dict | None) -> None:
    """The update's record (``rlcr_update.json``) and the training state, where given, into checkpoint folder ``d``."""
    if extra is not None:
        with open(f"{d}/rlcr_update.json", "w") as f:
            json.dump(extra, f, indent=2, sort_keys=True, default=str)
    if training_state is not None:
        torch.save(training_state, f"{d}/{TRAINING_STATE_FILE}")


def save_adapter_checkpoint(peft_model, store, rel: str, *, frame: dict[str, bytes], base_uri: str,
                            base_content_id: str | None, extra: dict | None = None,
                            training_state: dict | None = None) -> str:
    """Write a LoRA run's checkpoint (:mod:`rlcr.models.adapters`): ``peft``'s adapter files, the base's ``frame``
    (config, tokenizer: the files a model directory is recognised and served by), the record naming the base
    (:data:`rlcr.models.adapters.ADAPTER_FILE`) and, with ``training_state``, the adapters' AdamW state; sealed like
    :func:`save_checkpoint`. Refuses non-finite adapters. Returns the checkpoint's URI."""
    import os

    from rlcr.models.adapters import ADAPTER_FILE, ADAPTER_FORMAT

    for name, p in peft_model.named_parameters():
        if p.requires_grad and not torch.isfinite(p.detach()).all():
            raise NonFiniteError(f"refusing to write a checkpoint: adapter {name!r} has non-finite values")
    with store.writing_dir(rel) as d:
        for name, data in frame.items():
            with open(f"{d}/{name}", "wb") as f:
                f.write(data)
        peft_model.save_pretrained(d, safe_serialization=True)
        if os.path.exists(f"{d}/README.md") and "README.md" not in frame:
            os.remove(f"{d}/README.md")  # peft's model card: not ours to publish
        with open(f"{d}/{ADAPTER_FILE}", "w") as f:
            json.dump({"format": ADAPTER_FORMAT, "base": base_uri, "base_content_id": base_content_id}, f, indent=2)
        _write_extras(d, extra, training_state)
    return store.url(rel)
