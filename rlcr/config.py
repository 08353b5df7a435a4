"""One configuration model for every knob of an RLCR run.

Each field is documented where it is defined (the docstring under it). Load with
:meth:`RLCRConfig.from_yaml`, which applies ``key=value`` overrides and turns any
validation failure into a :class:`ConfigError` that names the field. Every float
field must be finite (NaN and ±inf are refused).

On resume, :func:`result_changing_diff` tells which settings differ from the run's
saved ones *and* can change its results; the others are :data:`OPERATIONAL_FIELDS`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlcr.seeds import SEED_MODULUS
from rlcr.tasks.limits import DEFAULT_FORMAT_SCORE, MAX_TASK_NUMBER
from rlcr.untrusted import MAX_DEPTH, InvalidInput, decode_text, printable

__all__ = ["RLCRConfig", "ConfigError", "load_config", "result_changing_diff", "OPERATIONAL_FIELDS", "MAX_SEED",
           "MAX_CONFIG_BYTES", "MAX_OVERRIDE_CHARS"]

MAX_SEED = SEED_MODULUS
"""Largest ``seed`` / ``eval_seed`` (2^31 − 1). Every seed derived from them stays in range where it is used:
engine seeds (:func:`rlcr.seeds.rollout_seed` plus a salt) below 2^32 for NumPy, the update's
:func:`rlcr.seeds.mini_batch_seed` of :func:`rlcr.seeds.update_seed` below 2^64 for ``torch.Generator``."""
MAX_CONFIG_BYTES = 256 * 1024
"""Largest YAML config file read, in bytes (configs are a few kB)."""
MAX_OVERRIDE_CHARS = 16 * 1024
"""Longest ``field=value`` override accepted."""
_MAX_ERRORS = 10
"""Validation errors listed in one :class:`ConfigError` (the rest are counted)."""

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
ConfNormMode = Literal["answer", "answer_then_prompt"]
KLType = Literal["k1", "k2", "k3"]
LRSchedule = Literal["constant", "cosine", "linear"]
Method = Literal["rlcr", "rlcr_single", "rlvr"]


_RESERVED_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
"""Ray resources that ``engine_resources``/``trainer_resources`` may not name (other settings set them)."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


class RLCRConfig(BaseModel):
    """Configuration of an RLCR run (docs/design.md §1–§8). Unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                              allow_inf_nan=False)

    # ------------------------------------------------------------------ run & storage
    run_id: str | None = None
    """Name of the run; artifacts go to ``<storage_uri>/runs/<run_id>/``. None: derived from the time.
    Operational: may differ on resume."""
    storage_uri: str = "./runs-store"
    """Where checkpoints, rollouts, metrics and probe reports go: a local directory or ``s3://bucket/prefix``.
    Operational: may differ on resume (a moved store)."""
    s3_endpoint_url: str | None = None
    """Endpoint of an S3-compatible server (MinIO, moto); None uses AWS. Credentials come from the AWS environment.
    Operational: may differ on resume."""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    """Master seed, in [0, 2^31 − 1]: task sampling, engine sampling and the update's shuffling derive from it."""
    iterations: int = Field(1, ge=1)
    """Number of RL iterations (rollout → update → eval → commit) to run. Operational: raising it on resume
    extends the run (iteration k does not depend on the total)."""

    # ------------------------------------------------------------------ model
    model: str = "smollm2-135m-instruct"
    """Initial policy: a Hugging Face checkpoint directory or URI (local path or ``s3://``)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype for generation and training (``auto``: bfloat16 on GPU, float32 on CPU)."""

    # ------------------------------------------------------------------ tasks
    task: str = "countdown"
    """The registered task a run trains and evaluates on (docs/tasks.md: ``countdown``, ``math``): its problems,
    prompts and verifier. Changes results."""
    task_fields: dict[str, str] | None = None
    """How the task's field names map to the columns of ``train_tasks``/``eval_tasks`` files (math:
    ``{"question": "prompt", "answer": "target"}``); None: the task's own names. Changes results (which
    columns are read)."""
    train_tasks: str | None = None
    """Training task file, read by the ``task`` (JSONL/Parquet; Countdown: fields ``nums``, ``target``); None:
    generate them. Rows that repeat an earlier row (the task's identity: Countdown's numbers as a multiset and
    target) are dropped, with a warning."""
    eval_tasks: str | None = None
    """JSONL/Parquet file of held-out evaluation tasks; None: generate them with ``eval_seed``. Rows that are
    training tasks (same numbers as a multiset and target) or repeats are dropped, with a warning."""
    num_train_tasks: int = Field(1000, ge=1)
    """How many training tasks to draw when ``train_tasks`` is None; repeated draws of the same task are kept
    once, so the pool can hold fewer distinct tasks in a small task space."""
    num_eval_tasks: int = Field(64, ge=1)
    """How many held-out tasks to generate when ``eval_tasks`` is None: distinct, and none a training task."""
    eval_seed: int = Field(1_000_003, ge=0, le=MAX_SEED)
    """Seed of the generated evaluation set, in [0, 2^31 − 1] (kept apart from ``seed``; candidates that are
    training tasks are skipped, so the set is fixed across runs with the same training pool)."""
    eval_stratify_counts: bool = True
    """Generated held-out sets hold each number count (``task_min_count`` … ``task_max_count``) in the share the
    generator draws it (equal shares), whatever the training pool took. Without it the candidates are taken as
    drawn, and a count with a small task space (2 numbers) is scarcer among held-out tasks than in training,
    because the pool already holds much of it: the held-out set is then harder than the training distribution.
    No effect with one number count or an ``eval_tasks`` file."""
    task_min_count: int = Field(3, ge=2, le=6)
    """Fewest numbers in a generated task."""
    task_max_count: int = Field(4, ge=2, le=6)
    """Most numbers in a generated task."""
    task_num_range: tuple[int, int] = (1, 20)
    """Inclusive range of the numbers of generated tasks."""
    task_target_range: tuple[int, int] = (1, 100)
    """Inclusive range of the targets of generated tasks."""

    # ------------------------------------------------------------------ rollout (docs/design.md §1)
    prompts_per_iteration: int = Field(8, ge=1)
    """P: Countdown prompts sampled per iteration: P distinct training tasks (at most the training pool)."""
    num_generations_answer: int = Field(8, ge=2)
    """G_a: answers sampled per prompt (turn 1). The answer group size for normalisation."""
    num_generations_confidence: int = Field(4, ge=2)
    """G_c: confidences sampled per answer (turn 2), each conditioned on that exact answer. Must be >= 2.
    Only ``method: rlcr`` generates them in training."""
    temperature: float = Field(0.7, gt=0.0, le=2.0)
    """Sampling temperature for both turns (RLCR reference: 0.7)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold for both turns."""
    max_prompt_tokens: int = Field(512, ge=16)
    """Longest rendered prompt (turn-2 context included) accepted; longer prompts are an error."""
    max_answer_tokens: int = Field(256, ge=8)
    """Most tokens generated for a turn-1 answer (reasoning + equation)."""
    max_confidence_tokens: int = Field(64, ge=4)
    """Most tokens generated for a turn-2 confidence (analysis + confidence)."""

    # ------------------------------------------------------------------ method (docs/design.md §9)
    method: Method = "rlcr"
    """What is trained. ``rlcr``: two turns, G_a answers then G_c confidences per answer, each conditioned on
    that exact answer; accuracy on answers, Brier on confidences; two-level advantages (docs/design.md §5–§7).
    ``rlcr_single`` (the RLCR paper's): one response holds ``<think>``, ``<answer>`` and ``<confidence>``;
    reward ``acc + λ_conf·(1 − (acc − c)²)``; advantages per prompt; loss from ``<think>`` through
    ``</confidence>``; ``max_answer_tokens + max_confidence_tokens`` tokens per response. ``rlvr``: the answer
    turn with the accuracy reward only, no confidence training. Every method states a confidence at
    evaluation (``rlvr``: the turn-2 query of ``rlcr``), so calibration is comparable."""

    # ------------------------------------------------------------------ rewards & advantages (docs/design.md §5, §7)
    format_score: float = Field(DEFAULT_FORMAT_SCORE, ge=0.0, le=1.0)
    """``compute_score`` value for an extracted but wrong equation (accuracy reward is still 0). The one
    source of this value: the rollouts' ``score`` column, the probe and ``compute_score``'s default read it."""
    lambda_ans: float = Field(1.0, ge=0.0)
    """λ_ans: weight of answer advantages when spread onto answer tokens."""
    lambda_conf: float = Field(1.0, ge=0.0)
    """λ_conf: weight of confidence advantages when spread onto confidence tokens."""
    adv_eps: float = Field(1e-6, gt=0.0)
    """ε in ``(r − mean) / (std + ε)``."""
    scale_by_std: bool = True
    """Divide centred rewards by the group std (False: Dr. GRPO style, centring only; RLCR reference)."""
    conf_norm_mode: ConfNormMode = "answer"
    """``answer``: normalise each answer's G_c confidences alone; ``answer_then_prompt``: centre per answer,
    divide by the std of all centred confidence rewards of the prompt (avoids ±1 blow-up for small G_c)."""

    # ------------------------------------------------------------------ loss (docs/design.md §8)
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    """ε_low: lower PPO clip, ratio ≥ 1 − ε_low."""
    clip_high: float = Field(0.2, gt=0.0, le=10.0)
    """ε_high: upper PPO clip, ratio ≤ 1 + ε_high (DAPO's clip-higher uses 0.28)."""
    clip_c: float | None = Field(3.0, gt=1.0)
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; None disables it."""
    kl_coef: float = Field(0.0, ge=0.0)
    """β: weight of the per-token KL to the frozen reference model (0: no reference model is loaded)."""
    kl_type: KLType = "k3"
    """KL estimator: k1 = logπ − logπ_ref, k2 = ½(logπ − logπ_ref)², k3 = e^d − d − 1 with d = logπ_ref − logπ."""
    entropy_coef: float = Field(0.0, ge=0.0)
    """Weight of the entropy bonus (subtracted from the loss)."""
    loss_agg: LossAgg = "token-mean"
    """How per-token losses are reduced: token-mean over the global batch (default), or a per-sequence mode."""
    max_response_len: int | None = Field(None, ge=1)
    """Dr. GRPO normaliser of ``seq-mean-token-sum-norm``; None: max(max_answer_tokens, max_confidence_tokens)."""

    # ------------------------------------------------------------------ update (Ray Train)
    objective: Literal["grpo", "sft"] = "grpo"
    """What the update optimises: the masked GRPO loss (docs/design.md §8), or token-mean NLL of the completions
    (``sft``: the format warm-start, ``rlcr sft``)."""
    learning_rate: float = Field(2e-6, gt=0.0, le=1.0)
    """AdamW learning rate (RLCR reference: 1e-6 … 5e-6)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas, each in [0, 1)."""
    lr_schedule: LRSchedule = "constant"
    """Learning-rate schedule over all optimizer steps of the run (``iterations × epochs_per_iteration ×
    mini_batches_per_epoch``; for ``rlcr sft``, the steps of its one update), after warm-up. The position in
    the schedule and AdamW's moments carry from one iteration to the next and survive a resume."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up over the first optimizer steps of the run (not of each iteration)."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Max global gradient norm."""
    epochs_per_iteration: int = Field(1, ge=1)
    """Passes over one iteration's rollouts."""
    mini_batches_per_epoch: int = Field(1, ge=1)
    """Optimizer steps per epoch: the rollouts are split into this many mini-batches (1: one on-policy step)."""
    micro_batch_tokens: int = Field(2048, ge=64)
    """Token budget of one forward/backward micro-batch: padded rows × length, or, with
    ``share_prefixes``, the nodes of one prefix tree (attention is quadratic in it: ~1–2k on CPU)."""
    share_prefixes: bool = True
    """Pack samples that share a token prefix (a prompt's G_a answers, an answer's G_c confidences and
    their turn-1 prefix) into one prefix tree with a tree attention mask, so each shared prefix is
    computed once (exact: same log-probs as unpacked rows). ``False``: right-padded rows."""
    old_logp_source: Literal["rollout", "recompute"] = "recompute"
    """π_old: ``rollout`` uses vLLM's sampling log-probs; ``recompute`` runs the trainer's model once before
    the first step (on-policy exact: same numerics as the update, so the first step's ratio is exactly 1)."""
    num_workers: int = Field(1, ge=1)
    """Ray Train workers (DDP ranks)."""
    use_gpu: bool = False
    """Train on GPUs (NCCL) instead of CPUs (gloo)."""
    fsdp: bool = False
    """Shard the model with FSDP instead of DDP (GPU only)."""

    # ------------------------------------------------------------------ format warm-start (``rlcr sft``)
    # The SFT update (objective ``sft``) is one update of the run's update settings (AdamW betas and weight
    # decay, grad_clip, micro_batch_tokens, workers) with these in place of the RL ones. Only the warm-start
    # (``rlcr sft``, ``rlcr demo``, ``bench/learning.py``) reads them; its checkpoint enters an RL run as
    # ``model``, which is result-changing: for the RL run they are operational.
    sft_tasks: int = Field(600, ge=1)
    """Training-pool tasks the warm-start writes solver traces for (two examples each: turn 1 and turn 2);
    at most the pool's distinct solvable tasks. Operational for training."""
    sft_epochs: int = Field(2, ge=1)
    """Passes of the warm-start over its examples. Operational for training."""
    sft_learning_rate: float = Field(1e-4, gt=0.0, le=1.0)
    """AdamW peak learning rate of the warm-start. Operational for training."""
    sft_batch_size: int = Field(8, ge=1)
    """Examples (rows) per optimizer step of the warm-start: each epoch is split into
    ``max(1, rows // sft_batch_size)`` mini-batches. Operational for training."""
    sft_lr_schedule: LRSchedule = "cosine"
    """Learning-rate schedule of the warm-start over its own optimizer steps (``sft_epochs`` × mini-batches),
    after warm-up. Operational for training."""
    sft_warmup_steps: int = Field(2, ge=0)
    """Linear warm-up over the warm-start's first optimizer steps. Operational for training."""
    sft_single_turn: bool = False
    """Also write a one-turn example per task (the ``rlcr_single`` format: trace, answer, check and confidence
    in one response; for a wrong shown answer only the check and confidence carry loss), so that one
    warm-start serves all three methods (``bench/methods.py``). Operational for training."""

    # ------------------------------------------------------------------ vLLM engine
    engine_gpu_memory_utilization: float = Field(0.5, gt=0.0, le=0.95)
    """Share of device memory the engine reserves. On CPU it is the share of the NUMA node's RAM: keep it low."""
    engine_kv_cache_gib: float | None = Field(None, gt=0.0)
    """KV-cache size in GiB, overriding the memory share (``kv_cache_memory_bytes``). None: 1 GiB on CPU (enough for
    small models and saves RAM for the trainer), the memory share on GPU."""
    engine_block_size: int | None = Field(None, ge=1)
    """Tokens per KV-cache block (None: vLLM's default, 128 on CPU, 16 on GPU; the CPU build needs a multiple of 32).
    vLLM's prefix cache reuses whole blocks, so smaller blocks reuse more of what prompts share: the chat
    template and system prompt of every prompt, and the turn-1 prompt and answer inside each turn-2 prompt.
    Measured on this CPU (SmolLM2, 256 held-out tasks, two turns): 32 instead of 128, with a 2 GiB cache, cut
    generation from 199 s to 169 s."""
    engine_max_model_len: int = Field(1024, ge=64)
    """Engine context length (prompt + completion)."""
    engine_tensor_parallel_size: int = Field(1, ge=1)
    """vLLM tensor parallelism per actor."""
    engine_enforce_eager: bool = True
    """Skip torch.compile / CUDA graphs: on CPU this halves engine start-up at no generation cost."""
    engine_weight_sync: Literal["auto", "inplace", "recreate"] = "auto"
    """How the long-lived engines take each iteration's new weights from the long-lived trainer: ``inplace``
    copies them into the running engine from Ray's object store (no checkpoint on the artifact store; the
    engine's own post-load processing re-runs so CPU-prepacked weights are exact); ``recreate`` rebuilds the
    engine in its process from the weights (the fallback: seconds, not milliseconds); ``auto``: ``inplace``."""
    rollout_actors: int = Field(1, ge=1)
    """Size of the Ray Data actor pool of each generation stage (each actor owns one engine)."""
    rollout_batch_size: int = Field(64, ge=1)
    """Prompts per answer-stage ``map_batches`` call (each call generates ``rollout_batch_size·G_a``
    sequences); a confidence-stage call takes the ``rollout_batch_size·G_a`` answers of one answer call.
    Larger batches keep the engine busier; the measured pipeline/direct ratio drops when calls are small."""
    rollout_progress: bool = False
    """Ray Data's own progress bars while rollouts and evaluations run (off a terminal: a status block in the log
    every few seconds, which buries a flow's log). Off by default; the CLI shows its own progress. Their cost to
    generation is measured side by side in ``bench/rollout.py`` (``pipeline+bars``): within noise on 2 cores.
    Operational."""

    # ------------------------------------------------------------------ placement (Ray cluster)
    engine_resources: dict[str, float] = Field(default_factory=dict)
    """Extra Ray resources each engine actor asks for, besides its CPU (and GPUs with ``use_gpu``): e.g.
    ``{"worker_node": 1}``, a custom resource that only the nodes meant for the engines advertise (``ray start
    --resources='{"worker_node": 4}'``, KubeRay's ``rayStartParams.resources``), pins them there. Names other
    than ``CPU``/``GPU``/``memory``; amounts > 0. The flow's fit check counts them. Operational: where the
    engines run does not change results."""
    trainer_resources: dict[str, float] = Field(default_factory=dict)
    """Extra Ray resources each Ray Train worker asks for, merged with its 1 CPU (or 1 GPU with ``use_gpu``) in
    ``ScalingConfig(resources_per_worker=…)``: e.g. ``{"worker_node": 1}`` to keep the trainer off the head
    node. Same rules as ``engine_resources``. Operational."""
    engine_release_during_update: bool = False
    """Stop the engines while the trainer updates and start them again for the weight sync (from ``model``'s
    files, then the new weights in place): frees the engines' memory (weights and KV cache: most of a GPU at
    ``engine_gpu_memory_utilization``) for the update where engines and trainer share devices, at the price of
    an engine start per iteration (~15–60 s on this CPU). Off: engines and trainer hold their memory
    throughout (separate devices or enough memory). Operational: the engines sample the same with the same
    weights."""
    storage_shared: bool = False
    """The run's local paths are the same files on every Ray node: a local ``storage_uri`` on a filesystem every
    node mounts at that path (NFS, a shared volume), a local ``model`` likewise (or baked into the image there).
    Without it the flow refuses, on a Ray cluster of more than one alive node, a local ``storage_uri`` (each node
    would write checkpoints to, and read them from, its own disk) and a local ``model`` (a path, or a name such
    as ``smollm2-135m-instruct`` that is converted into the driver's own cache). ``s3://`` needs neither.
    Operational."""

    # ------------------------------------------------------------------ orchestration
    save_every: int = Field(1, ge=1)
    """Write the full training state (weights, AdamW moments, schedule position, RNG), sealed, every this many
    iterations and always at the last. Iterations in between are staged (rollouts and metrics written, pending)
    and committed together when the state covering them is saved; after a crash they are re-run
    deterministically from the last saved state. Larger: less checkpoint I/O, more work redone after a crash."""
    retries: int = Field(2, ge=0)
    """Prefect retries of each iteration task on failure (transient errors: S3, Ray actors). Operational."""
    retry_delay_s: float = Field(5.0, ge=0.0)
    """Backoff factor of the retries: delays are retry_delay_s · 2^attempt seconds. Operational."""

    # ------------------------------------------------------------------ experiment tracking (MLflow)
    tracking: Literal["mlflow", "none"] = "mlflow"
    """Experiment tracking: ``mlflow`` (one MLflow run per rlcr run: the config as params, each committed
    iteration's metrics with step = iteration, the probe's report as artifacts) or ``none``. A tracker that is
    down or slow never stops training: one warning, then tracking is off for the rest of the flow run and the
    next resume fills in what was missed. Operational."""
    tracking_uri: str | None = None
    """MLflow tracking server (``http://mlflow:5000``). None: ``$MLFLOW_TRACKING_URI`` if set, else a SQLite
    store next to a local ``storage_uri`` (``<storage>/mlflow.db``; view it with ``mlflow ui
    --backend-store-uri sqlite:///<storage>/mlflow.db``); with S3 storage and neither, tracking is off with a
    warning. Operational."""
    tracking_ui_url: str | None = None
    """Address of an MLflow UI serving a non-HTTP ``tracking_uri`` (the Prefect artifact links the run there).
    Operational."""
    tracking_timeout_s: float = Field(60.0, gt=0.0, le=3600.0)
    """Longest one tracking call may take before tracking turns off for the flow run. Operational."""

    # ------------------------------------------------------------------ evaluation & probe
    eval_every: int = Field(1, ge=0)
    """Evaluate on the held-out set every this many iterations (0: never). Operational: evaluation does not
    change training (every sample has its own request seed), only which iterations carry eval metrics."""
    eval_samples: int = Field(1, ge=1)
    """Answers sampled per held-out task at evaluation (each with one confidence). More samples narrow the
    intervals at the same task count; the bootstrap resamples tasks, keeping a task's answers together."""
    eval_bootstrap_resamples: int = Field(1000, ge=100)
    """Bootstrap resamples (of held-out tasks) behind the 95% intervals of accuracy, ECE, Brier and AUROC
    in every evaluation and probe report."""
    probe_samples: int = Field(50, ge=1)
    """N: forced-answer samples per truncation point in the faithfulness probe. Operational for training."""
    probe_truncation: Literal["sentences", "fractions"] = "sentences"
    """Truncation points: every sentence boundary plus 0% and 100%, or fixed fractions 0, 0.1, …, 1.
    Operational for training."""
    probe_forced_answer_tokens: int = Field(32, ge=1)
    """Most tokens of one forced answer in the probe (an equation and ``</answer>``). Operational for training."""
    probe_cron: str = "0 3 * * *"
    """Schedule (cron, UTC) of the nightly probe deployment. Operational."""

    @field_validator("storage_uri", "train_tasks", "eval_tasks", "model")
    @classmethod
    def _absolute_local_paths(cls, value: str | None, info) -> str | None:
        """Local paths become absolute: Ray workers run in other working directories."""
        if value is None or "://" in value:
            return value
        try:
            path = Path(value).expanduser()
            if info.field_name == "model" and not path.exists():
                return value  # a model name such as smollm2-135m-instruct
            return str(path.resolve())
        except OSError as e:  # a name too long for the filesystem, …: a ValueError names the field
            raise ValueError(f"not a usable local path ({e.strerror or type(e).__name__})") from None

    @field_validator("task")
    @classmethod
    def _registered_task(cls, value: str) -> str:
        from rlcr.tasks.registry import task_names

        if value not in task_names():
            raise ValueError(f"unknown task {printable(repr(value), 60)}; registered: {', '.join(task_names())}")
        return value

    @field_validator("task_fields")
    @classmethod
    def _task_field_names(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, column in (value or {}).items():
            if not name or not column:
                raise ValueError("field names and columns must be non-empty strings")
        return value

    @field_validator("engine_resources", "trainer_resources")
    @classmethod
    def _extra_ray_resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if not name or not name.strip():
                raise ValueError("resource names must be non-empty")
            if name in _RESERVED_RESOURCES:
                raise ValueError(f"{name!r} is not an extra resource: CPUs and GPUs come from use_gpu, num_workers "
                                 f"and engine_tensor_parallel_size, memory is not reserved; name custom resources")
            if not amount > 0:
                raise ValueError(f"resource {name!r} must ask for an amount > 0, got {amount!r}")
            if round(amount, 4) != amount:
                raise ValueError(f"resource {name!r}: Ray counts resources in steps of 0.0001, got {amount!r}")
        return value

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_unit_interval(cls, value: tuple[float, float]) -> tuple[float, float]:
        for k, beta in enumerate(value):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"AdamW beta {k + 1} must be in [0, 1), got {beta!r}")
        return value

    @model_validator(mode="after")
    def _check_ranges(self) -> "RLCRConfig":
        if self.task_min_count > self.task_max_count:
            raise ValueError("task_min_count must be <= task_max_count")
        for name in ("task_num_range", "task_target_range"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name} must be (low, high) with low <= high, got {(lo, hi)}")
        if self.task_num_range[0] < 1:
            raise ValueError("task_num_range must hold positive numbers")
        if self.task_num_range[1] > MAX_TASK_NUMBER or max(map(abs, self.task_target_range)) > MAX_TASK_NUMBER:
            raise ValueError(f"task_num_range and task_target_range must lie within ±{MAX_TASK_NUMBER} (the longest "
                             "number the scorer reads)")
        if self.fsdp and not self.use_gpu:
            raise ValueError("fsdp requires use_gpu")
        if self.engine_block_size is not None and not self.use_gpu and self.engine_block_size % 32:
            raise ValueError(f"engine_block_size must be a multiple of 32 for vLLM's CPU backend (use_gpu false), "
                             f"got {self.engine_block_size}")
        if self.train_tasks is None and self.prompts_per_iteration > self.num_train_tasks:
            raise ValueError(f"prompts_per_iteration ({self.prompts_per_iteration}) must be <= num_train_tasks "
                             f"({self.num_train_tasks}): an iteration's prompts are distinct training tasks")
        return self

    # ------------------------------------------------------------------ helpers
    def config_hash(self) -> str:
        """Stable short hash of the settings (recorded in each iteration's manifest)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> "RLCRConfig":
        try:
            return cls.model_validate(dict(data))
        except ValidationError as e:
            raise ConfigError(_describe(e, source)) from None

    @classmethod
    def from_yaml(
        cls, path: str | Path | None = None, overrides: Mapping[str, Any] | Sequence[str] | None = None
    ) -> "RLCRConfig":
        """Load a YAML file (or defaults if None) and apply overrides (``{"k": v}`` or ``["k=v", …]``).

        The file is bounded (:data:`MAX_CONFIG_BYTES`, UTF-8, nesting :data:`~rlcr.untrusted.MAX_DEPTH`, no
        anchors or aliases), as is each override (:data:`MAX_OVERRIDE_CHARS`); anything else is a one-line
        :class:`ConfigError` naming the file or the override."""
        data: dict[str, Any] = {}
        source = "config"
        if path is not None:
            source = printable(path)
            loaded = safe_yaml(_read_config_text(path), source)
            if loaded is None:
                loaded = {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"{source}: expected a mapping of field: value, got {type(loaded).__name__}")
            data.update(loaded)
        data.update(_parse_overrides(overrides))
        return cls.from_dict(data, source=source)


def _read_config_text(path: str | Path) -> str:
    """The text of a config file: at most :data:`MAX_CONFIG_BYTES`, UTF-8; else a :class:`ConfigError`."""
    name = printable(path)
    try:
        with open(Path(path).expanduser(), "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{name}: config file not found") from None
    except OSError as e:
        reason = printable(e.strerror or type(e).__name__)
        raise ConfigError(f"{name}: cannot read the config file ({reason})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name}: more than the {MAX_CONFIG_BYTES:,} bytes a config file may hold")
    try:
        return decode_text(data, name)
    except InvalidInput as e:
        raise ConfigError(str(e)) from None


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses anchors and aliases (no exponential expansion: "billion laughs") and
    collections nested deeper than :data:`~rlcr.untrusted.MAX_DEPTH`, block or flow style alike. Both are
    checked in the composer, as each node starts, before it is built: the constructor never recurses
    further than that."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(None, None, "anchors and aliases (& and *) are not allowed",
                                              event.start_mark)
        if not isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _yaml_reason(e: Exception) -> str:
    """One line for a YAML error: the problem and where (PyYAML's own message spans several lines)."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return printable(" ".join(str(e.problem or e.context or "invalid YAML").split()), 160) + where
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return printable(" ".join(str(e).split()) or type(e).__name__, 160)


class _YAMLProblem(ValueError):
    """A YAML text was refused; the message is the one-line reason."""


def _load_yaml(text: str) -> Any:
    """Parse YAML text from outside with :class:`_BoundedLoader`, or raise :class:`_YAMLProblem` (one line) for
    invalid YAML, anchors or aliases, too deep nesting, or a value Python will not build (an integer beyond
    its int-string limit)."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 — a SafeLoader subclass
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError) as e:
        raise _YAMLProblem(_yaml_reason(e)) from None


def safe_yaml(text: str, source: str) -> Any:
    """:func:`_load_yaml`, or a :class:`ConfigError` naming ``source``."""
    try:
        return _load_yaml(text)
    except _YAMLProblem as e:
        raise ConfigError(f"{source}: not valid YAML ({e})") from None


def _parse_overrides(overrides: Mapping[str, Any] | Sequence[str] | None) -> dict[str, Any]:
    if overrides is None:
        return {}
    if isinstance(overrides, Mapping):
        return dict(overrides)
    out: dict[str, Any] = {}
    for item in overrides:
        shown = printable(repr(item), 120)
        if "=" not in item:
            raise ConfigError(f"override {shown}: expected field=value")
        if len(item) > MAX_OVERRIDE_CHARS:
            raise ConfigError(f"override {shown}: longer than the {MAX_OVERRIDE_CHARS:,} characters allowed")
        key, raw = item.split("=", 1)
        key = key.strip()
        try:
            out[key] = _load_yaml(raw) if raw.strip() else None
        except _YAMLProblem as e:
            raise ConfigError(f"override {shown}: the value of {printable(repr(key), 80)} is not valid YAML "
                              f"({e})") from None
    return out


def _describe(error: ValidationError, source: str) -> str:
    """One line per validation error (the first :data:`_MAX_ERRORS`), joined by ``; ``; field names and the
    values that failed are shown bounded and without control characters (they come from the file)."""
    lines = []
    errors = error.errors()
    for err in errors[:_MAX_ERRORS]:
        loc = printable(".".join(str(p) for p in err["loc"]), 80)
        msg = printable(err["msg"], 300)
        if not loc:  # a check across fields: its message names them
            lines.append(f"{source}: {msg}")
        elif err["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown field '{loc}'")
        else:
            got = err.get("input")
            got_text = "" if isinstance(got, dict) else f" (got {_bounded_repr(got)})"
            lines.append(f"{source}: field '{loc}': {msg}{got_text}")
    if len(errors) > _MAX_ERRORS:
        lines.append(f"and {len(errors) - _MAX_ERRORS} more errors")
    return "; ".join(lines)


def _bounded_repr(value: Any, limit: int = 80, depth: int = 0) -> str:
    """``repr(value)`` in at most ``limit`` characters, built in time bounded by ``limit`` (a value from a file
    may be a long string or a large collection): long strings are cut, collections show a few items."""
    if isinstance(value, str):
        extra = len(value) - limit
        text = printable(repr(value[:limit]), 4 * limit + 2)
        return text + (f"… ({extra} more characters)" if extra > 0 else "")
    if isinstance(value, (list, tuple, dict)):
        items = list(value.items())[:4] if isinstance(value, dict) else list(value[:4])
        if depth >= 2 or not items:
            inner = "…" if value else ""
        elif isinstance(value, dict):
            inner = ", ".join(f"{_bounded_repr(k, 20, depth + 1)}: {_bounded_repr(v, 20, depth + 1)}" for k, v in items)
        else:
            inner = ", ".join(_bounded_repr(v, 20, depth + 1) for v in items)
        more = f", … ({len(value)} items)" if len(value) > len(items) else ""
        opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
        return printable(opening + inner + more + closing, limit + 30)
    return printable(repr(value), limit)


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | Sequence[str] | None = None) -> RLCRConfig:
    """Shorthand for :meth:`RLCRConfig.from_yaml`."""
    return RLCRConfig.from_yaml(path, overrides)


# Fields that cannot change a run's results (rollouts, updates, checkpoints, evaluation numbers): where it
# runs and is stored, how long, how failures are retried, what is displayed, how often it is evaluated
# (every sample has its own request seed, so an evaluation between iterations leaves the rollouts
# unchanged), the probe's settings (the probe reads checkpoints; it does not train) and the warm-start's
# ``sft_*`` settings (the training flow never reads them; the warm-start's checkpoint enters a run as
# ``model``, which is result-changing). A resume may change them. Every other field is result-changing,
# conservatively so: e.g. ``rollout_batch_size`` (batching moves log-probs by float rounding, ~1e-6),
# ``micro_batch_tokens``/``num_workers`` (floating-point reduction order) and the ``engine_*`` settings
# (scheduling and kernels) change the numbers even where they do not change the method. The placement
# fields (``engine_resources``, ``trainer_resources``, ``storage_shared``) choose nodes, not kernels or batches.
OPERATIONAL_FIELDS: frozenset[str] = frozenset({
    "run_id", "storage_uri", "s3_endpoint_url", "storage_shared", "engine_resources", "trainer_resources",
    "engine_release_during_update",
    "iterations",
    "retries", "retry_delay_s", "rollout_progress", "eval_every", "save_every",
    "probe_samples", "probe_truncation", "probe_forced_answer_tokens", "probe_cron",
    "sft_tasks", "sft_epochs", "sft_learning_rate", "sft_batch_size", "sft_lr_schedule", "sft_warmup_steps",
    "sft_single_turn",
    "tracking", "tracking_uri", "tracking_ui_url", "tracking_timeout_s",
})


def result_changing_diff(saved: Mapping[str, Any], current: RLCRConfig) -> list[str]:
    """Sorted names of the fields whose value in ``current`` differs from ``saved`` and can change results.

    ``saved`` is a run's recorded config, ``RLCRConfig.model_dump(mode="json")`` (a ``{"config": …,
    "config_hash": …}`` record is unwrapped). Values are compared in that JSON form. Fields in
    :data:`OPERATIONAL_FIELDS` are ignored. A field missing from ``saved`` (added after the run started)
    counts as unchanged when ``current`` holds its default, which reproduces the older behaviour; a key
    of ``saved`` that is no field any more is ignored (the current code cannot honour it either way).
    """
    if "config" in saved and "config_hash" in saved and isinstance(saved["config"], Mapping):
        saved = saved["config"]
    now = current.model_dump(mode="json")
    diff = []
    for name, field in type(current).model_fields.items():
        if name in OPERATIONAL_FIELDS:
            continue
        if name in saved:
            if saved[name] != now[name]:
                diff.append(name)
        elif getattr(current, name) != field.get_default(call_default_factory=True):
            diff.append(name)
    return sorted(diff)
