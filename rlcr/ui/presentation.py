"""What a person reads: the ``rlcr`` command's console, numbers and file-given values made safe for it,
its tables (a run's summary, an evaluation, a comparison, a probe, the config), and the training flow's log
line and Prefect artifact of an iteration. Figures are computed elsewhere (:mod:`rlcr.evaluation.evaluate`); this
module only writes them out; the progress of long work is :mod:`rlcr.ui.progress`'s. Nothing here starts work."""

from __future__ import annotations

import math
import os
import time
from typing import Any, Optional

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlcr.untrusted import markdown_text, printable

__all__ = ["console", "fmt", "show", "summary_table", "provenance_text", "with_ci", "difference_text", "by_count_text",
           "metrics_markdown", "progress_line", "config_table", "eval_table", "comparison_table", "probe_table",
           "demo_table", "runs_table", "run_iterations_table"]

console = Console()
if not console.is_terminal and not os.environ.get("COLUMNS"):
    console.width = 140  # a log file has no width: rich would squeeze the summary tables into 80 columns


def fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v) if isinstance(v, int) else show(v, 40)  # a hand-edited metrics file may hold anything


def show(value: Any, limit: int = 200) -> str:
    """A value that came from a file (or from a value read from one) for rich output that reads markup: one
    line without control characters, at most ``limit`` characters (:func:`rlcr.untrusted.printable`), and its
    ``[`` escaped so rich shows it as it is."""
    return escape(printable(value, limit))


SUMMARY_COLUMNS = ("iter", "accuracy", "answer reward", "conf reward", "mean conf", "ECE", "Brier", "AUROC",
                   "parse rate")


def summary_table(run_id: str, cfg, width: Optional[int] = None):
    """Per-iteration held-out accuracy, rewards and calibration of a run, baseline first: one table where it
    fits ``width`` columns (default: the console's), else two (accuracy and rewards; calibration) with each
    interval on its own line in the cell, so that nothing is cut on an 80-column terminal."""
    from rich.console import Group
    from rich.measure import Measurement

    from rlcr.runs.store import RunStore

    run = RunStore.open(cfg, run_id)
    rows = []
    if run.store.exists(run.baseline_rel):
        rows.append(("0 (start)", run.store.read_json(run.baseline_rel)["eval"], {}))
    for m in run.committed():
        met = run.store.read_json(run.store.rel(m["metrics_uri"]))
        rows.append((str(m["iteration"]), met.get("eval", {}), met.get("rollout", {})))
    title = f"run {show(run_id)}  ({show(run.store.url(run.prefix))}); held-out figures with [95% bootstrap CI]"
    wide = _summary(title, SUMMARY_COLUMNS, rows, " ")
    width = width or console.width
    if Measurement.get(console, console.options.update_width(10_000), wide).maximum <= width:
        return wide
    rewards = _summary(title, ("iter", "accuracy", "answer reward", "conf reward", "parse rate"), rows, "\n")
    calibration = _summary(None, ("iter", "mean conf", "ECE", "Brier", "AUROC"), rows, "\n")
    return Group(rewards, calibration)


def _summary(title: Optional[str], columns: tuple[str, ...], rows, sep: str) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    for name, ev, ro in rows:
        cells = {"iter": name, "accuracy": with_ci(ev, "accuracy", sep=sep),
                 "answer reward": fmt(ro.get("answer/reward_mean")) if ro else "–",
                 "conf reward": fmt(ro.get("confidence/reward_mean")) if ro else "–",
                 "mean conf": fmt(ev.get("mean_confidence")), "ECE": with_ci(ev, "ece", sep=sep),
                 "Brier": with_ci(ev, "brier", sep=sep), "AUROC": with_ci(ev, "auroc", sep=sep),
                 "parse rate": fmt(ev.get("confidence_parse_rate"))}
        table.add_row(*(cells[c] for c in columns))
    return table


def provenance_text(fields: dict[str, Any]) -> str:
    """One line for a records file's provenance: its policy, method, sample draw and answers per task; each
    field is a file's own words, shown bounded, without control characters and never read as rich markup."""
    parts = [f"{k} {printable(fields[k], 200)}" for k in ("policy", "method", "draw", "eval_samples") if k in fields]
    if "pooled" in fields:
        parts.append(f"pooled {printable(fields['pooled'], 600)}")
    return escape(", ".join(parts))


# ----------------------------------------------------------------------------- figures as text


def difference_text(comparison: dict[str, Any], key: str, digits: int = 3) -> str:
    """``"-0.048 [-0.090, -0.007]"``: one difference of :func:`rlcr.evaluation.evaluate.compare_evaluations` with its
    interval."""
    d = comparison["differences"][key]
    if d["difference"] is None:
        return "–"
    ci = d["ci"]
    return f"{d['difference']:+.{digits}f}" + (f" [{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]" if ci else "")


def with_ci(metrics: dict[str, Any], key: str, digits: int = 3, sep: str = " ") -> str:
    """``"0.312 [0.271, 0.355]"``: a metric with its bootstrap interval (just the value where there is none)."""
    value = metrics.get(key)
    if not _is_number(value) or value != value:  # missing, NaN, or not a number (a hand-edited metrics file)
        return "–"
    text = f"{value:.{digits}f}"
    interval = (metrics.get("ci") or {}).get(key) if isinstance(metrics.get("ci"), dict) else None
    if not (isinstance(interval, (list, tuple)) and len(interval) == 2 and all(map(_is_number, interval))):
        return text
    return f"{text}{sep}[{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def by_count_text(metrics: dict[str, Any]) -> str:
    """``"2: acc 0.63, AUROC 0.74 · 3: acc 0.07, AUROC 0.64"`` from ``metrics["by_count"]``, the figures of each
    stratum (``–`` where undefined; empty when the evaluation has no breakdown)."""
    def f(v):
        return "–" if v is None else f"{v:.2f}"

    return " · ".join(f"{show(n, 40)}: acc {f(b['accuracy'])}, AUROC {f(b['auroc'])}"
                      for n, b in (metrics.get("by_count") or {}).items())


def short(v: Any) -> str:
    """A figure in the flow's log and artifact: 4 significant digits, ``nan`` for NaN."""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def metrics_markdown(run_id: str, iteration: int, metrics: dict[str, Any], uris: dict[str, str]) -> str:
    """The Prefect markdown artifact of one iteration: its figures and timings, and links to its files; names
    and URIs (from task files and configs) escaped as Markdown text (:func:`rlcr.untrusted.markdown_text`)."""
    rollout, ev, upd, timings = metrics["rollout"], metrics["eval"], metrics["update"], metrics["timings"]

    def pair(a: str, b: str, of: dict = rollout) -> str:
        return f"{short(of.get(a))} / {short(of.get(b))}"

    rows = [
        ("answer reward mean / std", pair("answer/reward_mean", "answer/reward_std")),
        ("confidence reward mean / std", pair("confidence/reward_mean", "confidence/reward_std")),
        ("answer / confidence length", pair("answer/length_mean", "confidence/length_mean")),
        ("tokens generated / trained", pair("tokens/generated", "tokens/trained")),
        ("held-out tasks × answers", f"{ev.get('n_tasks', '–')} × {ev.get('n_answers', '–')}"),
        ("held-out accuracy [95% CI]", with_ci(ev, "accuracy")),
        ("held-out mean confidence", short(ev.get("mean_confidence"))),
        ("held-out ECE (10 bins) [95% CI]", with_ci(ev, "ece")),
        ("held-out Brier [95% CI]", with_ci(ev, "brier")),
        ("held-out AUROC [95% CI]", with_ci(ev, "auroc")),
        ("held-out by stratum", _by_stratum_markdown(ev) or "–"),
        ("held-out per-answer rows", markdown_text(ev.get("records_uri") or "–", 400)),
        ("confidence parse rate", short(ev.get("confidence_parse_rate"))),
        ("update loss", short(upd.get("loss"))),
        ("grad norm", short(upd.get("grad_norm"))),
    ] + [(f"time: {k}", f"{v:.1f} s") for k, v in timings.items()]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    links = "\n".join(f"- {k}: {markdown_text(v, 400)}" for k, v in uris.items())
    return (f"# rlcr run {markdown_text(run_id)} — iteration {iteration}\n\n| metric | value |\n|---|---|\n"
            f"{table}\n\n{links}\n")


def _by_stratum_markdown(metrics: dict[str, Any]) -> str:
    """:func:`by_count_text` for Markdown: the strata's names (a task file's values) escaped as Markdown text."""
    def f(v):
        return "–" if v is None else f"{v:.2f}"

    return " · ".join(f"{markdown_text(n, 40)}: acc {f(b['accuracy'])}, AUROC {f(b['auroc'])}"
                      for n, b in (metrics.get("by_count") or {}).items())


def progress_line(metrics: dict) -> str:
    """The flow's log line of an iteration: held-out accuracy and ECE when it evaluated, else the training
    rollout's accuracy and mean confidence (labelled as such: the rollout's prompts are training prompts); then
    the answers' mean engine–trainer log-prob mismatch |Δ log π| (docs/design.md §11) where it was measured."""
    ev, ro = metrics["eval"], metrics["rollout"]
    mm = (metrics.get("update") or {}).get("mismatch/answer/mean_abs")
    tail = f", logπ mismatch {short(mm)}" if mm is not None else ""
    if ev:
        return f"held-out accuracy {short(ev.get('accuracy', math.nan))}, ECE {short(ev.get('ece', math.nan))}{tail}"
    conf = f", mean confidence {short(ro['confidence/mean'])}" if "confidence/mean" in ro else ""
    return (f"rollout accuracy {short(ro.get('answer/accuracy', math.nan))}{conf}{tail} (no held-out evaluation this "
            "iteration)")


# ----------------------------------------------------------------------------- the CLI's tables

CI_KEYS = ("accuracy", "ece", "brier", "auroc")


def config_table(rows: list[dict[str, Any]], title: str) -> Table:
    """`rlcr config show`: each field's value, who set it, whether it changes results, its documentation."""
    import json

    table = Table(title=title, show_lines=True)
    for col, kw in (("field", {"no_wrap": True}), ("value", {"max_width": 40}), ("set by", {}), ("results", {}),
                    ("documentation", {"ratio": 1})):
        table.add_column(col, **kw)
    for r in rows:
        table.add_row(r["field"], show(json.dumps(r["value"], ensure_ascii=False), 300), r["set_by"],
                      "changes" if r["changes_results"] else "operational", escape(r["doc"]))
    return table


EVAL_TITLE_WIDTH = 80
"""The widest title of ``rlcr eval``'s table: one 80-column line, never a word cut."""


def eval_table(policy: str, method: str, draw: int, m: dict[str, Any], stratum: str = "stratum") -> Table:
    """`rlcr eval`: one policy's held-out figures with their bootstrap intervals (by ``stratum``: the task's
    :attr:`~rlcr.tasks.base.Task.stratum_label`). ``policy``: what the title calls it (``RUN@K``, or its path,
    left out of the title where it would not fit one line of :data:`EVAL_TITLE_WIDTH`); the table is as wide as
    its title."""
    drawn = f", sample draw {draw}" if draw else ""
    rest = f"(method {printable(method, 40)}{drawn}; [95% bootstrap CI over tasks])"
    name = printable(policy, 200)
    title = f"held-out evaluation of {name} {rest}"
    if len(title) > EVAL_TITLE_WIDTH:  # a long path would be cut mid-word: the caller prints it on a line of its own
        title = f"held-out evaluation {rest}"
    table = Table(title=escape(title), min_width=min(EVAL_TITLE_WIDTH, len(title)))
    for k in ("n_tasks", "n_answers", "format_rate", "confidence_parse_rate", "mean_confidence"):
        table.add_row(k, fmt(m.get(k)))
    for k in CI_KEYS:
        table.add_row(k, with_ci(m, k))
    if by_count_text(m):
        table.add_row(f"by {stratum}", by_count_text(m))
    return table


def comparison_table(side_a: str, side_b: str, result: dict[str, Any]) -> Table:
    """`rlcr compare`: each side on the shared tasks, A − B with its paired interval, and whether it is resolved
    (``result``: :func:`rlcr.evaluation.comparison.compare_held_out`)."""
    cmp, alone, iteration = result["comparison"], result["sides"], result["iteration"]
    its = result.get("iterations") or []
    where = f" at iteration {iteration}" if iteration is not None else ""
    if iteration is None and any(k is not None for k in its):  # two iterations: each side's named
        where = " (" + ", ".join(f"{name} at iteration {k}" for name, k in zip("AB", its) if k is not None) + ")"
    table = Table(title=f"{show(side_a)} − {show(side_b)}{where}: {cmp['n_tasks']} shared held-out tasks "
                        "[paired 95% bootstrap CI]")
    table.add_column("metric")
    for name, m in zip("AB", alone):
        table.add_column(f"{name} ({m['n_answers']} answers)")
    table.add_column("A − B")
    table.add_column("resolved")
    for k in CI_KEYS:
        ci = cmp["differences"][k]["ci"]
        table.add_row(k, *(with_ci(m, k) for m in alone), difference_text(cmp, k),
                      "–" if not ci else ("yes" if ci[0] > 0 or ci[1] < 0 else "no"))
    return table


def suite_table(policy: str, suite: str, result: dict[str, Any]) -> Table:
    """`rlcr eval --suite`: each family's figures and the pooled ones, each with its bootstrap interval on the
    line below its value (so that the table fits 80 columns); ``result``:
    :func:`rlcr.evaluation.suite.summarize_suite`."""
    title = f"suite {printable(suite, 60)}: {printable(policy, 200)} [95% bootstrap CI over problems]"
    if len(title) > EVAL_TITLE_WIDTH:
        title = f"suite {printable(suite, 60)} [95% bootstrap CI over problems]"
    table = Table(title=escape(title), show_lines=True)
    named = [*result["families"].items(), ("pooled", result["pooled"])]
    table.add_column("family", min_width=min(24, max(len(printable(f, 40)) for f, _ in named)), overflow="fold")
    for col in ("accuracy", "ECE", "Brier", "AUROC"):  # the interval below the value, over two lines
        table.add_column(col, justify="right")
    for family, m in named:
        parsed = fmt(m.get("confidence_parse_rate"), 2)
        table.add_row(f"{escape(printable(family, 40))}\n[dim]n {fmt(m.get('n_tasks'))}, conf parsed {parsed}[/dim]",
                      *(with_ci(m, k, sep="\n").replace(", ", ",\n") for k in CI_KEYS))
    return table


def suite_comparison_table(suite: str, result: dict[str, Any]) -> Table:
    """`rlcr compare` of two `rlcr eval --suite` files, after the pooled table that names A and B: A − B per family
    and pooled, each with its paired interval on the lines below (``result``:
    :func:`rlcr.evaluation.suite.compare_suite`)."""
    table = Table(title=f"suite {show(suite, 60)}, per family: A − B [paired 95% bootstrap CI]", show_lines=True)
    named = [*result["families"].items(), ("pooled", result["pooled"])]
    table.add_column("family", min_width=min(24, max(len(printable(f, 40)) for f, _ in named)), overflow="fold")
    for col in ("accuracy", "ECE", "Brier", "AUROC"):
        table.add_column(f"Δ {col}", justify="right")
    for family, cmp in named:
        table.add_row(f"{escape(printable(family, 40))}\n[dim]n {fmt(cmp.get('n_tasks'))}[/dim]",
                      *(difference_text(cmp, k).replace(" [", "\n[").replace(", ", ",\n") for k in CI_KEYS))
    return table


def probe_table(result: dict[str, Any]) -> Table:
    """`rlcr probe`: the probe's headline metrics."""
    table = Table(title=f"probe of {result['run_id']} iteration {result['iteration']}")
    for k, v in result["metrics"].items():
        table.add_row(k, fmt(v))
    return table


def demo_table(evaluations: list[tuple[str, dict[str, Any]]]) -> Table:
    """`rlcr demo`: the held-out figures of each policy along the way (base, after SFT, after RLCR)."""
    t = Table(title="warm-start and RLCR on held-out tasks")
    for col in ("policy", "format rate", "accuracy", "conf parse rate", "mean conf", "ECE", "Brier", "AUROC"):
        t.add_column(col, justify="right")
    for name, m in evaluations:
        t.add_row(name, fmt(m.get("format_rate")), with_ci(m, "accuracy"), fmt(m.get("confidence_parse_rate")),
                  fmt(m.get("mean_confidence")), with_ci(m, "ece"), with_ci(m, "brier"), with_ci(m, "auroc"))
    return t


def _iterations_text(ks: list[int]) -> str:
    """Iteration numbers, short: ``1, 2, 4`` or ``2 … 40 (20)``."""
    return ", ".join(map(str, ks)) if len(ks) <= 3 else f"{ks[0]} … {ks[-1]} ({len(ks)})"


def runs_table(rows: list[dict[str, Any]], total: int, where: str):
    """`rlcr runs`: a store's runs (:func:`rlcr.runs.refs.store_summaries`), within 80 columns; why a run stopped
    or crashed, where known, is a line under the table (its state marked ``*``)."""
    left = f"; the last {len(rows)} of {total} by name" if total > len(rows) else ""
    table = Table(title=f"runs in {show(where, 120)}{left}", title_justify="left")
    for col, kw in (("run", {"overflow": "fold", "ratio": 1}), ("task", {"max_width": 10}),
                    ("method", {"max_width": 12}), ("iters", {"justify": "right", "no_wrap": True}),
                    ("checkpoints", {"max_width": 14}), ("acc", {"justify": "right"}),
                    ("ECE", {"justify": "right"}), ("state", {"no_wrap": True})):
        table.add_column(col, **kw)
    notes = []
    for r in rows:
        state = r["state"] if not r.get("problem") else f"{r['state']}: {show(r['problem'], 120)}"
        if r.get("reason") and not r.get("problem"):  # why it stopped: a line under the table, not a wide cell
            notes.append(f"{show(r['id'], 128)}: {r['state']}, {show(r['reason'], 300)}")
            state += " *"
        iters = "–" if r.get("method") == "sft" and r["iterations"] is None else \
            f"{r['committed']}/{r['iterations'] if isinstance(r['iterations'], int) else '?'}"
        table.add_row(show(r["id"], 128), show(r["task"] or "–", 20), show(r["method"] or "–", 24), iters,
                      _iterations_text(r["checkpoints"]) or "–", fmt(r["accuracy"]), fmt(r["ece"]), state)
    if not notes:
        return table
    from rich.console import Group
    from rich.text import Text

    return Group(table, *(Text.from_markup(f"* {note}") for note in notes))


def run_iterations_table(run_id: str, rows: list[dict[str, Any]]) -> Table:
    """`rlcr runs show RUN`: one run's committed iterations (:func:`rlcr.runs.refs.iteration_rows`)."""
    table = Table(title=f"run {show(run_id, 128)}: held-out figures; checkpoint: its reference for --checkpoint "
                        "and model.name", title_justify="left")
    for col in ("iter", "accuracy", "ECE", "checkpoint", "committed (UTC)"):
        table.add_column(col, justify="right" if col in ("iter", "accuracy", "ECE") else "left")
    for r in rows:
        at = r["committed_at"]
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(at)) if _is_number(at) and 0 <= at < 1e11 else "–"
        table.add_row("0 (start)" if r["iteration"] == 0 else str(r["iteration"]), fmt(r["accuracy"]),
                      fmt(r["ece"]), show(r["checkpoint"], 140) if r["checkpoint"] else "–", when)
    return table
