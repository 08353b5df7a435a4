"""Tasks from outside rlcr (issue 47): found through an entry point or ``tasks.module`` in every process, their own
settings (``tasks.options``), a bounded verifier for any task, and the worked example package ``examples/sumlist``
built as a wheel, installed into a temporary layer and run through the CLI (train, eval, compare, probe)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcr.config import ConfigError, RLCRConfig, result_changing_diff
from rlcr.tasks import registry
from rlcr.tasks.base import TASKS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sumlist"

TASK_SOURCE = '''
from rlcr.tasks.base import Task, TaskOptions, register_task


class Opts(TaskOptions):
    width: int = 3
    """How wide."""


@register_task("{name}")
class T(Task):
    Options = Opts

    def load(self, path, fields=None):
        return []

    def identity(self, p):
        return p

    def stratum(self, p):
        return 0

    def to_record(self, p):
        return {{"x": p}}

    def from_record(self, r):
        return r["x"]

    def user_text(self, p):
        return str(p)

    def score(self, completion, p, *, format_score, score=1.0):
        return score
'''


def BoundedVerifier(*args, **kwargs):
    from rlcr.tasks.verify import BoundedVerifier as verifier

    return verifier(*args, **kwargs)


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry as a new process finds it: entry points not loaded yet; tasks registered here removed after."""
    before = dict(TASKS)
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(registry, "_LOOKED", {})
    yield
    for name in set(TASKS) - set(before):
        TASKS.pop(name)
        registry._INSTANCES.pop(name, None)


def _package(root: Path, module: str, task: str, entry: str) -> None:
    """An installed distribution in ``root`` (a sys.path entry): the module and its dist-info with an entry point."""
    (root / f"{module}.py").write_text(TASK_SOURCE.format(name=task))
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[rlcr.tasks]\n{task} = {entry}\n")


# ----------------------------------------------------------------------------- item 1: tasks from outside rlcr


def test_a_task_of_an_installed_package_is_found_through_its_entry_point(tmp_path, monkeypatch, fresh_registry):
    _package(tmp_path, "ep_tasks", "eptask", "ep_tasks:T")
    _package(tmp_path, "broken_tasks", "broken", "broken_tasks_missing:T")  # a broken plugin breaks nothing
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = RLCRConfig(tasks={"name": "eptask", "options": {"width": 5}})
    assert cfg.tasks.options == {"width": 5}
    assert registry.get_task("eptask").name == "eptask"
    assert "eptask" in registry.task_names() and "broken" not in registry.task_names()
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_dict({"tasks.name": "broken"})
    line = str(e.value)
    assert "\n" not in line and "unknown task 'broken'" in line and "eptask" in line
    assert "entry points 'rlcr.tasks': " in line and "eptask" in line
    assert "broken (failed: ModuleNotFoundError: No module named 'broken_tasks_missing')" in line


def test_tasks_module_is_imported_before_the_task_is_looked_up(tmp_path, monkeypatch, fresh_registry):
    path = tmp_path / "my_file_task.py"
    path.write_text(TASK_SOURCE.format(name="filetask"))
    cfg = RLCRConfig.from_dict({"tasks.name": "filetask", "tasks.module": str(path)})
    assert registry.get_task("filetask").options(cfg).width == 3
    (tmp_path / "pkg_tasks").mkdir()
    (tmp_path / "pkg_tasks" / "__init__.py").write_text("")
    (tmp_path / "pkg_tasks" / "mine.py").write_text(TASK_SOURCE.format(name="dottedtask"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert RLCRConfig(tasks={"name": "dottedtask", "module": "pkg_tasks.mine"}).tasks.module == "pkg_tasks.mine"
    assert registry.plugin_modules("dottedtask") == ["dottedtask=pkg_tasks.mine:T"]
    assert registry.plugin_modules("math") == []
    for module, words in [("pkg_tasks.nope", "No module named 'pkg_tasks.nope'"),
                          (str(tmp_path / "absent.py"), "No module named 'absent'")]:
        with pytest.raises(ConfigError) as e:
            RLCRConfig.from_dict({"tasks.name": "dottedtask", "tasks.module": module})
        assert "\n" not in str(e.value) and "tasks.module" in str(e.value) and words in str(e.value)


def test_a_fresh_process_finds_the_task_as_a_ray_worker_would(tmp_path):
    """A worker validates the config it is given (``tasks.module``), or imports ``$RLCR_TASK_MODULES`` on a miss
    (what :func:`rlcr.runs.cluster.ensure_ray` puts in the Ray runtime environment)."""
    path = tmp_path / "worker_task.py"
    path.write_text(TASK_SOURCE.format(name="workertask"))
    cfg = RLCRConfig.from_dict({"tasks.name": "workertask", "tasks.module": str(path)})
    code = ("import json, sys; from rlcr.config import RLCRConfig; from rlcr.tasks.registry import get_task; "
            "cfg = RLCRConfig.model_validate(json.loads(sys.argv[1])); print(get_task(cfg.tasks.name).name)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code, cfg.model_dump_json()], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split() == ["workertask"], out.stderr[-2000:]
    code = "from rlcr.tasks.registry import get_task; print(get_task('workertask').name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "RLCR_TASK_MODULES": "workertask=worker_task:T",
                              "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])})
    assert out.stdout.split() == ["workertask"], out.stderr[-2000:]
    from rlcr.runs.cluster import task_runtime_env

    assert task_runtime_env(RLCRConfig(), ship=True) == {}  # a built-in task: nothing to carry
    env_of = task_runtime_env(cfg, ship=True)
    assert env_of == {"env_vars": {"RLCR_TASK_MODULES": "workertask=worker_task:T"}, "py_modules": [str(path)]}


def test_an_unknown_task_is_one_line_exit_2_naming_where_rlcr_looked(tmp_path):
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", "train", "--run-id", "x", f"storage.uri={tmp_path}",
                          "tasks.name=sumlist2"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "unknown task 'sumlist2'; registered: countdown" in lines[0]
    assert "entry points 'rlcr.tasks'" in lines[0] and "tasks.module: not set" in lines[0]
    assert not list(tmp_path.iterdir())  # refused before anything was written (Ray, Prefect, the store)


# ----------------------------------------------------------------------------- item 2: the task's own settings


def test_task_options_are_validated_by_the_tasks_model_and_old_names_answered():
    cfg = RLCRConfig.from_yaml(None, ["tasks.options.min_count=2", "tasks.options.max_count=3"])
    assert cfg.tasks.options == {"min_count": 2, "max_count": 3, "num_range": [1, 20], "target_range": [1, 100]}
    for override, words in [
        ("tasks.options.min_cuont=2", "unknown field 'tasks.options.min_cuont' of task 'countdown'; did you mean "
                                      "'tasks.options.min_count'"),
        ("tasks.options.min_count=two", "field 'tasks.options.min_count': Input should be a valid integer"),
        ("tasks.options.min_count=5", "tasks.options.min_count must be <= tasks.options.max_count"),
        ("tasks.min_count=2", "'tasks.min_count' is now 'tasks.options.min_count'"),
    ]:
        with pytest.raises(ConfigError) as e:
            RLCRConfig.from_yaml(None, [override])
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="unknown field 'tasks.options.min_count' of task 'math'"):
        RLCRConfig.from_dict({"tasks": {"name": "math", "options": {"min_count": 2}}})
    assert RLCRConfig(tasks={"name": "math"}).tasks.options == {}
    # a config dumped and given another task (what the flow does with overrides): that task's options
    switched = RLCRConfig.from_dict({**RLCRConfig().model_dump(), "tasks.name": "math"})
    assert switched.tasks.name == "math" and switched.tasks.options == {}
    again = RLCRConfig.from_dict({**switched.model_dump(), "tasks.name": "countdown", "tasks.options.max_count": 5})
    assert again.tasks.options == {"min_count": 3, "max_count": 5, "num_range": [1, 20], "target_range": [1, 100]}


def test_config_show_lists_the_tasks_options_with_their_docs():
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", "config", "show", "--json", "--config",
                          str(ROOT / "configs" / "demo.yaml"), "tasks.options.max_count=4"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["field"]: r for r in json.loads(res.stdout)}
    assert rows["tasks.options.min_count"]["value"] == 2 and rows["tasks.options.min_count"]["set_by"] == "file"
    assert rows["tasks.options.max_count"]["set_by"] == "command line"
    assert rows["tasks.options.num_range"]["doc"] == "Inclusive range of the numbers of generated tasks."
    assert all(rows[f"tasks.options.{k}"]["changes_results"] for k in ("min_count", "max_count", "target_range"))


def test_options_are_stored_with_the_run_and_part_of_the_resume_diff(tmp_path):
    from rlcr.runs.store import RunConfigMismatch, RunStore

    cfg = RLCRConfig(storage={"uri": str(tmp_path)}, tasks={"options": {"max_count": 5}})
    run = RunStore.open(cfg, "opts")
    run.check_config(cfg)
    stored = json.loads((tmp_path / "runs" / "opts" / "config.json").read_text())["config"]
    assert stored["tasks"]["options"]["max_count"] == 5
    other = cfg.model_copy(update={"tasks.options": {**cfg.tasks.options, "max_count": 6}})
    assert result_changing_diff(stored, other) == ["tasks.options.max_count"]
    with pytest.raises(RunConfigMismatch, match=r"tasks.options.max_count: 5 → 6"):
        run.check_config(other)
    # a run stored before the options moved (tasks.min_count …) resumes with the same settings
    old = {**stored, "tasks": {k: v for k, v in stored["tasks"].items() if k not in ("options", "module")}}
    old["tasks"].update(min_count=3, max_count=5, num_range=[1, 20], target_range=[1, 100])
    assert result_changing_diff(old, cfg) == []
    assert result_changing_diff(old, other) == ["tasks.options.max_count"]


# ----------------------------------------------------------------------------- item 3: a bounded verifier


def test_a_bounded_verifier_answers_and_caches_decided_results():
    verify = BoundedVerifier("plugin_verifiers:same", timeout_s=2.0)
    with verify.scoring(3) as stats:
        assert verify("42", 42) is True and verify(" 41", 42) is False and verify("42", 42) is True
    assert stats.timeouts == 0 and verify.restarts == 0
    assert BoundedVerifier("plugin_verifiers:raises")("1", 1) is None  # a bug: None, not a timeout
    with pytest.raises(ValueError, match="module:function"):
        BoundedVerifier("plugin_verifiers.same")


@pytest.mark.parametrize("function", ["sleep_forever", "spin_in_c", "allocate"])
def test_a_hostile_verifier_cannot_stall_or_poison_scoring(function):
    verify = BoundedVerifier(f"plugin_verifiers:{function}", timeout_s=0.5, memory_bytes=512 * 1024**2,
                             batch_base_s=4.0, batch_per_call_s=0.0)
    t0 = time.monotonic()
    with verify.scoring(20) as stats:
        results = [verify(str(k), k) for k in range(20)]
    took = time.monotonic() - t0
    assert results == [None] * 20 and took < 30  # the batch's budget, not 20 stalls (bounds, not a timing)
    if function == "allocate":  # out of memory (an error: the worker lives on) or out of time
        assert verify("1", 1) is None
    else:
        assert stats.timeouts == 20  # its timer fired, or (spin_in_c) it was killed past the deadline
    if function == "spin_in_c":
        assert verify.restarts >= 1  # a computation the timer cannot stop: killed, and the next call restarted it


def test_a_timeout_is_never_cached(tmp_path):
    flag = tmp_path / "flag"
    verify = BoundedVerifier("plugin_verifiers:slow_once", timeout_s=0.3)
    with verify.scoring(1) as stats:
        assert verify(str(flag), 1) is None
    assert stats.timeouts == 1
    flag.write_text("now")
    with verify.scoring(1) as stats:
        assert verify(str(flag), 1) is True  # asked again, not the timeout's answer
    assert stats.timeouts == 0


# ----------------------------------------------------------------------------- item 4: the example package


def _install_example(tmp_path: Path) -> Path:
    """examples/sumlist built as a wheel (offline, this venv's setuptools) and installed into a new directory:
    the temporary environment layer (returned), not the source tree."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w",
                    str(tmp_path / "wheel"), str(src)], check=True, timeout=300, capture_output=True)
    (wheel,) = (tmp_path / "wheel").glob("rlcr_sumlist-*.whl")
    layer = tmp_path / "layer"
    subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", "--target", str(layer), str(wheel)],
                   check=True, timeout=300, capture_output=True)
    assert (layer / "rlcr_sumlist" / "task.py").exists() and list(layer.glob("rlcr_sumlist-*.dist-info"))
    return layer


def _rlcr(args: list[str], env: dict, cwd: Path, timeout_s: float = 900) -> str:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", *args], env=env, cwd=cwd, capture_output=True,
                         text=True, timeout=timeout_s)
    assert res.returncode == 0, f"rlcr {' '.join(args[:2])}: {res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    print(f"rlcr {args[0]}: {time.perf_counter() - t0:.1f} s")
    return res.stdout


def test_a_task_package_installed_as_a_wheel_trains_evaluates_compares_and_probes(
        tmp_path, tiny_model_dir, ray_local, prefect_harness):
    """No file of rlcr names the task: the wheel's entry point does. The CLI's processes attach to the session's
    Ray (``RAY_ADDRESS``), whose workers do not have the layer on their path: the task's code reaches them in the
    runtime environment (``py_modules``), and its own tests pass against the installed package."""
    from prefect.settings import PREFECT_API_URL

    layer = _install_example(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(layer)]),
           "PREFECT_API_URL": PREFECT_API_URL.value(), "RAY_ADDRESS": ray_local.get_runtime_context().gcs_address}
    args = ["--config", str(ROOT / "configs" / "tiny.yaml"), f"storage.uri={tmp_path / 'store'}",
            f"model.name={tiny_model_dir}", "tasks.name=sumlist", "tasks.options.max_len=3", "run.iterations=1",
            "rollout.prompts_per_iteration=2", "tasks.num_eval=4", "eval.samples=1"]
    out = _rlcr(["train", "--run-id", "sums", *args], env, tmp_path)
    assert "sums" in out
    _rlcr(["eval", "--records", str(tmp_path / "a.parquet"), *args], env, tmp_path)
    out = _rlcr(["compare", "sums@latest", "sums@0", "--config", str(ROOT / "configs" / "tiny.yaml"),
                 f"storage.uri={tmp_path / 'store'}"], env, tmp_path)
    assert "accuracy" in out.lower() and "(A at iteration 1, B at iteration 0)" in " ".join(out.split())
    out = _rlcr(["probe", "--run-id", "sums", *args], env, tmp_path)
    stored = json.loads((tmp_path / "store" / "runs" / "sums" / "config.json").read_text())["config"]
    assert stored["tasks"]["name"] == "sumlist" and stored["tasks"]["options"] == {"min_len": 2, "max_len": 3,
                                                                                  "max_value": 20}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout[-3000:]
