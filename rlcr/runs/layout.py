"""Where a run's artifacts lie and how they are read back (the layout: :mod:`rlcr.runs.store`'s docstring).

Paths of the writer's own attempt (``iter-<k>/attempt-<id>/…``) are where it writes; readers look paths up
in the manifest (or the current draft), falling back to the layout of runs from before attempts.

**Every path of a run is built here** (``runs/<run_id>/…``): the flows, the trainer, the rollout pipeline,
the warm-start and the probe report ask :class:`RunLayout` (or :class:`rlcr.runs.store.RunStore`) for theirs
(``tests/test_layers.py`` refuses a run path built anywhere else).
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from rlcr.runs.lease import LEASE_MAX_BYTES, RunLease
from rlcr.storage import StorageError, Store, validate_run_id
from rlcr.untrusted import MAX_JSON_BYTES, InvalidInput, field, parse_json, printable

__all__ = ["RunLayout", "attempt_id", "PROCESS_ATTEMPT", "MAX_ITERATION", "URI_FIELDS", "RUNS", "STATUS_STATES",
           "ATTEMPT_PATTERN"]

log = logging.getLogger(__name__)

RUNS = "runs"
"""The folder of a store that holds its runs, one folder per run id."""
MAX_ITERATION = 1_000_000
STATUS_STATES = ("running", "finished", "stopped")
"""A training attempt's states in ``status.json``: ``running`` until it ends; one that ends without saying so (a
SIGKILL, a lost machine) stays ``running`` with no live lease."""
"""The largest iteration number a manifest may name."""
URI_FIELDS = ("checkpoint_uri", "state_uri", "rollouts_uri", "metrics_uri", "records_uri", "policy_in", "policy_out",
              "next_rollouts_uri")
"""Manifest fields that name artifacts: recorded relative to the run where they lie under it."""

_RUN_RELATIVE = re.compile(r"iter-(\d{4,})(/|$)")
"""A recorded path relative to the run (anything else, e.g. the initial model's name, is kept as it is)."""
ATTEMPT_PATTERN = re.compile(r"[0-9A-Za-z_-]{1,40}\Z")
_MODEL_COPY = re.compile(r"models/[0-9a-f]{32}")
_CONTENT_ID = re.compile(r"[0-9a-f]{32}")
PROCESS_ATTEMPT = secrets.token_hex(6)
"""The attempt id of the writes this process makes without a lease."""


def attempt_id(lease: RunLease | None) -> str:
    """The attempt a write belongs to: the lease's (:attr:`RunLease.attempt`), or this process's without one."""
    return lease.attempt if lease is not None else PROCESS_ATTEMPT


@dataclass
class RunLayout:
    """Where the artifacts of one run in a :class:`~rlcr.storage.Store` lie; reading them back, validated."""

    store: Store
    run_id: str

    def __post_init__(self) -> None:
        validate_run_id(self.run_id)

    # every path of a run, in one place
    @staticmethod
    def run_prefix(run_id: str) -> str:
        """``runs/<run_id>``, for a valid run id (else ValueError naming it)."""
        return f"{RUNS}/{validate_run_id(run_id)}"

    @classmethod
    def iteration_dir_of(cls, run_id: str, iteration: int) -> str:
        """``runs/<run_id>/iter-<kkkk>``: the folder of iteration k (zero-padded to 4 digits)."""
        return f"{cls.run_prefix(run_id)}/iter-{iteration:04d}"

    @classmethod
    def standalone_checkpoint_rel(cls, run_id: str, iteration: int) -> str:
        """Where a standalone update (:func:`rlcr.train.trainer.run_update`: the SFT warm-start, a one-off update; no
        lease, no manifest) saves the policy after iteration k: ``iter-<k>/checkpoint`` (k = 0: the warm-start
        checkpoint :meth:`checkpoint_rel` reads)."""
        return f"{cls.iteration_dir_of(run_id, iteration)}/checkpoint"

    @classmethod
    def standalone_rollouts_rel(cls, run_id: str, iteration: int) -> str:
        """Where standalone rollouts (:func:`rlcr.rollout.pipeline.run_rollouts` with a store; not the flow's,
        which :meth:`rollouts_rel` places) go: ``iter-<k>/rollouts/rollouts.parquet``."""
        return f"{cls.iteration_dir_of(run_id, iteration)}/rollouts/rollouts.parquet"

    @property
    def prefix(self) -> str:
        return self.run_prefix(self.run_id)

    def iteration_dir(self, iteration: int) -> str:
        return self.iteration_dir_of(self.run_id, iteration)

    @property
    def probes_rel(self) -> str:
        """The run's probe reports, one folder per UTC timestamp (:mod:`rlcr.probe.report`)."""
        return f"{self.prefix}/probes"

    def probe_rel(self, timestamp: str, name: str = "") -> str:
        """One probe report's folder (``probes/<timestamp>``), or its file ``name`` (``report.json``, …)."""
        return f"{self.probes_rel}/{timestamp}" + (f"/{name}" if name else "")

    def final_eval_rel(self, key: str, name: str = "") -> str:
        """One before → after evaluation of two checkpoints on a larger held-out set (``rlcr demo``'s last
        step): ``final-eval/<key>`` (``key``: a digest of what was evaluated), or its file ``name``."""
        return f"{self.prefix}/final-eval/{key}" + (f"/{name}" if name else "")

    @property
    def config_rel(self) -> str:
        return f"{self.prefix}/config.json"

    def stored_config(self) -> dict[str, Any] | None:
        """The config record the run started with (``config.json``'s ``config``, checked to be an object; a run
        from before the sections holds flat names), or None where the run recorded none."""
        doc = self._read_doc(self.config_rel)
        return None if doc is None else field(doc, "config", dict, self.store.url(self.config_rel))

    @property
    def lease_rel(self) -> str:
        return f"{self.prefix}/lease.json"

    @property
    def status_rel(self) -> str:
        """How the run's last training attempt went (``running``, then ``finished`` or ``stopped`` with a reason)
        and the iterations it was asked for: rewritten by each attempt, under its lease (:meth:`status`)."""
        return f"{self.prefix}/status.json"

    def status(self) -> dict[str, Any] | None:
        """``status.json`` checked: ``state`` one of :data:`STATUS_STATES`, ``target`` a positive iteration count,
        ``reason`` a string or None; None if the run has none (a run from before it, or one never trained)."""
        doc = self._read_doc(self.status_rel)
        if doc is None:
            return None
        source = self.store.url(self.status_rel)
        state = field(doc, "state", str, source)
        if state not in STATUS_STATES:
            raise InvalidInput(f"{source}: field 'state' is {printable(state, 40)!r}, not one of "
                               f"{', '.join(STATUS_STATES)}")
        target = field(doc, "target", int, source, lo=1, hi=MAX_ITERATION)
        reason = field(doc, "reason", (str, type(None)), source, default=None)
        return {"state": state, "target": target, "reason": reason}

    @property
    def initial_model_rel(self) -> str:
        """The run's initial model, recorded when it starts (create-only): the store's copy it trains from."""
        return f"{self.prefix}/initial-model.json"

    def initial_model(self) -> dict[str, Any] | None:
        """The recorded initial model (``source``: the ``model.name`` it came from; ``model``: its copy in the
        store, ``models/<digest>``; ``content_id``: that copy's seal's), checked; None if none is recorded."""
        doc = self._read_doc(self.initial_model_rel)
        if doc is None:
            return None
        source = self.store.url(self.initial_model_rel)
        field(doc, "source", str, source)
        rel = field(doc, "model", str, source)
        if not _MODEL_COPY.fullmatch(rel):
            raise InvalidInput(f"{source}: field 'model' is {printable(rel, 80)!r}, not models/<digest>")
        if not _CONTENT_ID.fullmatch(field(doc, "content_id", str, source)):
            raise InvalidInput(f"{source}: field 'content_id' is not 32 lowercase hex digits")
        return doc

    @property
    def baseline_rel(self) -> str:
        """Held-out evaluation of the initial policy (before iteration 1)."""
        return f"{self.prefix}/baseline.json"

    def manifest_rel(self, iteration: int) -> str:
        return f"{self.iteration_dir(iteration)}/manifest.json"

    def attempt_dir(self, iteration: int, attempt: str) -> str:
        """Where attempt ``attempt`` writes iteration k's artifacts (k = 0: the baseline's evaluation rows)."""
        if not isinstance(attempt, str) or not ATTEMPT_PATTERN.match(attempt):
            raise ValueError(f"invalid attempt id {printable(attempt, 60)!r}")
        return f"{self.iteration_dir(iteration)}/attempt-{attempt}"

    def current_attempt(self) -> str:
        """The attempt of the run's lease holder (whose drafts are current), or this process's if none holds it."""
        from rlcr.runs.lease import parse_lease

        try:
            raw = self.store.read_bytes(self.lease_rel, max_bytes=LEASE_MAX_BYTES)
            token = parse_lease(raw, self.store.url(self.lease_rel)).get("token")
        except (FileNotFoundError, NotADirectoryError, InvalidInput):  # none, or unreadable (refused unread)
            token = None
        return token[:12] if isinstance(token, str) and ATTEMPT_PATTERN.match(token[:12]) else PROCESS_ATTEMPT

    def pending_rel(self, iteration: int, attempt: str | None = None) -> str:
        """The manifest draft of a staged iteration (see the module docstring): attempt ``attempt``'s; without
        one, the lease holder's (:meth:`current_attempt`), else a run's from before attempts, if either exists."""
        if attempt is not None:
            return f"{self.attempt_dir(iteration, attempt)}/pending.json"
        own, legacy = self.pending_rel(iteration, self.current_attempt()), self._draft_rel(iteration, None)
        return legacy if not self.store.exists(own) and self.store.exists(legacy) else own

    def _draft_rel(self, iteration: int, attempt: str | None) -> str:
        """Attempt ``attempt``'s draft of iteration k; None: a run's from before attempts
        (``iter-<k>/pending.json``)."""
        return self.pending_rel(iteration, attempt) if attempt else f"{self.iteration_dir(iteration)}/pending.json"

    def metrics_rel(self, iteration: int, attempt: str | None = None) -> str:
        """Iteration k's metrics: attempt ``attempt``'s (where it writes them); without one, the file the
        manifest (or the current draft) names (:meth:`lookup_rel`)."""
        if attempt is not None:
            return f"{self.attempt_dir(iteration, attempt)}/metrics.json"
        return self.lookup_rel(iteration, "metrics_uri", "metrics.json")

    def checkpoint_rel(self, iteration: int, attempt: str | None = None) -> str:
        """The policy after iteration k: attempt ``attempt``'s (where it saves it); without one, the checkpoint
        iteration k's manifest names (k = 0: a warm-start run's SFT checkpoint, ``iter-0000/checkpoint``)."""
        if attempt is not None:
            return f"{self.attempt_dir(iteration, attempt)}/checkpoint"
        if iteration == 0:
            return f"{self.iteration_dir(0)}/checkpoint"
        return self.lookup_rel(iteration, "checkpoint_uri", "checkpoint")

    def rollouts_rel(self, iteration: int, attempt: str) -> str:
        """Attempt ``attempt``'s rollouts Parquet of iteration k (the manifest's ``rollouts_uri`` names it)."""
        return f"{self.attempt_dir(iteration, attempt)}/rollouts/rollouts.parquet"

    def eval_records_rel(self, iteration: int, attempt: str | None = None) -> str:
        """Per-answer rows of the held-out evaluation after iteration k (k = 0: of the initial policy), for
        paired comparisons (:func:`rlcr.evaluation.evaluate.compare_evaluations`): attempt ``attempt``'s; without one,
        the
        file the manifest (k = 0: ``baseline.json``) names, else ``iter-<k>/eval.parquet``
        (``baseline-eval.parquet``) of a run from before attempts."""
        if attempt is not None:
            return f"{self.attempt_dir(iteration, attempt)}/eval.parquet"
        if iteration == 0:
            doc = self.baseline() or {}
            ev = doc.get("eval") if isinstance(doc.get("eval"), dict) else {}
            found = self._rel_in_run(ev.get("records_uri"))
            return found or f"{self.prefix}/baseline-eval.parquet"
        return self.lookup_rel(iteration, "records_uri", "eval.parquet")

    def lookup_rel(self, iteration: int, key: str, legacy: str) -> str:
        """The path iteration k's manifest records under ``key`` (for a staged iteration: the current draft's);
        where none records it, ``iter-<k>/<legacy>``, the layout of runs from before attempts."""
        doc = self.manifest(iteration)
        if doc is None:
            rel = self.pending_rel(iteration)
            draft = self._read_doc(rel)
            if draft is None:  # none, or committed (and removed) meanwhile
                doc = self.manifest(iteration)
            else:
                doc = self._resolved(self._check_fields(draft, iteration, self.store.url(rel), draft=True))
        return (doc and self._rel_in_run(doc.get(key))) or f"{self.iteration_dir(iteration)}/{legacy}"

    def _rel_in_run(self, uri: Any) -> str | None:
        """A recorded artifact URI (resolved onto the store as it is now) as a path in the store; None if not."""
        if not isinstance(uri, str) or not uri:
            return None
        try:
            return self.store.rel(self._resolve(uri))
        except StorageError:
            return None

    def metrics(self, iteration: int) -> dict[str, Any] | None:
        """Iteration k's metrics (committed: the manifest's; staged: the current draft's), or None. Metrics are
        data the run wrote, ``NaN`` included (a figure with nothing to average), read as they are."""
        rel = self.metrics_rel(iteration)
        try:
            raw = self.store.read_bytes(rel, max_bytes=MAX_JSON_BYTES)
        except FileNotFoundError:
            return None
        return parse_json(raw, self.store.url(rel), allow_nonfinite=True)  # bounded in size and nesting

    def baseline(self) -> dict[str, Any] | None:
        """``baseline.json`` (the initial policy's held-out evaluation), checked to be a bounded JSON object, or
        None if the run has none. Its figures may be NaN (nothing to average), as the run wrote them."""
        try:
            raw = self.store.read_bytes(self.baseline_rel, max_bytes=MAX_JSON_BYTES)
        except FileNotFoundError:
            return None
        return parse_json(raw, self.store.url(self.baseline_rel), allow_nonfinite=True)

    def metrics_uri(self, iteration: int) -> str | None:
        rel = self.metrics_rel(iteration)
        return self.store.url(rel) if self.store.exists(rel) else None

    def eval_table(self, iteration: int):
        """The per-answer held-out rows after iteration k (0: the initial policy) as the Arrow table stored
        (:func:`rlcr.rollout.records.table_to_rows` turns it into checked rows); None where that evaluation kept
        none (no evaluation, or a run from before rows were kept)."""
        rel = self.eval_records_rel(iteration)
        return self.store.read_parquet(rel) if self.store.exists(rel) else None

    def sweep_temporaries(self) -> list:
        """Remove what killed writers of this run left behind (local stores; S3 writes no temporaries)."""
        removed = self.store.sweep_temporaries(self.prefix)
        for p in removed:
            log.warning("removed %s, left by a killed writer", p)
        return removed

    # ---------------------------------------------------------------- reading, validated
    def _read_doc(self, rel: str) -> dict[str, Any] | None:
        """A control document of the run, or None if absent. Bounded: read only if it is a regular file of at most
        :data:`~rlcr.untrusted.MAX_JSON_BYTES` (a FIFO, a device or a larger file is refused by its ``stat`` or,
        on S3, a ranged read; one-line :class:`InvalidInput` naming it), then parsed with the nesting bound."""
        try:
            raw = self.store.read_bytes(rel, max_bytes=MAX_JSON_BYTES)
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
        attempt = field(doc, "attempt", (str, type(None)), source, default=None)
        if attempt is not None and not ATTEMPT_PATTERN.match(attempt):
            raise InvalidInput(f"{source}: field 'attempt' is {printable(attempt, 60)!r}, not an attempt id")
        for key in URI_FIELDS:
            field(doc, key, (str, type(None)), source, default=None)
        field(doc, "policy_in_updates", list, source, default=[])
        field(doc, "config_hash", (str, type(None)), source, default=None)
        field(doc, "next_rollouts_sha256", (str, type(None)), source, default=None)
        field(doc, "next_rollouts_version", (int, type(None)), source, default=None, lo=0, hi=MAX_ITERATION)
        field(doc, "rollouts_version", (int, type(None)), source, default=None, lo=0, hi=MAX_ITERATION)
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
