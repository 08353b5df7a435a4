"""What an offline W&B run wrote, read back for the tests: its transaction log (``run-<id>.wandb``) is a sequence of
32 KiB blocks of records, each ``crc32 (4 bytes) | length (2) | kind (1) | payload``, a record split over blocks as
first/middle/last parts, after a 7-byte header ``:W&B``, magic ``0xBEE1``, version 0; each payload is a protobuf
``wandb_internal_pb2.Record``. wandb ships no reader of it."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, parts = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if length == 0 and kind == 0:  # the unwritten tail
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        if len(chunk) < length:  # cut short by a writer that died
            break
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, f"bad checksum at {pos}"
        pos += HEADER + length
        if kind in (FIRST, MIDDLE):
            parts = (b"" if kind == FIRST else parts) + chunk
            continue
        payload, parts = (parts + chunk if kind == LAST else chunk), b""
        record = pb.Record()
        record.ParseFromString(payload)
        yield record


def _key(item) -> str:
    return ".".join(item.nested_key) if item.nested_key else item.key


def read_run(path: Path, wait_s: float = 30.0) -> dict[str, Any]:
    """``history`` (rows as dicts), ``config``, ``summary``, ``notes``, ``exit_code`` (None: never finished).
    wandb-core writes the file from its own process, and the exit record may land just after ``finish()``
    returns: read again for up to ``wait_s`` seconds until it is there."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        out = _read_once(path)
        if out["exit_code"] is not None or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def _read_once(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"history": [], "config": {}, "summary": {}, "notes": None, "exit_code": None}
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "config":
            out["config"].update({_key(i): json.loads(i.value_json) for i in rec.config.update})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "run":
            out["config"].update({_key(i): json.loads(i.value_json) for i in rec.run.config.update})
            out["notes"] = rec.run.notes or out["notes"]
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
    out["config"].pop("_wandb", None)
    return out


def offline_runs(directory: Path, wandb_id: str) -> list[Path]:
    """Every attempt's log of W&B run ``wandb_id`` under ``directory`` (oldest first)."""
    return sorted(Path(directory).glob(f"wandb/offline-run-*-{wandb_id}/run-{wandb_id}.wandb"))
