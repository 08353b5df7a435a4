"""One iteration of the training flow: rollouts → advantages → (settle an earlier save) → update → weight sync
→ evaluate → stage (→ save → commit), each step a task of :mod:`flows.tasks`; in one-step-off mode the next
iteration's rollouts are sampled beside the update. :mod:`flows.train` runs iterations in turn."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from flows.tasks import (
    advantages_task,
    commit_task,
    evaluate_task,
    rollouts_task,
    save_task,
    saved_task,
    stage_task,
    sync_weights_task,
    update_task,
)
from rlcr import events
from rlcr.core.methods import method_record
from rlcr.rollout.ahead import Ahead, manifest_fields, read_ahead, seal_ahead
from rlcr.rollout.pipeline import rollout_seed
from rlcr.runs.store import attempt_id, prompts_for_iteration

__all__ = ["RunContext", "read_ahead_rollouts", "run_iteration", "PendingSave", "finish_save"]


@dataclass(frozen=True)
class RunContext:
    """What every iteration of one training attempt shares, built once by :func:`flows.train.rlcr_train`; what
    changes between iterations (the saved state, the engines' policy, staged iterations, a pending save, rollouts
    sampled ahead) is kept by the caller and passed per iteration."""

    cfg: Any
    """The run's :class:`~rlcr.config.RLCRConfig`."""
    run: Any
    """Its :class:`~rlcr.runs.store.RunStore` (every path and write of the run)."""
    lease: Any
    """The attempt's writer lease (:class:`~rlcr.runs.lease.RunLease`): every write is fenced by it."""
    trainer: Any
    """The long-lived Ray Train workers (:class:`~rlcr.train.trainer.PolicyTrainer`)."""
    engines: Any
    """The long-lived vLLM engines (:class:`~rlcr.rollout.engine.EnginePool`)."""
    initial: str
    """The run's initial model (its tokenizer, and the KL reference)."""
    train_tasks: list
    """The run's training pool (:func:`rlcr.runs.store.task_sets`)."""
    held_out: list
    """Its held-out set, disjoint from the pool."""
    opts: dict
    """Prefect task options (:func:`flows.tasks.task_options`)."""


def read_ahead_rollouts(cfg, run, done, train_tasks) -> Ahead | None:
    """One-step-off mode: the rollouts the last committed manifest names for the next iteration (checked), which
    that iteration trains on (:mod:`rlcr.rollout.ahead`); None in ``sync`` mode or if it names none."""
    if cfg.orchestration.mode != "one-step-off" or not done or done[-1]["iteration"] >= cfg.run.iterations:
        return None
    g_c = method_record(cfg.method.name).training_confidences(cfg.rollout.num_generations_confidence)
    prompts = prompts_for_iteration(cfg, train_tasks, done[-1]["iteration"] + 1)
    return read_ahead(run, done[-1], prompts, g_a=cfg.rollout.num_generations_answer, g_c=g_c)


def _update_and_next(ctx: RunContext, k: int, policy: str, rows, t: dict[str, float]):
    """Iteration k's update; in one-step-off mode (and unless k is the last) iteration k+1's rollouts generated
    meanwhile by the engines' policy ``policy`` (after k − 1 updates), then scored and written (an
    :class:`Ahead`, else None). Both are waited for before the caller syncs the new weights into the engines."""
    cfg, run, opts = ctx.cfg, ctx.run, ctx.opts
    ahead = cfg.orchestration.mode == "one-step-off" and k < cfg.run.iterations
    t0 = time.perf_counter()
    future = rollouts_task.with_options(**opts).submit(cfg, prompts_for_iteration(cfg, ctx.train_tasks, k + 1),
                                                       policy, run.run_id, k + 1, ctx.engines,
                                                       ctx.initial) if ahead else None
    try:
        with events.timed("update", k, t) as fig:
            update = update_task.with_options(**opts)(ctx.trainer, rows, k)
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
        written = advantages_task.with_options(**opts)(cfg, next_rows, run, k + 1, ctx.lease, k - 1)
    return update, seal_ahead(run, written, k + 1, k - 1, {**gen_timings, **t_next})


def run_iteration(ctx: RunContext, k: int, policies: tuple[str, str], staged: list[int], settle, ahead):
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
    cfg, run, opts, lease, engines = ctx.cfg, ctx.run, ctx.opts, ctx.lease, ctx.engines
    base, policy = policies
    t: dict[str, float] = {}
    started = time.perf_counter()
    if ahead is None:
        with events.timed("rollouts", k, t) as fig:
            prompts = prompts_for_iteration(cfg, ctx.train_tasks, k)
            rows, gen_timings = rollouts_task.with_options(**opts)(cfg, prompts, policy, run.run_id, k, engines,
                                                                   ctx.initial)
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
    update, ahead = _update_and_next(ctx, k, policy, rollout.rows, t)
    version = run.store.url(run.checkpoint_rel(k, attempt_id(lease)))  # "the policy after k": save_task's path
    with events.timed("sync_weights", k, t) as fig:
        synced = sync_weights_task.with_options(**opts)(engines, update.weights, version, k)
        fig["mode"] = synced[0].get("mode") if synced else None
    update.weights = None  # release the object-store copy
    ev: dict[str, Any] = {}
    if cfg.eval.every and (k % cfg.eval.every == 0 or k == cfg.run.iterations):
        with events.timed("evaluate", k, t) as fig:
            ev = evaluate_task.with_options(**opts)(cfg, run, ctx.held_out, version, k, engines, ctx.initial, lease)
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
        uri = save_task.with_options(**opts)(ctx.trainer, run, k, extra, lease, background)
    metrics["timings"].update(t)  # the save's time (the dict was copied when the iteration was staged)
    pending = PendingSave(k, list(staged), metrics)
    if not background:
        finish_save(run, ctx.trainer, pending, lease, opts, uri)
    # background: written while the next rollouts run; settled before the update
    return metrics, manifest, pending, ahead


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
