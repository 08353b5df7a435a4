"""`prefect deployment run rlcr/train` against a real local `prefect server start` (docs/design.md §1).

Starts a Prefect server and `python -m flows.serve` (the documented command) as
subprocesses, triggers one iteration of the tiny config through the CLI, and
checks that it completed and committed.
"""

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
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
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


def test_deployment_run_against_local_server(prefect_server, tiny_model_dir, tmp_path):
    env = prefect_server
    store = tmp_path / "store"
    config = tmp_path / "tiny.yaml"
    cfg = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    for section, values in {"model": {"name": str(tiny_model_dir)}, "storage": {"uri": str(store)},
                            "rollout": {"prompts_per_iteration": 2, "num_generations_answer": 2,
                                        "max_answer_tokens": 12, "max_confidence_tokens": 8},
                            "tasks": {"num_eval": 4}}.items():
        cfg.setdefault(section, {}).update(values)
    config.write_text(yaml.safe_dump(cfg))
    serve_log = open(tmp_path / "serve.log", "w")
    serve = subprocess.Popen([sys.executable, "-m", "flows.serve", "--config", str(config)], cwd=REPO, env=env,
                             stdout=serve_log, stderr=subprocess.STDOUT)
    prefect = lambda *args, **kw: subprocess.run([str(BIN / "prefect"), *args], env=env, cwd=REPO,
                                                  capture_output=True, text=True, **kw)
    try:
        wait_for(lambda: prefect("deployment", "inspect", "rlcr/train").returncode == 0, 180, "deployment rlcr/train")
        nightly = prefect("deployment", "inspect", "rlcr-probe/nightly")
        assert nightly.returncode == 0 and "0 3 * * *" in nightly.stdout
        run = prefect("deployment", "run", "rlcr/train", "-p", "run_id=dep", "-p", "iterations=1",
                      "--watch", "--watch-timeout", "900", timeout=960)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out + (tmp_path / "serve.log").read_text()[-4000:]
        assert "Completed" in out
        assert (store / "runs" / "dep" / "iter-0001" / "manifest.json").exists()
        from rlcr.runs import RunStore
        from rlcr.storage import Store

        run = RunStore(Store(str(store)), "dep")
        manifest = run.manifest(1)  # its checkpoint lies under the committing attempt's folder
        assert "/iter-0001/attempt-" in manifest["checkpoint_uri"]
        assert run.store.is_complete(run.store.rel(manifest["checkpoint_uri"]))
    finally:
        serve.terminate()
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
        serve_log.close()
