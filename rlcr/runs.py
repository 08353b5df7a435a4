"""Run bookkeeping: manifests, commit and resume, and the run's writer lease.

A run lives under ``<storage>/runs/<run_id>/``. Iteration k (from 1) writes its
artifacts under ``iter-<kkkk>/`` and is *committed* by writing
``iter-<kkkk>/manifest.json`` last, create-only: an iteration is committed once and
never overwritten. Anything without a manifest is an uncommitted attempt: a re-run
overwrites it, and readers ignore it.

With ``save_every`` > 1 the training state is saved every few iterations only. An
iteration after which nothing was saved is *staged* (``iter-<kkkk>/pending.json``:
its manifest draft, next to its rollouts and metrics) and committed, in order, when
the state that covers it is saved: every committed iteration is resumable exactly.
Its manifest names that state (``state_uri``, ``state_iteration``); only the saving
iteration's manifest has a ``checkpoint_uri``. A crash in the middle of committing a
group is finished on resume (:meth:`RunStore.finish_group`).

One writer per run: a flow holds ``runs/<run_id>/lease.json`` (:class:`RunLease`,
created with a conditional put) for as long as it runs and renews it every
``heartbeat_s``; a second writer fails at once with a message naming the holder. A
lease whose heartbeat is older than ``timeout_s`` (default :data:`LEASE_TIMEOUT_S`)
belongs to a dead writer and is taken over (compare-and-swap on its version); so is, at
once, a lease whose holder ran on this machine and whose process is gone (a killed local run).
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from rlcr.config import RLCRConfig, result_changing_diff
from rlcr.storage import (
    AlreadyExists,
    Store,
    StorageError,
    VersionConflict,
    iteration_prefix,
    pid_alive,
    validate_run_id,
)
from rlcr.tasks.sets import prompts_for_iteration, task_sets

__all__ = ["RunStore", "RunConfigMismatch", "RunLease", "RunLocked", "LeaseLost", "AlreadyCommitted",
           "task_sets", "prompts_for_iteration", "new_run_id", "LEASE_TIMEOUT_S", "LEASE_HEARTBEAT_S"]

log = logging.getLogger(__name__)

LEASE_TIMEOUT_S = 60.0
"""A run's lease whose last heartbeat is older than this (seconds) is taken to belong to a dead writer."""
LEASE_HEARTBEAT_S = 10.0
"""How often the holder renews its lease (seconds)."""


class RunConfigMismatch(ValueError):
    """Resuming a run with settings that differ from the ones it started with."""


class RunLocked(RuntimeError):
    """Another live writer holds the run's lease; the message names it."""


class LeaseLost(RuntimeError):
    """This writer's lease was taken over (it stalled past the timeout): it must not commit."""


class AlreadyCommitted(RuntimeError):
    """An iteration that is already committed cannot be committed again."""


def new_run_id() -> str:
    """A fresh run id: UTC time to the second plus a random suffix (unique across calls and machines)."""
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


@dataclass
class RunStore:
    """The artifacts of one run in a :class:`~rlcr.storage.Store`."""

    store: Store
    run_id: str

    def __post_init__(self) -> None:
        validate_run_id(self.run_id)

    @classmethod
    def open(cls, cfg: RLCRConfig, run_id: str) -> "RunStore":
        return cls(Store(cfg.storage_uri, endpoint_url=cfg.s3_endpoint_url), run_id)

    @property
    def prefix(self) -> str:
        return f"runs/{self.run_id}"

    def iteration_dir(self, iteration: int) -> str:
        return iteration_prefix(self.run_id, iteration)

    # every path of a run, in one place
    @property
    def config_rel(self) -> str:
        return f"{self.prefix}/config.json"

    @property
    def lease_rel(self) -> str:
        return f"{self.prefix}/lease.json"

    @property
    def baseline_rel(self) -> str:
        """Held-out evaluation of the initial policy (before iteration 1)."""
        return f"{self.prefix}/baseline.json"

    def eval_records_rel(self, iteration: int) -> str:
        """Per-answer rows of the held-out evaluation after iteration k (k = 0: of the initial policy, beside
        ``baseline.json``), for paired comparisons (:func:`rlcr.evaluate.compare_evaluations`)."""
        return f"{self.prefix}/baseline-eval.parquet" if iteration == 0 else f"{self.iteration_dir(iteration)}/eval.parquet"

    def eval_records(self, iteration: int) -> list[dict[str, Any]] | None:
        """The per-answer held-out rows after iteration k (0: the initial policy); None where that evaluation
        kept none (no evaluation, or a run from before rows were kept)."""
        from rlcr.rollout.records import table_to_rows

        rel = self.eval_records_rel(iteration)
        return table_to_rows(self.store.read_parquet(rel)) if self.store.exists(rel) else None

    def manifest_rel(self, iteration: int) -> str:
        return f"{self.iteration_dir(iteration)}/manifest.json"

    def metrics_rel(self, iteration: int) -> str:
        return f"{self.iteration_dir(iteration)}/metrics.json"

    def pending_rel(self, iteration: int) -> str:
        """The manifest draft of a staged iteration (see the module docstring)."""
        return f"{self.iteration_dir(iteration)}/pending.json"

    def checkpoint_rel(self, iteration: int) -> str:
        """The policy after iteration k (k = 0: a warm-start run's SFT checkpoint)."""
        return f"{self.iteration_dir(iteration)}/checkpoint"

    def sweep_temporaries(self) -> list:
        """Remove what killed writers of this run left behind (local stores; S3 writes no temporaries)."""
        removed = self.store.sweep_temporaries(self.prefix)
        for p in removed:
            log.warning("removed %s, left by a killed writer", p)
        return removed

    # ---------------------------------------------------------------- config
    def check_config(self, cfg: RLCRConfig) -> None:
        """Record the run's config on first use; on resume refuse a config with other settings."""
        rel = self.config_rel
        current = cfg.model_dump(mode="json")
        if not self.store.exists(rel):
            self.store.write_json(rel, {"config": current, "config_hash": cfg.config_hash()})
            return
        saved = self.store.read_json(rel)
        if saved["config_hash"] == cfg.config_hash():
            return
        diff = result_changing_diff(saved["config"], cfg)
        if diff:
            details = ", ".join(f"{k}: {saved['config'].get(k)!r} → {current.get(k)!r}" for k in diff)
            raise RunConfigMismatch(f"run {self.run_id!r} was started with other settings ({details}); "
                                    "use a new run_id or the original config")

    # ---------------------------------------------------------------- manifests
    def manifest(self, iteration: int) -> dict[str, Any] | None:
        try:
            return self.store.read_json(self.manifest_rel(iteration))
        except FileNotFoundError:
            return None

    def committed(self) -> list[dict[str, Any]]:
        """Manifests of the committed iterations 1..k, in order (stops at the first gap)."""
        out = []
        k = 1
        while (m := self.manifest(k)) is not None:
            out.append(m)
            k += 1
        return out

    def last_committed(self) -> dict[str, Any] | None:
        done = self.committed()
        return done[-1] if done else None

    def stage(self, iteration: int, manifest: dict[str, Any], metrics: dict[str, Any], *,
              lease: "RunLease | None" = None) -> None:
        """Write iteration k's metrics and manifest draft (pending; a re-run overwrites both)."""
        if self.manifest(iteration) is not None:
            raise AlreadyCommitted(f"iteration {iteration} of run {self.run_id!r} is already committed; "
                                   f"refusing to stage it again")
        if lease is not None:
            lease.check()
        self.store.write_json(self.metrics_rel(iteration), metrics)
        self.store.write_json(self.pending_rel(iteration),
                              {**manifest, "metrics_uri": self.store.url(self.metrics_rel(iteration))})

    def pending(self) -> list[int]:
        """Staged iterations after the last committed one, in order (stops at the first gap)."""
        k, out = len(self.committed()) + 1, []
        while self.store.exists(self.pending_rel(k)):
            out.append(k)
            k += 1
        return out

    def commit_staged(self, iterations: list[int], state_uri: str, state_iteration: int, *,
                      lease: "RunLease | None" = None) -> list[str]:
        """Commit staged iterations, in order, as covered by the sealed state saved after ``state_iteration``."""
        uris = []
        content_id = self.store.content_id(self.store.rel(state_uri))
        for k in iterations:
            draft = self.store.read_json(self.pending_rel(k))
            manifest = {**draft, "state_uri": state_uri, "state_iteration": state_iteration,
                        "state_content_id": content_id,
                        "checkpoint_uri": state_uri if k == state_iteration else None}
            uris.append(self.commit(k, manifest, lease=lease))
            self.store.rm(self.pending_rel(k))
        return uris

    def finish_group(self, *, lease: "RunLease | None" = None) -> list[str]:
        """Commit the rest of a group a crash interrupted: the last committed manifest names a saved state
        after a later iteration, whose staged iterations are committed now. Returns the manifests written."""
        last = self.last_committed()
        if not last or not last.get("state_iteration") or last["state_iteration"] <= last["iteration"]:
            return []
        todo = list(range(last["iteration"] + 1, last["state_iteration"] + 1))
        missing = [k for k in todo if not self.store.exists(self.pending_rel(k))]
        if missing:
            raise RuntimeError(f"run {self.run_id!r}: iterations {missing} are covered by {last['state_uri']} "
                               f"but their staged manifests are gone; cannot finish committing them")
        return self.commit_staged(todo, last["state_uri"], last["state_iteration"], lease=lease)

    def commit(self, iteration: int, manifest: dict[str, Any], *, lease: "RunLease | None" = None) -> str:
        """Write the manifest last, create-only and durably: after this, the iteration exists.

        Refused (nothing written) when the checkpoint is not sealed, when iteration k−1 is not
        committed, when ``lease`` is no longer held, or when iteration k is already committed.
        """
        ckpt = manifest.get("checkpoint_uri") or manifest.get("state_uri")
        if ckpt and not self.store.is_complete(self.store.rel(ckpt)):
            raise RuntimeError(f"refusing to commit iteration {iteration}: checkpoint {ckpt} is not sealed")
        if iteration > 1 and self.manifest(iteration - 1) is None:
            raise RuntimeError(f"refusing to commit iteration {iteration} of run {self.run_id!r}: "
                               f"iteration {iteration - 1} is not committed")
        if lease is not None:
            lease.check()
        manifest = {**manifest, "run_id": self.run_id, "iteration": iteration, "committed_at": time.time()}
        rel = self.manifest_rel(iteration)
        try:
            self.store.write_json(rel, manifest, exclusive=True)
        except AlreadyExists:
            raise AlreadyCommitted(f"iteration {iteration} of run {self.run_id!r} is already committed "
                                   f"({self.store.url(rel)}); refusing to overwrite it") from None
        return self.store.url(rel)


def _now() -> float:
    return time.time()


class RunLease:
    """The exclusive writer lease of one run (see the module docstring).

    ``with RunLease(run, owner="flow run 1234"):`` acquires on entry (raising
    :class:`RunLocked` naming the live holder), renews the heartbeat from a daemon
    thread, and releases on exit. :meth:`check` raises :class:`LeaseLost` if the lease
    was taken over meanwhile (e.g. this process stalled past ``timeout_s``).
    """

    def __init__(self, run: RunStore, *, owner: str | None = None, timeout_s: float = LEASE_TIMEOUT_S,
                 heartbeat_s: float = LEASE_HEARTBEAT_S):
        if heartbeat_s <= 0 or timeout_s <= heartbeat_s:
            raise ValueError(f"lease timeout ({timeout_s} s) must exceed the heartbeat interval ({heartbeat_s} s) > 0")
        self.run, self.store, self.rel = run, run.store, run.lease_rel
        self.timeout_s, self.heartbeat_s = timeout_s, heartbeat_s
        self.token = uuid.uuid4().hex
        self.owner = owner or "rlcr"
        self.version: str | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ document
    def _doc(self, acquired_at: float) -> bytes:
        return json.dumps({
            "run_id": self.run.run_id, "owner": self.owner, "token": self.token,
            "host": socket.gethostname(), "machine": _machine_id(), "pid": os.getpid(), "user": _user(),
            "acquired_at": acquired_at, "heartbeat_at": _now(), "timeout_s": self.timeout_s,
        }, indent=1).encode()

    @staticmethod
    def describe(holder: dict[str, Any]) -> str:
        """``holder``: a lease as :func:`_parse_lease` reads it."""
        age = _now() - holder["heartbeat_at"]
        return (f"{holder.get('owner')} ({holder.get('user')}@{holder.get('host')}, pid {holder.get('pid')}), "
                f"last heartbeat {age:.0f} s ago")

    # ------------------------------------------------------------------ acquire / renew / release
    def acquire(self) -> "RunLease":
        self._acquired_at = _now()
        data = self._doc(self._acquired_at)
        try:
            self.store.write_bytes(self.rel, data, exclusive=True)
        except AlreadyExists:
            self._take_over_if_stale(data)
        raw, self.version = self.store.read_versioned(self.rel)
        holder = _parse_lease(raw)
        if holder.get("token") != self.token:  # lost a race right after acquiring
            raise RunLocked(self._locked_message(holder))
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat_loop, name=f"lease-{self.run.run_id}", daemon=True)
        self._thread.start()
        return self

    def _locked_message(self, holder: dict[str, Any]) -> str:
        return (f"run {self.run.run_id!r} is being written by {self.describe(holder)}; only one writer per run. "
                f"Wait for it to finish, use another run id, or — if that writer is dead — retry after "
                f"{self.timeout_s:.0f} s without a heartbeat, when its lease ({self.store.url(self.rel)}) is taken over")

    def _take_over_if_stale(self, data: bytes) -> None:
        try:
            raw, version = self.store.read_versioned(self.rel)
        except FileNotFoundError:  # released in between: try once more from scratch
            try:
                self.store.write_bytes(self.rel, data, exclusive=True)
            except AlreadyExists:
                raise RunLocked(f"run {self.run.run_id!r}: another writer acquired the lease just now") from None
            return
        holder = _parse_lease(raw)
        age = _now() - holder["heartbeat_at"]
        dead_here = holder["machine"] == _machine_id() and not pid_alive(holder["pid"])
        if age <= holder["timeout_s"] and not dead_here:
            raise RunLocked(self._locked_message(holder))
        try:
            self.store.write_if_version(self.rel, data, version)
        except VersionConflict:
            raise RunLocked(f"run {self.run.run_id!r}: another writer took over the stale lease first") from None
        log.warning("run %s: took over the lease of %s", self.run.run_id, self.describe(holder))

    def renew(self) -> None:
        """Write a fresh heartbeat if the lease is still ours (else mark it lost)."""
        with self._lock:
            if self.lost or self.version is None:
                return
            try:
                self.store.write_if_version(self.rel, self._doc(self._acquired_at), self.version)
                _, self.version = self.store.read_versioned(self.rel)
                self._last_ok = _now()
            except (VersionConflict, FileNotFoundError):
                self.lost = "the lease was taken over by another writer"
            except StorageError as e:  # storage unreachable: keep trying until the timeout
                if _now() - getattr(self, "_last_ok", self._acquired_at) > self.timeout_s:
                    self.lost = f"the heartbeat could not be written for {self.timeout_s:.0f} s ({e})"

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.renew()
            if self.lost:
                log.error("run %s: %s", self.run.run_id, self.lost)
                return

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this writer still holds the lease (reads it: one GET)."""
        if self.lost is None:
            try:
                raw, _ = self.store.read_versioned(self.rel)
                if _parse_lease(raw).get("token") != self.token:
                    self.lost = "the lease was taken over by another writer"
            except FileNotFoundError:
                self.lost = "the lease was removed"
        if self.lost:
            raise LeaseLost(f"run {self.run.run_id!r}: {self.lost}; this writer stops without committing")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            if self.version is not None and not self.lost:
                try:
                    self.store.delete_if_version(self.rel, self.version)
                except StorageError as e:
                    log.warning("run %s: could not release the lease (%s); it expires after %.0f s",
                                self.run.run_id, e, self.timeout_s)
            self.version = None

    def __enter__(self) -> "RunLease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _parse_lease(raw: bytes) -> dict[str, Any]:
    """A lease document read from storage, with typed fields; anything unreadable counts as a heartbeat at
    time 0 (stale: taken over, by compare-and-swap, like a dead holder's)."""
    try:
        doc = json.loads(raw)
        doc = doc if isinstance(doc, dict) else {}
    except ValueError:
        doc = {}

    def num(key, default, kind=float):
        try:
            value = kind(doc.get(key, default))
            return value if value == value else default  # NaN → default
        except (TypeError, ValueError, OverflowError):
            return default

    return {**doc, "owner": str(doc.get("owner", "an unreadable lease")), "heartbeat_at": num("heartbeat_at", 0.0),
            "timeout_s": num("timeout_s", LEASE_TIMEOUT_S), "pid": num("pid", -1, int),
            "machine": str(doc.get("machine", ""))}


def _machine_id() -> str:
    """This machine (host name + boot id): a lease whose holder ran here and whose pid is gone is free at once."""
    try:
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "?"
