"""Prefect flow ``rlcr-probe``: probe the newest committed checkpoint of a run (deployment ``rlcr-probe/nightly``).

    resolve the run's newest committed checkpoint → probe (docs/design.md §15) → report.json + report.html → artifact

The probe runs on the task the run was trained on (its task and task options, from the run's recorded config:
:func:`rlcr.runs.refs.with_run_task`), whatever the config names; the report names it (``task``, ``task_options``).

The report goes to ``<storage>/runs/<run_id>/probes/<timestamp>/`` and a Prefect
markdown artifact links it. The probe's vLLM engine runs in the flow's own
process (one engine): the process that executes the flow run needs the
accelerator. The ``nightly`` deployment runs on ``cfg.probe.cron`` (UTC,
default 03:00), or the cron given to :func:`probe_deployment`.

Run it once without a server:

    python -m flows.probe --config configs/tiny.yaml --run-id demo --num-tasks 8
"""

from __future__ import annotations

import re
import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE as NO_CACHE
from prefect.schedules import Cron

from flows.train import run_key
from rlcr.config import resolve_config
from rlcr.probe.probe import probe_checkpoint
from rlcr.probe.report import report_markdown, write_report
from rlcr.runs.layout import RunLayout
from rlcr.runs.refs import NoCommittedIteration, newest_checkpoint, newest_run, task_fields, with_run_task
from rlcr.runs.store import RunStore, task_sets
from rlcr.storage import Store
from rlcr.tracking import tracker_from_config

__all__ = ["rlcr_probe", "probe_deployment", "newest_checkpoint", "newest_run", "probe_artifact_key"]


def probe_artifact_key(run_id: str) -> str:
    """The probe's Prefect artifact key: ``rlcr-probe-<run id>`` where the id already is a valid key part,
    else ``rlcr-probe-<slug>-<hash>`` (:func:`flows.train.run_key`): any valid run id works."""
    return f"rlcr-probe-{run_id if re.fullmatch(r'[a-z0-9-]{1,80}', run_id) else run_key(run_id)}"


def track_report(cfg, run_id: str, uris: dict[str, str], log, suite: dict[str, Any] | None = None,
                 iteration: int = 0) -> None:
    """The report (HTML with its plots, and JSON) as artifacts of the run's MLflow run, under
    ``probe/<timestamp>``, and the task probed as its params (``tasks.name``, ``tasks.options.*``: the run's, which
    a run's MLflow params already hold); with a ``suite`` result, its figures per family as metrics
    ``<suite>/<family>/<metric>`` at step ``iteration``. A tracker that is off or down costs a warning, never the
    probe."""
    import tempfile
    from pathlib import Path

    store = Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url)
    params = {"tasks": {"name": cfg.tasks.name, "options": cfg.tasks.options}}  # the run's own: its params hold them
    with tracker_from_config(cfg, run_id, params=params, logger=log, resume=False) as tracker, \
            tempfile.TemporaryDirectory(prefix="rlcr-probe-") as d:
        if not tracker.enabled:
            return
        for name in ("html", "json"):
            (Path(d) / f"report.{name}").write_bytes(store.read_bytes(store.rel(uris[name])))
        tracker.log_artifact(d, f"probe/{uris['prefix'].rstrip('/').rsplit('/', 1)[-1]}")
        if suite is not None:
            from rlcr.evaluation.suite import suite_metrics

            tracker.log_metrics(suite_metrics(suite, suite["suite"]), step=iteration)


def override_names(overrides: dict[str, Any] | list[str] | None) -> list[str]:
    """The dotted fields a flow's ``overrides`` set (``section.field=value`` items, or a mapping's keys): what the
    caller chose explicitly, which a run's own task may not silently replace (:func:`rlcr.runs.refs.with_run_task`)."""
    if isinstance(overrides, dict):
        return [str(k) for k in overrides]
    return [str(item).split("=", 1)[0].strip() for item in overrides or [] if "=" in str(item)]


@task(name="probe", cache_policy=NO_CACHE)
def probe_task(cfg, checkpoint_uri: str, tasks, samples: int | None) -> dict[str, Any]:
    """Turn 1, turn 2 and the forced answers at every truncation point; metrics."""
    return probe_checkpoint(cfg, checkpoint_uri, tasks, samples=samples)


@task(name="suite", cache_policy=NO_CACHE)
def suite_task(cfg, checkpoint_uri: str, suite) -> tuple[dict[str, Any], Any]:
    """The checkpoint on an evaluation suite's families (:func:`rlcr.evaluation.suite.evaluate_suite`): the
    result and the per-answer rows as a table."""
    from rlcr.evaluation.suite import evaluate_suite
    from rlcr.rollout.records import rows_to_table
    from rlcr.runs.cluster import ensure_ray

    ensure_ray(cfg)
    result, rows, suite_cfg = evaluate_suite(cfg, suite, checkpoint_uri, trained_on=cfg)
    return result, rows_to_table(rows, suite_cfg.tasks.name)


@task(name="write-report", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def write_report_task(cfg, run_id: str, report: dict[str, Any], timestamp: str,
                      suite_rows=None) -> dict[str, str]:
    """The suite's rows (``suite-rows.parquet``) where a suite ran, report.html, then report.json (its presence
    marks the report complete)."""
    store = Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url)
    if suite_rows is not None:
        store.write_parquet(RunLayout(store, run_id).probe_rel(timestamp, "suite-rows.parquet"), suite_rows)
    return write_report(store, run_id, report, timestamp=timestamp)


@flow(name="rlcr-probe", log_prints=True)
def rlcr_probe(
    config: str | None = None,
    overrides: dict[str, Any] | list[str] | None = None,
    run_id: str | None = None,
    num_tasks: int | None = None,
    samples: int | None = None,
    iteration: int | None = None,
    suite: str | None = None,
) -> dict[str, Any]:
    """Probe the newest committed checkpoint of ``run_id`` (or iteration ``iteration``'s) on the first
    ``num_tasks`` held-out tasks.

    ``run_id``: default the config's ``run_id``, else the run in storage committed most
    recently. ``num_tasks``: default all held-out tasks. ``samples``: N forced
    answers per truncation point (default ``cfg.probe.samples``). ``suite``: an evaluation suite file
    (``configs/suites/ood.yaml``): the checkpoint is also evaluated on its families; the figures go into the
    report (``suite``), its rows beside it (``suite-rows.parquet``), and each family's figures to MLflow.
    """
    log = get_run_logger()
    cfg = resolve_config(config, overrides, None)
    the_suite = None
    if suite:
        from rlcr.evaluation.suite import load_suite

        the_suite = load_suite(suite)  # before any work: a bad file is one line
    run_id = run_id or cfg.run.id or newest_run(Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url))
    if not run_id:
        raise NoCommittedIteration(f"no run with a committed iteration under {cfg.storage.uri}: nothing to probe")
    iteration, checkpoint = newest_checkpoint(cfg, run_id, iteration)
    cfg, note = with_run_task(cfg, RunStore.open(cfg, run_id).stored_config(), run_id, override_names(overrides))
    if note:
        log.info("%s", note)
    _, held_out = task_sets(cfg)
    tasks = held_out[:num_tasks] if num_tasks else held_out
    log.info("probing run %s iteration %d (%s) on %d tasks of task %s", run_id, iteration, checkpoint, len(tasks),
             cfg.tasks.name)
    report = probe_task(cfg, checkpoint, tasks, samples)
    report.update(iteration=iteration, config_hash=cfg.config_hash(), **task_fields(cfg))
    suite_rows = None
    if the_suite is not None:
        report["suite"], suite_rows = suite_task(cfg, checkpoint, the_suite)
        pooled = report["suite"]["pooled"]
        log.info("suite %s: pooled accuracy %.3f, ECE %s over %d problems", the_suite.name, pooled["accuracy"],
                 pooled.get("ece"), pooled["n_tasks"])
    timestamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    uris = write_report_task(cfg, run_id, report, timestamp, suite_rows)
    report["run_id"] = run_id
    track_report(cfg, run_id, uris, log, report.get("suite"), iteration)
    create_markdown_artifact(
        key=probe_artifact_key(run_id),
        markdown=report_markdown(report, uris),
        description=f"rlcr probe of {run_id} iteration {iteration}",
    )
    m = report["metrics"]
    log.info("probe report %s: accuracy %.3f, AOC %s, ECE %s", uris["html"], m["accuracy"], m["aoc"],
             m["calibration"]["verbalized"]["ece"])
    return {"run_id": run_id, "iteration": iteration, "checkpoint_uri": checkpoint, "report": uris, **task_fields(cfg),
            "metrics": {k: m[k] for k in ("n_tasks", "accuracy", "aoc", "mc_full_mean", "confidence_parse_rate")},
            **({"suite": report["suite"]} if "suite" in report else {})}


def probe_deployment(config: str | None = None, cron: str | None = None, run_id: str | None = None,
                     suite: str | None = None):
    """The ``nightly`` deployment: cron (UTC) from the argument, else the config's ``probe.cron``; ``suite``: an
    evaluation suite file each probe also runs (checked now, so that a bad file fails the deployment, not the
    night)."""
    cfg = resolve_config(config, None, None)
    params: dict[str, Any] = {}
    if config:
        params["config"] = config
    if run_id:
        params["run_id"] = run_id
    if suite:
        from pathlib import Path

        from rlcr.evaluation.suite import load_suite

        load_suite(suite)
        params["suite"] = str(Path(suite).expanduser().resolve())
    return rlcr_probe.to_deployment(
        name="nightly",
        schedule=Cron(cron or cfg.probe.cron, timezone="UTC"),
        parameters=params,
        description="Nightly faithfulness probe + calibration report of a run's newest committed checkpoint",
    )


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Run the rlcr-probe flow without a Prefect server.")
    ap.add_argument("--config")
    ap.add_argument("--run-id")
    ap.add_argument("--num-tasks", type=int)
    ap.add_argument("--samples", type=int)
    ap.add_argument("--suite", help="an evaluation suite file (configs/suites/ood.yaml) to run too")
    ap.add_argument("overrides", nargs="*", help="field=value")
    a = ap.parse_args()
    print(rlcr_probe(config=a.config, overrides=a.overrides, run_id=a.run_id, num_tasks=a.num_tasks,
                     samples=a.samples, suite=a.suite))


if __name__ == "__main__":
    main()
