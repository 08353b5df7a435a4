"""The sections of how a run is executed: the vLLM engines, placement on the Ray cluster, orchestration
(checkpoints, retries), experiment tracking, evaluation and the faithfulness probe. The run's identity and
method sections are in :mod:`rlcr.config.sections`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from rlcr.config.fields import RESULTS_KEY, Section, changes, operational
from rlcr.untrusted import printable

RESERVED_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
"""Ray resources that ``placement.engine_resources``/``placement.trainer_resources`` may not name (other settings
set them)."""


class EngineSection(Section):
    """The vLLM engines (docs/design.md §10). Scheduling and kernels change the numbers even where they do not
    change the method: the engine settings are result-changing, conservatively so."""

    gpu_memory_utilization: float = changes(0.5, gt=0.0, le=0.95)
    """Share of device memory the engine reserves. On CPU it is the share of the NUMA node's RAM: keep it low."""
    kv_cache_gib: float | None = changes(None, gt=0.0)
    """KV-cache size in GiB, overriding the memory share (``kv_cache_memory_bytes``). None: 1 GiB on CPU (enough for
    small models and saves RAM for the trainer), the memory share on GPU."""
    block_size: int | None = changes(None, ge=1)
    """Tokens per KV-cache block (None: vLLM's default, 128 on CPU, 16 on GPU; the CPU build needs a multiple of 32).
    vLLM's prefix cache reuses whole blocks, so smaller blocks reuse more of what prompts share: the chat
    template and system prompt of every prompt, and the turn-1 prompt and answer inside each turn-2 prompt.
    Measured on this CPU (SmolLM2, 256 held-out tasks, two turns): 32 instead of 128, with a 2 GiB cache, cut
    generation from 199 s to 169 s."""
    max_model_len: int = changes(1024, ge=64)
    """Engine context length (prompt + completion)."""
    tensor_parallel_size: int = changes(1, ge=1)
    """vLLM tensor parallelism per actor."""
    enforce_eager: bool = changes(True)
    """Skip torch.compile / CUDA graphs: on CPU this halves engine start-up at no generation cost."""
    weight_sync: Literal["auto", "inplace", "recreate"] = changes("auto")
    """How the long-lived engines take each iteration's new weights from the long-lived trainer: ``inplace``
    copies them into the running engine from Ray's object store (no checkpoint on the artifact store; the
    engine's own post-load processing re-runs so CPU-prepacked weights are exact); ``recreate`` rebuilds the
    engine in its process from the weights (the fallback: seconds, not milliseconds); ``auto``: ``inplace``."""
    sync_bucket_mib: float = operational(512.0, gt=0.0)
    """The weight sync's bucket: the trainer puts the new weights into Ray's object store this many MiB at a time
    (whole decoder layers; a bucket may pass it by one layer), so the worker that gathers them holds one bucket,
    not a second full model (under ``update.fsdp``: each weight gathered from its shards as it goes). Operational:
    the engines load the same weights however they are cut."""
    release_during_update: bool = operational(False)
    """Stop the engines while the trainer updates and start them again for the weight sync (from ``model.name``'s
    files, then the new weights in place): frees the engines' memory (weights and KV cache: most of a GPU at
    ``engine.gpu_memory_utilization``) for the update where engines and trainer share devices, at the price of
    an engine start per iteration (~15–60 s on this CPU). Off: engines and trainer hold their memory
    throughout (separate devices or enough memory). Operational: the engines sample the same with the same
    weights."""
    call_timeout_s: float = operational(7200.0, gt=0.0, le=86400.0)
    """How long one call to an engine actor may take — one batch's generation, a checkpoint load, a weight sync —
    before the run stops with an error naming the call (:class:`rlcr.rollout.engine.EngineTimeout`), instead of
    waiting on a hung engine for ever. The default leaves hours for a large batch on a slow device."""


def _extra_ray_resources(value: dict[str, float]) -> dict[str, float]:
    for name, amount in value.items():
        if not name or not name.strip():
            raise ValueError("resource names must be non-empty")
        if name in RESERVED_RESOURCES:
            raise ValueError(f"{name!r} is not an extra resource: CPUs and GPUs come from update.use_gpu, "
                             f"update.num_workers and engine.tensor_parallel_size, memory is not reserved; name "
                             f"custom resources")
        if not amount > 0:
            raise ValueError(f"resource {name!r} must ask for an amount > 0, got {amount!r}")
        if round(amount, 4) != amount:
            raise ValueError(f"resource {name!r}: Ray counts resources in steps of 0.0001, got {amount!r}")
    return value


class PlacementSection(Section):
    """Where the engines and trainer run on a Ray cluster. The placement fields choose nodes, not kernels or
    batches: operational."""

    engine_resources: dict[str, float] = Field(default_factory=dict, json_schema_extra={RESULTS_KEY: False})
    """Extra Ray resources each engine actor asks for, besides its CPU (and GPUs with ``update.use_gpu``): e.g.
    ``{"worker_node": 1}``, a custom resource that only the nodes meant for the engines advertise (``ray start
    --resources='{"worker_node": 4}'``, KubeRay's ``rayStartParams.resources``), pins them there. Names other
    than ``CPU``/``GPU``/``memory``; amounts > 0. The flow's fit check counts them. Operational: where the
    engines run does not change results."""
    trainer_resources: dict[str, float] = Field(default_factory=dict, json_schema_extra={RESULTS_KEY: False})
    """Extra Ray resources each Ray Train worker asks for, merged with its 1 CPU (or 1 GPU with ``update.use_gpu``)
    in ``ScalingConfig(resources_per_worker=…)``: e.g. ``{"worker_node": 1}`` to keep the trainer off the head
    node. Same rules as ``placement.engine_resources``. Operational."""
    engine_gpus: float | None = Field(None, gt=0.0, json_schema_extra={RESULTS_KEY: False})
    """GPUs each engine actor asks Ray for with ``update.use_gpu`` (None: ``engine.tensor_parallel_size``). A
    share below 1 (``0.5``) puts an engine and the trainer on one device (docs/one-gpu.md: with
    ``engine.gpu_memory_utilization`` leaving the trainer its memory, or ``engine.release_during_update``).
    Operational: where the engines run does not change results."""
    trainer_gpus: float | None = Field(None, gt=0.0, le=1.0, json_schema_extra={RESULTS_KEY: False})
    """GPUs each Ray Train worker asks Ray for with ``update.use_gpu`` (None: 1). ``0.5`` beside
    ``placement.engine_gpus: 0.5``: engine and trainer on one device (docs/one-gpu.md). Operational."""
    storage_shared: bool = operational(False)
    """The run's local paths are the same files on every Ray node: a local ``storage.uri`` on a filesystem every
    node mounts at that path (NFS, a shared volume), a local ``model.name`` likewise (or baked into the image
    there). Without it the flow refuses, on a Ray cluster of more than one alive node, a local ``storage.uri``
    (each node would write checkpoints to, and read them from, its own disk) and a local ``model.name`` (a path,
    or a name such as ``smollm2-135m-instruct`` that is converted into the driver's own cache). ``s3://`` needs
    neither. Operational."""

    engine_cpus: list[int] | None = Field(None, min_length=1, json_schema_extra={RESULTS_KEY: False})
    """Pin each engine actor (every thread of its process) to these logical CPUs of its node (Linux; ids from
    ``os.sched_getaffinity``), with as many torch/OpenMP threads. None: no pinning, a thread per core of the node.
    Beside ``placement.trainer_cpus`` on other CPUs it keeps generation and the update off each other's cores
    (``orchestration.mode: one-step-off`` on one machine). Operational."""
    trainer_cpus: list[int] | None = Field(None, min_length=1, json_schema_extra={RESULTS_KEY: False})
    """Pin each Ray Train worker to these logical CPUs of its node, with as many torch threads (None: the node's
    cores shared among its workers). Operational."""
    trainer_keeps_memory: bool = operational(True)
    """The Ray Train workers keep the memory they free for their next update instead of handing it back to the
    kernel (glibc's allocator in one arena, no per-allocation mmap, no trimming:
    :data:`rlcr.runs.cluster.KEEP_MEMORY_ENV`,
    set when each worker process starts). Off, every update faults its activations in again — on a VM that
    reports free pages to its host, about 2 s per GiB that sat free through the rollouts: measured on the demo
    (2-core VM), the 4th update took 24.8 s in the flow against 20.6 s with this on (bench/perf/update_in_flow.py,
    docs/update-performance.md). A worker's resident memory then stays at its peak. Operational."""

    @field_validator("engine_cpus", "trainer_cpus")
    @classmethod
    def _cpu_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (any(c < 0 for c in value) or len(set(value)) != len(value)):
            raise ValueError("must be distinct CPU ids >= 0")
        return value

    @field_validator("engine_resources", "trainer_resources")
    @classmethod
    def _extra_resources(cls, value: dict[str, float]) -> dict[str, float]:
        return _extra_ray_resources(value)


class OrchestrationSection(Section):
    """How iterations follow each other, checkpoints and retries of the training flow (docs/design.md §12)."""

    mode: Literal["sync", "one-step-off"] = changes("sync")
    """``sync``: iteration k's rollouts are sampled by the policy after k − 1 updates, then the update runs while
    the engines wait. ``one-step-off``: iteration k+1's rollouts are generated while iteration k's update runs,
    by the policy the engines hold then (after k − 1 updates: at most one update stale, recorded per row as
    ``policy_version``); the weights reach the engines once both are done. The first iteration of a run (and of
    a run extended past its last iteration) is sampled on-policy. Overlaps generation with training where the
    engines and the trainer have their own devices (or cores: ``placement.engine_cpus``); correct the staleness
    with ``loss.tis_cap`` / ``loss.seq_mask_band`` (docs/design.md §8, §12). Changes results."""

    save_every: int = changes(1, ge=1)
    """Write the full training state (weights, AdamW moments, schedule position, RNG), sealed, every this many
    iterations and always at the last. Iterations in between are staged (rollouts and metrics written, pending)
    and committed together when the state covering them is saved; after a crash they are re-run
    deterministically from the last saved state. Larger: less checkpoint I/O, more work redone after a crash."""
    background_save: bool = operational(True)
    """Write the training state in the background: the trainer's rank 0 writes it while the next iteration's
    rollouts run, and the iterations it covers are committed when it is done, before the next update (which
    waits for it, so the state written is exactly the state after the saving iteration). ``false``: the flow
    waits for the write before going on. Either way the same files are written and the same iterations
    committed; a crash before the commit re-runs them from the last saved state. Operational."""
    keep_checkpoints: int | None = operational(None, ge=1)
    """Keep the saved states of only the newest this many saves of the run: after each save is committed, the
    checkpoints of older saves are deleted (1.6 GB each for a 135M model in fp32 with its AdamW moments). Their
    iterations stay committed, with metrics, rollouts and evaluation rows; only the policy after them can no
    longer be loaded (evaluated, probed, or resumed from: a run always resumes from its newest save, which is
    kept). A probe or evaluation that is reading a save while it is deleted fails (with a nightly probe on a
    live run, keep at least 2: the save it starts on then outlives the next one). None: keep every save.
    Operational."""
    retries: int = operational(2, ge=0)
    """Prefect retries of each iteration task on failure (transient errors: S3, Ray actors). Operational."""
    retry_delay_s: float = operational(5.0, ge=0.0)
    """Backoff factor of the retries: delays are retry_delay_s · 2^attempt seconds. Operational."""


TRACKING_BACKENDS = ("mlflow", "wandb", "none")


class TrackingSection(Section):
    """Experiment tracking (MLflow, W&B)."""

    backend: str | list[str] = operational("mlflow")
    """Experiment tracking: ``mlflow`` (one MLflow run per rlcr run: the config as params, each committed
    iteration's metrics with step = iteration, the probe's report as artifacts), ``wandb`` (one W&B run per rlcr
    run, the same metrics with ``iteration`` as x-axis; needs the ``wandb`` extra), both (``[mlflow, wandb]``) or
    ``none``. A tracker that is down or slow never stops training: one warning, then it is off for the rest of
    the flow run and the next resume fills in what was missed. Operational."""
    uri: str | None = operational(None)
    """MLflow tracking server (``http://mlflow:5000``). None: ``$MLFLOW_TRACKING_URI`` if set, else a SQLite
    store next to a local ``storage.uri`` (``<storage>/mlflow.db``; view it with ``mlflow ui
    --backend-store-uri sqlite:///<storage>/mlflow.db``); with S3 storage and neither, tracking is off with a
    warning. Operational."""
    ui_url: str | None = operational(None)
    """Address of an MLflow UI serving a non-HTTP ``tracking.uri`` (the Prefect artifact links the run there).
    Operational."""
    timeout_s: float = operational(60.0, gt=0.0, le=3600.0)
    """Longest one tracking call may take before tracking turns off for the flow run. Operational."""
    @field_validator("backend", mode="before")
    @classmethod
    def _known_backends(cls, value: Any) -> Any:
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError("expected mlflow, wandb or none, or a list such as [mlflow, wandb]")
        for name in names:
            if name not in TRACKING_BACKENDS or (name == "none" and len(names) > 1):
                raise ValueError(f"unknown tracker {printable(name, 40)!r}: expected mlflow, wandb or none, or a "
                                 "list such as [mlflow, wandb]")
        return value

    wandb_project: str = operational("rlcr", min_length=1, max_length=128)
    """W&B project of the runs (``tracking.backend`` ``wandb``). Operational."""
    wandb_entity: str | None = operational(None, max_length=128)
    """W&B entity (team or user); None: the API key's default. Operational."""
    wandb_mode: Literal["online", "offline"] | None = operational(None)
    """``offline``: W&B writes local files only (send them later with ``wandb sync``); None: ``$WANDB_MODE``, else
    online (``WANDB_API_KEY`` and ``WANDB_BASE_URL`` from the environment). Operational."""
    wandb_dir: str | None = operational(None)
    """Where W&B writes its files (its ``wandb/`` folder goes inside); None: the storage folder where storage is
    local, else ``$WANDB_DIR`` or the working directory. Operational."""


class EvalSection(Section):
    """Evaluation on the held-out set (docs/design.md §13)."""

    every: int = operational(1, ge=0)
    """Evaluate on the held-out set every this many iterations (0: never). Operational: evaluation does not
    change training (every sample has its own request seed), only which iterations carry eval metrics."""
    samples: int = changes(1, ge=1)
    """Answers sampled per held-out task at evaluation (each with one confidence). More samples narrow the
    intervals at the same task count; the bootstrap resamples tasks, keeping a task's answers together."""
    bootstrap_resamples: int = changes(1000, ge=100)
    """Bootstrap resamples (of held-out tasks) behind the 95% intervals of accuracy, ECE, Brier and AUROC
    in every evaluation and probe report."""


class ProbeSection(Section):
    """The faithfulness probe (docs/design.md §15, docs/probe.md). The probe reads checkpoints; it does not train:
    operational."""

    samples: int = operational(50, ge=1)
    """N: forced-answer samples per truncation point in the faithfulness probe. Operational for training."""
    truncation: Literal["sentences", "fractions"] = operational("sentences")
    """Truncation points: every sentence boundary plus 0% and 100%, or fixed fractions 0, 0.1, …, 1.
    Operational for training."""
    forced_answer_tokens: int = operational(32, ge=1)
    """Most tokens of one forced answer in the probe (an equation and ``</answer>``). Operational for training."""
    cron: str = operational("0 3 * * *")
    """Schedule (cron, UTC) of the nightly probe deployment. Operational."""
