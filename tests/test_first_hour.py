"""What a new user meets in their first hour (issue 77): help texts that name the real options, set-up commands
that work as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_serve_help_names_the_config_field_it_defaults_to():
    """``flows.serve --help`` said ``probe_cron``, a field name from before the config was grouped."""
    out = subprocess.run([sys.executable, "-m", "flows.serve", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    assert "--probe-cron" in out and "probe.cron" in out and "probe_cron" not in out


def test_the_readmes_mlflow_command_runs_one_worker():
    """``mlflow ui`` starts 4 workers by default; on a loaded 2-core machine the page died until ``--workers 1``."""
    line = next(x for x in (ROOT / "README.md").read_text().splitlines() if "mlflow ui" in x and x.startswith("."))
    assert re.search(r"mlflow ui .*--workers 1\b", line), line


def _config_show(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", "config", "show", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = [x for x in (res.stdout + res.stderr).splitlines() if x.strip()]
    return line


def test_a_task_option_typo_is_attributed_to_where_it_was_set(tmp_path):
    """A typo on the command line was blamed on the config file ("… in the config file"), with a stray
    "did you mean 'tasks.options'" after the task's own, right, suggestion."""
    line = _config_show("--config", "configs/tiny.yaml", "tasks.options.max_lne=3")
    assert "set on the command line: tasks.options.max_lne=3" in line and "in the config file" not in line
    assert line.count("did you mean") == 1 and "'tasks.options.max_count'" in line
    typo = tmp_path / "typo.yaml"
    typo.write_text("tasks:\n  options:\n    max_lne: 3\n")
    line = _config_show("--config", str(typo))
    assert line.endswith("in the config file") and "command line" not in line and line.count("did you mean") == 1


def test_sft_on_a_task_without_warm_start_names_the_method(tmp_path):
    """``rlcr sft`` on a task with no ``warm_start`` was a traceback that did not name the method; now one line,
    exit 2, before any work (the example package's task, which has none)."""
    task_file = tmp_path / "nows_task.py"
    task_file.write_text("from rlcr.tasks.base import register_task\nfrom rlcr_sumlist.task import SumList\n\n\n"
                         "@register_task('sumlist')\nclass Registered(SumList):\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'examples' / 'sumlist'}{os.pathsep}{ROOT}"}
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", "sft", "--config", str(ROOT / "configs" / "tiny.yaml"),
                          "tasks.name=sumlist", f"tasks.module={task_file}", "model.name=tiny",
                          f"storage.uri={tmp_path / 'store'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    lines = [x for x in (res.stdout + res.stderr).splitlines() if x.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stdout + res.stderr
    assert "warm_start" in lines[0] and "'sumlist'" in lines[0]
    assert not (tmp_path / "store").exists()
