"""Run bookkeeping: manifests, commit and resume (the run's writer lease: :mod:`rlcr.lease`).

A run lives under ``<storage>/runs/<run_id>/``. Iteration k (from 1) writes its
artifacts under ``iter-<kkkk>/`` and is *committed* by writing
``iter-<kkkk>/manifest.json`` last, create-only: an iteration is committed once and
never overwritten. Anything without a manifest is an uncommitted attempt: a re-run
overwrites it, and readers ignore it.

With ``save_every`` > 1 the training state is saved every few iterations only. An
iteration after which nothing was saved is *staged* (``iter-<kkkk>/pending.json``:
its manifest draft, next to its rollouts and metrics) and committed, in order, when
the state that covers it is saved: every committed iteration is resumable exactly.
Its manifest names that state (``state_uri``, ``state_iteration``, and the seal's
``state_content_id``); only the saving iteration's manifest has a ``checkpoint_uri``.
``policy_in`` is the last *saved* state the iteration's policy descends from (a
sealed checkpoint, or the initial model) and ``policy_in_updates`` the iterations
applied to it in memory since (empty when the policy was that state itself);
``policy_out`` names the policy after the iteration (saved there only where
``checkpoint_uri`` is set). A crash in the middle of committing a group is finished on
resume (:meth:`RunStore.finish_group`).

**Paths are relative to the run.** Manifests and drafts record the run's own artifacts
as paths relative to ``runs/<run_id>/`` (``iter-0002/checkpoint``), so a store moved
elsewhere (another directory, bucket or prefix) still resumes; :meth:`RunStore.manifest`
returns them as absolute URIs of the store as it is now (an older manifest's absolute
URI ``…/runs/<run_id>/<rest>`` is mapped onto the current store the same way).

**Fencing.** Every write of a run's artifact goes through a :class:`RunStore` method
that checks the writer's lease first (:class:`LeaseLost` if it was taken over) and
refuses an iteration that is already committed (:class:`AlreadyCommitted`): a
committed artifact is never replaced. A check cannot be atomic with an S3 upload, so
readers verify too: resuming from a state, and finishing a group, require the seal's
content id to be the one the manifest recorded (:class:`StateMismatch` names both).

Everything read back is validated (:mod:`rlcr.untrusted`): a corrupt or hand-edited
manifest or draft gives one line naming the file, never a ``KeyError``.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from rlcr.config import RLCRConfig, result_changing_diff
from rlcr.lease import LEASE_HEARTBEAT_S, LEASE_TIMEOUT_S, LeaseLost, RunLease, RunLocked
from rlcr.storage import (
    AlreadyExists,
    Store,
    StorageError,
    iteration_prefix,
    validate_run_id,
)
from rlcr.tasks.sets import prompts_for_iteration, task_sets
from rlcr.untrusted import InvalidInput, field, parse_json, printable

__all__ = ["RunStore", "RunConfigMismatch", "RunLease", "RunLocked", "LeaseLost", "AlreadyCommitted",
           "StateMismatch", "task_sets", "prompts_for_iteration", "new_run_id", "list_runs", "check_fence",
           "LEASE_TIMEOUT_S", "LEASE_HEARTBEAT_S", "MAX_ITERATION"]

log = logging.getLogger(__name__)

MAX_ITERATION = 1_000_000
"""The largest iteration number a manifest may name."""
URI_FIELDS = ("checkpoint_uri", "state_uri", "rollouts_uri", "metrics_uri", "policy_in", "policy_out")
"""Manifest fields that name artifacts: recorded relative to the run where they lie under it."""

_RUN_RELATIVE = re.compile(r"iter-(\d{4,})(/|$)")
"""A recorded path relative to the run (anything else, e.g. the initial model's name, is kept as it is)."""


class RunConfigMismatch(ValueError):
    """Resuming a run with settings that differ from the ones it started with."""


class AlreadyCommitted(RuntimeError):
    """An iteration that is already committed cannot be committed (or any of its artifacts written) again."""


class StateMismatch(RuntimeError):
    """A saved state's seal is not the one its manifest recorded: it was rewritten after the commit."""


def new_run_id() -> str:
    """A fresh run id: UTC time to the second plus a random suffix (unique across calls and machines)."""
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)


def list_runs(store: Store) -> list[str]:
    """The run ids under ``store``'s ``runs/``: entries that are not runs (``.DS_Store``, a README, a folder
    whose name is no valid run id) are skipped."""
    out = []
    for name in store.ls("runs"):
        try:
            validate_run_id(name)
        except ValueError:
            continue
        if store.exists(f"runs/{name}/config.json") or store.exists(f"runs/{name}/iter-0001"):
            out.append(name)
    return out


def check_fence(store: Store, fence: dict[str, str]) -> None:
    """Raise :class:`LeaseLost` unless the lease at ``fence["lease_rel"]`` still carries ``fence["token"]`` and
    ``fence["manifest_rel"]`` is not written yet: the last check a trainer worker makes before it uploads a
    checkpoint (see :meth:`RunStore.checkpoint_fence`)."""
    from rlcr.lease import parse_lease

    try:
        raw = store.read_bytes(fence["lease_rel"])
    except FileNotFoundError:
        raw = b""
    if parse_lease(raw, store.url(fence["lease_rel"])).get("token") != fence["token"]:
        raise LeaseLost(f"{store.url(fence['lease_rel'])}: the lease was taken over; not writing the checkpoint")
    if store.exists(fence["manifest_rel"]):
        raise LeaseLost(f"{store.url(fence['manifest_rel'])} exists: the iteration was committed by another "
                        f"writer; not writing the checkpoint")


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

    # ---------------------------------------------------------------- reading, validated
    def _read_doc(self, rel: str) -> dict[str, Any] | None:
        """A control document of the run (bounded, one-line :class:`InvalidInput` naming it), or None if absent."""
        try:
            raw = self.store.read_bytes(rel)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            raise InvalidInput(f"{self.store.url(rel)}: a parent of it is a file, not a folder") from None
        return parse_json(raw, self.store.url(rel))

    def _check_fields(self, doc: dict[str, Any], iteration: int, source: str, *, draft: bool) -> dict[str, Any]:
        """Check a manifest's (or ``draft``: a pending draft's) fields; ranges relative to ``iteration``."""
        if not draft:
            field(doc, "iteration", int, source, lo=iteration, hi=iteration)
            if field(doc, "run_id", str, source, default=self.run_id) != self.run_id:
                raise InvalidInput(f"{source}: field 'run_id' is {printable(doc['run_id'], 60)!r}, not {self.run_id!r}")
            field(doc, "committed_at", float, source, default=0.0)
            state_it = field(doc, "state_iteration", (int, type(None)), source, default=None, lo=iteration,
                             hi=MAX_ITERATION)
            if state_it is not None:
                recorded = self._relative(self._resolve(field(doc, "state_uri", str, source)))
                m = _RUN_RELATIVE.match(recorded)
                if m and int(m.group(1)) != state_it:
                    raise InvalidInput(f"{source}: field 'state_iteration' = {state_it} does not match its "
                                       f"state_uri {printable(recorded, 100)}")
            field(doc, "state_content_id", (str, type(None)), source, default=None)
        for key in URI_FIELDS:
            field(doc, key, (str, type(None)), source, default=None)
        field(doc, "policy_in_updates", list, source, default=[])
        field(doc, "config_hash", (str, type(None)), source, default=None)
        return doc

    def _resolve(self, value: str | None) -> str | None:
        """A recorded artifact path → an absolute URI in the store as it is now (see the module docstring)."""
        if not value:
            return value
        if _RUN_RELATIVE.match(value):
            return self.store.url(f"{self.prefix}/{value}")
        marker = f"/runs/{self.run_id}/"
        if marker in value:
            try:
                self.store.rel(value)
            except StorageError:
                return self.store.url(f"{self.prefix}/{value.split(marker, 1)[1]}")
        return value

    def _relative(self, value: Any) -> Any:
        """An artifact URI under this run → its path relative to the run (others are kept as they are)."""
        if not isinstance(value, str) or not value:
            return value
        try:
            rel = self.store.rel(value)
        except StorageError:
            return value
        return rel[len(self.prefix) + 1:] if rel.startswith(self.prefix + "/") else value

    def _resolved(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, **{k: self._resolve(doc[k]) for k in URI_FIELDS if k in doc}}

    def _recorded(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, **{k: self._relative(doc[k]) for k in URI_FIELDS if k in doc}}

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
            details = ", ".join(f"{k}: {printable(repr(saved['config'].get(k)), 60)} → {current.get(k)!r}"
                                for k in diff)
            raise RunConfigMismatch(f"run {self.run_id!r} was started with other settings ({details}); "
                                    "use a new run_id or the original config")

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
        self.guard(iteration, lease, "metrics")
        self.store.write_json(self.metrics_rel(iteration), metrics)
        return self.store.url(self.metrics_rel(iteration))

    def write_rollouts(self, iteration: int, table, *, lease: RunLease | None = None) -> str:
        """The iteration's rollouts Parquet (``iter-<k>/rollouts/rollouts.parquet``); returns its URI."""
        self.guard(iteration, lease, "rollouts")
        return self.store.write_parquet(f"{self.iteration_dir(iteration)}/rollouts/rollouts.parquet", table)

    def write_eval_records(self, iteration: int, table, *, lease: RunLease | None = None) -> str:
        self.guard(iteration, lease, "evaluation records")
        return self.store.write_parquet(self.eval_records_rel(iteration), table)

    def write_baseline(self, doc: dict[str, Any], *, lease: RunLease | None = None) -> None:
        """``baseline.json``, create-only (written once, before iteration 1)."""
        self.guard(0, lease, "baseline")
        try:
            self.store.write_json(self.baseline_rel, doc, exclusive=True)
        except AlreadyExists:
            raise AlreadyCommitted(f"{self.store.url(self.baseline_rel)} is already written") from None

    def checkpoint_fence(self, iteration: int, lease: RunLease | None) -> dict[str, str] | None:
        """Check as :meth:`guard` does, and return what the process that uploads iteration k's checkpoint
        checks again just before it does (:func:`check_fence`); None without a lease."""
        self.guard(iteration, lease, "checkpoint")
        if lease is None:
            return None
        return {"lease_rel": self.lease_rel, "token": lease.token, "manifest_rel": self.manifest_rel(iteration)}

    # ---------------------------------------------------------------- manifests
    def manifest(self, iteration: int) -> dict[str, Any] | None:
        """Iteration k's manifest, checked, with its artifact paths as absolute URIs; None if not committed."""
        rel = self.manifest_rel(iteration)
        doc = self._read_doc(rel)
        if doc is None:
            return None
        return self._resolved(self._check_fields(doc, iteration, self.store.url(rel), draft=False))

    def committed(self) -> list[dict[str, Any]]:
        """Manifests of the committed iterations 1..k, in order (stops at the first gap)."""
        out = []
        k = 1
        while k <= MAX_ITERATION and (m := self.manifest(k)) is not None:
            out.append(m)
            k += 1
        return out

    def last_committed(self) -> dict[str, Any] | None:
        done = self.committed()
        return done[-1] if done else None

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
        """Write iteration k's metrics and manifest draft (pending; a re-run overwrites both)."""
        self.write_metrics(iteration, metrics, lease=lease)
        draft = self._recorded({**manifest, "metrics_uri": self.store.url(self.metrics_rel(iteration))})
        self.store.write_json(self.pending_rel(iteration), draft)

    def pending(self) -> list[int]:
        """Staged iterations after the last committed one, in order (stops at the first gap)."""
        k, out = len(self.committed()) + 1, []
        while self.store.exists(self.pending_rel(k)):
            out.append(k)
            k += 1
        return out

    def _draft(self, iteration: int) -> dict[str, Any]:
        rel = self.pending_rel(iteration)
        doc = self._read_doc(rel)
        if doc is None:
            raise FileNotFoundError(f"{self.store.url(rel)}: the staged manifest is gone")
        return self._check_fields(doc, iteration, self.store.url(rel), draft=True)

    def commit_staged(self, iterations: list[int], state_uri: str, state_iteration: int, *,
                      lease: RunLease | None = None, content_id: str | None = None) -> list[str]:
        """Commit staged iterations, in order, as covered by the sealed state saved after ``state_iteration``
        (``content_id``: its seal's, when the caller knows it; else read now)."""
        uris = []
        content_id = content_id or self.store.content_id(self.store.rel(state_uri))
        for k in iterations:
            manifest = {**self._draft(k), "state_uri": state_uri, "state_iteration": state_iteration,
                        "state_content_id": content_id,
                        "checkpoint_uri": state_uri if k == state_iteration else None}
            uris.append(self.commit(k, manifest, lease=lease))
            self.store.rm(self.pending_rel(k))
        return uris

    def finish_group(self, *, lease: RunLease | None = None) -> list[str]:
        """Commit the rest of a group a crash interrupted: the last committed manifest names a saved state
        after a later iteration, whose staged iterations are committed now. Returns the manifests written."""
        last = self.last_committed()
        if not last or not last.get("state_iteration") or last["state_iteration"] <= last["iteration"]:
            return []
        state_uri = self.verified_state(last)
        first, end = last["iteration"] + 1, last["state_iteration"]
        for k in range(first, end + 1):  # stops at the first missing draft: bounded by what exists
            if not self.store.exists(self.pending_rel(k)):
                raise RuntimeError(f"run {self.run_id!r}: iterations {k}..{end} are covered by {state_uri} but "
                                   f"the staged manifest of {k} is gone; cannot finish committing them")
        return self.commit_staged(list(range(first, end + 1)), state_uri, end, lease=lease,
                                  content_id=last.get("state_content_id"))

    def commit(self, iteration: int, manifest: dict[str, Any], *, lease: RunLease | None = None) -> str:
        """Write the manifest last, create-only and durably: after this, the iteration exists.

        Refused (nothing written) when the checkpoint is not sealed, when iteration k−1 is not
        committed, when ``lease`` is no longer held, or when iteration k is already committed.
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
            raise AlreadyCommitted(f"iteration {iteration} of run {self.run_id!r} is already committed "
                                   f"({self.store.url(rel)}); refusing to overwrite it") from None
        return self.store.url(rel)
