"""Prefect flow ``rlcr``: resumable RLCR iterations (deployment ``rlcr/train``).

Each iteration is a sequence of Prefect tasks (docs/design.md §1; the tasks in :mod:`flows.tasks`, one
iteration in :mod:`flows.iteration`, the flow here):

    rollouts (answer stage → confidence stage, Ray Data + vLLM)
      → advantages (+ rollouts Parquet) → update (Ray Train) → evaluate (held-out) → commit

An iteration is committed by writing its manifest last (``rlcr.runs.store``). Running
the flow again with the same ``run_id`` resumes after the last committed
iteration; a crash mid-iteration leaves nothing that looks committed. The vLLM
engines live for the whole flow run and take each new checkpoint in turn.

Run it without a server (Prefect's ephemeral mode):

    python -m flows.train --config configs/tiny.yaml --run-id demo

or through the deployment (``python -m flows.serve``, then
``prefect deployment run rlcr/train``).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact

from flows.iteration import PendingSave, RunContext, finish_save, read_ahead_rollouts, run_iteration
from flows.tasks import evaluate_task, prune_task, task_options
from rlcr import events
from rlcr.config import ConfigError, RLCRConfig, resolve_config
from rlcr.models.source import run_initial_model
from rlcr.rollout.ahead import Ahead
from rlcr.rollout.engine import EnginePool
from rlcr.runs.cluster import check_cluster_fits, check_storage, engines_start_beside_trainer, ensure_ray
from rlcr.runs.lease import LeaseLost
from rlcr.runs.store import RunLease, RunStore, new_run_id, task_sets
from rlcr.storage import validate_run_id
from rlcr.tracking import Tracker, sync_run, tracker_from_config
from rlcr.train.mismatch import mismatch_warning
from rlcr.train.trainer import PolicyTrainer, StateLost
from rlcr.ui.presentation import metrics_markdown, progress_line
from rlcr.untrusted import printable

__all__ = ["rlcr_train", "artifact_key", "run_key"]


# ----------------------------------------------------------------------------- helpers


def resolve_run_id(cfg: RLCRConfig, run_id: str | None) -> str:
    """The run id to use (argument, config, or a fresh one), validated; ConfigError if invalid."""
    run_id = run_id or cfg.run.id or new_run_id()
    try:
        return validate_run_id(run_id)
    except ValueError as e:
        raise ConfigError(f"run_id: {e}") from None


def run_key(run_id: str) -> str:
    """Any valid run id as part of a Prefect artifact key (``[a-z0-9-]``): a slug and a short hash of the id,
    which keeps distinct ids distinct."""
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")[:60] or "run"
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:6]
    return f"{slug}-{digest}"


def artifact_key(run_id: str, iteration: int) -> str:
    """A Prefect artifact key (``[a-z0-9-]``) for any valid run id (:func:`run_key`)."""
    return f"rlcr-{run_key(run_id)}-iter-{iteration}"


# ----------------------------------------------------------------------------- flow


def track_committed(tracker: Tracker, run: RunStore, iterations: list[int] | None, log) -> None:
    """Send committed iterations' metrics to the experiment tracker (step = iteration; 0: the baseline
    evaluation; None: every step the run holds, a resume's back-fill), skipping those it already holds
    completely: a resumed or re-run iteration is never logged twice (:func:`rlcr.tracking.sync_run`). Only
    committed figures go out, so what the tracker shows is what the run's manifests name."""
    if tracker.enabled and sync_run(tracker, run, iterations) and tracker.run_url:
        with contextlib.suppress(Exception):  # a link is a convenience: never fail the flow for it
            create_link_artifact(key=f"rlcr-{run_key(run.run_id)}-mlflow", link=tracker.run_url,
                                 link_text="MLflow run", description=f"rlcr {run.run_id} in MLflow")


@flow(name="rlcr", log_prints=True)
def rlcr_train(
    config: str | None = None,
    overrides: dict[str, Any] | list[str] | None = None,
    run_id: str | None = None,
    iterations: int | None = None,
) -> dict[str, Any]:
    """Train (or resume) run ``run_id`` until ``iterations`` iterations are committed.

    ``config``: a YAML file (defaults if None); ``overrides``: ``{"field": value}`` or
    ``["field=value", …]``; ``iterations`` overrides the config's. One writer per run:
    a second flow on the same ``run_id`` fails at once (``RunLocked``, naming the holder).
    """
    log = get_run_logger()
    events.emit(events.StageEvent("prefect", 0, "end"))  # the flow run has started: Prefect is up
    cfg = resolve_config(config, overrides, iterations)
    run_id = resolve_run_id(cfg, run_id)
    run = RunStore.open(cfg, run_id)
    from prefect.context import get_run_context

    with contextlib.ExitStack() as stack:
        lease = stack.enter_context(RunLease(run, owner=f"prefect flow run {get_run_context().flow_run.id}"))
        run.check_config(cfg, lease=lease)
        stack.enter_context(_attempt_status(run, cfg.run.iterations, lease, log))
        run.sweep_temporaries()
        run.finish_group(lease=lease)
        train_tasks, held_out = task_sets(cfg)
        with events.phase("model"):
            initial = run_initial_model(cfg, run, lease=lease, warn=log.warning)  # on resume: the one it started with
        done = run.committed()
        tracker = stack.enter_context(tracker_from_config(cfg, run_id, logger=log))
        # MLflow's status follows rlcr's: a run whose iterations are all committed is FINISHED even when the
        # attempt ended by an interrupt or error after its last commit
        tracker.finished = lambda: len(run.committed()) >= cfg.run.iterations
        track_committed(tracker, run, None, log)
        summary: dict[str, Any] = {"run_id": run_id, "storage": run.store.url(run.prefix), "iterations": [],
                                   "mlflow": tracker.where()}
        if len(done) >= cfg.run.iterations:
            log.info("run %s already has %d committed iterations", run_id, len(done))
            summary["iterations"] = [m["iteration"] for m in done]
            return summary
        saved = _last_state(run, done, initial)
        log.info("run %s: iterations %d..%d from %s", run_id, len(done) + 1, cfg.run.iterations, saved)

        with events.phase("ray"):
            ensure_ray(cfg)
            check_storage(cfg)
            check_cluster_fits(cfg)
        opts = task_options(cfg)
        with contextlib.ExitStack() as workers:
            engines, trainer = _start_workers(cfg, workers, saved, bool(done), initial)
            if not done and cfg.eval.every and not run.store.exists(run.baseline_rel):
                baseline = evaluate_task.with_options(**opts)(cfg, run, held_out, saved, 0, engines, initial, lease)
                run.write_baseline({"policy_uri": saved, "eval": baseline}, lease=lease)
                track_committed(tracker, run, [0], log)
            ahead = read_ahead_rollouts(cfg, run, done, train_tasks)  # one-step-off: already sampled
            ctx = RunContext(cfg=cfg, run=run, lease=lease, trainer=trainer, engines=engines, initial=initial,
                             train_tasks=train_tasks, held_out=held_out, opts=opts)
            _Iterations(ctx, tracker, log, saved, ahead, summary).run(len(done) + 1)
        summary["final_checkpoint"] = run.committed()[-1]["checkpoint_uri"]
        return summary


@contextlib.contextmanager
def _attempt_status(run: RunStore, target: int, lease: RunLease, log):
    """``status.json`` of this attempt: ``running`` now; ``finished`` once ``target`` iterations are committed, else
    ``stopped`` with the reason (an interrupt, the error) as the flow unwinds. Never fails the flow: a status
    that cannot be written (the lease lost, the store down) is a warning."""
    def write(state: str, reason: str | None = None) -> None:
        try:
            run.write_status(state, target, reason, lease=lease)
        except Exception as e:  # noqa: BLE001 — bookkeeping, not the run's data
            log.warning("run %s: could not record its status (%s): %s", run.run_id, state, printable(e, 300))

    write("running")
    try:
        yield
    except BaseException as e:
        try:
            done = len(run.committed()) >= target
        except Exception:  # noqa: BLE001
            done = False
        write("finished" if done else "stopped", None if done else stop_reason(e))
        raise
    write("finished")


def stop_reason(e: BaseException) -> str:
    """Why an attempt stopped, in a few words for ``rlcr runs``."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(e, LeaseLost):
        return f"lost its lease: {printable(e, 200)}"
    return f"failed: {type(e).__name__}: {printable(e, 200)}"


def _last_state(run: RunStore, done: list[dict], initial: str) -> str:
    """The state a run (re)starts from: the last committed iteration's, checked (``RunStore.verified_state``), or
    the initial model before any."""
    return run.verified_state(done[-1]) if done else initial


def _start_workers(cfg, workers: contextlib.ExitStack, policy: str, restore: bool, initial: str):
    """The run's vLLM engines and Ray Train workers on ``policy`` (``restore``: with its optimizer state), entered
    into ``workers``: the engines start first, beside the trainer where the cluster allows
    (:func:`rlcr.runs.cluster.engines_start_beside_trainer`), and are waited for once the trainer is up."""
    beside = engines_start_beside_trainer(cfg)
    events.started("engines", 0)
    engines_t0 = time.perf_counter()
    engines = workers.enter_context(EnginePool(cfg, policy, wait=not beside))
    with events.phase("trainer"):
        trainer = workers.enter_context(PolicyTrainer(cfg, policy_uri=policy, restore=restore, ref_uri=initial))
    engines.wait_started()
    events.ended("engines", engines_t0)
    return engines, trainer


class _Iterations:
    """The flow's loop over iterations and its state between them: ``saved`` (the last committed state),
    ``policy`` (the weights the engines sample with), ``staged`` (the iterations applied in memory since
    ``saved``), ``pending`` (a background save not yet committed), ``ahead`` (one-step-off: the next iteration's
    rollouts, already sampled) and the rewinds so far."""

    def __init__(self, ctx: RunContext, tracker: Tracker, log, saved: str, ahead: Ahead | None, summary: dict):
        self.ctx, self.tracker, self.log = ctx, tracker, log
        self.cfg, self.run_store, self.lease, self.opts = ctx.cfg, ctx.run, ctx.lease, ctx.opts
        self.trainer, self.engines, self.initial = ctx.trainer, ctx.engines, ctx.initial
        self.summary, self.saved, self.policy, self.staged = summary, saved, saved, []
        self.pending: PendingSave | None = None
        self.ahead = ahead
        self.rewinds = 0

    def run(self, k: int) -> None:
        """Iterations ``k`` .. ``run.iterations``; a lost worker state rewinds to the last committed one (up to
        ``orchestration.retries`` times); any other failure first keeps what a finished background save covers."""
        cfg = self.cfg
        while k <= cfg.run.iterations:
            try:
                metrics, manifest, save, self.ahead = run_iteration(
                    self.ctx, k, (self.saved, self.policy), self.staged, self.settle, self.ahead)
            except StateLost as e:  # the workers died with unsaved updates: rewind to the last saved state
                k = self._rewind(e, k)
                continue
            except Exception:
                with contextlib.suppress(Exception):
                    self.settle()
                raise
            self.policy = metrics["engines"]["policy"]
            if save is not None and save.uri:
                self._committed(save)
            elif save is not None:
                self.pending = save
            _report(self.run_store.run_id, k, metrics, manifest, save, self.tracker, self.log)
            k += 1
        assert self.pending is None  # the last iteration's save is waited for; the others settle before an update

    def settle(self) -> str | None:
        """Commit the pending background save, if any (waiting for it); returns its state's URI."""
        if self.pending is None:
            return None
        save, self.pending = self.pending, None
        finish_save(self.run_store, self.trainer, save, self.lease, self.opts)
        self._committed(save)
        return save.uri

    def _committed(self, save: PendingSave) -> None:
        self.summary["iterations"].extend(save.covers)
        track_committed(self.tracker, self.run_store, save.covers, self.log)
        self.saved = save.uri
        del self.staged[:len(save.covers)]
        prune_task.with_options(**self.opts)(self.run_store, self.cfg.orchestration.keep_checkpoints, self.lease,
                                             save.covers)

    def _rewind(self, e: StateLost, k: int) -> int:
        """Back to the last committed state after the workers died with unsaved updates (``e``): the warning
        first, then the trainer restarted on that state and the engines loaded with it. Returns the iteration
        to run next; raises ``e`` once the rewinds exceed ``orchestration.retries``."""
        self.rewinds += 1
        if self.rewinds > self.cfg.orchestration.retries:
            raise e
        run = self.run_store
        done = run.committed()
        state = _last_state(run, done, self.initial)
        self.log.warning("%s; rewinding to %s and re-running iterations %d..%d (rewind %d of %d)",
                         e, state, len(done) + 1, k, self.rewinds, self.cfg.orchestration.retries)
        self.trainer.restart_from(state, restore=bool(done))
        self.engines.load(state)
        self.saved, self.policy, self.staged, self.pending = state, state, [], None
        self.ahead = read_ahead_rollouts(self.cfg, run, done, self.ctx.train_tasks)
        return len(done) + 1


def _report(run_id: str, k: int, metrics: dict, manifest: dict, save: PendingSave | None, tracker: Tracker,
            log) -> None:
    """Iteration k's Prefect artifact (its figures and where its checkpoint, rollouts and MLflow run are), its
    log line, and a warning when the engine–trainer log-prob mismatch is off (:func:`mismatch_warning`)."""
    state = save.uri if save and save.uri else "saving (committed before the next update)" if save else None
    create_markdown_artifact(
        key=artifact_key(run_id, k),
        markdown=metrics_markdown(run_id, k, metrics, {"checkpoint": state or "pending (not saved yet)",
                                                       "rollouts": manifest["rollouts_uri"],
                                                       "MLflow": tracker.run_url or tracker.ui_hint or "off"}),
        description=f"rlcr {run_id} iteration {k}",
    )
    log.info("iteration %d %s: %s", k, "committed" if save and save.uri else "saving" if save else "staged",
             progress_line(metrics))
    if warning := mismatch_warning(metrics["update"], metrics["rollout"].get("staleness", 0.0)):
        log.warning("iteration %d: %s", k, warning)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Run the rlcr training flow without a Prefect server.")
    ap.add_argument("--config")
    ap.add_argument("--run-id")
    ap.add_argument("--iterations", type=int)
    ap.add_argument("overrides", nargs="*", help="field=value")
    a = ap.parse_args()
    print(rlcr_train(config=a.config, overrides=a.overrides, run_id=a.run_id, iterations=a.iterations))


if __name__ == "__main__":
    main()
