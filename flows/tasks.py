"""The training flow's Prefect tasks: each step of an iteration as one task (its retries, its stage event), a
thin wrapper over the rlcr function that does the work. :mod:`flows.iteration` chains them; :mod:`flows.train`
is the flow."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NONE as NO_CACHE
from prefect.tasks import exponential_backoff

from rlcr import events
from rlcr.config import RLCRConfig
from rlcr.evaluation.evaluate import evaluate_policy
from rlcr.rollout.pipeline import finalize_rollouts, generate_rollouts
from rlcr.rollout.records import rows_to_table
from rlcr.runs.store import AlreadyCommitted, LeaseLost, StateMismatch, attempt_id
from rlcr.train.trainer import StateLost, TrainerLost

__all__ = ["task_options", "rollouts_task", "advantages_task", "update_task", "sync_weights_task", "evaluate_task",
           "stage_task", "save_task", "saved_task", "prune_task", "commit_task"]


def task_options(cfg: RLCRConfig) -> dict:
    """Every task's options: ``orchestration.retries`` with exponential back-off, never cached, and no retry of
    what a retry cannot mend (:func:`_retry_unless_final`)."""
    return dict(retries=cfg.orchestration.retries,
                retry_delay_seconds=exponential_backoff(backoff_factor=cfg.orchestration.retry_delay_s),
                cache_policy=NO_CACHE, retry_condition_fn=_retry_unless_final)


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
    result.uri = run.write_rollouts(iteration, rows_to_table(result.rows, cfg.tasks.name), lease=lease)
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
    metrics["records_uri"] = run.write_eval_records(iteration, rows_to_table(rows, cfg.tasks.name), lease=lease)
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
