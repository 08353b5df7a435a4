"""``rlcr runs`` and ``rlcr runs show RUN``: the runs of the configured store, and one run's iterations, with
the ``RUN@ITERATION`` references the other commands take (:mod:`rlcr.runs.refs`)."""

from __future__ import annotations

from typing import Optional

import typer

from rlcr.cli.app import UserError, app
from rlcr.cli.inputs import check_storage, load, valid_run_id
from rlcr.ui.presentation import console, run_iterations_table, runs_table
from rlcr.untrusted import printable


@app.command(name="runs")
def runs(
    words: list[str] = typer.Argument(None, metavar="[show RUN] [section.field=value ...]",
                                      help="`show RUN`: that run's iterations; section.field=value overrides "
                                           "(storage.uri=… picks the store)."),
    config: Optional[str] = typer.Option(None, help="YAML config file (for storage.uri)."),
):
    """The runs in the configured store (storage.uri): id, task, method, committed / configured iterations,
    iterations with a checkpoint, the last held-out accuracy and ECE, and the state (running, finished,
    crashed, stopped: docs/guarantees.md §1). `rlcr runs show RUN` lists one run's iterations with the
    RUN@ITERATION references that `rlcr eval --checkpoint`, `rlcr probe --run-id` and model.name take. Reads only
    (no lease, nothing written or created): a read-only store will do."""
    words = list(words or [])
    show_run = None
    if words and words[0] == "show":
        if len(words) < 2 or "=" in words[1]:
            raise UserError("rlcr runs show: expected a run id (rlcr runs show RUN)")
        show_run, words = words[1], words[2:]
    bad = [w for w in words if "=" not in w]
    if bad:
        raise UserError(f"rlcr runs: unexpected argument {printable(repr(bad[0]), 80)} (expected `show RUN` "
                        f"or section.field=value)")
    cfg = load(config, words)
    check_storage(cfg, read_only=True)  # only reads: a read-only store will do, a missing one is not created
    from rlcr.runs.layout import RUNS
    from rlcr.runs.refs import iteration_rows, store_summaries
    from rlcr.storage import Store

    store = Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url, create=False)
    if show_run is None:
        rows, total = store_summaries(store)
        console.print(runs_table(rows, total, store.url(RUNS)))
        return
    run_id = valid_run_id(show_run, cfg, "RUN")
    console.print(run_iterations_table(run_id, iteration_rows(store, run_id)))
