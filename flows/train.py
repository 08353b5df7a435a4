"""Prefect flow ``rlcr``: resumable RLCR iterations (deployment ``rlcr/train``).

Each iteration is a sequence of Prefect tasks (docs/design.md §1):

    rollouts (answer stage → confidence stage, Ray Data + vLLM)
      → advantages (+ rollouts Parquet) → update (Ray Train) → evaluate (held-out) → commit

An iteration is committed by writing its manifest last (``rlcr.runs``). Running
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
from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NONE as NO_CACHE
from prefect.tasks import exponential_backoff

from rlcr import events
from rlcr.cluster import check_cluster_fits, check_storage, engines_start_beside_trainer, ensure_ray
from rlcr.config import ConfigError, RLCRConfig, load_config
from rlcr.evaluate import evaluate_policy
from rlcr.model_source import run_initial_model
from rlcr.presentation import metrics_markdown, progress_line
from rlcr.rollout.ahead import Ahead, manifest_fields, read_ahead, seal_ahead
from rlcr.rollout.engine import EnginePool
from rlcr.rollout.pipeline import finalize_rollouts, generate_rollouts, rollout_seed
from rlcr.rollout.records import rows_to_table
from rlcr.runs import (AlreadyCommitted, LeaseLost, RunLease, RunStore, StateMismatch, attempt_id, new_run_id,
                       prompts_for_iteration, task_sets)
from rlcr.storage import validate_run_id
from rlcr.tracking import Tracker, sync_run, tracker_from_config
from rlcr.train.mismatch import mismatch_warning
from rlcr.train.trainer import PolicyTrainer, StateLost, TrainerLost

__all__ = ["rlcr_train", "ensure_ray", "resolve_config", "artifact_key", "run_key"]


# ----------------------------------------------------------------------------- helpers


def resolve_config(config: str | None, overrides: dict | list | None, iterations: int | None) -> RLCRConfig:
    """Config file + overrides (+ iterations); raises ConfigError naming the field, before any Ray work."""
    extra = dict(overrides) if isinstance(overrides, dict) else {}
    items = list(overrides) if isinstance(overrides, (list, tuple)) else []
    cfg = load_config(config, items)
    if extra or iterations is not None:
        data = {**cfg.model_dump(), **extra}
        if iterations is not None:
            data["run.iterations"] = iterations
        cfg = RLCRConfig.from_dict(data, source=config or "config")
    return cfg


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


def _opts(cfg: RLCRConfig) -> dict:
    return dict(retries=cfg.orchestration.retries, retry_delay_seconds=exponential_backoff(backoff_factor=cfg.orchestration.retry_delay_s),
                cache_policy=NO_CACHE, retry_condition_fn=_retry_unless_final)


# ----------------------------------------------------------------------------- tasks


@task(name="rollouts")
def rollouts_task(cfg, prompts, policy, run_id, iteration, engines, tokenizer_uri):
    """Answer stage then confidence stage on Ray Data; scored records."""
    events.started("rollouts", iteration)
    return generate_rollouts(cfg, prompts, policy_uri=policy, run_id=run_id, iteration=iteration, engines=engines,
                             tokenizer_uri=tokenizer_uri)


@task(name="advantages")
def advantages_task(cfg, rows, run, iteration, lease, version):
    """Two-level advantages (docs/design.md §7) and the rollouts Parquet (written under the run's lease);
    ``version``: the updates in the policy that sampled them."""
    events.started("advantages", iteration)
    result = finalize_rollouts(cfg, rows, run_id=run.run_id, iteration=iteration, policy_version=version)
    result.uri = run.write_rollouts(iteration, rows_to_table(result.rows), lease=lease)
    return result


def _retry_unless_final(task, task_run, state) -> bool:
    """A retry cannot bring back unsaved updates (:class:`StateLost` goes to the flow, which rewinds), nor a
    lost lease, nor a committed iteration or a rewritten state: those go to the flow at once."""
    try:
        state.result()
    except (StateLost, LeaseLost, AlreadyCommitted, StateMismatch):
        return False
    except BaseException:  # noqa: BLE001 - any other failure is retried
        return True
    return True


@task(name="update", retry_condition_fn=_retry_unless_final)
def update_task(trainer, rows, iteration):
    """Masked GRPO update on the run's long-lived Ray Train workers (their AdamW carries over)."""
    events.started("update", iteration)
    trainer.ensure_running()
    return trainer.update(rows, iteration)


@task(name="sync_weights")
def sync_weights_task(engines, weights, version, iteration):
    """Copy the new weights into the running engines from Ray's object store (``engine.weight_sync``)."""
    events.started("sync_weights", iteration)
    return engines.update_weights(weights, version)


@task(name="evaluate")
def evaluate_task(cfg, run, held_out, policy, iteration, engines, tokenizer_uri, lease):
    """Held-out accuracy and calibration (docs/design.md §13) of the policy the engines hold; its per-answer rows go to
    this attempt's ``run.eval_records_rel(iteration, attempt)`` (``records_uri`` in the metrics and the
    manifest) for paired comparisons."""
    events.started("evaluate" if iteration else "baseline", iteration)
    metrics, rows = evaluate_policy(cfg, held_out, policy_uri=policy, iteration=iteration, engines=engines,
                                    tokenizer_uri=tokenizer_uri, run_id=run.run_id)
    metrics["records_uri"] = run.write_eval_records(iteration, rows_to_table(rows), lease=lease)
    return metrics


@task(name="stage")
def stage_task(run, iteration, manifest, metrics, lease):
    """Metrics and the manifest draft of an iteration (pending until a saved state covers it)."""
    events.started("stage", iteration)
    run.stage(iteration, manifest, metrics, lease=lease)


@task(name="save", retry_condition_fn=_retry_unless_final)
def save_task(trainer, run, iteration, extra, lease, background=False):
    """The full training state (weights, AdamW, schedule, RNG), sealed, after iteration ``iteration``, under
    this attempt's path (which no other writer's manifest names); fenced by the run's lease (checked here and
    again by the worker just before it uploads). ``background``: started, not waited for (:func:`saved_task`)."""
    events.started("save", iteration)
    fence = run.checkpoint_fence(iteration, lease)
    trainer.ensure_running()
    return trainer.save(run.checkpoint_rel(iteration, attempt_id(lease)), extra=extra, fence=fence,
                        background=background)


@task(name="saved", retry_condition_fn=_retry_unless_final)
def saved_task(trainer, iteration):
    """Wait for the background save of iteration ``iteration``: (its URI, the seconds its write took). Workers
    that died meanwhile are :class:`StateLost` (the flow rewinds to the last committed state)."""
    events.started("saved", iteration)
    try:
        return trainer.saved()
    except TrainerLost:
        trainer.ensure_running()  # dead with unsaved updates: StateLost
        raise


@task(name="prune")
def prune_task(run, keep, lease, covers):
    """After a commit, fenced by the run's lease: delete the checkpoints other (dead) attempts left under the
    iterations just committed (``covers``), and with ``keep`` (``orchestration.keep_checkpoints``) those of all
    but the newest ``keep`` committed saves."""
    for uri in run.prune_dead_attempts(covers, lease=lease):
        get_run_logger().info("removed %s (left by an attempt that did not commit its iteration)", uri)
    for uri in run.prune_checkpoints(keep, lease=lease) if keep else ():
        get_run_logger().info("removed %s (orchestration.keep_checkpoints = %d)", uri, keep)


@task(name="commit")
def commit_task(run, iterations, state_uri, state_iteration, lease):
    """Manifests of the staged iterations, in order, create-only, under the run's lease: now they exist."""
    events.started("commit", state_iteration)
    return run.commit_staged(iterations, state_uri, state_iteration, lease=lease)


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
        run.sweep_temporaries()
        run.finish_group(lease=lease)
        train_tasks, held_out = task_sets(cfg)
        with events.phase("model"):
            initial = run_initial_model(cfg, run, lease=lease, warn=log.warning)  # on resume: the one it started with
        done = run.committed()
        tracker = stack.enter_context(tracker_from_config(cfg, run_id, logger=log))
        track_committed(tracker, run, None, log)
        summary: dict[str, Any] = {"run_id": run_id, "storage": run.store.url(run.prefix), "iterations": [],
                                   "mlflow": tracker.where()}
        if len(done) >= cfg.run.iterations:
            log.info("run %s already has %d committed iterations", run_id, len(done))
            summary["iterations"] = [m["iteration"] for m in done]
            return summary
        saved = run.verified_state(done[-1]) if done else initial
        log.info("run %s: iterations %d..%d from %s", run_id, len(done) + 1, cfg.run.iterations, saved)

        with events.phase("ray"):
            ensure_ray(cfg)
            check_storage(cfg)
            check_cluster_fits(cfg)
        opts = _opts(cfg)
        beside = engines_start_beside_trainer(cfg)  # then launched here, and waited for once the trainer is up
        with contextlib.ExitStack() as workers:
            events.started("engines", 0)
            engines_t0 = time.perf_counter()
            engines = workers.enter_context(EnginePool(cfg, saved, wait=not beside))
            with events.phase("trainer"):
                trainer = workers.enter_context(PolicyTrainer(cfg, policy_uri=saved, restore=bool(done),
                                                              ref_uri=initial))
            engines.wait_started()
            events.ended("engines", engines_t0)
            if not done and cfg.eval.every and not run.store.exists(run.baseline_rel):
                baseline = evaluate_task.with_options(**opts)(cfg, run, held_out, saved, 0, engines, initial, lease)
                run.write_baseline({"policy_uri": saved, "eval": baseline}, lease=lease)
                track_committed(tracker, run, [0], log)
            policy, staged, rewinds = saved, [], 0  # staged: the iterations applied in memory since `saved`
            ahead = _read_ahead(cfg, run, done, train_tasks)  # one-step-off: the next rollouts, already sampled
            pending: PendingSave | None = None  # a background save not yet committed

            def committed(save: PendingSave) -> None:
                nonlocal saved
                summary["iterations"].extend(save.covers)
                track_committed(tracker, run, save.covers, log)
                saved = save.uri
                del staged[:len(save.covers)]
                prune_task.with_options(**opts)(run, cfg.orchestration.keep_checkpoints, lease, save.covers)

            def settle() -> str | None:
                nonlocal pending
                if pending is None:
                    return None
                save, pending = pending, None
                finish_save(run, trainer, save, lease, opts)
                committed(save)
                return save.uri

            k = len(done) + 1
            while k <= cfg.run.iterations:
                try:
                    metrics, manifest, save, ahead = _iteration(cfg, run, k, trainer, engines, (saved, policy),
                                                                initial, train_tasks, held_out, opts, lease, staged,
                                                                settle, ahead)
                except StateLost as e:  # the workers died with unsaved updates: rewind to the last saved state
                    rewinds += 1
                    if rewinds > cfg.orchestration.retries:
                        raise
                    done = run.committed()
                    saved = policy = run.verified_state(done[-1]) if done else initial
                    log.warning("%s; rewinding to %s and re-running iterations %d..%d (rewind %d of %d)",
                                e, policy, len(done) + 1, k, rewinds, cfg.orchestration.retries)
                    trainer.restart_from(policy, restore=bool(done))
                    engines.load(policy)
                    staged, pending, k = [], None, len(done) + 1
                    ahead = _read_ahead(cfg, run, done, train_tasks)
                    continue
                except Exception:
                    with contextlib.suppress(Exception):  # keep what a finished background save covers
                        settle()
                    raise
                policy = metrics["engines"]["policy"]
                if save is not None and save.uri:
                    committed(save)
                elif save is not None:
                    pending = save
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
                k += 1
            assert pending is None  # the last iteration's save is waited for; the others settle before an update
        summary["final_checkpoint"] = run.committed()[-1]["checkpoint_uri"]
        return summary


def _read_ahead(cfg, run, done, train_tasks) -> Ahead | None:
    """One-step-off mode: the rollouts the last committed manifest names for the next iteration (checked), which
    that iteration trains on (:mod:`rlcr.rollout.ahead`); None in ``sync`` mode or if it names none."""
    if cfg.orchestration.mode != "one-step-off" or not done or done[-1]["iteration"] >= cfg.run.iterations:
        return None
    g_c = cfg.rollout.num_generations_confidence if cfg.method.name == "rlcr" else 0
    prompts = prompts_for_iteration(cfg, train_tasks, done[-1]["iteration"] + 1)
    return read_ahead(run, done[-1], prompts, g_a=cfg.rollout.num_generations_answer, g_c=g_c)


def _update_and_next(cfg, run, k, trainer, engines, policy, initial, train_tasks, rows, opts, lease, t):
    """Iteration k's update; in one-step-off mode (and unless k is the last) iteration k+1's rollouts generated
    meanwhile by the engines' policy ``policy`` (after k − 1 updates), then scored and written (an
    :class:`Ahead`, else None). Both are waited for before the caller syncs the new weights into the engines."""
    ahead = cfg.orchestration.mode == "one-step-off" and k < cfg.run.iterations
    t0 = time.perf_counter()
    future = rollouts_task.with_options(**opts).submit(cfg, prompts_for_iteration(cfg, train_tasks, k + 1), policy,
                                                       run.run_id, k + 1, engines, initial) if ahead else None
    try:
        with events.timed("update", k, t) as fig:
            update = update_task.with_options(**opts)(trainer, rows, k)
            fig["loss"] = update.metrics.get("loss")
    finally:
        if future is not None:
            future.wait()  # never leave a generation running on the engines while the caller goes on
    if future is None:
        return update, None
    next_rows, gen_timings = future.result()
    t["overlap_s"] = time.perf_counter() - t0  # the update and the next generation, side by side
    t_next = {"rollouts_s": gen_timings.get("rollout/pipeline_s", 0.0)}
    with events.timed("advantages", k + 1, t_next):
        written = advantages_task.with_options(**opts)(cfg, next_rows, run, k + 1, lease, k - 1)
    return update, seal_ahead(run, written, k + 1, k - 1, {**gen_timings, **t_next})


def _iteration(cfg, run, k, trainer, engines, policies, initial, train_tasks, held_out, opts, lease, staged,
               settle, ahead):
    """One iteration: rollouts → advantages → (settle) → update → weight sync → evaluate → stage (→ save →
    commit). ``ahead``: this iteration's rollouts if they were sampled one step off (during the previous update,
    or named by the last committed manifest on a resume); otherwise they are sampled now.

    ``policies``: (the last saved state, the policy the engines hold: that state plus the updates of the
    iterations in ``staged``). ``settle()``: commits an earlier iteration's background save, if one is
    pending, and returns the state it saved (else None). Returns (metrics, manifest draft, what was saved:
    None, or a :class:`PendingSave` — committed already unless ``orchestration.background_save``; and the next
    iteration's rollouts when they were sampled one step off, else None). ``staged`` collects the iterations
    staged since the last save; on a save they are committed (or will be, when the background save is settled)
    and the caller removes them from the list.
    """
    base, policy = policies
    t: dict[str, float] = {}
    started = time.perf_counter()
    if ahead is None:
        with events.timed("rollouts", k, t) as fig:
            prompts = prompts_for_iteration(cfg, train_tasks, k)
            rows, gen_timings = rollouts_task.with_options(**opts)(cfg, prompts, policy, run.run_id, k, engines,
                                                                   initial)
            fig["samples"] = len(rows)
        with events.timed("advantages", k, t) as fig:
            rollout = advantages_task.with_options(**opts)(cfg, rows, run, k, lease, k - 1)
            fig.update({"answer reward": rollout.stats.get("answer/reward_mean"),
                        "confidence reward": rollout.stats.get("confidence/reward_mean")})
        rollout_version = k - 1
    else:  # sampled during the previous update (its generation's figures come with it, when this process ran it)
        rollout, gen_timings, rollout_version = ahead.result, dict(ahead.timings), ahead.version
        t.update({key: v for key, v in gen_timings.items() if key.endswith("_s") and "/" not in key})
    base = settle() or base  # an earlier iteration's background save: done and committed before the update
    if cfg.engine.release_during_update:
        engines.release()  # their memory goes to the update; the weight sync starts them again
    update, ahead = _update_and_next(cfg, run, k, trainer, engines, policy, initial, train_tasks, rollout.rows, opts,
                                     lease, t)
    version = run.store.url(run.checkpoint_rel(k, attempt_id(lease)))  # "the policy after k": save_task's path
    with events.timed("sync_weights", k, t) as fig:
        synced = sync_weights_task.with_options(**opts)(engines, update.weights, version, k)
        fig["mode"] = synced[0].get("mode") if synced else None
    update.weights = None  # release the object-store copy
    ev: dict[str, Any] = {}
    if cfg.eval.every and (k % cfg.eval.every == 0 or k == cfg.run.iterations):
        with events.timed("evaluate", k, t) as fig:
            ev = evaluate_task.with_options(**opts)(cfg, run, held_out, version, k, engines, initial, lease)
            fig.update({"accuracy": ev.get("accuracy"), "ECE": ev.get("ece")})
    save = k % cfg.orchestration.save_every == 0 or k == cfg.run.iterations
    metrics = {"rollout": rollout.stats, "update": update.metrics, "eval": ev,
               "engines": {"policy": version, "sync": synced},
               "timings": {**t, **gen_timings}}
    manifest = {  # policy_in: a saved state (+ policy_in_updates applied in memory); policy_out: where it is saved
        "policy_in": base, "policy_in_updates": list(staged), "policy_out": version if save else None,
        "rollouts_uri": rollout.uri, "rollouts_version": rollout_version, **manifest_fields(ahead),
        "records_uri": ev.get("records_uri"), "config_hash": cfg.config_hash(),
        "seeds": {"run": cfg.run.seed, "rollout": rollout_seed(cfg, k), "eval": cfg.tasks.eval_seed},
    }
    # from the rollouts (or those sampled ahead) to the evaluation: an iteration's wall time, its save aside
    t["iteration_s"] = metrics["timings"]["iteration_s"] = time.perf_counter() - started
    with events.timed("stage", k, t):
        stage_task.with_options(**opts)(run, k, manifest, metrics, lease)
    staged.append(k)
    if not save:
        return metrics, manifest, None, ahead
    background = cfg.orchestration.background_save and k < cfg.run.iterations  # the last: nothing to overlap
    with events.timed("save", k, t):
        extra = {k_: v for k_, v in update.metrics.items() if k_ != "history"}
        extra.update(run_id=run.run_id, iteration=k, parent=policy, covers=list(staged))
        uri = save_task.with_options(**opts)(trainer, run, k, extra, lease, background)
    metrics["timings"].update(t)  # the save's time (the dict was copied when the iteration was staged)
    pending = PendingSave(k, list(staged), metrics)
    if not background:
        finish_save(run, trainer, pending, lease, opts, uri)
    return metrics, manifest, pending, ahead  # background: written while the next rollouts run; settled before the update


@dataclass
class PendingSave:
    """A saved (or saving) state and what it commits: the staged iterations ``covers`` (the last is ``k``,
    whose ``metrics`` get the save's timings)."""

    k: int
    covers: list[int]
    metrics: dict[str, Any]
    uri: str | None = None
    """The saved state, once the iterations are committed."""


def finish_save(run, trainer, pending: PendingSave, lease, opts, uri: str | None = None) -> str:
    """Commit the iterations a save covers, once it is written: ``uri`` if the flow waited for it, otherwise
    after waiting for the background write (its wait added to ``save_s``, the write's own time as
    ``save_write_s``). Sets and returns ``pending.uri``, the saved state."""
    k, t = pending.k, {}
    if uri is None:
        with events.timed("saved", k, t):
            uri, write_s = saved_task.with_options(**{**opts, "retries": 0})(trainer, k)
        timings = pending.metrics["timings"]
        timings.update(save_s=timings.get("save_s", 0.0) + t["saved_s"], save_write_s=write_s)
    run.write_metrics(k, pending.metrics, lease=lease)  # still pending: now with the save's time
    with events.timed("commit", k, t):
        commit_task.with_options(**opts)(run, pending.covers, uri, k, lease)
    pending.uri = uri
    return uri


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
