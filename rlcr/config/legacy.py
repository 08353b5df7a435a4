"""The flat layout of the config (rlcr before the sections): its names and a reader for records written in it.

Until the settings were grouped into sections, :class:`~rlcr.config.RLCRConfig` was one flat model
(``temperature``, ``engine_kv_cache_gib``, …) and every run stored its config in that form
(``config.json``: ``{"config": {...}, "config_hash": ...}``). :func:`nested_from_flat` stays so that those
runs still resume and compare (:func:`rlcr.config.result_changing_diff`) and their stored records
(``bench/methods.py``'s runs) still read; :data:`FLAT_NAMES` also lets a flat name given in a YAML file or
override be answered with its new dotted name. Do not remove while stored runs of the flat layout may exist.
"""

from __future__ import annotations

from typing import Any, Mapping

FLAT_NAMES: dict[str, str] = {
    "run_id": "run.id", "seed": "run.seed", "iterations": "run.iterations",
    "storage_uri": "storage.uri", "s3_endpoint_url": "storage.s3_endpoint_url",
    "model": "model.name", "dtype": "model.dtype",
    "task": "tasks.name", "task_fields": "tasks.field_map", "train_tasks": "tasks.train_file",
    "eval_tasks": "tasks.eval_file", "num_train_tasks": "tasks.num_train",
    "num_eval_tasks": "tasks.num_eval", "eval_seed": "tasks.eval_seed",
    "eval_stratify_counts": "tasks.eval_stratify_counts", "task_min_count": "tasks.options.min_count",
    "task_max_count": "tasks.options.max_count", "task_num_range": "tasks.options.num_range",
    "task_target_range": "tasks.options.target_range",
    "prompts_per_iteration": "rollout.prompts_per_iteration",
    "num_generations_answer": "rollout.num_generations_answer",
    "num_generations_confidence": "rollout.num_generations_confidence", "temperature": "rollout.temperature",
    "top_p": "rollout.top_p", "max_prompt_tokens": "rollout.max_prompt_tokens",
    "max_answer_tokens": "rollout.max_answer_tokens", "max_confidence_tokens": "rollout.max_confidence_tokens",
    "rollout_actors": "rollout.actors", "rollout_batch_size": "rollout.batch_size",
    "rollout_progress": "rollout.progress",
    "method": "method.name", "format_score": "method.format_score", "lambda_ans": "method.lambda_ans",
    "lambda_conf": "method.lambda_conf", "adv_eps": "method.adv_eps", "scale_by_std": "method.scale_by_std",
    "conf_norm_mode": "method.conf_norm_mode",
    "clip_low": "loss.clip_low", "clip_high": "loss.clip_high", "clip_c": "loss.clip_c", "kl_coef": "loss.kl_coef",
    "kl_type": "loss.kl_type", "entropy_coef": "loss.entropy_coef", "loss_agg": "loss.agg",
    "max_response_len": "loss.max_response_len",
    "objective": "update.objective", "learning_rate": "update.learning_rate", "weight_decay": "update.weight_decay",
    "adam_betas": "update.adam_betas", "lr_schedule": "update.lr_schedule", "warmup_steps": "update.warmup_steps",
    "grad_clip": "update.grad_clip", "epochs_per_iteration": "update.epochs_per_iteration",
    "mini_batches_per_epoch": "update.mini_batches_per_epoch", "micro_batch_tokens": "update.micro_batch_tokens",
    "share_prefixes": "update.share_prefixes", "old_logp_source": "update.old_logp_source",
    "num_workers": "update.num_workers", "use_gpu": "update.use_gpu", "fsdp": "update.fsdp",
    "sft_tasks": "sft.tasks", "sft_epochs": "sft.epochs", "sft_learning_rate": "sft.learning_rate",
    "sft_batch_size": "sft.batch_size", "sft_lr_schedule": "sft.lr_schedule", "sft_warmup_steps": "sft.warmup_steps",
    "sft_single_turn": "sft.single_turn",
    "engine_gpu_memory_utilization": "engine.gpu_memory_utilization", "engine_kv_cache_gib": "engine.kv_cache_gib",
    "engine_block_size": "engine.block_size", "engine_max_model_len": "engine.max_model_len",
    "engine_tensor_parallel_size": "engine.tensor_parallel_size", "engine_enforce_eager": "engine.enforce_eager",
    "engine_weight_sync": "engine.weight_sync", "engine_release_during_update": "engine.release_during_update",
    "engine_resources": "placement.engine_resources", "trainer_resources": "placement.trainer_resources",
    "storage_shared": "placement.storage_shared",
    "save_every": "orchestration.save_every", "retries": "orchestration.retries",
    "retry_delay_s": "orchestration.retry_delay_s",
    "tracking": "tracking.backend", "tracking_uri": "tracking.uri", "tracking_ui_url": "tracking.ui_url",
    "tracking_timeout_s": "tracking.timeout_s",
    "eval_every": "eval.every", "eval_samples": "eval.samples", "eval_bootstrap_resamples": "eval.bootstrap_resamples",
    "probe_samples": "probe.samples", "probe_truncation": "probe.truncation",
    "probe_forced_answer_tokens": "probe.forced_answer_tokens", "probe_cron": "probe.cron",
}
"""Each field name of the flat layout → its dotted name in the sections."""


MOVED_NAMES: dict[str, str] = {
    "tasks.min_count": "tasks.options.min_count", "tasks.max_count": "tasks.options.max_count",
    "tasks.num_range": "tasks.options.num_range", "tasks.target_range": "tasks.options.target_range",
}
"""Fields of the sections that moved (issue 47: Countdown's own settings into ``tasks.options``) → their new
dotted names. A config that gives an old name is refused naming the new one; a stored run's record that holds
one is read with it moved (:func:`upgraded`)."""


def _put(out: dict[str, Any], dotted: str, value: Any) -> None:
    *path, leaf = dotted.split(".")
    for part in path:
        out = out.setdefault(part, {})
    out[leaf] = value


def upgraded(record: Mapping[str, Any]) -> dict[str, Any]:
    """A nested config record (a copy) with the fields of :data:`MOVED_NAMES` at their new places: a run stored
    before they moved resumes and compares with the same settings."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in record.items()}
    for old, new in MOVED_NAMES.items():
        section, name = old.split(".", 1)
        values = out.get(section)
        if isinstance(values, dict) and name in values:
            value = values.pop(name)
            options = values.get("options")
            values["options"] = options = dict(options) if isinstance(options, Mapping) else {}
            options.setdefault(new.rsplit(".", 1)[1], value)
    return out


def is_flat(record: Mapping[str, Any]) -> bool:
    """Whether a stored config record (the ``config`` of a run's record) is in the flat layout: it holds a flat
    name whose value is not a section (``model: "smollm2…"``, ``seed: 0``; a section's value is a mapping)."""
    return any(key in FLAT_NAMES and not isinstance(value, Mapping) for key, value in record.items())


def nested_from_flat(record: Mapping[str, Any]) -> dict[str, Any]:
    """A config record of the flat layout in the nested one (``{"temperature": 1.0}`` → ``{"rollout":
    {"temperature": 1.0}}``), for stored runs written before the sections; a record already nested is returned
    as a copy. A key that is no flat name (a field removed before the sections) is dropped: neither layout can
    honour it. The mapping is data, not code: it is the one place that knows the old names."""
    if not is_flat(record):
        return upgraded(record)
    out: dict[str, Any] = {}
    for key, value in record.items():
        dotted = FLAT_NAMES.get(key)
        if dotted is not None:
            _put(out, dotted, value)
    return out
