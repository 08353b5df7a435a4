"""Tasks by name (docs/tasks.md): the built-in tasks, the tasks of installed packages and the task module a
config names.

:func:`rlcr.tasks.base.register_task` fills :data:`rlcr.tasks.base.TASKS`. This module imports the built-in
task modules, and finds the tasks from outside rlcr (issue 47):

* an **entry point** of group ``rlcr.tasks`` of any installed package (``sumlist = "rlcr_sumlist:SumList"``:
  a :class:`~rlcr.tasks.base.Task` subclass, registered under the entry point's name unless it registered
  itself; or a module, whose import registers its tasks);
* the **task module** of a config, ``tasks.module``: a dotted module name or the path of a ``.py`` file,
  imported when the config is validated (in the driver and in every Ray worker, which validates the config
  it is given);
* the tasks listed in ``$RLCR_TASK_MODULES`` (comma-separated ``name=module:Class``): set by
  :func:`rlcr.runs.cluster.ensure_ray` in the Ray runtime environment, so a worker on any node imports the run's
  task module before it looks the task up (on a cluster the module's code travels in the runtime environment's
  ``py_modules``).

:func:`get_task` loads them on a miss, in any process, before it refuses a name (the entry point and the
``$RLCR_TASK_MODULES`` entry of that very name first, the others only if they do not register it); the
refusal is one line naming the registered tasks and where rlcr looked.

A plugin is code rlcr does not control, so its import is guarded: before a module is imported here it is
imported once in a probe process of its own (:func:`_probe`), which is killed past
``$RLCR_TASK_IMPORT_TIMEOUT_S`` (default :data:`IMPORT_TIMEOUT_S`); only a module that imported there is
imported in this process. A module that raises anything at import, ``SystemExit`` and ``KeyboardInterrupt``
included, is a broken plugin: refused in one line naming it and where it came from, never the end of rlcr. A
Ctrl-C of the user (a SIGINT arriving while the import runs in the main thread) still interrupts rlcr.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import rlcr.tasks.countdown_task  # noqa: F401  (registers "countdown")
import rlcr.tasks.file_task  # noqa: F401  (registers "file")
import rlcr.tasks.math  # noqa: F401  (registers "math")
import rlcr.tasks.qa  # noqa: F401  (registers "qa")
import rlcr.tasks.reasoning_gym_task  # noqa: F401  (registers "reasoning_gym"; reasoning-gym is imported on use)
from rlcr.tasks.base import TASKS, Task, register_task
from rlcr.untrusted import printable

__all__ = ["get_task", "task_names", "builtin_task_names", "task_class", "load_task_plugins", "import_task_module",
           "where_looked", "plugin_modules", "ENTRY_POINT_GROUP", "MODULES_ENV", "IMPORT_TIMEOUT_ENV",
           "IMPORT_TIMEOUT_S"]

ENTRY_POINT_GROUP = "rlcr.tasks"
"""The entry point group of tasks from installed packages."""
MODULES_ENV = "RLCR_TASK_MODULES"
"""Environment variable: comma-separated task modules a process imports before it refuses a task name."""
IMPORT_TIMEOUT_ENV = "RLCR_TASK_IMPORT_TIMEOUT_S"
"""Environment variable: seconds a plugin module may take to import in its probe process."""
IMPORT_TIMEOUT_S = 60.0
"""Default of ``$RLCR_TASK_IMPORT_TIMEOUT_S``: room for a plugin that imports a large library at import, a bound
for one that never returns (every probe of one lookup shares it: they run side by side)."""
_PROBE_ENV = "RLCR_TASK_IMPORT_PROBE"  # set in a probe process: the plugins its module imports are not probed again
_ENTRY_POINTS_KEY = f"entry points '{ENTRY_POINT_GROUP}'"

_INSTANCES: dict[str, Task] = {}
_LOOKED: dict[str, Any] = {}  # where rlcr looked → what it found there (for the refusal's line)
_ENTRY_POINTS_LOADED = False

# The probe: imports one module (by name, or a file under a name) and writes what happened as JSON to the fd that
# was its stdout, while the module's own output goes to stderr (discarded). os._exit: threads or atexit hooks the
# module started cannot hold the probe open past its answer.
_PROBE_CODE = r"""
import importlib, importlib.util, json, os, sys
request = json.loads(sys.stdin.read())
sys.path[:] = request["path"]
answer = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
error = None
try:
    if request["file"] is None:
        importlib.import_module(request["name"])
    else:
        spec = importlib.util.spec_from_file_location(request["name"], request["file"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[request["name"]] = module
        spec.loader.exec_module(module)
except BaseException as e:
    try:
        text = str(e.code) if isinstance(e, SystemExit) else str(e)
    except BaseException:
        text = "?"
    error = [type(e).__name__, text[:300]]
answer.write(json.dumps({"error": error}))
answer.flush()
os._exit(0)
"""


class _Refused(Exception):
    """A plugin module that cannot be used; the message is one line (without the module's name)."""


def task_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(TASKS)


def builtin_task_names() -> list[str]:
    """The names of rlcr's own tasks (those whose class lives in ``rlcr``), sorted."""
    return sorted(n for n, cls in TASKS.items() if cls.__module__.split(".")[0] == "rlcr")


def _short(e: BaseException) -> str:
    """An exception as one bounded line; a ``SystemExit`` or ``KeyboardInterrupt`` says it was raised at import."""
    return _describe(type(e).__name__, e.code if isinstance(e, SystemExit) else e)


def _describe(kind: str, text: Any) -> str:
    where = " raised at import" if kind in ("SystemExit", "KeyboardInterrupt") else ""
    try:
        text = str(text)
    except Exception:  # noqa: BLE001  (a plugin's exception whose text fails)
        text = "?"
    return printable(f"{kind}{where}: {text}" if text else f"{kind}{where}", 160)


def _import_timeout() -> float:
    """``$RLCR_TASK_IMPORT_TIMEOUT_S`` (a positive number), or :data:`IMPORT_TIMEOUT_S`."""
    raw = os.environ.get(IMPORT_TIMEOUT_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return IMPORT_TIMEOUT_S
    return value if 0 < value < float("inf") else IMPORT_TIMEOUT_S


def _probe(requests: list[tuple[str, str | None]]) -> list[str | None]:
    """Import each ``(module name, .py file or None)`` in a fresh Python process of its own (this process's
    ``sys.path``, working directory and environment), side by side, each killed with its process group past the
    time bound; the reason each cannot be imported (one line), None where it imported.

    Why a process: an import that never returns cannot be stopped in this process (a thread left importing
    holds the import lock; a timer signal reaches neither other threads nor code blocked in C), and a module
    that calls ``os._exit`` or ``sys.exit`` at import must not end rlcr. The probe costs a Python start per module
    not yet imported in this process (about half a second), once. A probe process imports its plugins unprobed."""
    if not requests or os.environ.get(_PROBE_ENV):
        return [None] * len(requests)
    timeout = _import_timeout()
    deadline = time.monotonic() + timeout
    env = {**os.environ, _PROBE_ENV: "1"}
    path = [p for p in sys.path if isinstance(p, str)]
    started: list[tuple[subprocess.Popen, Any]] = []
    answers: list[str | None] = []
    try:
        for name, file in requests:
            out = tempfile.TemporaryFile()
            proc = subprocess.Popen([sys.executable, "-c", _PROBE_CODE], stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.DEVNULL, env=env, start_new_session=True)
            started.append((proc, out))
            with contextlib.suppress(OSError):  # a probe that died at start answers below
                proc.stdin.write(json.dumps({"path": path, "name": name, "file": file}).encode())
                proc.stdin.close()
        for proc, out in started:
            try:
                code = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                answers.append(f"its import did not finish within {timeout:g} s "
                               f"(${IMPORT_TIMEOUT_ENV} sets the bound)")
                continue
            out.seek(0)
            try:
                error = json.loads(out.read(4096))["error"]
            except (ValueError, KeyError, TypeError):
                how = f"exit code {code}" if code >= 0 else f"signal {-code}"
                answers.append(f"it ended its process at import ({how})")
                continue
            answers.append(None if error is None else _describe(str(error[0]), error[1]))
    finally:
        for proc, out in started:
            if proc.poll() is None:  # past the bound (or rlcr interrupted): the probe and what it started
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.close()
    return answers


@contextlib.contextmanager
def _sigint_watch() -> Iterator[Callable[[], bool]]:
    """Around an in-process import: yields a function telling whether a KeyboardInterrupt raised meanwhile came
    from a SIGINT (the user's Ctrl-C), which must still interrupt rlcr, rather than from the module's own code.
    Outside the main thread no SIGINT is delivered; in the main thread with a SIGINT handler not Python's default,
    rlcr cannot tell and treats it as the user's."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield lambda: main
        return
    seen: list[bool] = []

    def on_sigint(signum: int, frame: Any) -> None:
        seen.append(True)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield lambda: bool(seen)
    finally:
        if signal.getsignal(signal.SIGINT) is on_sigint:  # unless the module installed a handler of its own
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _guarded(load: Callable[[], Any]) -> Any:
    """``load()`` (a plugin's import in this process); anything its code raises, ``SystemExit`` and a
    ``KeyboardInterrupt`` of its own included, is :class:`_Refused`. The user's Ctrl-C passes."""
    with _sigint_watch() as user_interrupted:
        try:
            return load()
        except KeyboardInterrupt as e:
            if user_interrupted():
                raise
            raise _Refused(_short(e)) from None
        except BaseException as e:  # noqa: BLE001  (the plugin's code: whatever it raises, it is refused)
            raise _Refused(_short(e)) from None


def _import_probed(name: str, file: Path | None = None) -> Any:
    """The module ``name`` (from ``file`` where given), imported here after it imported in a probe process."""
    if file is None and name in sys.modules:
        return sys.modules[name]
    (error,) = _probe([(name, None if file is None else str(file))])
    if error is not None:
        raise _Refused(error)
    if file is None:
        return _guarded(lambda: importlib.import_module(name))
    return _guarded(lambda: _exec_file(name, file))


def _exec_file(name: str, path: Path) -> Any:
    """Import the file ``path`` as the module ``name`` (left out of ``sys.modules`` if it fails)."""
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _same_file(a: Any, b: Path) -> bool:
    """Whether the file ``a`` (a module's origin) is ``b``, or a copy of it (the one a Ray runtime environment's
    ``py_modules`` put on ``sys.path`` of a worker on the driver's node)."""
    try:
        if a is None:
            return False
        other = Path(a)
        if other.resolve() == b.resolve():
            return True
        size = b.stat().st_size
        return (other.is_file() and other.stat().st_size == size and size <= 16 * 1024**2
                and other.read_bytes() == b.read_bytes())
    except (OSError, ValueError, TypeError):
        return False


def _name_taken_by(name: str, path: Path) -> str | None:
    """Where the module ``name`` comes from when it is not the file ``path``: one already imported, or one this
    process would import by that name (a standard or installed module); None when the name is free or this file's.
    Imported under that name, the file would be skipped (the module already imported is used) or would replace
    that module for everything else in the process; on another node of a cluster the name would find the other."""
    module = sys.modules.get(name)
    if module is not None:
        origin = getattr(module, "__file__", None)
        return None if _same_file(origin, path) else f"the module {name!r} already imported ({origin or 'built-in'})"
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None or (spec.has_location and _same_file(spec.origin, path)):
        return None
    return f"the module {name!r} at {spec.origin or 'a namespace package'}"


def _import_spec(spec: str) -> Any:
    """The module of a task module spec (:func:`import_task_module`); :class:`_Refused` where it cannot be used."""
    if not isinstance(spec, str) or not spec:
        raise _Refused("not a module name or the path of a .py file")
    if not spec.endswith(".py"):
        return _import_probed(spec)
    try:
        path = Path(spec).expanduser()
        name = path.stem
        present = path.is_file()
    except (OSError, ValueError, RuntimeError) as e:
        raise _Refused(_short(e)) from None
    if "." in name:
        raise _Refused(f"a file is imported under its name, and {printable(repr(name), 60)} is no module name: "
                       "rename the file (no dot before .py)")
    if not present:  # another node of a cluster: the runtime environment's py_modules put it on sys.path
        return _import_probed(name)
    taken = _name_taken_by(name, path)
    if taken is not None:
        raise _Refused(f"a file is imported under its name, and {printable(repr(name), 60)} is "
                       f"{printable(taken, 200)}: rename the file (e.g. my_{printable(name, 40)}.py)")
    if name in sys.modules:  # this very file, imported before
        return sys.modules[name]
    return _import_probed(name, path)


def import_task_module(spec: str, *, required: bool = True, label: str = "tasks.module") -> Any:
    """Import a task module: a dotted module name, or the path of a ``.py`` file (imported under its file's stem,
    which must not name another module; or, where the file is absent, e.g. on another node of a cluster, by that
    stem from ``sys.path``, where the runtime environment's ``py_modules`` put it), probed first (:func:`_probe`).
    ``required``: a module that cannot be imported is a ValueError (one line); otherwise it is only noted for
    :func:`where_looked` (and not tried again). Returns the module (None where it failed)."""
    key = f"{label} {printable(repr(spec), 120)}"
    if not required and str(_LOOKED.get(key, "")).startswith("failed"):
        return None
    try:
        module = _import_spec(spec)
    except _Refused as e:
        _LOOKED[key] = f"failed: {e}"
        if required:
            raise ValueError(f"{key}: cannot import it ({e})") from None
        return None
    _LOOKED[key] = "imported"
    return module


def _register_entry_point(ep: Any) -> None:
    obj = _guarded(ep.load)
    if isinstance(obj, type) and issubclass(obj, Task) and obj not in TASKS.values():
        try:
            register_task(ep.name)(obj)
        except ValueError as e:  # its name is taken by another task
            raise _Refused(_short(e)) from None


def _load_entry_points(wanted: str | None = None) -> None:
    """Import the ``rlcr.tasks`` entry points of the installed packages (once per process): those named
    ``wanted`` first, the others only if they do not register it. Their modules are probed side by side. A
    plugin that fails is skipped and named in :func:`where_looked`; it never breaks the other tasks."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    from importlib.metadata import entry_points

    try:
        found = list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as e:  # noqa: BLE001  (a broken distribution's metadata)
        _ENTRY_POINTS_LOADED = True
        _LOOKED[_ENTRY_POINTS_KEY] = f"unreadable ({_short(e)})"
        return
    results = _LOOKED.setdefault(_ENTRY_POINTS_KEY, {})
    if not isinstance(results, dict):
        results = _LOOKED[_ENTRY_POINTS_KEY] = {}
    first = [ep for ep in found if ep.name == wanted]
    for batch in (first, [ep for ep in found if ep.name != wanted]):
        batch = [ep for ep in batch if ep.name not in results]
        modules = sorted({ep.module for ep in batch if ep.module not in sys.modules})
        verdicts = dict(zip(modules, _probe([(m, None) for m in modules])))
        for ep in batch:
            label = printable(ep.name, 40)
            try:
                if verdicts.get(ep.module) is not None:
                    raise _Refused(verdicts[ep.module])
                _register_entry_point(ep)
                results[ep.name] = label
            except _Refused as e:
                results[ep.name] = f"{label} (failed: {e})"
        if wanted is not None and wanted in TASKS:
            return
    _ENTRY_POINTS_LOADED = True


def _import_worker_task(entry: str) -> None:
    """One entry of ``$RLCR_TASK_MODULES``: ``name=module:Class`` (the class registered as ``name`` unless its
    import registered it), or a plain module."""
    name, _, target = entry.rpartition("=")
    module_name, _, qualname = target.partition(":")
    module = import_task_module(module_name, required=False, label=f"${MODULES_ENV}")
    obj = module
    for part in qualname.split(".") if qualname and module is not None else []:
        obj = getattr(obj, part, None)
    if name and name not in TASKS and isinstance(obj, type) and issubclass(obj, Task):
        register_task(name)(obj)


def load_task_plugins(cfg: Any = None, *, wanted: str | None = None) -> None:
    """Make the tasks from outside rlcr known in this process: the ``rlcr.tasks`` entry points, the modules of
    ``$RLCR_TASK_MODULES`` and ``cfg.tasks.module`` (an ``RLCRConfig``, or None). With ``wanted`` (a task name
    looked up), the entry of ``$RLCR_TASK_MODULES`` and the entry point of that name come first, and the others
    are imported only if they do not register it."""
    entries = [s.strip() for s in os.environ.get(MODULES_ENV, "").split(",") if s.strip()]
    if wanted is not None:
        for entry in entries:
            if entry.rpartition("=")[0] == wanted:
                _import_worker_task(entry)
        if wanted in TASKS:
            return
        _load_entry_points(wanted)
        if wanted in TASKS:
            return
    _load_entry_points()
    for entry in entries:
        _import_worker_task(entry)
    module = getattr(getattr(cfg, "tasks", None), "module", None)
    if module:
        import_task_module(module)


def where_looked() -> str:
    """Where rlcr looked for tasks, one line: the built-in ones, the entry point group, task modules."""
    parts = [f"built-in ({', '.join(builtin_task_names())})"]
    for where, what in _LOOKED.items():
        if isinstance(what, dict):  # the entry points, the failed ones first (a shown line may be cut short)
            what = ", ".join(sorted(what.values(), key=lambda v: " (failed: " not in v)) or "none installed"
        parts.append(f"{where}: {what}")
    if not any(k.startswith("tasks.module") for k in _LOOKED):
        parts.append("tasks.module: not set")
    return "; ".join(parts)


def task_class(name: Any) -> type[Task]:
    """The class registered as ``name``, loading the plugins first on a miss; ValueError (one line) naming the
    registered tasks and where rlcr looked."""
    if isinstance(name, str) and name not in TASKS:
        load_task_plugins(wanted=name)
    if not isinstance(name, str) or name not in TASKS:
        raise ValueError(f"unknown task {printable(repr(name), 60)}; registered: {', '.join(sorted(TASKS))} "
                         f"(looked in: {where_looked()})")
    return TASKS[name]


def get_task(name: Any) -> Task:
    """The task registered as ``name`` (one instance per process); ValueError naming the registered ones."""
    cls = task_class(name)
    if name not in _INSTANCES or type(_INSTANCES[name]) is not cls:
        _INSTANCES[name] = cls()
    return _INSTANCES[name]


def plugin_modules(name: str) -> list[str]:
    """What a Ray worker imports for the task ``name`` (``$RLCR_TASK_MODULES``): ``name=module:Class`` of its
    class unless it is rlcr's own (empty then). A class defined in ``__main__`` cannot be imported elsewhere:
    a ValueError says so."""
    cls = task_class(name)
    if cls.__module__.split(".")[0] == "rlcr":
        return []
    if cls.__module__ == "__main__":
        raise ValueError(f"task {name!r} is defined in the script being run (__main__): Ray workers cannot import "
                         "it; put it in a module and name it in tasks.module (docs/tasks.md)")
    return [f"{name}={cls.__module__}:{cls.__qualname__}"]
