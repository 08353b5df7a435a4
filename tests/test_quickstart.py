"""README.md's quick start, as written: its commands are the Makefile's targets, a clean clone's ``make demo`` and
``make test`` only install into ``.venv`` and then run the documented command, and that command, ``rlcr demo``,
runs end to end from the clone (on the tiny model: the real demo takes ~15 minutes) and prints what the README
says it prints, leaving the MLflow database the quick start's third command opens.

The set-up is checked on make's dry runs (``make -n``) in a ``git clone`` of this repository: nothing is
installed. The demo runs in its own process from the clone's root, with this tree's code on ``PYTHONPATH``,
its own local Ray (under a temp dir of its own), the ephemeral Prefect API and the config default
``./runs-store``. Measured on the 2-core machine (2026-11-25, other jobs beside it): the demo 113 s.
"""

import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from rlcr.config import RLCRConfig
from rlcr.tracking import LOCAL_DB

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def quick_start() -> tuple[list[str], str]:
    """The quick start's command lines (comments dropped) and the whole section's text, from README.md."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Quick start' section"
    block = re.search(r"```bash\n(.*?)```", section.group(1), re.S)
    assert block, "README.md's quick start shows no ```bash block"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return [c for c in commands if c], section.group(1)


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):(?!=)", (ROOT / "Makefile").read_text(), re.M))


def test_the_quick_start_shows_the_makefiles_targets_and_the_demos_store():
    commands, section = quick_start()
    makes = [shlex.split(c) for c in commands if c.startswith("make")]
    assert all(len(m) == 2 and m[0] == "make" for m in makes), makes  # `make <target>`, nothing else
    assert [m[1] for m in makes] == ["demo", "test"]  # the two commands the section explains, in its order
    targets = makefile_targets()
    named = set(re.findall(r"`make ([\w-]+)`", section)) | {m[1] for m in makes}
    assert named <= targets, f"README's quick start names make targets the Makefile lacks: {named - targets}"
    # the third command opens the demo's MLflow database: the store the config defaults to, from the clone's root
    others = [shlex.split(c) for c in commands if not c.startswith("make")]
    assert len(others) == 1 and others[0][:2] == [".venv/bin/mlflow", "ui"], others
    store = dict(RLCRConfig.dotted_fields())["storage.uri"].default.removeprefix("./")
    assert others[0][2:] == ["--workers", "1", "--backend-store-uri", f"sqlite:///{store}/{LOCAL_DB}"]
    assert (VENV_BIN / "mlflow").exists() or not (VENV_BIN / "rlcr").exists()  # what `make setup` installs


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A clean ``git clone`` of this repository (its committed state), as a user would start."""
    if shutil.which("git") is None or shutil.which("make") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git, make and a git checkout")
    dest = tmp_path_factory.mktemp("clone") / "rlcr"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True, capture_output=True, timeout=120)
    assert not (dest / ".venv").exists()
    return dest


def dry_run(clone: Path, target: str) -> list[str]:
    # as a fresh shell runs it: not as a sub-make of CI's `make test` (MAKELEVEL/MAKEFLAGS would make it print
    # "make[1]: Entering/Leaving directory" lines around the commands)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    out = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=clone, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip() and not line.startswith("#")]
    return [line for line in lines if not line.startswith(" ")]  # a continued shell line belongs to the one above


# Every set-up step of a clean clone: create .venv, install into it (its own pip), check it, stamp it.
SETUP_STEP = re.compile(r"^(test -x \.venv/bin/python \|\| python3 -m venv \.venv|\.venv/bin/python -m pip .*"
                        r"|TORCH=\$\(grep -m1 -E '\^torch==' requirements/\w+\.txt\) && \{ \.venv/bin/python -m pip "
                        r"install .*"
                        r"|\.venv/bin/python -c \"import .*|touch \.venv/\.setup-done)$")


def test_a_clean_clone_installs_only_into_venv_then_runs_the_documented_command(clone):
    demo, test = dry_run(clone, "demo"), dry_run(clone, "test")
    demo_recipe = (clone / "Makefile").read_text().split("\ndemo:", 1)[1]
    assert demo[-1] == ".venv/bin/rlcr demo --config configs/demo.yaml" and demo[-1].split(" ", 1)[1] in demo_recipe
    assert test[-2:] == [".venv/bin/python -m ruff check .", ".venv/bin/python -m pytest -q"]  # the linter first
    for lines in (demo[:-1], test[:-2]):
        odd = [line for line in lines if not SETUP_STEP.match(line) and not line.startswith("command -v chromium")]
        assert not odd, f"a set-up step that is not an install into .venv: {odd}"
        assert any(" -m pip install " in line and "-e " in line for line in lines)  # the project itself
        assert "touch .venv/.setup-done" in lines
    assert demo[-2] == "touch .venv/.setup-done"
    assert test[-3].startswith("command -v chromium")  # then the page tests' browser (README), outside .venv
    assert not [line for line in demo if "chromium" in line or "apt-get" in line or "sudo" in line]
    # set up once, both run the documented command at once ("seconds afterwards")
    stamp = clone / ".venv" / ".setup-done"
    stamp.parent.mkdir()
    stamp.touch()
    try:
        assert dry_run(clone, "demo") == [".venv/bin/rlcr demo --config configs/demo.yaml"]
        assert dry_run(clone, "test")[-2:] == [".venv/bin/python -m ruff check .", ".venv/bin/python -m pytest -q"]
    finally:
        shutil.rmtree(clone / ".venv")


def tiny_demo_config(clone: Path, model: Path) -> Path:
    """configs/demo.yaml with the tiny model and a few tasks and tokens (the rest as the demo has it)."""
    cfg = yaml.safe_load((clone / "configs" / "demo.yaml").read_text())
    small = {"model.name": str(model), "run.iterations": 1, "tasks.num_train": 16, "tasks.num_eval": 4,
             "rollout.prompts_per_iteration": 2, "rollout.num_generations_answer": 2,
             "rollout.num_generations_confidence": 2, "rollout.max_answer_tokens": 16,
             "rollout.max_confidence_tokens": 8, "rollout.max_prompt_tokens": 256, "engine.max_model_len": 512,
             "engine.kv_cache_gib": 0.25, "rollout.batch_size": 8, "sft.tasks": 4, "sft.epochs": 1,
             "update.micro_batch_tokens": 4096, "orchestration.save_every": 1, "probe.forced_answer_tokens": 8}
    for dotted, value in small.items():
        section, name = dotted.split(".")
        cfg.setdefault(section, {})[name] = value
    path = clone / "configs" / "demo-tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_the_demo_command_runs_from_a_clean_clone(clone, tiny_model_dir):
    """``rlcr demo`` as ``make demo`` runs it (the venv's ``rlcr`` entry point, from the clone's root), on the tiny
    model: the five steps, the policies' table, ECE before and after, the probe's report, the times, and the MLflow
    database that the quick start's ``mlflow ui`` opens."""
    config = tiny_demo_config(clone, tiny_model_dir)
    rlcr = [str(VENV_BIN / "rlcr")] if (VENV_BIN / "rlcr").exists() else [sys.executable, "-m", "rlcr.cli"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "PREFECT_")) and k not in ("RLCR_CACHE", "PYTHONPATH")}
    with tempfile.TemporaryDirectory(prefix="rlcr-qs-", dir="/tmp") as tmp:  # short: Ray's socket paths
        env.update(PYTHONPATH=str(ROOT), RAY_TMPDIR=tmp, PREFECT_HOME=str(Path(tmp) / "prefect"),
                   RLCR_CACHE=str(Path(tmp) / "cache"), RLCR_RAY_DASHBOARD="0", COLUMNS="200",
                   PREFECT_SERVER_ANALYTICS_ENABLED="false", RAY_USAGE_STATS_ENABLED="0")
        proc = subprocess.run([*rlcr, "demo", "--config", str(config.relative_to(clone)), "--probe-tasks", "2",
                               "--probe-samples", "2", "--final-tasks", "8"], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    for step in ("1/6", "2/6", "3/6", "4/6", "5/6", "6/6"):
        assert step in out, f"step {step} not printed:\n{out[-3000:]}"
    assert "warm-start and RLCR on held-out tasks" in out and "after RLCR (1 it., 8 tasks)" in out
    assert re.search(r"ECE before RLCR \(after SFT\): \S+ +→ +after RLCR: \S+", out)
    # the before → after change on the larger held-out set, paired, with its interval per metric
    assert "after RLCR − after SFT: 8 shared held-out tasks" in out, out[-3000:]
    for k in ("accuracy", "ece", "brier", "auroc"):  # each metric's paired change, with whether it is resolved
        assert re.search(rf"^│ {k} +│.*│ (yes|no|–) +│$", out, re.M), out[-3000:]
    stored = list((clone / "runs-store" / "runs" / "demo" / "final-eval").glob("*/summary.json"))
    assert len(stored) == 1 and {p.name for p in stored[0].parent.iterdir()} == {"summary.json", "before.parquet",
                                                                                 "after.parquet"}
    report = re.search(r"probe report: (\S+\.html)", out)
    assert report and Path(report.group(1) if report.group(1).startswith("/")
                           else clone / report.group(1)).exists(), out[-2000:]
    assert re.search(r"^time: prepare .*; total \d+\.\d min$", out, re.M), out[-1000:]
    db = clone / "runs-store" / LOCAL_DB  # the quick start's `mlflow ui --backend-store-uri sqlite:///runs-store/…`
    with sqlite3.connect(db) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM runs")}
    assert "demo" in names
