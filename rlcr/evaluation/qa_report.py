"""Per-evidence figures of ``qa`` evaluations (docs/tasks.md, "The QA task"): ``python -m rlcr.evaluation.qa_report
A.parquet [B.parquet]`` reads the per-answer rows of ``rlcr eval --records`` (checked by
:func:`rlcr.evaluation.comparison.read_records`, and to be answers to the ``qa`` task, as the rows name it) and prints
JSON
naming the task (``"task": "qa"``): per evidence state, the evaluation's figures with their
95% bootstrap intervals over tasks (:func:`rlcr.evaluation.evaluate.summarize_eval` on that stratum's rows), the mean
token
F1 of the answers (:func:`rlcr.tasks.qa.answer_f1`, which the rollout schema has no column for) and, given two
files of the same held-out set, A − B per stratum with paired intervals
(:func:`rlcr.evaluation.evaluate.compare_evaluations`) and the paired change of the mean stated confidence.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

import numpy as np

from rlcr.tasks.qa import answer_f1
from rlcr.tasks.registry import get_task

__all__ = ["evidence_figures", "evidence_differences", "main"]

_KEYS = ("n_tasks", "n_answers", "accuracy", "mean_confidence", "brier", "ece", "auroc", "confidence_parse_rate",
         "format_rate", "ci")


def _strata(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(str(r["evidence"]), []).append(r)
    return out


def evidence_figures(rows: Sequence[dict[str, Any]], *, n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """``{stratum: figures}`` of one evaluation's rows (and ``"all"``): summarize_eval's, plus ``f1``."""
    from rlcr.evaluation.evaluate import summarize_eval

    task = get_task("qa")
    out = {}
    for name, part in [*sorted(_strata(rows).items()), ("all", list(rows))]:
        figures = summarize_eval(part, n_resamples=n_resamples, seed=seed)
        answers = [r for r in part if r["sample_type"] == "answer"]
        f1 = [answer_f1(r["completion_text"], task.from_record(r)) for r in answers]
        out[name] = {**{k: figures.get(k) for k in _KEYS}, "f1": sum(f1) / len(f1) if f1 else None}
    return out


def _mean_confidence_by_task(rows: Sequence[dict[str, Any]]) -> dict[Any, float]:
    from rlcr.evaluation.evaluate import stated_confidences

    by: dict[Any, list[float]] = {}
    for pid, _, c in stated_confidences(rows):
        if c is not None:
            by.setdefault(pid, []).append(c)
    return {pid: float(np.mean(v)) for pid, v in by.items()}


def evidence_differences(rows_a: Sequence[dict[str, Any]], rows_b: Sequence[dict[str, Any]], *,
                         n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """A − B per stratum: compare_evaluations' differences, and ``mean_confidence``: the mean over the tasks
    both stated a confidence on of (A's mean confidence − B's), with a percentile bootstrap interval over tasks."""
    from rlcr.evaluation.evaluate import compare_evaluations

    a, b = _strata(rows_a), _strata(rows_b)
    out = {}
    for name in sorted(set(a) & set(b)):
        ca, cb = _mean_confidence_by_task(a[name]), _mean_confidence_by_task(b[name])
        d = np.array([ca[p] - cb[p] for p in sorted(set(ca) & set(cb))])
        rng = np.random.default_rng(seed)
        means = [float(d[rng.integers(0, d.size, d.size)].mean()) for _ in range(n_resamples)] if d.size else []
        out[name] = {**compare_evaluations(a[name], b[name], n_resamples=n_resamples, seed=seed),
                     "mean_confidence": {"difference": float(d.mean()) if d.size else None, "n_tasks": int(d.size),
                                         "ci": [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]
                                         if means else None}}
    return out


def main(argv: Sequence[str]) -> int:
    from rlcr.evaluation.comparison import read_records, rows_task
    from rlcr.untrusted import InvalidInput, printable

    if len(argv) not in (1, 2):
        print("usage: python -m rlcr.evaluation.qa_report A.parquet [B.parquet]", file=sys.stderr)
        return 2
    try:
        sides = [read_records(f)[0] for f in argv]
        for f, rows in zip(argv, sides):
            task = rows_task(rows, f) if rows else None
            if task != "qa":
                raise InvalidInput(f"{printable(f)}: not rows of the qa task ("
                                   f"{'no rows' if task is None else f'rows of task {printable(repr(task), 60)}'})")
    except InvalidInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    report: dict[str, Any] = {"task": "qa", "A": evidence_figures(sides[0])}
    if len(sides) == 2:
        report["B"] = evidence_figures(sides[1])
        report["A-B"] = evidence_differences(sides[0], sides[1])
    print(json.dumps(report, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
