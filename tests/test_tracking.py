"""Experiment tracking (rlcr.tracking) against a real `mlflow server` on 127.0.0.1 and a real local SQLite store;
the run's metric chart checked in headless Chromium. No mocks."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rlcr.tracking import (
    SENTINEL,
    STARTED,
    Tracker,
    flatten_metrics,
    flatten_params,
    metric_key,
    open_tracker,
    tracked_metrics,
)

ROOT = Path(__file__).resolve().parents[1]
SERVER_START_S = 180  # `mlflow server` takes ~10 s to answer on the busy 2-core box (~30–50 s with job execution)
# The server's job execution (MLflow 3's background jobs: a Huey consumer process per job type, each importing
# mlflow beside the uvicorn worker) is for GenAI jobs rlcr never submits; off, the server answers 3–4× sooner
# here. Tracking itself is the same server code either way.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """`mlflow server` in its own process group, with its own SQLite store and artifact root under ``root``."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "MlflowServer":
        self.root.mkdir(parents=True, exist_ok=True)
        mlflow = Path(sys.executable).with_name("mlflow")
        cmd = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
               "--artifacts-destination", str(self.root / "artifacts")]
        self.log = open(self.root / "server.log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=self.root, env={**os.environ, **SERVER_ENV})
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer within {SERVER_START_S} s")

    def stop(self) -> None:
        """SIGKILL the server's process group (the CLI and its uvicorn worker)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None
        self.log.close()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.stop()


@pytest.fixture
def doomed_mlflow_server(tmp_path):
    """A server of this test's own, which the test kills."""
    server = MlflowServer(tmp_path / "doomed-server").start()
    yield server
    server.stop()


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def iteration_metrics(k: int) -> dict:
    """A metrics.json-shaped dict for iteration ``k``."""
    return {
        "rollout": {"answer/reward_mean": 0.1 * k, "answer/accuracy": 0.5, "tokens/generated": 100.0 * k,
                    "confidence/mean": float("nan")},
        "update": {"loss": 1.0 / k, "grad_norm": 2.0, "clip_frac": 0.01, "history": [{"loss": 1.0}] * 3},
        "eval": {"accuracy": 0.4 + 0.01 * k, "ece": 0.3 / k, "n_tasks": 20, "ci": {"ece": [0.1 / k, 0.5 / k]},
                 "by_count": {"3": {"accuracy": 0.6, "auroc": None}}},
        "timings": {"update_s": 3.5, "rollouts_s": 10.0},
        "engines": {"policy": "file:///x"},
    }


def history(c, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in c.get_metric_history(run_id, key))


# ----------------------------------------------------------------------------- without MLflow


def test_flatten_metrics_keys_ci_and_non_finite():
    flat = flatten_metrics(iteration_metrics(2))
    assert flat["eval/ece"] == pytest.approx(0.15)
    assert flat["eval/ece_ci_low"] == pytest.approx(0.05) and flat["eval/ece_ci_high"] == pytest.approx(0.25)
    assert flat["rollout/answer/reward_mean"] == pytest.approx(0.2)
    assert flat["timings/update_s"] == 3.5 and flat["eval/by_count/3/accuracy"] == 0.6
    assert "rollout/confidence/mean" not in flat  # NaN skipped
    assert "eval/by_count/3/auroc" not in flat and not any(k.startswith("update/history") for k in flat)
    assert not any(k.startswith("engines") for k in flat)  # strings skipped
    assert flatten_metrics({"a_ci": [0.1, 0.2], "x": {"y": True}}) == {"a_ci_low": 0.1, "a_ci_high": 0.2, "x/y": 1.0}


def test_metric_keys_are_valid_mlflow_names():
    from mlflow.utils.validation import _validate_metric_name

    for raw in ("a//b/../c", "/x/", "..", "a/./b", "", "ümlaut:key?", "x" * 400):
        key = metric_key(raw)
        _validate_metric_name(key)  # raises if MLflow would refuse it
        assert len(key) <= 250


def test_flatten_params_stringifies_and_truncates():
    flat = flatten_params({"lr": 1e-5, "betas": [0.9, 0.99], "res": {"GPU": 1}, "none": None, "long": "x" * 7000})
    assert flat == {"lr": "1e-05", "betas": "[0.9, 0.99]", "res.GPU": "1", "none": "None", "long": "x" * 6000}


def test_kind_none_writes_nothing(tmp_path):
    store = tmp_path / "store"
    tracker = open_tracker("none", None, str(store), "r1", {"lr": 1})
    assert type(tracker) is Tracker and not tracker.enabled and tracker.run_url is None
    assert tracker.log_iteration(1, iteration_metrics(1)) is False and tracker.logged_iterations() == set()
    assert tracker.log_artifact(__file__) is False and tracker.log_metrics({"a": 1}) is False
    tracker.close()
    assert not store.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="tracking kind"):
        open_tracker("tensorboard", None, str(store), "r1", {})


def test_remote_storage_without_tracking_uri_warns_and_is_off(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="rlcr.tracking"):
        tracker = open_tracker("mlflow", None, "s3://bucket/store", "r1", {})
    assert not tracker.enabled and "not local" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_a_hung_server_costs_one_bounded_wait(tmp_path, caplog):
    """A server that accepts connections and never answers: open gives up at its deadline, warns once, and
    every later call returns at once."""
    import mlflow.tracking  # noqa: F401 - imported here so that the deadline measures the request, not the import

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="rlcr.tracking"):
            tracker = open_tracker("mlflow", uri, str(tmp_path), "r1", {"lr": 1}, timeout_s=3)
            opened = time.monotonic() - t0
            assert tracker.log_iteration(1, iteration_metrics(1)) is False
            tracker.close()
    assert opened < 10 and time.monotonic() - t0 < 11
    assert not tracker.enabled
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "rlcr.tracking"]
    assert len(warnings) == 1 and "did not finish within 3 s" in warnings[0].getMessage()


@pytest.mark.slow
def test_local_default_backend_needs_no_server(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "store"
    report = tmp_path / "report.html"
    report.write_text("<h1>probe</h1>")
    with open_tracker("mlflow", None, str(store), "local run", {"lr": 1e-5}, timeout_s=120) as tracker:
        assert tracker.enabled and tracker.tracking_uri == f"sqlite:///{store / 'mlflow.db'}"
        assert tracker.run_url is None
        assert tracker.ui_hint == f"mlflow ui --backend-store-uri {tracker.tracking_uri} --workers 1"
        assert tracker.log_iteration(1, iteration_metrics(1)) and tracker.log_artifact(report, "probe")
    assert (store / "mlflow.db").is_file()
    assert (store / "mlflow-artifacts" / tracker.mlflow_run_id / "artifacts" / "probe" / "report.html").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "store"]  # nothing in the cwd
    c = client(tracker.tracking_uri)
    run = c.get_run(tracker.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"lr": "1e-05"}
    assert history(c, tracker.mlflow_run_id, "eval/ece") == [(1, pytest.approx(0.3))]


def test_the_probe_adds_to_a_finished_run_without_reopening_it(tmp_path, monkeypatch):
    """The experiment is marked as training (MLflow 3's UI opens it on its runs, not a GenAI overview); the probe's
    report goes to the run without reopening it: status, end time (so the run's duration: the training's) and
    params unchanged, and no stray ``_`` parameter from its empty params."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    report = tmp_path / "report.html"
    report.write_text("<h1>probe</h1>")
    with open_tracker("mlflow", None, str(store), "trained", {"lr": 1e-5}, timeout_s=120) as tracker:
        tracker.log_iteration(1, iteration_metrics(1))
    c = client(tracker.tracking_uri)
    trained = c.get_run(tracker.mlflow_run_id).info
    time.sleep(1.1)
    with open_tracker("mlflow", None, str(store), "trained", {}, timeout_s=120, resume=False) as probe:
        assert probe.mlflow_run_id == tracker.mlflow_run_id and probe.log_artifact(report, "probe")
    after = c.get_run(tracker.mlflow_run_id)
    assert (after.info.status, after.info.end_time) == ("FINISHED", trained.end_time)
    assert after.data.params == {"lr": "1e-05"} and flatten_params({}) == {}
    assert c.get_experiment(tracker.experiment_id).tags.get("mlflow.experimentKind") == "custom_model_development"


# ----------------------------------------------------------------------------- against `mlflow server`


def test_params_and_metrics_logged_with_steps(mlflow_server, tmp_path):
    params = {"lr": 1e-5, "method": "rlcr", "engine_resources": {"GPU": 1}}
    tracker = open_tracker("mlflow", mlflow_server.url, str(tmp_path), "steps run", params)
    assert tracker.enabled and tracker.run_url == (f"{mlflow_server.url}/#/experiments/{tracker.experiment_id}"
                                                   f"/runs/{tracker.mlflow_run_id}")
    for k in (1, 2, 3):
        assert tracker.log_iteration(k, iteration_metrics(k))
    c = client(mlflow_server.url)
    run = c.get_run(tracker.mlflow_run_id)
    assert run.data.params == {"lr": "1e-05", "method": "rlcr", "engine_resources.GPU": "1"}
    assert run.data.tags["rlcr.run_id"] == "steps run" and run.info.run_name == "steps run"
    assert c.get_experiment(run.info.experiment_id).name == "rlcr"
    assert history(c, tracker.mlflow_run_id, "eval/ece") == [(1, pytest.approx(0.3)), (2, pytest.approx(0.15)),
                                                              (3, pytest.approx(0.1))]
    assert [s for s, _ in history(c, tracker.mlflow_run_id, "eval/ece_ci_low")] == [1, 2, 3]
    assert history(c, tracker.mlflow_run_id, "timings/update_s") == [(1, 3.5), (2, 3.5), (3, 3.5)]
    assert history(c, tracker.mlflow_run_id, SENTINEL) == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert set(run.data.metrics) == set(tracked_metrics(iteration_metrics(1))) | {SENTINEL, STARTED}
    assert history(c, tracker.mlflow_run_id, "Summary/ece") == history(c, tracker.mlflow_run_id, "eval/ece")
    tracker.close()
    assert c.get_run(tracker.mlflow_run_id).info.status == "FINISHED"


def test_resume_continues_the_run_and_never_duplicates(mlflow_server, tmp_path):
    """A tracker killed without closing (as by SIGKILL), then a new one for the same rlcr run re-logging the
    committed iterations: the same MLflow run, exactly one value per step for every metric."""
    params = {"lr": 1e-5, "iterations": 3}
    first = open_tracker("mlflow", mlflow_server.url, str(tmp_path), "resumed run", params)
    for k in (1, 2):
        assert first.log_iteration(k, iteration_metrics(k))
    # no close(): the process died
    again = open_tracker("mlflow", mlflow_server.url, str(tmp_path), "resumed run", {**params, "iterations": 5})
    assert again.enabled and again.mlflow_run_id == first.mlflow_run_id
    assert again.logged_iterations() == {1, 2}
    for k in (1, 2, 3, 4):  # the flow back-fills every committed iteration, then goes on
        assert again.log_iteration(k, iteration_metrics(k))
    assert again.log_iteration(4, iteration_metrics(4))  # and twice is still once
    c = client(mlflow_server.url)
    for key in (*flatten_metrics(iteration_metrics(1)), SENTINEL):
        steps = [s for s, _ in history(c, first.mlflow_run_id, key)]
        assert steps == [1, 2, 3, 4], key
    run = c.get_run(first.mlflow_run_id)
    assert run.data.params["iterations"] == "3" and run.data.tags["rlcr.params_changed"] == "iterations"
    assert len(c.search_runs([run.info.experiment_id], "tags.`rlcr.run_id` = 'resumed run'")) == 1
    again.close()


def committed_run(root: Path, run_id: str, iterations: dict[int, dict], baseline: dict | None):
    """A run's store holding ``baseline.json`` (the baseline's held-out evaluation) and committed iterations
    with these metrics, written as the flow writes them (RunStore)."""
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunStore

    run = RunStore.open(RLCRConfig(storage={"uri": str(root)}, model={"name": "m"}), run_id)
    if baseline is not None:
        run.write_baseline({"policy_uri": "file:///initial", "eval": baseline})
    for k, metrics in iterations.items():
        run.commit(k, {"metrics_uri": run.write_metrics(k, metrics)})
    return run


def test_a_tracker_down_during_the_first_run_is_back_filled_from_step_0(mlflow_server, tmp_path, caplog):
    """Issue item 10: no tracker while the run evaluated its baseline and committed iterations 1-2; the
    resume's back-fill (what the flow sends at its start) logs steps 0, 1 and 2, each value once."""
    from rlcr.tracking import sync_run

    baseline = {"accuracy": 0.3, "ece": 0.4, "n_tasks": 20, "ci": {"ece": [0.2, 0.6]}}
    run = committed_run(tmp_path / "store", "down first", {}, baseline)
    unreachable = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="rlcr.tracking"):
        down = open_tracker("mlflow", unreachable, str(tmp_path), "down first", {"lr": 1}, timeout_s=30)
    assert not down.enabled and "is off" in caplog.text
    assert sync_run(down, run, [0]) == 0
    for k in (1, 2):
        run.commit(k, {"metrics_uri": run.write_metrics(k, iteration_metrics(k))})
        assert sync_run(down, run, [k]) == 0

    again = open_tracker("mlflow", mlflow_server.url, str(tmp_path), "down first", {"lr": 1})
    assert again.enabled and again.logged_iterations() == set()
    assert sync_run(again, run) == 3
    assert sync_run(again, run) == 3 and again.log_iteration(0, {"eval": baseline})  # again: nothing re-sent
    resumed = open_tracker("mlflow", mlflow_server.url, str(tmp_path), "down first", {"lr": 1})
    assert resumed.logged_iterations() == {0, 1, 2} and sync_run(resumed, run) == 3
    c = client(mlflow_server.url)
    assert history(c, again.mlflow_run_id, SENTINEL) == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert history(c, again.mlflow_run_id, "eval/ece") == [(0, 0.4), (1, pytest.approx(0.3)), (2, pytest.approx(0.15))]
    assert history(c, again.mlflow_run_id, "eval/ece_ci_high")[0] == (0, 0.6)
    for key in (*flatten_metrics(iteration_metrics(1)), STARTED):
        steps = [s for s, _ in history(c, again.mlflow_run_id, key)]
        assert steps == ([0, 1, 2] if key in ("eval/accuracy", "eval/ece", "eval/n_tasks", "eval/ece_ci_low",
                                              "eval/ece_ci_high", STARTED) else [1, 2]), key
    again.close()
    resumed.close()


class FailsAfterAFullBatch:
    """The real MlflowClient, except that once a batch of 1000 metrics has gone through, every later
    ``log_batch`` raises: a process cut off between two batches of one iteration (a fault injected in front of
    the real server, which stores what it was sent)."""

    def __init__(self, real):
        self.real = real
        self.full_batches = 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def log_batch(self, run_id, metrics=(), **kwargs):
        if self.full_batches:
            raise ConnectionError("injected fault: the process died here")
        self.real.log_batch(run_id, metrics=metrics, **kwargs)
        self.full_batches += len(metrics) == 1000


def stored_steps(server: MlflowServer, run_id: str) -> dict[str, list[int]]:
    """Every metric's logged steps (with repeats) as the server's SQLite store holds them."""
    import sqlite3

    with sqlite3.connect(server.root / "server.db") as db:
        rows = db.execute("SELECT key, step FROM metrics WHERE run_uuid = ? ORDER BY key, step", (run_id,)).fetchall()
    out: dict[str, list[int]] = {}
    for key, step in rows:
        out.setdefault(key, []).append(step)
    return out


def test_an_iteration_cut_off_between_batches_is_completed_key_by_key(mlflow_server, tmp_path, caplog):
    """Issue item 10: an iteration of more than 999 metrics goes out in several batches; cut off after the
    first, it is not counted as logged, and the next sync sends the keys it lacks: every key holds the step
    exactly once."""
    wide = {"eval": {"ece": 0.25}, "wide": {f"m{i:04d}": float(i) for i in range(1100)}}
    run = committed_run(tmp_path / "store", "cut", {1: iteration_metrics(1), 2: wide}, None)
    tracker = open_tracker("mlflow", mlflow_server.url, str(tmp_path), "cut", {"lr": 1})
    assert tracker.log_iteration(1, iteration_metrics(1))
    tracker._client = FailsAfterAFullBatch(tracker._client)
    with caplog.at_level(logging.WARNING, logger="rlcr.tracking"):
        assert tracker.log_iteration(2, wide) is False
    assert not tracker.enabled and "injected fault" in caplog.text
    expected = set(flatten_metrics(wide))
    cut = stored_steps(mlflow_server, tracker.mlflow_run_id)
    assert 0 < len(expected & set(cut)) < len(expected)  # half logged: some keys hold step 2, others nothing

    # completing it reads each key's history: ~1100 requests, under load longer than the default deadline
    again = open_tracker("mlflow", mlflow_server.url, str(tmp_path), "cut", {"lr": 1}, timeout_s=600)
    assert again.logged_iterations() == {1}  # not 2: it is incomplete

    from rlcr.tracking import sync_run

    assert sync_run(again, run) == 2 and again.logged_iterations() == {1, 2}
    steps = stored_steps(mlflow_server, tracker.mlflow_run_id)
    assert {k: v for k, v in steps.items() if k in expected} == {k: [2] for k in expected if k != "eval/ece"} | \
        {"eval/ece": [1, 2]}
    assert steps[SENTINEL] == [1, 2] and steps[STARTED] == [1, 2]
    assert sync_run(again, run) == 2 and stored_steps(mlflow_server, tracker.mlflow_run_id) == steps
    again.close()


def test_parent_and_child_runs(mlflow_server, tmp_path):
    parent = open_tracker("mlflow", mlflow_server.url, str(tmp_path), "bench/benchmark", {"methods": "rlcr,rlvr"})
    children = [open_tracker("mlflow", mlflow_server.url, str(tmp_path), f"bench-{m}", {"method": m}, parent=parent)
                for m in ("rlcr", "rlvr")]
    c = client(mlflow_server.url)
    for child in children:
        assert c.get_run(child.mlflow_run_id).data.tags["mlflow.parentRunId"] == parent.mlflow_run_id
        child.close()
    assert parent.log_metrics({"methods": {"ece_ratio": 0.5}}, step=20)
    assert history(c, parent.mlflow_run_id, "methods/ece_ratio") == [(20, 0.5)]
    parent.close()


def test_server_killed_mid_run_is_bounded_warned_and_harmless(doomed_mlflow_server, tmp_path, caplog):
    tracker = open_tracker("mlflow", doomed_mlflow_server.url, str(tmp_path), "doomed", {"lr": 1}, timeout_s=20)
    assert tracker.log_iteration(1, iteration_metrics(1))
    doomed_mlflow_server.stop()
    report = tmp_path / "report.html"
    report.write_text("x")
    with caplog.at_level(logging.WARNING, logger="rlcr.tracking"):
        t0 = time.monotonic()
        assert tracker.log_iteration(2, iteration_metrics(2)) is False
        failed_after = time.monotonic() - t0
        t1 = time.monotonic()
        assert tracker.log_iteration(3, iteration_metrics(3)) is False
        assert tracker.log_artifact(report) is False and tracker.log_metrics({"a": 1}) is False
        tracker.close("FAILED")
        later = time.monotonic() - t1
    assert failed_after < 21 and later < 1
    assert not tracker.enabled
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "rlcr.tracking"]
    assert len(warnings) == 1 and "logging iteration 2" in warnings[0].getMessage()


# ----------------------------------------------------------------------------- the UI in headless Chromium


class Chromium:
    """Headless Chromium driven over the DevTools protocol: it waits in real time for the page to render
    (``--dump-dom`` with ``--virtual-time-budget`` snapshots MLflow's lazily drawn charts only now and then)."""

    def __init__(self, profile: Path):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            pytest.skip("chromium is not installed (make setup-test)")
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        from websockets.sync.client import connect

        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.next_id = 0

    def send(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def evaluate(self, expression: str):
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def render(self, url: str, ready_js: str, timeout_s: float = 90) -> str:
        """Navigate to ``url``, wait until ``ready_js`` is true (at most ``timeout_s``), return the DOM."""
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(ready_js) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)  # let the last frame settle for the screenshot
        return self.evaluate("document.documentElement.outerHTML")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


CHART_READY = ("document.querySelectorAll('.js-plotly-plot path.js-line').length > 0 && "
               "!!document.querySelector('[title=\"Summary/ece\"]')")


def test_the_run_page_draws_the_metric_chart(mlflow_server, tmp_path):
    """In headless Chromium: the run's first charts are its headline figures (Summary/: rewards, held-out
    accuracy, ECE…), before engines/…, eval/…; the experiment's link opens on its training runs."""
    tracker = open_tracker("mlflow", mlflow_server.url, str(tmp_path), "chart run", {"lr": 1e-5})
    for k in range(1, 6):
        tracker.log_iteration(k, {**iteration_metrics(k), "engines": {"sync": [{"bytes": 1e6, "load_s": 0.2}]}})
    tracker.close()
    browser = Chromium(tmp_path / "chromium-profile")
    try:
        dom = browser.render(f"{tracker.run_url}/model-metrics", CHART_READY)
        shot = tmp_path / "mlflow-run-model-metrics.png"
        browser.screenshot(shot)
        titles = browser.evaluate("[...document.querySelectorAll('[title]')].map(e => e.getAttribute('title'))")
        page = browser.render(tracker.experiment_url, "document.body.innerText.includes('chart run')", 60)
        at = browser.evaluate("location.href")
        browser.screenshot(tmp_path / "mlflow-experiment.png")
    finally:
        browser.close()
    charts = [t for t in titles if "/" in t]
    assert charts[:3] == ["Summary/accuracy", "Summary/answer_reward", "Summary/ece"], titles
    assert "chart run" in page and "/runs" in at and "Token Usage" not in page, at  # the runs table, not GenAI
    assert "MLflow" in dom and "chart run" in dom
    assert 'title="Summary/ece"' in dom  # the chart card of the metric
    lines = re.findall(r'<path class="js-line" d="(M[^"]+)"', dom)  # plotly's drawn traces
    assert any(d.count("L") >= 4 for d in lines), lines  # one line through the 5 logged steps
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    keep = ROOT / "tests" / "artifacts" / shot.name
    ignored = subprocess.run(["git", "check-ignore", "-q", str(keep)], cwd=ROOT).returncode == 0
    if ignored:  # kept for a look only where git ignores it
        keep.parent.mkdir(exist_ok=True)
        shutil.copy(shot, keep)


def test_a_note_says_why_calibration_metrics_are_missing(tmp_path, monkeypatch):
    """No confidence parsed: ECE, Brier and AUROC are undefined and not logged; the run's note (MLflow's
    description) says why, and is cleared once a later step has them."""
    from rlcr.tracking import NOTE_TAG

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    silent = {"eval": {"accuracy": 0.0, "ece": None, "brier": None, "auroc": None, "confidence_parse_rate": 0.0}}
    with open_tracker("mlflow", None, str(store), "silent", {"lr": 1e-5}, timeout_s=120) as tracker:
        assert tracker.log_iteration(1, silent)
        c = client(tracker.tracking_uri)
        note = c.get_run(tracker.mlflow_run_id).data.tags.get(NOTE_TAG, "")
        assert "undefined at iteration 1" in note and "confidence_parse_rate = 0" in note and "rlcr sft" in note
        assert history(c, tracker.mlflow_run_id, "eval/ece") == []
        assert tracker.log_iteration(2, iteration_metrics(2))
        assert c.get_run(tracker.mlflow_run_id).data.tags.get(NOTE_TAG, "") == ""


def test_mlflow_status_follows_the_runs_committed_iterations(tmp_path, monkeypatch):
    """A run finished in rlcr was KILLED in MLflow: an interrupt after the last commit ended the MLflow run as
    killed. The flow tells the tracker whether every iteration is committed; that decides FINISHED."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    statuses = {}
    for name, finished in (("all-committed", True), ("cut-short", False)):
        with pytest.raises(KeyboardInterrupt):
            with open_tracker("mlflow", None, str(store), name, {}, timeout_s=120) as tracker:
                tracker.finished = lambda finished=finished: finished
                tracker.log_iteration(1, iteration_metrics(1))
                raise KeyboardInterrupt
        statuses[name] = client(tracker.tracking_uri).get_run(tracker.mlflow_run_id).info.status
    assert statuses == {"all-committed": "FINISHED", "cut-short": "KILLED"}
