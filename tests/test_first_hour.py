"""What a new user meets in their first hour (issue 77): help texts that name the real options, set-up commands
that work as written."""

from __future__ import annotations

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
