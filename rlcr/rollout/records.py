"""Rollout records: one row per generated sample, answers and confidences alike (docs/design.md §1).

The tree P prompts → G_a answers → G_c confidences is flattened into rows that
carry their position in it (``prompt_id``, ``answer_id``, ``confidence_id``), the
tokens the policy saw and produced, and the reward and advantage. The schema is a
pyarrow schema: rollouts are written as Parquet and read back without loss.
Pure Python + pyarrow.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Sequence

import pyarrow as pa
import torch

from rlcr.core.advantages import method_advantages
from rlcr.core.methods import METHOD_RECORDS
from rlcr.core.rewards import accuracy_reward, answer_reward, brier_reward, parse_confidence, split_single_turn
from rlcr.tasks.base import LEGACY_TASK, Task
from rlcr.tasks.registry import get_task, load_task_plugins, task_names
from rlcr.untrusted import InvalidInput, printable

__all__ = [
    "ROLLOUT_SCHEMA",
    "rollout_schema",
    "record_task",
    "records_task_name",
    "TASK_KEY",
    "RolloutValidationError",
    "rollout_row",
    "answer_scores",
    "confidence_scores",
    "assign_advantages",
    "rows_to_table",
    "table_to_rows",
    "read_records_table",
    "with_provenance",
    "provenance",
    "validate_rollouts",
]

ANSWER, CONFIDENCE = "answer", "confidence"

_GENERIC_FIELDS = (
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("iteration", pa.int32(), nullable=False),
    pa.field("prompt_id", pa.int64(), nullable=False),
    pa.field("answer_id", pa.int32(), nullable=False),
    pa.field("confidence_id", pa.int32(), nullable=True),  # null for answers
    pa.field("sample_type", pa.string(), nullable=False),  # answer | confidence
    pa.field("context_text", pa.string(), nullable=False),  # rendered prompt
    pa.field("context_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("completion_text", pa.string(), nullable=False),
    pa.field("completion_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("completion_logprobs", pa.list_(pa.float32()), nullable=True),  # sampling log-probs
    pa.field("loss_mask", pa.list_(pa.int8()), nullable=True),  # docs/design.md §6 span mask over completion_ids
    pa.field("finish_reason", pa.string(), nullable=False),  # stop | length | …
    pa.field("truncated", pa.bool_(), nullable=False),
    pa.field("score", pa.float64(), nullable=True),  # compute_score (answers)
    pa.field("correct", pa.float64(), nullable=False),  # acc of the answer (own or parent's)
    pa.field("confidence", pa.float64(), nullable=True),  # parsed c (confidences)
    pa.field("reward", pa.float64(), nullable=False),
    pa.field("advantage", pa.float64(), nullable=True),  # filled by assign_advantages
    # updates in the policy that sampled the row (k − 1 synchronous, k − 2 one step off; null: evaluation rows and
    # files from before it was recorded)
    pa.field("policy_version", pa.int32(), nullable=True),
    # the registered task the row is a problem of, by name (null: files from before it was recorded)
    pa.field("task_name", pa.string(), nullable=True),
)
_ADDED_LATER = frozenset({"policy_version", "task_name"})
"""Nullable columns that files written before them lack: read as null."""
_TASK_COLUMNS_AT = 6
"""The task's columns come after ``sample_type`` (Countdown's ``nums``, ``target``: where they always were)."""


TASK_KEY = b"rlcr.task"
"""Schema metadata key of the task's name: a table or Parquet file of rows says whose rows it holds."""


def rollout_schema(task: str | Task) -> pa.Schema:
    """The rollout schema of ``task``: the generic fields with the task's record columns
    (:meth:`~rlcr.tasks.base.Task.record_fields`) after ``sample_type``, and the task's name in its metadata
    (:data:`TASK_KEY`), which Parquet keeps."""
    task = get_task(task) if isinstance(task, str) else task
    return pa.schema([*_GENERIC_FIELDS[:_TASK_COLUMNS_AT], *task.record_fields(), *_GENERIC_FIELDS[_TASK_COLUMNS_AT:]],
                     metadata={TASK_KEY: task.name.encode()})


ROLLOUT_SCHEMA = rollout_schema(LEGACY_TASK)
"""The rollout schema of the files of before the task interface (:data:`~rlcr.tasks.base.LEGACY_TASK`, Countdown's:
its ``nums``/``target`` columns), kept for the tests and readers of those files; the schema of a task's rows is
``rollout_schema(task)``."""


def record_task(columns: Iterable[str], name: str | None = None) -> Task:
    """The registered task of records with ``columns`` (a row's keys, a table's column names): the one place
    that decides whose records the records are when nobody says.

    ``name``: the task the records name (:func:`records_task_name`); it must be registered and its record
    columns present. Without one (rows or files from before records carried it) the task is guessed from the
    columns: the one task whose record columns are exactly the columns besides the generic ones, else, of the
    tasks whose columns they hold, the one whose columns hold every other's. Two candidates left are refused in
    one line naming them, rather than the first taken (a plugin whose record columns are math's would otherwise
    read math's rows as its own).
    RolloutValidationError when none fits."""
    have = set(columns)
    if name is not None:
        try:
            task = get_task(name)
            fields = task.record_fields()
        except (ValueError, NotImplementedError) as e:
            raise RolloutValidationError(f"the records name task {printable(repr(name), 60)}, which cannot read "
                                         f"them here ({printable(e, 200)})") from None
        missing = [f.name for f in fields if f.name not in have]
        if missing:
            raise RolloutValidationError(f"the records name task {name!r} but lack its columns {missing}")
        return task
    load_task_plugins()  # rows of a task from outside rlcr (docs/tasks.md): its columns are its record's
    own = have - {f.name for f in _GENERIC_FIELDS}
    holding = []
    for candidate in task_names():
        task = get_task(candidate)
        try:
            fields = _field_names(task)
        except NotImplementedError:  # a task the flow cannot run
            continue
        if fields <= have:
            holding.append((task, fields == own))
    exact = [t for t, same in holding if same]
    if len(exact) == 1:
        return exact[0]
    widest = [t for t, _ in holding if all(_field_names(u) <= _field_names(t) for u, _ in holding)]
    if len(widest) == 1:  # qa's columns hold math's: a qa file is qa's
        return widest[0]
    found = [t for t, _ in holding]
    if found:
        raise RolloutValidationError(f"the records name no task and hold the columns of tasks "
                                     f"{', '.join(t.name for t in found)}: which one is ambiguous")
    raise RolloutValidationError(f"rollout rows hold the columns of no registered task ({', '.join(task_names())})")


def _field_names(task: Task) -> set[str]:
    return {f.name for f in task.record_fields()}


def records_task_name(records: Any) -> str | None:
    """The task name records carry (None: records from before they carried it): a table's or schema's
    :data:`TASK_KEY` metadata, else its ``task_name`` column's; rows' ``task_name``. Rows or a column naming
    two tasks, or metadata and column that disagree, are refused (RolloutValidationError, one line)."""
    if isinstance(records, (pa.Table, pa.Schema)):
        schema = records if isinstance(records, pa.Schema) else records.schema
        raw = (schema.metadata or {}).get(TASK_KEY)
        names = set()
        if isinstance(records, pa.Table) and "task_name" in records.column_names:
            import pyarrow.compute as pc

            names = {v for v in pc.unique(records.column("task_name")).to_pylist() if v is not None}
        if raw is not None:
            names.add(raw.decode("utf-8", "replace"))
    else:
        names = {r.get("task_name") for r in records} - {None}
    if len(names) > 1:
        shown = ", ".join(printable(repr(n), 60) for n in sorted(names))
        raise RolloutValidationError(f"records of several tasks ({shown}): one file or evaluation holds one "
                                     "task's rows")
    return names.pop() if names else None


class RolloutValidationError(ValueError):
    """The rollout rows do not form a complete, consistent P × G_a × G_c tree."""


def rollout_row(
    sample_type: str,
    *,
    task: Any,
    prompt_id: int,
    answer_id: int,
    confidence_id: int | None = None,
    context_text: str,
    context_ids: Sequence[int],
    completion_text: str,
    completion_ids: Sequence[int],
    completion_logprobs: Sequence[float] | None = None,
    loss_mask: Sequence[int] | None = None,
    finish_reason: str | None = "stop",
    run_id: str | None = None,
    iteration: int | None = None,
    task_name: str,
    score: float | None = None,
    correct: float | None = None,
    confidence: float | None = None,
    reward: float | None = None,
    advantage: float | None = None,
    policy_version: int | None = None,
) -> dict[str, Any]:
    """One rollout row with every field of its task's :func:`rollout_schema`: the only place a row is laid out.

    The rollout stages, the warm-start's examples (:mod:`rlcr.train.sft`) and the tests build
    their rows here. ``task`` is a problem of the task ``task_name``, whose record
    (:meth:`~rlcr.tasks.base.Task.to_record`: Countdown's ``nums``, ``target``) fills the task columns. ``truncated``
    follows from ``finish_reason`` ("length"); an empty ``finish_reason`` is "stop". Scores come from
    :func:`answer_scores` / :func:`confidence_scores`; ``run_id``/``iteration`` may be filled in later (the
    pipeline does in :func:`rlcr.rollout.pipeline.to_records`), ``advantage`` by
    :func:`assign_advantages`.
    """
    if sample_type not in (ANSWER, CONFIDENCE):
        raise ValueError(f"sample_type must be {ANSWER!r} or {CONFIDENCE!r}, got {sample_type!r}")
    return {
        "run_id": run_id,
        "iteration": iteration,
        "prompt_id": int(prompt_id),
        "answer_id": int(answer_id),
        "confidence_id": confidence_id,
        "sample_type": sample_type,
        **get_task(task_name).to_record(task),
        "context_text": context_text,
        "context_ids": list(context_ids),
        "completion_text": completion_text,
        "completion_ids": list(completion_ids),
        "completion_logprobs": None if completion_logprobs is None else list(completion_logprobs),
        "loss_mask": None if loss_mask is None else list(loss_mask),
        "finish_reason": finish_reason or "stop",
        "truncated": finish_reason == "length",
        "score": score,
        "correct": correct,
        "confidence": confidence,
        "reward": reward,
        "advantage": advantage,
        "policy_version": policy_version,
        "task_name": task_name,
    }


def answer_scores(completion_text: str, task: Any, *, format_score: float, method: str = "rlcr",
                  lambda_conf: float = 1.0, task_name: str) -> dict[str, float | None]:
    """Scores of an answer-turn completion on problem ``task`` of the task ``task_name`` (docs/design.md §5, §9):
    ``score`` = the task's :meth:`~rlcr.tasks.base.Task.score`, ``correct`` =
    the accuracy reward ∈ {0, 1}, ``reward`` = ``method``'s registered answer reward
    (:data:`rlcr.core.rewards.ANSWER_REWARDS`: accuracy, or accuracy + λ_conf·Brier for ``rlcr_single``) and
    ``confidence`` = the response's own stated confidence (``rlcr_single``, whose answer part is scored alone:
    :func:`rlcr.core.rewards.split_single_turn`; else None). Keyword arguments of :func:`rollout_row`."""
    single = method in METHOD_RECORDS and METHOD_RECORDS[method].single_turn
    answer, stated = split_single_turn(completion_text) if single else (completion_text, "")
    kind = get_task(task_name)
    return {"score": float(kind.score(answer, task, format_score=format_score)),
            "correct": accuracy_reward(answer, task, kind),
            "reward": answer_reward(method)(completion_text, task, lambda_conf=lambda_conf, kind=kind),
            "confidence": parse_confidence(stated) if single else None}


def confidence_scores(completion_text: str, correct: float) -> dict[str, float | None]:
    """Scores of a turn-2 confidence given its answer's accuracy ``correct`` (docs/design.md §5): the parsed
    ``confidence`` (None if unparseable) and ``reward`` = 1 − (correct − c)², 0 if unparseable."""
    return {"confidence": parse_confidence(completion_text), "reward": brier_reward(completion_text, correct)}


def assign_advantages(
    rows: list[dict[str, Any]],
    *,
    method: str = "rlcr",
    eps: float = 1e-6,
    scale_by_std: bool = True,
    conf_mode: str = "answer",
) -> list[dict[str, Any]]:
    """Fill ``advantage`` of every row with ``method``'s registered advantages (docs/design.md §7, §9), in place;
    returns ``rows``.

    ``rlcr``: answers normalised per prompt over its G_a answers, confidences per answer over its G_c
    confidences (or ``answer_then_prompt``). ``rlcr_single``/``rlvr``: answers only, per prompt. The tree
    must be complete (see :func:`validate_rollouts`).
    """
    p, g_a, g_c = validate_rollouts(rows, check_context=False)
    ans = sorted((r for r in rows if r["sample_type"] == ANSWER), key=lambda r: (r["prompt_id"], r["answer_id"]))
    conf = sorted(
        (r for r in rows if r["sample_type"] == CONFIDENCE),
        key=lambda r: (r["prompt_id"], r["answer_id"], r["confidence_id"]),
    )
    a_adv, c_adv = method_advantages(method)(
        torch.tensor([r["reward"] for r in ans], dtype=torch.float64).reshape(p, g_a),
        torch.tensor([r["reward"] for r in conf], dtype=torch.float64).reshape(p, g_a, g_c) if g_c else None,
        eps=eps, scale_by_std=scale_by_std, conf_mode=conf_mode,
    )
    for r, a in zip(ans, a_adv.flatten().tolist()):
        r["advantage"] = a
    for r, a in zip(conf, c_adv.flatten().tolist() if c_adv is not None else []):
        r["advantage"] = a
    return rows


def rows_to_table(rows: Iterable[dict[str, Any]], task: str | Task | None = None) -> pa.Table:
    """Rows → pyarrow Table with the :func:`rollout_schema` of ``task`` (default: the task the rows name, else
    the one whose record columns they hold, :func:`record_task`; no rows need ``task``, their table's schema is
    that task's); missing optional fields become null, and every row's ``task_name`` is the task's (a row naming
    another is refused)."""
    rows = list(rows)
    if task is None:
        if not rows:
            raise ValueError("rows_to_table: no rows, so no task to take the schema of: pass the task")
        task = record_task(rows[0], records_task_name(rows))
    schema = rollout_schema(task)
    name = schema.metadata[TASK_KEY].decode()
    other = next((r["task_name"] for r in rows if r.get("task_name") not in (None, name)), None)
    if other is not None:
        raise RolloutValidationError(f"a row of task {printable(repr(other), 60)} among rows of task {name!r}")
    return pa.Table.from_pylist([{**{f.name: r.get(f.name) for f in schema}, "task_name": name} for r in rows],
                                schema=schema)


def table_to_rows(table: pa.Table) -> list[dict[str, Any]]:
    """pyarrow Table (e.g. read from Parquet) → rows, each naming its task (``task_name``); checks the schema's
    columns are present (the task's record columns: those of the task the table names, or for a file from
    before tables named it, the task whose columns it holds: :func:`record_task`)."""
    task = record_task(table.column_names, records_task_name(table))
    schema = rollout_schema(task)
    for name in sorted(_ADDED_LATER - set(table.column_names)):
        table = table.append_column(schema.field(name), pa.nulls(table.num_rows, schema.field(name).type))
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise RolloutValidationError(f"rollout table lacks columns {missing}")
    rows = table.select([f.name for f in schema]).cast(schema).to_pylist()
    for r in rows:
        r["task_name"] = task.name
    return rows


def read_records_table(source: Any, name: str) -> pa.Table:
    """The rollout or evaluation records of a Parquet file from outside (a path or a binary file object), in
    bounded memory: the columns of the task the file's schema holds (:func:`record_task`) required before a row
    is read, then :func:`rlcr.columnar.read_parquet_table` (rows and decoded size within its limits).
    :class:`~rlcr.untrusted.InvalidInput` naming ``name``."""
    import pyarrow.parquet as pq

    from rlcr.columnar import read_parquet_table

    try:
        schema = pq.ParquetFile(source).schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InvalidInput(f"{printable(name)}: not a readable Parquet file ({type(e).__name__}: "
                           f"{printable(e, 160)})") from None
    try:
        columns = [f.name for f in rollout_schema(record_task(schema.names, records_task_name(schema)))]
    except RolloutValidationError as e:
        raise InvalidInput(f"{printable(name)}: {e}") from None
    columns = [c for c in columns if c in schema.names or c not in _ADDED_LATER]  # older files lack those
    return read_parquet_table(source, name, columns=columns, required=[c for c in columns if c not in _ADDED_LATER])


PROVENANCE_KEY = b"rlcr.provenance"
MAX_PROVENANCE_BYTES = 64 * 1024
"""Largest provenance document read from a file's metadata (it holds a few short fields)."""


def with_provenance(table: pa.Table, **fields: Any) -> pa.Table:
    """``table`` with ``fields`` (JSON values: policy, method, sample draw, …) in its schema metadata, which
    Parquet keeps, so a file of rows says where its rows came from without a column per fact."""
    import json

    meta = dict(table.schema.metadata or {})
    meta[PROVENANCE_KEY] = json.dumps(fields, sort_keys=True).encode()
    return table.replace_schema_metadata(meta)


def provenance(table: pa.Table, source: str = "rows") -> dict[str, Any]:
    """The fields :func:`with_provenance` stored in ``table`` ({} for rows written without them, or whose
    provenance is damaged: not JSON, not an object). Provenance holding a key twice, larger than
    :data:`MAX_PROVENANCE_BYTES` or nested deeper than :data:`rlcr.untrusted.MAX_DEPTH` is no damage but a
    hostile file: :class:`InvalidInput` naming ``source``, before any parser recurses."""
    from rlcr.untrusted import DuplicateKey, check_depth, loads_unique, printable

    raw = (table.schema.metadata or {}).get(PROVENANCE_KEY)
    if not raw:
        return {}
    if len(raw) > MAX_PROVENANCE_BYTES:
        raise InvalidInput(f"{printable(source)}: provenance metadata of {len(raw):,} bytes, more than the "
                           f"{MAX_PROVENANCE_BYTES:,} allowed")
    check_depth(raw, f"{source}: provenance metadata")
    try:
        fields = loads_unique(raw.decode("utf-8"))
    except DuplicateKey as e:  # which of the two values holds is no question to settle silently
        raise InvalidInput(f"{printable(source)}: provenance metadata: {e}") from None
    except (ValueError, RecursionError):  # a damaged file: its rows still read, their provenance is unknown
        return {}
    return fields if isinstance(fields, dict) else {}


def validate_rollouts(
    rows: Sequence[dict[str, Any]],
    *,
    num_prompts: int | None = None,
    g_a: int | None = None,
    g_c: int | None = None,
    check_context: bool = True,
) -> tuple[int, int, int]:
    """Check the rows form a complete tree; return ``(P, G_a, G_c)``.

    Every confidence's parent answer exists; there are P·G_a answers and
    P·G_a·G_c confidences with no duplicates; each confidence's context contains
    its parent answer's text; rewards are finite. Raises RolloutValidationError.
    """
    answers: dict[tuple[int, int], dict[str, Any]] = {}
    conf_count: Counter = Counter()
    seen_conf: set[tuple[int, int, int]] = set()
    for i, r in enumerate(rows):
        st = r.get("sample_type")
        if st == ANSWER:
            key = (r["prompt_id"], r["answer_id"])
            if key in answers:
                raise RolloutValidationError(f"row {i}: duplicate answer prompt_id={key[0]} answer_id={key[1]}")
            if r.get("confidence_id") is not None:
                raise RolloutValidationError(f"row {i}: answer row has a confidence_id")
            answers[key] = r
        elif st != CONFIDENCE:
            raise RolloutValidationError(f"row {i}: sample_type must be 'answer' or 'confidence', got {st!r}")
        reward = r.get("reward")
        if reward is None or reward != reward or reward in (float("inf"), float("-inf")):
            raise RolloutValidationError(f"row {i}: reward must be finite, got {reward!r}")
    for i, r in enumerate(rows):
        if r["sample_type"] != CONFIDENCE:
            continue
        key = (r["prompt_id"], r["answer_id"])
        ckey = key + (r.get("confidence_id"),)
        if ckey[2] is None:
            raise RolloutValidationError(f"row {i}: confidence row without confidence_id")
        if ckey in seen_conf:
            raise RolloutValidationError(f"row {i}: duplicate confidence {ckey}")
        seen_conf.add(ckey)
        parent = answers.get(key)
        if parent is None:
            raise RolloutValidationError(f"row {i}: confidence's parent answer prompt_id={key[0]} answer_id={key[1]} "
                                         "is missing")
        if check_context and parent["completion_text"] not in r["context_text"]:
            raise RolloutValidationError(
                f"row {i}: confidence context does not contain its parent answer "
                f"(prompt_id={key[0]} answer_id={key[1]})"
            )
        if float(r["correct"]) != float(parent["correct"]):
            raise RolloutValidationError(f"row {i}: confidence label differs from its parent answer's accuracy")
        conf_count[key] += 1
    per_prompt = Counter(p for p, _ in answers)
    prompts = sorted(per_prompt)
    if not prompts:
        raise RolloutValidationError("no answer rows")
    sizes_a = set(per_prompt.values())
    if len(sizes_a) != 1:
        raise RolloutValidationError(f"prompts have different numbers of answers: {dict(per_prompt)}")
    sizes_c = {conf_count.get(k, 0) for k in answers}
    if len(sizes_c) != 1:
        raise RolloutValidationError(f"answers have different numbers of confidences: {sorted(sizes_c)}")
    shape = (len(prompts), sizes_a.pop(), sizes_c.pop())
    for name, want, got in (("P", num_prompts, shape[0]), ("G_a", g_a, shape[1]), ("G_c", g_c, shape[2])):
        if want is not None and want != got:
            raise RolloutValidationError(f"expected {name}={want}, found {got}")
    return shape
