"""The ``lora`` section: train low-rank adapters instead of every weight (docs/design.md §11.1)."""

from __future__ import annotations

from pydantic import field_validator

from rlcr.config.fields import Section, changes

LLAMA_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear projection of a Llama/Qwen/SmolLM2 decoder layer (not the embedding or the LM head)."""


class LoRASection(Section):
    """Low-rank adapters (LoRA, with ``peft``): the update trains only the adapters of the named modules; the engines
    merge each new adapter into the base weights; checkpoints hold the adapter and its AdamW state."""

    enabled: bool = changes(False)
    """Train LoRA adapters instead of every weight. The base model stays frozen and is the KL reference (no second
    copy of the model); a checkpoint holds the adapter and names its base (``rlcr export`` writes it merged). LoRA
    usually needs a larger ``update.learning_rate`` than full fine-tuning (1e-5 … 1e-4)."""
    rank: int = changes(16, ge=1, le=1024)
    """Rank r of each adapter (B·A, with A: r × in, B: out × r)."""
    alpha: float = changes(32.0, gt=0.0)
    """LoRA alpha: the adapter's product is scaled by alpha / r."""
    dropout: float = changes(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapters' input in every trainer forward (the π_old pre-pass included, so above 0 the first
    step's ratio is no longer exactly 1); the KL reference and the engines never drop."""
    target_modules: list[str] = changes(list(LLAMA_LINEAR), min_length=1)
    """Names of the linear modules that get adapters (matched as the last part of a module's name, as ``peft``
    does); default: every projection of a Llama-style decoder layer."""

    @field_validator("target_modules")
    @classmethod
    def _plain_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or not all(c.isalnum() or c in "_." for c in name):
                raise ValueError(f"lora.target_modules: {name!r} is not a module name (letters, digits, _ and .)")
        return value
