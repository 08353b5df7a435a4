"""Task sets of a run: the training pool, the held-out set, the SFT warm-start tasks and the prompts of each iteration.

The run's task (``cfg.tasks.name``, :func:`rlcr.tasks.registry.get_task`) loads, generates and identifies the
problems: two rows with the same :meth:`~rlcr.tasks.base.Task.identity` are the same problem (Countdown: the
multiset of its numbers and its target, whatever their order or the reference solution). By construction:

* the training pool holds each identity once (the first occurrence is kept; dropped duplicates of a
  task file are reported with a logged warning);
* the held-out set holds each identity once and shares none with the training pool, hence none with
  the SFT warm-start tasks either, which are drawn from the training pool (:func:`sft_tasks`);
* an iteration's P prompts are P distinct training tasks, and over iterations every training task is
  used once per epoch (:func:`prompts_for_iteration`).
"""

from __future__ import annotations

import functools
import json
import logging
import random
from types import SimpleNamespace
from typing import Any, Iterable, Sequence

from rlcr.config import RLCRConfig
from rlcr.seeds import sft_task_order_seed, task_order_seed
from rlcr.tasks.base import Task
from rlcr.tasks.registry import get_task
from rlcr.untrusted import printable

__all__ = ["task_sets", "training_pool", "held_out_set", "sft_tasks", "prompts_for_iteration"]

log = logging.getLogger(__name__)

# Generating the held-out set gives up after this many draws per held-out task (plus a constant):
# a task space that small is nearly covered by the training pool.
HELD_OUT_ATTEMPTS_PER_TASK = 100
HELD_OUT_ATTEMPTS_MIN = 1000


def _task(cfg: RLCRConfig) -> Task:
    return get_task(cfg.tasks.name)


def _generation(cfg: RLCRConfig) -> tuple:
    """The task settings generation reads (a cache key): the task's name and its ``tasks.options``."""
    return (cfg.tasks.name, json.dumps(cfg.tasks.options, sort_keys=True))


def _distinct(task: Task, problems: Iterable[Any]) -> list[Any]:
    """``problems`` with each identity once (first occurrence kept, order kept)."""
    seen: set = set()
    out = []
    for t in problems:
        key = task.identity(t)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


@functools.lru_cache(maxsize=4)
def _generated(n: int, seed: int, settings: tuple) -> tuple:
    """Generation is deterministic and costs seconds (the solver runs per draw): the SFT warm-start and
    the run in one process share it (keyed by ``settings``, :func:`_generation`)."""
    name, options = settings
    view = SimpleNamespace(tasks=SimpleNamespace(name=name, options=json.loads(options)))  # what generation reads
    return tuple(get_task(name).generate(n, seed, view))


def _load(cfg: RLCRConfig, path: str) -> list[Any]:
    task = _task(cfg)
    return task.bind(task.load(path, cfg.tasks.field_map), cfg)


def training_pool(cfg: RLCRConfig) -> list[Any]:
    """The run's training tasks, each identity once: loaded from ``train_tasks`` or generated from ``seed``.

    Repeats are dropped (first occurrence kept): from a file with a logged warning naming the count; a
    generated pool of ``tasks.num_train`` draws keeps its distinct tasks (small task spaces repeat).
    """
    if cfg.tasks.train_file:
        raw = _load(cfg, cfg.tasks.train_file)
        source = printable(cfg.tasks.train_file)  # a path: shown without control characters, bounded
    else:
        raw = list(_generated(cfg.tasks.num_train, cfg.run.seed, _generation(cfg)))
        source = f"generated training tasks (seed {cfg.run.seed})"
    train = _distinct(_task(cfg), raw)
    if not train:
        raise ValueError(f"the training task set is empty ({source})")
    dropped = len(raw) - len(train)
    if dropped and cfg.tasks.train_file:
        log.warning("%s: dropped %d of %d training rows that repeat an earlier row's numbers and target",
                    source, dropped, len(raw))
    elif dropped:
        log.info("%s: %d of %d draws are distinct tasks", source, len(train), len(raw))
    return train


def held_out_set(cfg: RLCRConfig, train: Sequence[Any]) -> list[Any]:
    """Held-out tasks, each identity once and none shared with ``train`` (the run's training pool).

    From ``eval_tasks``: overlapping and repeated rows are dropped with a logged warning naming the
    counts and the file; a file with nothing left is refused. Generated: candidates are drawn from the
    ``eval_seed`` stream and those whose identity is a training task (or an earlier held-out task) are
    skipped until ``tasks.num_eval`` are found; with ``tasks.eval_stratify_counts`` (default) a candidate is also
    skipped once its stratum (:meth:`~rlcr.tasks.base.Task.stratum`; Countdown: the number count) has its share.
    The set therefore depends on the training pool too.
    """
    task = _task(cfg)
    taken = {task.identity(t) for t in train}
    if cfg.tasks.eval_file:
        rows = _load(cfg, cfg.tasks.eval_file)
        name = printable(cfg.tasks.eval_file)
        out, seen, overlap = [], set(), 0
        for t in rows:
            key = task.identity(t)
            if key in taken:
                overlap += 1
            elif key not in seen:
                seen.add(key)
                out.append(t)
        repeats = len(rows) - len(out) - overlap
        if not out:
            raise ValueError(f"{name}: no held-out task left: of its {len(rows)} rows, {overlap} share "
                             f"numbers and target with a training task and {repeats} repeat an earlier row")
        if overlap:
            log.warning("%s: dropped %d of %d held-out rows that share numbers and target with a training task "
                        "(%d held-out tasks remain)", name, overlap, len(rows), len(out))
        if repeats:
            log.warning("%s: dropped %d of %d held-out rows that repeat an earlier row's numbers and target",
                        name, repeats, len(rows))
        return out

    n = cfg.tasks.num_eval
    quota = _count_quota(cfg)
    limit = HELD_OUT_ATTEMPTS_PER_TASK * n + HELD_OUT_ATTEMPTS_MIN
    out, seen, overlap, repeats, attempts = [], set(), 0, 0, 0
    for problem in task.candidates(cfg.tasks.eval_seed, cfg):
        attempts += 1
        if problem is not None and quota.get(task.stratum(problem), 1) > 0:
            key = task.identity(problem)
            if key in taken:
                overlap += 1
            elif key in seen:
                repeats += 1
            else:
                seen.add(key)
                out.append(problem)
                if quota:
                    quota[task.stratum(problem)] -= 1
                if len(out) == n:
                    break
        if attempts >= limit:
            raise ValueError(
                f"could generate only {len(out)} of tasks.num_eval={n} held-out tasks apart from the {len(train)} "
                f"training tasks in {attempts} draws ({overlap} were training tasks, {repeats} repeats): the task "
                "space is too small for these ranges; widen the task's ranges (tasks.options) or lower tasks.num_train/"
                "tasks.num_eval" + (f" (tasks.eval_stratify_counts asks for {_count_quota(cfg)} tasks per stratum; "
                                    f"short: {_shortfall(_count_quota(cfg), quota)}; false takes them as drawn)"
                                    if quota else ""))
    if overlap or repeats:
        log.info("held-out set (tasks.eval_seed %d): skipped %d generated tasks that are training tasks and %d repeats",
                 cfg.tasks.eval_seed, overlap, repeats)
    return out


def _shortfall(asked: dict[Any, int], left: dict[Any, int]) -> str:
    """The strata that did not get their share: ``"coin_flip 9 of 16"``."""
    return ", ".join(f"{printable(k, 60)} {asked[k] - v} of {asked[k]}" for k, v in left.items() if v > 0)


def _count_quota(cfg: RLCRConfig) -> dict[Any, int]:
    """Held-out tasks per stratum with ``tasks.eval_stratify_counts`` (equal shares of ``tasks.num_eval`` over the
    task's :meth:`~rlcr.tasks.base.Task.strata`, the remainder to the first ones; Countdown: the number counts,
    smallest first); empty (no quota) without it, or with a single stratum or none (a task whose generation draws
    no strata: :meth:`~rlcr.tasks.base.Task.strata` empty)."""
    counts = list(_task(cfg).strata(cfg))
    if not cfg.tasks.eval_stratify_counts or len(counts) <= 1:
        return {}
    share, extra = divmod(cfg.tasks.num_eval, len(counts))
    return {c: share + (i < extra) for i, c in enumerate(counts)}


def task_sets(cfg: RLCRConfig) -> tuple[list[Any], list[Any]]:
    """(training pool, held-out set): each identity once, and no held-out task is a training task.

    Raises ValueError when an iteration's ``rollout.prompts_per_iteration`` exceeds the distinct training tasks.
    """
    train = training_pool(cfg)
    if cfg.rollout.prompts_per_iteration > len(train):
        source = (printable(cfg.tasks.train_file) if cfg.tasks.train_file
                  else f"tasks.num_train={cfg.tasks.num_train} generated")
        raise ValueError(f"rollout.prompts_per_iteration={cfg.rollout.prompts_per_iteration} exceeds the {len(train)} "
                         f"distinct training tasks ({source}): an iteration's prompts must be distinct tasks")
    return train, held_out_set(cfg, train)


def sft_tasks(cfg: RLCRConfig, n: int, train: Sequence[Any] | None = None) -> list[Any]:
    """``n`` distinct training tasks for the SFT warm-start, each ready for it
    (:meth:`~rlcr.tasks.base.Task.sft_problem`: Countdown's with a checked reference solution).

    Drawn from the run's training pool (``train``, default :func:`training_pool`), so the warm-start
    never sees a held-out task; the choice is seeded by ``cfg.run.seed``. A Countdown task without a correct
    ``solution`` (public datasets carry none) gets one from the solver; tasks without a trace are passed over.
    Raises ValueError when the pool has fewer than ``n`` distinct (usable) tasks.
    """
    task = _task(cfg)
    pool = _distinct(task, training_pool(cfg) if train is None else train)
    if n < 0:
        raise ValueError(f"the SFT task count must be >= 0, got {n}")
    if n > len(pool):
        raise ValueError(f"the SFT warm-start asks for {n} tasks but the training pool has only {len(pool)} "
                         "distinct tasks; ask for fewer or raise tasks.num_train")
    order = list(range(len(pool)))
    random.Random(sft_task_order_seed(cfg.run.seed)).shuffle(order)
    out: list[Any] = []
    for i in order:
        if len(out) == n:
            break
        ready = task.sft_problem(pool[i])
        if ready is not None:
            out.append(ready)
    if len(out) < n:
        raise ValueError(f"the SFT warm-start asks for {n} tasks but only {len(out)} of the {len(pool)} distinct "
                         "training tasks are solvable" if task.name == "countdown" else
                         f"the SFT warm-start asks for {n} tasks but only {len(out)} of the {len(pool)} distinct "
                         "training tasks have a worked solution")
    return out


def _epoch_orders(seed: int, n: int, p: int, last_epoch: int) -> list[list[int]]:
    """Orders of epochs 0..last_epoch: each a seeded shuffle of range(n), the head of each epoch
    rearranged so that the iteration straddling an epoch boundary draws no task twice."""
    orders: list[list[int]] = []
    for epoch in range(last_epoch + 1):
        order = list(range(n))
        random.Random(task_order_seed(seed, epoch)).shuffle(order)
        boundary = epoch * n
        tail = boundary - boundary // p * p  # positions of the previous epoch in the straddling iteration
        if epoch and tail:
            taken = set(orders[-1][n - tail:])
            head_len = p - tail  # <= n - tail, since n >= p
            head = [i for i in order if i not in taken][:head_len]
            in_head = set(head)
            order = head + [i for i in order if i not in in_head]
        orders.append(order)
    return orders


def prompts_for_iteration(cfg: RLCRConfig, train: Sequence[Any], iteration: int) -> list[tuple[int, Any]]:
    """P = ``rollout.prompts_per_iteration`` distinct prompts for iteration k (k >= 1), deterministic in (seed, k).

    The iterations read consecutive stretches of a stream of epochs, each epoch a seeded shuffle of the
    training set, so every task is used once per epoch. Where an iteration straddles two epochs (N not a
    multiple of P), the next epoch starts with tasks the iteration has not drawn yet, so no iteration
    draws a task twice. ``prompt_id`` is the task's index in the training set, so a prompt is traceable
    across iterations. ``train`` should be the pool of :func:`task_sets` (each identity once).
    """
    p, n = cfg.rollout.prompts_per_iteration, len(train)
    if p > n:
        raise ValueError(f"rollout.prompts_per_iteration={p} exceeds the {n} training tasks")
    if iteration < 1:
        raise ValueError(f"iterations count from 1, got {iteration}")
    start = (iteration - 1) * p
    orders = _epoch_orders(cfg.run.seed, n, p, (start + p - 1) // n)
    chosen = [orders[pos // n][pos % n] for pos in range(start, start + p)]
    return [(i, train[i]) for i in chosen]
