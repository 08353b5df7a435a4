"""Task sets of a run: the training pool, the held-out set, and the prompts of each iteration."""

from __future__ import annotations

import random

from rlcr.config import RLCRConfig
from rlcr.tasks.countdown import CountdownTask, generate_tasks, load_tasks

__all__ = ["task_sets", "prompts_for_iteration"]


def task_sets(cfg: RLCRConfig) -> tuple[list[CountdownTask], list[CountdownTask]]:
    """Training and held-out evaluation tasks: loaded from files, or generated from seeds."""
    gen = dict(min_count=cfg.task_min_count, max_count=cfg.task_max_count,
               num_range=tuple(cfg.task_num_range), target_range=tuple(cfg.task_target_range))
    train = load_tasks(cfg.train_tasks) if cfg.train_tasks else generate_tasks(cfg.num_train_tasks, cfg.seed, **gen)
    held_out = load_tasks(cfg.eval_tasks) if cfg.eval_tasks else generate_tasks(cfg.num_eval_tasks, cfg.eval_seed, **gen)
    if not train:
        raise ValueError("the training task set is empty")
    return train, held_out


def prompts_for_iteration(cfg: RLCRConfig, train: list[CountdownTask], iteration: int) -> list[tuple[int, CountdownTask]]:
    """P prompts for iteration k, drawn without replacement from an epoch-wise shuffle (seeded).

    ``prompt_id`` is the task's index in the training set, so a prompt is traceable across iterations.
    """
    p = cfg.prompts_per_iteration
    start = (iteration - 1) * p
    chosen: list[int] = []
    while len(chosen) < p:
        epoch, offset = divmod(start + len(chosen), len(train))
        order = list(range(len(train)))
        random.Random(cfg.seed * 7_919 + epoch).shuffle(order)
        chosen.append(order[offset])
    return [(i, train[i]) for i in chosen]
