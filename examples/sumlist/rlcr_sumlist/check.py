"""The verifier, run by rlcr's BoundedVerifier in a worker process (time and memory bounded)."""


def same_number(answer: str, total: int) -> bool:
    """Whether the model's answer is the number ``total`` (``"42"``, ``" 42.0 "``)."""
    try:
        return float(answer.strip()) == total
    except ValueError:
        return False
