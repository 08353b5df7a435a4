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
* the tasks listed in ``$RLCR_TASK_MODULES`` (comma-separated ``name=module:Class``): set by :func:`rlcr.cluster.ensure_ray` in
  the Ray runtime environment, so a worker on any node imports the run's task module before it looks the
  task up (on a cluster the module's code travels in the runtime environment's ``py_modules``).

:func:`get_task` loads them on a miss, in any process, before it refuses a name; the refusal is one line
naming the registered tasks and where rlcr looked.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import rlcr.tasks.countdown_task  # noqa: F401  (registers "countdown")
import rlcr.tasks.math  # noqa: F401  (registers "math")
import rlcr.tasks.qa  # noqa: F401  (registers "qa")
from rlcr.tasks.base import TASKS, Task, register_task
from rlcr.untrusted import printable

__all__ = ["get_task", "task_names", "task_class", "load_task_plugins", "import_task_module", "where_looked",
           "plugin_modules", "ENTRY_POINT_GROUP", "MODULES_ENV"]

ENTRY_POINT_GROUP = "rlcr.tasks"
"""The entry point group of tasks from installed packages."""
MODULES_ENV = "RLCR_TASK_MODULES"
"""Environment variable: comma-separated task modules a process imports before it refuses a task name."""

_INSTANCES: dict[str, Task] = {}
_LOOKED: dict[str, str] = {}  # where rlcr looked → what it found there (for the refusal's line)
_ENTRY_POINTS_LOADED = False


def task_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(TASKS)


def _short(e: BaseException) -> str:
    return printable(f"{type(e).__name__}: {e}", 160)


def _load_entry_points() -> None:
    """Import the ``rlcr.tasks`` entry points of the installed packages (once per process). A plugin that
    fails to import is skipped and named in :func:`where_looked`; it never breaks the other tasks."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    found = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if isinstance(obj, type) and issubclass(obj, Task) and obj not in TASKS.values():
                register_task(ep.name)(obj)
            found.append(printable(ep.name, 40))
        except Exception as e:  # noqa: BLE001  (a broken plugin: named in the refusal, never fatal here)
            found.append(f"{printable(ep.name, 40)} (failed: {_short(e)})")
    _LOOKED[f"entry points '{ENTRY_POINT_GROUP}'"] = ", ".join(found) or "none installed"


def import_task_module(spec: str, *, required: bool = True, label: str = "tasks.module") -> Any:
    """Import a task module: a dotted module name, or the path of a ``.py`` file (imported under its file's stem,
    or, where the file is absent, e.g. on another node of a cluster, by that stem from ``sys.path``, where the
    runtime environment's ``py_modules`` put it). ``required``: an import error is a ValueError (one line);
    otherwise it is only noted for :func:`where_looked`. Returns the module (None where it failed)."""
    key = f"{label} {printable(repr(spec), 120)}"
    try:
        if spec.endswith(".py"):
            path = Path(spec).expanduser()
            name = path.stem
            if name in sys.modules:
                module = sys.modules[name]
            else:
                if path.is_file():
                    loader_spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(loader_spec)
                    sys.modules[name] = module
                    try:
                        loader_spec.loader.exec_module(module)
                    except BaseException:
                        sys.modules.pop(name, None)
                        raise
                else:
                    module = importlib.import_module(name)
        else:
            module = importlib.import_module(spec)
        _LOOKED[key] = "imported"
        return module
    except Exception as e:  # noqa: BLE001  (the user's module: any error is one line naming it)
        _LOOKED[key] = f"failed: {_short(e)}"
        if required:
            raise ValueError(f"tasks.module {printable(repr(spec), 120)}: cannot import it ({_short(e)})") from None
        return None


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


def load_task_plugins(cfg: Any = None) -> None:
    """Make the tasks from outside rlcr known in this process: the ``rlcr.tasks`` entry points, the modules of
    ``$RLCR_TASK_MODULES`` and ``cfg.tasks.module`` (an ``RLCRConfig``, or None)."""
    _load_entry_points()
    for entry in filter(None, (s.strip() for s in os.environ.get(MODULES_ENV, "").split(","))):
        _import_worker_task(entry)
    module = getattr(getattr(cfg, "tasks", None), "module", None)
    if module:
        import_task_module(module)


def where_looked() -> str:
    """Where rlcr looked for tasks, one line: the built-in ones, the entry point group, task modules."""
    parts = ["built-in (countdown, math)"] + [f"{k}: {v}" for k, v in _LOOKED.items()]
    if not any(k.startswith("tasks.module") for k in _LOOKED):
        parts.append("tasks.module: not set")
    return "; ".join(parts)


def task_class(name: Any) -> type[Task]:
    """The class registered as ``name``, loading the plugins first on a miss; ValueError (one line) naming the
    registered tasks and where rlcr looked."""
    if isinstance(name, str) and name not in TASKS:
        load_task_plugins()
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
