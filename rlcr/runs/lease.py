"""The writer lease of a run: one writer per run, and a stalled or dead writer is taken over safely.

A flow holds ``runs/<run_id>/lease.json`` (:class:`RunLease`, created with a conditional put) for as long as
it runs and renews it every ``heartbeat_s`` with a compare-and-swap on its version (the ETag on S3). Every
renew changes the version: the version is the heartbeat.

**Takeover does not trust anyone's wall clock.** A writer finding the lease held:

1. takes it over at once (compare-and-swap) when the holder ran on this machine and its process is gone,
   or when the document is unreadable or invalid (a live holder's next renew or check would fail on it);
2. otherwise reads the holder's ``heartbeat_at`` only as a *hint*: when it is within ``timeout_s`` of this
   machine's clock (either way), the holder is taken to be alive and :class:`RunLocked` is raised at once;
3. otherwise (the heartbeat looks old, or the clocks disagree by more than ``timeout_s``) it *watches* the
   version for ``timeout_s`` of its own ``time.monotonic()``: if the version changes, the holder is alive
   (:class:`RunLocked`); if it does not, the lease is taken over with a compare-and-swap on the version it
   watched. A dead holder is so taken over within at most 3 × ``timeout_s`` whatever its clock claimed
   (the hint can only say "alive" for 2 × ``timeout_s`` of this machine's time), and a live holder whose
   clock is off is never taken over. ``timeout_s`` is always the taker's own (a lease's ``timeout_s`` field,
   ``Infinity`` or ``1e308`` included, is shown, never obeyed); at most :data:`LEASE_MAX_TIMEOUT_S`.

**Fencing.** The holder trusts its lease only until ``0.9 × timeout_s`` after the start of its last
successful renew, on its own monotonic clock — earlier than any taker can take over — and :meth:`check`
also reads the lease and compares its token. A writer that stalled (SIGSTOP, a long GC) is thus refused
(:class:`LeaseLost`) on its next check. Each renew on S3 uses short timeouts and one retry, so a slow S3
cannot make one renew last longer than the timeout; a failed renew is retried at once, then every
``heartbeat_s / 4``.

**A slow store is not another writer.** Every lease document carries the writer's random ``token`` (and the time
of its heartbeat), so no two writers ever write the same bytes. A create or renew whose PUT landed but whose answer
came too late is retried by the client and refused (412): the store takes an object holding exactly the bytes sent
as that write's success (:meth:`~rlcr.storage.Store.write_bytes`, :meth:`~rlcr.storage.Store.write_if_version`),
and the lease takes a lease carrying its own token as its own (a renew that failed but landed), never as a holder
to wait for or a takeover.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from rlcr.storage import AlreadyExists, StorageError, Store, VersionConflict, pid_alive, validate_new_run_id
from rlcr.untrusted import InvalidInput, field, parse_json, printable

__all__ = ["RunLease", "RunLocked", "LeaseLost", "LEASE_TIMEOUT_S", "LEASE_HEARTBEAT_S", "LEASE_MAX_TIMEOUT_S",
           "LEASE_MAX_BYTES", "parse_lease", "machine_id"]

log = logging.getLogger(__name__)

LEASE_TIMEOUT_S = 60.0
"""A lease whose version did not change for this long (seconds, the taker's clock) belongs to a dead writer."""
LEASE_HEARTBEAT_S = 10.0
"""How often the holder renews its lease (seconds)."""
LEASE_MAX_TIMEOUT_S = 3600.0
"""The longest lease timeout a writer may configure (seconds)."""
LEASE_MAX_BYTES = 64 * 1024
"""Largest lease document read (bytes): a larger one, or anything but a regular file, is refused unread."""
PID_MAX = 2 ** 22
"""The largest process id a lease may name (Linux's ``pid_max`` limit)."""


class RunLocked(RuntimeError):
    """Another live writer holds the run's lease; the message names it."""


class LeaseLost(RuntimeError):
    """This writer's lease was taken over (it stalled past the timeout): it must not write or commit."""


def _now() -> float:
    return time.time()


def _control_store(store: Store, attempt_s: float) -> Store:
    """``store`` for the lease's own requests: on S3 with short timeouts and one retry, so that a renew
    finishes (or fails) well within the lease timeout."""
    if store.is_local:
        return store
    import fsspec

    fast = Store(store.uri, endpoint_url=store.endpoint_url)
    options: dict[str, Any] = {"skip_instance_cache": True, "config_kwargs": {
        "retries": {"max_attempts": 2, "mode": "standard"}, "connect_timeout": min(5.0, attempt_s),
        "read_timeout": attempt_s}}
    if store.endpoint_url:
        options["client_kwargs"] = {"endpoint_url": store.endpoint_url}
    fast.fs = fsspec.filesystem(store.protocol, **options)
    fast.fs.retries = 1  # s3fs retries a timed-out call 5 times on top of botocore's attempts: not for the lease
    return fast


class RunLease:
    """The exclusive writer lease of one run (see the module docstring).

    ``with RunLease(run, owner="flow run 1234"):`` acquires on entry (raising :class:`RunLocked` naming the
    live holder), renews the heartbeat from a daemon thread, and releases on exit. :meth:`check` raises
    :class:`LeaseLost` if the lease was taken over meanwhile (e.g. this process stalled past ``timeout_s``).
    """

    def __init__(self, run, *, owner: str | None = None, timeout_s: float = LEASE_TIMEOUT_S,
                 heartbeat_s: float = LEASE_HEARTBEAT_S):
        if not (0 < heartbeat_s < timeout_s <= LEASE_MAX_TIMEOUT_S):
            raise ValueError(f"lease timeout ({timeout_s} s) must exceed the heartbeat interval ({heartbeat_s} s) "
                             f"> 0 and be at most {LEASE_MAX_TIMEOUT_S:.0f} s")
        self.run, self.rel = run, run.lease_rel
        self.store = _control_store(run.store, attempt_s=max(0.5, (timeout_s - heartbeat_s) / 4))
        self.timeout_s, self.heartbeat_s = float(timeout_s), float(heartbeat_s)
        self.token = uuid.uuid4().hex
        self.owner = owner or "rlcr"
        self.version: str | None = None
        self.lost: str | None = None
        self._valid_until = 0.0  # monotonic
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ document
    @property
    def attempt(self) -> str:
        """The id of this writer's attempt (the first 12 hex digits of its token): it names the paths its
        artifacts go to (``iter-<k>/attempt-<id>/``, :mod:`rlcr.runs.store`)."""
        return self.token[:12]

    def _doc(self) -> bytes:
        return json.dumps({
            "run_id": self.run.run_id, "owner": self.owner, "token": self.token,
            "host": socket.gethostname(), "machine": machine_id(), "pid": os.getpid(), "user": _user(),
            "acquired_at": self._acquired_at, "heartbeat_at": _now(), "timeout_s": self.timeout_s,
            "heartbeat_s": self.heartbeat_s,
        }, indent=1).encode()

    @staticmethod
    def describe(holder: dict[str, Any]) -> str:
        """``holder``: a lease as :func:`parse_lease` reads it. Ages are by this machine's clock, never negative."""
        if not holder.get("readable"):
            return f"an unreadable lease ({holder.get('problem')})"
        age = _now() - holder["heartbeat_at"]
        beat = (f"last heartbeat {age:.0f} s ago by this machine's clock" if age >= 0 else
                f"its clock is {-age:.0f} s ahead of this machine's")
        return (f"{printable(holder['owner'], 120)} ({printable(holder['user'], 40)}@{printable(holder['host'], 80)}, "
                f"pid {holder['pid']}), {beat}")

    # ------------------------------------------------------------------ acquire
    def acquire(self) -> "RunLease":
        """Take the lease (see the class docstring). A run that does not exist yet is created by this first
        write, so its id is checked first: one that could be read as a run reference (``@``) is refused
        (:func:`~rlcr.storage.validate_new_run_id`, a one-line ``InvalidInput``) before anything is written."""
        if "@" in self.run.run_id and not self.run.store.exists(self.run.prefix):
            try:
                validate_new_run_id(self.run.run_id)
            except ValueError as e:
                raise InvalidInput(str(e)) from None
        self._acquired_at = _now()
        self._sent = time.monotonic()
        try:
            self.store.write_bytes(self.rel, self._doc(), exclusive=True)
        except AlreadyExists:
            self._take_over()
        raw, self.version = self.store.read_versioned(self.rel, max_bytes=LEASE_MAX_BYTES)
        holder = parse_lease(raw, self.store.url(self.rel))
        if holder.get("token") != self.token:  # lost a race right after acquiring
            raise RunLocked(self._locked_message(holder))
        self._valid_until = self._sent + 0.9 * self.timeout_s  # from when the winning write was sent
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat_loop, name=f"lease-{self.run.run_id}", daemon=True)
        self._thread.start()
        return self

    def _locked_message(self, holder: dict[str, Any], why: str = "") -> str:
        return (f"run {self.run.run_id!r} is being written by {self.describe(holder)}{why}; only one writer per "
                f"run. Wait for it to finish, use another run id, or — if that writer is dead — retry: its lease "
                f"({self.store.url(self.rel)}) is taken over once it has not changed for {self.timeout_s:.0f} s")

    def _create_again(self) -> None:
        """The lease was released in between: try once more from scratch."""
        self._sent = time.monotonic()
        try:
            self.store.write_bytes(self.rel, self._doc(), exclusive=True)
        except AlreadyExists:
            raise RunLocked(f"run {self.run.run_id!r}: another writer acquired the lease just now") from None

    def _take_over(self) -> None:
        try:
            raw, version = self.store.read_versioned(self.rel, max_bytes=LEASE_MAX_BYTES)
        except FileNotFoundError:
            return self._create_again()
        holder = parse_lease(raw, self.store.url(self.rel))
        if holder.get("token") == self.token:  # this writer's own create landed, its answer lost: acquired
            return
        dead_here = holder.get("readable") and holder["machine"] == machine_id() and not pid_alive(holder["pid"])
        if holder.get("readable") and not dead_here:
            age = _now() - holder["heartbeat_at"]
            if abs(age) <= self.timeout_s:  # the hint says alive: refuse at once
                raise RunLocked(self._locked_message(holder))
            if not self._unchanged_for_timeout(holder, version):
                return self._create_again()
        self._sent = time.monotonic()
        try:
            self.store.write_if_version(self.rel, self._doc(), version)
        except VersionConflict:
            raise RunLocked(f"run {self.run.run_id!r}: another writer took over the stale lease first") from None
        log.warning("run %s: took over the lease of %s", self.run.run_id, self.describe(holder))

    def _unchanged_for_timeout(self, holder: dict[str, Any], version: str) -> bool:
        """Watch the lease's version for ``timeout_s`` (this machine's monotonic clock). True: unchanged (the
        holder is dead); False: the lease is gone (released). A changed version raises :class:`RunLocked`."""
        log.warning("run %s: the lease of %s: no recent heartbeat by this machine's clock; watching it for "
                    "%.0f s before taking it over", self.run.run_id, self.describe(holder), self.timeout_s)
        deadline = time.monotonic() + self.timeout_s
        poll = max(0.05, min(1.0, self.heartbeat_s / 2))
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(poll, left))
            try:
                _, now_version = self.store.read_versioned(self.rel, max_bytes=LEASE_MAX_BYTES)
            except FileNotFoundError:
                return False
            if now_version != version:
                raise RunLocked(self._locked_message(holder, ", which renewed its lease while this writer "
                                                             "watched it (its clock differs from this machine's)"))
        return True

    # ------------------------------------------------------------------ renew / check / release
    def renew(self) -> None:
        """Write a fresh heartbeat if the lease is still ours (else mark it lost)."""
        with self._lock:
            if self.lost or self.version is None:
                return
            started = time.monotonic()
            try:
                self._swap_heartbeat()
                _, self.version = self.store.read_versioned(self.rel, max_bytes=LEASE_MAX_BYTES)
                self._valid_until = started + 0.9 * self.timeout_s
            except (VersionConflict, FileNotFoundError):
                self.lost = "the lease was taken over by another writer"
            except StorageError as e:  # storage unreachable: keep trying while the lease is still valid
                if time.monotonic() >= self._valid_until:
                    self.lost = f"the heartbeat could not be written for {0.9 * self.timeout_s:.0f} s ({e})"
                raise

    def _swap_heartbeat(self) -> None:
        """Write a fresh heartbeat by compare-and-swap on :attr:`version`. On a conflict, a lease that still
        carries this writer's token was written by this writer (no other has the token): an earlier renew that
        landed while its answer was lost (a slow store; the renew failed with StorageError). Its version is
        adopted and the swap made again; a lease with any other token is another writer's (VersionConflict)."""
        try:
            self.store.write_if_version(self.rel, self._doc(), self.version)
        except VersionConflict:
            raw, version = self.store.read_versioned(self.rel, max_bytes=LEASE_MAX_BYTES)
            if parse_lease(raw, self.store.url(self.rel)).get("token") != self.token:
                raise
            self.version = version
            self.store.write_if_version(self.rel, self._doc(), self.version)

    def _heartbeat_loop(self) -> None:
        wait = self.heartbeat_s
        while not self._stop.wait(wait):
            try:
                self.renew()
                wait = self.heartbeat_s
            except StorageError as e:
                log.warning("run %s: renewing the lease failed (%s); retrying", self.run.run_id, e)
                wait = self.heartbeat_s / 4
            if self.lost:
                log.error("run %s: %s", self.run.run_id, self.lost)
                return

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this writer still holds the lease: its last renew is recent enough
        on this machine's monotonic clock, and the lease (one GET) still carries its token."""
        if self.lost is None and self.version is not None and time.monotonic() >= self._valid_until:
            self.lost = (f"no heartbeat landed for {0.9 * self.timeout_s:.0f} s (this writer stalled or storage was "
                         f"unreachable): another writer may have taken over")
        if self.lost is None:
            try:
                raw, _ = self.store.read_versioned(self.rel, max_bytes=LEASE_MAX_BYTES)
                if parse_lease(raw, self.store.url(self.rel)).get("token") != self.token:
                    self.lost = "the lease was taken over by another writer"
            except FileNotFoundError:
                self.lost = "the lease was removed"
        if self.lost:
            raise LeaseLost(f"run {self.run.run_id!r}: {self.lost}; this writer stops without writing anything more")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            if self.version is not None and not self.lost:
                try:
                    self.store.delete_if_version(self.rel, self.version, max_bytes=LEASE_MAX_BYTES)
                except StorageError as e:
                    log.warning("run %s: could not release the lease (%s); it expires after %.0f s",
                                self.run.run_id, e, self.timeout_s)
            self.version = None

    def __enter__(self) -> "RunLease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def parse_lease(raw: bytes, source: str) -> dict[str, Any]:
    """A lease document read from storage, with checked fields and ``readable`` True; anything unreadable or
    out of range (a pid beyond :data:`PID_MAX`, a non-finite heartbeat) gives ``readable`` False and the
    problem, in one line: such a lease is taken over at once (its holder's next renew or check fails on it)."""
    try:
        doc = parse_json(raw, source, max_bytes=LEASE_MAX_BYTES)
        return {"readable": True, "token": field(doc, "token", str, source),
                "owner": field(doc, "owner", str, source, default="?"),
                "user": field(doc, "user", str, source, default="?"),
                "host": field(doc, "host", str, source, default="?"),
                "machine": field(doc, "machine", str, source, default=""),
                "pid": field(doc, "pid", int, source, lo=1, hi=PID_MAX),
                "heartbeat_at": field(doc, "heartbeat_at", float, source),
                "timeout_s": field(doc, "timeout_s", float, source, default=LEASE_TIMEOUT_S)}
    except InvalidInput as e:
        return {"readable": False, "owner": "an unreadable lease", "problem": printable(e, 200)}


def machine_id() -> str:
    """This machine (host name + boot id): a lease whose holder ran here and whose pid is gone is free at once."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "?"
