"""The update on Ray Train: ``TorchTrainer`` + ``train_loop_per_worker`` (SPEC §2, §7).

A thin layer over :func:`rlcr.train.update.train_update`:

* every worker loads the policy (and, when β > 0, a frozen reference model) from
  a checkpoint URI (local or ``s3://``), wraps it with ``prepare_model`` (DDP, or
  FSDP with ``cfg.fsdp`` on GPUs; gloo on CPU, NCCL on GPU);
* it reads the rollout dataset through ``get_dataset_shard("train")``. The
  dataset is deliberately *not* split by Ray (``DataConfig(datasets_to_split=[])``):
  Ray's split is ``equal=True``, which drops rows when their number is not a
  multiple of the worker count. Instead every worker reads the rows (token ids:
  small) into one global order and processes its own part of each mini-batch,
  so the mini-batches — and the update — do not depend on the number of workers;
* rank 0 writes the new checkpoint to
  ``<storage_uri>/runs/<run_id>/iter-<k>/checkpoint/`` with
  :func:`rlcr.train.checkpoint.save_checkpoint` through
  :class:`rlcr.storage.Store` (sealed with ``_COMPLETE``) and reports its URI and
  the metrics. Ray Train's own ``storage_path`` is a temporary local directory for
  its bookkeeping only; it is not the artifact store.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from rlcr.config import RLCRConfig
from rlcr.seeds import update_seed
from rlcr.storage import Store, fetch_checkpoint, iteration_prefix
from rlcr.train.batching import prepare_samples
from rlcr.train.checkpoint import save_checkpoint
from rlcr.train.update import CompletionLogProbs, train_update

__all__ = ["UpdateResult", "run_update", "checkpoint_rel", "train_loop_per_worker", "load_policy"]

RESULT_FILE = "update_result.json"
WORKER_START_ATTEMPTS = 5
"""Ray Train waits ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` (60 s) per attempt to place its workers and, by
default, retries forever (seen here after an OOM kill left the cluster short): the update gives up after this
many attempts (≈ 5 min) and fails, so the flow's task retry — or the user — takes over."""


@dataclass
class UpdateResult:
    checkpoint_uri: str
    metrics: dict[str, Any] = field(default_factory=dict)


def checkpoint_rel(run_id: str, iteration: int) -> str:
    """Path of an iteration's checkpoint inside the store."""
    return f"{iteration_prefix(run_id, iteration)}/checkpoint"


def load_policy(uri: str, cfg: RLCRConfig, *, device: torch.device | str = "cpu"):
    """(tokenizer, causal LM in float32 on ``device``) from a checkpoint URI (local or s3://)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = fetch_checkpoint(uri, endpoint_url=cfg.s3_endpoint_url)
    tokenizer = AutoTokenizer.from_pretrained(local)
    lm = AutoModelForCausalLM.from_pretrained(local, dtype=torch.float32).to(device)
    return tokenizer, lm


def _fetch_first_on_local_rank0(uri: str, cfg: RLCRConfig) -> None:
    """Download a remote checkpoint once per node before the others read the cache."""
    import ray.train
    import torch.distributed as dist

    if ray.train.get_context().get_local_rank() == 0:
        fetch_checkpoint(uri, endpoint_url=cfg.s3_endpoint_url)
    if dist.is_initialized():
        dist.barrier()


def _full_state_dict(model) -> dict[str, torch.Tensor]:
    """FSDP: gather the full (CPU) state dict of the wrapped CompletionLogProbs on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k.removeprefix("lm."): v for k, v in sd.items()}


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train worker: load → update → (rank 0) checkpoint → report."""
    import ray.train
    import ray.train.torch
    from ray.train import Checkpoint

    cfg = RLCRConfig.model_validate(config["cfg"])
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.seed)
    if device.type == "cpu":
        # Ray pins OMP_NUM_THREADS=1 per worker; give each worker its share of this node's cores.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, ctx.get_local_world_size())))

    _fetch_first_on_local_rank0(config["policy_uri"], cfg)
    tokenizer, lm = load_policy(config["policy_uri"], cfg, device=device)
    policy = CompletionLogProbs(lm)
    ref = None
    if cfg.kl_coef > 0:
        ref_uri = config["ref_uri"]
        _fetch_first_on_local_rank0(ref_uri, cfg)
        _, ref_lm = load_policy(ref_uri, cfg, device=device)
        ref = CompletionLogProbs(ref_lm.eval().requires_grad_(False))
    model = ray.train.torch.prepare_model(policy, parallel_strategy="fsdp" if cfg.fsdp else "ddp")

    rows = list(ray.train.get_dataset_shard("train").iter_rows())
    samples = prepare_samples(rows, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    metrics = train_update(
        model, samples, cfg, pad_id=pad_id, ref=ref, rank=rank, world_size=world_size,
        seed=update_seed(cfg.seed, int(config["iteration"])),
    )

    state_dict = _full_state_dict(model) if cfg.fsdp else None  # a collective: all ranks
    with tempfile.TemporaryDirectory(prefix="rlcr-report-") as d:
        checkpoint = None
        if rank == 0:
            store = Store(cfg.storage_uri, endpoint_url=cfg.s3_endpoint_url)
            meta = {k: v for k, v in metrics.items() if k != "history"}
            meta.update(run_id=config["run_id"], iteration=config["iteration"], parent=config["policy_uri"])
            uri = save_checkpoint(lm, tokenizer, store, checkpoint_rel(config["run_id"], config["iteration"]),
                                  state_dict=state_dict, extra=meta)
            with open(os.path.join(d, RESULT_FILE), "w") as f:
                json.dump({"checkpoint_uri": uri, "metrics": metrics}, f, default=float)
            checkpoint = Checkpoint.from_directory(d)
        flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        ray.train.report(flat, checkpoint=checkpoint)


def _as_dataset(rollouts):
    import ray.data

    if isinstance(rollouts, ray.data.Dataset):
        return rollouts
    rows = list(rollouts)
    if not rows:
        raise ValueError("run_update: no rollout rows")
    return ray.data.from_items(rows)


def _check_workers_fit(cfg: RLCRConfig) -> None:
    """Fail at once, naming the shortfall, when the cluster cannot hold the trainer workers: Ray Train
    would otherwise wait for them forever (it retries its placement-group start without end)."""
    import ray

    from rlcr.cluster import ResourceError, trainer_worker_resources

    total = ray.cluster_resources()
    for res, per_worker in trainer_worker_resources(cfg).items():
        need = per_worker * cfg.num_workers
        if need > float(total.get(res, 0.0)) + 1e-9:
            raise ResourceError(f"the update asks for {cfg.num_workers} worker(s) × {per_worker:g} {res} = {need:g} "
                                f"{res} but the cluster has {float(total.get(res, 0.0)):g} (num_workers, use_gpu)")


def run_update(
    cfg: RLCRConfig,
    rollouts,
    *,
    policy_uri: str,
    run_id: str,
    iteration: int,
    ref_uri: str | None = None,
) -> UpdateResult:
    """One masked GRPO update on Ray Train; returns the new checkpoint's URI and the metrics.

    ``rollouts``: a ``ray.data.Dataset`` or a list of rows (``ROLLOUT_SCHEMA``),
    answers and confidences together, advantages assigned. ``ref_uri``: the frozen
    reference model for β > 0 (default: the initial policy ``cfg.model``). Raises
    ``ray.train.TrainingFailedError`` if a worker fails.
    """
    from ray.train import DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if cfg.kl_coef > 0 and ref_uri is None:
        from rlcr.models import resolve_model

        ref_uri = resolve_model(cfg.model)  # the frozen initial policy
    ray_storage = tempfile.mkdtemp(prefix="rlcr-raytrain-")
    try:
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={
                "cfg": cfg.model_dump(mode="json"), "policy_uri": policy_uri, "ref_uri": ref_uri,
                "run_id": run_id, "iteration": int(iteration),
            },
            scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu),
            run_config=RunConfig(name=f"update-{run_id}-{iteration}-{uuid.uuid4().hex[:8]}", storage_path=ray_storage,
                                 failure_config=FailureConfig(max_failures=0,
                                                              controller_failure_limit=WORKER_START_ATTEMPTS - 1)),
            datasets={"train": _as_dataset(rollouts)},
            dataset_config=DataConfig(datasets_to_split=[]),
        )
        _check_workers_fit(cfg)
        result = trainer.fit()
        with result.checkpoint.as_directory() as d:
            with open(os.path.join(d, RESULT_FILE)) as f:
                payload = json.load(f)
    finally:
        shutil.rmtree(ray_storage, ignore_errors=True)
    return UpdateResult(checkpoint_uri=payload["checkpoint_uri"], metrics=payload["metrics"])
