"""What each training method is (docs/design.md §9): one record per method, read wherever its shape matters
(which turns are sampled, which samples are trained on), beside the registries of its reward
(:data:`rlcr.core.rewards.ANSWER_REWARDS`) and advantages (:data:`rlcr.core.advantages.METHOD_ADVANTAGES`).

===============  ===========  ======================  =====================================================
method           single_turn  trains_confidence_turn  what it is
===============  ===========  ======================  =====================================================
``rlcr``         no           yes                     two-turn RLCR: G_a answers, then G_c confidences per
                                                      answer, both trained (accuracy, Brier)
``rlcr_single``  yes          no                      the paper's one-turn RLCR: answer and confidence in one
                                                      response, rewarded accuracy + λ_conf·Brier
``rlvr``         no           no                      RL on accuracy alone; its confidence turn is asked only
                                                      at evaluation, never trained
===============  ===========  ======================  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Method", "METHOD_RECORDS", "METHODS", "method_record"]


@dataclass(frozen=True)
class Method:
    """One training method's shape."""

    name: str
    single_turn: bool
    """The answer and its stated confidence come in one response: there is no second (confidence) turn, in
    training or evaluation."""
    trains_confidence_turn: bool
    """Training samples ``rollout.num_generations_confidence`` confidences per answer in a second turn and
    updates on them; otherwise training rollouts hold answers only."""

    @property
    def has_confidence_turn(self) -> bool:
        """A second turn asks for the confidence (in training where it is trained, always at evaluation)."""
        return not self.single_turn

    def training_confidences(self, g_c: int) -> int:
        """Confidences per answer in a training rollout: ``g_c`` where the confidence turn is trained, else 0."""
        return g_c if self.trains_confidence_turn else 0


METHOD_RECORDS: dict[str, Method] = {
    "rlcr": Method("rlcr", single_turn=False, trains_confidence_turn=True),
    "rlcr_single": Method("rlcr_single", single_turn=True, trains_confidence_turn=False),
    "rlvr": Method("rlvr", single_turn=False, trains_confidence_turn=False),
}
"""Every method by name (``method.name``)."""
METHODS = tuple(METHOD_RECORDS)
"""The methods' names: two-turn RLCR, one-turn RLCR (the paper's), accuracy-only RLVR."""


def method_record(name: str) -> Method:
    """The record of method ``name``; a one-line ValueError naming the methods for an unknown one."""
    try:
        return METHOD_RECORDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r} (one of {', '.join(METHODS)})") from None
