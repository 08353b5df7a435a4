"""Stage events of a training run: how a front end (the CLI's progress display) or a test follows a flow.

The flow emits ``StageEvent(stage, iteration, "start")`` at the start of every attempt
of a stage (inside the Prefect task, so a retry is a second start) and ``"end"`` with
the elapsed time and the stage's headline figures when it finished. Subscribers are
called in the flow's process, in order; an exception raised by a subscriber fails
that stage (tests use this to inject failures). Subscribe with :func:`subscribed`
(a context manager) or :func:`subscribe` / :func:`unsubscribe`.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal

__all__ = ["StageEvent", "subscribe", "unsubscribe", "subscribed", "emit"]


@dataclass(frozen=True)
class StageEvent:
    stage: str
    """``baseline``, ``rollouts``, ``advantages``, ``update``, ``sync_weights``, ``evaluate`` or ``commit``."""
    iteration: int
    """The iteration (0: the baseline evaluation before iteration 1)."""
    phase: Literal["start", "end"]
    elapsed_s: float | None = None
    """Wall time of the stage (``end`` only), retries included."""
    figures: dict[str, Any] = field(default_factory=dict)
    """Headline figures of the finished stage (``end`` only), e.g. ``{"answer reward": 0.31}``."""


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
