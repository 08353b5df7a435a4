"""Every seed derived from the run's seed, in one place (reproducibility: docs/design.md §2–§4, §17).

A run has one seed, ``cfg.run.seed`` (held-out tasks use ``cfg.tasks.eval_seed``). Everything
random below it gets its own seed from a named derivation here, so that no two
streams share a seed by accident and the mixing constants live nowhere else::

    cfg.run.seed
    ├─ task_order_seed(seed, epoch)        shuffle of the training pool, per pass over it
    ├─ rollout_seed(seed, iteration)       seed of an iteration's rollouts
    │   ├─ + eval_salt(draw)               … of the held-out evaluation's rollouts (draw 0: + EVAL_SALT)
    │   ├─ answer_seed(·, prompt_id, k)    the k-th answer of a prompt (its own vLLM request seed)
    │   └─ confidence_seed(·, prompt_id, answer_id, h)
    │                                      the h-th confidence of one answer (its own request seed)
    ├─ update_seed(seed, iteration)        the update's mini-batch plan
    │   └─ mini_batch_seed(·, epoch)       the permutation of one epoch's rows
    ├─ mix(seed, PROBE_*_SALT)             the probe's three generate calls
    ├─ sft_task_order_seed(seed)           which training tasks the warm-start uses
    └─ sft_seed(seed)                      the warm-start's wrong answers and stated confidences

The values are part of a run's identity: a derivation must never change (rollouts
and updates are tested to be reproducible), only new ones may be added.
Pure Python.
"""

from __future__ import annotations

__all__ = [
    "SEED_MODULUS",
    "EVAL_SALT",
    "eval_salt",
    "ANSWER_SALT",
    "CONFIDENCE_SALT",
    "PROBE_TURN1_SALT",
    "PROBE_TURN2_SALT",
    "PROBE_FORCED_SALT",
    "mix",
    "rollout_seed",
    "answer_seed",
    "confidence_seed",
    "update_seed",
    "mini_batch_seed",
    "task_order_seed",
    "sft_task_order_seed",
    "sft_seed",
]

SEED_MODULUS = 2**31 - 1
"""Mixed seeds stay below this (a prime; every RNG here takes a 31-bit seed)."""
_MIX = 1_000_003  # large prime multiplier of the seed-mixing hashes
_STEP = 7_919  # prime multiplier of iteration / epoch counters

EVAL_SALT = 7_777_777
"""Added to an iteration's rollout seed for the held-out evaluation (its samples differ from training's)."""
ANSWER_SALT, CONFIDENCE_SALT = 0, 1
"""Salts of the two rollout stages' request seeds (turn 1, turn 2)."""
PROBE_TURN1_SALT, PROBE_TURN2_SALT, PROBE_FORCED_SALT = 1, 2, 3
"""Salts of the probe's three generate calls (turn 1, turn 2, forced answers) under the probe seed."""


def mix(seed: int, *keys: int) -> int:
    """Hash ``seed`` and the integer ``keys`` into a seed in ``[0, SEED_MODULUS)`` (no keys: ``seed`` unchanged).

    The rollout stages mix the iteration's seed, the stage salt and a sample's identity into
    that sample's own request seed (:func:`answer_seed`, :func:`confidence_seed`).
    """
    h = seed
    for k in keys:
        h = (h * _MIX + int(k) + 1) % SEED_MODULUS
    return h


def rollout_seed(seed: int, iteration: int, *, salt: int = 0) -> int:
    """Engine seed of iteration ``iteration``'s rollouts: distinct per iteration, fixed by the run's seed.
    ``salt`` (e.g. :data:`EVAL_SALT`) is added to the mixed value."""
    return (seed * _MIX + iteration * _STEP) % SEED_MODULUS + salt


def answer_seed(seed: int, prompt_id: int, answer_index: int) -> int:
    """Request seed of answer ``answer_index`` of prompt ``prompt_id`` under rollout seed ``seed``
    (:func:`rollout_seed`, evaluation salt included): the sample depends on this seed and the prompt only,
    not on the batch, actor or engine it is drawn in (docs/reproducibility.md)."""
    return mix(seed, ANSWER_SALT, prompt_id, answer_index)


def confidence_seed(seed: int, prompt_id: int, answer_id: int, confidence_index: int) -> int:
    """Request seed of confidence ``confidence_index`` of answer ``answer_id`` of prompt ``prompt_id``
    (the turn-2 counterpart of :func:`answer_seed`; other salt, one key more)."""
    return mix(seed, CONFIDENCE_SALT, prompt_id, answer_id, confidence_index)


def eval_salt(draw: int = 0) -> int:
    """Salt of the held-out evaluation's rollouts for sample draw ``draw``: draw 0 (what every flow evaluation
    uses) is :data:`EVAL_SALT`; draw k > 0 re-samples the same tasks with other seeds, to measure how much one
    evaluation moves between draws (``rlcr eval --draw``)."""
    if draw < 0:
        raise ValueError(f"draw must be >= 0, got {draw}")
    return EVAL_SALT if draw == 0 else mix(EVAL_SALT, draw)


def update_seed(seed: int, iteration: int) -> int:
    """Seed of iteration ``iteration``'s update: its mini-batch plan (:func:`mini_batch_seed` per epoch)."""
    return seed * _STEP + iteration


def mini_batch_seed(seed: int, epoch: int) -> int:
    """Seed of the row permutation of one epoch of an update (``seed``: :func:`update_seed`)."""
    return int(seed) * _MIX + epoch


def task_order_seed(seed: int, epoch: int) -> int:
    """Seed of the shuffle of the training pool for its ``epoch``-th pass (prompts of an iteration)."""
    return seed * _STEP + epoch


def sft_task_order_seed(seed: int) -> str:
    """Seed (a string: :class:`random.Random` hashes it) of the shuffle that picks the warm-start's tasks
    from the training pool."""
    return f"rlcr-sft-{seed}"


def sft_seed(seed: int) -> int:
    """Seed of the warm-start examples (which turn-2 examples show a wrong answer; the stated confidences)."""
    return seed + 17
