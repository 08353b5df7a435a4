"""The sections of the run's settings: identity and storage, model, tasks, rollout, method, loss, update and the
format warm-start. The engine, placement, orchestration, tracking, evaluation and probe sections are in
:mod:`rlcr.config.operations`. Each field's docstring documents it; :func:`~rlcr.config.fields.changes` /
:func:`~rlcr.config.fields.operational` mark whether it can change a run's results."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import field_validator, model_validator

from rlcr.config.fields import Section, changes, operational
from rlcr.config.legacy import MOVED_NAMES
from rlcr.seeds import SEED_MODULUS
from rlcr.tasks.limits import DEFAULT_FORMAT_SCORE
from rlcr.untrusted import printable

MAX_SEED = SEED_MODULUS
"""Largest ``run.seed`` / ``tasks.eval_seed`` (2^31 − 1). Every seed derived from them stays in range where it is
used: engine seeds (:func:`rlcr.seeds.rollout_seed` plus a salt) below 2^32 for NumPy, the update's
:func:`rlcr.seeds.mini_batch_seed` of :func:`rlcr.seeds.update_seed` below 2^64 for ``torch.Generator``."""

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
ConfNormMode = Literal["answer", "answer_then_prompt"]
KLType = Literal["k1", "k2", "k3"]
LRSchedule = Literal["constant", "cosine", "linear"]
Method = Literal["rlcr", "rlcr_single", "rlvr"]


def absolute_local_path(value: str | None, *, keep_missing: bool = False) -> str | None:
    """Local paths become absolute: Ray workers run in other working directories. ``keep_missing``: a path that
    does not exist is kept as given (a model name such as ``smollm2-135m-instruct``)."""
    if value is None or "://" in value:
        return value
    try:
        path = Path(value).expanduser()
        if keep_missing and not path.exists():
            return value
        return str(path.resolve())
    except OSError as e:  # a name too long for the filesystem, …: a ValueError names the field
        raise ValueError(f"not a usable local path ({e.strerror or type(e).__name__})") from None


class RunSection(Section):
    """Identity of the run: its name, master seed and length."""

    id: str | None = operational(None)
    """Name of the run; artifacts go to ``<storage.uri>/runs/<run.id>/``. None: derived from the time.
    Operational: may differ on resume."""
    seed: int = changes(0, ge=0, le=MAX_SEED)
    """Master seed, in [0, 2^31 − 1]: task sampling, engine sampling and the update's shuffling derive from it."""
    iterations: int = operational(1, ge=1)
    """Number of RL iterations (rollout → update → eval → commit) to run. Operational: raising it on resume
    extends the run (iteration k does not depend on the total)."""


class StorageSection(Section):
    """Where the run's artifacts go."""

    uri: str = operational("./runs-store")
    """Where checkpoints, rollouts, metrics and probe reports go: a local directory or ``s3://bucket/prefix``.
    Operational: may differ on resume (a moved store)."""
    s3_endpoint_url: str | None = operational(None)
    """Endpoint of an S3-compatible server (MinIO, moto); None uses AWS. Credentials come from the AWS environment.
    Operational: may differ on resume."""

    @field_validator("uri")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return absolute_local_path(value)


class ModelSection(Section):
    """The initial policy."""

    name: str = changes("smollm2-135m-instruct")
    """Initial policy, any Hugging Face causal LM (docs/models.md): a local checkpoint directory or an ``s3://``
    directory (copied once into the store by content), a hub id ``org/name`` (fetched when the hub answers), or
    a name rlcr builds (``smollm2-135m-instruct``, ``tiny``)."""
    chat_template: str | None = changes(None)
    """A Jinja chat template that replaces the tokenizer's (for a model whose tokenizer has none, e.g. a base
    model); None: the tokenizer's own. The run's copy of the model carries it (docs/models.md)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = changes("auto")
    """Weights dtype for generation and training (``auto``: bfloat16 on GPU, float32 on CPU)."""

    @field_validator("name")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return absolute_local_path(value, keep_missing=True)


class TasksSection(Section):
    """The task and its problems: training pool and held-out set (docs/design.md §2, docs/tasks.md)."""

    name: str = changes("countdown")
    """The registered task a run trains and evaluates on (docs/tasks.md: ``countdown``, ``math``): its problems,
    prompts and verifier."""
    field_map: dict[str, str] | None = changes(None)
    """How the task's field names map to the columns of ``tasks.train_file``/``tasks.eval_file`` (math:
    ``{"question": "prompt", "answer": "target"}``); None: the task's own names."""
    train_file: str | None = changes(None)
    """Training task file, read by the task (JSONL, Parquet, or a ``datasets`` directory saved to disk;
    Countdown: fields ``nums``, ``target``); None: generate them. Rows that repeat an earlier row (the task's
    identity: Countdown's numbers as a multiset and target) are dropped, with a warning."""
    eval_file: str | None = changes(None)
    """Held-out task file, read like ``tasks.train_file``; None: generate them with ``tasks.eval_seed``. Rows that
    are training tasks (the same identity) or repeats are dropped, with a warning."""
    num_train: int = changes(1000, ge=1)
    """How many training tasks to draw when ``tasks.train_file`` is None; repeated draws of the same task are kept
    once, so the pool can hold fewer distinct tasks in a small task space."""
    num_eval: int = changes(64, ge=1)
    """How many held-out tasks to generate when ``tasks.eval_file`` is None: distinct, and none a training task."""
    eval_seed: int = changes(1_000_003, ge=0, le=MAX_SEED)
    """Seed of the generated evaluation set, in [0, 2^31 − 1] (kept apart from ``run.seed``; candidates that are
    training tasks are skipped, so the set is fixed across runs with the same training pool)."""
    eval_stratify_counts: bool = changes(True)
    """Generated held-out sets hold each stratum of the task (Countdown: each number count,
    ``tasks.options.min_count`` … ``tasks.options.max_count``) in equal shares, whatever the training pool took.
    Without it the candidates are taken as drawn, and a stratum with a small task space (2 numbers) is scarcer
    among held-out tasks than in training, because the pool already holds much of it: the held-out set is then
    harder than the training distribution. No effect with one stratum or a ``tasks.eval_file``."""
    module: str | None = operational(None)
    """A module that registers the task (docs/tasks.md): a dotted module name (``my_tasks.sumlist``) or the path of
    a ``.py`` file, imported before the task is looked up, in the driver and in every Ray worker (on a cluster it
    travels in the Ray runtime environment). None: the built-in tasks and those of installed packages (entry
    points of group ``rlcr.tasks``). Operational: where the code is found; ``tasks.name`` says which task."""
    options: dict[str, Any] = changes({})
    """The task's own settings, validated by the task's ``Options`` model (unknown or mistyped keys refused);
    holds every option, defaults included, once validated. Countdown: ``min_count``, ``max_count``,
    ``num_range``, ``target_range`` (docs/tasks.md lists each task's options)."""

    @field_validator("train_file", "eval_file")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        return absolute_local_path(value)

    @field_validator("module")
    @classmethod
    def _module_path(cls, value: str | None) -> str | None:
        return absolute_local_path(value) if value is not None and value.endswith(".py") else value

    @field_validator("field_map")
    @classmethod
    def _field_names(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, column in (value or {}).items():
            if not name or not column:
                raise ValueError("field names and columns must be non-empty strings")
        return value

    @model_validator(mode="before")
    @classmethod
    def _moved_names(cls, data: Any) -> Any:
        """A task setting that moved into ``tasks.options`` (``tasks.min_count``) is refused naming its new name."""
        if isinstance(data, dict):
            for old, new in MOVED_NAMES.items():
                if old.split(".", 1)[1] in data:
                    raise ValueError(f"'{old}' is now '{new}': did you mean '{new}'? (a task's own settings are in "
                                     "tasks.options)")
        return data

    @model_validator(mode="after")
    def _task_and_options(self) -> "TasksSection":
        """Import ``tasks.module``, resolve ``tasks.name`` and validate ``tasks.options`` by the task's model."""
        from rlcr.tasks.registry import import_task_module, task_class

        if self.module is not None:
            import_task_module(self.module)
        try:
            task = task_class(self.name)
        except ValueError as e:
            raise ValueError(f"tasks.name: {e}") from None
        options = validate_options(task, self.options)
        if options != self.options:
            object.__setattr__(self, "options", options)  # holds every option, as validated
        return self


def validate_options(task: type, raw: Any) -> dict[str, Any]:
    """``raw`` (``tasks.options``) validated by ``task.Options``: the options as JSON, defaults included; a
    ValueError of one line per problem, naming ``tasks.options.<key>`` (an unknown key: the nearest ones)."""
    from pydantic import ValidationError

    model = task.Options
    try:
        return model.model_validate(dict(raw or {})).model_dump(mode="json")
    except ValidationError as e:
        problems = []
        for err in e.errors()[:5]:
            loc = ".".join(str(p) for p in err["loc"])
            where = f"tasks.options.{loc}" if loc else "tasks.options"
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(str(err["loc"][0]), list(model.model_fields), n=3, cutoff=0.5)
                hint = "; did you mean " + " or ".join(repr(f"tasks.options.{c}") for c in close) + "?" if close else ""
                known = ", ".join(model.model_fields) or "none"
                problems.append(f"unknown field {printable(repr(where), 80)} of task {task.name!r}{hint} (its "
                                f"options: {known})")
            else:
                msg = printable(err["msg"], 200).removeprefix("Value error, ")
                got = err.get("input")
                got = "" if isinstance(got, dict) else f" (got {printable(repr(got), 60)})"
                problems.append(msg if "tasks.options." in msg else f"field {printable(repr(where), 80)}: {msg}{got}")
        raise ValueError("; ".join(problems)) from None


class RolloutSection(Section):
    """Sampling the rollouts (docs/design.md §1, §10)."""

    prompts_per_iteration: int = changes(8, ge=1)
    """P: Countdown prompts sampled per iteration: P distinct training tasks (at most the training pool)."""
    num_generations_answer: int = changes(8, ge=2)
    """G_a: answers sampled per prompt (turn 1). The answer group size for normalisation."""
    num_generations_confidence: int = changes(4, ge=2)
    """G_c: confidences sampled per answer (turn 2), each conditioned on that exact answer. Must be >= 2.
    Only ``method.name: rlcr`` generates them in training."""
    temperature: float = changes(0.7, gt=0.0, le=2.0)
    """Sampling temperature for both turns (RLCR reference: 0.7)."""
    top_p: float = changes(1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold for both turns. Below 1 the tokens are drawn from the truncated, renormalised
    distribution, but the log-probs recorded with them (``completion_logprobs``) stay the untruncated model's
    (vLLM's ``raw_logprobs``, checked at every sampling call), the distribution the trainer computes: the mismatch
    figures and ``loss.tis_cap`` / ``loss.seq_mask_band`` carry no kept-mass factor. The truncation itself, like the
    temperature, is not importance-corrected (docs/design.md §8)."""
    max_prompt_tokens: int = changes(512, ge=16)
    """Longest rendered prompt accepted, turn-2 context included; checked before any Ray work for each first-turn
    prompt and each turn-2 prompt at its longest (an empty answer + ``rollout.max_answer_tokens``): a run whose
    turn 2 may not fit is refused up front."""
    max_answer_tokens: int = changes(256, ge=8)
    """Most tokens generated for a turn-1 answer (reasoning + equation)."""
    max_confidence_tokens: int = changes(64, ge=4)
    """Most tokens generated for a turn-2 confidence (analysis + confidence)."""
    actors: int = changes(1, ge=1)
    """Size of the Ray Data actor pool of each generation stage (each actor owns one engine)."""
    batch_size: int = changes(64, ge=1)
    """Prompts per answer-stage ``map_batches`` call (each call generates ``rollout.batch_size·G_a``
    sequences); a confidence-stage call takes the ``rollout.batch_size·G_a`` answers of one answer call.
    Larger batches keep the engine busier; the measured pipeline/direct ratio drops when calls are small.
    Changes results only by float rounding (batching moves log-probs by ~1e-6), conservatively counted."""
    pipeline_turns: bool = changes(False)
    """Both turns of an answer batch in one engine run: each answer's G_c confidence requests are sent as soon
    as that answer is done, while the other answers still decode (the confidence stage then lays out what was
    sampled). False (default): turn 2 starts after the whole turn-1 batch. Same requests and seeds either way
    (the same tokens in every comparison so far); changes results only by float rounding (the batches differ;
    log-probs move by ~1e-6), conservatively counted. Off by default because on the 2-core CPU it did not
    generate faster at demo scale (``bench/perf/generation.py``: 1.01×, 0.77–1.18, n = 4; docs/iteration-overhead.md);
    unmeasured on GPUs."""
    progress: bool = operational(False)
    """Ray Data's own progress bars while rollouts and evaluations run (off a terminal: a status block in the log
    every few seconds, which buries a flow's log). Off by default; the CLI shows its own progress. Their cost to
    generation is measured side by side in ``bench/perf/rollout.py`` (``pipeline+bars``): within noise on 2 cores.
    Operational."""


class MethodSection(Section):
    """What is trained, its rewards and advantages (docs/design.md §5, §7, §9)."""

    name: Method = changes("rlcr")
    """What is trained. ``rlcr``: two turns, G_a answers then G_c confidences per answer, each conditioned on
    that exact answer; accuracy on answers, Brier on confidences; two-level advantages (docs/design.md §5–§7).
    ``rlcr_single`` (the RLCR paper's): one response holds ``<think>``, ``<answer>`` and ``<confidence>``;
    reward ``acc + λ_conf·(1 − (acc − c)²)``; advantages per prompt; loss from ``<think>`` through
    ``</confidence>``; ``rollout.max_answer_tokens + rollout.max_confidence_tokens`` tokens per response.
    ``rlvr``: the answer turn with the accuracy reward only, no confidence training. Every method states a
    confidence at evaluation (``rlvr``: the turn-2 query of ``rlcr``), so calibration is comparable."""
    format_score: float = changes(DEFAULT_FORMAT_SCORE, ge=0.0, le=1.0)
    """``compute_score`` value for an extracted but wrong equation (accuracy reward is still 0). The one
    source of this value: the rollouts' ``score`` column, the probe and ``compute_score``'s default read it."""
    lambda_ans: float = changes(1.0, ge=0.0)
    """λ_ans: weight of answer advantages when spread onto answer tokens."""
    lambda_conf: float = changes(1.0, ge=0.0)
    """λ_conf: weight of confidence advantages when spread onto confidence tokens."""
    adv_eps: float = changes(1e-6, gt=0.0)
    """ε in ``(r − mean) / (std + ε)``."""
    scale_by_std: bool = changes(True)
    """Divide centred rewards by the group std (False: Dr. GRPO style, centring only; RLCR reference)."""
    conf_norm_mode: ConfNormMode = changes("answer")
    """``answer``: normalise each answer's G_c confidences alone; ``answer_then_prompt``: centre per answer,
    divide by the std of all centred confidence rewards of the prompt (avoids ±1 blow-up for small G_c)."""


class LossSection(Section):
    """The clipped policy-gradient loss (docs/design.md §8)."""

    clip_low: float = changes(0.2, ge=0.0, lt=1.0)
    """ε_low: lower PPO clip, ratio ≥ 1 − ε_low."""
    clip_high: float = changes(0.2, gt=0.0, le=10.0)
    """ε_high: upper PPO clip, ratio ≤ 1 + ε_high (DAPO's clip-higher uses 0.28)."""
    clip_c: float | None = changes(3.0, gt=1.0)
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; None disables it."""
    kl_coef: float = changes(0.0, ge=0.0)
    """β: weight of the per-token KL to the frozen reference model (0: no reference model is loaded)."""
    kl_type: KLType = changes("k3")
    """KL estimator: k1 = logπ − logπ_ref, k2 = ½(logπ − logπ_ref)², k3 = e^d − d − 1 with d = logπ_ref − logπ."""
    entropy_coef: float = changes(0.0, ge=0.0)
    """Weight of the entropy bonus (subtracted from the loss)."""
    agg: LossAgg = changes("token-mean")
    """How per-token losses are reduced: token-mean over the global batch (default), or a per-sequence mode."""
    max_response_len: int | None = changes(None, ge=1)
    """Dr. GRPO normaliser of ``seq-mean-token-sum-norm``; None: max(rollout.max_answer_tokens,
    rollout.max_confidence_tokens)."""
    tis_cap: float | None = changes(None, ge=1.0)
    """Truncated importance sampling against the engine–trainer mismatch (docs/design.md §8): each token's
    policy-gradient term is weighted by min(π_old/μ, C), μ the engine's sampling log-probs, C this cap (≥ 1;
    verl/TRL use ~2). None: off. With ``update.old_logp_source=rollout`` (π_old = μ) every weight is 1: refused.
    μ and π_old are both the untempered, untruncated model's (with ``rollout.top_p`` < 1 too): the weights correct
    the engine's numerics and staleness, not the sampling settings."""
    seq_mask_band: tuple[float, float] | None = changes(None)
    """Sequence-level masking (docs/design.md §8): a sample whose geometric-mean ratio π_old/μ over its masked
    tokens leaves [lo, hi] (0 < lo ≤ 1 ≤ hi, e.g. [0.5, 2]) gets weight 0. None: off. Refused with
    ``update.old_logp_source=rollout``, like ``loss.tis_cap``."""

    @field_validator("seq_mask_band")
    @classmethod
    def _band_around_one(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0.0 < value[0] <= 1.0 <= value[1]:
            raise ValueError(f"must be [lo, hi] with 0 < lo <= 1 <= hi, got {list(value)}")
        return value


class UpdateSection(Section):
    """The policy update on Ray Train: optimizer, schedule, batching, workers (docs/design.md §11)."""

    objective: Literal["grpo", "sft"] = changes("grpo")
    """What the update optimises: the masked GRPO loss (docs/design.md §8), or token-mean NLL of the completions
    (``sft``: the format warm-start, ``rlcr sft``)."""
    learning_rate: float = changes(2e-6, gt=0.0, le=1.0)
    """AdamW learning rate (RLCR reference: 1e-6 … 5e-6)."""
    weight_decay: float = changes(0.0, ge=0.0)
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = changes((0.9, 0.999))
    """AdamW betas, each in [0, 1)."""
    lr_schedule: LRSchedule = changes("constant")
    """Learning-rate schedule over all optimizer steps of the run (``run.iterations × update.epochs_per_iteration
    × update.mini_batches_per_epoch``; for ``rlcr sft``, the steps of its one update), after warm-up. The
    position in the schedule and AdamW's moments carry from one iteration to the next and survive a resume."""
    warmup_steps: int = changes(0, ge=0)
    """Linear warm-up over the first optimizer steps of the run (not of each iteration)."""
    grad_clip: float = changes(1.0, gt=0.0)
    """Max global gradient norm."""
    epochs_per_iteration: int = changes(1, ge=1)
    """Passes over one iteration's rollouts."""
    mini_batches_per_epoch: int = changes(1, ge=1)
    """Optimizer steps per epoch: the rollouts are split into this many mini-batches (1: one on-policy step)."""
    micro_batch_tokens: int = changes(2048, ge=64)
    """Token budget of one forward/backward micro-batch: padded rows × length, or, with
    ``update.share_prefixes``, the nodes of one prefix tree (attention is quadratic in it: ~1–2k on CPU).
    Changes results only by floating-point reduction order, conservatively counted."""
    share_prefixes: bool = changes(True)
    """Pack samples that share a token prefix (a prompt's G_a answers, an answer's G_c confidences and
    their turn-1 prefix) into one prefix tree with a tree attention mask, so each shared prefix is
    computed once (exact: same log-probs as unpacked rows). ``False``: right-padded rows."""
    old_logp_source: Literal["rollout", "recompute"] = changes("recompute")
    """π_old: ``rollout`` uses vLLM's sampling log-probs; ``recompute`` runs the trainer's model once before
    the first step (on-policy exact: same numerics as the update, so the first step's ratio is exactly 1)."""
    num_workers: int = changes(1, ge=1)
    """Ray Train workers (DDP or FSDP ranks). Changes results by floating-point reduction order."""
    use_gpu: bool = changes(False)
    """Train on GPUs (NCCL) instead of CPUs (gloo); the engines then run on GPUs too."""
    fsdp: bool = changes(False)
    """Shard the update with FSDP2 (``fully_shard`` on each decoder layer and the root; the β > 0 reference too:
    ``rlcr/train/fsdp.py``) instead of DDP: each worker keeps 1/``update.num_workers`` of the weights, gradients and
    AdamW moments instead of all of them. On CPUs (gloo) or GPUs (NCCL). The same update as DDP (objective, masks,
    micro-batches, global-norm clipping, LR schedule; tested on CPU: loss and gradient norm within 1e-4, weights
    within float tolerance): changes results by floating-point reduction order only. Checkpoints stay ordinary
    Hugging Face directories (the weights gathered on rank 0, one at a time); AdamW's state is saved by shard (each
    rank its file, torch.distributed.checkpoint, in the checkpoint's ``optimizer/``) and resumes on any number of
    FSDP or DDP workers; a DDP training state resumes under FSDP. Not with ``lora.enabled``."""
    fsdp_param_dtype: Literal["float32", "bfloat16"] = changes("float32")
    """With ``update.fsdp``: the precision the sharded layers are gathered and computed in. ``bfloat16``: FSDP2's
    ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: forward and backward in bf16 (half the bytes
    gathered), gradients reduced in fp32 into the fp32 shards AdamW updates (fp32 master weights). Changes
    results beyond float order (bf16 rounding of weights and activations: on the tiny test model the loss moves
    by ~1e-3 relative); on CPUs without bf16 instructions it is slower, not faster. ``float32``: no mixed precision
    (``update.autocast`` still applies, as under DDP: bf16 on GPUs by default)."""

    autocast: Literal["auto", "bfloat16", "off"] = changes("auto")
    """The update's forward and backward precision over fp32 master weights (the weights, gradients and AdamW
    state stay fp32): ``bfloat16`` runs them under bf16 autocast (matmuls in bf16; RMSNorm and the log-probs
    upcast to fp32; on CPU the prefix-tree attention in fp32 too), ``off`` in fp32. ``auto``: bf16 on a GPU that
    supports it, fp32 on CPU. ``bfloat16`` on CPU pays only where the CPU has bf16 instructions (``avx512_bf16``
    or ``amx_bf16`` in ``lscpu``; elsewhere it is slower and a warning says so); with ``model.dtype: bfloat16``
    the engines sample in bf16 too (docs/update-performance.md: speed and what it does to learning). Changes
    results beyond float order."""

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_unit_interval(cls, value: tuple[float, float]) -> tuple[float, float]:
        for k, beta in enumerate(value):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"AdamW beta {k + 1} must be in [0, 1), got {beta!r}")
        return value

    @model_validator(mode="after")
    def _precision_with_fsdp(self) -> "UpdateSection":
        if self.fsdp_param_dtype != "float32" and not self.fsdp:
            raise ValueError(f"update.fsdp_param_dtype={self.fsdp_param_dtype} is FSDP's mixed precision: it needs "
                             f"update.fsdp")
        return self


class SFTSection(Section):
    """The format warm-start (``rlcr sft``, docs/design.md §14).

    The SFT update (``update.objective: sft``) is one update of the run's update settings (AdamW betas and weight
    decay, grad_clip, micro_batch_tokens, workers) with these in place of the RL ones. Only the warm-start
    (``rlcr sft``, ``rlcr demo``, ``bench/learning.py``) reads them; its checkpoint enters an RL run as
    ``model.name``, which is result-changing: for the RL run they are operational."""

    tasks: int = operational(600, ge=1)
    """Training-pool tasks the warm-start writes solver traces for (two examples each: turn 1 and turn 2);
    at most the pool's distinct solvable tasks. Operational for training."""
    epochs: int = operational(2, ge=1)
    """Passes of the warm-start over its examples. Operational for training."""
    learning_rate: float = operational(1e-4, gt=0.0, le=1.0)
    """AdamW peak learning rate of the warm-start. Operational for training."""
    batch_size: int = operational(8, ge=1)
    """Examples (rows) per optimizer step of the warm-start: each epoch is split into
    ``max(1, rows // sft.batch_size)`` mini-batches. Operational for training."""
    lr_schedule: LRSchedule = operational("cosine")
    """Learning-rate schedule of the warm-start over its own optimizer steps (``sft.epochs`` × mini-batches),
    after warm-up. Operational for training."""
    warmup_steps: int = operational(2, ge=0)
    """Linear warm-up over the warm-start's first optimizer steps. Operational for training."""
    single_turn: bool = operational(False)
    """Also write a one-turn example per task (the ``rlcr_single`` format: trace, answer, check and confidence
    in one response; for a wrong shown answer only the check and confidence carry loss), so that one
    warm-start serves all three methods (``bench/methods.py``). Operational for training."""
