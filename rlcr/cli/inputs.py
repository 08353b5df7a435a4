"""What every ``rlcr`` command checks of its input before Ray or Prefect start: the config (a field named with
where it was set), the run id, the storage, the local model and task files, an existing run and its settings;
and the line that says where the logs go."""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from pathlib import Path
from typing import Callable, Iterator, Optional

from rich.console import Console

from rlcr.cli.app import UserError
from rlcr.ui.presentation import console
from rlcr.untrusted import printable

__all__ = ["load", "override_keys", "valid_run_id", "check_storage", "check_inputs", "existing_run", "check_resume",
           "logs_line", "quiet", "VERBOSE_HELP", "sft_overrides", "quiet_ray_data", "resolve_ref", "run_and_iteration"]


def quiet_ray_data() -> None:
    """The CLI shows its own rich progress: no per-dataset Ray Data INFO lines (its progress bars follow
    ``rollout.progress``, off by default)."""
    import logging

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled"


def load(config: Optional[str], overrides: list[str]):
    """The resolved config, or a one-line config error that names the field and whether the file or the command
    line set it (an unknown field: with the nearest field names)."""
    from rlcr.config import ConfigError, load_config

    quiet_ray_data()
    keys = override_keys(overrides)
    try:
        return load_config(config, overrides)
    except ConfigError as e:
        raise ConfigError(_explained(str(e), config, keys)) from None


def override_keys(overrides: list[str]) -> dict[str, str]:
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
        if key not in fields and key not in RLCRConfig.model_fields and not key.startswith("tasks.options."):
            raise ConfigError(f"unknown field {printable(repr(key), 80)} in the command-line argument "
                              f"{printable(repr(item), 120)}{_did_you_mean(key)}")
        keys[key] = item
    return keys


def _did_you_mean(name: str) -> str:
    """The nearest dotted field names to ``name`` (a flat name of older rlcr: its dotted name; a field name
    without its section: the fields of that name)."""
    from rlcr.config import FLAT_NAMES, RLCRConfig
    from rlcr.config.legacy import MOVED_NAMES

    fields = [dotted for dotted, _ in RLCRConfig.dotted_fields()]
    leaf = name.rsplit(".", 1)[-1]
    moved = FLAT_NAMES.get(name) or MOVED_NAMES.get(name)
    close = [moved] if moved else [f for f in fields if f.endswith("." + leaf)]
    close = close or difflib.get_close_matches(name, fields, n=3, cutoff=0.6)
    close = close or [f for f in fields if f.rsplit(".", 1)[-1] in difflib.get_close_matches(
        leaf, [g.rsplit(".", 1)[-1] for g in fields], n=3, cutoff=0.6)][:3]
    hint = "; did you mean " + " or ".join(repr(c) for c in close) + "?" if close else ""
    return f"{hint} (`rlcr config show` lists the fields)"


def _explained(message: str, config: Optional[str], keys: dict[str, str]) -> str:
    """A :class:`~rlcr.config.ConfigError`'s message with where each named field was set: an unknown field is the
    file's unless the command line set it (a task option: the command line's names are checked against the task
    only with the config); a field's bad value, the command line's when an argument set it (the field or its whole
    section)."""
    names = re.findall(r"unknown field '([^']*)'", message)
    if names and not any(names[0] == k or names[0].startswith(k + ".") for k in keys) and config is not None:
        return f"{message} in the config file" + ("" if "did you mean" in message else _did_you_mean(names[0]))
    named = re.findall(r"field '([^']*)'", message) + re.findall(r"\b([a-z]+\.[a-z_]+)\b", message)
    fields = list(dict.fromkeys(k for k in keys for f in named if f == k or f.startswith(k + ".")))
    if fields:
        return f"{message} (set on the command line: {', '.join(printable(keys[f], 120) for f in fields)})"
    return message


def valid_run_id(run_id: Optional[str], cfg, option: str = "--run-id") -> str:
    """A valid run id, or a one-line error naming where it came from."""
    from rlcr.storage import validate_run_id

    try:
        return validate_run_id(run_id if run_id is not None else cfg.run.id)
    except ValueError as e:
        raise UserError(f"{option if run_id is not None else 'run_id (config)'}: {e}") from None


def check_storage(cfg, uri: Optional[str] = None, *, read_only: bool = False) -> None:
    """The run's storage answers (:func:`rlcr.runs.cluster.check_storage_reachable`, bounded), before Ray or Prefect;
    ``read_only``: for a command that only reads (a read-only store will do; a missing one is refused)."""
    from rlcr.runs.cluster import check_storage_reachable

    check_storage_reachable(cfg, timeout_s=float(os.environ.get("RLCR_STORAGE_CHECK_TIMEOUT_S", "15")), uri=uri,
                            read_only=read_only)


def check_inputs(cfg, model: Optional[str] = None, option: str = "model") -> None:
    """What the run reads is there, before Ray starts: the model (a checkpoint directory with a tokenizer and a
    chat template, or a hub id the hub answers for: :func:`rlcr.models.source.check_model`), the task files, and the
    task itself (:func:`rlcr.runs.preflight.check_task`: its methods on one problem of its sets)."""
    from rlcr.models.source import ModelSourceError, check_model
    from rlcr.runs.refs import is_run_ref

    model = model if model is not None else cfg.model.name
    if is_run_ref(model):  # RUN@ITERATION: a committed, sealed checkpoint of a run in the configured store
        model = resolve_ref(cfg, model, "model.name" if option == "model" else option)
    try:
        check_model(model, chat_template=cfg.model.chat_template, label=option)
    except ModelSourceError as e:
        raise UserError(str(e)) from None
    remote = False
    for name in ("tasks.train_file", "tasks.eval_file"):
        path = cfg.get(name)
        remote = remote or (path is not None and "://" in path)
        if path is not None and "://" not in path and not Path(path).is_file():
            raise UserError(f"{name} {printable(path, 300)}: no such file")
    from rlcr.runs.preflight import TaskCheckError, check_task

    try:  # the task's own mistakes, now rather than after Ray and the engines started (task files on S3: the run's)
        check_task(cfg, sets=not remote)
    except TaskCheckError as e:
        raise UserError(str(e)) from None


def resolve_ref(cfg, ref: str, option: str) -> str:
    """The checkpoint URI that run reference ``ref`` (``RUN@ITERATION``, ``RUN@latest``) names in the configured
    store (:func:`rlcr.runs.refs.resolve_checkpoint`), or a one-line error naming ``option``."""
    from rlcr.runs.refs import RunRefError, resolve_checkpoint
    from rlcr.storage import Store

    check_storage(cfg, read_only=True)
    try:
        store = Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url, create=False)
        return resolve_checkpoint(store, ref, label=option)
    except RunRefError as e:
        raise UserError(str(e)) from None


def run_and_iteration(value: str, cfg, option: str) -> tuple[str, Optional[int]]:
    """``RUN`` or ``RUN@ITERATION`` / ``RUN@latest`` of an option that takes run ids: (valid run id, iteration or
    None)."""
    from rlcr.runs.refs import RunRefError, parse_ref

    try:
        parsed = parse_ref(value)
    except RunRefError as e:
        raise UserError(f"{option}: {e}") from None
    return parsed if parsed is not None else (valid_run_id(value, cfg, option), None)


def existing_run(cfg, run_id: str):
    """Run ``run_id`` under the config's storage, or a one-line error naming the storage and the runs it holds."""
    from rlcr.runs.layout import RUNS
    from rlcr.runs.store import RunStore, list_runs

    run = RunStore.open(cfg, run_id)
    if run.store.exists(run.prefix):
        return run
    runs = sorted(list_runs(run.store))
    shown = ", ".join(printable(r, 60) for r in runs[:10]) + (f", … ({len(runs)} runs)" if len(runs) > 10 else "")
    raise UserError(f"run {printable(repr(run_id), 140)} not found under {printable(run.store.url(RUNS), 300)} "
                    f"(runs there: {shown or 'none'}; storage.uri chooses the storage)")


def check_resume(run, cfg) -> None:
    """A run that exists is resumed with settings that give the same results (else RunConfigMismatch); a new one
    must have an id no run reference could be mistaken for (no ``@``: :func:`rlcr.storage.validate_new_run_id`)."""
    from rlcr.storage import validate_new_run_id

    if run.store.exists(run.config_rel):
        run.check_config(cfg)  # reads only: the file is there
    elif not run.store.exists(run.prefix):
        try:
            validate_new_run_id(run.run_id)
        except ValueError as e:
            raise UserError(f"run id: {e}") from None


def logs_line(log: Optional[Path] = None, out: Optional[Console] = None) -> str:
    """The lines at the start of a run: where the driver's output goes (``log``, the file :mod:`rlcr.ui.terminal`
    routes it to, or None: this terminal), and, where it is on, the Ray dashboard. Returns the full account
    (the Ray workers' logs, Prefect's flow runs, the dashboard), which a routed command writes atop its log file
    and a ``-v`` one prints here."""
    from rlcr.runs.cluster import ray_dashboard, ray_log_dir
    from rlcr.ui.terminal import display_path

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
    driver = "this terminal" if log is None else display_path(log)
    details = (f"logs: driver → {driver}; engines and trainer (Ray workers) → {workers} (worker-*.out/.err); "
               f"flow runs → Prefect, {prefect}; Ray dashboard: {dashboard}")
    out = out or console
    if log is None:
        out.print(details, markup=False, highlight=False, soft_wrap=True)
    else:
        out.print(f"logs: {driver} (Prefect, Ray, vLLM; -v shows them here)", markup=False, highlight=False,
                  soft_wrap=True)
        if on and not address:
            out.print("Ray dashboard: http://127.0.0.1:8265", markup=False, highlight=False)
    return details


VERBOSE_HELP = "Show Prefect's, Ray's, Ray Data's and vLLM's output here instead of in the log file."


@contextlib.contextmanager
def quiet(command: str, run_id: Optional[str], verbose: bool, acknowledge: Optional[Callable[[], str]] = None,
          farewell: Optional[Callable[[float], str]] = None) -> Iterator[None]:
    """The terminal of a command that starts Ray, vLLM or Prefect: the 'logs:' line, then everything but rlcr's
    own lines into ``rlcr-logs/[<run id>/]<command>-<time>.log`` (:mod:`rlcr.ui.terminal`); ``verbose``: here.
    A Ctrl-C is answered at once and ends the command within seconds, exit code 130 (:mod:`rlcr.cli.interrupt`):
    ``acknowledge()`` is its first line (default: the command is cancelled), ``farewell(seconds)`` its last."""
    from rlcr.cli.interrupt import interruptible
    from rlcr.ui.terminal import log_file, routed

    log = None if verbose else log_file(run_id, command)
    details = logs_line(log)
    ack = acknowledge or (lambda: f"stopping (Ctrl-C): rlcr {command} is cancelled")
    bye = farewell or (lambda seconds: f"stopped in {seconds:.1f} s (exit code 130)")
    with interruptible(ack, bye) as stop, routed(log, header=details, interrupted=lambda: stop.requested):
        yield


def sft_overrides(tasks: Optional[int], epochs: Optional[int]) -> list[str]:
    """The warm-start's command-line options as overrides of the config's ``sft.tasks`` / ``sft.epochs``."""
    return [f"{k}={v}" for k, v in (("sft.tasks", tasks), ("sft.epochs", epochs)) if v is not None]
