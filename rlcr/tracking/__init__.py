"""Experiment tracking: one MLflow run per rlcr run, fed from each committed iteration's ``metrics.json``.

    tracker = open_tracker("mlflow", None, cfg.storage.uri, run_id, cfg.model_dump(mode="json"))
    tracker.log_iteration(k, metrics)          # after iteration k is committed; idempotent
    tracker.log_artifact("probe/report.html")  # reports, plots
    tracker.close()                            # or: with open_tracker(...) as tracker: ...

Where the run goes (:func:`resolve_backend`):

* ``tracking.uri`` given (``http://mlflow.cluster:5000``, ``sqlite:///…``, ``databricks``…): there.
* else ``$MLFLOW_TRACKING_URI`` if set.
* else, local storage: ``sqlite:///<storage>/mlflow.db`` with artifacts under ``<storage>/mlflow-artifacts``
  (MLflow 3 defaults to a SQLite store; its ``./mlruns`` file store is deprecated). View it with
  ``mlflow ui --backend-store-uri sqlite:///<storage>/mlflow.db`` (:attr:`Tracker.ui_hint`).
* else (S3 or other remote storage, no tracking URI): tracking is off for the run, with one warning — a
  SQLite file in the driver's working directory would be lost with the driver on a cluster, so a server
  must be named instead.

One MLflow run per rlcr run id: experiment ``rlcr``, the run tagged ``rlcr.run_id`` = the run id (and named so). A
resumed run finds and continues it (status back to RUNNING). Params are the flattened config, logged once:
on resume only new keys are logged; a key whose value changed keeps its first value (MLflow refuses to change
a param) and is listed in the tag ``rlcr.params_changed``.

Metrics: :func:`flatten_metrics` (:mod:`rlcr.tracking.flatten`; ``eval/ece``, ``eval/ece_ci_low``,
``rollout/answer/reward_mean``, ``timings/update_s``…) and the headline figures again under ``Summary/``
(:data:`HEADLINE`), step = iteration (0: the baseline evaluation), non-finite values skipped. An
iteration goes out as the marker :data:`STARTED` alone, then its metrics in ``log_batch`` calls of at most
1000, then the sentinel :data:`SENTINEL` alone: a step the sentinel holds is logged completely and never sent
again; a step only the start marker holds was cut off mid-log (a SIGKILL or a failure between two calls),
and is completed key by key: each key's history is read (one call per key, only for such a step) and only
the keys without that step are sent. So after a kill and a resume every metric holds exactly one value per
step. :func:`sync_run` sends what a run holds (step 0 from ``baseline.json``, k from iteration k's
``metrics.json``); with no steps named it back-fills all of them.

Never fails or stalls training: every call runs in a daemon thread joined with a deadline (``timeout_s``);
MLflow's HTTP client gets a short timeout and few retries (``MLFLOW_HTTP_REQUEST_TIMEOUT`` /
``_MAX_RETRIES`` / ``_BACKOFF_FACTOR``, unless already set in the environment). The first failure or
timeout logs one warning and turns the tracker off for the rest of the process; a later resume opens a new
tracker and can back-fill the missed iterations (:meth:`Tracker.log_iteration` is idempotent). A call past its
deadline is stopped, not left running: :class:`CallAbandoned` is raised in its thread, which unwinds and closes
its connection (a server streaming an endless body is not downloaded after tracking is off).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from rlcr.tracking.flatten import (
    HEADLINE,
    MAX_TAG_VALUE,
    METRICS_PER_BATCH,
    PARAMS_PER_BATCH,
    SENTINEL,
    STARTED,
    flatten_metrics,
    flatten_params,
    metric_key,
    tracked_metrics,
)

__all__ = ["Tracker", "BoundedTracker", "MlflowTracker", "Trackers", "open_tracker", "tracker_from_config",
           "flatten_params", "flatten_metrics", "tracked_metrics", "HEADLINE", "metric_key", "resolve_backend",
           "log_iterations", "sync_run", "step_metrics", "TRACKING_KINDS", "EXPERIMENT", "RUN_ID_TAG", "SENTINEL",
           "STARTED", "CallAbandoned", "MLFLOW_UI_URL"]

MLFLOW_UI_URL = "http://127.0.0.1:5000"
"""Where ``mlflow ui`` serves by default."""

TRACKING_KINDS = ("mlflow", "wandb", "none")
EXPERIMENT = "rlcr"
"""The MLflow experiment every rlcr run goes to."""
RUN_ID_TAG = "rlcr.run_id"
PARENT_TAG = "mlflow.parentRunId"
CHANGED_TAG = "rlcr.params_changed"
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
"""The experiment's kind for MLflow's UI (3.x): training runs, so it opens on its runs and their charts (unset,
MLflow 3 infers a GenAI experiment and opens on an empty GenAI overview)."""
LOCAL_DB = "mlflow.db"
LOCAL_ARTIFACTS = "mlflow-artifacts"
DEFAULT_TIMEOUT_S = 60.0
"""Longest one tracker call may take (opening included) before the tracker turns itself off."""
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
"""MLflow's HTTP client settings (environment; values already set are kept): ~10 s per request, 2 retries."""

_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- where the run goes


def _is_local(storage_uri: str) -> bool:
    return "://" not in storage_uri or storage_uri.startswith("file://")


def resolve_backend(tracking_uri: str | None, storage_uri: str) -> tuple[str, str | None] | None:
    """``(tracking URI, artifact location for a new experiment or None for the server's default)``, or None
    when there is nowhere to track to (remote storage and no tracking URI; see the module doc)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    if uri:
        return uri, None
    if not _is_local(storage_uri):
        return None
    root = Path(storage_uri.removeprefix("file://")).expanduser().resolve()
    return f"sqlite:///{root / LOCAL_DB}", (root / LOCAL_ARTIFACTS).as_uri()


# ----------------------------------------------------------------------------- trackers


class Tracker:
    """The no-op tracker (``kind="none"``, or tracking off): every method does nothing and returns at once."""

    enabled = False
    tracking_uri: str | None = None
    mlflow_run_id: str | None = None
    experiment_id: str | None = None
    run_url: str | None = None
    """The run's page in the MLflow UI (for a Prefect link artifact); None when no UI address is known."""
    experiment_url: str | None = None
    """The experiment's page on its training runs (MLflow's UI, where the tracking URI is a server)."""
    ui_hint: str | None = None
    """How to view the runs (``mlflow ui --backend-store-uri … --workers 1`` for a local store: one worker, which a
    loaded 2-core machine keeps answering)."""

    def where(self) -> str | None:
        """Where a person looks at the runs: the experiment's page on its training runs, or, for a local store,
        how to serve it and the page to open (MLflow opens a bare experiment link on its GenAI overview)."""
        if self.experiment_url:
            return self.experiment_url
        if self.ui_hint and self.experiment_id is not None:
            return (f"{self.ui_hint}, then open {MLFLOW_UI_URL}/#/experiments/{self.experiment_id}"
                    "?workflowType=machine_learning")
        return None

    def log_iteration(self, iteration: int, metrics: Mapping[str, Any]) -> bool:
        """Log iteration ``iteration``'s ``metrics.json`` dict (step = iteration); True if it is logged now or
        was already. Idempotent."""
        return False

    def logged_iterations(self) -> set[int]:
        """The iterations logged completely (the steps of :data:`SENTINEL`): what a resumed flow need not read
        again to back-fill (one cut off mid-log is not among them). Empty when off."""
        return set()

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> bool:
        """Log a (nested) dict of numbers once at ``step`` (not deduplicated: for one-off summaries)."""
        return False

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> bool:
        """Upload a file or directory under the run's artifacts (``artifact_path``: a sub-folder)."""
        return False

    def set_tags(self, tags: Mapping[str, Any]) -> bool:
        return False

    def close(self, status: str = "FINISHED") -> None:
        """End the run (``FINISHED``, ``FAILED`` or ``KILLED``); the tracker is off afterwards."""

    def __enter__(self) -> "Tracker":
        return self

    finished: Optional[Callable[[], bool]] = None
    """Set by the training flow: whether the rlcr run has all its iterations committed, so that the MLflow run
    ends ``FINISHED`` as rlcr says it is, even when the attempt ended by an interrupt or error after its last
    commit."""

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.finished is not None:
            try:
                if self.finished():
                    exc_type = None
            except Exception:  # noqa: BLE001 — the status as the exception says, then
                pass
        self.close("FINISHED" if exc_type is None else ("KILLED" if issubclass(exc_type, KeyboardInterrupt)
                                                         else "FAILED"))


class BoundedTracker(Tracker):
    """A tracker whose every call to its service is bounded (:meth:`_call`): one that fails or takes longer than
    ``_timeout_s`` warns once (naming :attr:`label`) and turns the tracker off for the rest of the process."""

    label = "tracking"
    _timeout_s = DEFAULT_TIMEOUT_S
    _logger: Any = None

    # -- the guard: bounded time, one warning, then off

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        if not self.enabled:
            return None
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn(*args)
            except CallAbandoned:  # past its deadline: nothing kept (its traceback would hold the connection)
                pass
            except BaseException as e:  # noqa: BLE001 - reported below, never raised into training
                box["error"] = e

        t = threading.Thread(target=target, name=f"rlcr-tracking-{what}", daemon=True)
        t.start()
        t.join(self._timeout_s)
        if t.is_alive():
            _abandon(t)
            self._disable(f"{what} did not finish within {self._timeout_s:g} s")
            return None
        if "error" in box:
            e = box["error"]
            self._disable(f"{what} failed: {type(e).__name__}: {_short(e)}")
            return None
        return box.get("value")

    def _disable(self, reason: str) -> None:
        if self.enabled:
            self.enabled = False
            (self._logger or _log).warning("%s is off for the rest of this run: %s. Training goes on; a resumed run "
                                           "logs the missed iterations.", self.label, reason)


class MlflowTracker(BoundedTracker):
    """A run in an MLflow tracking store; built by :func:`open_tracker`."""

    def __init__(self, tracking_uri: str, *, timeout_s: float, logger: Any, ui_url: str | None = None,
                 resume: bool = True):
        self.tracking_uri = tracking_uri
        self._resume = resume  # False: attach to a run without reopening it (its status and end time stay)
        self.enabled = True
        self._timeout_s = timeout_s
        self._logger = logger or _log
        self._ui_url = ui_url
        self._client = None
        self._steps: dict[str, set[int]] = {}  # marker metric → steps it holds (read once, then kept)
        self._note, self._noted_step = "", -1  # the calibration note set last, and the step it was set for
        self.label = f"MLflow tracking ({tracking_uri})"
        if tracking_uri.startswith("sqlite:"):
            self.ui_hint = f"mlflow ui --backend-store-uri {tracking_uri} --workers 1"

    # -- opening

    def _open(self, experiment: str, artifact_location: str | None, run_id: str, params: Mapping[str, str],
              parent_run_id: str | None) -> bool:
        from mlflow.tracking import MlflowClient

        self._client = client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment_id = _experiment(client, experiment, artifact_location)
        run = _find_run(client, self.experiment_id, run_id)
        if run is None:
            tags = {RUN_ID_TAG: run_id, **({PARENT_TAG: parent_run_id} if parent_run_id else {})}
            run = client.create_run(self.experiment_id, tags=tags, run_name=run_id)
        else:
            if parent_run_id and run.data.tags.get(PARENT_TAG) != parent_run_id:
                client.set_tag(run.info.run_id, PARENT_TAG, parent_run_id)
            if self._resume and run.info.status != "RUNNING":
                client.update_run(run.info.run_id, status="RUNNING")
        self.mlflow_run_id = run.info.run_id
        self._log_params(run.data.params, params)
        base = self.tracking_uri if self.tracking_uri.startswith(("http://", "https://")) else self._ui_url
        if base:
            self.run_url = f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.mlflow_run_id}"
            # a bare experiment link opens on the GenAI overview where the browser has not chosen "Model training"
            self.experiment_url = f"{base.rstrip('/')}/#/experiments/{self.experiment_id}?workflowType=machine_learning"
        return True

    def _log_params(self, existing: Mapping[str, str], params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        new = [Param(k, v) for k, v in params.items() if k not in existing]
        for i in range(0, len(new), PARAMS_PER_BATCH):
            self._client.log_batch(self.mlflow_run_id, params=new[i:i + PARAMS_PER_BATCH], synchronous=True)
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:
            self._logger.info("MLflow run %s keeps the first value of params changed since: %s",
                              self.mlflow_run_id, ", ".join(changed))
            self._client.set_tag(self.mlflow_run_id, CHANGED_TAG, ", ".join(changed)[:MAX_TAG_VALUE])

    # -- logging

    def _logged_steps(self, key: str) -> set[int]:
        if key not in self._steps:
            self._steps[key] = {m.step for m in self._client.get_metric_history(self.mlflow_run_id, key)}
        return self._steps[key]

    def _send(self, metrics: list) -> None:
        for i in range(0, len(metrics), METRICS_PER_BATCH):
            self._client.log_batch(self.mlflow_run_id, metrics=metrics[i:i + METRICS_PER_BATCH], synchronous=True)

    def _log_iteration(self, iteration: int, flat: dict[str, float]) -> bool:
        from mlflow.entities import Metric

        if iteration in self._logged_steps(SENTINEL):
            return True
        ts = int(time.time() * 1000)
        if iteration in self._logged_steps(STARTED):  # cut off mid-log before: send only the keys it lacks
            keys = [k for k in sorted(flat) if iteration not in self._logged_steps(k)]
        else:
            self._send([Metric(STARTED, float(iteration), ts, iteration)])
            self._logged_steps(STARTED).add(iteration)
            keys = sorted(flat)
        self._send([Metric(k, flat[k], ts, iteration) for k in keys])
        for k in keys:
            if k in self._steps:
                self._steps[k].add(iteration)
        self._send([Metric(SENTINEL, float(iteration), ts, iteration)])
        self._logged_steps(SENTINEL).add(iteration)
        return True

    def log_iteration(self, iteration: int, metrics: Mapping[str, Any]) -> bool:
        flat = tracked_metrics(metrics)
        done = bool(self._call(f"logging iteration {iteration}", self._log_iteration, int(iteration), flat))
        if done and int(iteration) >= self._noted_step:
            note = calibration_note(int(iteration), metrics)
            if note != self._note:  # the run's description (MLflow's note) says why the calibration charts are empty
                self._call("setting the run's note", self._client.set_tag, self.mlflow_run_id, NOTE_TAG, note)
                self._note = note
            self._noted_step = int(iteration)
        return done

    def logged_iterations(self) -> set[int]:
        return set(self._call("reading the logged iterations", self._logged_steps, SENTINEL) or ())

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> bool:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        batch = [Metric(k, v, ts, int(step)) for k, v in flatten_metrics(metrics).items()]
        return bool(self._call("logging metrics", lambda: self._send(batch) or True))

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> bool:
        path = Path(local_path)

        def upload() -> bool:
            if path.is_dir():
                self._client.log_artifacts(self.mlflow_run_id, str(path), artifact_path)
            else:
                self._client.log_artifact(self.mlflow_run_id, str(path), artifact_path)
            return True

        return bool(self._call(f"uploading {path.name}", upload))

    def set_tags(self, tags: Mapping[str, Any]) -> bool:
        from mlflow.entities import RunTag

        batch = [RunTag(metric_key(k), str(v)[:MAX_TAG_VALUE]) for k, v in tags.items()]
        return bool(self._call("setting tags", lambda: self._client.log_batch(
            self.mlflow_run_id, tags=batch, synchronous=True) or True))

    def close(self, status: str = "FINISHED") -> None:
        if self.enabled and self.mlflow_run_id and self._resume:
            self._call("ending the run", self._client.set_terminated, self.mlflow_run_id, status)
        self.enabled = False


NOTE_TAG = "mlflow.note.content"
"""The tag MLflow's UI shows as a run's description."""


def calibration_note(iteration: int, metrics: Mapping[str, Any]) -> str:
    """The run's note for its latest logged step: why its calibration metrics are missing there, or "" when they
    are defined. Undefined ECE, Brier and AUROC are not logged (MLflow takes numbers only), so their charts are
    empty or stop; the note says why."""
    ev = metrics.get("eval") if isinstance(metrics.get("eval"), Mapping) else None
    if ev is None:
        return ""
    ece, parsed = ev.get("ece"), ev.get("confidence_parse_rate")
    if isinstance(ece, (int, float)) and math.isfinite(ece):
        return ""
    step = "the baseline evaluation (step 0)" if iteration == 0 else f"iteration {iteration}"
    if isinstance(parsed, (int, float)) and parsed == 0:
        why = ("no held-out answer stated a confidence that could be parsed (eval/confidence_parse_rate = 0): "
               "calibration needs stated confidences. A format warm-start (`rlcr sft`) teaches the confidence "
               "turn's format")
    else:
        why = "no held-out answer had both a parsed confidence and a verdict to calibrate against"
    return (f"Calibration metrics (eval/ece, eval/brier, eval/auroc) are undefined at {step}, the latest logged: "
            f"{why}. They are logged from the first evaluation where they are defined.")


class CallAbandoned(BaseException):
    """Raised inside a tracker call's thread once its deadline has passed, so that the call stops (a server that
    answers with an endless body would otherwise be downloaded into memory for as long as the process lives).
    A BaseException: the HTTP client's retry loops, which catch ``Exception``, let it through."""


def _abandon(thread: threading.Thread) -> None:
    """Stop an abandoned tracker call: :class:`CallAbandoned` is raised in ``thread`` at its next Python
    instruction (the HTTP client reads a body in chunks and returns to Python after each, or after its read
    timeout), its frames unwind and the connection is closed."""
    import ctypes

    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(CallAbandoned))


def _short(e: BaseException, limit: int = 300) -> str:
    from rlcr.untrusted import printable

    return printable(str(e), limit)


def _experiment(client: Any, name: str, artifact_location: str | None) -> str:
    """The id of experiment ``name``, created (or restored from deleted) if need be."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location, tags=EXPERIMENT_TAGS)
        except MlflowException:  # created meanwhile by another process
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    for key, value in EXPERIMENT_TAGS.items():  # an experiment made by an older rlcr (or by hand)
        if exp.tags.get(key) != value:
            client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def _find_run(client: Any, experiment_id: str, run_id: str) -> Any:
    """The oldest active MLflow run tagged ``rlcr.run_id = run_id``, or None."""
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'",
                               max_results=1, order_by=["attributes.start_time ASC"])
    return found[0] if found else None


def _set_http_env() -> None:
    for k, v in HTTP_ENV.items():
        os.environ.setdefault(k, v)


def open_tracker(kind: str | list[str], tracking_uri: str | None, storage_uri: str, run_id: str,
                 params: Mapping[str, Any], *, parent: Tracker | str | None = None, experiment: str = EXPERIMENT,
                 ui_url: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, logger: Any = None,
                 resume: bool = True, wandb: Mapping[str, Any] | None = None) -> Tracker:
    """The tracker of rlcr run ``run_id``: ``kind="none"`` → the no-op :class:`Tracker`; ``"mlflow"`` → the
    MLflow run tagged with ``run_id`` in ``experiment`` (created, or found and continued), its params the
    flattened ``params`` (:func:`flatten_params`). ``parent``: a tracker or MLflow run id whose child this run
    is (tag ``mlflow.parentRunId``). ``ui_url``: the MLflow UI serving a non-HTTP store (for
    :attr:`Tracker.run_url`). ``logger``: where the one warning goes (e.g. Prefect's run logger). ``resume``
    False: add to the run (artifacts, tags) without reopening it: its status and end time, so its duration, stay
    the training's (the probe's report).

    Never raises for an unreachable, slow or failing store: after ``timeout_s`` or an error it warns once and
    returns a disabled tracker (``enabled`` False, every call a no-op). Raises ValueError for an unknown kind.

    ``kind`` ``"wandb"`` (``wandb``: a dict of :class:`~rlcr.tracking.wandb_tracker.WandbTracker`'s project,
    entity, mode and directory) is the W&B run of ``run_id``; a list of kinds is every one of them
    (:class:`Trackers`). W&B has no way to add to a run without reopening it: with ``resume`` False it is left
    out."""
    if not isinstance(kind, str):
        kinds = [k for k in dict.fromkeys(kind) if k != "none"]
        return Trackers([open_tracker(k, tracking_uri, storage_uri, run_id, params, parent=parent,
                                      experiment=experiment, ui_url=ui_url, timeout_s=timeout_s, logger=logger,
                                      resume=resume, wandb=wandb) for k in kinds])
    if kind not in TRACKING_KINDS:
        raise ValueError(f"tracking kind {kind!r}: expected one of {', '.join(TRACKING_KINDS)}")
    if kind == "none" or (kind == "wandb" and not resume):
        return Tracker()
    log = logger or _log
    if kind == "wandb":
        return _open_wandb(run_id, params, storage_uri, timeout_s, log, **(wandb or {}))
    backend = resolve_backend(tracking_uri, storage_uri)
    if backend is None:
        log.warning("MLflow tracking is off for run %s: storage %s is not local and no tracking.uri (or "
                    "MLFLOW_TRACKING_URI) names a tracking server", run_id, storage_uri)
        return Tracker()
    if "'" in run_id or "\\" in run_id:
        log.warning("MLflow tracking is off: run id %r cannot be searched for", run_id)
        return Tracker()
    _set_http_env()
    uri, artifact_location = backend
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    tracker = MlflowTracker(uri, timeout_s=timeout_s, logger=log, ui_url=ui_url, resume=resume)
    parent_id = parent.mlflow_run_id if isinstance(parent, Tracker) else parent
    tracker._call(f"opening run {run_id}", tracker._open, experiment, artifact_location, run_id,
                  flatten_params(params), parent_id)
    if tracker.enabled and tracker.mlflow_run_id is None:  # pragma: no cover - _open either sets it or raises
        tracker.enabled = False
    return tracker


def tracker_from_config(cfg: Any, run_id: str, *, parent: Tracker | str | None = None,
                        params: Mapping[str, Any] | None = None, logger: Any = None, resume: bool = True) -> Tracker:
    """:func:`open_tracker` with the config's ``tracking`` (default ``"mlflow"``), ``tracking.uri``,
    ``tracking.ui_url``, the ``tracking.wandb_*`` fields and ``storage.uri``; params: ``params`` or the whole config
    (``model_dump``)."""
    if params is None:
        params = cfg.model_dump(mode="json")
    t = cfg.tracking
    return open_tracker(getattr(t, "backend", "mlflow"), getattr(t, "uri", None), cfg.storage.uri,
                        run_id, params, parent=parent, ui_url=getattr(t, "ui_url", None),
                        timeout_s=getattr(t, "timeout_s", DEFAULT_TIMEOUT_S), logger=logger, resume=resume,
                        wandb={"project": getattr(t, "wandb_project", EXPERIMENT),
                               "entity": getattr(t, "wandb_entity", None), "mode": getattr(t, "wandb_mode", None),
                               "directory": getattr(t, "wandb_dir", None)})


def _open_wandb(run_id: str, params: Mapping[str, Any], storage_uri: str, timeout_s: float, log: Any, *,
                project: str = EXPERIMENT, entity: str | None = None, mode: str | None = None,
                directory: str | None = None) -> Tracker:
    """The W&B tracker of ``run_id`` (:mod:`rlcr.tracking.wandb_tracker`), its files in ``directory``, else beside
    a local store, else ``$WANDB_DIR`` or the working directory; a disabled tracker (one warning) where the
    ``wandb`` package is missing or the run cannot be opened in ``timeout_s``."""
    from rlcr.tracking.wandb_tracker import WandbTracker

    if directory is None:
        directory = (str(Path(storage_uri.removeprefix("file://")).expanduser().resolve()) if _is_local(storage_uri)
                     else os.environ.get("WANDB_DIR") or os.getcwd())
    tracker = WandbTracker(run_id, project=project, entity=entity, mode=mode, directory=directory,
                           timeout_s=timeout_s, logger=log)
    tracker._call(f"opening run {run_id}", tracker._open, params)
    return tracker


class Trackers(Tracker):
    """Several trackers as one (``tracking.backend: [mlflow, wandb]``): each call goes to every tracker still on;
    one that turns off leaves the others going. The MLflow one (if any) answers for the MLflow attributes."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = [t for t in trackers if t.enabled] or [Tracker()]
        first = next((t for t in self.trackers if isinstance(t, MlflowTracker)), self.trackers[0])
        for name in ("tracking_uri", "mlflow_run_id", "experiment_id", "run_url", "experiment_url", "ui_hint"):
            setattr(self, name, getattr(first, name, None))

    @property
    def enabled(self) -> bool:  # type: ignore[override]
        return any(t.enabled for t in self.trackers)

    def where(self) -> str | None:
        places = [w for w in (t.where() for t in self.trackers) if w]
        return "; ".join(places) or None

    def log_iteration(self, iteration: int, metrics: Mapping[str, Any]) -> bool:
        return all([t.log_iteration(iteration, metrics) for t in self.trackers if t.enabled])

    def logged_iterations(self) -> set[int]:
        sets = [t.logged_iterations() for t in self.trackers if t.enabled]
        return set.intersection(*sets) if sets else set()

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> bool:
        return all([t.log_metrics(metrics, step) for t in self.trackers if t.enabled])

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> bool:
        return all([t.log_artifact(local_path, artifact_path) for t in self.trackers if t.enabled])

    def set_tags(self, tags: Mapping[str, Any]) -> bool:
        return all([t.set_tags(tags) for t in self.trackers if t.enabled])

    def close(self, status: str = "FINISHED") -> None:
        for t in self.trackers:
            t.close(status)


def log_iterations(tracker: Tracker, items: Iterable[tuple[int, Mapping[str, Any]]]) -> int:
    """Log several iterations (e.g. every committed one on resume: those already logged are skipped cheaply);
    the number logged or already there. Stops when the tracker turns off."""
    n = 0
    for iteration, metrics in items:
        if not tracker.enabled or not tracker.log_iteration(iteration, metrics):
            break
        n += 1
    return n


def step_metrics(run: Any, step: int) -> Mapping[str, Any] | None:
    """What rlcr run ``run`` (a :class:`~rlcr.runs.store.RunStore`) holds for tracker step ``step``: 0 the baseline
    evaluation (``baseline.json``'s ``eval``), k ≥ 1 iteration k's ``metrics.json``; None where it has none."""
    if step == 0:
        doc = run.baseline()
        return {"eval": doc.get("eval", {})} if doc else None
    return run.metrics(step)


def sync_run(tracker: Tracker, run: Any, steps: Iterable[int] | None = None) -> int:
    """Send the figures rlcr run ``run`` holds at ``steps`` (:func:`step_metrics`) to ``tracker``, those it
    does not hold completely; ``steps`` None: every step the run has, 0 (the baseline, if written) and each
    committed iteration: a resume's back-fill of what a tracker that was down or cut off missed. Returns the
    number of those steps now logged completely; stops when the tracker turns off."""
    if not tracker.enabled:
        return 0
    if steps is None:
        steps = [0, *(m["iteration"] for m in run.committed())]
    have = tracker.logged_iterations()
    n = 0
    for k in steps:
        if k not in have:
            if not tracker.enabled:
                break
            metrics = step_metrics(run, k)
            if metrics is None or not tracker.log_iteration(k, metrics):
                continue
        n += 1
    return n
