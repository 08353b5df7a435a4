"""An rlcr task from outside rlcr: add up a list of numbers (rlcr's docs/tasks.md, "A task in forty lines").

The task is :class:`rlcr_sumlist.task.SumList` (entry point ``sumlist`` of group ``rlcr.tasks``); its verifier,
:func:`rlcr_sumlist.check.same_number`, runs in rlcr's bounded worker process, which imports this package: keep
it light.
"""
