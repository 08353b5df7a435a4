"""The masked GRPO update (docs/design.md §8): batching and the update in-process, Ray Train on top.

* :mod:`rlcr.train.batching` — rows → samples → mini-batches → token-budget micro-batches;
* :mod:`rlcr.train.logprobs` — log π at masked tokens (prefix-tree attention);
* :mod:`rlcr.train.objectives` — the objectives, registered by name;
* :mod:`rlcr.train.update` — the optimizer, its schedule and the step loop (no Ray);
* :mod:`rlcr.train.checkpoint` — sealed, finite checkpoints in the artifact store;
* :mod:`rlcr.train.worker` — one rank's state and the methods the driver calls on it (:mod:`rlcr.train.rpc`);
* :mod:`rlcr.train.trainer` — :class:`~rlcr.train.trainer.PolicyTrainer`, Ray Train workers that live for a
  run, and the standalone :func:`~rlcr.train.trainer.run_update` (imports Ray lazily);
* :mod:`rlcr.train.sft` — the format warm-start (SFT) on a task's traces.

Nothing is imported here, so that naming a submodule (``from rlcr.train.sft import …``) does not load torch.
"""
