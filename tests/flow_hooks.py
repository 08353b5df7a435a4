"""Stage hook for the flow tests (``RLCR_STAGE_HOOK=flow_hooks:hook``): inject failures at a stage."""

ACTIONS: dict[tuple[str, int], object] = {}
SEEN: list[tuple[str, int]] = []


def hook(stage: str, iteration: int) -> None:
    SEEN.append((stage, iteration))
    action = ACTIONS.get((stage, iteration))
    if action is None:
        return
    if isinstance(action, BaseException):
        raise action
    action()
