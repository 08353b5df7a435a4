"""Tasks by name (docs/tasks.md): the registered tasks, the ones shipped with rlcr imported first.

:func:`rlcr.tasks.base.register_task` fills :data:`rlcr.tasks.base.TASKS`; this module imports the
built-in task modules (so they are registered) and hands out one instance per name and process.
"""

from __future__ import annotations

from typing import Any

import rlcr.tasks.countdown_task  # noqa: F401  (registers "countdown")
import rlcr.tasks.math  # noqa: F401  (registers "math")
import rlcr.tasks.qa  # noqa: F401  (registers "qa")
from rlcr.tasks.base import TASKS, Task
from rlcr.untrusted import printable

__all__ = ["get_task", "task_names"]

_INSTANCES: dict[str, Task] = {}


def task_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(TASKS)


def get_task(name: Any) -> Task:
    """The task registered as ``name`` (one instance per process); ValueError naming the registered ones."""
    if not isinstance(name, str) or name not in TASKS:
        raise ValueError(f"unknown task {printable(repr(name), 60)}; registered: {', '.join(sorted(TASKS))}")
    if name not in _INSTANCES:
        _INSTANCES[name] = TASKS[name]()
    return _INSTANCES[name]
