"""``rlcr eval``, ``rlcr compare`` and ``rlcr probe``: options parsed, the evaluation, comparison or probe run, its
table printed.
Which rows a comparison may compare is :mod:`rlcr.evaluation.comparison`'s; the figures
:mod:`rlcr.evaluation.evaluate`'s; the tables
:mod:`rlcr.ui.presentation`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from rlcr.cli.app import UserError, app
from rlcr.cli.inputs import (
    VERBOSE_HELP,
    check_inputs,
    check_storage,
    existing_run,
    load,
    quiet,
    resolve_ref,
    run_and_iteration,
)
from rlcr.ui.presentation import (
    comparison_table,
    console,
    eval_table,
    probe_table,
    provenance_text,
    show,
    suite_comparison_table,
    suite_table,
)
from rlcr.ui.progress import step
from rlcr.untrusted import printable


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


def _write_records(records: str, target: tuple[Any, str], rows, cfg, policy: str, draw: int,
                   **extra: Any) -> None:
    """The per-answer rows, with their provenance, to the file :func:`_records_target` checked: create-only
    (a file that appeared during the evaluation is kept, not replaced)."""
    from rlcr.rollout.records import rows_to_table, with_provenance
    from rlcr.runs.refs import task_fields
    from rlcr.storage import AlreadyExists, Store

    store, name = target
    if store is None:  # local: the directory is made now, after the evaluation
        store = Store(str(Path(records).expanduser().parent))
    table = with_provenance(rows_to_table(rows, cfg.tasks.name), policy=policy, method=cfg.method.name, draw=draw,
                            eval_samples=cfg.eval.samples, eval_seed=cfg.tasks.eval_seed, config_hash=cfg.config_hash(),
                            **task_fields(cfg), **extra)
    try:
        store.write_parquet(name, table, exclusive=True)
    except AlreadyExists:
        console.print(f"[red]{show(records)} appeared during the evaluation; left as it was, rows not written[/red]")
        raise typer.Exit(1)
    console.print(f"per-answer rows: {show(store.url(name))}")


def run_task(cfg, run_id: str, overrides: list[str], option: str):
    """``cfg`` with the task (and task options) run ``run_id`` was trained on (:func:`rlcr.runs.refs.with_run_task`):
    a line where that replaces the config's; a ``tasks.name``/``tasks.options`` on the command line that is not the
    run's is one line naming ``option`` and both, before any work."""
    from rlcr.cli.inputs import override_keys
    from rlcr.runs.refs import TaskMismatch, with_run_task
    from rlcr.untrusted import InvalidInput

    run = existing_run(cfg, run_id)
    try:
        cfg, note = with_run_task(cfg, run.stored_config(), run_id, override_keys(overrides))
    except TaskMismatch as e:
        raise UserError(f"{option}: {e}") from None
    except InvalidInput as e:  # a damaged config.json of the run
        raise UserError(f"{option}: {printable(e, 400)}") from None
    if note:
        console.print(note, markup=False, highlight=False)
    return cfg


def task_line(cfg) -> str:
    """The line that names the task an evaluation or probe ran on, and its options."""
    options = ", ".join(f"{k}={v!r}" for k, v in sorted(cfg.tasks.options.items()))
    return f"task: {cfg.tasks.name}" + (f" ({options})" if options else "")


@app.command("eval")
def evaluate(
    config: Optional[str] = typer.Option(None, help="YAML config file."),
    checkpoint: Optional[str] = typer.Option(None, help="A run's checkpoint, RUN@ITERATION or RUN@latest (in the "
                                                        "config's storage; `rlcr runs` lists them), or a checkpoint "
                                                        "directory or URI (default: the config's model)."),
    records: Optional[str] = typer.Option(None, help="Also write the per-answer rows to this new Parquet file, "
                                                     "a local path or a URI such as s3://bucket/prefix/rows.parquet "
                                                     "(for `rlcr compare`)."),
    draw: int = typer.Option(0, min=0, help="Sample draw: 0 samples what the flow's evaluations sample; "
                                            "k > 0 re-samples the same tasks with other seeds (how much "
                                            "one evaluation moves between draws)."),
    suite: Optional[str] = typer.Option(None, help="An evaluation suite file (configs/suites/ood.yaml): its "
                                                   "families' problems instead of the task's held-out set, "
                                                   "each family's figures and the pooled ones."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
):
    """Held-out accuracy, format rate and calibration (docs/design.md §13) of one checkpoint; with --suite, on
    each family of an evaluation suite (docs/probe.md)."""
    cfg = load(config, overrides or [])
    the_suite = _suite(suite) if suite is not None else None  # before any work
    target = _records_target(records, cfg) if records is not None else None
    from rlcr.runs.refs import is_run_ref

    ref = checkpoint if checkpoint and is_run_ref(checkpoint) else None
    if ref:
        checkpoint = resolve_ref(cfg, checkpoint, "--checkpoint")
        cfg = run_task(cfg, ref.rsplit("@", 1)[0], overrides or [], "--checkpoint")
    if the_suite is not None:
        return _evaluate_suite(cfg, the_suite, checkpoint, ref, records, target, draw, verbose)
    check_inputs(cfg, checkpoint, "--checkpoint" if checkpoint else "model")
    if checkpoint and "://" in checkpoint:
        check_storage(cfg, uri=checkpoint)
    from rlcr.evaluation.evaluate import evaluate_policy
    from rlcr.models.source import import_model
    from rlcr.rollout.engine import EnginePool
    from rlcr.runs.cluster import ensure_ray
    from rlcr.runs.store import task_sets
    from rlcr.storage import Store

    policy = checkpoint or import_model(cfg.model.name,
                                        Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url),
                                        chat_template=cfg.model.chat_template)
    try:
        _, held_out = task_sets(cfg)
    except ValueError as e:  # a task file's row (TaskFormatError), or sets that cannot be made
        raise UserError(f"task error: {printable(e, 1000)}") from None
    run_id = ref.rsplit("@", 1)[0] if ref else None
    from rlcr.tasks.registry import get_task

    label = policy_label(ref, policy)
    with quiet("eval", run_id, verbose):  # rlcr's lines, the table included, inside: the console is the terminal's
        with step(f"evaluating {printable(label)} on {len(held_out)} held-out tasks"):
            ensure_ray(cfg)
            with EnginePool(cfg, policy) as engines:
                m, rows = evaluate_policy(cfg, held_out, policy_uri=policy, iteration=0, engines=engines, draw=draw)
        if target is not None:
            _write_records(records, target, rows, cfg, policy, draw)
        console.print(eval_table(label, cfg.method.name, draw, m, stratum=get_task(cfg.tasks.name).stratum_label))
        if label != policy or label not in eval_table(label, cfg.method.name, draw, m).title:
            console.print(f"checkpoint: {printable(policy, 1000)}", markup=False, highlight=False, soft_wrap=True)
        console.print(printable(task_line(cfg), 1000), markup=False, highlight=False)


def _suite(path: str):
    """The suite file ``path``, checked (one line naming the file and the field, exit code 2)."""
    from rlcr.evaluation.suite import load_suite
    from rlcr.untrusted import InvalidInput

    try:
        return load_suite(path)
    except InvalidInput as e:
        raise typer.BadParameter(printable(e, 600), param_hint="--suite") from None


def _evaluate_suite(cfg, suite, checkpoint: Optional[str], ref: Optional[str], records: Optional[str], target,
                    draw: int, verbose: bool) -> None:
    """`rlcr eval --suite`: the checkpoint on the suite's problems (the same for every checkpoint, none of its
    run's training problems), each family's figures and the pooled ones; the rows to ``records``."""
    from rlcr.evaluation.suite import evaluate_suite, suite_config, suite_tasks
    from rlcr.models.source import import_model
    from rlcr.rollout.pipeline import check_prompt_lengths
    from rlcr.runs.cluster import ensure_ray
    from rlcr.storage import Store
    from rlcr.untrusted import InvalidInput

    check_inputs(cfg, checkpoint, "--checkpoint" if checkpoint else "model")
    if checkpoint and "://" in checkpoint:
        check_storage(cfg, uri=checkpoint)
    trained_on = cfg if ref else None
    policy = checkpoint or import_model(cfg.model.name,
                                        Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url),
                                        chat_template=cfg.model.chat_template)
    try:  # before Ray: a suite that cannot be drawn, or whose prompts the engine settings cannot hold
        problems = suite_tasks(cfg, suite, trained_on=trained_on)
        check_prompt_lengths(suite_config(cfg, suite), list(enumerate(problems)), policy)
    except (InvalidInput, ValueError) as e:
        raise UserError(f"--suite {printable(suite.name, 60)}: {printable(e, 600)}") from None
    n_problems = len(problems)
    label = policy_label(ref, policy)
    with quiet("eval", ref.rsplit("@", 1)[0] if ref else None, verbose):
        with step(f"evaluating {printable(label)} on suite {suite.name}: {n_problems} problems, "
                  f"{len(suite.families)} families"):
            ensure_ray(cfg)
            result, rows, suite_cfg = evaluate_suite(cfg, suite, policy, trained_on=trained_on, draw=draw,
                                                     problems=problems)
        if target is not None:
            _write_records(records, target, rows, suite_cfg, policy, draw, suite=suite.name, suite_seed=suite.seed)
        table = suite_table(label, suite.name, result)
        console.print(table)
        if label not in table.title:
            console.print(f"checkpoint: {printable(policy, 1000)}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"method: {printable(cfg.method.name, 40)}; the run's task: {printable(cfg.tasks.name, 60)}; "
                      f"suite seed {suite.seed}, {suite.n} problems a family", markup=False, highlight=False)


def policy_label(ref: Optional[str], policy: str) -> str:
    """What a title calls the evaluated policy: its run reference ``RUN@K`` (``RUN@latest`` as the iteration it
    named), else the path or URI it was given."""
    if not ref:
        return policy
    if ref.endswith("@latest"):
        import re

        found = re.findall(r"iter-0*(\d+)", policy)
        return f"{ref.rsplit('@', 1)[0]}@{found[-1]}" if found else ref
    return ref


@app.command()
def compare(
    run_a: str = typer.Argument(..., help="Run A (the difference is A minus B), RUN@K for its iteration K "
                                          "(RUN@latest: its last evaluated one), or a .parquet file of "
                                          "`rlcr eval --records`, or several such files of one policy's "
                                          "sample draws joined by '+' (pooled: more answers per task)."),
    run_b: str = typer.Argument(..., help="Run B, RUN@K, or a .parquet file, or draws joined by '+'."),
    iteration: Optional[int] = typer.Option(None, help="Iteration of the runs given without @K (0: their "
                                                       "initial policies); default: the last one they all "
                                                       "evaluated."),
    config: Optional[str] = typer.Option(None, help="YAML config file (for storage.uri)."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
):
    """Two runs' held-out evaluations, paired on the same tasks: each side's accuracy, ECE, Brier and AUROC on
    those tasks, and A − B with paired bootstrap 95% intervals over tasks (docs/design.md §13). RUN@K sides
    compare two iterations, of one run or of two (``first@2 first@latest``: what training changed)."""
    cfg = load(config, overrides or [])
    sides = (run_a, run_b)
    files = [s.endswith(".parquet") for s in sides]
    if not all(files):
        check_storage(cfg, read_only=True)  # compare only reads: a read-only store will do
    runs, pins = zip(*((None, None) if f else _compare_side(cfg, s, name)
                       for s, f, name in zip(sides, files, ("RUN_A", "RUN_B"))))
    from rlcr.evaluation.comparison import RowsRefused, compare_held_out  # torch: after the inputs are checked

    try:
        result = compare_held_out(sides, runs, iteration, n_resamples=cfg.eval.bootstrap_resamples,
                                  seed=cfg.tasks.eval_seed, pins=pins)
    except RowsRefused as e:
        raise typer.BadParameter(str(e), param_hint=e.param) from None
    console.print(comparison_table(run_a, run_b, result))
    if result.get("suite"):
        console.print(suite_comparison_table(result["suite"], result["by_family"]))
    console.print(f"task: {printable(result['task'], 80)}", markup=False, highlight=False)
    for name, fields in zip("AB", result["sources"]):
        if fields:
            console.print(f"{name}: {provenance_text(fields)}")


def _compare_side(cfg, side: str, name: str):
    """A run side of `rlcr compare`: (the run, the iteration its ``@`` names: K, ``"latest"``, or None for a bare
    run). A reference that is also the id of a run in the store is refused as ambiguous; a reference to a run
    that is not there says how it was read."""
    from rlcr.runs.refs import LATEST
    from rlcr.runs.store import RunStore
    from rlcr.storage import RUN_ID_PATTERN

    run_id, iteration = run_and_iteration(side, cfg, name)
    if run_id == side:
        return existing_run(cfg, run_id), None
    at = LATEST if iteration is None else iteration
    read = f"{name}: {printable(side, 140)!r} is read as iteration {at} of run {printable(run_id, 140)!r}"
    literal = RunStore.open(cfg, side) if RUN_ID_PATTERN.fullmatch(side) else None  # could a run have this id?
    if literal is not None and literal.store.exists(literal.prefix):
        raise UserError(f"{read}, but a run {printable(side, 140)!r} exists too: the reference is ambiguous "
                        "(rename that run, or compare its `rlcr eval --records` file)")
    try:
        return existing_run(cfg, run_id), at
    except UserError as e:
        raise UserError(f"{read}; {e}") from None


@app.command()
def probe(
    config: Optional[str] = typer.Option(None, help="YAML config file."),
    run_id: str = typer.Option(..., help="Run whose newest committed checkpoint is probed; RUN@ITERATION probes "
                                         "that iteration's checkpoint."),
    overrides: list[str] = typer.Argument(None, help="section.field=value overrides."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP),
):
    """Faithfulness probe + calibration report of a run's newest checkpoint, or of RUN@ITERATION's (the
    `rlcr-probe` flow). A run that does not exist or has no such checkpoint is one line, exit code 2, before
    Prefect starts."""
    cfg = load(config, overrides or [])
    run_id, iteration = run_and_iteration(run_id, cfg, "--run-id")
    check_storage(cfg)
    last = existing_run(cfg, run_id).last_committed()
    if iteration is not None:
        resolve_ref(cfg, f"{run_id}@{iteration}", "--run-id")  # one line naming the iterations that have one
    elif last is None or not last.get("checkpoint_uri"):
        raise UserError(f"run {printable(repr(run_id), 140)} has no committed iteration yet: nothing to probe (train "
                        f"it first: rlcr train --run-id {printable(run_id, 140)})")
    cfg = run_task(cfg, run_id, overrides or [], "--run-id")
    from flows.probe import rlcr_probe

    with quiet("probe", run_id, verbose):
        with step("probing (forced answers along the reasoning)"):
            result = rlcr_probe(config=config, overrides=list(overrides or []), run_id=run_id, iteration=iteration)
        console.print(probe_table(result))
        console.print(printable(task_line(cfg), 1000), markup=False, highlight=False)
        console.print(f"report: [bold]{show(result['report'].get('html'))}[/bold]")
