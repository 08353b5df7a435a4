"""What an rlcr run's figures and config become in MLflow: a ``metrics.json`` dict as flat numeric metrics
(``eval/ece``, ``eval/ece_ci_low``…) with its headline figures again under ``Summary/``, and a config as
flat string params, every key made a valid MLflow name and every value cut to MLflow's limits. Pure: no MLflow
import; :mod:`rlcr.tracking` sends what these return."""

from __future__ import annotations

import math
import posixpath
import re
from typing import Any, Mapping

__all__ = ["HEADLINE", "SENTINEL", "STARTED", "metric_key", "flatten_metrics", "tracked_metrics", "flatten_params"]

SENTINEL = "rlcr/iteration"
"""Metric logged alone after all of an iteration's other metrics (value and step = the iteration): the steps
it holds are the iterations logged completely."""
STARTED = "rlcr/iteration_started"
"""Metric logged alone before any of an iteration's metrics: a step it holds and :data:`SENTINEL` does not is
an iteration cut off mid-log, completed key by key."""
HEADLINE = {"rollout/answer/reward_mean": "Summary/answer_reward",
            "rollout/confidence/reward_mean": "Summary/confidence_reward", "eval/accuracy": "Summary/accuracy",
            "eval/ece": "Summary/ece", "eval/brier": "Summary/brier", "eval/auroc": "Summary/auroc"}
"""Headline figures logged a second time under ``Summary/``: MLflow's run page groups charts by key prefix in
sorted order (the layout is kept only in the browser), so a capitalised section comes before ``engines/…``,
``eval/…``: a run's first charts are its rewards, held-out accuracy and calibration."""
MAX_KEY = 250          # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
MAX_PARAM_VALUE = 6000  # MAX_PARAM_VAL_LENGTH
MAX_TAG_VALUE = 8000    # MAX_TAG_VAL_LENGTH
PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
METRICS_PER_BATCH = 1000  # MAX_METRICS_PER_BATCH
SKIPPED_LISTS = frozenset({"history"})
"""List-valued keys not flattened into metrics: ``update/history`` holds every optimizer step (its summaries,
``loss_first``, ``grad_norm_last``…, are logged); it stays in ``metrics.json``."""

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_./\- ]")


def metric_key(key: str) -> str:
    """``key`` made a valid MLflow metric/param name: characters other than letters, digits, ``_ . / -`` and
    space become ``_``; empty, ``.`` and ``..`` path segments are dropped or made ``_``; at most 250 chars."""
    parts = [_BAD_CHARS.sub("_", p) for p in str(key).split("/")]
    parts = [("_" * len(p) if p in (".", "..") else p) for p in parts if p]
    out = "/".join(parts)[:MAX_KEY].rstrip("/") or "_"
    return out if posixpath.normpath(out) == out else out.replace(".", "_")


def _number(value: Any) -> float | None:
    if isinstance(value, (bool, int, float)) and not isinstance(value, complex):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def flatten_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric leaves of a ``metrics.json`` dict as ``{"eval/ece": 0.12, …}``: nested keys joined
    with ``/``; ``ci: {name: [low, high]}`` → ``<name>_ci_low`` / ``<name>_ci_high`` (and ``<name>_ci: [l, h]``
    the same); other lists by index (``eval/reliability/3/accuracy``) except :data:`SKIPPED_LISTS`; bools as
    0/1; strings, None, NaN and ±inf skipped."""
    out: dict[str, float] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                k = str(k)
                sub = f"{path}/{k}" if path else k
                if k == "ci" and isinstance(v, Mapping):
                    for ck, cv in v.items():
                        pair(cv, f"{path}/{ck}_ci" if path else f"{ck}_ci")
                elif k.endswith("_ci"):
                    pair(v, sub)
                elif not (k in SKIPPED_LISTS and isinstance(v, (list, tuple))):
                    walk(v, sub)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}/{i}" if path else str(i))
        elif (f := _number(value)) is not None:
            out[metric_key(path)] = f

    def pair(value: Any, path: str) -> None:
        if isinstance(value, (list, tuple)) and len(value) == 2:
            walk(value[0], f"{path}_low")
            walk(value[1], f"{path}_high")
        else:
            walk(value, path)

    walk(metrics, "")
    return out


def tracked_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """What an iteration's ``metrics.json`` dict is logged as: :func:`flatten_metrics` (less the markers) and
    its :data:`HEADLINE` figures again under ``Summary/``."""
    flat = {k: v for k, v in flatten_metrics(metrics).items() if k not in (SENTINEL, STARTED)}
    return {**flat, **{HEADLINE[k]: v for k, v in flat.items() if k in HEADLINE}}


def flatten_params(params: Mapping[str, Any]) -> dict[str, str]:
    """A config dict as MLflow params: nested dicts joined with ``.`` (``engine_resources.GPU``), every value
    ``str()``-ed (lists and None included), keys made valid and values cut to MLflow's 6000 characters."""
    out: dict[str, str] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, Mapping) and value:
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k))
        else:
            out[metric_key(path)] = str(value)[:MAX_PARAM_VALUE]

    if params:  # an empty config is no parameter (not ``_ = {}``)
        walk(params, "")
    return out
