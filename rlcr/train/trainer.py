"""The update on Ray Train: one ``TorchTrainer`` whose workers live for a whole flow run (docs/design.md §1, §8).

:class:`PolicyTrainer` starts the workers once — each loads the policy (and, for
β > 0, the frozen reference), wraps it with ``prepare_model`` (DDP; FSDP with
``cfg.update.fsdp`` on GPUs; gloo on CPU, NCCL on GPU) and builds the run's one AdamW —
and then serves commands from the driver through Ray queues (one inbox per rank,
one shared outbox):

* ``update``: the iteration's rows arrive as an object-store reference; every
  rank runs :func:`rlcr.train.update.train_update` with the *same* optimizer and
  LR-schedule position as the previous iteration (AdamW's moments carry over), and
  rank 0 puts the new full state dict in Ray's object store for the engines
  (weight sync in memory: no checkpoint on the artifact store);
* ``save``: rank 0 writes the full training state — weights (safetensors, what
  vLLM and transformers load), ``training_state.pt`` (AdamW state, schedule
  position, RNG) and the tokenizer — sealed, to the artifact store
  (:func:`rlcr.train.checkpoint.save_checkpoint`); a trainer started from such a
  checkpoint with ``restore=True`` continues exactly where it stopped;
* ``stop``.

Rows are not split by Ray: every rank reads all of them (token ids: small) in one
global order and processes its own part of each mini-batch, so the update does not
depend on the number of workers. If a worker dies, ``fit()`` ends (``max_failures=0``)
and the driver's next request raises :class:`TrainerLost`; :meth:`PolicyTrainer.ensure_running`
restarts the workers from the last saved state when nothing unsaved would be lost,
and otherwise raises :class:`StateLost` so the flow can rewind to that state.

:func:`run_update` is the standalone form (start, one update, save, stop) used by
``rlcr sft`` and the tests.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from rlcr.config import RLCRConfig
from rlcr.seeds import update_seed
from rlcr.storage import Store, fetch_checkpoint, iteration_prefix
from rlcr.train.batching import prepare_samples
from rlcr.train.checkpoint import TRAINING_STATE_FILE, NonFiniteError, save_checkpoint
from rlcr.train.update import CompletionLogProbs, Schedule, make_optimizer, train_update

__all__ = [
    "UpdateResult", "PolicyTrainer", "TrainerLost", "StateLost", "run_update", "checkpoint_rel",
    "train_loop_per_worker", "load_policy",
]

log = logging.getLogger(__name__)

WORKER_START_ATTEMPTS = 5
"""Ray Train waits ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` (60 s) per attempt to place its workers and, by
default, retries forever (seen here after an OOM kill left the cluster short): the trainer gives up after this
many attempts (≈ 5 min) and fails, so the flow's task retry — or the user — takes over."""
START_TIMEOUT_S = 900.0
"""Longest wait for the workers to load the model and report ready (placement attempts included)."""
UPDATE_TIMEOUT_S = 4 * 3600.0
"""Longest wait for one update; a dead worker is noticed within seconds (``fit()`` ends), this bounds a hang."""
SAVE_TIMEOUT_S = 3600.0
"""Longest wait for one save of the training state."""
STOP_TIMEOUT_S = 120.0


def _brief(error: BaseException | None) -> str:
    """The gist of Ray Train's (long) failure report: its first lines that name the error."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    keep = [ln for ln in lines if "Error" in ln or "died" in ln or "killed" in ln][:3] or lines[:2]
    return " | ".join(keep)[:600]


class TrainerLost(RuntimeError):
    """The trainer's workers are gone (a worker died or failed); the in-memory state went with them."""


class StateLost(TrainerLost):
    """The trainer died holding updates that were never saved: the run must rewind to the last saved state."""


@dataclass
class UpdateResult:
    """An update's metrics and where its weights are: ``weights`` (an ObjectRef to the full state dict,
    for the engines) and/or ``checkpoint_uri`` (a sealed checkpoint, when saved)."""

    metrics: dict[str, Any] = field(default_factory=dict)
    weights: Any = None
    checkpoint_uri: str | None = None


def checkpoint_rel(run_id: str, iteration: int) -> str:
    """Path of an iteration's checkpoint inside the store."""
    return f"{iteration_prefix(run_id, iteration)}/checkpoint"


def load_policy(uri: str, cfg: RLCRConfig, *, device: torch.device | str = "cpu"):
    """(tokenizer, causal LM in float32 on ``device``) from a checkpoint URI (local or s3://)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = fetch_checkpoint(uri, endpoint_url=cfg.storage.s3_endpoint_url)
    tokenizer = AutoTokenizer.from_pretrained(local)
    lm = AutoModelForCausalLM.from_pretrained(local, dtype=torch.float32).to(device)
    return tokenizer, lm


# ----------------------------------------------------------------------------- the worker


def _fetch_first_on_local_rank0(uri: str, cfg: RLCRConfig) -> str:
    """Download a remote checkpoint once per node before the others read the cache; its local path."""
    import ray.train
    import torch.distributed as dist

    if ray.train.get_context().get_local_rank() == 0:
        fetch_checkpoint(uri, endpoint_url=cfg.storage.s3_endpoint_url)
    if dist.is_initialized():
        dist.barrier()
    return str(fetch_checkpoint(uri, endpoint_url=cfg.storage.s3_endpoint_url))


def _full_state_dict(model, lm, cfg: RLCRConfig) -> dict[str, torch.Tensor]:
    """The LM's full state dict with Hugging Face names (FSDP: gathered to CPU on every rank, a collective)."""
    if not cfg.update.fsdp:
        return lm.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k.removeprefix("lm."): v for k, v in sd.items()}


def _optimizer_state(model, optimizer, cfg: RLCRConfig) -> dict:
    if not cfg.update.fsdp:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _restore_training_state(local_dir: str, model, optimizer, schedule: Schedule, cfg: RLCRConfig) -> bool:
    """Load AdamW state, schedule position and RNG saved next to the weights; False if the checkpoint has none."""
    path = os.path.join(local_dir, TRAINING_STATE_FILE)
    if not os.path.exists(path):
        return False
    state = torch.load(path, map_location="cpu", weights_only=False)
    if cfg.update.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state["optimizer"])
    schedule.done, schedule.total = int(state["schedule"]["done"]), int(state["schedule"]["total"])
    torch.set_rng_state(state["rng"]["torch"])
    return True


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train worker for a whole flow run: load once, then serve ``update``/``save``/``stop`` commands."""
    import ray
    import ray.train
    import ray.train.torch

    from rlcr.rollout.engine import pack_weights, resolve_dtype

    cfg = RLCRConfig.model_validate(config["cfg"])
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    inbox, outbox = config["inboxes"][rank], config["outbox"]
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.run.seed)
    if device.type == "cpu":
        # Ray pins OMP_NUM_THREADS=1 per worker; give each worker its share of this node's cores.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, ctx.get_local_world_size())))

    local = _fetch_first_on_local_rank0(config["policy_uri"], cfg)
    tokenizer, lm = load_policy(local, cfg, device=device)
    policy = CompletionLogProbs(lm)
    ref = None
    if cfg.loss.kl_coef > 0:
        _fetch_first_on_local_rank0(config["ref_uri"], cfg)
        _, ref_lm = load_policy(config["ref_uri"], cfg, device=device)
        ref = CompletionLogProbs(ref_lm.eval().requires_grad_(False))
    model = ray.train.torch.prepare_model(policy, parallel_strategy="fsdp" if cfg.update.fsdp else "ddp")
    optimizer = make_optimizer(model, cfg)
    schedule = Schedule.for_run(cfg)
    restored = config["restore"] and _restore_training_state(local, model, optimizer, schedule, cfg)
    if config["restore"] and not restored and rank == 0:
        log.warning("%s holds no training state (written by an older rlcr?): AdamW starts afresh", config["policy_uri"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    outbox.put({"seq": 0, "rank": rank, "restored": bool(restored), "schedule": [schedule.done, schedule.total],
                "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()})

    while True:
        cmd = inbox.get()
        op, reply = cmd["op"], {"seq": cmd["seq"], "rank": rank}
        if op == "stop":
            outbox.put(reply)
            return
        if op == "update":
            rows = ray.get(cmd["rows"][0])
            metrics = train_update(
                model, prepare_samples(rows, tokenizer), cfg, pad_id=pad_id, ref=ref, rank=rank,
                world_size=world_size, seed=update_seed(cfg.run.seed, int(cmd["iteration"])),
                optimizer=optimizer, schedule=schedule,
            )
            metrics["schedule_step"] = schedule.done
            state = _full_state_dict(model, lm, cfg)  # a collective under FSDP: all ranks
            if rank == 0:
                for name, t in state.items():
                    if torch.is_floating_point(t) and not torch.isfinite(t).all():
                        raise NonFiniteError(f"update of iteration {cmd['iteration']}: parameter {name!r} "
                                             f"has non-finite values; the engines keep the previous weights")
                # the engines' copy, in the object store (one copy per node, read zero-copy by the engines), in
                # the engines' dtype: they would round fp32 to bf16 on load anyway, so this halves the bytes on GPU
                engine_dtype = getattr(torch, resolve_dtype(cfg.model.dtype))
                if engine_dtype != torch.float32:
                    state = {k: v.to(engine_dtype) if torch.is_floating_point(v) else v for k, v in state.items()}
                reply["weights"] = [ray.put(pack_weights(state))]
                reply["metrics"] = metrics
        elif op == "save":
            state = _full_state_dict(model, lm, cfg) if cfg.update.fsdp else None  # collectives: all ranks
            training_state = None
            if cmd["with_optimizer"]:
                training_state = {"optimizer": _optimizer_state(model, optimizer, cfg),
                                  "schedule": {"done": schedule.done, "total": schedule.total},
                                  "rng": {"torch": torch.get_rng_state()}, "format": 1}
            if rank == 0:
                store = Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url)
                if cmd.get("fence"):  # the writer's lease, checked again just before the upload
                    from rlcr.runs import LeaseLost, check_fence

                    try:
                        check_fence(store, cmd["fence"])
                    except LeaseLost as e:
                        reply["refused"] = str(e)
                        outbox.put(reply)
                        continue
                reply["uri"] = save_checkpoint(lm, tokenizer, store, cmd["rel"], state_dict=state,
                                               extra=cmd["extra"], training_state=training_state)
        else:
            raise ValueError(f"trainer: unknown command {op!r}")
        outbox.put(reply)


# ----------------------------------------------------------------------------- the driver's handle


def _check_workers_fit(cfg: RLCRConfig) -> None:
    """Fail at once, naming the shortfall, when the cluster cannot hold the trainer workers: Ray Train
    would otherwise wait for them forever (it retries its placement-group start without end)."""
    import ray

    from rlcr.cluster import ResourceError, trainer_worker_resources

    total = ray.cluster_resources()
    for res, per_worker in trainer_worker_resources(cfg).items():
        need = per_worker * cfg.update.num_workers
        if need > float(total.get(res, 0.0)) + 1e-9:
            fields = "update.num_workers, placement.trainer_resources" if res in cfg.placement.trainer_resources else "update.num_workers, update.use_gpu"
            raise ResourceError(f"the update asks for {cfg.update.num_workers} worker(s) × {per_worker:g} {res} = {need:g} "
                                f"{res} but the cluster has {float(total.get(res, 0.0)):g} ({fields})")


def _rows(rollouts) -> list[dict[str, Any]]:
    import ray.data

    rows = rollouts.take_all() if isinstance(rollouts, ray.data.Dataset) else list(rollouts)
    if not rows:
        raise ValueError("update: no rollout rows")
    return rows


class PolicyTrainer:
    """The run's Ray Train workers (model, AdamW, process group), started once and fed every iteration.

    ``policy_uri``: the checkpoint to start from; ``restore``: also load the training state saved with
    it (resuming a run) rather than a fresh AdamW and schedule (a new run from a base or warm-start
    model). ``ref_uri``: the frozen reference for β > 0 (default: ``cfg.model.name``).
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, cfg: RLCRConfig, *, policy_uri: str, restore: bool = False, ref_uri: str | None = None):
        if cfg.loss.kl_coef > 0 and ref_uri is None:
            from rlcr.models import resolve_model

            ref_uri = resolve_model(cfg.model.name)  # the frozen initial policy
        self.cfg, self.ref_uri = cfg, ref_uri
        self.saved_uri, self.saved_restore = policy_uri, restore
        self.unsaved = 0  # updates applied since the state at saved_uri
        self.restored = False
        self.start_s = 0.0  # seconds the last (re)start took
        self.starts = 0  # (re)starts so far
        self.workers: list[dict[str, Any]] = []  # rank, pid, node id of each worker
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._start()

    # ------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
        from ray.util.queue import Queue

        from rlcr.cluster import trainer_worker_resources

        t0 = time.perf_counter()
        _check_workers_fit(self.cfg)
        n = self.cfg.update.num_workers
        self.inboxes = [Queue(actor_options={"num_cpus": 0}) for _ in range(n)]
        self.outbox = Queue(actor_options={"num_cpus": 0})
        self._ray_storage = tempfile.mkdtemp(prefix="rlcr-raytrain-")
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={
                "cfg": self.cfg.model_dump(mode="json"), "policy_uri": self.saved_uri, "restore": self.saved_restore,
                "ref_uri": self.ref_uri, "inboxes": self.inboxes, "outbox": self.outbox,
            },
            scaling_config=ScalingConfig(num_workers=n, use_gpu=self.cfg.update.use_gpu,
                                         resources_per_worker=trainer_worker_resources(self.cfg)),
            run_config=RunConfig(name=f"rlcr-trainer-{uuid.uuid4().hex[:8]}", storage_path=self._ray_storage,
                                 failure_config=FailureConfig(max_failures=0,
                                                              controller_failure_limit=WORKER_START_ATTEMPTS - 1)),
        )
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._fit, args=(trainer,), name="rlcr-trainer", daemon=True)
        self._thread.start()
        self._seq = 0
        ready = self._collect(0, START_TIMEOUT_S, "start")
        self.restored = bool(ready[0]["restored"])
        self.workers = [{"rank": r, "pid": ready[r]["pid"], "node_id": ready[r]["node_id"]} for r in sorted(ready)]
        self.starts += 1
        self.start_s = time.perf_counter() - t0

    def _fit(self, trainer) -> None:
        try:
            trainer.fit()
        except BaseException as e:  # noqa: BLE001 - reported to the waiting driver
            self._error = e
        finally:
            self._done.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    def ensure_running(self) -> bool:
        """Restart dead workers from the last saved state (True if restarted); :class:`StateLost` if they
        died holding unsaved updates (the caller must rewind to :attr:`saved_uri`)."""
        if self.alive:
            return False
        if self.unsaved:
            raise StateLost(f"the trainer died with {self.unsaved} unsaved update(s) after {self.saved_uri}: "
                            f"rewind to it ({_brief(self._error)})")
        log.warning("trainer workers gone (%s); restarting from %s", _brief(self._error), self.saved_uri)
        self._teardown()
        self._start()
        return True

    def restart_from(self, policy_uri: str, *, restore: bool) -> None:
        """Replace the workers with fresh ones loading ``policy_uri`` (a rewind after :class:`StateLost`)."""
        self.close()
        self.saved_uri, self.saved_restore, self.unsaved = policy_uri, restore, 0
        self._start()

    def close(self) -> None:
        """Stop the workers (bounded wait) and release the queues and Ray Train's scratch directory."""
        if self.alive:
            try:
                self._request("stop", STOP_TIMEOUT_S)
            except TrainerLost:
                pass
            self._thread.join(timeout=STOP_TIMEOUT_S)
        self._teardown()

    def _teardown(self) -> None:
        import ray

        for q in [*getattr(self, "inboxes", []), *([self.outbox] if hasattr(self, "outbox") else [])]:
            try:
                ray.kill(q.actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.inboxes = []
        shutil.rmtree(getattr(self, "_ray_storage", ""), ignore_errors=True)

    def __enter__(self) -> "PolicyTrainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ requests
    def _request(self, op: str, timeout_s: float, **payload) -> dict[str, Any]:
        if not self.alive:
            raise TrainerLost(f"trainer: cannot {op}: the workers are gone ({_brief(self._error)})")
        self._seq += 1
        for inbox in self.inboxes:
            inbox.put({"op": op, "seq": self._seq, **payload})
        return self._collect(self._seq, timeout_s, op)[0]

    def _collect(self, seq: int, timeout_s: float, op: str) -> dict[int, dict[str, Any]]:
        """Every rank's reply to request ``seq``; TrainerLost if the workers die, TimeoutError past ``timeout_s``."""
        replies: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        while len(replies) < self.cfg.update.num_workers:
            try:
                r = self.outbox.get(timeout=1.0)
            except queue.Empty:
                if self._done.is_set():
                    raise TrainerLost(f"trainer: the workers died during {op!r}: {self._error}") from self._error
                if time.monotonic() > deadline:
                    raise TimeoutError(f"trainer: no answer to {op!r} within {timeout_s:.0f} s") from None
                continue
            except Exception as e:  # the queue actor itself is gone
                raise TrainerLost(f"trainer: lost its queue during {op!r}: {e}") from e
            if r["seq"] == seq:
                replies[r["rank"]] = r
        return replies

    def update(self, rows, iteration: int) -> UpdateResult:
        """One iteration's masked GRPO update with the run's optimizer; the new weights stay in memory."""
        import ray

        rows_ref = ray.put(_rows(rows))
        r = self._request("update", UPDATE_TIMEOUT_S, rows=[rows_ref], iteration=int(iteration))
        self.unsaved += 1
        metrics = {**r["metrics"], "workers": self.workers, "trainer_starts": self.starts}
        return UpdateResult(metrics=metrics, weights=r["weights"][0])

    def save(self, rel: str, *, extra: dict[str, Any] | None = None, with_optimizer: bool = True,
             fence: dict[str, str] | None = None) -> str:
        """Write the training state (weights, tokenizer; with ``with_optimizer`` AdamW, schedule and RNG),
        sealed, at ``rel`` in ``cfg.storage.uri``; returns its URI. Later rewinds/restarts start from it.
        ``fence``: :meth:`rlcr.runs.RunStore.checkpoint_fence`, checked by rank 0 just before the upload
        (:class:`~rlcr.runs.LeaseLost` if the writer lost its lease)."""
        r = self._request("save", SAVE_TIMEOUT_S, rel=rel, extra=extra or {}, with_optimizer=with_optimizer,
                          fence=fence)
        if r.get("refused"):
            from rlcr.runs import LeaseLost

            raise LeaseLost(r["refused"])
        self.saved_uri, self.saved_restore, self.unsaved = r["uri"], with_optimizer, 0
        return r["uri"]


def run_update(
    cfg: RLCRConfig,
    rollouts,
    *,
    policy_uri: str,
    run_id: str,
    iteration: int,
    ref_uri: str | None = None,
    with_optimizer: bool = False,
) -> UpdateResult:
    """A standalone update on Ray Train (start the workers, one update from a fresh AdamW, save, stop).

    ``rollouts``: a ``ray.data.Dataset`` or a list of rows (``ROLLOUT_SCHEMA``) with advantages assigned.
    Writes the sealed checkpoint at ``runs/<run_id>/iter-<k>/checkpoint``; returns its URI and the metrics.
    """
    rows = _rows(rollouts)
    with PolicyTrainer(cfg, policy_uri=policy_uri, ref_uri=ref_uri) as trainer:
        result = trainer.update(rows, iteration)
        meta = {k: v for k, v in result.metrics.items() if k != "history"}
        meta.update(run_id=run_id, iteration=iteration, parent=policy_uri)
        result.checkpoint_uri = trainer.save(checkpoint_rel(run_id, iteration), extra=meta,
                                             with_optimizer=with_optimizer)
        result.weights = None
    return result
