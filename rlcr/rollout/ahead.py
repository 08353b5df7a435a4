"""Rollouts sampled one step ahead (``orchestration.mode: one-step-off``, docs/design.md §12).

In that mode iteration k+1's rollouts are generated while iteration k's update runs, by the policy the engines
hold then (after k − 1 updates). They are scored, given their advantages and written as iteration k+1's
rollouts file before iteration k is staged, and iteration k's manifest names that file with its SHA-256 and the
policy version that sampled it (``next_rollouts_uri``, ``next_rollouts_sha256``, ``next_rollouts_version``).
So whatever a crash interrupts, the last committed manifest says which rollouts come next: a resume trains on
exactly those (read back and checked here), never on a second sample of them, and never skips them.

The rows the update sees are always those read back from the file's bytes (:func:`seal_ahead` round-trips the
rows it wrote through the same table conversion), so an uninterrupted run and a resumed one train on identical
values (``completion_logprobs`` are float32 in the file).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rlcr.rollout.pipeline import RolloutResult, rollout_stats
from rlcr.rollout.records import RolloutValidationError, rows_to_table, table_to_rows, validate_rollouts
from rlcr.untrusted import InvalidInput, printable

__all__ = ["Ahead", "seal_ahead", "read_ahead", "manifest_fields", "MANIFEST_FIELDS"]

MANIFEST_FIELDS = ("next_rollouts_uri", "next_rollouts_sha256", "next_rollouts_version")
"""What iteration k's manifest records of iteration k+1's rollouts in one-step-off mode (absent in ``sync``)."""


@dataclass
class Ahead:
    """Iteration ``iteration``'s rollouts, sampled by the policy after ``version`` updates, as written."""

    iteration: int
    version: int
    result: RolloutResult
    sha256: str
    timings: dict[str, float] = field(default_factory=dict)
    """The generation's own timings (empty when read back by a resume: that generation ran in another process)."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def seal_ahead(run, result: RolloutResult, iteration: int, version: int, timings: Mapping[str, float]) -> Ahead:
    """The rollouts file ``result.uri`` just written for ``iteration``: its digest read from the store, and the
    rows as a reader of that file gets them."""
    data = run.store.read_bytes(run.store.rel(result.uri))
    rows = table_to_rows(rows_to_table(result.rows))
    return Ahead(iteration, version, RolloutResult(rows=rows, uri=result.uri, timings=dict(result.timings),
                                                   stats=dict(result.stats)), _digest(data), dict(timings))


def manifest_fields(ahead: Ahead | None) -> dict[str, Any]:
    """The manifest fields naming the next iteration's rollouts (empty without any)."""
    if ahead is None:
        return {}
    return {"next_rollouts_uri": ahead.result.uri, "next_rollouts_sha256": ahead.sha256,
            "next_rollouts_version": ahead.version}


def read_ahead(run, manifest: Mapping[str, Any] | None, prompts: Sequence[tuple[int, Any]], *, g_a: int,
               g_c: int) -> Ahead | None:
    """The rollouts committed manifest ``manifest`` (iteration k) names for iteration k+1, checked: None if it
    names none (``sync`` mode, the run's last iteration, or no manifest yet). ``prompts``: iteration k+1's
    prompts (the rows must be theirs). A file that is gone, altered, or not what the manifest says is an
    :class:`~rlcr.untrusted.InvalidInput` naming it and what is wrong: never silently re-sampled."""
    if not manifest or not manifest.get("next_rollouts_uri"):
        return None
    k = int(manifest["iteration"]) + 1
    uri, sha, version = (manifest.get(f) for f in MANIFEST_FIELDS)
    where = f"iteration {k - 1}'s manifest names {printable(uri, 160)}"
    if not isinstance(sha, str) or not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < k:
        raise InvalidInput(f"{where}: next_rollouts_sha256/next_rollouts_version are missing or invalid")
    from rlcr.columnar import MAX_TABLE_BYTES, read_parquet_table

    try:
        rel = run.store.rel(uri)
        data = run.store.read_bytes(rel, max_bytes=MAX_TABLE_BYTES)  # larger: refused by its size, unread
    except FileNotFoundError:
        raise InvalidInput(f"{where}, which is gone: the rollouts it trained on next cannot be recovered") from None
    except Exception as e:  # noqa: BLE001 - a foreign URI, a folder: one line naming it
        raise InvalidInput(f"{where}, which cannot be read: {printable(str(e), 200)}") from None
    if _digest(data) != sha:
        raise InvalidInput(f"{where}, whose content is not what was written (SHA-256 differs)")
    rows = table_to_rows(read_parquet_table(io.BytesIO(data), run.store.url(rel)))
    _check_rows(rows, where, run_id=run.run_id, iteration=k, version=version, prompts=prompts, g_a=g_a, g_c=g_c)
    stats = {**rollout_stats(rows), "staleness": float(k - 1 - version)}
    return Ahead(k, version, RolloutResult(rows=rows, uri=uri, stats=stats), sha)


def _check_rows(rows, where: str, *, run_id: str, iteration: int, version: int, prompts, g_a: int, g_c: int) -> None:
    for i, r in enumerate(rows):
        got = (r.get("run_id"), r.get("iteration"), r.get("policy_version"))
        if got != (run_id, iteration, version):
            raise InvalidInput(f"{where}: row {i} is of run/iteration/version {printable(str(got), 120)}, not "
                               f"{(run_id, iteration, version)}")
        if r.get("advantage") is None:
            raise InvalidInput(f"{where}: row {i} has no advantage")
    wanted = sorted(pid for pid, _ in prompts)
    have = sorted({r["prompt_id"] for r in rows})
    if have != wanted:
        raise InvalidInput(f"{where}: its prompts {have[:8]} are not iteration {iteration}'s {wanted[:8]}")
    try:
        validate_rollouts(rows, num_prompts=len(wanted), g_a=g_a, g_c=g_c)
    except RolloutValidationError as e:
        raise InvalidInput(f"{where}: {e}") from None
