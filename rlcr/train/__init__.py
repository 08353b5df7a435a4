"""The masked GRPO update (docs/design.md §8): batching and the update in-process, Ray Train on top.

* :mod:`rlcr.train.batching` — rows → samples → mini-batches → token-budget micro-batches;
* :mod:`rlcr.train.logprobs` — log π at masked tokens (prefix-tree attention);
* :mod:`rlcr.train.objectives` — the objectives, registered by name;
* :mod:`rlcr.train.update` — the optimizer, its schedule and the step loop (no Ray);
* :mod:`rlcr.train.checkpoint` — sealed, finite checkpoints in the artifact store;
* :mod:`rlcr.train.worker` — one rank's state and the methods the driver calls on it (:mod:`rlcr.train.rpc`);
* :mod:`rlcr.train.trainer` — :class:`~rlcr.train.trainer.PolicyTrainer`, Ray Train workers that live for a
  run, and the standalone :func:`run_update` (imports Ray lazily).
"""

from rlcr.train.batching import MicroBatch, Sample, collate, pack_micro_batches, prepare_samples
from rlcr.train.checkpoint import NonFiniteError, save_checkpoint
from rlcr.train.logprobs import CompletionLogProbs
from rlcr.train.objectives import OBJECTIVES, register_objective
from rlcr.train.update import train_update


def run_update(*args, **kwargs):
    """See :func:`rlcr.train.trainer.run_update` (imported lazily: it pulls in Ray)."""
    from rlcr.train.trainer import run_update as _run

    return _run(*args, **kwargs)


__all__ = [
    "MicroBatch",
    "Sample",
    "collate",
    "pack_micro_batches",
    "prepare_samples",
    "CompletionLogProbs",
    "OBJECTIVES",
    "register_objective",
    "NonFiniteError",
    "save_checkpoint",
    "train_update",
    "run_update",
]
