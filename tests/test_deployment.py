"""`prefect deployment run rlcr/train` against a real local `prefect server start` (docs/design.md §1).

Starts a Prefect server and `python -m flows.serve` (the documented command) as
subprocesses, triggers one iteration of the tiny config through the CLI, and
checks that it completed and committed; then serves the nightly probe on an
every-minute schedule and waits for the scheduler's run of it to complete.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(2)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture
def prefect_server(tmp_path):
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
           # the scheduler service every 5 s instead of 60 (its loop is what a served schedule depends on)
           "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5"}
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)

    def healthy():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2).status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, 180, "the Prefect server")
        yield env
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def api(env, path: str, body: dict | None = None):
    """The Prefect server's REST API: GET ``path``, or POST ``body`` to it; the decoded JSON."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(env["PREFECT_API_URL"] + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def serve_deployments(env, config: Path, log: Path, *args: str) -> subprocess.Popen:
    with open(log, "a") as out:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "flows.serve", "--config", str(config), *args], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def test_deployment_run_against_local_server(prefect_server, tiny_model_dir, tmp_path):
    """`prefect deployment run rlcr/train` on the served deployments; then the nightly probe, served on an
    every-minute cron, is run by the server's scheduler to completion. Issue "trust round 5", finding: with the
    SQLAlchemy 2.1 a fresh install got, Prefect's scheduler failed on every loop, so no scheduled run was ever
    created and the nightly probe never ran; this test timed out waiting for one."""
    env = prefect_server
    store = tmp_path / "store"
    config = tmp_path / "tiny.yaml"
    cfg = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    for section, values in {"model": {"name": str(tiny_model_dir)}, "storage": {"uri": str(store)},
                            "rollout": {"prompts_per_iteration": 2, "num_generations_answer": 2,
                                        "max_answer_tokens": 12, "max_confidence_tokens": 8},
                            "tasks": {"num_eval": 4}, "probe": {"samples": 1, "forced_answer_tokens": 4}}.items():
        cfg.setdefault(section, {}).update(values)
    config.write_text(yaml.safe_dump(cfg))
    serve_log = tmp_path / "serve.log"
    served = [serve_deployments(env, config, serve_log)]

    def prefect(*args, **kw):
        return subprocess.run([str(BIN / "prefect"), *args], env=env, cwd=REPO, capture_output=True, text=True, **kw)

    try:
        wait_for(lambda: prefect("deployment", "inspect", "rlcr/train").returncode == 0, 180, "deployment rlcr/train")
        nightly = prefect("deployment", "inspect", "rlcr-probe/nightly")
        assert nightly.returncode == 0 and "0 3 * * *" in nightly.stdout
        run = prefect("deployment", "run", "rlcr/train", "-p", "run_id=dep", "-p", "iterations=1",
                      "--watch", "--watch-timeout", "900", timeout=960)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out + serve_log.read_text()[-4000:]
        assert "Completed" in out
        assert (store / "runs" / "dep" / "iter-0001" / "manifest.json").exists()
        from rlcr.runs.store import RunStore
        from rlcr.storage import Store

        run = RunStore(Store(str(store)), "dep")
        manifest = run.manifest(1)  # its checkpoint lies under the committing attempt's folder
        assert "/iter-0001/attempt-" in manifest["checkpoint_uri"]
        assert run.store.is_complete(run.store.rel(manifest["checkpoint_uri"]))

        # The nightly probe on its schedule: served again with a cron of every minute (one flow run at a time), the
        # server's scheduler creates its runs and the serving process runs the first when its minute comes.
        stop(served[0])
        started = time.time()
        served.append(serve_deployments({**env, "PREFECT_RUNNER_PROCESS_LIMIT": "1"}, config, serve_log,
                                        "--probe-cron", "* * * * *"))
        wait_for(lambda: "* * * * *" in prefect("deployment", "inspect", "rlcr-probe/nightly").stdout, 180,
                 "the nightly probe's every-minute schedule")
        deployment_id = api(env, "/deployments/name/rlcr-probe/nightly")["id"]

        def scheduled_run_completed() -> bool:
            runs = api(env, "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [deployment_id]}}})
            ended = [r for r in runs if r["auto_scheduled"] and r["state_type"] in ("COMPLETED", "FAILED", "CRASHED")]
            assert all(r["state_type"] == "COMPLETED" for r in ended), (
                [(r["name"], r["state_type"], r["state_name"]) for r in ended], serve_log.read_text()[-4000:])
            return bool(ended)

        wait_for(scheduled_run_completed, 360, "a scheduled run of rlcr-probe/nightly to complete")
        print(f"scheduled probe run completed {time.time() - started:.0f} s after serving its schedule")
        assert list((store / "runs" / "dep" / "probes").glob("*/report.json"))
    finally:
        for proc in served:
            stop(proc)
