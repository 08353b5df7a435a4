"""Evaluation suites: a fixed set of problem families outside a run's training task, each answered and scored
like a held-out set, each reported on its own (docs/probe.md, "Out-of-domain suites").

A suite file (``configs/suites/ood.yaml``) names reasoning-gym datasets ("families"), each with its generator's
settings, how many problems each family holds, and the seed of its problems::

    name: ood
    seed: 7301
    n: 64
    families:
      syllogism: {}
      basic_arithmetic: {min_terms: 2, max_terms: 2, max_digits: 1}

The suite's problems are one held-out set of the ``reasoning_gym`` task (:mod:`rlcr.tasks.reasoning_gym_task`)
over those datasets, drawn from ``seed`` in equal shares, none of them a problem of the run's own training pool;
so a suite is the same problems for every checkpoint it evaluates, and two checkpoints' answers pair by task.
The figures per family are :func:`rlcr.evaluation.evaluate.summarize_eval`'s (accuracy, ECE, Brier and AUROC with
bootstrap 95% intervals over problems), and the pooled figures are over every family's answers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlcr.config import MAX_SEED, RLCRConfig
from rlcr.evaluation.evaluate import compare_evaluations, summarize_eval
from rlcr.untrusted import InvalidInput, printable

__all__ = ["Suite", "load_suite", "evaluate_suite", "suite_config", "suite_tasks", "summarize_suite", "compare_suite",
           "suite_metrics", "SUITE_TASK", "MAX_FAMILIES", "MAX_PER_FAMILY"]

SUITE_TASK = "reasoning_gym"
"""The task a suite's problems are drawn from."""
MAX_FAMILIES = 32
MAX_PER_FAMILY = 2000


class Suite(BaseModel):
    """A suite file, validated: every field below, nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    """What tables, records and trackers call the suite."""
    description: str = Field(default="", max_length=2000)
    """What the suite measures, in a sentence or two (shown by nothing; for the reader of the file)."""
    seed: int = Field(ge=0, le=MAX_SEED)
    """Seed of the suite's problems (the held-out seed of its generators): fixed, so that every checkpoint
    answers the same problems."""
    n: int = Field(ge=1, le=MAX_PER_FAMILY)
    """Problems per family."""
    families: dict[str, dict[str, Any]] = Field(min_length=1, max_length=MAX_FAMILIES)
    """reasoning-gym datasets by name, each with its generator's settings (``{}``: its defaults)."""

    @field_validator("families", mode="before")
    @classmethod
    def _families(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        out = {}
        for name, settings in value.items():
            settings = {} if settings is None else settings
            if isinstance(settings, Mapping) and "weight" in settings:
                raise ValueError(f"family {printable(repr(name), 60)}: a suite's families have no weight (each "
                                 "holds n problems)")
            out[name] = settings
        return out

    @field_validator("families")
    @classmethod
    def _known(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from rlcr.tasks.reasoning_gym_task import check_datasets

        checked = check_datasets(value)
        return {name: {k: v for k, v in settings.items() if k != "weight"} for name, settings in checked.items()}

    def datasets(self) -> dict[str, dict[str, Any]]:
        """``tasks.options.datasets`` of the suite's task: each family once, in equal shares."""
        return {name: dict(settings) for name, settings in self.families.items()}


def load_suite(path: str | Path) -> Suite:
    """The suite in file ``path``; :class:`InvalidInput`, one line naming the file and the field, for a file
    that is missing, too large, not YAML, or a field that is wrong (an unknown dataset or setting with the
    nearest names)."""
    from rlcr.config.loading import ConfigError, read_config_text, safe_yaml

    name = printable(path)
    try:
        data = safe_yaml(read_config_text(path), name)
    except ConfigError as e:
        raise InvalidInput(str(e).replace("config file", "suite file")) from None
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{name}: a suite file is a mapping (name, seed, n, families), not "
                           f"{type(data).__name__}")
    try:
        return Suite.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "suite"
        reason = re.sub(r"^(Value error|Assertion failed), ", "", err["msg"])
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise InvalidInput(f"{name}: {printable(where, 80)}: {printable(reason, 300)}{more}") from None


def suite_config(cfg: RLCRConfig, suite: Suite) -> RLCRConfig:
    """``cfg`` with its task replaced by the suite's: the ``reasoning_gym`` task over the suite's families,
    ``n`` held-out problems of each from the suite's seed. The method, model, decoding and evaluation
    settings stay ``cfg``'s (a run's checkpoint is asked as that run asks its own tasks)."""
    tasks = {"name": SUITE_TASK, "options": {"datasets": suite.datasets()},
             "num_train": max(cfg.tasks.num_train, cfg.rollout.prompts_per_iteration),  # not drawn: a suite trains none
             "num_eval": suite.n * len(suite.families), "eval_seed": suite.seed, "eval_stratify_counts": True}
    try:
        return RLCRConfig.from_dict({**cfg.model_dump(mode="json"), "tasks": tasks}, source=f"suite {suite.name}")
    except ValueError as e:
        raise InvalidInput(printable(e, 400)) from None


def suite_tasks(cfg: RLCRConfig, suite: Suite, trained_on: RLCRConfig | None = None) -> list[Any]:
    """The suite's problems (``n`` per family, in equal shares, the same for every checkpoint): the held-out
    set of :func:`suite_config`'s task. ``trained_on``: the config of the run whose checkpoint is evaluated;
    where that run trained on reasoning-gym too, its training pool is kept out of the suite's problems."""
    from rlcr.runs.task_sets import held_out_set, training_pool

    taken = training_pool(trained_on) if trained_on is not None and trained_on.tasks.name == SUITE_TASK else []
    return held_out_set(suite_config(cfg, suite), taken)


def evaluate_suite(cfg: RLCRConfig, suite: Suite, policy: str, *, trained_on: RLCRConfig | None = None,
                   draw: int = 0, problems: Sequence[Any] | None = None
                   ) -> tuple[dict[str, Any], list[dict[str, Any]], RLCRConfig]:
    """Checkpoint ``policy`` on the suite's problems (on engines of its own, :class:`EnginePool`; Ray must be
    up): ``(summarize_suite's result, the per-answer rows, the suite's config)``. ``trained_on``: as in
    :func:`suite_tasks`; ``problems``: those :func:`suite_tasks` already drew (default: drawn here); ``draw``:
    the sample draw (0: the flow's seeds)."""
    from rlcr.evaluation.evaluate import evaluate_policy
    from rlcr.rollout.engine import EnginePool

    suite_cfg = suite_config(cfg, suite)
    problems = suite_tasks(cfg, suite, trained_on=trained_on) if problems is None else problems
    with EnginePool(suite_cfg, policy) as engines:
        pooled, rows = evaluate_policy(suite_cfg, problems, policy_uri=policy, iteration=0, engines=engines,
                                       draw=draw)
    result = summarize_suite(rows, n_resamples=cfg.eval.bootstrap_resamples, seed=suite.seed, pooled=pooled)
    return {"suite": suite.name, "suite_seed": suite.seed, "n": suite.n, **result}, rows, suite_cfg


def _family_rows(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The rows of each family (the task's ``dataset`` column), in family order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(str(r["dataset"]), []).append(r)
    return dict(sorted(out.items()))


def summarize_suite(rows: Sequence[dict[str, Any]], *, n_resamples: int = 1000, seed: int = 0,
                    pooled: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"families": {family: figures}, "pooled": figures}``: :func:`summarize_eval` of each family's answers
    and of all of them (``pooled``: that of all of them, where the caller has it already)."""
    families = {name: summarize_eval(fam, n_resamples=n_resamples, seed=seed)
                for name, fam in _family_rows(rows).items()}
    return {"families": families,
            "pooled": pooled if pooled is not None else summarize_eval(rows, n_resamples=n_resamples, seed=seed)}


def compare_suite(rows_a: Sequence[dict[str, Any]], rows_b: Sequence[dict[str, Any]], *, n_resamples: int = 1000,
                  seed: int = 0, pooled: dict[str, Any] | None = None) -> dict[str, Any]:
    """A − B per family and pooled, paired by problem (:func:`compare_evaluations`): ``{"families": {family:
    difference}, "pooled": difference}`` (``pooled``: the pooled difference, where the caller has it already);
    a family only one side answered is left out."""
    a, b = _family_rows(rows_a), _family_rows(rows_b)
    families = {name: compare_evaluations(a[name], b[name], n_resamples=n_resamples, seed=seed)
                for name in a if name in b}
    return {"families": families, "pooled": pooled if pooled is not None
            else compare_evaluations(rows_a, rows_b, n_resamples=n_resamples, seed=seed)}


def suite_metrics(result: Mapping[str, Any], suite: str) -> dict[str, float]:
    """Flat ``{suite/<family>/<metric>: value}`` of a :func:`summarize_suite` result (``pooled`` as a family),
    finite values only: what a tracker logs."""
    out: dict[str, float] = {}
    named = {**result["families"], "pooled": result["pooled"]}
    for family, m in named.items():
        for key in ("accuracy", "ece", "brier", "auroc", "mean_confidence", "confidence_parse_rate"):
            v = m.get(key)
            if isinstance(v, (int, float)) and v == v and abs(v) != float("inf"):
                out[f"{suite}/{family}/{key}"] = float(v)
    return out
