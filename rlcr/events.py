"""Stage events of a training run: how a front end (the CLI's progress display) or a test follows a flow.

The flow emits ``StageEvent(stage, iteration, "start")`` at the start of every attempt
of a stage (inside the Prefect task, so a retry is a second start) and ``"end"`` with
the elapsed time and the stage's headline figures when it finished. Subscribers are
called in the flow's process, in order; an exception raised by a subscriber fails
that stage (tests use this to inject failures). Subscribe with :func:`subscribed`
(a context manager) or :func:`subscribe` / :func:`unsubscribe`.

The flow marks its stages with :func:`started` (inside each Prefect task: every attempt) and
:func:`timed` (around the task call: the elapsed time into the iteration's timings, and the
``end`` event with the figures the body sets). This is the one mechanism: a front end that only
wants starts checks ``event.phase``. Inside a long stage (a held-out evaluation, the probe) :func:`progress`
reports how much of it is done: ``"progress"`` events with ``figures`` ``done``, ``total``, ``unit`` and ``part``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal

__all__ = ["StageEvent", "subscribe", "unsubscribe", "subscribed", "emit", "started", "timed", "phase", "ended",
           "STARTUP", "progress"]


@dataclass(frozen=True)
class StageEvent:
    stage: str
    """``baseline``, ``rollouts``, ``advantages``, ``update``, ``sync_weights``, ``evaluate`` or ``commit``; or a
    start-up phase (:data:`STARTUP`)."""
    iteration: int
    """The iteration (0: the baseline evaluation before iteration 1)."""
    phase: Literal["start", "end", "progress"]
    elapsed_s: float | None = None
    """Wall time of the stage (``end`` only), retries included."""
    figures: dict[str, Any] = field(default_factory=dict)
    """Headline figures of the finished stage (``end`` only), e.g. ``{"answer reward": 0.31}``; of a
    ``progress`` event: ``{"done": 3, "total": 8, "unit": "tasks", "part": "answers"}``."""


STARTUP = ("prefect", "model", "ray", "engines", "trainer")
"""The start-up phases of a flow run, iteration 0 (engines and trainer may overlap): Prefect (its API and the
flow run; the command line emits its start), the initial model, Ray, the vLLM engines, the Ray Train workers."""

_subscribers: list[Callable[[StageEvent], None]] = []
_lock = threading.Lock()


def subscribe(fn: Callable[[StageEvent], None]) -> None:
    with _lock:
        _subscribers.append(fn)


def unsubscribe(fn: Callable[[StageEvent], None]) -> None:
    with _lock:
        if fn in _subscribers:
            _subscribers.remove(fn)


@contextlib.contextmanager
def subscribed(fn: Callable[[StageEvent], None]) -> Iterator[None]:
    subscribe(fn)
    try:
        yield
    finally:
        unsubscribe(fn)


def emit(event: StageEvent) -> None:
    with _lock:
        subscribers = list(_subscribers)
    for fn in subscribers:
        fn(event)


def started(stage: str, iteration: int) -> None:
    """The ``start`` event of one attempt of a stage."""
    emit(StageEvent(stage, iteration, "start"))


@contextlib.contextmanager
def timed(stage: str, iteration: int, timings: dict[str, float]) -> Iterator[dict[str, Any]]:
    """Time a stage into ``timings[<stage>_s]`` and emit its ``end`` event with the figures the body sets in
    the dict it is given (a stage that raises has no ``end`` event and no timing)."""
    figures: dict[str, Any] = {}
    t0 = time.perf_counter()
    yield figures
    elapsed = time.perf_counter() - t0
    timings[f"{stage}_s"] = elapsed
    emit(StageEvent(stage, iteration, "end", elapsed, figures))


@contextlib.contextmanager
def phase(stage: str) -> Iterator[dict[str, Any]]:
    """A start-up phase (:data:`STARTUP`): its ``start`` event, then its ``end`` event with the elapsed time."""
    started(stage, 0)
    with timed(stage, 0, {}) as figures:
        yield figures


def ended(stage: str, since: float) -> None:
    """The ``end`` event of a phase started at ``time.perf_counter()`` value ``since`` (for phases that overlap)."""
    emit(StageEvent(stage, 0, "end", time.perf_counter() - since))


def progress(stage: str, iteration: int, done: int, total: int, unit: str = "tasks", part: str = "") -> None:
    """Progress inside a long stage: ``done`` of ``total`` ``unit`` finished (``part``: which part of the stage,
    e.g. the probe's ``answers``, ``confidences``, ``forced answers``)."""
    emit(StageEvent(stage, iteration, "progress", figures={"done": done, "total": total, "unit": unit, "part": part}))
