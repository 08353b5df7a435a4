"""Held-out evaluation of a policy: one answer and one confidence per task (SPEC §9)."""

from __future__ import annotations

from typing import Any, Sequence

from rlcr.config import RLCRConfig
from rlcr.metrics import calibration_metrics
from rlcr.rollout.pipeline import build_rollout_dataset, check_prompt_lengths, to_records
from rlcr.seeds import EVAL_SALT
from rlcr.tasks.countdown import CountdownTask

__all__ = ["evaluate_policy", "summarize_eval"]


def summarize_eval(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy over all answers; calibration over answers whose confidence parsed.

    An unparseable confidence has no value to calibrate; it is counted in
    ``confidence_parse_rate`` (and gets Brier reward 0 in training).
    """
    answers = {(r["prompt_id"], r["answer_id"]): r for r in rows if r["sample_type"] == "answer"}
    confs = [r for r in rows if r["sample_type"] == "confidence"]
    pairs = [(r["confidence"], answers[(r["prompt_id"], r["answer_id"])]["correct"])
             for r in confs if r["confidence"] is not None]
    metrics = calibration_metrics([c for c, _ in pairs], [y for _, y in pairs])
    n = len(answers)
    metrics.update({
        "n_tasks": n,
        "accuracy": sum(a["correct"] for a in answers.values()) / n if n else float("nan"),
        "accuracy_with_confidence": metrics.pop("accuracy"),
        "format_rate": sum((a["score"] or 0) > 0 for a in answers.values()) / n if n else float("nan"),
        "confidence_parse_rate": len(pairs) / len(confs) if confs else float("nan"),
    })
    return metrics


def evaluate_policy(
    cfg: RLCRConfig,
    tasks: Sequence[CountdownTask],
    *,
    policy_uri: str,
    iteration: int,
    engines=None,
    tokenizer_uri: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sample one answer and one confidence per held-out task; return (metrics, rows).
    ``policy_uri``/``engines``/``tokenizer_uri``: as in :func:`rlcr.rollout.pipeline.generate_rollouts`."""
    indexed = list(enumerate(tasks))
    check_prompt_lengths(cfg, indexed, tokenizer_uri or policy_uri)
    ds = build_rollout_dataset(cfg, indexed, policy_uri, iteration, engines=engines.names if engines else None,
                               g_a=1, g_c=1, salt=EVAL_SALT)
    rows = to_records(ds.take_all(), "eval", iteration)
    return summarize_eval(rows), rows
