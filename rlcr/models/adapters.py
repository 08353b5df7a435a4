"""LoRA adapters outside the trainer (docs/design.md §11.1): the adapter checkpoint, the merge, the engines' update.

An **adapter checkpoint** (a checkpoint of a ``lora.enabled`` run) is a sealed directory holding ``peft``'s
``adapter_model.safetensors`` and ``adapter_config.json``, the base's frame (``config.json``, generation config,
tokenizer), :data:`ADAPTER_FILE` (the base — its URI, or a built-in model's name — and its content id, checked
whenever the base is read: :func:`base_reference`) and, for a resume, the adapter's AdamW state.
Everything that reads a checkpoint as a model reads it **merged**: :func:`fetch_model` hands
out :func:`merged_dir`, a Hugging Face directory (the base's frame, ``model.safetensors`` with every targeted
weight replaced by :func:`merge_weight`), built once per node in the cache. So evaluation, comparison, the probe,
the engines and ``model.name`` take an adapter checkpoint like any other; ``rlcr export`` writes that directory.

The engines take an update as an :class:`AdapterUpdate` (the A and B of each targeted module, megabytes) and merge it
into their *base* weights with the same :func:`merge_weight` before loading the targeted tensors in place, so an
engine synced in memory and one created from the merged checkpoint hold the same bits (tests/test_lora.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rlcr.untrusted import InvalidInput, field, parse_json, printable, read_local

__all__ = ["ADAPTER_FILE", "ADAPTER_WEIGHTS", "ADAPTER_CONFIG", "AdapterInfo", "AdapterUpdate", "merge_weight",
           "is_adapter_dir", "read_adapter", "base_content_id", "base_reference", "base_dir", "merged_dir",
           "merge_into", "layer_tensors", "export_merged"]

ADAPTER_FILE = "rlcr_adapter.json"
"""rlcr's record in an adapter checkpoint: ``{"format": 1, "base": URI or built-in name, "base_content_id": …}``
(:func:`base_reference`)."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FORMAT = 1
MAX_NESTING = 8
"""Most adapter checkpoints stacked on one another (a LoRA run started from a LoRA run's checkpoint, …)."""
_BASE_ID = re.compile(r"(sha256:)?[0-9a-f]{32}")
_PEFT_KEY = re.compile(r"base_model\.model\.(?P<module>[A-Za-z0-9_.]+)\.lora_(?P<ab>[AB])\.weight")


def merge_weight(base, a, b, scale: float):
    """``base + scale · B·A`` in ``base``'s dtype, computed in float64 (the one merge every side uses: trainer-side
    exports, the engines' update and the merged checkpoint give the same bits)."""
    import torch

    delta = (b.to(torch.float64) @ a.to(torch.float64)) * float(scale)
    return (base.to(torch.float64) + delta).to(base.dtype)


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter checkpoint says: its base, the scale alpha / r and the (A, B) of each targeted weight."""

    base: str
    base_content_id: str | None
    scale: float
    factors: dict[str, tuple[Any, Any]]
    """HF weight name (``model.layers.0.self_attn.q_proj.weight``) → (A [r, in], B [out, r])."""


@dataclass(frozen=True)
class AdapterUpdate:
    """The trainer's update for the engines in a LoRA run: ``tensors`` holds ``<weight name>.lora_A`` and
    ``.lora_B`` for every targeted weight (packed by :func:`rlcr.models.weights.pack_weights`), ``scale`` is alpha /
    r."""

    tensors: dict[str, Any]
    scale: float

    def factors(self) -> dict[str, tuple[Any, Any]]:
        from rlcr.models.weights import to_tensor

        names = {k.rsplit(".lora_", 1)[0] for k in self.tensors}
        out = {}
        for name in sorted(names):
            if f"{name}.lora_A" not in self.tensors or f"{name}.lora_B" not in self.tensors:
                raise ValueError(f"adapter update: weight {name!r} lacks its lora_A or lora_B")
            out[name] = (to_tensor(name, self.tensors[f"{name}.lora_A"]),
                         to_tensor(name, self.tensors[f"{name}.lora_B"]))
        return out


def is_adapter_dir(local: str | Path) -> bool:
    return (Path(local) / ADAPTER_FILE).is_file()


def _scale(config: dict, source: str) -> float:
    if config.get("use_rslora") or config.get("rank_pattern") or config.get("alpha_pattern") or config.get("use_dora"):
        raise InvalidInput(f"{source}: rslora, DoRA and per-module ranks are not supported")
    r = field(config, "r", int, source, lo=1, hi=65536)
    return float(field(config, "lora_alpha", (int, float), source, lo=0.0, hi=1e9)) / r


def read_adapter(local: str | Path) -> AdapterInfo:
    """The adapter checkpoint at ``local``, checked: its record, the scale and each weight's A and B (shapes
    ``[r, in]`` and ``[out, r]``). Anything else is an :class:`InvalidInput` naming the file."""
    from safetensors.torch import load_file

    local = Path(local)
    rec_src = f"{local}/{ADAPTER_FILE}"
    record = parse_json(read_local(local / ADAPTER_FILE, 1 << 20, rec_src), rec_src)
    if field(record, "format", int, rec_src) != ADAPTER_FORMAT:
        raise InvalidInput(f"{printable(rec_src)}: format {record.get('format')!r}, expected {ADAPTER_FORMAT}")
    base = field(record, "base", str, rec_src)
    content_id = field(record, "base_content_id", (str, type(None)), rec_src, default=None)
    if content_id is not None and not _BASE_ID.fullmatch(content_id):
        raise InvalidInput(f"{printable(rec_src)}: base_content_id is not a seal's content id or sha256:<digest>")
    cfg_src = f"{local}/{ADAPTER_CONFIG}"
    scale = _scale(parse_json(read_local(local / ADAPTER_CONFIG, 1 << 20, cfg_src), cfg_src), cfg_src)
    tensors = load_file(str(local / ADAPTER_WEIGHTS))
    pairs: dict[str, dict[str, Any]] = {}
    for key, t in tensors.items():
        m = _PEFT_KEY.fullmatch(key)
        if m is None:
            raise InvalidInput(f"{printable(str(local / ADAPTER_WEIGHTS))}: unexpected tensor {printable(key, 120)!r}")
        pairs.setdefault(f"{m['module']}.weight", {})[m["ab"]] = t
    factors = {}
    for name, ab in sorted(pairs.items()):
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None or a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise InvalidInput(f"{printable(str(local / ADAPTER_WEIGHTS))}: {printable(name, 120)}: lora_A and "
                               f"lora_B missing or of mismatched shapes")
        factors[name] = (a, b)
    return AdapterInfo(base=base, base_content_id=content_id, scale=scale, factors=factors)


def merge_into(base_dir: str | Path, factors: Mapping[str, tuple[Any, Any]], scale: float) -> dict[str, Any]:
    """The merged tensor of every weight in ``factors``, its base read from ``base_dir``'s safetensors (only
    those tensors are read). A weight the base lacks, or of another shape, raises ValueError naming it."""
    from safetensors import safe_open

    where: dict[str, str] = {}
    for path in sorted(Path(base_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            where.update({k: str(path) for k in f.keys()})
    out = {}
    by_file: dict[str, list[str]] = {}
    for name in factors:
        if name not in where:
            raise ValueError(f"adapter: the base model has no weight {printable(name, 120)!r}")
        by_file.setdefault(where[name], []).append(name)
    for path, names in by_file.items():
        with safe_open(path, "pt") as f:
            for name in names:
                base = f.get_tensor(name)
                a, b = factors[name]
                if (b.shape[0], a.shape[1]) != tuple(base.shape):
                    raise ValueError(f"adapter: weight {name!r}: B·A is {(b.shape[0], a.shape[1])}, the base "
                                     f"has {tuple(base.shape)}")
                out[name] = merge_weight(base, a, b, scale)
    return out


def base_content_id(local: str | Path) -> str:
    """The content id an adapter checkpoint records for its base at ``local``: the seal's, when the base is sealed
    (a store's ``models/`` copy, a checkpoint); else ``sha256:`` and the digest of its weight files
    (:func:`weights_digest`: a built-in model, built on each node, has no seal)."""
    from rlcr.storage import COMPLETE_MARKER, checkpoint_content_id

    if (Path(local) / COMPLETE_MARKER).exists():
        return checkpoint_content_id(local)
    return "sha256:" + weights_digest(local)


_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def weights_digest(root: str | Path) -> str:
    """A digest of a model directory's weight files alone (each top-level ``*.safetensors``/``*.bin`` file's name
    and SHA-256; not its config, tokenizer or training state): what identifies a LoRA run's base that is not
    sealed in a store (a built-in model, rebuilt on each node), whose frame the adapter checkpoint carries
    itself. A directory without weight files raises ValueError."""
    names = sorted(p.name for p in Path(root).iterdir() if p.name.endswith(_WEIGHT_SUFFIXES) and p.is_file())
    if not names:
        raise ValueError(f"{printable(str(root), 200)}: holds no weights (*.safetensors or *.bin)")
    total = hashlib.sha256()
    for name in names:
        h = hashlib.sha256()
        with open(Path(root) / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        total.update(f"{name}\0{h.hexdigest()}\n".encode())
    return total.hexdigest()[:32]


def base_reference(base_uri: str, local: str | Path) -> tuple[str, str]:
    """What a new LoRA run records for its base ``base_uri`` (fetched to ``local``): a reference every node can
    resolve — the built-in model's name when ``local`` is this node's build of it (its path is node-local), else
    the URI — and :func:`base_content_id`, which every reader checks."""
    from rlcr.models.smollm2 import builtin_name

    return builtin_name(local) or base_uri, base_content_id(local)


def _fetch_base(info: AdapterInfo, local: Path, endpoint_url: str | None, depth: int) -> Path:
    """The adapter checkpoint ``local``'s base, fetched (a built-in name: built or found on this node) and checked
    against the content id recorded for it; a base that is not the one the adapter was trained on is refused."""
    from rlcr.models.smollm2 import BUILTIN_MODELS, resolve_model
    from rlcr.storage import fetch_checkpoint

    shown = f"{printable(str(local))}: its base {printable(info.base, 200)}"
    if info.base_content_id is None:
        raise ValueError(f"{shown} is recorded without a content id, so the base it was trained on cannot be "
                         f"checked; refusing to merge it into whatever is there now")
    try:
        if info.base in BUILTIN_MODELS:
            raw = Path(resolve_model(info.base))
        else:
            raw = fetch_checkpoint(info.base, endpoint_url=endpoint_url)
        actual = base_content_id(raw)
    except Exception as e:  # noqa: BLE001 - one line naming the checkpoint and its base
        raise ValueError(f"{shown} cannot be read ({printable(e, 200)})") from None
    if actual != info.base_content_id:
        raise ValueError(f"{shown} has content id {printable(actual, 80)}, the adapter was trained on "
                         f"{printable(info.base_content_id, 80)}; refusing to merge it into another base")
    return merged_dir(raw, endpoint_url=endpoint_url, _depth=depth + 1)


def base_dir(local: str | Path, *, endpoint_url: str | None = None) -> Path:
    """The (merged, if itself an adapter checkpoint) local directory of an adapter checkpoint's base."""
    return _fetch_base(read_adapter(local), Path(local), endpoint_url, 0)


def fetch_model(uri: str, *, endpoint_url: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """A checkpoint URI → a local Hugging Face model directory (:func:`rlcr.storage.fetch_checkpoint`), an adapter
    checkpoint merged into its base (:func:`merged_dir`): what every reader of a checkpoint as a model calls."""
    from rlcr.storage import fetch_checkpoint

    return merged_dir(fetch_checkpoint(uri, endpoint_url=endpoint_url, cache_dir=cache_dir), endpoint_url=endpoint_url)


def merged_dir(local: str | Path, *, endpoint_url: str | None = None, cache_dir: str | Path | None = None,
               _depth: int = 0) -> Path:
    """``local`` itself for a plain checkpoint; for an adapter checkpoint, the Hugging Face directory of its base
    with the adapter merged (its frame: the base's; built once in ``$RLCR_CACHE/merged``, atomically)."""
    from rlcr.storage import checkpoint_content_id, default_cache_dir

    local = Path(local)
    if not is_adapter_dir(local):
        return local
    if _depth >= MAX_NESTING:
        raise ValueError(f"{printable(str(local))}: adapter checkpoints nested more than {MAX_NESTING} deep")
    info = read_adapter(local)
    base = _fetch_base(info, local, endpoint_url, _depth)
    key = hashlib.sha256(f"{checkpoint_content_id(local)}\0{base.resolve()}\0{checkpoint_content_id(base)}"
                         .encode()).hexdigest()[:32]
    cache = Path(cache_dir) if cache_dir else default_cache_dir() / "merged"
    dest = cache / key
    if (dest / "model.safetensors").is_file():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache))
    try:
        _write_merged(tmp, base, merge_into(base, info.factors, info.scale))
        try:
            os.rename(tmp, dest)
        except OSError:  # another process built it meanwhile
            if not (dest / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _write_merged(dest: Path, base: Path, merged: Mapping[str, Any]) -> None:
    """The base's frame and all its weights, the merged ones replaced, as one ``model.safetensors``."""
    from safetensors.torch import save_file

    from rlcr.models.weights import read_checkpoint_weights, read_frame

    for name, data in read_frame(base).items():
        if name not in (ADAPTER_FILE, ADAPTER_CONFIG, "training_state.pt"):
            (dest / name).write_bytes(data)
    weights = read_checkpoint_weights(base)
    weights.update(merged)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dest / "model.safetensors"),
              metadata={"format": "pt"})


def export_merged(local: str | Path, out: str | Path, *, endpoint_url: str | None = None) -> Path:
    """Write the checkpoint at ``local`` (an adapter checkpoint merged) as a plain Hugging Face directory ``out``
    (config, tokenizer, ``model.safetensors``; no rlcr files). ``out`` must not exist or be empty."""
    from rlcr.models.weights import NOT_FRAME_FILES

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{printable(str(out))}: exists and is not an empty directory")
    src = merged_dir(local, endpoint_url=endpoint_url)
    out.mkdir(parents=True, exist_ok=True)
    skip = NOT_FRAME_FILES | {ADAPTER_FILE, ADAPTER_CONFIG, ADAPTER_WEIGHTS, "training_state.pt"}
    for p in sorted(src.iterdir()):
        if p.is_file() and p.name not in skip and not p.name.startswith("."):
            shutil.copyfile(p, out / p.name)
    return out


def layer_tensors(base_dir: str | Path, factors: Mapping[str, tuple[Any, Any]], scale: float,
                  groups: list[list[str]]) -> dict[str, Any]:
    """What an engine loads in place for an adapter: every tensor of each layer it touches — the targeted weights
    merged (:func:`merge_into`), the rest of those modules (biases) and of their fused partners (``groups``, e.g.
    ``k_proj`` and ``v_proj`` with ``q_proj``) as the base has them."""
    from safetensors import safe_open

    modules = set()
    for name in factors:
        module = name.removesuffix(".weight")
        parent, _, leaf = module.rpartition(".")
        modules.add(module)
        for group in groups:
            if leaf in group:
                modules.update(f"{parent}.{g}" if parent else g for g in group)
    out: dict[str, Any] = {}
    for path in sorted(Path(base_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                if key.rpartition(".")[0] in modules and key not in factors:
                    out[key] = f.get_tensor(key)
    out.update(merge_into(base_dir, factors, scale))
    return out
