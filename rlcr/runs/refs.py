"""Runs by name: ``RUN@ITERATION`` references to a run's checkpoints, and what ``rlcr runs`` lists.

**A run reference** is ``RUN@K`` (iteration K's checkpoint; ``RUN@0``: the run's starting point — a warm-start
run's checkpoint, else the store's copy of the model the run started from) or ``RUN@latest`` (the newest
committed iteration whose checkpoint is still held), read in the configured store (``storage.uri``). It has
no ``/`` and no ``://``, and the iteration follows the *last* ``@`` (a run id may hold ``@`` itself): so a
hub id (``org/name``), a URI and a path (``./first@2``) are never references. Where an argument takes run ids
(``rlcr compare``, ``rlcr probe --run-id``, ``rlcr runs show``) a bare ``RUN`` names the run itself.

Everything is resolved through the manifest (:class:`rlcr.runs.store.RunStore`): the URI given back is the sealed
checkpoint the committed iteration names, never a guessed path. An iteration without a checkpoint (saved
every ``orchestration.save_every`` iterations; older ones pruned by ``orchestration.keep_checkpoints``) is
one line naming the iterations that have one.

**States** (``rlcr runs``; the lease is read, never taken: :mod:`rlcr.runs.lease`):

* ``running`` — a writer holds the lease and its heartbeat is fresh (within the lease timeout of this
  machine's clock; a holder on this machine must still be alive);
* ``finished`` — every configured iteration (``run.iterations``) is committed;
* ``crashed`` — not finished, and its writer died holding the lease (a stale heartbeat, a holder on this
  machine that is gone, an unreadable lease): ``rlcr train --run-id RUN`` takes it over and resumes;
* ``stopped`` — not finished and no lease (the writer stopped early, on an error or an interruption, and
  released it): ``rlcr train --run-id RUN`` resumes;
* ``invalid`` — a file of the run cannot be read (the table names the problem).
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlcr.storage.errors import StorageError
from rlcr.tasks.base import LEGACY_TASK
from rlcr.untrusted import InvalidInput, field, printable

__all__ = ["RunRefError", "parse_ref", "is_run_ref", "resolve_checkpoint", "run_summary", "store_summaries",
           "iteration_rows", "MAX_LISTED_RUNS", "STATES", "LATEST", "READ_THREADS", "with_run_task", "TaskMismatch",
           "task_fields", "NoCommittedIteration", "newest_run", "newest_checkpoint"]

LATEST = "latest"
"""The iteration of ``RUN@latest``."""
MAX_LISTED_RUNS = 200
"""Most runs ``rlcr runs`` reads (the newest by name are shown first; the table says how many were left out)."""
STATES = ("running", "finished", "crashed", "stopped", "invalid")
READ_THREADS = 16
"""How many runs ``rlcr runs`` reads at once from S3 (each read waits on the network, not on this machine)."""
_REF = re.compile(r"(?P<run>[^/]+)@(?P<iteration>[0-9]{1,7}|latest)")


class RunRefError(InvalidInput):
    """A run reference that names nothing usable (no such run, iteration or checkpoint); one line."""


class NoCommittedIteration(RuntimeError):
    """The run has no committed iteration, so there is no checkpoint to read (probe, demo, the grid)."""


def parse_ref(text: Any) -> tuple[str, int | None] | None:
    """``(run id, iteration)`` (iteration None: ``latest``) when ``text`` is a run reference (see the module
    docstring), else None. The run id is checked (:func:`rlcr.storage.validate_run_id`: RunRefError)."""
    from rlcr.storage import validate_run_id

    if not isinstance(text, str) or "://" in text or not (m := _REF.fullmatch(text)):
        return None
    try:
        validate_run_id(m["run"])
    except ValueError as e:
        raise RunRefError(f"run reference {printable(text, 160)!r}: {e}") from None
    return m["run"], None if m["iteration"] == "latest" else int(m["iteration"])


def is_run_ref(text: Any) -> bool:
    """Whether ``text`` has the form of a run reference (``RUN@K``, ``RUN@latest``; no ``/``, no ``://``)."""
    return isinstance(text, str) and "://" not in text and _REF.fullmatch(text) is not None


def _open(store, run_id: str, label: str):
    from rlcr.runs.layout import RUNS
    from rlcr.runs.store import RunStore, run_folders

    run = RunStore(store, run_id)
    if not store.exists(run.prefix):
        runs = run_folders(store)[:10]  # one listing, whatever the store holds
        raise RunRefError(f"{label}: run {printable(run_id, 140)!r} not found under {printable(store.url(RUNS), 300)} "
                          f"(runs there: {', '.join(printable(r, 60) for r in runs) or 'none'}; "
                          "`rlcr runs` lists them)")
    return run


def _held(run, manifests: list[dict[str, Any]]) -> list[int]:
    """The committed iterations whose checkpoint is still there, sealed."""
    out = []
    for m in manifests:
        uri = m.get("checkpoint_uri")
        if uri and run._rel_in_run(uri) and run.store.is_complete(run._rel_in_run(uri)):
            out.append(m["iteration"])
    return out


def _starting_point(run, label: str) -> str:
    """``RUN@0``: a warm-start run's checkpoint, else the store's copy of the run's initial model."""
    rel = run.checkpoint_rel(0)
    if run.store.is_complete(rel):
        return run.store.url(rel)
    recorded = run.initial_model()
    if recorded is not None and run.store.is_complete(recorded["model"]):
        return run.store.url(recorded["model"])
    raise RunRefError(f"{label}: run {printable(run.run_id, 140)!r} has no checkpoint at iteration 0 (no warm-start "
                      f"checkpoint and no recorded copy of its initial model)")


def resolve_checkpoint(store, ref: str, *, label: str = "checkpoint") -> str:
    """The URI of the sealed checkpoint run reference ``ref`` names in ``store`` (a :class:`rlcr.storage.Store`),
    through the run's manifests; :class:`RunRefError` (one line, prefixed with ``label``) when the run, the
    iteration or its checkpoint is not there, naming the iterations that have one."""
    parsed = parse_ref(ref)
    if parsed is None:
        raise RunRefError(f"{label}: {printable(ref, 160)!r} is not a run reference (RUN@ITERATION or RUN@latest)")
    run_id, k = parsed
    run = _open(store, run_id, label)
    if k == 0:
        return _starting_point(run, label)
    done = run.committed()
    held = _held(run, done)
    have = f"iterations with a checkpoint: {', '.join(map(str, held[-20:]))}" if held else "no checkpoint is held"
    name = f"run {printable(run_id, 140)!r}"
    if k is None:
        if not held:
            raise RunRefError(f"{label}: {name} has no committed checkpoint yet ({len(done)} committed iterations)")
        k = held[-1]
    if k > len(done):
        raise RunRefError(f"{label}: {name} has no committed iteration {k} ({len(done)} committed; {have})")
    if k not in held:
        why = ("its checkpoint was pruned (orchestration.keep_checkpoints)" if done[k - 1].get("checkpoint_uri") else
               "no checkpoint was saved after it (orchestration.save_every)")
        raise RunRefError(f"{label}: {name}, iteration {k}: {why}; {have}")
    return done[k - 1]["checkpoint_uri"]


# ------------------------------------------------------------------------------------------------ listing
def _config(run) -> dict[str, Any]:
    """The run's recorded config (sections), or {} where none is recorded."""
    from rlcr.config import nested_from_flat

    doc = run._read_doc(run.config_rel)
    if doc is None:
        return {}
    saved = field(doc, "config", dict, run.store.url(run.config_rel))
    return nested_from_flat(saved) if "run" not in saved else saved


def _leaf(cfg: dict[str, Any], section: str, name: str) -> Any:
    value = cfg.get(section)
    return value.get(name) if isinstance(value, dict) else None


def _lease_state(run, now: float) -> str | None:
    """``running`` (a fresh lease), ``crashed`` (a lease its writer left: stale, dead or unreadable) or None."""
    from rlcr.runs.lease import LEASE_MAX_BYTES, LEASE_TIMEOUT_S, machine_id, parse_lease
    from rlcr.storage import pid_alive

    try:
        raw = run.store.read_bytes(run.lease_rel, max_bytes=LEASE_MAX_BYTES)
    except FileNotFoundError:
        return None
    except InvalidInput:  # refused unread (a FIFO, a device, too large): an unreadable lease
        return "crashed"
    holder = parse_lease(raw, run.store.url(run.lease_rel))
    if not holder.get("readable"):
        return "crashed"
    dead_here = holder["machine"] == machine_id() and not pid_alive(holder["pid"])
    return "running" if abs(now - holder["heartbeat_at"]) <= LEASE_TIMEOUT_S and not dead_here else "crashed"


def run_summary(store, run_id: str, *, now: float | None = None) -> dict[str, Any]:
    """One row of ``rlcr runs``: ``id``, ``task``, ``method`` (``sft``: a warm-start run of ``rlcr sft``),
    ``committed`` (count), ``iterations`` (what the latest attempt was asked for: ``status.json``'s target, else the
    config's), ``checkpoints`` (iterations holding one), ``accuracy`` / ``ece`` (the last held-out evaluation),
    ``state`` (:data:`STATES`), ``reason`` (why a run stopped or crashed, where known) and ``problem`` (why
    ``invalid``)."""
    from rlcr.runs.store import RunStore

    row: dict[str, Any] = {"id": run_id, "task": None, "method": None, "committed": 0, "iterations": None,
                           "checkpoints": [], "accuracy": None, "ece": None, "state": "invalid", "problem": None,
                           "reason": None}
    try:
        run = RunStore(store, run_id)
        cfg = _config(run)
        if not cfg and store.exists(run.standalone_checkpoint_rel(run_id, 0)):  # `rlcr sft`'s warm-start run
            sealed = store.is_complete(run.standalone_checkpoint_rel(run_id, 0))
            row.update(method="sft", checkpoints=[0] if sealed else [], state="finished" if sealed else "stopped",
                       reason=None if sealed else "its checkpoint is not sealed (the warm-start did not finish)")
            return row
        status = run.status()
        row.update(task=_leaf(cfg, "tasks", "name"), method=_leaf(cfg, "method", "name"),
                   iterations=_leaf(cfg, "run", "iterations"))
        done = run.committed()
        if status is not None:  # the iterations the latest attempt was asked for (a resume may extend the run)
            row["iterations"] = status["target"]
        elif isinstance(row["iterations"], int) and len(done) > row["iterations"]:  # extended before status.json
            row["iterations"] = len(done)
        row.update(committed=len(done), checkpoints=_held(run, done))
        ev = (run.metrics(len(done)) if done else (run.baseline() or {})) or {}
        ev = ev.get("eval") if isinstance(ev.get("eval"), dict) else {}
        row.update(accuracy=ev.get("accuracy"), ece=ev.get("ece"))
        lease = _lease_state(run, time.time() if now is None else now)
        finished = isinstance(row["iterations"], int) and len(done) >= row["iterations"]
        row["state"] = lease if lease == "running" else "finished" if finished else lease or "stopped"
        if row["state"] == "crashed":
            row["reason"] = "its writer ended without releasing the run"
        elif row["state"] == "stopped" and status is not None:
            row["reason"] = (status["reason"] if status["state"] == "stopped"
                             else "ended without saying why (killed?)")
    except (InvalidInput, ValueError, StorageError, OSError) as e:  # this run's files: its row, not the listing
        row["problem"] = printable(e, 200)
    return row


def store_summaries(store, *, limit: int = MAX_LISTED_RUNS) -> tuple[list[dict[str, Any]], int]:
    """``rlcr runs``: the rows of at most ``limit`` runs of ``store`` (by run id, newest names last) and how
    many runs the store holds.

    Reads only what it shows: one listing of ``runs/`` gives the candidate folders; the newest names are checked
    to hold a run (:func:`rlcr.runs.store.is_run`) until ``limit`` are found, and only those are read. On S3 the
    checks and the rows are read :data:`READ_THREADS` at a time. The count is of the folders named like runs,
    less those found holding none (older folders are not opened to count them)."""
    from rlcr.runs.store import is_run, run_folders

    names = run_folders(store)
    workers = 1 if store.is_local else READ_THREADS
    chosen: list[str] = []
    empty = 0
    end = len(names)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while end > 0 and len(chosen) < limit:
            batch = names[max(0, end - (limit - len(chosen))):end][::-1]  # newest first
            end -= len(batch)
            for name, ok in zip(batch, pool.map(lambda n: _holds_run(is_run, store, n), batch)):
                if ok:
                    chosen.append(name)
                else:
                    empty += 1
        rows = list(pool.map(lambda r: run_summary(store, r), sorted(chosen)))
    return rows, len(names) - empty


def _holds_run(is_run, store, name: str) -> bool:
    """Whether folder ``name`` holds a run; a folder that cannot be checked is listed (its row says why)."""
    try:
        return is_run(store, name)
    except (StorageError, OSError):
        return True


def iteration_rows(store, run_id: str) -> list[dict[str, Any]]:
    """``rlcr runs show RUN``: one row per committed iteration (0: the baseline evaluation) with its held-out
    figures, whether its checkpoint is held, and its ``RUN@K`` reference."""
    run = _open(store, run_id, "RUN")
    done = run.committed()
    held = set(_held(run, done))
    base = (run.baseline() or {}).get("eval")
    rows = [{"iteration": 0, "accuracy": base.get("accuracy"), "ece": base.get("ece"), "checkpoint": None,
             "committed_at": None}] if isinstance(base, dict) else []
    for m in done:
        k = m["iteration"]
        met = run.metrics(k) or {}
        ev = met.get("eval") if isinstance(met.get("eval"), dict) else {}
        rows.append({"iteration": k, "accuracy": ev.get("accuracy"), "ece": ev.get("ece"),
                     "checkpoint": f"{run_id}@{k}" if k in held else None, "committed_at": m.get("committed_at")})
    return rows


# ----------------------------------------------------------------------------- a run's task

class TaskMismatch(ValueError):
    """A run is named with a task (or task options) other than the one it was trained on."""


def task_fields(cfg: Any) -> dict[str, Any]:
    """What names the task an evaluation or probe ran on, for its records and reports: ``task`` (``tasks.name``)
    and ``task_options`` (``tasks.options``, every option, defaults included)."""
    return {"task": cfg.tasks.name, "task_options": dict(cfg.tasks.options)}


_TASK_IDENTITY = ("name", "options", "module")
"""``tasks`` fields a run reference brings (the other ``tasks`` fields choose problems of that task)."""


def with_run_task(cfg: Any, stored: dict[str, Any] | None, run_id: str,
                  command_line: Any = ()) -> tuple[Any, str | None]:
    """``cfg`` with the task of run ``run_id`` (``stored``: the config record the run started with,
    :meth:`~rlcr.runs.layout.RunLayout.stored_config`), for evaluating or probing one of its checkpoints: a
    policy trained on one task is measured on that task, not on the config's.

    The run's ``tasks`` section is taken, with the fields ``cfg`` sets explicitly (its file or the command line:
    how many held-out tasks, which file) on top when ``cfg`` names the same task; ``tasks.module`` is ``cfg``'s
    where it sets one (where the code is found here), else the run's. ``command_line``: the dotted fields the
    command line set; a ``tasks.name`` or ``tasks.options`` there that is not the run's is refused
    (:class:`TaskMismatch`, one line naming both). Returns (the config, a line saying the config's task was
    replaced, or None). A run that recorded no config keeps ``cfg``'s task, with a line saying so."""
    from rlcr.config import RLCRConfig, nested_from_flat

    keys = set(command_line)
    if stored is None:
        return cfg, (f"run {printable(repr(run_id), 140)} recorded no config: evaluating on the config's task "
                     f"{cfg.tasks.name!r}")
    saved = nested_from_flat(stored)
    run_tasks = saved.get("tasks") if isinstance(saved.get("tasks"), dict) else {}
    run_name = run_tasks.get("name", LEGACY_TASK)  # a config stored before runs named their task: Countdown's
    shown_run = printable(repr(run_id), 140)
    if cfg.tasks.name != run_name and keys & {"tasks", "tasks.name"}:
        raise TaskMismatch(f"tasks.name {cfg.tasks.name!r} (command line), but run {shown_run} was trained on task "
                           f"{printable(repr(run_name), 60)}: a run is evaluated on its own task (drop tasks.name, "
                           "or name a run of that task)")
    same = cfg.tasks.name == run_name
    explicit = {k.split(".")[1] for k in keys if k.startswith("tasks.")} | (set(cfg.tasks.model_fields_set)
                                                                            if same else set())
    merged = {k: v for k, v in run_tasks.items() if k in cfg.tasks.model_fields}
    merged.update({k: getattr(cfg.tasks, k) for k in explicit - set(_TASK_IDENTITY) if k in cfg.tasks.model_fields})
    merged["name"] = run_name
    if cfg.tasks.module is not None:
        merged["module"] = cfg.tasks.module
    try:
        out = RLCRConfig.from_dict({**cfg.model_dump(mode="json"), "tasks": merged},
                                   source=f"run {printable(run_id, 140)}'s tasks")
    except ValueError as e:
        raise TaskMismatch(f"the task of run {shown_run} cannot be set up here: {printable(e, 400)}") from None
    if same and cfg.tasks.options != out.tasks.options:
        differ = sorted(k for k in {*cfg.tasks.options, *out.tasks.options}
                        if cfg.tasks.options.get(k) != out.tasks.options.get(k))
        shown = ", ".join(f"{k}: {printable(repr(out.tasks.options.get(k)), 40)} → "
                          f"{printable(repr(cfg.tasks.options.get(k)), 40)}" for k in differ)
        if any(k == "tasks" or k.startswith("tasks.options") for k in keys):
            raise TaskMismatch(f"tasks.options differ from those run {shown_run} was trained with ({shown}; "
                               "command line): a run is evaluated on its own task options (drop them, or name a "
                               "run trained with them)")
        return out, f"the task options run {shown_run} was trained with are used, not the config's ({shown})"
    if not same:
        return out, (f"the task run {shown_run} was trained on, {printable(repr(run_name), 60)}, is used, not "
                     f"the config's {cfg.tasks.name!r}")
    return out, None


# ----------------------------------------------------------------------------- the newest checkpoint of a run


def newest_run(store) -> str | None:
    """The run under ``store`` whose newest committed iteration was committed last (None if none). Entries
    under ``runs/`` that are not runs (``.DS_Store``, a README, an invalid name) are skipped, and so, with a
    warning, are runs whose manifests cannot be read."""
    import logging
    import math

    from rlcr.runs.store import RunStore, list_runs

    best, best_t = None, -math.inf
    for run_id in list_runs(store):
        try:
            last = RunStore(store, run_id).last_committed()
        except (InvalidInput, StorageError) as e:
            logging.getLogger(__name__).warning("skipping run %s: %s", printable(run_id), printable(e, 300))
            continue
        if last is not None and last.get("committed_at", 0.0) > best_t:
            best, best_t = run_id, last.get("committed_at", 0.0)
    return best


def newest_checkpoint(cfg, run_id: str, iteration: int | None = None) -> tuple[int, str]:
    """(iteration, checkpoint URI) of the run's newest committed iteration (or of ``iteration``: a one-line
    :class:`RunRefError` naming the iterations with a checkpoint where it has none), its seal checked against the
    manifest; :class:`NoCommittedIteration` if there is none."""
    from rlcr.runs.store import RunStore

    run = RunStore.open(cfg, run_id)
    if iteration is not None:
        uri = resolve_checkpoint(run.store, f"{run_id}@{iteration}", label="probe")
        return iteration, (run.verified_state(run.manifest(iteration)) if iteration else uri)
    last = run.last_committed()
    if last is None or not last.get("checkpoint_uri"):
        raise NoCommittedIteration(
            f"run {run_id!r} has no committed iteration under {run.store.url(run.prefix)}: nothing to probe "
            "(train it first, or pass another run_id)")
    return int(last["iteration"]), run.verified_state(last)
