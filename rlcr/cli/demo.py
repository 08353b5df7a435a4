"""``rlcr demo``: the main job end to end — SmolLM2 → format warm-start → RLCR iterations → a before → after
evaluation on a larger held-out set → probe — with a summary of each policy along the way and where the time
went."""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from typing import Optional

import typer

from rlcr.cli.app import app
from rlcr.cli.inputs import VERBOSE_HELP, check_inputs, check_storage, load, quiet, sft_overrides, valid_run_id
from rlcr.ui.presentation import comparison_table, console, demo_table, fmt, show, summary_table
from rlcr.ui.progress import StageProgress, committed_figures, step
from rlcr.untrusted import printable


@app.command()
def demo(
    config: str = typer.Option("configs/demo.yaml", help="YAML config of the demo run."),
    run_id: str = typer.Option("demo", help="Run name (an existing demo run is resumed)."),
    sft_tasks: Optional[int] = typer.Option(None, help="Solver tasks for the warm-start (overrides sft.tasks)."),
    sft_epochs: Optional[int] = typer.Option(None, help="Passes over the warm-start traces (overrides sft.epochs)."),
    probe_tasks: int = typer.Option(8, help="Held-out tasks in the final probe."),
    probe_samples: int = typer.Option(16, help="Forced answers per truncation point in the final probe."),
    final_tasks: int = typer.Option(256, min=0, help="Held-out tasks on which the warm-start and the final policy "
                                                     "are evaluated side by side (paired intervals); 0: skip, and "
                                                     "report the iterations' own evaluations."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
):
    """The main job: SmolLM2 → format warm-start → RLCR iterations → before/after evaluation → probe."""
    t_start = time.perf_counter()
    cfg = load(config, sft_overrides(sft_tasks, sft_epochs))
    run_id = valid_run_id(run_id, cfg)
    valid_run_id(f"{run_id}-sft", cfg, "--run-id (its warm-start run, <run-id>-sft)")
    check_inputs(cfg)
    check_storage(cfg)
    resume = shlex.join(["rlcr", "demo", "--config", config, "--run-id", run_id])
    with quiet("demo", run_id, verbose, lambda: "stopping (Ctrl-C): the demo is cancelled; its finished steps and "
                                               f"committed iterations are kept; resume with:\n{resume}"):
        _demo(cfg, config, run_id, probe_tasks, probe_samples, final_tasks, verbose, t_start)


def _demo(cfg, config: str, run_id: str, probe_tasks: int, probe_samples: int, final_tasks: int, verbose: bool,
          t_start: float) -> None:
    from flows.probe import rlcr_probe
    from flows.train import rlcr_train
    from rlcr import events
    from rlcr.evaluation.evaluate import evaluate_policy
    from rlcr.models.smollm2 import SMOLLM2
    from rlcr.models.source import import_model
    from rlcr.rollout.engine import EnginePool
    from rlcr.runs.cluster import ensure_ray
    from rlcr.runs.store import RunStore, task_sets
    from rlcr.train.sft import warm_start

    times: dict[str, float] = {}

    t0 = time.perf_counter()
    label = ("SmolLM2-135M-Instruct (GGUF → safetensors)" if cfg.model.name == SMOLLM2
             else printable(cfg.model.name, 120))
    with step(f"1/6 preparing {label}"):
        base = import_model(cfg.model.name, RunStore.open(cfg, run_id).store, chat_template=cfg.model.chat_template)
    times["prepare"] = time.perf_counter() - t0

    ensure_ray(cfg)
    _, held_out = task_sets(cfg)
    t0 = time.perf_counter()
    with step(f"2/6 evaluating the base model on {len(held_out)} held-out tasks"):
        with EnginePool(cfg, base) as engines:
            before, _ = evaluate_policy(cfg, held_out, policy_uri=base, iteration=0, engines=engines)
    times["eval base"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with step(f"3/6 format warm-start: SFT on {cfg.sft.tasks} solver traces × {cfg.sft.epochs} epochs "
              "(Ray Train; reused if sealed)"):
        sft_uri, _ = warm_start(cfg, run_id=f"{run_id}-sft")
    times["sft"] = time.perf_counter() - t0
    console.print(f"warm-started checkpoint: {show(sft_uri)}")

    t0 = time.perf_counter()
    overrides = [f"model.name={sft_uri}"]
    train_cfg = cfg.model_copy(update={"model.name": sft_uri})
    done = len(RunStore.open(train_cfg, run_id).committed())
    bar = StageProgress(train_cfg.run.iterations, done + 1, figures=committed_figures(train_cfg, run_id),
                        title="4/6 RLCR", redirect=verbose)
    with events.subscribed(bar.on_event), bar:
        rlcr_train(config=config, overrides=overrides, run_id=run_id)
    times["rlcr"] = time.perf_counter() - t0

    final = None
    if final_tasks:
        t0 = time.perf_counter()
        with step(f"5/6 the warm-start and the RLCR policy on {final_tasks} held-out tasks (same tasks and seeds; "
                  "reused if stored)"):
            final = final_evaluation(train_cfg, run_id, sft_uri, final_tasks)
        times["final eval"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with step(f"6/6 probe: {probe_tasks} tasks × {probe_samples} forced answers per truncation point"):
        probe_result = rlcr_probe(config=config, overrides=overrides, run_id=run_id,
                                  num_tasks=probe_tasks, samples=probe_samples)
    times["probe"] = time.perf_counter() - t0

    print_summary(train_cfg, run_id, before, len(held_out), final)
    html = probe_result.get("report", {}).get("html") if isinstance(probe_result, dict) else None
    console.print(f"probe report: [bold]{show(html or probe_result)}[/bold]")
    console.print("time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in times.items())
                  + f"; total {(time.perf_counter() - t_start) / 60:.1f} min")


def print_summary(cfg, run_id: str, base: dict, base_tasks: int, final: dict | None) -> None:
    """The run's settings, the policies' held-out figures (base, after SFT, after RLCR) and, with the larger
    evaluation (``final``), the change with its paired intervals; without it, the iterations' own evaluations."""
    from rlcr.runs.store import RunStore

    console.print(summary_table(run_id, cfg))
    if final is None:
        run = RunStore.open(cfg, run_id)
        after_sft = run.store.read_json(run.baseline_rel)["eval"]
        last = run.store.read_json(run.store.rel(run.last_committed()["metrics_uri"]))["eval"]
        console.print(demo_table([("base SmolLM2", base), ("after SFT", after_sft),
                                  (f"after RLCR ({run.last_committed()['iteration']} it.)", last)]))
        console.print(f"ECE before RLCR (after SFT): {fmt(after_sft.get('ece'))}  →  after RLCR: "
                      f"{fmt(last.get('ece'))}")
        return
    n = final["n_tasks"]
    console.print(demo_table([(f"base SmolLM2 ({base_tasks} tasks)", base), (f"after SFT ({n} tasks)", final["before"]),
                              (f"after RLCR ({final['iteration']} it., {n} tasks)", final["after"])]))
    console.print(f"ECE before RLCR (after SFT): {fmt(final['before'].get('ece'))}  →  after RLCR: "
                  f"{fmt(final['after'].get('ece'))}")
    console.print(comparison_table("after RLCR", "after SFT", {"comparison": final["comparison"], "iteration": None,
                                                               "sides": [final["after"], final["before"]]}))


def final_evaluation(cfg, run_id: str, before_uri: str, n_tasks: int) -> dict:
    """The warm-start (``before_uri``) and the run's newest checkpoint on ``n_tasks`` held-out tasks — drawn like the
    run's held-out set (``tasks.eval_seed``, strata in equal shares), none a training or warm-start task — with
    the same request seeds, and the change with paired bootstrap intervals
    (:func:`rlcr.evaluation.evaluate.evaluate_before_after`).

    Stored under the run (``final-eval/<key>``: both sides' per-answer rows as Parquet, then ``summary.json``,
    written last and create-only: it marks the evaluation complete, and the rows of one interrupted before it
    are written again), keyed by the two checkpoints, the task count and the config, so a re-run demo reads
    it back instead of evaluating again. Returns the summary: ``before``/``after`` metrics, ``comparison``, ``n_tasks``,
    ``iteration`` and both URIs."""
    from rlcr.evaluation.evaluate import evaluate_before_after
    from rlcr.rollout.records import rows_to_table
    from rlcr.runs.refs import newest_checkpoint
    from rlcr.runs.store import RunStore
    from rlcr.runs.task_sets import held_out_set, training_pool

    iteration, after_uri = newest_checkpoint(cfg, run_id)
    big = cfg.model_copy(update={"tasks.num_eval": n_tasks})
    run = RunStore.open(cfg, run_id)
    key = hashlib.sha256(json.dumps([before_uri, after_uri, n_tasks, big.config_hash()]).encode()).hexdigest()[:16]
    summary_rel = run.final_eval_rel(key, "summary.json")
    if run.store.exists(summary_rel):
        return read_summary(run.store.read_bytes(summary_rel), run.store.url(summary_rel))
    tasks = held_out_set(big, training_pool(big))
    result = evaluate_before_after(big, tasks, before_uri, after_uri, run_id=run_id)
    for side in ("before", "after"):
        run.store.write_parquet(run.final_eval_rel(key, f"{side}.parquet"),
                                rows_to_table(result[f"rows_{side}"], cfg.tasks.name))
    summary = {"n_tasks": len(tasks), "iteration": iteration, "before_uri": before_uri, "after_uri": after_uri,
               **{k: result[k] for k in ("before", "after", "comparison")}}
    run.store.write_json(summary_rel, summary, exclusive=True)
    return summary


def read_summary(data: bytes, source: str) -> dict:
    """A stored ``final-eval/<key>/summary.json``, checked before it is shown (bounded JSON, the fields the summary
    prints and their types): anything else is one line naming the file, and the stored rows stay as they are."""
    from rlcr.ui.presentation import CI_KEYS
    from rlcr.untrusted import InvalidInput, parse_json

    doc = parse_json(data, source, allow_nonfinite=True)

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def well_formed() -> bool:
        if not (isinstance(doc.get("n_tasks"), int) and isinstance(doc.get("iteration"), int)
                and isinstance(doc.get("before"), dict) and isinstance(doc.get("after"), dict)):
            return False
        differences = doc.get("comparison", {}).get("differences") if isinstance(doc.get("comparison"), dict) else None
        for k in CI_KEYS:
            d = differences.get(k) if isinstance(differences, dict) else None
            if not isinstance(d, dict) or not (d.get("difference") is None or number(d.get("difference"))):
                return False
            ci = d.get("ci")
            if not (ci is None or (isinstance(ci, list) and len(ci) == 2 and all(map(number, ci)))):
                return False
        return True

    if not well_formed():
        raise InvalidInput(f"{printable(source)}: not a before → after evaluation summary written by rlcr demo "
                           "(remove its folder to evaluate again)")
    return doc
