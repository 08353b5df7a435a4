"""The function the ``reasoning_gym`` task's bounded verifier runs in its worker process (never in a run's own
processes): one of reasoning-gym's items rebuilt from its dataset, settings, seed and index, and an answer scored by
that dataset's own ``score_answer``. Rebuilding the item (instead of shipping it) gives ``score_answer`` exactly the
entry the generator made, metadata types included; the datasets are kept per settings for the worker's life."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=64)
def _dataset(name: str, settings: str, seed: int, size: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(settings))


def score(name: str, settings: str, seed: int, size: int, index: int, answer: str) -> float:
    """``score_answer(answer, entry)`` of item ``index`` of dataset ``name`` (``settings``: its generator's settings
    as JSON), as a float in [0, 1]."""
    dataset = _dataset(name, settings, int(seed), int(size))
    value = float(dataset.score_answer(answer, dataset[int(index)]))
    return min(max(value, 0.0), 1.0) if value == value else 0.0
