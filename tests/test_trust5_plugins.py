"""Plugin loading of the task registry against hostile or careless plugins: a module that exits, interrupts or
never returns at import, a namespace-package task shipped to a cluster, a task file named like another module,
and the refusal's list of built-in tasks (docs/tasks.md, "How rlcr finds it")."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlcr.config import ConfigError, RLCRConfig
from rlcr.tasks import registry
from rlcr.tasks.base import TASKS

ROOT = Path(__file__).resolve().parents[1]

TASK_SOURCE = '''
from rlcr.tasks.base import Task, register_task


@register_task("{name}")
class T(Task):
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

HOSTILE = {  # module source run at import
    "exits_zero": "raise SystemExit(0)\n",
    "parses_argv": "import argparse\nargparse.ArgumentParser().parse_args(['--no-such-flag'])\n",
    "interrupts": "raise KeyboardInterrupt\n",
    "hard_exit": "import os\nos._exit(0)\n",
}


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry as a new process finds it; tasks registered here removed after."""
    before = dict(TASKS)
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(registry, "_LOOKED", {})
    yield
    for name in set(TASKS) - set(before):
        TASKS.pop(name)
        registry._INSTANCES.pop(name, None)


def _dist(root: Path, module: str, source: str, entry: str) -> None:
    """An installed distribution in ``root`` (a sys.path entry): the module and a dist-info whose entry point of
    group ``rlcr.tasks`` is ``entry`` (``name = module:attr``)."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[rlcr.tasks]\n{entry}\n")


def _cli(args: list[str], env: dict, cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlcr.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout_s, env={**os.environ, **env})


def _one_line(res: subprocess.CompletedProcess) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    return lines[0]


def test_plugins_that_exit_at_import_do_not_end_the_cli(tmp_path):
    """Item 10, installed plugins that exit at import, next to a working one. Before, ``rlcr config show
    tasks.name=goodplug``, ``rlcr train tasks.name=goodplug`` and ``rlcr train tasks.name=<a miss>`` ended with
    the first such plugin's import: exit 0 and no output (``SystemExit(0)``, ``os._exit(0)``); now they are
    skipped, the working plugin's task is found, and a miss is one line, exit 2, naming each broken plugin and
    what it did."""
    layer = tmp_path / "layer"
    layer.mkdir()
    _dist(layer, "good_plug", TASK_SOURCE.format(name="goodplug"), "goodplug = good_plug:T")
    for module in ("exits_zero", "hard_exit"):
        _dist(layer, module, HOSTILE[module], f"{module} = {module}:T")
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(layer)])}
    res = _cli(["config", "show", "--json", "tasks.name=goodplug"], env, tmp_path)
    assert res.returncode == 0 and '"goodplug"' in res.stdout, (res.stdout[-2000:], res.stderr[-3000:])
    # train finds the task and stops at its check (tests/test_first_hour.py): this test task has no generator
    line = _one_line(_cli(["train", "--run-id", "x", f"storage.uri={tmp_path / 'store'}", "tasks.name=goodplug"], env,
                          tmp_path))
    assert line.startswith("error: task 'goodplug': candidates:") and "no generator" in line, line
    res = _cli(["train", "--run-id", "x", f"storage.uri={tmp_path / 'store'}", "tasks.name=missing"], env, tmp_path)
    line = _one_line(res)
    assert "unknown task 'missing'; registered: countdown, file, goodplug, math, qa, reasoning_gym" in line
    assert "exits_zero (failed: SystemExit raised at import: 0)" in line, line
    assert "hard_exit (failed: it ended its process at import (exit code 0))" in line, line
    assert not (tmp_path / "store").exists()


def test_each_broken_entry_point_is_named_and_the_working_one_found(tmp_path, monkeypatch, fresh_registry):
    """Item 10, in rlcr's own process: plugins that exit (``sys.exit``, argparse at import, ``os._exit``) or raise
    KeyboardInterrupt at import are skipped, each named with what it raised; before, the first of them ended the
    process (or raised KeyboardInterrupt out of the lookup)."""
    for module, source in HOSTILE.items():
        _dist(tmp_path, module, source, f"{module} = {module}:T")
    _dist(tmp_path, "good_plug2", TASK_SOURCE.format(name="goodplug2"), "goodplug2 = good_plug2:T")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as e:
        registry.task_class("missing")
    line = str(e.value)
    assert "\n" not in line and "registered: countdown, file, goodplug2, math, qa, reasoning_gym" in line
    for words in ["exits_zero (failed: SystemExit raised at import: 0)",
                  "parses_argv (failed: SystemExit raised at import: 2)",
                  "interrupts (failed: KeyboardInterrupt raised at import)",
                  "hard_exit (failed: it ended its process at import (exit code 0))"]:
        assert words in line, line
    assert registry.get_task("goodplug2").name == "goodplug2"
    assert not set(HOSTILE) & set(sys.modules)


def test_a_module_that_exits_at_import_named_by_tasks_module_or_the_environment_is_refused(tmp_path):
    """Item 10, the same through ``tasks.module`` (a file, a module name) and ``$RLCR_TASK_MODULES``: before, rlcr
    ended with exit 0 and no output; now a one-line refusal, exit 2, naming the module and what it raised."""
    (tmp_path / "exits_at_import.py").write_text(HOSTILE["exits_zero"])
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    store = f"storage.uri={tmp_path / 'store'}"
    for module in [str(tmp_path / "exits_at_import.py"), "exits_at_import"]:
        line = _one_line(_cli(["train", "--run-id", "x", store, "tasks.name=sometask", f"tasks.module={module}"],
                              env, tmp_path))
        assert f"tasks.module '{module}': cannot import it (SystemExit raised at import: 0)" in line, line
    res = _cli(["train", "--run-id", "x", store, "tasks.name=sometask"],
               {**env, registry.MODULES_ENV: "sometask=exits_at_import:T"}, tmp_path)
    line = _one_line(res)
    assert "unknown task 'sometask'" in line
    assert "$RLCR_TASK_MODULES 'exits_at_import': failed: SystemExit raised at import: 0" in line, line
    assert not (tmp_path / "store").exists()


def test_the_in_process_import_refuses_a_module_that_exits_but_passes_the_users_ctrl_c(
        tmp_path, monkeypatch, fresh_registry):
    """Item 10, the guard of the import in rlcr's own process (here without the probe process, as in a probe
    itself): a SystemExit or a KeyboardInterrupt raised by the module's code is a refusal naming the module;
    before, it propagated out of the config's validation and ended the process. A SIGINT arriving meanwhile (the
    user's Ctrl-C) still interrupts."""
    monkeypatch.setenv("RLCR_TASK_IMPORT_PROBE", "1")  # what a probe process sets: import in this process directly
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    for module in ("exits_zero", "interrupts"):
        path = tmp_path / f"{module}_mod.py"
        path.write_text(HOSTILE[module])
        with pytest.raises(ConfigError) as e:
            RLCRConfig.from_dict({"tasks.name": "countdown", "tasks.module": str(path)})
        kind = "SystemExit" if module == "exits_zero" else "KeyboardInterrupt"
        assert "\n" not in str(e.value) and f"cannot import it ({kind} raised at import" in str(e.value)
        assert f"{module}_mod" not in sys.modules
    path = tmp_path / "ctrl_c_mod.py"
    path.write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n")
    with pytest.raises(KeyboardInterrupt):
        registry.import_task_module(str(path))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # rlcr's own handler is gone


def test_a_plugin_whose_import_never_returns_bounds_every_lookup(tmp_path):
    """Item 10, an import that never returns. Before, every task-name miss (and every name of an entry point
    loaded after it) hung for good; now each plugin is first imported in a probe process killed past
    ``$RLCR_TASK_IMPORT_TIMEOUT_S``, the working plugin's task is found without importing the hanging one, a miss
    is refused naming it, and nothing the probe started is left running."""
    layer = tmp_path / "layer"
    layer.mkdir()
    pid_file = tmp_path / "pid"
    _dist(layer, "hangs_plug", f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                               "while True:\n    time.sleep(1)\n", "hangs = hangs_plug:T")
    _dist(layer, "good_plug", TASK_SOURCE.format(name="goodplug"), "goodplug = good_plug:T")
    code = textwrap.dedent("""
        import sys
        from rlcr.tasks.registry import get_task
        print(get_task(sys.argv[1]).name)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(layer)]), "RLCR_TASK_IMPORT_TIMEOUT_S": "3"}
    t0 = time.monotonic()
    found = subprocess.run([sys.executable, "-c", code, "goodplug"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert found.stdout.split() == ["goodplug"] and not pid_file.exists(), found.stderr[-3000:]
    missed = subprocess.run([sys.executable, "-c", code, "missing"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert time.monotonic() - t0 < 60  # bounded (the probe's bound is 3 s), not a hang
    assert "hangs (failed: its import did not finish within 3 s" in missed.stderr, missed.stderr[-3000:]
    assert "goodplug" in missed.stderr and "unknown task 'missing'" in missed.stderr
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # the probe was killed with its process group
        os.kill(pid, 0)


def test_a_namespace_package_task_is_carried_to_the_cluster(tmp_path, monkeypatch, fresh_registry):
    """Item 10, a task in a namespace package (no ``__init__.py``) with ``RAY_ADDRESS`` set: the runtime
    environment carries its package's directory. Before, ``task_runtime_env`` built ``Path(None)`` from the
    package's missing ``__file__`` and ``rlcr train`` ended in a TypeError traceback."""
    from rlcr.runs.cluster import task_runtime_env

    (tmp_path / "ns_tasks").mkdir()
    (tmp_path / "ns_tasks" / "mine.py").write_text(TASK_SOURCE.format(name="nstask"))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = RLCRConfig(tasks={"name": "nstask", "module": "ns_tasks.mine"})
    assert getattr(sys.modules["ns_tasks"], "__file__", None) is None  # a namespace package
    env = task_runtime_env(cfg, ship=True)
    assert env == {"env_vars": {registry.MODULES_ENV: "nstask=ns_tasks.mine:T"},
                   "py_modules": [str(tmp_path / "ns_tasks")]}
    sys.modules.pop("ns_tasks.mine")
    sys.modules.pop("ns_tasks")


def test_a_task_file_named_like_another_module_is_refused_naming_the_clash(tmp_path, fresh_registry):
    """Item 10, ``tasks.module: ./fractions.py``. Before, the file was never run (the standard library's
    ``fractions``, already imported, was taken for it) and the refusal said the task was unknown, with
    ``tasks.module …: imported``; now one line names the clash and the fix. A file named like a standard
    module not imported yet (``tabnanny.py``) is refused too: imported under that name it would replace it."""
    import fractions  # noqa: F401  (imported in any rlcr process; made sure of here)

    for stem, words in [("fractions", "'fractions' is the module 'fractions' already imported ("),
                        ("tabnanny", "'tabnanny' is the module 'tabnanny' at ")]:
        path = tmp_path / f"{stem}.py"
        path.write_text(TASK_SOURCE.format(name=f"{stem}task"))
        with pytest.raises(ConfigError) as e:
            RLCRConfig.from_dict({"tasks.name": f"{stem}task", "tasks.module": str(path)})
        line = str(e.value)
        assert "\n" not in line and f"tasks.module '{path}': cannot import it (a file is imported under its name" \
            in line and words in line and "rename the file" in line, line
        assert f"{stem}task" not in TASKS
    assert "tabnanny" not in sys.modules
    mine = tmp_path / "my_fractions.py"  # the fix the refusal names
    mine.write_text(TASK_SOURCE.format(name="fractask"))
    copies = tmp_path / "py_modules_copy"  # a worker's path on the driver's node: a copy of the file, no clash
    copies.mkdir()
    (copies / mine.name).write_bytes(mine.read_bytes())
    sys.path.insert(0, str(copies))
    try:
        assert RLCRConfig.from_dict({"tasks.name": "fractask", "tasks.module": str(mine)}).tasks.name == "fractask"
    finally:
        sys.path.remove(str(copies))
        sys.modules.pop("my_fractions", None)


def test_the_refusal_lists_every_built_in_task(fresh_registry):
    """The refusal of an unknown name lists the built-in tasks derived from the registry; before, it said
    ``built-in (countdown, math)``, leaving out ``qa``."""
    with pytest.raises(ValueError) as e:
        registry.task_class("no_such_task")
    builtin = sorted(n for n, cls in TASKS.items() if cls.__module__.startswith("rlcr."))
    assert {"countdown", "math", "qa"} <= set(builtin)
    assert f"(looked in: built-in ({', '.join(builtin)});" in str(e.value), str(e.value)
