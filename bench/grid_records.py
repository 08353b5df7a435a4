"""The grid's per-answer records: one small Parquet file per evaluation, ``s<seed>-<policy>-<split>-<protocol>.parquet``
under ``bench/results/grid/`` (policy: ``warm_start``, ``rlcr``, ``rlvr``, ``rlcr_single``; split: ``test``,
``calibration``; protocol: ``primary``, ``paper``; the addendum's ``rlvr_g4``, ``math`` and ``qa`` under
``bench/results/grid-2/``), holding :data:`COLUMNS` only. A record is written once (create-only); the confidence
is the one stated, NaN where none parsed: the paper protocol's "unparsed = 0" is applied when a table is built
(bench/grid_table.py, bench/grid_addendum_table.py), not in the record. Reading checks every file (size, name,
schema, values) and names the one at fault."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Sequence

from rlcr.untrusted import printable

POLICIES = ("warm_start", "rlcr", "rlvr", "rlcr_single")
SPLITS = ("test", "calibration")
PROTOCOLS = ("primary", "paper")
COLUMNS = ("seed", "method", "split", "protocol", "task", "stratum", "prompt_id", "answer_id", "correct", "confidence",
           "warm_start")
WARM_START = re.compile(r"[0-9a-f]{64}")
"""``warm_start``: the sha256 of the seed's warm-start weights (:func:`weights_digest`), the same in every record."""
NAME = re.compile(r"s(\d+)-(warm_start|rlcr|rlvr|rlcr_single|rlvr_g4)-(test|calibration|math|qa)"
                  r"-(primary|paper)\.parquet")
"""A record's file name. ``rlvr_g4`` and the ``math`` and ``qa`` splits are the addendum's (bench/protocol-2.yaml;
its records live under ``bench/results/grid-2/``, bench/grid_addendum.py)."""
DEFAULT_DIR = Path(__file__).resolve().parent / "results" / "grid"
MAX_RECORD_BYTES = 16 * 1024 * 1024
"""The largest record file read (one evaluation: 256 tasks × 8 answers is ~40 kB; the whole grid ~0.6 MB)."""


class RecordError(ValueError):
    """A record file is malformed; the one-line message names it."""


def record_name(seed: int, policy: str, split: str, protocol: str) -> str:
    """The deterministic file name of one evaluation's records."""
    name = f"s{seed}-{policy}-{split}-{protocol}.parquet"
    if not NAME.fullmatch(name):
        raise ValueError(f"no record name for seed {seed!r}, policy {policy!r}, split {split!r}, protocol {protocol!r}")
    return name


def weights_digest(checkpoint: str | Path) -> str:
    """sha256 over a local checkpoint's ``*.safetensors`` files (names and bytes, in name order): the identity of
    its weights, bit for bit (a seal's ``content_id`` is random per write, so it cannot say that two warm-starts
    trained in different sessions are the same)."""
    import hashlib

    h = hashlib.sha256()
    files = sorted(Path(checkpoint).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{printable(checkpoint)}: no *.safetensors weights")
    for path in files:
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def record_table(rows: Sequence[dict[str, Any]], *, seed: int, policy: str, split: str, protocol: str,
                 task_name: str, warm_start: str):
    """An evaluation's rows (:func:`rlcr.evaluation.evaluate.evaluate_policy`) as the record's Arrow table: one row per
    answer, its task's identity and stratum (:class:`rlcr.tasks.base.Task`), correct and stated confidence, and
    the seed's warm-start (:func:`weights_digest`) the evaluated policy started from."""
    import pyarrow as pa

    from rlcr.evaluation.evaluate import answers_with_confidence
    from rlcr.tasks.registry import get_task

    task = get_task(task_name)
    out: dict[str, list] = {c: [] for c in COLUMNS}
    for a, c in answers_with_confidence(rows):
        problem = task.from_record(a)
        for k, v in (("seed", seed), ("method", policy), ("split", split), ("protocol", protocol),
                     ("task", str(task.identity(problem))), ("stratum", str(task.stratum(problem))),
                     ("prompt_id", int(a["prompt_id"])), ("answer_id", int(a["answer_id"])),
                     ("correct", int(float(a["correct"]) > 0.5)), ("confidence", None if c is None else float(c)),
                     ("warm_start", warm_start)):
            out[k].append(v)
    types = {"seed": pa.int32(), "prompt_id": pa.int32(), "answer_id": pa.int32(), "correct": pa.int8(),
             "confidence": pa.float64()}
    return pa.table({k: pa.array(v, type=types.get(k, pa.string())) for k, v in out.items()})


def write_record(directory: Path, name: str, table) -> Path:
    """``table`` to ``directory/name``, create-only (an existing record is never replaced) and atomic (a
    temporary file renamed into place, so a stopped grid leaves no half-written record)."""
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if path.exists():
        raise FileExistsError(f"{printable(path)}: exists; records are never overwritten")
    tmp = directory / f".{name}.{os.getpid()}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.link(tmp, path)  # fails if the record appeared meanwhile
    tmp.unlink()
    return path


def read_records(directory: Path, warm_starts: dict | None = None) -> dict[tuple[int, str, str, str], Any]:
    """Every record under ``directory``: ``{(seed, policy, split, protocol): Answers}``. A file whose name or
    contents do not fit :data:`NAME` / :data:`COLUMNS` is a one-line :class:`RecordError` naming it.
    ``warm_starts``: filled with each record's warm-start digest, by the same keys."""
    import pyarrow.parquet as pq

    from rlcr.evaluation.protocol_stats import Answers

    out = {}
    for path in sorted(Path(directory).glob("*.parquet")) if Path(directory).is_dir() else []:
        where = printable(path)
        m = NAME.fullmatch(path.name)
        if not m:
            raise RecordError(f"{where}: not a grid record name (s<seed>-<policy>-<split>-<protocol>.parquet)")
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            raise RecordError(f"{where}: not a regular file of at most {MAX_RECORD_BYTES:,} bytes")
        try:
            t = pq.read_table(path, columns=list(COLUMNS)).to_pydict()
        except Exception as e:  # noqa: BLE001 — not Parquet, a missing column …
            raise RecordError(f"{where}: not a readable grid record "
                              f"({type(e).__name__}: {printable(e, 160)})") from None
        key = (int(m.group(1)), m.group(2), m.group(3), m.group(4))
        for col, want in zip(("seed", "method", "split", "protocol"), key):
            if set(t[col]) - {want}:
                raise RecordError(f"{where}: column {col} holds {printable(sorted(set(t[col]) - {want})[0], 40)}, "
                                  f"not {want} as its name says")
        if not t["task"]:
            raise RecordError(f"{where}: holds no answer")
        if len(set(t["warm_start"])) != 1 or not WARM_START.fullmatch(str(t["warm_start"][0])):
            raise RecordError(f"{where}: column warm_start must hold one sha256 (64 lowercase hex digits)")
        if warm_starts is not None:
            warm_starts[key] = t["warm_start"][0]
        conf = [math.nan if c is None else c for c in t["confidence"]]
        try:
            out[key] = Answers(t["task"], t["stratum"], t["correct"], conf)
        except ValueError as e:
            raise RecordError(f"{where}: {printable(e, 160)}") from None
    return out
