"""Which held-out rows a paired comparison compares (docs/design.md §9): a run's at an iteration, a .parquet file
of `rlcr eval --records`, or several such files of one policy's sample draws pooled; the rules that refuse rows
that are not one evaluation, draws that are not of one policy, or the same answers counted twice. The figures
are :mod:`rlcr.evaluation.evaluate`'s; the CLI only parses options and prints (:mod:`rlcr.ui.presentation`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from rlcr.evaluation.evaluate import check_eval_rows, compare_evaluations, pool_draws, summarize_eval
from rlcr.rollout.records import provenance, read_records_table, table_to_rows
from rlcr.runs.refs import LATEST
from rlcr.untrusted import InvalidInput, printable

__all__ = ["RowsRefused", "evaluated_iterations", "read_records", "check_draws", "held_out_rows",
           "side_iterations", "compare_held_out", "rows_task", "LATEST"]

SIDES = "RUN_A/RUN_B"


class RowsRefused(InvalidInput):
    """Rows that cannot be compared; ``param`` names the input they came from (``RUN_A/RUN_B``, ``--iteration``)."""

    def __init__(self, message: str, param: str = SIDES):
        super().__init__(message)
        self.param = param


def evaluated_iterations(run) -> list[int]:
    """Iterations of a run (0: its initial policy) whose held-out evaluation kept per-answer rows."""
    its = [0] + [m["iteration"] for m in run.committed()]
    return [k for k in its if run.store.exists(run.eval_records_rel(k))]


def read_records(f: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The per-answer rows of one .parquet file of `rlcr eval --records`, checked to be one evaluation
    (:func:`rlcr.evaluation.evaluate.check_eval_rows`), and the provenance it holds; a one-line error naming the
    file."""
    from rlcr.columnar import TableTooLarge

    name = printable(f)
    if not Path(f).is_file():
        raise RowsRefused(f"{name}: no such file")
    try:
        table = read_records_table(f, f)  # bounded: schema, rows and decoded size checked before rows are read
        rows = table_to_rows(table)
    except TableTooLarge as e:
        raise RowsRefused(str(e)) from None
    except InvalidInput as e:  # not Parquet, or not the rollout schema
        reason = str(e).removeprefix(f"{name}: ")
        raise RowsRefused(f"{name}: not per-answer evaluation rows ({printable(reason, 300)})") from None
    except Exception as e:  # a column of the wrong type
        raise RowsRefused(f"{name}: not per-answer evaluation rows ({type(e).__name__}: {printable(e, 300)})") from None
    try:
        check_eval_rows(rows, f)
        return rows, provenance(table, f)
    except InvalidInput as e:
        raise RowsRefused(str(e)) from None


def rows_task(rows: Sequence[dict[str, Any]], source: str) -> str:
    """The name of the task a side's rows answered (the name they carry; for rows from before they carried
    one, the task whose columns they hold): RowsRefused naming ``source`` where that is none or ambiguous."""
    from rlcr.rollout.records import record_task, records_task_name

    try:
        return record_task(rows[0].keys() if rows else (), records_task_name(rows)).name
    except ValueError as e:
        raise RowsRefused(f"{printable(source, 140)}: {printable(e, 300)}") from None


def check_draws(files: Sequence[str], sources: Sequence[dict[str, Any]]) -> None:
    """What pooled files say of themselves must fit one policy, drawn anew each time."""
    known = [(f, s) for f, s in zip(files, sources) if s]
    for f, s in known[1:]:
        if s.get("policy") != known[0][1].get("policy") or s.get("method") != known[0][1].get("method"):
            raise RowsRefused(f"{printable(f)}: rows of {printable(s.get('policy'), 100)} "
                              f"({printable(s.get('method'), 40)}), but {printable(known[0][0])} holds "
                              f"{printable(known[0][1].get('policy'), 100)} "
                              f"({printable(known[0][1].get('method'), 40)}); "
                              "pooled files must be draws of one policy")
    seen: dict[str, str] = {}
    for f, s in known:  # the draw as its JSON text: a hand-written file may hold any JSON value there
        first = seen.setdefault(json.dumps(s["draw"]), f) if "draw" in s else f
        if first != f:
            raise RowsRefused(f"{printable(f)}: sample draw {printable(s['draw'], 60)}, as {printable(first)} "
                              "— the same answers twice; pool different draws (`rlcr eval --draw k`)")


def held_out_rows(side: str, run, iteration: Optional[int]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The per-answer held-out rows of one side of a comparison — a run's at ``iteration``, a .parquet file's,
    or those of several files joined by '+' (sample draws of one policy, pooled by
    :func:`rlcr.evaluation.evaluate.pool_draws`) — and, for files `rlcr eval --records` wrote, where they came from."""
    if run is not None:
        table = run.eval_table(iteration)
        rows = None if table is None else table_to_rows(table)
        if rows is None:
            raise RowsRefused(f"run {run.run_id!r} kept no held-out rows for iteration {iteration} "
                              f"(it has them for {evaluated_iterations(run) or 'none'})", "--iteration")
        try:
            check_eval_rows(rows, run.store.url(run.eval_records_rel(iteration)))
        except InvalidInput as e:
            raise RowsRefused(str(e)) from None
        return rows, {}
    files = [side] if Path(side).is_file() else side.split("+")  # a file whose own name holds '+' is one file
    if len(set(map(os.path.realpath, files))) < len(files):
        raise RowsRefused(f"{printable(side)}: a file is named twice (its answers would count twice)")
    draws, sources = zip(*(read_records(f) for f in files))
    if len(files) == 1:
        return draws[0], sources[0]
    check_draws(files, list(sources))
    try:
        rows = pool_draws(draws)
    except ValueError as e:
        raise RowsRefused(f"{printable(side)}: {printable(e, 300)}") from None
    known = [s for s in sources if s]
    pooled = {"pooled": " + ".join(Path(f).name + (f" (draw {s['draw']})" if "draw" in s else "")
                                   for f, s in zip(files, sources))}
    return rows, {**{k: v for k, v in (known[0] if known else {}).items() if k in ("policy", "method")}, **pooled}




def side_iterations(runs: Sequence[Any], pins: Sequence[Any], iteration: Optional[int],
                    names: Sequence[str] = ("RUN_A", "RUN_B")) -> list[Optional[int]]:
    """The iteration each side is read at (None for a file). A side pinned by ``RUN@K`` is read at K, one pinned
    by ``RUN@latest`` at its last evaluated iteration; the other runs at ``iteration`` (``--iteration``) or, when
    none is asked for, at the last iteration all of them evaluated. ``--iteration`` is refused where no side is
    a run given without ``@``; a pinned iteration must be committed (or 0) with held-out rows, else one line
    naming the side (``names``) and the iterations that have them."""
    free = [r for r, pin in zip(runs, pins) if r is not None and pin is None]
    if iteration is not None and not free:
        pinned = any(r is not None for r in runs)
        raise RowsRefused("applies to runs given without @ITERATION; here each run names its own" if pinned
                          else "applies to runs, not to .parquet files", "--iteration")
    if iteration is None and free:
        common = sorted(set.intersection(*(set(evaluated_iterations(r)) for r in free)))
        if not common:
            raise RowsRefused(f"{' and '.join(repr(r.run_id) for r in free)} kept per-answer "
                              "held-out rows for no common iteration")
        iteration = common[-1]
    out: list[Optional[int]] = []
    for run, pin, name in zip(runs, pins, names):
        if run is None or pin is None:
            out.append(None if run is None else iteration)
            continue
        held = evaluated_iterations(run)
        if pin == LATEST and not held:
            raise RowsRefused(f"run {run.run_id!r} kept per-answer held-out rows for no iteration", name)
        if pin != LATEST and pin not in held:
            raise RowsRefused(f"run {run.run_id!r} kept no held-out rows for committed iteration {pin} (it has them "
                              f"for {held or 'none'})", name)
        out.append(held[-1] if pin == LATEST else int(pin))
    if len(runs) == 2 and runs[0] is not None and runs[1] is not None and runs[0].run_id == runs[1].run_id \
            and out[0] == out[1]:
        raise RowsRefused(f"both sides are run {runs[0].run_id!r} at iteration {out[0]}: the same answers twice")
    return out


def compare_held_out(sides: Sequence[str], runs: Sequence[Any], iteration: Optional[int], *, n_resamples: int,
                     seed: int, pins: Optional[Sequence[Any]] = None) -> dict[str, Any]:
    """A − B on the held-out tasks both sides evaluated (:func:`rlcr.evaluation.evaluate.compare_evaluations`), and each
    side alone on those shared tasks, for scale: ``{"iteration", "iterations", "comparison", "sides",
    "sources"}``. ``pins``: per side, the iteration a ``RUN@K`` reference names (K or :data:`LATEST`; None: none,
    see :func:`side_iterations`); ``iteration`` is the one both runs share, or None where they differ. ``task``:
    the task both sides answered (sides of two tasks are refused in one line naming both)."""
    its = side_iterations(runs, pins or [None] * len(runs), iteration)
    rows, sources = zip(*(held_out_rows(side, run, k) for side, run, k in zip(sides, runs, its)))
    tasks = [rows_task(side_rows, side) for side_rows, side in zip(rows, sides)]
    if len(set(tasks)) > 1:
        raise RowsRefused(f"{printable(sides[0], 140)} holds answers to task {tasks[0]!r}, {printable(sides[1], 140)} "
                          f"to task {tasks[1]!r}: answers to different tasks cannot be paired")
    try:
        cmp = compare_evaluations(rows[0], rows[1], n_resamples=n_resamples, seed=seed)
    except ValueError as e:
        raise RowsRefused(printable(e, 500)) from None
    shared = set.intersection(*({r["prompt_id"] for r in side if r["sample_type"] == "answer"} for side in rows))
    alone = [summarize_eval([r for r in side if r["prompt_id"] in shared], n_resamples=n_resamples, seed=seed)
             for side in rows]
    at = {k for k in its if k is not None}
    out = {"iteration": at.pop() if len(at) == 1 else None, "iterations": its, "comparison": cmp, "sides": alone,
           "sources": list(sources), "task": tasks[0]}
    suites = {(s.get("suite"), s.get("suite_seed")) for s in sources}
    if len(suites) == 1 and None not in next(iter(suites)):  # two evaluations of one suite: per family too
        from rlcr.evaluation.suite import compare_suite

        out["suite"] = str(next(iter(suites))[0])
        out["by_family"] = compare_suite(rows[0], rows[1], n_resamples=n_resamples, seed=seed, pooled=cmp)
    return out
