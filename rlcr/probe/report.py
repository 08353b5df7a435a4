"""The probe report: ``report.json`` + a self-contained ``report.html`` in the run's storage (docs/design.md §15, §13).

Written to ``<storage>/runs/<run_id>/probes/<timestamp>/`` through
:class:`rlcr.storage.Store` (local or S3). Timestamps are UTC
``YYYYmmddTHHMMSSZ``, so the newest report is the last name in sort order.
The HTML embeds every plot as a base64 PNG (matplotlib, Agg backend) and loads
nothing from outside: it opens from a file, a bucket, or an attachment.

Plots: reliability diagrams (verbalized confidence; MC success rate at 100%),
confidence vs the share of reasoning shown (every task's curve, the mean curve
and its 10–90% band), histograms of the answer and confidence rewards.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import time
from typing import Any
from urllib.parse import quote

from rlcr.runs.layout import RunLayout
from rlcr.untrusted import markdown_text

__all__ = [
    "write_report", "render_html", "report_figures", "report_markdown", "latest_report", "to_json",
]


def _clean(obj: Any) -> Any:
    """NaN/inf → None (strict JSON), tuples → lists, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(_clean(report), indent=2, allow_nan=False)


# ----------------------------------------------------------------------------- figures


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _num(v, fmt: str = ".3f") -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _ci(cal: dict, key: str) -> str:
    """A calibration figure with its 95% bootstrap interval over tasks (``cal["ci"]``), when there is one."""
    interval = (cal.get("ci") or {}).get(key)
    return f"{_num(cal.get(key))} [{_num(interval[0])}, {_num(interval[1])}]" if interval else _num(cal.get(key))


def _reliability(ax, cal: dict, title: str, color: str) -> None:
    ax.plot([0, 1], [0, 1], ls="--", color="0.5", lw=1, label="perfect calibration")
    bins = [b for b in cal["reliability"] if b["count"]]
    if bins:
        centers = [(b["lo"] + b["hi"]) / 2 for b in bins]
        ax.bar(centers, [b["accuracy"] for b in bins], width=0.09, color=color, alpha=0.6, edgecolor="black",
               label="accuracy per bin")
        # the calibration gap of each bin: from its accuracy to its mean confidence
        ax.bar(centers, [b["mean_confidence"] - b["accuracy"] for b in bins], bottom=[b["accuracy"] for b in bins],
               width=0.09, color="tab:red", alpha=0.25, edgecolor="tab:red", hatch="//", label="gap to mean confidence")
        ax.plot([b["mean_confidence"] for b in bins], [b["accuracy"] for b in bins], "o", color="black", ms=4,
                label="(mean confidence, accuracy)")
        for b in bins:
            ax.annotate(str(b["count"]), ((b["lo"] + b["hi"]) / 2, b["accuracy"]), ha="center", va="bottom", fontsize=7)
    else:
        ax.text(0.5, 0.5, "no parseable confidences", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlim=(0, 1), ylim=(0, 1.05), xlabel="confidence", ylabel="accuracy",
           title=f"{title}\nn={cal['n']}  ECE={_num(cal['ece'])}  Brier={_num(cal['brier'])}  "
                 f"AUROC={_num(cal['auroc'])}")
    ax.legend(fontsize=7, loc="upper left")


def report_figures(report: dict[str, Any]) -> dict[str, str]:
    """name → base64 PNG of each plot."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    m, tasks = report["metrics"], report["tasks"]
    figs = {}

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    _reliability(axes[0], m["calibration"]["verbalized"], "verbalized confidence (turn 2)", "tab:blue")
    _reliability(axes[1], m["calibration"]["mc_full"], "Monte-Carlo success rate at 100% reasoning", "tab:orange")
    figs["reliability"] = _png(fig)

    fig, ax = plt.subplots(figsize=(10, 4.5))
    cmap = plt.get_cmap("viridis")
    for i, r in enumerate(tasks):
        ax.plot([p["fraction"] for p in r["points"]], [p["confidence"] for p in r["points"]], "-o", ms=2.5, lw=0.8,
                alpha=0.45, color=cmap(i / max(1, len(tasks) - 1)))
    mc = m["mean_curve"]
    if mc["n"]:
        ax.fill_between(mc["x"], mc["p10"], mc["p90"], color="tab:red", alpha=0.15, label="10–90% of tasks")
        ax.plot(mc["x"], mc["mean"], color="tab:red", lw=2.5, label=f"mean over {mc['n']} tasks")
        ax.legend(fontsize=8, loc="upper left")
    ax.set(xlim=(-0.02, 1.02), ylim=(-0.03, 1.03), xlabel="share of reasoning tokens shown",
           ylabel="P(forced answer correct)",
           title=f"early answering: confidence vs truncation (AOC = {_num(m['aoc'])}, "
                 f"N = {report['settings']['samples']} per point, {report['settings']['truncation']})")
    figs["truncation"] = _png(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ans = [r["answer_correct"] for r in tasks]
    axes[0].hist(ans, bins=[-0.25, 0.25, 0.75, 1.25], color="tab:green", edgecolor="black")
    axes[0].set(xticks=[0, 1], xlabel="answer reward (accuracy)", ylabel="tasks",
                title=f"answer reward: mean {_num(m['accuracy'])}")
    conf = [r["confidence_reward"] for r in tasks]
    axes[1].hist(conf, bins=10, range=(0, 1), color="tab:purple", edgecolor="black")
    axes[1].set(xlabel="confidence reward 1 − (acc − c)²  (0 if unparseable)", ylabel="tasks",
                title=f"confidence reward: parse rate {_num(m['confidence_parse_rate'])}")
    figs["rewards"] = _png(fig)
    return figs


# ----------------------------------------------------------------------------- HTML


def _metric_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    m = report["metrics"]
    v, mc, gap = m["calibration"]["verbalized"], m["calibration"]["mc_full"], m["verbalized_gap"]
    return [
        ("tasks", str(m["n_tasks"])),
        ("accuracy (turn-1 response) [95% CI]", _ci({**v, "accuracy": m["accuracy"]}, "accuracy")),
        ("format rate (an answer was extracted)", _num(m["format_rate"])),
        ("responses with reasoning", _num(m["reasoning_rate"])),
        ("truncation points per task", _num(m["points_per_task"], ".1f")),
        ("AOC (length-weighted, 1 − AUC)", _num(m["aoc"])),
        ("MC success at 0% / 100% reasoning", f"{_num(m['mc_zero_mean'])} / {_num(m['mc_full_mean'])}"),
        ("verbalized − MC@100%: mean / |mean| / RMSE",
         f"{_num(gap['mean'])} / {_num(gap['mean_abs'])} / {_num(gap['rmse'])} "
         f"(n={gap['n']}, unparsed {gap['n_unparsed']})"),
        ("confidence parse rate", _num(m["confidence_parse_rate"])),
        ("verbalized: mean confidence", _num(v["mean_confidence"])),
        ("verbalized: Brier [95% CI]", _ci(v, "brier")),
        ("verbalized: ECE (10 bins) [95% CI]", _ci(v, "ece")),
        ("verbalized: AUROC [95% CI]", _ci(v, "auroc")),
        ("MC@100% as confidence: Brier / ECE / AUROC [95% CI]",
         f"{_ci(mc, 'brier')} / {_ci(mc, 'ece')} / {_ci(mc, 'auroc')}"),
    ]


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;
vertical-align:top;font-size:13px}th{background:#f2f2f2}img{max-width:100%;display:block;margin:8px 0 20px}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}pre{white-space:pre-wrap;margin:0;
max-width:520px}.meta td:first-child{font-weight:600}
"""


def _suite_html(suite: dict[str, Any], e) -> str:
    """The evaluation suite's figures (:func:`rlcr.evaluation.suite.summarize_suite`), a row per family and the
    pool, each value with its 95% bootstrap interval."""
    def cell(m: dict[str, Any], key: str) -> str:
        v, ci = m.get(key), (m.get("ci") or {}).get(key) if isinstance(m.get("ci"), dict) else None
        if not isinstance(v, (int, float)) or v != v:
            return "–"
        ok = isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci)
        return f"{v:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ok else "")

    def _finite(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, (int, float)) and math.isfinite(v) else "–"

    families = suite.get("families") if isinstance(suite.get("families"), dict) else {}
    rows = [*families.items(), ("pooled", suite.get("pooled") or {})]
    head = (f"<h2>Suite {e(str(suite.get('suite', '')))}</h2><p>Held-out figures on each family of the evaluation "
            f"suite (seed {e(str(suite.get('suite_seed', '–')))}, {e(str(suite.get('n', '–')))} problems a family), "
            "with 95% bootstrap intervals over problems.</p><table><tr><th>family</th><th>n</th><th>accuracy</th>"
            "<th>ECE</th><th>Brier</th><th>AUROC</th><th>conf parsed</th></tr>")
    body = "".join(f"<tr><td>{e(str(name))}</td><td>{e(str(m.get('n_tasks', '–')))}</td>"
                   + "".join(f"<td>{e(cell(m, k))}</td>" for k in ("accuracy", "ece", "brier", "auroc"))
                   + f"<td>{e(_finite(m.get('confidence_parse_rate')))}</td></tr>"
                   for name, m in rows if isinstance(m, dict))
    return head + body + "</table>"


def render_html(report: dict[str, Any], figures: dict[str, str] | None = None) -> str:
    """The self-contained HTML page of a report (plots inline as data: URIs)."""
    figures = figures if figures is not None else report_figures(report)
    e = html.escape
    s = report["settings"]
    meta = [("run", report.get("run_id", "–")), ("iteration", report.get("iteration", "–")),
            ("task", report.get("task", "–")), ("task options", _options(report.get("task_options"))),
            ("checkpoint", report.get("checkpoint_uri", "–")), ("created (UTC)", report.get("created_at", "–")),
            ("forced-answer samples N", s["samples"]), ("truncation", s["truncation"]),
            ("temperature", s["temperature"]), ("seed", s["seed"])]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>rlcr probe report</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Faithfulness probe — {e(str(report.get('run_id', '')))}</h1>",
        "<table class='meta'>" + "".join(f"<tr><td>{e(k)}</td><td><code>{e(str(v))}</code></td></tr>" for k, v in meta)
        + "</table>",
        "<h2>Metrics</h2><table><tr><th>metric</th><th>value</th></tr>"
        + "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in _metric_rows(report)) + "</table>",
    ]
    captions = {
        "truncation": "Confidence vs truncation: each thin line is one task (forced answers after a prefix of its "
                      "reasoning); the thick line is the mean over tasks, the band spans 10–90% of tasks.",
        "reliability": "Reliability diagrams: accuracy per equal-width confidence bin (numbers: bin sizes); "
                       "the dashed diagonal is perfect calibration.",
        "rewards": "Rewards of the probed responses: accuracy of the turn-1 answer and the Brier confidence reward.",
    }
    for name in ("truncation", "reliability", "rewards"):
        if name in figures:
            parts.append(f"<h2>{e(name.capitalize())}</h2><p>{e(captions[name])}</p>"
                         f"<img alt='{e(name)}' src='data:image/png;base64,{figures[name]}'>")
    if isinstance(report.get("suite"), dict):
        parts.append(_suite_html(report["suite"], e))
    shown = "nums → target" if report["tasks"] and all(_as_nums_target(r) for r in report["tasks"]) else "task"
    parts.append(f"<h2>Tasks</h2><table><tr><th>#</th><th>{shown}</th>"
                 "<th>response</th><th>correct</th>"
                 "<th>verbalized</th><th>MC@0%</th><th>MC@100%</th><th>points</th><th>AOC</th></tr>")
    for r in report["tasks"]:
        resp = r["response"] if len(r["response"]) <= 400 else r["response"][:400] + " …"
        parts.append(
            f"<tr><td>{r['index']}</td><td>{_task_cell(r, e)}</td><td><pre>{e(resp)}</pre></td>"
            f"<td>{_num(r['answer_correct'], '.0f')}</td><td>{_num(r['verbalized_confidence'], '.2f')}</td>"
            f"<td>{_num(r['mc_zero'], '.2f')}</td><td>{_num(r['mc_full'], '.2f')}</td><td>{len(r['points'])}</td>"
            f"<td>{_num(r['aoc'], '.3f')}</td></tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- storage


def write_report(store, run_id: str, report: dict[str, Any], *, timestamp: str | None = None) -> dict[str, str]:
    """Write ``report.json`` and ``report.html`` under ``runs/<run_id>/probes/<timestamp>/``; return their URIs.

    The HTML is written first and the JSON last: a report directory with a
    ``report.json`` is complete.
    """
    timestamp = timestamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report = {**report, "run_id": run_id, "created_at": report.get("created_at") or timestamp}
    layout = RunLayout(store, run_id)
    html_rel, json_rel = layout.probe_rel(timestamp, "report.html"), layout.probe_rel(timestamp, "report.json")
    store.write_text(html_rel, render_html(report))
    store.write_bytes(json_rel, to_json(report).encode())
    return {"prefix": store.url(layout.probe_rel(timestamp)), "json": store.url(json_rel), "html": store.url(html_rel)}


def latest_report(store, run_id: str) -> tuple[str, dict[str, Any]] | None:
    """``(timestamp, report)`` of the newest complete probe report of a run, or None."""
    layout = RunLayout(store, run_id)
    for ts in reversed(store.ls(layout.probes_rel)):
        rel = layout.probe_rel(ts, "report.json")
        if store.exists(rel):
            return ts, store.read_json(rel)
    return None


def report_markdown(report: dict[str, Any], uris: dict[str, str]) -> str:
    """Markdown for the Prefect artifact: the metrics table and links to the report files."""
    rows = "\n".join(f"| {k} | {v} |" for k, v in _metric_rows(report))
    # names, options and URIs come from configs and files: escaped (markdown_text), link targets percent-encoded
    link = {k: quote(f"file://{v}" if v.startswith("/") else v, safe=":/?#@!$&'*+,;=%~") for k, v in uris.items()}
    md = markdown_text
    return (f"# rlcr probe — run {md(report.get('run_id'))}, iteration {md(report.get('iteration', '–'))}\n\n"
            f"task {md(report.get('task', '–'))} ({md(_options(report.get('task_options')), 400)}), "
            f"checkpoint {md(report.get('checkpoint_uri', '–'), 400)}\n\n| metric | value |\n|---|---|\n{rows}\n\n"
            f"- report: [{md(uris['html'], 400)}](<{link['html']}>)\n"
            f"- data: [{md(uris['json'], 400)}](<{link['json']}>)\n")


def _options(options: Any) -> str:
    """A report's task options as one short text (``–`` where the report names none)."""
    if not isinstance(options, dict) or not options:
        return "–" if options is None else "no options"
    return ", ".join(f"{k}={v!r}" for k, v in sorted(options.items()))


def _as_nums_target(r: dict) -> bool:
    """Whether :func:`_task_cell` shows the probed task ``r`` as ``nums → target`` (a record with Countdown's
    columns, whichever task the report names)."""
    return "nums" in r and "target" in r


def _task_cell(r: dict, e) -> str:
    """A probed task in the report's table: Countdown's ``nums → target``, math's ``question``, else the task's
    first record field (the key after ``index``: any task's ``to_record``)."""
    if _as_nums_target(r):
        return f"{e(str(r['nums']))} → {e(str(r['target']))}"
    first = next((k for k in r if k != "index"), "question")
    text = str(r.get("question", r.get(first, "")))
    return e(text if len(text) <= 200 else text[:200] + " …")
