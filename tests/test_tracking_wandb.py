"""W&B as a second tracker (``tracking.backend: wandb``), in W&B's offline mode (no network, no account): the MLflow
tracker's contract — one run per rlcr run across attempts, the config as parameters, one value per iteration,
back-fill of what an earlier attempt missed, bounded calls, the Summary figures — read back from the run's own
files (tests/wandb_records.py)."""

from __future__ import annotations

import logging
import time

import pytest

from rlcr.tracking import Trackers, log_iterations, open_tracker
from rlcr.tracking.wandb_tracker import LOGGED_KEY, wandb_run_id
from wandb_records import offline_runs, read_run

pytest.importorskip("wandb")


def metrics(k: int, parsed: bool = True) -> dict:
    ev = {"accuracy": 0.4 + 0.01 * k, "ece": 0.3 / (k + 1), "confidence_parse_rate": 1.0, "n_tasks": 8} if parsed \
        else {"accuracy": 0.0, "ece": None, "confidence_parse_rate": 0.0, "n_tasks": 8}
    return {"rollout": {"answer/reward_mean": 0.1 * k}, "update": {"loss": 1.0 / (k + 1)}, "eval": ev}


@pytest.fixture
def offline(monkeypatch, tmp_path):
    for key in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_DIR", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    return {"mode": "offline", "project": "rlcr-test"}


def wandb_tracker(store, run_id, params, wandb, **kw):
    return open_tracker("wandb", None, str(store), run_id, params, timeout_s=120, wandb=wandb, **kw)


def rows_of(store, run_id) -> list[dict]:
    """Every history row of every attempt of ``run_id``'s W&B run, in order."""
    return [row for path in offline_runs(store, wandb_run_id(run_id)) for row in read_run(path)["history"]]


def test_one_run_across_attempts_one_row_per_iteration_and_the_config_as_parameters(tmp_path, offline):
    store = tmp_path / "store"
    params = {"run": {"iterations": 3, "seed": 7}, "update": {"learning_rate": 1e-4}}
    with wandb_tracker(store, "my run", params, offline) as first:
        assert first.enabled, "the W&B tracker did not open"
        assert log_iterations(first, [(0, metrics(0)), (1, metrics(1)), (1, metrics(1))]) == 3  # 1 again: skipped
        first.finished = lambda: False
        assert "wandb sync" in first.where()
    with wandb_tracker(store, "my run", params, offline) as second:  # the resume: iterations 0..3 offered again
        assert second.logged_iterations() == {0, 1}
        assert log_iterations(second, [(k, metrics(k)) for k in range(4)]) == 4
    runs = [read_run(p) for p in offline_runs(store, wandb_run_id("my run"))]
    assert len(runs) == 2 and [r["exit_code"] for r in runs] == [0, 0]
    rows = rows_of(store, "my run")
    assert [row["iteration"] for row in rows] == [0, 1, 2, 3]  # each iteration once, across both attempts
    assert rows[2]["eval/accuracy"] == pytest.approx(0.42) and rows[2]["Summary/accuracy"] == pytest.approx(0.42)
    assert rows[3]["update/loss"] == pytest.approx(0.25)
    assert runs[0]["config"]["run"] == {"iterations": 3, "seed": 7}  # nested, as the config is
    assert runs[0]["config"]["update"]["learning_rate"] == pytest.approx(1e-4)
    assert runs[1]["summary"][LOGGED_KEY] == [0, 1, 2, 3]


def test_an_interrupted_attempt_is_killed_and_undefined_calibration_has_a_note(tmp_path, offline):
    store = tmp_path / "store"
    with pytest.raises(KeyboardInterrupt):
        with wandb_tracker(store, "cut", {}, offline) as tracker:
            tracker.finished = lambda: False
            tracker.log_iteration(1, metrics(1, parsed=False))
            raise KeyboardInterrupt
    (run,) = [read_run(p) for p in offline_runs(store, wandb_run_id("cut"))]
    assert run["exit_code"] == 130
    assert "undefined at iteration 1" in (run["notes"] or "") and "confidence_parse_rate = 0" in run["notes"]
    assert "eval/ece" not in run["history"][0]  # undefined: not logged (W&B would draw NaN as a gap anyway)


def test_an_unreachable_wandb_server_costs_one_bounded_wait_and_a_warning(tmp_path, offline, monkeypatch, caplog):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING):
        tracker = open_tracker("wandb", None, str(tmp_path / "store"), "online", {}, timeout_s=8,
                               wandb={"mode": "online", "project": "rlcr-test"})
        assert not tracker.enabled and not tracker.log_iteration(1, metrics(1))
        tracker.close()
    assert time.perf_counter() - t0 < 30
    assert sum("W&B tracking" in r.getMessage() and "is off" in r.getMessage() for r in caplog.records) == 1


def test_both_trackers_at_once(tmp_path, offline, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    with open_tracker(["mlflow", "wandb"], None, str(store), "both", {"a": 1}, timeout_s=120,
                      wandb=offline) as both:
        assert isinstance(both, Trackers) and both.enabled and len(both.trackers) == 2
        assert both.log_iteration(1, metrics(1)) and both.logged_iterations() == {1}
        assert "mlflow ui" in both.where() and "wandb sync" in both.where()
    history = MlflowClient(tracking_uri=both.tracking_uri).get_metric_history(both.mlflow_run_id, "eval/accuracy")
    assert [(m.step, round(m.value, 3)) for m in history] == [(1, 0.41)]
    assert [row["iteration"] for row in rows_of(store, "both")] == [1]


def test_the_training_flow_logs_to_wandb(tiny_model_dir, tmp_path, offline, ray_local, prefect_harness, monkeypatch):
    """The real flow with ``tracking.backend: [mlflow, wandb]`` offline: the baseline and both iterations, each
    once, with the held-out figures; the run's config as parameters; the run ends finished."""
    from flows.train import rlcr_train

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    overrides = {"model.name": str(tiny_model_dir), "storage.uri": str(store), "rollout.prompts_per_iteration": 2,
                 "rollout.num_generations_answer": 2, "rollout.num_generations_confidence": 2,
                 "tasks.num_train": 16, "tasks.num_eval": 4, "rollout.max_answer_tokens": 16,
                 "rollout.max_confidence_tokens": 8, "engine.max_model_len": 512, "engine.kv_cache_gib": 0.25,
                 "tracking.backend": ["mlflow", "wandb"], "tracking.wandb_mode": "offline",
                 "tracking.wandb_project": "rlcr-test"}
    summary = rlcr_train(overrides=overrides, run_id="flow-wandb", iterations=2)
    assert summary["iterations"] == [1, 2] and "wandb sync" in (summary["mlflow"] or "")
    (path,) = offline_runs(store, wandb_run_id("flow-wandb"))
    run = read_run(path)
    assert [row["iteration"] for row in run["history"]] == [0, 1, 2] and run["exit_code"] == 0
    assert all("eval/accuracy" in row for row in run["history"])
    assert run["config"]["tasks"]["num_eval"] == 4 and run["config"]["tracking"]["backend"] == ["mlflow", "wandb"]
