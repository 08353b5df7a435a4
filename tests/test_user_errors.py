"""Issue 33 item 3: a wrong invocation of `rlcr` is one line and exit code 2, never a traceback, and what the
input alone shows wrong is answered before Ray or Prefect start.

Each invocation runs the real CLI in a subprocess through a small launcher that records, at exit, which of
Ray, Prefect, vLLM and torch were imported: a framework that was never imported was never started. As a
second guard, RAY_ADDRESS and PREFECT_API_URL point at a closed port, so that starting either would fail
with a different, longer error. `rlcr --debug` shows the traceback."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("ray", "prefect", "vllm", "torch")
LAUNCHER = f"""
import atexit, os, sys

def _report():
    with open(os.environ["RLCR_TEST_IMPORTED"], "w") as f:
        f.write(" ".join(m for m in {HEAVY!r} if m in sys.modules))

atexit.register(_report)
sys.argv[0] = "rlcr"
from rlcr.cli import app
app()
"""


def closed_port() -> int:
    from s3server import free_port

    return free_port()  # bound, then closed: nothing listens there


def run_cli(args, tmp_path, env=None, drop=()):
    """(exit code, the output's non-blank lines, the heavy modules imported, seconds)."""
    port = closed_port()
    full = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}", "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
            "RLCR_TEST_IMPORTED": str(tmp_path / "imported.txt"), "AWS_EC2_METADATA_DISABLED": "true",
            "RLCR_STORAGE_CHECK_TIMEOUT_S": "10", "COLUMNS": "100", **(env or {})}
    for name in drop:
        full.pop(name, None)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", LAUNCHER, *args], cwd=tmp_path, env=full, capture_output=True,
                         text=True, timeout=120)
    took = time.perf_counter() - t0
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    imported = (tmp_path / "imported.txt").read_text().split() if (tmp_path / "imported.txt").exists() else ["?"]
    return res.returncode, lines, imported, took


def assert_one_line(rc, lines, imported, took, *needles):
    text = "\n".join(lines)
    assert rc == 2, text[-3000:]
    assert "Traceback" not in text and len(lines) == 1, text[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert imported == [], f"imported {imported} before refusing: {lines[0]}"
    assert took < 60


def _setup(tmp_path: Path) -> None:
    """A store with run 'started' (config recorded with seed 1, nothing committed), a config file with a typo,
    a plain file where a directory is expected, a base model without a chat template."""
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunStore

    RunStore.open(RLCRConfig(storage={"uri": str(tmp_path / "store")}, run={"seed": 1}), "started").check_config(
        RLCRConfig(storage={"uri": str(tmp_path / "store")}, run={"seed": 1}))
    (tmp_path / "typo.yaml").write_text("leraning_rate: 1.0e-5\n")
    (tmp_path / "afile").write_text("not a directory")
    base = tmp_path / "base-model"  # a checkpoint directory whose tokenizer has no chat template
    base.mkdir()
    for name, text in (("config.json", "{}"), ("model.safetensors", ""), ("tokenizer.json", "{}"),
                       ("tokenizer_config.json", "{}")):
        (base / name).write_text(text)


S = "storage.uri={tmp}/store"
NO_CREDENTIALS = {"env": {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"},
                  "drop": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")}
CASES = [  # (id, arguments, what the line must say, extra environment)
    ("run-id-with-slash", ["train", "--run-id", "a/b", S], ["--run-id", "invalid run id 'a/b'"], {}),
    ("zero-iterations", ["train", "--iterations", "0", S],
     ["'--iterations'", "greater than or equal to 1", "rlcr train --help"], {}),
    ("iterations-not-a-number", ["train", "--iterations", "many", S], ["'--iterations'"], {}),
    ("typo-on-the-command-line", ["train", "leraning_rate=1e-5", S],
     ["unknown field 'leraning_rate'", "command-line", "did you mean 'sft.learning_rate' or 'update.learning_rate'"],
     {}),
    ("typo-in-the-file", ["train", "--config", "{tmp}/typo.yaml", S],
     ["typo.yaml", "unknown field 'leraning_rate'", "in the config file",
      "did you mean 'sft.learning_rate' or 'update.learning_rate'"], {}),
    ("bad-value-on-the-command-line", ["train", "run.seed=-1", S],
     ["field 'run.seed'", "set on the command line: run.seed=-1"], {}),
    ("missing-config-file", ["train", "--config", "{tmp}/nope.yaml"], ["nope.yaml: config file not found"], {}),
    ("s3-without-credentials", ["train", "storage.uri=s3://rlcr-bucket/runs", "storage.s3_endpoint_url=http://127.0.0.1:{port}"],
     ["storage.uri s3://rlcr-bucket/runs", "no AWS credentials", "AWS_ACCESS_KEY_ID"], NO_CREDENTIALS),
    ("s3-endpoint-unreachable", ["train", "storage.uri=s3://rlcr-bucket/runs", "storage.s3_endpoint_url=http://127.0.0.1:{port}"],
     ["storage.uri s3://rlcr-bucket/runs", "cannot reach the S3 endpoint http://127.0.0.1:", "storage.s3_endpoint_url"],
     {}),
    ("storage-under-a-file", ["train", "storage.uri={tmp}/afile/store"], ["storage.uri", "is not a directory"], {}),
    ("model-missing", ["train", "model.name={tmp}/no-model", S], ["model", "no-model: no such directory"], {}),
    ("model-hub-id-offline", ["train", "model.name=Qwen/Qwen2.5-0.5B-Instruct", S],
     ["model Qwen/Qwen2.5-0.5B-Instruct is a Hugging Face hub id", "cannot be reached", "pass model.name=DIR"],
     {"env": {"HF_HUB_OFFLINE": "1"}}),
    ("model-without-chat-template", ["train", "model.name={tmp}/base-model", S],
     ["base-model", "no chat template", "chat_template"], {}),
    ("task-file-missing", ["train", "tasks.train_file={tmp}/tasks.jsonl", S],
     ["tasks.train_file", "tasks.jsonl: no such file"], {}),
    ("resume-with-other-settings", ["train", "--run-id", "started", "run.seed=2", S],
     ["run 'started' was started with other settings", "seed"], {}),
    ("dashboard-setting", ["train", S], ["RLCR_RAY_DASHBOARD='sometimes'"],
     {"env": {"RLCR_RAY_DASHBOARD": "sometimes"}}),
    ("compare-unknown-runs", ["compare", "started", "ghost", S],
     ["run 'ghost' not found under", "runs there: started"], {}),
    ("probe-unknown-run", ["probe", "--run-id", "ghost", S], ["run 'ghost' not found", "runs there: started"], {}),
    ("probe-nothing-committed", ["probe", "--run-id", "started", S],
     ["run 'started' has no committed iteration", "rlcr train --run-id started"], {}),
    ("probe-without-run-id", ["probe", S], ["Missing option '--run-id'"], {}),
    ("eval-checkpoint-missing", ["eval", "--checkpoint", "{tmp}/ckpt", S],
     ["--checkpoint", "ckpt: no such directory"], {}),
    ("eval-records-not-parquet", ["eval", "--records", "{tmp}/rows.csv", S], ["expected a .parquet file name"], {}),
    ("demo-run-id", ["demo", "--run-id", "x/../y", "--config", str(ROOT / "configs" / "demo.yaml")],
     ["--run-id", "invalid run id"], {}),
    ("sft-model-missing", ["sft", "model.name={tmp}/no-model", S], ["no-model: no such directory"], {}),
    ("unknown-command", ["trian"], ["No such command 'trian'", "Did you mean 'train'"], {}),
    ("config-show-typo", ["config", "show", "sede=3"], ["unknown field 'sede'", "did you mean 'run.seed'"], {}),
]


@pytest.mark.parametrize("args, needles, extra", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_wrong_invocation_is_one_line_before_ray_or_prefect_start(tmp_path, args, needles, extra):
    _setup(tmp_path)
    port = closed_port()

    def fill(t):
        return t.format(tmp=tmp_path, port=port)

    rc, lines, imported, took = run_cli([fill(a) for a in args], tmp_path, extra.get("env"), extra.get("drop", ()))
    assert_one_line(rc, lines, imported, took, *map(fill, needles))


def test_debug_shows_the_traceback_of_the_same_error(tmp_path):
    rc, lines, _, _ = run_cli(["--debug", "train", "--run-id", "a/b", f"storage.uri={tmp_path}/store"], tmp_path)
    text = "\n".join(lines)
    assert rc == 2 and "Traceback" in text and lines[-1].startswith("error: --run-id: invalid run id 'a/b'"), text


def test_an_unknown_bucket_is_named_before_ray_or_prefect_start(s3_server, tmp_path):
    """The one check that needs a server: a moto S3 endpoint that answers, without the bucket."""
    rc, lines, imported, took = run_cli(["train", "storage.uri=s3://no-such-bucket/runs",
                                         f"storage.s3_endpoint_url={s3_server.endpoint}"], tmp_path)
    assert_one_line(rc, lines, imported, took, "storage.uri s3://no-such-bucket/runs",
                    "bucket 'no-such-bucket' does not exist", s3_server.endpoint)
