"""A bounded verifier for any task (docs/tasks.md, "Its verifier"): a task's check of an answer run in a worker
process under time and memory limits, so a slow or hostile verifier cannot stall or poison training.

    VERIFY = BoundedVerifier("my_tasks.sumlist:check", timeout_s=1.0)

    class SumList(Task):
        def score(self, completion, problem, *, format_score, score=1.0):
            answer = extract_answer(completion)
            if answer is None:
                return 0.0
            return score if VERIFY(answer, problem.total) is True else format_score

        def scoring(self, n):
            return VERIFY.scoring(n)

The function (``module:name``, importable from this process's ``sys.path``) takes and returns JSON values. Each
call runs in the verifier's worker process (one per verifier and process, started on first use, one call at
a time) under its own timer (``timeout_s``) and an address-space limit (``memory_bytes``). The rules, those of
the math verifier (:mod:`rlcr.tasks.math_verifier`):

* a call out of time (the worker's timer fired, or it did not answer by the deadline plus :data:`KILL_GRACE_S`:
  then it and its process group are killed and the next call restarts it) returns ``None`` and is counted as a
  timeout (the rollouts' ``verifier/timeouts`` when the task's :meth:`~rlcr.tasks.base.Task.scoring` is
  :meth:`BoundedVerifier.scoring`); a call in which the worker died (out of memory, killed) is counted the same way;
* nothing obtained through a timeout is cached: only results, per arguments (:attr:`BoundedVerifier.cache_size`);
* a function that raises returns ``None`` (not cached, not a timeout);
* inside :meth:`BoundedVerifier.scoring` the calls of a batch of ``n`` share ``batch_base_s + n * batch_per_call_s``
  seconds, and each of the ``n`` distinct calls (arguments) keeps its own ``batch_per_call_s`` until it is reached:
  a slow call spends the shared ``batch_base_s`` and its own share, never the share of a call after it, so a stall
  costs at most the calls it hit. A call reached with no time left returns ``None`` without running, counted as a
  timeout. Within the batch a call that timed out or raised is not run again: the same arguments return ``None``
  at once, counted once (the rollouts ask for the score, the accuracy and the answer reward of each answer).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from rlcr.tasks.base import ScoringStats
from rlcr.tasks.worker_process import WorkerProcess

__all__ = ["BoundedVerifier", "KILL_GRACE_S", "STARTUP_DEADLINE_S", "scoring_batch", "in_batch", "BatchStats"]

KILL_GRACE_S = 0.5
"""How long past a call's deadline the worker may still answer before it is killed."""
STARTUP_DEADLINE_S = 60.0
"""Longest wait for a worker to import the function and say it is ready."""
MAX_REPLY_BYTES = 1024 * 1024
"""Longest reply line read from the worker; a longer one kills it (counted as an error)."""
_MIN_CALL_S = 0.005


class _Batch:
    """One :meth:`BoundedVerifier.scoring` batch of ``n`` calls: its :class:`ScoringStats`, its end, the calls
    reached so far (by arguments) and those that timed out or raised in it."""

    def __init__(self, n: int, base_s: float, share_s: float) -> None:
        self.stats, self.n, self.share_s = ScoringStats(), max(n, 0), share_s
        self.end = time.monotonic() + base_s + share_s * self.n
        self.reached: set[str] = set()
        self.failed: set[str] = set()

    def until(self, key: str) -> float:
        """When the call ``key`` must be over: the batch's end less the shares of the calls not yet reached."""
        self.reached.add(key)
        return self.end - self.share_s * max(self.n - len(self.reached), 0)


class BoundedVerifier(WorkerProcess):
    """The function ``target`` (``"module:name"``) run in a worker process under time and memory limits; with
    ``file``, the module is that file (a checker anywhere on disk, ``tasks.name: file``)."""

    startup_deadline_s = STARTUP_DEADLINE_S
    max_reply_bytes = MAX_REPLY_BYTES

    def __init__(self, target: str, *, timeout_s: float = 2.0, memory_bytes: int = 1024**3,
                 batch_base_s: float = 2.0, batch_per_call_s: float = 0.1, cache_size: int = 4096,
                 file: str | None = None) -> None:
        if ":" not in target:
            raise ValueError(f"BoundedVerifier: target must be 'module:function', got {target!r}")
        self.target, self.timeout_s, self.memory_bytes = target, float(timeout_s), int(memory_bytes)
        self.file = os.path.abspath(file) if file else None
        """The file the worker loads the target's module from (as that module name), wherever it is; None: the
        module is imported by name (or from the file it was loaded from in this process)."""
        self.batch_base_s, self.batch_per_call_s, self.cache_size = batch_base_s, batch_per_call_s, cache_size
        super().__init__()  # ``restarts``: workers started after the first (a timeout, a death)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._cache: OrderedDict[str, Any] = OrderedDict()
        atexit.register(self._stop)

    # ---- the batch a thread scores

    @contextmanager
    def scoring(self, n: int) -> Iterator[ScoringStats]:
        """A batch of ``n`` calls in this thread sharing one time budget; yields the :class:`ScoringStats` whose
        ``timeouts`` it counts (return it from the task's ``scoring``)."""
        with self._lock:
            self._wait_ready(time.monotonic() + STARTUP_DEADLINE_S)  # started outside the budget
        outer, current = getattr(self._local, "batch", None), _Batch(n, self.batch_base_s, self.batch_per_call_s)
        self._local.batch = current
        try:
            yield current.stats
        finally:
            self._local.batch = outer

    # ---- one call

    def __call__(self, *args: Any) -> Any:
        """The function's result for ``args`` (JSON values), or None: out of time or memory (counted), or raised."""
        key = json.dumps(args, sort_keys=True)
        batch = getattr(self._local, "batch", None)
        if batch is not None and key in batch.failed:
            return None  # timed out or raised earlier in this batch: not run again, not counted again
        until = batch.until(key) if batch is not None else time.monotonic() + STARTUP_DEADLINE_S + self.timeout_s
        if not self._lock.acquire(timeout=max(until - time.monotonic(), 0.0)):
            return self._failed(batch, key, timed_out=True)
        try:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            reply = self._attempt(key, until)
            if reply in (b"t", b"e"):
                return self._failed(batch, key, timed_out=reply == b"t")
            result = json.loads(reply)["r"]
            self._cache[key] = result
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return result
        finally:
            self._lock.release()

    @staticmethod
    def _failed(batch: _Batch | None, key: str, *, timed_out: bool) -> None:
        """None for a call that timed out (counted) or raised, remembered for the rest of the batch."""
        if batch is not None:
            batch.failed.add(key)
            batch.stats.timeouts += timed_out
        return None

    def _attempt(self, key: str, until: float) -> bytes:
        if not self._wait_ready(until):
            return b"t"
        deadline_s = min(self.timeout_s, until - time.monotonic())
        if deadline_s < _MIN_CALL_S:
            return b"t"
        if not self._send(b'{"args": ' + key.encode() + b', "deadline": ' + repr(deadline_s).encode() + b"}"):
            return b"t"  # the worker died: the next call restarts it
        reply = self._readline(time.monotonic() + deadline_s + KILL_GRACE_S)
        if reply is None:  # past the deadline (what its timer cannot stop), out of memory, or dead: kill it
            self._stop()
            return b"t"
        if reply in (b"t", b"e"):
            return reply
        try:
            json.loads(reply)["r"]
        except (ValueError, KeyError, TypeError):
            self._stop()
            return b"e"
        return reply

    # ---- the worker process (started, read and killed by :class:`~rlcr.tasks.worker_process.WorkerProcess`)

    def _argv(self) -> list[str]:
        source = Path(__file__).with_name("verify_worker.py").read_text(encoding="utf-8")
        path = json.dumps([os.path.abspath(p) if p else os.getcwd() for p in sys.path])
        # isolated (-I): neither the working directory nor PYTHONPATH can shadow a module the worker runs on
        return [sys.executable, "-I", "-c", source, self.target, path, str(self.memory_bytes), self._module_file()]

    def _module_file(self) -> str:
        """The file the target's module was imported from in this process when that is how the worker must load
        it too: a task file given by path (``tasks.module: ./mytask.py``), whose folder is on no ``sys.path``.
        Empty when the module is importable by name (or not imported here)."""
        from importlib.machinery import PathFinder

        if self.file:
            return self.file
        name = self.target.partition(":")[0]
        file = getattr(sys.modules.get(name), "__file__", None)
        if "." in name or not isinstance(file, str) or not os.path.isfile(file):
            return ""
        try:
            found = PathFinder.find_spec(name)  # on sys.path, as the worker would find it (not sys.modules)
        except (ImportError, ValueError):
            found = None
        if found is not None and found.origin and os.path.abspath(found.origin) == os.path.abspath(file):
            return ""
        return os.path.abspath(file)

    def _not_started(self) -> str:
        return (f"the verifier {self.target!r} did not start in its worker (can it be imported, and within "
                f"{self.memory_bytes:,} bytes?)")


# ---- batches over verifiers known per problem (the file and reasoning_gym tasks)


class BatchStats:
    """The timeouts of every verifier called in a batch, summed (what :func:`scoring_batch` yields)."""

    def __init__(self) -> None:
        self.parts: list[Any] = []

    @property
    def timeouts(self) -> int:
        return sum(p.timeouts for p in self.parts)


_BATCH = threading.local()
"""This thread's open batch: (n, the exit stack of the verifiers' batches, their stats, the verifiers entered)."""


@contextlib.contextmanager
def scoring_batch(n: int) -> Iterator[BatchStats]:
    """A task's :meth:`~rlcr.tasks.base.Task.scoring` when its verifier is known only per problem: a batch of ``n``
    answers in this thread, in which each verifier that :func:`in_batch` hands out enters its own
    :meth:`BoundedVerifier.scoring` once; yields the timeouts of all of them."""
    stats = BatchStats()
    with contextlib.ExitStack() as stack:
        _BATCH.state = (n, stack, stats, set())
        try:
            yield stats
        finally:
            _BATCH.state = None


def in_batch(verifier: BoundedVerifier) -> BoundedVerifier:
    """``verifier``, inside this thread's open batch (its :meth:`~BoundedVerifier.scoring` entered once)."""
    state = getattr(_BATCH, "state", None)
    if state is not None and id(verifier) not in state[3]:
        n, stack, stats, entered = state
        stats.parts.append(stack.enter_context(verifier.scoring(n)))
        entered.add(id(verifier))
    return verifier
