"""The set-up each README command runs: `make demo` needs no root (no Debian packages), `make test` brings
the headless Chromium its page tests use. Checked on make's dry run of every recipe (``-n -B``)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dry_run(target: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-B", target, "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_demo_installs_no_system_packages():
    recipe = dry_run("demo")
    assert "pip install" in recipe  # it does set up the Python environment
    assert "apt-get" not in recipe and "sudo" not in recipe and "chromium" not in recipe


def test_make_test_installs_chromium_for_the_page_tests():
    recipe = dry_run("test")
    assert "apt-get" in recipe and "chromium" in recipe
    assert "pytest" in recipe


def test_one_storage_default_everywhere():
    """The config default, the shipped local configs, the notebook and the README name the same store."""
    import json

    import yaml

    from rlcr.config import RLCRConfig

    default = dict(RLCRConfig.dotted_fields())["storage.uri"].default
    assert default == "./runs-store"
    for name in ("demo", "tiny", "methods"):
        assert yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())["storage"]["uri"] == default, name
    nb = json.loads((ROOT / "notebooks" / "explore.ipynb").read_text())
    assert f'STORAGE_URI = os.environ.get("STORE") or "{default}"' in "".join(nb["cells"][1]["source"])
    assert "./runs-store" in (ROOT / "README.md").read_text()
