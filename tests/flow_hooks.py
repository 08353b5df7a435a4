"""Stage hook for the flow tests (subscribed to :mod:`rlcr.events`): inject failures at a stage's start."""

ACTIONS: dict[tuple[str, int], object] = {}
SEEN: list[tuple[str, int]] = []


def hook(event) -> None:
    """A :class:`rlcr.events.StageEvent`: at the start of a stage attempt, record it and do its action."""
    if event.phase != "start":
        return
    SEEN.append((event.stage, event.iteration))
    action = ACTIONS.get((event.stage, event.iteration))
    if action is None:
        return
    if isinstance(action, BaseException):
        raise action
    action()
