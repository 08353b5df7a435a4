"""Run bookkeeping: manifests, commit and resume (the run's writer lease: :mod:`rlcr.runs.lease`).

A run lives under ``<storage>/runs/<run_id>/``. Iteration k (from 1) is *committed* by
writing ``iter-<kkkk>/manifest.json`` last, create-only: an iteration is committed once and
never overwritten. Its artifacts are **attempt-scoped**: each writer (*attempt*: one lease,
:attr:`RunLease.attempt`, the first 12 hex digits of its token; without a lease, one id per
process) writes iteration k's only under its own ``iter-<kkkk>/attempt-<id>/``::

    iter-0002/manifest.json                      create-only; names the paths below
    iter-0002/attempt-3f2a9c01b7de/checkpoint/   sealed (where the state was saved)
    iter-0002/attempt-3f2a9c01b7de/metrics.json
    iter-0002/attempt-3f2a9c01b7de/rollouts/rollouts.parquet
    iter-0002/attempt-3f2a9c01b7de/eval.parquet  (held-out rows; k = 0: the baseline's, under iter-0000/)
    iter-0002/attempt-3f2a9c01b7de/pending.json  the manifest draft while staged

The manifest names exactly the paths of the attempt that committed (``checkpoint_uri``,
``state_uri``, ``metrics_uri``, ``rollouts_uri``, ``records_uri``, and that ``attempt``). So a
writer that passed its lease check and then stalled past the lease timeout can only ever
write into its own attempt's paths, which no manifest names: nothing committed is replaced,
whatever the timing. **Readers go through the manifest** (or, for a staged iteration, the
draft of the lease holder's attempt): :meth:`RunStore.metrics`, ``metrics_rel``,
``checkpoint_rel``, ``eval_records_rel`` (without an attempt) look the path up. Runs from
before attempts (``iter-<k>/checkpoint``, ``iter-<k>/metrics.json``, ``iter-<k>/pending.json``)
read as before: their manifests name those paths, and a lookup that finds no recorded path
falls back to them. An attempt's directory that no manifest names is garbage (a crashed or
taken-over writer's leftovers, or a stale writer's late upload): readers never look at it,
and it may be deleted once its iteration is committed.

With ``save_every`` > 1 the training state is saved every few iterations only. An
iteration after which nothing was saved is *staged* (``iter-<kkkk>/attempt-<id>/pending.json``:
its manifest draft, next to its rollouts and metrics) and committed, in order, when
the state that covers it is saved: every committed iteration is resumable exactly.
Its manifest names that state (``state_uri``, ``state_iteration``, and the seal's
``state_content_id``); only the saving iteration's manifest has a ``checkpoint_uri``.
``policy_in`` is the last *saved* state the iteration's policy descends from (a
sealed checkpoint, or the initial model) and ``policy_in_updates`` the iterations
applied to it in memory since (empty when the policy was that state itself);
``policy_out`` names the policy after the iteration (saved there only where
``checkpoint_uri`` is set). A crash in the middle of committing a group is finished on
resume (:meth:`RunStore.finish_group`, from the drafts of the attempt the last manifest names).

**Paths are relative to the run.** Manifests and drafts record the run's own artifacts
as paths relative to ``runs/<run_id>/`` (``iter-0002/attempt-<id>/checkpoint``), so a store moved
elsewhere (another directory, bucket or prefix) still resumes; :meth:`RunStore.manifest`
returns them as absolute URIs of the store as it is now (an older manifest's absolute
URI ``…/runs/<run_id>/<rest>`` is mapped onto the current store the same way).

**Fencing.** Every write of a run's artifact goes through a :class:`RunStore` method
that checks the writer's lease first (:class:`LeaseLost` if it was taken over) and
refuses an iteration that is already committed (:class:`AlreadyCommitted`). A check cannot
be atomic with an upload; attempt-scoped paths make that harmless (a late write lands in
its own attempt's paths), and readers verify too: resuming from a state, and finishing a group, require the seal's
content id to be the one the manifest recorded (:class:`StateMismatch` names both).

Everything read back is validated (:mod:`rlcr.untrusted`): a corrupt or hand-edited
manifest or draft gives one line naming the file, never a ``KeyError``.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from rlcr.config import RLCRConfig, nested_from_flat, result_changing_diff
from rlcr.runs.layout import ATTEMPT_PATTERN, MAX_ITERATION, PROCESS_ATTEMPT, RUNS, URI_FIELDS, RunLayout, attempt_id
from rlcr.runs.lease import LEASE_HEARTBEAT_S, LEASE_TIMEOUT_S, LeaseLost, RunLease, RunLocked
from rlcr.runs.task_sets import prompts_for_iteration, task_sets
from rlcr.storage import AlreadyExists, StorageError, Store, validate_run_id
from rlcr.storage.seals import COMPLETE_MARKER
from rlcr.untrusted import field, printable

__all__ = ["RunStore", "RunConfigMismatch", "RunLease", "RunLocked", "LeaseLost", "AlreadyCommitted",
           "StateMismatch", "task_sets", "prompts_for_iteration", "new_run_id", "list_runs", "run_folders", "is_run",
           "check_fence",
           "LEASE_TIMEOUT_S", "LEASE_HEARTBEAT_S", "MAX_ITERATION", "attempt_id", "PROCESS_ATTEMPT"]

log = logging.getLogger(__name__)


def _dotted(record: dict, name: str):
    """The value of the dotted field ``name`` in a nested config record (None where absent)."""
    value: Any = record
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


class RunConfigMismatch(ValueError):
    """Resuming a run with settings that differ from the ones it started with."""


class AlreadyCommitted(RuntimeError):
    """An iteration that is already committed cannot be committed (or any of its artifacts written) again."""


class StateMismatch(RuntimeError):
    """A saved state's seal is not the one its manifest recorded: it was rewritten after the commit."""


def new_run_id() -> str:
    """A fresh run id: UTC time to the second plus a random suffix (unique across calls and machines)."""
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


def run_folders(store: Store) -> list[str]:
    """The names under ``store``'s ``runs/`` that are valid run ids, sorted: one listing, nothing read (a folder
    may still hold no run: :func:`is_run`)."""
    out = []
    for name in store.ls(RUNS):
        try:
            out.append(validate_run_id(name))
        except ValueError:
            continue
    return sorted(out)


def is_run(store: Store, run_id: str) -> bool:
    """Whether ``runs/<run_id>`` holds a run (its config, a first iteration, or a warm-start's iteration 0), by at
    most three existence checks."""
    layout = RunLayout(store, run_id)
    return (store.exists(layout.config_rel) or store.exists(layout.iteration_dir(1))
            or store.exists(layout.iteration_dir(0)))


def list_runs(store: Store) -> list[str]:
    """The run ids under ``store``'s ``runs/``: entries that are not runs (``.DS_Store``, a README, a folder
    whose name is no valid run id) are skipped. Checks every folder (two requests each on S3): where only some
    are needed, take :func:`run_folders` and check those with :func:`is_run`."""
    return [name for name in run_folders(store) if is_run(store, name)]


def check_fence(store: Store, fence: dict[str, str]) -> None:
    """Raise :class:`LeaseLost` unless the lease at ``fence["lease_rel"]`` still carries ``fence["token"]`` and
    ``fence["manifest_rel"]`` is not written yet: the last check a trainer worker makes before it uploads a
    checkpoint (see :meth:`RunStore.checkpoint_fence`)."""
    from rlcr.runs.lease import LEASE_MAX_BYTES, parse_lease
    from rlcr.untrusted import InvalidInput

    try:
        raw = store.read_bytes(fence["lease_rel"], max_bytes=LEASE_MAX_BYTES)
    except (FileNotFoundError, InvalidInput):  # gone, or refused unread (not a lease this writer wrote)
        raw = b""
    if parse_lease(raw, store.url(fence["lease_rel"])).get("token") != fence["token"]:
        raise LeaseLost(f"{store.url(fence['lease_rel'])}: the lease was taken over; not writing the checkpoint")
    if store.exists(fence["manifest_rel"]):
        raise LeaseLost(f"{store.url(fence['manifest_rel'])} exists: the iteration was committed by another "
                        f"writer; not writing the checkpoint")


class RunStore(RunLayout):
    """The artifacts of one run in a :class:`~rlcr.storage.Store`: its layout and reads (:class:`RunLayout`), and
    its fenced writes and commits."""

    @classmethod
    def open(cls, cfg: RLCRConfig, run_id: str, *, create: bool = True) -> "RunStore":
        """Run ``run_id`` in the config's store; ``create`` False: a command that only reads (a missing local
        store is refused in one line, not created: :class:`~rlcr.storage.Store`)."""
        return cls(Store(cfg.storage.uri, endpoint_url=cfg.storage.s3_endpoint_url, create=create), run_id)

    # ---------------------------------------------------------------- config
    def check_config(self, cfg: RLCRConfig, *, lease: RunLease | None = None) -> None:
        """Record the run's config on first use; on resume refuse a config with other settings."""
        rel = self.config_rel
        current = cfg.model_dump(mode="json")
        saved = self._read_doc(rel)
        if saved is None:
            if lease is not None:
                lease.check()
            try:
                self.store.write_json(rel, {"config": current, "config_hash": cfg.config_hash()}, exclusive=True)
            except AlreadyExists:
                return self.check_config(cfg, lease=lease)
            return
        source = self.store.url(rel)
        if field(saved, "config_hash", str, source) == cfg.config_hash():
            return
        diff = result_changing_diff(field(saved, "config", dict, source), cfg)
        if diff:
            stored = nested_from_flat(saved["config"])  # a run stored before the sections: flat names
            details = ", ".join(f"{k}: {printable(repr(_dotted(stored, k)), 60)} → {_dotted(current, k)!r}"
                                for k in diff)
            fix = "use a new run_id or the original config"
            if self.last_committed() is None:  # a start that failed: nothing of it is worth keeping
                fix = (f"it has no committed iteration, so nothing is lost by discarding it: delete "
                       f"{printable(self.store.url(self.prefix), 300)} and start again, or {fix}")
            raise RunConfigMismatch(f"run {self.run_id!r} was started with other settings ({details}); {fix}")

    def write_status(self, state: str, target: int, reason: str | None = None, *,
                     lease: RunLease | None = None) -> None:
        """This attempt's ``status.json`` (:meth:`~rlcr.runs.layout.RunLayout.status`): its state, the iterations
        it was asked for and, when it stopped short of them, why. Fenced by ``lease``; it replaces the previous
        attempt's (a record of the latest attempt, not of the run's history)."""
        if lease is not None:
            lease.check()
        self.store.write_json(self.status_rel, {"state": state, "target": int(target), "reason": reason,
                                                "at": time.time()})

    def record_initial_model(self, doc: dict[str, Any], *, lease: RunLease | None = None) -> dict[str, Any]:
        """Record the run's initial model (:meth:`initial_model`), create-only, under ``lease``; returns the
        record that stands (another writer's, if it recorded one first)."""
        if lease is not None:
            lease.check()
        try:
            self.store.write_json(self.initial_model_rel, doc, exclusive=True)
        except AlreadyExists:
            pass
        return self.initial_model()

    # ---------------------------------------------------------------- fenced writes
    def guard(self, iteration: int, lease: RunLease | None, what: str) -> None:
        """Before writing ``what`` of iteration k (0: the baseline): the lease is still held (else
        :class:`LeaseLost`) and k is not committed yet (else :class:`AlreadyCommitted`)."""
        if lease is not None:
            lease.check()
        done = self.baseline_rel if iteration == 0 else self.manifest_rel(iteration)
        if self.store.exists(done):
            raise AlreadyCommitted(f"iteration {iteration} of run {self.run_id!r} is already committed "
                                   f"({self.store.url(done)}); refusing to write its {what}")

    def write_metrics(self, iteration: int, metrics: dict[str, Any], *, lease: RunLease | None = None) -> str:
        """The iteration's metrics, at the writer's attempt's path; returns its URI."""
        self.guard(iteration, lease, "metrics")
        rel = self.metrics_rel(iteration, attempt_id(lease))
        self.store.write_json(rel, metrics)
        return self.store.url(rel)

    def write_rollouts(self, iteration: int, table, *, lease: RunLease | None = None) -> str:
        """The iteration's rollouts Parquet (``iter-<k>/attempt-<id>/rollouts/rollouts.parquet``); its URI."""
        self.guard(iteration, lease, "rollouts")
        return self.store.write_parquet(self.rollouts_rel(iteration, attempt_id(lease)), table)

    def write_eval_records(self, iteration: int, table, *, lease: RunLease | None = None) -> str:
        """The held-out rows after iteration k (0: the baseline's), at the writer's attempt's path; its URI."""
        self.guard(iteration, lease, "evaluation records")
        return self.store.write_parquet(self.eval_records_rel(iteration, attempt_id(lease)), table)

    def write_baseline(self, doc: dict[str, Any], *, lease: RunLease | None = None) -> None:
        """``baseline.json``, create-only (written once, before iteration 1)."""
        self.guard(0, lease, "baseline")
        try:
            self.store.write_json(self.baseline_rel, doc, exclusive=True)
        except AlreadyExists:
            raise AlreadyCommitted(f"{self.store.url(self.baseline_rel)} is already written") from None

    def checkpoint_fence(self, iteration: int, lease: RunLease | None) -> dict[str, str] | None:
        """Check as :meth:`guard` does, and return what the process that uploads iteration k's checkpoint (to
        ``checkpoint_rel(k, attempt_id(lease))``) checks again just before it does (:func:`check_fence`); None
        without a lease."""
        self.guard(iteration, lease, "checkpoint")
        if lease is None:
            return None
        return {"lease_rel": self.lease_rel, "token": lease.token, "manifest_rel": self.manifest_rel(iteration)}

    def verified_state(self, manifest: dict[str, Any]) -> str | None:
        """The manifest's saved state (URI), after checking its seal is the one the manifest recorded
        (:class:`StateMismatch` naming both content ids otherwise); None when it names no state."""
        uri = manifest.get("state_uri") or manifest.get("checkpoint_uri")
        if not uri:
            return None
        recorded = manifest.get("state_content_id")
        if recorded is None:  # a manifest from before content ids were recorded
            return uri
        try:
            actual = self.store.content_id(self.store.rel(uri))
        except StorageError as e:
            raise StateMismatch(f"run {self.run_id!r}, iteration {manifest['iteration']}: its state {uri} cannot "
                                f"be verified ({printable(e, 200)})") from None
        if actual != recorded:
            raise StateMismatch(f"run {self.run_id!r}, iteration {manifest['iteration']}: the manifest recorded "
                                f"state content id {printable(recorded, 80)} but {uri} is sealed with {actual}: it "
                                f"was rewritten after the commit; refusing to resume from it")
        return uri

    def stage(self, iteration: int, manifest: dict[str, Any], metrics: dict[str, Any], *,
              lease: RunLease | None = None) -> None:
        """Write iteration k's metrics and manifest draft at the writer's attempt's paths (pending; the same
        attempt re-running k overwrites both)."""
        uri = self.write_metrics(iteration, metrics, lease=lease)
        draft = self._recorded({**manifest, "metrics_uri": uri, "attempt": attempt_id(lease)})
        self.store.write_json(self.pending_rel(iteration, attempt_id(lease)), draft)

    def pending(self) -> list[int]:
        """Staged iterations after the last committed one (the lease holder's: :meth:`pending_rel`), in order
        (stops at the first gap)."""
        k, out = len(self.committed()) + 1, []
        while self.store.exists(self.pending_rel(k)):
            out.append(k)
            k += 1
        return out

    def _draft(self, iteration: int, attempt: str | None) -> dict[str, Any]:
        """Attempt ``attempt``'s draft of iteration k (None: a run's from before attempts,
        ``iter-<k>/pending.json``)."""
        rel = self._draft_rel(iteration, attempt)
        doc = self._read_doc(rel)
        if doc is None:
            raise FileNotFoundError(f"{self.store.url(rel)}: the staged manifest is gone")
        return self._check_fields(doc, iteration, self.store.url(rel), draft=True)

    def commit_staged(self, iterations: list[int], state_uri: str, state_iteration: int, *,
                      lease: RunLease | None = None, content_id: str | None = None) -> list[str]:
        """Commit the writer's own staged iterations, in order, as covered by the sealed state saved after
        ``state_iteration`` (``content_id``: its seal's, when the caller knows it; else read now)."""
        return self._commit_drafts(iterations, attempt_id(lease), state_uri, state_iteration, lease, content_id)

    def _commit_drafts(self, iterations: list[int], attempt: str | None, state_uri: str, state_iteration: int,
                       lease: RunLease | None, content_id: str | None) -> list[str]:
        uris = []
        content_id = content_id or self.store.content_id(self.store.rel(state_uri))
        for k in iterations:
            draft = self._draft(k, attempt)
            manifest = {**draft, "state_uri": state_uri, "state_iteration": state_iteration,
                        "state_content_id": content_id,
                        "checkpoint_uri": state_uri if k == state_iteration else None}
            uris.append(self.commit(k, manifest, lease=lease))
            self.store.rm(self._draft_rel(k, attempt))
        return uris

    def finish_group(self, *, lease: RunLease | None = None) -> list[str]:
        """Commit the rest of a group a crash interrupted: the last committed manifest names a saved state
        after a later iteration, whose staged iterations (the drafts of the attempt that manifest names) are
        committed now. Returns the manifests written."""
        last = self.last_committed()
        if not last or not last.get("state_iteration") or last["state_iteration"] <= last["iteration"]:
            return []
        state_uri = self.verified_state(last)
        first, end, attempt = last["iteration"] + 1, last["state_iteration"], last.get("attempt")
        for k in range(first, end + 1):  # stops at the first missing draft: bounded by what exists
            if not self.store.exists(self._draft_rel(k, attempt)):
                raise RuntimeError(f"run {self.run_id!r}: iterations {k}..{end} are covered by {state_uri} but "
                                   f"the staged manifest of {k} is gone; cannot finish committing them")
        return self._commit_drafts(list(range(first, end + 1)), attempt, state_uri, end, lease,
                                   last.get("state_content_id"))

    def prune_checkpoints(self, keep: int, *, lease: RunLease | None = None) -> list[str]:
        """Delete the saved states of all but the newest ``keep`` committed saves
        (``orchestration.keep_checkpoints``); returns the URIs removed.

        Safe against a stale writer: only saves older than the newest ``keep`` committed ones are removed, and
        manifests are never removed, so whatever a later holder of the lease resumes from (the newest committed
        save) is never among them. The iterations stay committed (manifests, metrics, rollouts, evaluation
        rows); only their policy can no longer be loaded. Only a manifest's own checkpoint folder
        (``iter-<k>/attempt-<id>/checkpoint``, or ``iter-<k>/checkpoint`` of a run from before attempts) is
        removed: a path a manifest names anywhere else is left in place with a warning. The seal goes first, so
        a deletion cut short leaves an unsealed folder that readers refuse, never a sealed partial one."""
        if keep < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {keep}")
        saves = [m for m in self.committed() if m.get("checkpoint_uri")]
        removed = []
        for m in saves[:-keep]:
            k = m["iteration"]
            rel = self._rel_in_run(m["checkpoint_uri"])
            own = {f"{self.iteration_dir(k)}/checkpoint"}
            if m.get("attempt"):
                own.add(f"{self.attempt_dir(k, m['attempt'])}/checkpoint")
            if rel not in own:
                log.warning("run %s, iteration %d: its manifest names checkpoint %s, not this iteration's own "
                            "folder; left in place", self.run_id, k, printable(m["checkpoint_uri"], 200))
                continue
            if not self.store.exists(rel):
                continue  # removed before
            removed.append(self._remove_checkpoint(rel, lease))
        return removed

    def prune_dead_attempts(self, iterations: list[int], *, lease: RunLease | None = None) -> list[str]:
        """Delete the checkpoints that other attempts left under the committed iterations ``iterations`` (a
        writer that crashed, or lost its lease, before committing them); returns the URIs removed.

        Only a committed iteration is looked at, and in it only ``attempt-<id>/checkpoint`` folders of attempts
        other than the one its manifest names, holding no path the manifest names: the manifest is create-only,
        so no manifest can ever name them, and the attempt writing the run now is the one that committed.
        Fenced by ``lease`` before each deletion; the seal goes first, as in :meth:`prune_checkpoints`."""
        removed = []
        for k in iterations:
            m = self.manifest(k)
            if m is None or not m.get("attempt"):
                continue  # not committed (a live writer's), or from before attempts
            named = {self._rel_in_run(m.get(f)) for f in URI_FIELDS} - {None}
            for entry in self.store.ls(self.iteration_dir(k)):
                attempt = entry.removeprefix("attempt-")
                if entry == attempt or attempt == m["attempt"] or not ATTEMPT_PATTERN.match(attempt):
                    continue
                rel = f"{self.attempt_dir(k, attempt)}/checkpoint"
                if any(n == rel or n.startswith(rel + "/") for n in named) or not self.store.exists(rel):
                    continue
                removed.append(self._remove_checkpoint(rel, lease))
        return removed

    def _remove_checkpoint(self, rel: str, lease: RunLease | None) -> str:
        """Delete one checkpoint folder under ``lease`` (checked first): its seal, then its files; its URI."""
        if lease is not None:
            lease.check()
        self.store.rm(f"{rel}/{COMPLETE_MARKER}")
        self.store.rm(rel)
        return self.store.url(rel)

    def commit(self, iteration: int, manifest: dict[str, Any], *, lease: RunLease | None = None) -> str:
        """Write the manifest last, create-only and durably: after this, the iteration exists.

        Refused (nothing written) when the checkpoint is not sealed, when iteration k−1 is not
        committed, when ``lease`` is no longer held, or when iteration k is already committed — unless by
        this very commit, landed on an earlier try whose answer was lost (:meth:`_committed_as`).
        """
        ckpt = manifest.get("checkpoint_uri") or manifest.get("state_uri")
        if ckpt and not self.store.is_complete(self.store.rel(ckpt)):
            raise RuntimeError(f"refusing to commit iteration {iteration}: checkpoint {ckpt} is not sealed")
        if iteration > 1 and not self.store.exists(self.manifest_rel(iteration - 1)):
            raise RuntimeError(f"refusing to commit iteration {iteration} of run {self.run_id!r}: "
                               f"iteration {iteration - 1} is not committed")
        if lease is not None:
            lease.check()
        manifest = self._recorded({**manifest, "run_id": self.run_id, "iteration": iteration,
                                   "committed_at": time.time()})
        rel = self.manifest_rel(iteration)
        try:
            self.store.write_json(rel, manifest, exclusive=True)
        except AlreadyExists:
            if not self._committed_as(rel, manifest):
                raise AlreadyCommitted(f"iteration {iteration} of run {self.run_id!r} is already committed "
                                       f"({self.store.url(rel)}); refusing to overwrite it") from None
        return self.store.url(rel)

    def _committed_as(self, rel: str, manifest: dict[str, Any]) -> bool:
        """Whether the manifest at ``rel`` is ``manifest`` in every field but ``committed_at``, naming the same
        attempt: this commit's own, which landed although the store's answer was lost (the write failed with
        StorageError and the commit is being retried). Any other manifest, or one naming no attempt, is not."""
        import json

        from rlcr.untrusted import InvalidInput

        try:
            existing = self._read_doc(rel)
        except InvalidInput:
            return False
        ours = json.loads(json.dumps(manifest, sort_keys=True, default=str))
        if not existing or not ours.get("attempt"):
            return False
        return ({k: v for k, v in existing.items() if k != "committed_at"} ==
                {k: v for k, v in ours.items() if k != "committed_at"})
