"""Weights & Biases as a tracker (``tracking.backend: wandb``, or ``[mlflow, wandb]`` for both): the same contract
as MLflow's (:mod:`rlcr.tracking`).

* **One W&B run per rlcr run**, across attempts: its id is derived from the rlcr run id (:func:`wandb_run_id`)
  and every attempt resumes it (``resume="allow"``); its name is the rlcr run id.
* **The config as parameters**: the whole config, nested, as the run's config (a resume adds what is new).
* **One value per iteration**: each committed iteration is one history row, with ``iteration`` as every chart's
  x-axis (``define_metric("*", step_metric="iteration")``), its metrics flattened as for MLflow and the headline
  figures again under ``Summary/`` (:func:`rlcr.tracking.flatten.tracked_metrics`). The iterations logged are kept
  in the run's summary (``rlcr/iterations_logged``) and in a ledger beside the W&B files
  (``<dir>/rlcr-ledger/<run id>.json``; offline runs cannot read their summary back): a resume skips them and
  back-fills the rest, so an outage or a tracker that was off costs nothing but the wait. W&B's own x-axis
  (``_step``) counts rows in the order they were sent; ``iteration`` is the one to read.
* **Bounded**: every call (``init`` included) runs in a daemon thread joined with ``tracking.timeout_s``; the first
  failure or timeout warns once and turns the tracker off for the rest of the process (training goes on).
* **Quiet**: no console capture, no system metrics, no code or git snapshot; W&B's own lines go to the
  command's log file (:mod:`rlcr.ui.terminal`).

Where: ``tracking.wandb_project`` (and ``wandb_entity``) on the W&B server the environment names (``WANDB_API_KEY``,
``WANDB_BASE_URL``); ``tracking.wandb_mode: offline`` (or ``WANDB_MODE=offline``) writes the runs to local files
only, sent later with ``wandb sync <dir>``. The files go to ``tracking.wandb_dir``, else ``<storage>/`` for local
storage, else ``$WANDB_DIR`` or the working directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from rlcr.tracking import BoundedTracker, calibration_note
from rlcr.tracking.flatten import flatten_metrics, tracked_metrics

__all__ = ["WandbTracker", "wandb_run_id", "LOGGED_KEY", "STEP_KEY", "EXIT_CODES"]

LOGGED_KEY = "rlcr/iterations_logged"
"""The run summary's list of the iterations logged completely."""
STEP_KEY = "iteration"
"""Every chart's x-axis: the rlcr iteration (0: the baseline evaluation)."""
EXIT_CODES = {"FINISHED": 0, "FAILED": 1, "KILLED": 130}
"""The W&B exit code of an rlcr close status (W&B shows a non-zero code as failed)."""
QUIET_SETTINGS = {"console": "off", "silent": True, "x_disable_stats": True, "x_disable_meta": True,
                  "disable_git": True, "save_code": False, "x_save_requirements": False,
                  "x_transaction_log_flush_interval": 1.0}
"""What rlcr turns off in W&B: console capture, system metrics, machine and code snapshots; and the run's file is
flushed every second (W&B's default is 15 s), so an attempt killed hard loses at most a second of rows, which the
next attempt back-fills."""


def wandb_run_id(run_id: str) -> str:
    """A W&B run id for rlcr run ``run_id``, stable across attempts and machines: its letters, digits, ``-`` and
    ``_`` (at most 48) and 8 hex digits of its digest (two run ids that differ only in other characters stay apart)."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", run_id)[:48].strip("-") or "run"
    return f"{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def _wandb_module():
    try:
        import wandb
    except ImportError:  # the optional extra is not installed
        raise ImportError("tracking.backend wandb needs the wandb package: pip install 'rlcr[wandb]' (pinned in "
                          "constraints.txt)") from None
    return wandb


class WandbTracker(BoundedTracker):
    """A run in W&B; built by :func:`rlcr.tracking.open_tracker`."""

    def __init__(self, run_id: str, *, project: str, entity: str | None, mode: str | None, directory: str,
                 timeout_s: float, logger: Any):
        self.label = f"W&B tracking ({project}{', ' + mode if mode else ''})"
        self.rlcr_run_id, self.project, self.entity, self.mode = run_id, project, entity, mode
        self.directory, self._timeout_s, self._logger = directory, timeout_s, logger
        self.enabled = True
        self.wandb_run_id = wandb_run_id(run_id)
        self._run: Any = None
        self._logged: set[int] = set()
        self._note, self._noted_step = "", -1

    # -- opening

    def _open(self, params: Mapping[str, Any]) -> bool:
        wandb = _wandb_module()
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(**QUIET_SETTINGS, init_timeout=max(5.0, float(self._timeout_s) - 1.0))
        run = wandb.init(project=self.project, entity=self.entity, id=self.wandb_run_id, name=self.rlcr_run_id,
                         config=dict(params), resume="allow", dir=self.directory, mode=self.mode or None,
                         settings=settings, reinit="create_new")
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY)
        self._run = run
        logged = run.summary.get(LOGGED_KEY) if hasattr(run.summary, "get") else None
        self._logged = {int(k) for k in (logged or []) if isinstance(k, int)} | self._ledger_read()
        self.run_url = getattr(run, "url", None) or None
        return True

    # -- the ledger of logged iterations (offline runs cannot read their summary back)

    def _ledger_path(self) -> Path:
        return Path(self.directory) / "rlcr-ledger" / f"{self.wandb_run_id}.json"

    def _ledger_read(self) -> set[int]:
        try:
            doc = json.loads(self._ledger_path().read_text()[:1_000_000])
        except (OSError, ValueError):
            return set()
        return {k for k in doc.get("iterations", []) if isinstance(k, int)} if isinstance(doc, dict) else set()

    def _ledger_write(self) -> None:
        path = self._ledger_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"run_id": self.rlcr_run_id, "iterations": sorted(self._logged)}))
        os.replace(tmp, path)

    # -- logging

    def _log_row(self, iteration: int, flat: dict[str, float]) -> bool:
        if iteration in self._logged:
            return True
        self._run.log({STEP_KEY: iteration, **flat})
        self._logged.add(iteration)
        self._run.summary[LOGGED_KEY] = sorted(self._logged)
        self._ledger_write()
        return True

    def log_iteration(self, iteration: int, metrics: Mapping[str, Any]) -> bool:
        flat = tracked_metrics(metrics)
        done = bool(self._call(f"logging iteration {iteration}", self._log_row, int(iteration), flat))
        if done and int(iteration) >= self._noted_step:
            note = calibration_note(int(iteration), metrics)
            if note != self._note:  # the run's notes say why the calibration charts are empty
                self._call("setting the run's notes", setattr, self._run, "notes", note)
                self._note = note
            self._noted_step = int(iteration)
        return done

    def logged_iterations(self) -> set[int]:
        return set(self._logged) if self.enabled else set()

    def log_metrics(self, metrics: Mapping[str, Any], step: int = 0) -> bool:
        return bool(self._call("logging metrics", lambda: self._run.log({STEP_KEY: int(step),
                                                                         **flatten_metrics(metrics)}) or True))

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> bool:
        path = Path(local_path)

        def upload() -> bool:
            wandb = _wandb_module()
            name = re.sub(r"[^A-Za-z0-9._-]", "-", f"{self.wandb_run_id}-{artifact_path or path.stem}")[:120]
            artifact = wandb.Artifact(name, type=artifact_path or "report")
            if path.is_dir():
                artifact.add_dir(str(path))
            else:
                artifact.add_file(str(path))
            self._run.log_artifact(artifact)
            return True

        return bool(self._call(f"uploading {path.name}", upload))

    def set_tags(self, tags: Mapping[str, Any]) -> bool:
        return bool(self._call("setting tags", lambda: self._run.summary.update(
            {f"tags/{k}": str(v)[:8000] for k, v in tags.items()}) or True))

    def close(self, status: str = "FINISHED") -> None:
        if self.enabled and self._run is not None:
            self._call("ending the run", lambda: self._run.finish(exit_code=EXIT_CODES.get(status, 1)))
        self.enabled = False

    def where(self) -> str | None:
        if self.run_url:
            return self.run_url
        if self.mode == "offline" or os.environ.get("WANDB_MODE") == "offline":
            return f"W&B offline files in {self.directory}/wandb (send them with: wandb sync {self.directory}/wandb)"
        return None
