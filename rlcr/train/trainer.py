"""The update on Ray Train: one ``TorchTrainer`` whose workers live for a whole flow run (docs/design.md §11, §12).

:class:`PolicyTrainer` starts the workers once; each builds a :class:`rlcr.train.worker.TrainerWorker` — the
policy (and, for β > 0, the frozen reference) wrapped by ``prepare_model`` (DDP) or sharded with FSDP2
(``cfg.update.fsdp``, :mod:`rlcr.train.fsdp`; gloo on CPU, NCCL on GPU) and the run's one AdamW — and the
driver then calls its methods on every rank (:mod:`rlcr.train.rpc`):

* :meth:`PolicyTrainer.update` → ``TrainerWorker.update``: the iteration's rows arrive as an object-store
  reference; every rank runs :func:`rlcr.train.update.train_update` with the *same* optimizer and LR-schedule
  position as the previous iteration (AdamW's moments carry over), and rank 0 puts the new full state dict in
  Ray's object store for the engines (weight sync in memory, :mod:`rlcr.models.weights`: no checkpoint on the store);
* :meth:`PolicyTrainer.save` → ``TrainerWorker.save``: rank 0 writes the full training state — weights
  (safetensors, what vLLM and transformers load), ``training_state.pt`` (AdamW state, schedule position, RNG)
  and the tokenizer — sealed, to the artifact store (:func:`rlcr.train.checkpoint.save_checkpoint`), after
  checking the writer's lease; a trainer started from such a checkpoint with ``restore=True`` continues
  exactly where it stopped. With ``background=True`` the write runs while the driver goes on and
  :meth:`PolicyTrainer.saved` collects it;
* ``stop``.

Why ``TorchTrainer`` and not one plain Ray actor per rank (verl's and open-instruct's worker groups, whose
methods Ray calls directly): Ray Train places the workers (placement group, ``placement.trainer_resources``, GPUs), sets
up the process group and the device, gives ``prepare_model`` (DDP/FSDP) its context, and ends ``fit()`` the
moment a worker dies (``max_failures=0``), which is how a dead worker is noticed within seconds. Actors would
have to redo all of that by hand. What Ray Train lacks is a way to call into a worker that lives on; the RPC
layer adds exactly that: typed calls of :class:`~rlcr.train.worker.TrainerWorker`'s methods, checked against
their signatures on the driver, one reply per rank.

Rows are not split by Ray: every rank reads all of them (token ids: small) in one
global order and processes its own part of each mini-batch, so the update does not
depend on the number of workers. If a worker dies (or a call raises), ``fit()`` ends
and the driver's pending or next call raises :class:`TrainerLost`; :meth:`PolicyTrainer.ensure_running`
restarts the workers from the last saved state when nothing unsaved would be lost,
and otherwise raises :class:`StateLost` so the flow can rewind to that state.

:func:`run_update` is the standalone form (start, one update, save, stop) used by
``rlcr sft`` and the tests.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rlcr.config import RLCRConfig
from rlcr.runs.layout import RunLayout
from rlcr.train.rpc import WorkerGroup, WorkerGroupLost
from rlcr.train.throughput import autocast_warning
from rlcr.train.worker import TrainerWorker, load_policy, train_loop_per_worker

__all__ = [
    "UpdateResult", "PolicyTrainer", "TrainerLost", "StateLost", "run_update",
    "train_loop_per_worker", "load_policy",
]

log = logging.getLogger(__name__)

WORKER_START_ATTEMPTS = 5
"""Ray Train waits ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` (60 s) per attempt to place its workers and, by
default, retries forever (seen here after an OOM kill left the cluster short): the trainer gives up after this
many attempts (≈ 5 min) and fails, so the flow's task retry — or the user — takes over."""
START_TIMEOUT_S = 900.0
"""Longest wait for the workers to load the model and answer their first call (placement attempts included)."""
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
    """An update's metrics and where its weights are: ``weights`` (for the engines, in Ray's object store:
    :class:`~rlcr.models.weights.WeightBuckets`, or a LoRA run's adapters) and/or ``checkpoint_uri`` (a sealed
    checkpoint, when saved)."""

    metrics: dict[str, Any] = field(default_factory=dict)
    weights: Any = None
    checkpoint_uri: str | None = None


# ----------------------------------------------------------------------------- the driver's handle


def _check_workers_fit(cfg: RLCRConfig) -> None:
    """Fail at once, naming the shortfall, when the cluster cannot hold the trainer workers: Ray Train
    would otherwise wait for them forever (it retries its placement-group start without end)."""
    import ray

    from rlcr.runs.cluster import ResourceError, trainer_worker_resources

    total = ray.cluster_resources()
    for res, per_worker in trainer_worker_resources(cfg).items():
        need = per_worker * cfg.update.num_workers
        if need > float(total.get(res, 0.0)) + 1e-9:
            fields = ("update.num_workers, placement.trainer_resources" if res in cfg.placement.trainer_resources
                      else "update.num_workers, update.use_gpu")
            raise ResourceError(f"the update asks for {cfg.update.num_workers} worker(s) × {per_worker:g} {res} = "
                                f"{need:g} {res} but the cluster has {float(total.get(res, 0.0)):g} ({fields})")


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
        if cfg.loss.kl_coef > 0 and ref_uri is None and not cfg.lora.enabled:  # LoRA: the frozen base is π_ref
            from rlcr.models.source import import_model
            from rlcr.storage import Store

            store = Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url)
            ref_uri = import_model(cfg.model.name, store, chat_template=cfg.model.chat_template)  # the initial policy
        if (warning := autocast_warning(cfg)) is not None:
            log.warning("%s", warning)
        self.cfg, self.ref_uri = cfg, ref_uri
        self.saved_uri, self.saved_restore = policy_uri, restore
        self.unsaved = 0  # updates applied since the state at saved_uri
        self.restored = False
        self.start_s = 0.0  # seconds the last (re)start took
        self.starts = 0  # (re)starts so far
        self.workers: list[dict[str, Any]] = []  # rank, pid, node id of each worker
        self._group: WorkerGroup | None = None
        self._thread: threading.Thread | None = None
        self._pending: tuple[bool, int] | None = None  # a background save: (with_optimizer, updates it covers)
        self._start()

    # ------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from rlcr.runs.cluster import trainer_runtime_env, trainer_worker_resources

        t0 = time.perf_counter()
        _check_workers_fit(self.cfg)
        n = self.cfg.update.num_workers
        self._error: BaseException | None = None
        self._pending = None  # fresh workers hold no background save
        self._done = threading.Event()
        self._group = WorkerGroup(TrainerWorker, n, alive=lambda: not self._done.is_set())
        self._ray_storage = tempfile.mkdtemp(prefix="rlcr-raytrain-")
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={
                "cfg": self.cfg.model_dump(mode="json"), "policy_uri": self.saved_uri, "restore": self.saved_restore,
                "ref_uri": self.ref_uri, "inboxes": self._group.inboxes, "outbox": self._group.outbox,
            },
            scaling_config=ScalingConfig(num_workers=n, use_gpu=self.cfg.update.use_gpu,
                                         resources_per_worker=trainer_worker_resources(self.cfg)),
            run_config=RunConfig(name=f"rlcr-trainer-{uuid.uuid4().hex[:8]}", storage_path=self._ray_storage,
                                 failure_config=FailureConfig(max_failures=0,
                                                              controller_failure_limit=WORKER_START_ATTEMPTS - 1),
                                 worker_runtime_env=trainer_runtime_env(self.cfg)),
        )
        self._thread = threading.Thread(target=self._fit, args=(trainer,), name="rlcr-trainer", daemon=True)
        self._thread.start()
        try:  # the first call waits for every rank to load the model (and restore): the start's timeout
            infos = self._call("describe", START_TIMEOUT_S)
        except BaseException:
            self._teardown()
            raise
        self.restored = infos[0].restored
        self.workers = [{"rank": i.rank, "pid": i.pid, "node_id": i.node_id} for i in infos]
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
                self._call("stop", STOP_TIMEOUT_S)
            except TrainerLost:
                pass
            self._thread.join(timeout=STOP_TIMEOUT_S)
        self._teardown()

    def _teardown(self) -> None:
        if self._group is not None:
            self._group.close()
        shutil.rmtree(getattr(self, "_ray_storage", ""), ignore_errors=True)

    def __enter__(self) -> "PolicyTrainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ calls on the workers
    def _call(self, method: str, timeout_s: float, **kwargs) -> list[Any]:
        """:meth:`TrainerWorker.<method> <rlcr.train.worker.TrainerWorker>` on every rank (:mod:`rlcr.train.rpc`);
        the return values by rank. :class:`TrainerLost` if the workers are or go away, TimeoutError past
        ``timeout_s``."""
        if not self.alive:
            raise TrainerLost(f"trainer: cannot {method}: the workers are gone ({_brief(self._error)})")
        try:
            return self._group.call(method, timeout_s, **kwargs)
        except WorkerGroupLost as e:
            raise TrainerLost(f"trainer: {e}: {self._error}") from (self._error or e)

    def update(self, rows, iteration: int) -> UpdateResult:
        """One iteration's masked GRPO update with the run's optimizer; the new weights stay in memory."""
        import ray

        out = self._call("update", UPDATE_TIMEOUT_S, rows=ray.put(_rows(rows)), iteration=int(iteration))[0]
        self.unsaved += 1
        metrics = {**out.metrics, "workers": self.workers, "trainer_starts": self.starts}
        return UpdateResult(metrics=metrics, weights=out.weights)

    def save(self, rel: str, *, extra: dict[str, Any] | None = None, with_optimizer: bool = True,
             fence: dict[str, str] | None = None, background: bool = False) -> str | None:
        """Write the training state (weights, tokenizer; with ``with_optimizer`` AdamW, schedule and RNG),
        sealed, at ``rel`` in ``cfg.storage.uri``; returns its URI. Later rewinds/restarts start from it.
        ``fence``: :meth:`rlcr.runs.store.RunStore.checkpoint_fence`, checked by rank 0 just before the upload
        (:class:`~rlcr.runs.store.LeaseLost` if the writer lost its lease). ``background``: rank 0 writes while the
        caller goes on; returns None, and :meth:`saved` gives the URI (the next :meth:`update` waits for the
        write, so it writes the state of this call)."""
        out = self._call("save", SAVE_TIMEOUT_S, rel=rel, extra=extra or {}, with_optimizer=with_optimizer,
                         fence=fence, background=background)[0]
        if background:
            self._pending = (with_optimizer, self.unsaved)
            return None
        return self._saved(out, with_optimizer, self.unsaved)

    def saved(self) -> tuple[str, float]:
        """Wait for the background save started last: (its URI, the seconds its write took). LeaseLost if the
        lease was lost before it wrote; :class:`TrainerLost` if the workers died (the flow then rewinds)."""
        if self._pending is None:
            raise RuntimeError("trainer: no background save to wait for")
        with_optimizer, covered = self._pending
        self._pending = None
        out = self._call("saved", SAVE_TIMEOUT_S)[0]
        return self._saved(out, with_optimizer, covered), out.write_s

    def _saved(self, out, with_optimizer: bool, covered: int) -> str:
        if out.refused:
            from rlcr.runs.store import LeaseLost

            raise LeaseLost(out.refused)
        # updates applied after the save started are not in it
        self.saved_uri, self.saved_restore, self.unsaved = out.uri, with_optimizer, self.unsaved - covered
        return out.uri


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

    ``rollouts``: a ``ray.data.Dataset`` or a list of rows (``rollout_schema(task)``) with advantages assigned.
    Writes the sealed checkpoint at ``runs/<run_id>/iter-<k>/checkpoint``; returns its URI and the metrics.
    """
    rows = _rows(rollouts)
    with PolicyTrainer(cfg, policy_uri=policy_uri, ref_uri=ref_uri) as trainer:
        result = trainer.update(rows, iteration)
        meta = {k: v for k, v in result.metrics.items() if k != "history"}
        meta.update(run_id=run_id, iteration=iteration, parent=policy_uri)
        result.checkpoint_uri = trainer.save(RunLayout.standalone_checkpoint_rel(run_id, iteration), extra=meta,
                                             with_optimizer=with_optimizer)
        result.weights = None
    return result
