"""Method calls on the trainer's Ray Train workers (docs/design.md §12): a small typed RPC over Ray queues.

Ray Train's ``TorchTrainer`` runs one function per worker to its end; it has no way to call into a worker
that lives on. The trainer's workers therefore each build one object (:class:`rlcr.train.worker.TrainerWorker`)
and :func:`serve` it: the driver's :class:`WorkerGroup` sends a :class:`Call` — a method of that class and its
keyword arguments, checked against the method's signature before anything is sent — to every rank's inbox, and
each rank answers with a :class:`Reply` holding the method's return value. Calls go one at a time and every
rank runs every call (the methods are collectives: DDP/FSDP), so the replies of a call are one per rank.

A method that raises ends its worker's loop, hence ``fit()`` (``max_failures=0``), as a dead worker does: the
driver's pending call then raises :class:`WorkerGroupLost` with Ray Train's report. Nothing here imports torch.
"""

from __future__ import annotations

import inspect
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Call", "Reply", "serve", "check_call", "WorkerGroup", "WorkerGroupLost", "STOP"]

STOP = "stop"
"""The method after whose reply :func:`serve` returns (the worker's function, and so ``fit()``, ends)."""


class WorkerGroupLost(RuntimeError):
    """The workers are gone (one died or raised) or their queues are: no call can be answered."""


@dataclass(frozen=True)
class Call:
    """One method call for every rank: ``method(**kwargs)``; ``call_id`` pairs it with its replies."""

    call_id: int
    method: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """One rank's return value of call ``call_id``."""

    call_id: int
    rank: int
    value: Any = None


def serve(target: Any, methods: tuple[str, ...], inbox, outbox, *, rank: int) -> None:
    """Run ``target``'s ``methods`` as calls arrive in ``inbox``, reply in ``outbox``; return after :data:`STOP`.

    Anything but a :class:`Call` of one of ``methods`` is a ValueError (which ends the worker, as any error)."""
    while True:
        call = inbox.get()
        if not isinstance(call, Call) or call.method not in methods:
            what = call.method if isinstance(call, Call) else type(call).__name__
            raise ValueError(f"trainer worker {rank}: unknown call {what!r} (methods: {', '.join(methods)})")
        value = getattr(target, call.method)(**call.kwargs)
        outbox.put(Reply(call.call_id, rank, value))
        if call.method == STOP:
            return


def check_call(worker_cls: type, method: str, kwargs: dict[str, Any]) -> None:
    """``method`` is one of ``worker_cls``'s served methods and takes ``kwargs``: a mistake is an error on the
    driver (AttributeError, TypeError), not a dead worker."""
    fn = getattr(worker_cls, method, None)
    if method not in getattr(worker_cls, "METHODS", ()) or not callable(fn):
        raise AttributeError(f"{worker_cls.__name__} serves no method {method!r}")
    inspect.signature(fn).bind(None, **kwargs)


class WorkerGroup:
    """The driver's end: ``size`` ranks, each serving an object of ``worker_cls`` (:func:`serve` of its
    ``METHODS``).

    ``alive()`` says whether the workers still run (Ray Train's ``fit()`` has not ended); whoever runs ``fit()``
    knows, and knows why they ended. The queues are Ray actors of 0 CPUs, owned here."""

    def __init__(self, worker_cls: type, size: int, *, alive: Callable[[], bool]):
        from ray.util.queue import Queue

        self.worker_cls, self.size = worker_cls, size
        self._alive = alive
        self.inboxes = [Queue(actor_options={"num_cpus": 0}) for _ in range(size)]
        self.outbox = Queue(actor_options={"num_cpus": 0})
        self._next_id = 0

    def call(self, method: str, timeout_s: float, **kwargs) -> list[Any]:
        """``method(**kwargs)`` on every rank; the return values by rank. :class:`WorkerGroupLost` if the workers
        die first (or are already gone), TimeoutError past ``timeout_s``."""
        check_call(self.worker_cls, method, kwargs)
        if not self._alive():
            raise WorkerGroupLost(f"cannot {method}: the workers are gone")
        self._next_id += 1
        call = Call(self._next_id, method, kwargs)
        try:
            for inbox in self.inboxes:
                inbox.put(call)
        except Exception as e:  # the queue actor itself is gone
            raise WorkerGroupLost(f"lost its queue during {method!r}: {e}") from e
        return self._collect(call, timeout_s)

    def _collect(self, call: Call, timeout_s: float) -> list[Any]:
        replies: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(replies) < self.size:
            try:
                r = self.outbox.get(timeout=1.0)
            except queue.Empty:
                if not self._alive():
                    raise WorkerGroupLost(f"the workers died during {call.method!r}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"trainer workers: no answer to {call.method!r} "
                                       f"within {timeout_s:.0f} s") from None
                continue
            except Exception as e:  # the queue actor itself is gone
                raise WorkerGroupLost(f"lost its queue during {call.method!r}: {e}") from e
            if isinstance(r, Reply) and r.call_id == call.call_id:  # (a late reply to an abandoned call: dropped)
                replies[r.rank] = r.value
        return [replies[rank] for rank in range(self.size)]

    def close(self) -> None:
        """Kill the queue actors (the workers, if any are left, then fail on their next read)."""
        import ray

        for q in [*self.inboxes, self.outbox]:
            try:
                ray.kill(q.actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.inboxes = []
