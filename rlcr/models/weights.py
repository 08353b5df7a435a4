"""Weight transfer between the trainer and the rollout engines (docs/design.md §12): checkpoint files, the
packed in-memory form, validation and the in-place load into a running vLLM engine.

Both sides import this module and nothing heavier: the trainer's workers pack their full state dict
(:func:`pack_weights`) into Ray's object store in the engines' dtype (:func:`resolve_dtype`);
:class:`rlcr.rollout.engine.RolloutEngine` checks the weights against its model (:func:`check_weights`,
:class:`WeightSpec` read from the checkpoint's safetensors headers by :func:`checkpoint_weight_spec`) and copies
them in place (:func:`load_weights_in_place`: vLLM's layerwise reload, then the tied LM head re-packed), or
writes them as a checkpoint next to the engine's frame (:func:`read_frame`, :func:`write_checkpoint`) and
re-creates the engine from it. vLLM is imported only inside the functions that run in an engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = [
    "has_gpu", "resolve_dtype", "WeightSpec", "checkpoint_weight_spec", "read_checkpoint_weights", "read_frame",
    "frame_id", "SameAs", "Bfloat16Bits", "pack_weights", "check_weights", "load_weights_in_place",
    "write_checkpoint", "fused_groups", "to_tensor", "layer_key", "WeightBuckets", "BucketWriter",
    "TRAINING_STATE_FILE", "OPTIMIZER_DIR", "is_training_state"]


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch always importable here
        return False


def resolve_dtype(dtype: str) -> str:
    """``auto`` → bfloat16 on GPU, float32 on CPU (matching the trainer's numerics there)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if has_gpu() else "float32"



WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".pt", ".pth")
"""Files of a checkpoint directory that hold weights (or trainer state), not the engine's frame."""
TRAINING_STATE_FILE = "training_state.pt"
"""In a checkpoint, next to the weights: AdamW's state (unless sharded), the LR schedule's position and the RNG —
what a resume needs to continue exactly (rlcr.train.checkpoint writes it)."""
OPTIMIZER_DIR = "optimizer"
"""In a checkpoint of a sharded (FSDP) update: AdamW's state, one file per rank (rlcr.train.sharded_state)."""


def is_training_state(name: str) -> bool:
    """Whether the file ``name`` of a checkpoint (relative, ``/``-separated) is training state: what a resume reads
    and a new run started from the checkpoint leaves behind (it starts a fresh AdamW)."""
    return name == TRAINING_STATE_FILE or name.startswith(OPTIMIZER_DIR + "/")


NOT_FRAME_FILES = {"_COMPLETE", "rlcr_update.json"}
"""rlcr's own files in a checkpoint directory (seal, update summary): they change every iteration; vLLM never
reads them."""
TIED_HEAD = "lm_head.weight"
TIED_EMBEDDING = "model.embed_tokens.weight"


@dataclass(frozen=True)
class WeightSpec:
    """The parameters an engine takes: HF name → shape, and whether the LM head is tied to the embedding
    (then ``lm_head.weight`` may be left out of an update; given, it must equal the embedding)."""

    shapes: Mapping[str, tuple[int, ...]]
    tied_head: bool


def _is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES)


def checkpoint_weight_spec(model_dir: str | Path) -> WeightSpec:
    """Names and shapes of a checkpoint's tensors, read from its safetensors headers (no tensor is loaded)."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    if not shapes:
        raise ValueError(f"{model_dir}: no safetensors weights (the engine's weight sync needs them)")
    from transformers import AutoConfig

    # the model class's default applies where config.json does not say
    tied = bool(getattr(AutoConfig.from_pretrained(model_dir), "tie_word_embeddings", False))
    return WeightSpec(shapes=shapes, tied_head=tied)


def read_checkpoint_weights(model_dir: str | Path) -> dict[str, Any]:
    """All tensors of a checkpoint's safetensors files, by name."""
    from safetensors.torch import load_file

    weights: dict[str, Any] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        weights.update(load_file(str(path)))
    return weights


def read_frame(model_dir: str | Path) -> dict[str, bytes]:
    """Everything of a checkpoint directory but its weights and rlcr's own files: config, generation config,
    tokenizer, chat template (what, besides the weights, the engine is created from)."""
    return {p.name: p.read_bytes() for p in sorted(Path(model_dir).iterdir())
            if p.is_file() and not _is_weight_file(p.name) and p.name not in NOT_FRAME_FILES
            and not p.name.startswith(".")}


def frame_id(frame: Mapping[str, bytes]) -> str:
    """Digest of a frame; JSON files compared by content, without the ``transformers_version`` that wrote them."""
    h = hashlib.sha256()
    for name in sorted(frame):
        data = frame[name]
        if name.endswith(".json"):
            try:
                doc = json.loads(data)
                if isinstance(doc, dict):
                    doc.pop("transformers_version", None)
                data = json.dumps(doc, sort_keys=True).encode()
            except ValueError:
                pass
        h.update(f"{name}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class SameAs:
    """In a packed state dict: this name's tensor is the tensor named ``name`` (tied weights, sent once)."""

    name: str


@dataclass(frozen=True)
class Bfloat16Bits:
    """In a packed state dict: a bfloat16 tensor's bits as an int16 numpy array (numpy has no bfloat16), so that
    it too is read zero-copy from the object store."""

    bits: Any


def pack_weights(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A state dict as ``ray.put`` moves it fastest: CPU tensors as numpy arrays (the engine reads them zero-copy
    from the object store's shared memory; torch tensors are copied in and out of a pickle), bfloat16 ones as
    :class:`Bfloat16Bits`; other dtypes numpy lacks stay torch tensors. A tensor that is an earlier one again (a
    tied ``lm_head.weight``, which ``state_dict()`` lists besides the embedding) is sent as :class:`SameAs` that
    one."""
    import torch

    packed, first_name = {}, {}
    for name, t in state_dict.items():
        if isinstance(t, torch.Tensor):
            t = t.detach()
            identity = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
            if t.numel() and identity in first_name:
                packed[name] = SameAs(first_name[identity])
                continue
            first_name[identity] = name
            t = t.cpu().contiguous()
            if t.dtype == torch.bfloat16:
                t = Bfloat16Bits(t.view(torch.int16).numpy())
            else:
                with contextlib.suppress(TypeError):  # a dtype numpy lacks: stays a tensor
                    t = t.numpy()
        packed[name] = t
    return packed


def layer_key(name: str) -> str:
    """The decoder layer a weight belongs to: its name up to the first numeric part (``model.layers.3`` of
    ``model.layers.3.self_attn.q_proj.weight``); ``""`` for weights outside the layers (embedding, final norm).
    A weight bucket ends only where this changes, so a layer's fused groups (q/k/v, gate/up) travel together."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ""


@dataclass
class WeightBuckets:
    """The trainer's new weights in Ray's object store, a bucket per ref (:class:`BucketWriter`): each a
    :func:`pack_weights` dict of whole decoder layers, so that the worker that gathers them (rank 0) never holds
    more than one bucket besides its own copy (under FSDP: its shard). The engines resolve them all (zero-copy
    from shared memory) and load them as one update."""

    refs: list
    tensors: int = 0
    bytes: int = 0
    largest: int = 0  # bytes of the largest bucket

    def resolve(self) -> dict[str, Any]:
        """The packed state dict of all buckets (:func:`pack_weights`' form; numpy arrays read zero-copy)."""
        import ray

        merged: dict[str, Any] = {}
        for bucket in ray.get(list(self.refs)):
            if not isinstance(bucket, Mapping):
                raise ValueError(f"weights: a bucket is a {type(bucket).__name__}, expected a dict of name → tensor")
            repeated = sorted(set(merged) & set(bucket))
            if repeated:
                raise ValueError(f"weights: parameter(s) {repeated[:5]} in two buckets")
            merged.update(bucket)
        return merged


class BucketWriter:
    """Collects ``(name, tensor or SameAs)`` one at a time into buckets of at least ``limit_bytes`` (a bucket ends
    between decoder layers only: :func:`layer_key`), each put into Ray's object store as it closes (in ``dtype``,
    packed by :func:`pack_weights`). :meth:`close` returns the :class:`WeightBuckets`. A bucket holds at most
    ``limit_bytes`` plus one layer."""

    def __init__(self, limit_bytes: int, dtype=None):
        self.limit, self.dtype = int(limit_bytes), dtype
        self._bucket: dict[str, Any] = {}
        self._size = 0
        self._layer: str | None = None
        self.out = WeightBuckets(refs=[])

    def add(self, name: str, tensor) -> None:
        import torch

        key = layer_key(name)
        if self._bucket and key != self._layer and self._size >= self.limit:
            self._flush()
        self._layer = key
        if isinstance(tensor, SameAs):  # a tied weight: its twin's name (in this bucket or an earlier one)
            self._bucket[name] = tensor
            return
        t = tensor.detach()
        if self.dtype is not None and torch.is_floating_point(t) and t.dtype != self.dtype:
            t = t.to(self.dtype)
        self._bucket[name] = t
        self._size += t.numel() * t.element_size()

    def _flush(self) -> None:
        import ray

        if not self._bucket:
            return
        self.out.refs.append(ray.put(pack_weights(self._bucket)))
        self.out.tensors += len(self._bucket)
        self.out.bytes += self._size
        self.out.largest = max(self.out.largest, self._size)
        self._bucket, self._size = {}, 0

    def close(self) -> WeightBuckets:
        self._flush()
        return self.out


def to_tensor(name: str, value):
    """A weight as a torch tensor (numpy arrays are wrapped, not copied)."""
    import warnings

    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach()
    with warnings.catch_warnings():
        # arrays from the object store are read-only; the loader only reads them
        warnings.simplefilter("ignore", UserWarning)
        if isinstance(value, np.ndarray):
            return torch.from_numpy(value)
        if isinstance(value, Bfloat16Bits) and isinstance(value.bits, np.ndarray) and value.bits.dtype == np.int16:
            return torch.from_numpy(value.bits).view(torch.bfloat16)
    raise ValueError(f"weight {name!r}: expected a torch tensor or numpy array, got {type(value).__name__}")


def check_weights(weights: Mapping[str, Any], spec: WeightSpec, *, partial: bool = False) -> dict[str, Any]:
    """The weights to load, as tensors, after checking them against ``spec``: every name known, none missing (unless
    ``partial``: a LoRA update's layers), shapes equal, floating point. A tied ``lm_head.weight`` must equal the
    embedding and is dropped (the engine ties them). Raises ValueError naming the parameter."""
    import torch

    if not isinstance(weights, Mapping):
        raise ValueError(f"weights: expected a dict of name → tensor, got {type(weights).__name__}")
    optional = {TIED_HEAD} if spec.tied_head else set()
    unknown = sorted(set(weights) - set(spec.shapes) - optional)
    if unknown:
        raise ValueError(f"weights: unknown parameter(s) {unknown[:5]} (the engine's model has no such names)")
    missing = sorted(set(spec.shapes) - set(weights) - optional)
    if missing and not partial:
        raise ValueError(f"weights: missing parameter(s) {missing[:5]} ({len(missing)} of {len(spec.shapes)})")
    tensors = {}
    for name, value in weights.items():
        if isinstance(value, SameAs):
            if isinstance(weights.get(value.name), (SameAs, type(None))):
                raise ValueError(f"weight {name!r}: the same as {value.name!r}, which is not a tensor of the update")
            value = weights[value.name]
        t = to_tensor(name, value)
        want = spec.shapes[name] if name in spec.shapes else spec.shapes.get(TIED_EMBEDDING)
        if tuple(t.shape) != tuple(want):
            raise ValueError(f"weight {name!r}: shape {tuple(t.shape)}, the engine's model has {tuple(want)}")
        if not t.is_floating_point():
            raise ValueError(f"weight {name!r}: dtype {t.dtype}, expected a floating-point dtype")
        if t.device.type != "cpu":
            raise ValueError(f"weight {name!r}: on {t.device}, expected a CPU tensor")
        tensors[name] = t
    if spec.tied_head and TIED_HEAD in tensors and TIED_HEAD not in spec.shapes:
        head, embedding = tensors.pop(TIED_HEAD), tensors.get(TIED_EMBEDDING)
        if embedding is not None and head.data_ptr() != embedding.data_ptr() and not torch.equal(head, embedding):
            raise ValueError(f"weight {TIED_HEAD!r}: differs from {TIED_EMBEDDING!r}, but the model ties them")
    return tensors


class _DropLayerwiseLoadWarnings(logging.Filter):
    """vLLM's layerwise reload warns "<Layer>: Failed to load weights" for every layer that owns no checkpoint
    tensor (rotary caches, the tied LM head); with the update checked complete beforehand that is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to load weights" not in str(record.msg)


def _repack_tied_embeddings(worker, loaded: Sequence[str]) -> list[str]:
    """Re-run the post-load processing of embedding/LM-head layers that share their weight with another layer and
    got no tensor of their own in ``loaded`` (the update's names).

    vLLM's layerwise reload processes a layer when its own checkpoint tensors arrive. A tied ``ParallelLMHead``
    gets none (its weight *is* the embedding's), so on CPU its GEMM packing — made by
    ``dispatch_cpu_unquantized_gemm`` from the old values, kept in ``layer.cpu_linear`` — would stay stale.
    ``UnquantizedEmbeddingMethod.process_weights_after_loading`` keeps the weight itself, so re-running it is
    safe; on GPU it does nothing.
    """
    from collections import defaultdict

    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    by_storage = defaultdict(list)
    for name, module in worker.model_runner.get_model().named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod) and weight is not None \
                and weight.numel() > 0:
            by_storage[weight.data_ptr()].append((name, module))
    loaded = set(loaded)
    repacked = []
    with set_current_vllm_config(worker.vllm_config):
        for group in by_storage.values():
            if len(group) < 2:
                continue
            for name, module in group:
                if f"{name}.weight" not in loaded:  # (a name the model maps differently is re-packed: harmless)
                    module.quant_method.process_weights_after_loading(module)
                    repacked.append(name)
    return repacked


def load_weights_in_place(llm, weights: Mapping[str, Any]) -> dict[str, Any]:
    """Copy checked HF-named ``weights`` into the running engine and make it exact; returns the seconds of the
    reload and the re-packing, and the re-packed tied layers.

    ``reload_weights`` (the worker's, :func:`vllm.model_executor.model_loader.reload.inplace.reload_weights`
    with ``is_checkpoint_format=True``) restores each layer's checkpoint-format parameters, feeds the weights
    through the model's own ``load_weights`` (qkv/gate-up fusion), re-runs each layer's
    ``process_weights_after_loading`` (CPU: oneDNN/SGL packing) and copies the results into the original
    storage; :func:`_repack_tied_embeddings` redoes what it skips. The prefix cache is then dropped.
    """
    layerwise_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    quiet = _DropLayerwiseLoadWarnings()
    layerwise_log.addFilter(quiet)
    t0 = time.perf_counter()
    try:
        # sorted: each layer's tensors arrive together, so the reload buffers one layer at a time
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": sorted(weights.items()),
                                                     "is_checkpoint_format": True})
    finally:
        layerwise_log.removeFilter(quiet)
    t1 = time.perf_counter()
    repacked = llm.collective_rpc(_repack_tied_embeddings, args=(sorted(weights),))[0]
    if not llm.reset_prefix_cache():
        raise RuntimeError("new weights are loaded, but vLLM could not reset its prefix cache")
    return {"reload_s": t1 - t0, "repack_s": time.perf_counter() - t1, "repacked": repacked}


def fused_groups(llm) -> list[list[str]]:
    """The engine model's fused layers as groups of checkpoint module names (``[["q_proj", "k_proj", "v_proj"],
    ["gate_proj", "up_proj"]]`` for Llama: vLLM's ``packed_modules_mapping``). A partial in-place load must give
    every member of a group it touches: a fused layer half loaded would keep garbage in the other half."""
    def mapping(worker):
        return {k: list(v) for k, v in getattr(worker.model_runner.get_model(), "packed_modules_mapping", {}).items()}

    return [group for group in llm.collective_rpc(mapping)[0].values() if len(group) > 1]


def write_checkpoint(dest: str | Path, frame: Mapping[str, bytes], weights: Mapping[str, Any]) -> Path:
    """A Hugging Face checkpoint directory from a frame (config, tokenizer…) and checked weights."""
    from safetensors.torch import save_file

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in frame.items():
        (dest / name).write_bytes(data)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dest / "model.safetensors"),
              metadata={"format": "pt"})
    return dest
