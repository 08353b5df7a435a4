"""Held-out evaluation of a policy (docs/design.md §13, §9): ``eval.samples`` answers per task, each with one
stated confidence, and bootstrap 95% intervals over tasks.

Every method states a confidence: ``rlcr`` and ``rlvr`` in a second turn (the same confidence query),
``rlcr_single`` in its one response. This module computes figures; their text (a figure with its interval,
a difference, the breakdown by number count) is :mod:`rlcr.ui.presentation`'s.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from rlcr.config import RLCRConfig
from rlcr.core.methods import method_record
from rlcr.core.metrics import bootstrap_intervals, calibration_metrics, paired_bootstrap_differences
from rlcr.rollout.pipeline import build_rollout_dataset, check_prompt_lengths, to_records
from rlcr.seeds import eval_salt
from rlcr.untrusted import InvalidInput, printable

__all__ = ["evaluate_policy", "evaluate_before_after", "summarize_eval", "stated_confidences",
           "answers_with_confidence", "by_number_count", "by_stratum", "compare_evaluations",
           "pool_draws", "check_eval_rows"]

CI_LEVEL = 0.95


def answers_with_confidence(rows: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], float | None]]:
    """(answer row, its stated confidence or None) per evaluated answer, in answer order: the confidence of its
    (first) turn-2 confidence row, or, without turn 2 (``rlcr_single``), the one stated in the answer."""
    answers = sorted((r for r in rows if r["sample_type"] == "answer"), key=lambda r: (r["prompt_id"], r["answer_id"]))
    turn2: dict[tuple[int, int], float | None] = {}
    for r in sorted((r for r in rows if r["sample_type"] == "confidence"), key=lambda r: r["confidence_id"] or 0):
        turn2.setdefault((r["prompt_id"], r["answer_id"]), r["confidence"])
    if turn2:
        return [(a, turn2.get((a["prompt_id"], a["answer_id"]))) for a in answers]
    return [(a, a.get("confidence")) for a in answers]


def stated_confidences(rows: Sequence[dict[str, Any]]) -> list[tuple[Any, float, float | None]]:
    """``(prompt_id, correct, confidence or None)`` per evaluated answer, in answer order: the confidence of
    its (first) turn-2 confidence row, or, without turn 2 (``rlcr_single``), the one stated in the answer."""
    return [(a["prompt_id"], float(a["correct"]), c) for a, c in answers_with_confidence(rows)]


def _record_task(rows: Sequence[dict[str, Any]]):
    """The task the rows name (``task_name``), or for rows from before they named it, the one whose record
    columns they hold (Countdown's ``nums``/``target``, math's ``question``/…): :func:`record_task`. None for no
    rows (of no task)."""
    from rlcr.rollout.records import record_task, records_task_name

    return record_task(rows[0].keys(), records_task_name(rows)) if rows else None


def by_stratum(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stratum of the tasks (:meth:`~rlcr.tasks.base.Task.stratum`; Countdown: the number count, ``"2"``,
    ``"3"``, …; math: the level): answers, accuracy and, over the answers whose confidence parsed, mean
    confidence, ECE and AUROC (None where undefined). On a mix of difficulties the pooled AUROC also rewards
    telling easy tasks from hard ones; the AUROC within one stratum is what is left of telling a right answer
    from a wrong one on the same kind of task."""
    if not rows:
        return {}
    task = _record_task(rows)
    groups: dict[Any, list[tuple[float, float | None]]] = {}
    for a, c in answers_with_confidence(rows):
        groups.setdefault(task.stratum(task.from_record(a)), []).append((float(a["correct"]), c))
    out = {}
    for n, items in sorted(groups.items(), key=lambda kv: (isinstance(kv[0], str), kv[0])):
        pairs = [(c, y) for y, c in items if c is not None]
        cal = calibration_metrics([c for c, _ in pairs], [y for _, y in pairs]) if pairs else {}
        out[str(n)] = {"n_answers": len(items), "accuracy": sum(y for y, _ in items) / len(items),
                       **{k: _finite_or_none(cal.get(k)) for k in ("mean_confidence", "ece", "auroc")}}
    return out


by_number_count = by_stratum
"""Countdown's name of :func:`by_stratum` (its strata are the number counts)."""


def _finite_or_none(value):
    return None if value is None or value != value else value


def summarize_eval(rows: Sequence[dict[str, Any]], *, n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Accuracy over all answers; calibration over answers whose confidence parsed; 95% bootstrap intervals
    of accuracy, ECE, Brier and AUROC resampling tasks (``ci``: ``{metric: [low, high]}``).

    An unparseable confidence has no value to calibrate; it is counted in
    ``confidence_parse_rate`` (and gets Brier reward 0 in training).
    """
    per_answer = stated_confidences(rows)
    pairs = [(c, y) for _, y, c in per_answer if c is not None]
    metrics = calibration_metrics([c for c, _ in pairs], [y for _, y in pairs])
    answers = [r for r in rows if r["sample_type"] == "answer"]
    n = len(answers)
    tasks = {r["prompt_id"] for r in answers}
    metrics.update({
        "n_tasks": len(tasks),
        "n_answers": n,
        "accuracy": sum(a["correct"] for a in answers) / n if n else float("nan"),
        "accuracy_with_confidence": metrics.pop("accuracy"),
        "format_rate": sum((a["score"] or 0) > 0 for a in answers) / n if n else float("nan"),
        "confidence_parse_rate": len(pairs) / n if n else float("nan"),
        "by_count": by_stratum(rows),  # per stratum (the key of Countdown's number counts, kept for stored results)
        "ci_level": CI_LEVEL,
        "ci_resamples": n_resamples,
        "ci": bootstrap_intervals([float("nan") if c is None else c for _, _, c in per_answer],
                                  [y for _, y, _ in per_answer], [p for p, _, _ in per_answer],
                                  n_resamples=n_resamples, level=CI_LEVEL, seed=seed),
    })
    return metrics


_REQUIRED = ("prompt_id", "answer_id", "sample_type", "correct")


def _check_values(r: dict[str, Any], where: str, task_columns: Sequence[str]) -> None:
    """One row's own values: present (the generic fields and the task's columns ``task_columns``), finite, in
    range."""
    for name in (*_REQUIRED[:3], *task_columns, *_REQUIRED[3:]):
        if r.get(name) is None:
            raise InvalidInput(f"{where}: field {name!r} is null")
    if r["sample_type"] not in ("answer", "confidence"):
        raise InvalidInput(f"{where}: sample_type must be 'answer' or 'confidence', found "
                           f"{printable(repr(r['sample_type']), 40)}")
    if r["sample_type"] == "confidence" and r.get("confidence_id") is None:
        raise InvalidInput(f"{where}: a confidence row without confidence_id")
    for name, lo, hi in (("correct", 0.0, 1.0), ("confidence", 0.0, 1.0), ("score", -math.inf, math.inf)):
        v = r.get(name)
        if v is not None and not (math.isfinite(v) and lo <= v <= hi):
            bounds = f" in [{lo}, {hi}]" if lo == 0 else ""
            raise InvalidInput(f"{where}: {name} is {v!r}, not a finite number{bounds}")


def check_eval_rows(rows: Sequence[dict[str, Any]], source: str) -> None:
    """Refuse per-answer evaluation rows (from a file: ``source`` names it) that are not one evaluation, with
    an :class:`~rlcr.untrusted.InvalidInput` naming the file and the row (counted from 1), in one line:
    a null required field, a NaN or out-of-range ``correct``/``confidence``/``score``, a second answer row
    with the same (``prompt_id``, ``answer_id``) or confidence row with the same (…, ``confidence_id``) —
    it would count twice —, or rows of one ``prompt_id`` that disagree on its task (numbers and target) or,
    between its answers, on the prompt they were given — two tasks merged into one."""
    seen: dict[tuple, int] = {}
    tasks: dict[Any, tuple[tuple, int]] = {}
    prompts: dict[Any, tuple[str, int]] = {}
    name = printable(source)
    if not rows:
        return
    try:
        columns = [f.name for f in _record_task(rows).record_fields() if not f.nullable]
    except ValueError as e:
        raise InvalidInput(f"{name}: {printable(e, 300)}") from None
    for i, r in enumerate(rows, start=1):
        where = f"{name}: row {i}"
        _check_values(r, where, columns)
        pid, kind = r["prompt_id"], r["sample_type"]
        key = (kind, pid, r["answer_id"]) + ((r["confidence_id"],) if kind == "confidence" else ())
        if key in seen:
            ids = "answer_id" + (", confidence_id" if kind == "confidence" else "")
            raise InvalidInput(f"{where}: the same {kind} as row {seen[key]} (prompt_id, {ids} "
                               f"{', '.join(map(str, key[1:]))}): its rows would count twice")
        seen[key] = i
        task = _task_key(r, columns)
        first, at = tasks.setdefault(pid, (task, i))
        if task != first:
            raise InvalidInput(f"{where}: prompt_id {pid} holds task {printable(task, 80)}, but row {at} holds "
                               f"{printable(first, 80)}: two tasks under one prompt_id")
        if kind == "answer":
            context, at = prompts.setdefault(pid, (r.get("context_text"), i))
            if r.get("context_text") != context:
                raise InvalidInput(f"{where}: prompt_id {pid} was given another prompt than in row {at}: two "
                                   "prompts under one prompt_id")


def _task_key(r: dict[str, Any], columns: Sequence[str]) -> tuple:
    """A row's task as a comparable tuple of its task columns (Countdown: (numbers, target))."""
    return tuple(tuple(r[c]) if isinstance(r[c], list) else r[c] for c in columns)


def _tasks(rows: Sequence[dict[str, Any]]) -> dict[int, tuple]:
    """``{prompt_id: task}`` of the tasks an evaluation's answers were given (Countdown: (numbers, target))."""
    if not rows:
        return {}
    columns = [f.name for f in _record_task(rows).record_fields() if not f.nullable]
    return {r["prompt_id"]: _task_key(r, columns) for r in rows if r["sample_type"] == "answer"}


def _first_task_mismatch(ta: dict[int, tuple], tb: dict[int, tuple]) -> int | None:
    """The first ``prompt_id`` both hold whose task differs (two evaluations of different held-out sets)."""
    return next((pid for pid in sorted(set(ta) & set(tb)) if ta[pid] != tb[pid]), None)


def compare_evaluations(rows_a: Sequence[dict[str, Any]], rows_b: Sequence[dict[str, Any]], *,
                        n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """A minus B on the held-out tasks both evaluated (accuracy, ECE, Brier, AUROC), with paired bootstrap
    95% intervals over tasks (:func:`rlcr.core.metrics.paired_bootstrap_differences`). Tasks are matched by
    ``prompt_id``; raises ``ValueError`` naming the first ``prompt_id`` whose numbers or target differ
    between the two (evaluations of different held-out sets cannot be paired)."""
    ta, tb = _tasks(rows_a), _tasks(rows_b)
    pid = _first_task_mismatch(ta, tb)
    if pid is not None:
        raise ValueError(f"prompt_id {pid}: task {ta[pid]} in A but {tb[pid]} in B — not the same held-out set")
    return paired_bootstrap_differences(stated_confidences(rows_a), stated_confidences(rows_b),
                                        n_resamples=n_resamples, level=CI_LEVEL, seed=seed)


def pool_draws(draws: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Several sample draws of one policy on the same held-out tasks as one evaluation with more answers per
    task: each draw's ``answer_id`` is offset past the previous draws' (its confidences follow their answer),
    so a task keeps all its answers and the bootstrap still resamples tasks. Raises ``ValueError`` naming the
    draw (0-based) and ``prompt_id`` whose task differs from an earlier draw's (different held-out sets)."""
    pooled: list[dict[str, Any]] = []
    seen: dict[int, tuple] = {}
    offset = 0
    names = [(i, _record_task(rows).name) for i, rows in enumerate(draws) if rows]  # an empty draw: no task
    other = next(((i, n) for i, n in names if n != names[0][1]), None)
    if other is not None:
        raise ValueError(f"draw {other[0]}: answers to task {other[1]!r}, but draw {names[0][0]}'s to task "
                         f"{names[0][1]!r} — not the same held-out set")
    for i, rows in enumerate(draws):
        tasks = _tasks(rows)
        pid = _first_task_mismatch(seen, tasks)
        if pid is not None:
            raise ValueError(f"draw {i}, prompt_id {pid}: task {tasks[pid]} but {seen[pid]} in an earlier draw "
                             "— not the same held-out set")
        seen.update(tasks)
        pooled.extend(dict(r, answer_id=r["answer_id"] + offset) for r in rows)
        offset += 1 + max((r["answer_id"] for r in rows), default=-1)
    return pooled


def evaluate_policy(
    cfg: RLCRConfig,
    tasks: Sequence[Any],
    *,
    policy_uri: str,
    iteration: int,
    engines=None,
    tokenizer_uri: str | None = None,
    run_id: str = "eval",
    draw: int = 0,
    temperature: float | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sample ``cfg.eval.samples`` answers per held-out task, each with one stated confidence; return
    (metrics of :func:`summarize_eval`, rows). ``policy_uri``/``engines``/``tokenizer_uri``: as in
    :func:`rlcr.rollout.pipeline.generate_rollouts`; ``run_id`` labels the rows; ``draw``: which sample draw
    (:func:`rlcr.seeds.eval_salt`; 0 is the flow's); ``temperature``: the decoding temperature of both turns
    (default ``rollout.temperature``; 0: greedy, the RLCR paper's protocol, with ``eval.samples`` 1)."""
    indexed = list(enumerate(tasks))
    check_prompt_lengths(cfg, indexed, tokenizer_uri or policy_uri)
    ds = build_rollout_dataset(cfg, indexed, policy_uri, iteration, engines=engines.names if engines else None,
                               g_a=cfg.eval.samples, g_c=1, salt=eval_salt(draw),
                               confidences=method_record(cfg.method.name).has_confidence_turn,
                               temperature=temperature)
    rows = to_records(_collect(ds, len(indexed), iteration), run_id, iteration)
    return summarize_eval(rows, n_resamples=cfg.eval.bootstrap_resamples, seed=cfg.tasks.eval_seed), rows


def _collect(ds, n_tasks: int, iteration: int) -> list[dict[str, Any]]:
    """The dataset's rows, as ``take_all`` gathers them (row by row as blocks come back to the driver, in order),
    with an ``evaluate`` progress event (:func:`rlcr.events.progress`) each time a task's first rows are back."""
    from rlcr import events

    raw, seen = [], set()
    events.progress("evaluate", iteration, 0, n_tasks)
    for row in ds.iter_rows():
        raw.append(row)
        if row["prompt_id"] not in seen:
            seen.add(row["prompt_id"])
            events.progress("evaluate", iteration, len(seen), n_tasks)
    return raw


def evaluate_before_after(cfg: RLCRConfig, tasks: Sequence[Any], before_uri: str, after_uri: str, *,
                          run_id: str = "eval") -> dict[str, Any]:
    """Two checkpoints (e.g. the warm-start and the trained policy) on the same held-out tasks with the same
    request seeds (draw 0), each on its own engines; the change with paired bootstrap intervals over tasks.

    Returns ``{"before": metrics, "after": metrics, "comparison": after − before}`` (metrics of
    :func:`summarize_eval`; comparison of :func:`compare_evaluations`, A = after, B = before) and the rows as
    ``"rows_before"``/``"rows_after"``. Pairing keeps the shared task difficulty out of the interval, which is
    why a change too small to read from two separate intervals can still be resolved."""
    from rlcr.rollout.engine import EnginePool

    out: dict[str, Any] = {}
    for side, uri in (("before", before_uri), ("after", after_uri)):
        with EnginePool(cfg, uri) as engines:
            out[side], out[f"rows_{side}"] = evaluate_policy(cfg, tasks, policy_uri=uri, iteration=0,
                                                             engines=engines, run_id=run_id)
    out["comparison"] = compare_evaluations(out["rows_after"], out["rows_before"],
                                            n_resamples=cfg.eval.bootstrap_resamples, seed=cfg.tasks.eval_seed)
    return out
