"""``rlcr demo``: the main job end to end — SmolLM2 → format warm-start → RLCR iterations → probe — with a summary
of each policy along the way and where the time went."""

from __future__ import annotations

import time
from typing import Optional

import typer

from rlcr.cli.app import app
from rlcr.cli.inputs import check_inputs, check_storage, load, logs_line, sft_overrides, valid_run_id
from rlcr.presentation import StageProgress, committed_figures, console, demo_table, fmt, show, step, summary_table
from rlcr.untrusted import printable


@app.command()
def demo(
    config: str = typer.Option("configs/demo.yaml", help="YAML config of the demo run."),
    run_id: str = typer.Option("demo", help="Run name (an existing demo run is resumed)."),
    sft_tasks: Optional[int] = typer.Option(None, help="Solver tasks for the warm-start (overrides sft.tasks)."),
    sft_epochs: Optional[int] = typer.Option(None, help="Passes over the warm-start traces (overrides sft.epochs)."),
    probe_tasks: int = typer.Option(8, help="Held-out tasks in the final probe."),
    probe_samples: int = typer.Option(16, help="Forced answers per truncation point in the final probe."),
):
    """The main job: SmolLM2 → format warm-start → RLCR iterations → probe, with a summary."""
    t_start = time.perf_counter()
    cfg = load(config, sft_overrides(sft_tasks, sft_epochs))
    run_id = valid_run_id(run_id, cfg)
    valid_run_id(f"{run_id}-sft", cfg, "--run-id (its warm-start run, <run-id>-sft)")
    check_inputs(cfg)
    check_storage(cfg)
    logs_line()
    from flows.probe import rlcr_probe
    from flows.train import ensure_ray, rlcr_train
    from rlcr import events
    from rlcr.evaluate import evaluate_policy
    from rlcr.model_source import import_model
    from rlcr.models import SMOLLM2
    from rlcr.rollout.engine import EnginePool
    from rlcr.runs import RunStore, task_sets
    from rlcr.sft import warm_start

    times: dict[str, float] = {}

    t0 = time.perf_counter()
    label = "SmolLM2-135M-Instruct (GGUF → safetensors)" if cfg.model.name == SMOLLM2 else printable(cfg.model.name, 120)
    with step(f"1/5 preparing {label}"):
        base = import_model(cfg.model.name, RunStore.open(cfg, run_id).store, chat_template=cfg.model.chat_template)
    times["prepare"] = time.perf_counter() - t0

    ensure_ray()
    _, held_out = task_sets(cfg)
    t0 = time.perf_counter()
    with step(f"2/5 evaluating the base model on {len(held_out)} held-out tasks"):
        with EnginePool(cfg, base) as engines:
            before, _ = evaluate_policy(cfg, held_out, policy_uri=base, iteration=0, engines=engines)
    times["eval base"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with step(f"3/5 format warm-start: SFT on {cfg.sft.tasks} solver traces × {cfg.sft.epochs} epochs "
              "(Ray Train; reused if sealed)"):
        sft_uri, _ = warm_start(cfg, run_id=f"{run_id}-sft")
    times["sft"] = time.perf_counter() - t0
    console.print(f"warm-started checkpoint: {show(sft_uri)}")

    t0 = time.perf_counter()
    overrides = [f"model.name={sft_uri}"]
    train_cfg = cfg.model_copy(update={"model.name": sft_uri})
    done = len(RunStore.open(train_cfg, run_id).committed())
    bar = StageProgress(train_cfg.run.iterations, done + 1, figures=committed_figures(train_cfg, run_id), title="4/5 RLCR")
    with events.subscribed(bar.on_event), bar:
        rlcr_train(config=config, overrides=overrides, run_id=run_id)
    times["rlcr"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with step(f"5/5 probe: {probe_tasks} tasks × {probe_samples} forced answers per truncation point"):
        probe_result = rlcr_probe(config=config, overrides=overrides, run_id=run_id,
                                  num_tasks=probe_tasks, samples=probe_samples)
    times["probe"] = time.perf_counter() - t0

    run = RunStore.open(train_cfg, run_id)
    after_sft = run.store.read_json(run.baseline_rel)["eval"]
    last = run.store.read_json(run.store.rel(run.last_committed()["metrics_uri"]))["eval"]
    console.print(summary_table(run_id, train_cfg))
    console.print(demo_table([("base SmolLM2", before), ("after SFT", after_sft),
                              (f"after RLCR ({run.last_committed()['iteration']} it.)", last)]))
    console.print(f"ECE before RLCR (after SFT): {fmt(after_sft.get('ece'))}  →  after RLCR: {fmt(last.get('ece'))}")
    html = probe_result.get("report", {}).get("html") if isinstance(probe_result, dict) else None
    console.print(f"probe report: [bold]{show(html or probe_result)}[/bold]")
    console.print("time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in times.items())
                  + f"; total {(time.perf_counter() - t_start) / 60:.1f} min")
