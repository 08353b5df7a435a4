"""A task's mistakes found before a run starts (docs/tasks.md, "Checked before the run").

:func:`check_task` runs when a command validates its config, before Prefect or Ray start: the task is
instantiated (a required method left out is named), the training pool and the held-out set are drawn as the run
will draw them (a quota the task space cannot fill fails here, not after the engines started), and one held-out
problem goes through every method the flow calls on it: identity, stratum, the record and its fields, the prompt,
and a score of its own warm-start trace (which must score full) or of a dummy answer. Each failure is one line
naming the task and the method (:class:`TaskCheckError`). Generation is cached per process, so the run that
follows in this process draws its sets again at no cost.
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable

from rlcr.tasks.base import Task
from rlcr.tasks.registry import task_class
from rlcr.untrusted import printable

__all__ = ["check_task", "TaskCheckError"]

_DUMMY = "<think>a check of the task, not an answer</think>\n<answer>0</answer>"


class TaskCheckError(ValueError):
    """The task cannot run: one line naming it and the method at fault."""


def check_task(cfg: Any, *, sets: bool = True) -> None:
    """Check the task of ``cfg`` (an :class:`~rlcr.config.RLCRConfig`) as described in the module docstring;
    ``sets``: draw the training pool and the held-out set too (commands that read no task set skip it).
    Raises :class:`TaskCheckError`."""
    from rlcr.runs.task_sets import held_out_set, training_pool
    from rlcr.tasks.registry import get_task

    name = cfg.tasks.name
    shown = printable(repr(name), 60)
    cls = task_class(name)
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise TaskCheckError(f"task {shown} ({printable(cls.__qualname__, 80)}) does not define "
                             f"{', '.join(missing)}, which every task must (docs/tasks.md, 'The interface')")
    task = _step(name, "__init__", lambda: get_task(name))
    if not sets:
        return
    train = _step(name, "load" if cfg.tasks.train_file else "candidates", lambda: training_pool(cfg),
                  "drawing the training pool")
    held = _step(name, "load" if cfg.tasks.eval_file else "candidates", lambda: held_out_set(cfg, train),
                 "drawing the held-out set")
    _check_problem(task, name, held[0] if held else train[0])


def _check_problem(task: Task, name: str, problem: Any) -> None:
    """One problem through every method the flow calls on it."""
    hash(_step(name, "identity", lambda: task.identity(problem)))
    stratum = _step(name, "stratum", lambda: task.stratum(problem))
    if not isinstance(stratum, (str, int)):
        _fail(name, "stratum", f"returned a {type(stratum).__name__}, not a str or an int")
    record = _step(name, "to_record", lambda: task.to_record(problem))
    if not isinstance(record, dict):
        _fail(name, "to_record", f"returned a {type(record).__name__}, not a dict")
    _step(name, "to_record", lambda: json.dumps(record), "its record is not JSON-serialisable")
    fields = _step(name, "record_fields", task.record_fields)
    absent = sorted(set(record) - {f.name for f in fields})
    if absent:
        _fail(name, "record_fields", f"declares no field for the record key(s) {absent}")
    back = _step(name, "from_record", lambda: task.from_record(record))
    if _step(name, "identity", lambda: task.identity(back)) != task.identity(problem):
        _fail(name, "from_record", "from_record(to_record(p)) is another problem (its identity differs)")
    text = _step(name, "user_text", lambda: task.user_text(problem))
    if not isinstance(text, str) or not text.strip():
        _fail(name, "user_text", "returned no text")
    trace = _step(name, "warm_start", lambda: task.warm_start(problem, random.Random(0)))
    completion = _DUMMY if trace is None else _step(name, "warm_start_completion",
                                                    lambda: task.warm_start_completion(trace))
    with _step(name, "scoring", lambda: task.scoring(1)):
        got = _step(name, "score", lambda: task.score(completion, problem, format_score=0.5, score=1.0))
    if not isinstance(got, (int, float)) or isinstance(got, bool) or not 0.0 <= got <= 1.0:
        _fail(name, "score", f"returned {printable(repr(got), 60)}, not a number in [0, 1]")
    if trace is not None and got != 1.0:
        _fail(name, "warm_start", f"its own trace scores {got}, not the full score (the trace's answer must be right)")


def _step(name: str, method: str, call: Callable[[], Any], doing: str | None = None) -> Any:
    try:
        return call()
    except TaskCheckError:
        raise
    except Exception as e:  # noqa: BLE001 - the task's code: any failure is one line naming the method
        detail = f"{type(e).__name__}: {printable(e, 240)}" if str(e) else type(e).__name__
        _fail(name, method, f"{doing + ': ' if doing else ''}{detail}")


def _fail(name: str, method: str, why: str) -> None:
    raise TaskCheckError(f"task {printable(repr(name), 60)}: {method}: {why}")
