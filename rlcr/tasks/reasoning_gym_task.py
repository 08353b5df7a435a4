"""The ``reasoning_gym`` task: problems from reasoning-gym's seeded procedural generators (about a hundred:
arithmetic, algebra, algorithmic, logic, games, graphs, cognition), one dataset or a weighted mixture, each with its
generator's own settings (docs/tasks.md). Needs the optional extra: ``pip install 'rlcr[reasoning-gym]'``.

    tasks:
      name: reasoning_gym
      options:
        datasets:
          basic_arithmetic: {weight: 2, min_terms: 2, max_terms: 3, max_digits: 2}
          leg_counting: {}

* **Rows**: draw i of a stream picks a dataset by weight (a seeded choice) and takes that dataset's next item; each
  dataset is reasoning-gym's generator under its settings with a seed derived from the stream's (``run.seed`` for
  training, ``tasks.eval_seed`` for the held-out set), so the same settings give the same problems. A problem's
  identity is its question, so the held-out set shares none with the training pool. Task files are not read: the
  generators are the source (for files, ``tasks.name: file``).
* **Strata**: the dataset: held-out sets are split evenly over the mixture's datasets, and every table and metric is
  per dataset.
* **Scores**: no ``<answer>`` on the last line → 0; the dataset's own ``score_answer`` gives 1.0 → the full score;
  anything below 1.0 (reasoning-gym's partial credit included: rlcr's accuracy is right or wrong, and the Brier
  reward needs that), out of time or raising → ``method.format_score``. ``score_answer`` runs in a bounded worker
  process (:class:`~rlcr.tasks.verify.BoundedVerifier`, ``scorer_timeout_s`` a call), on the item rebuilt there
  from its dataset, settings, seed and index (:mod:`rlcr.tasks.reasoning_gym_score`).
* **Warm-start**: format only: the item's own answer after an empty ``<think></think>`` (reasoning-gym gives no
  worked solutions), kept where the dataset scores it 1.0; the confidence turn is format-only as for every task.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Any, Hashable, Iterator, Mapping

from pydantic import Field, field_validator

from rlcr.tasks.base import Task, TaskOptions, WarmStart, extract_answer, register_task
from rlcr.tasks.verify import BoundedVerifier, in_batch, scoring_batch
from rlcr.untrusted import printable

__all__ = ["ReasoningGymTask", "ReasoningGymOptions", "GymProblem", "DATASET_SIZE", "check_datasets"]

DATASET_SIZE = 1_000_000
"""The size each generator is created with (items are made on demand, each from its own seed and index)."""
MAX_DATASETS = 64
INSTRUCTION = "Reason in <think> </think>, then give only the final answer in <answer> </answer> on the last line."
SYSTEM_PROMPT = (
    "Solve the problem. Think step by step inside <think> </think>, "
    "then write only the final answer inside <answer> </answer>."
)
SINGLE_TURN_SYSTEM_PROMPT = (
    "Solve the problem. Think step by step inside <think> </think>, "
    "then write only the final answer inside <answer> </answer>, "
    "then say how likely your answer is to be correct: optionally check it inside <analysis> </analysis>, "
    "then give a probability between 0 and 1 inside <confidence> </confidence>."
)
_NOT_SETTINGS = {"seed", "size"}


def _gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError("tasks.name reasoning_gym needs the reasoning-gym package: pip install "
                         "'rlcr[reasoning-gym]' (pinned in constraints.txt)") from None
    return reasoning_gym


def check_datasets(datasets: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The mixture validated against reasoning-gym's registry and each generator's own settings: ``{name:
    {"weight": w, **settings}}`` in name order. ValueError, one line: an unknown dataset or setting (with the
    nearest names), a bad weight, settings the generator refuses."""
    if not isinstance(datasets, Mapping) or not datasets:
        raise ValueError("name one dataset at least: {dataset_name: {setting: value, …}}")
    if len(datasets) > MAX_DATASETS:
        raise ValueError(f"at most {MAX_DATASETS} datasets, got {len(datasets)}")
    registry = _gym().factory.DATASETS
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(datasets):
        if name not in registry:
            close = difflib.get_close_matches(str(name), list(registry), n=3, cutoff=0.5)
            hint = f" (nearest: {', '.join(close)})" if close else f" ({len(registry)} datasets: see docs/tasks.md)"
            raise ValueError(f"unknown reasoning-gym dataset {printable(repr(name), 60)}{hint}")
        raw = datasets[name] if datasets[name] is not None else {}
        if not isinstance(raw, Mapping):
            raise ValueError(f"dataset {name!r}: its settings must be a mapping, got {type(raw).__name__}")
        settings = dict(raw)
        weight = settings.pop("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or weight <= 0:
            raise ValueError(f"dataset {name!r}: weight must be a positive number, got {printable(repr(weight), 40)}")
        config_cls = registry[name][1]
        fields = [f for f in getattr(config_cls, "__dataclass_fields__", {}) if f not in _NOT_SETTINGS]
        for key in settings:
            if key not in fields:
                close = difflib.get_close_matches(str(key), fields, n=3, cutoff=0.5)
                hint = f"; did you mean {' or '.join(close)}?" if close else ""
                raise ValueError(f"unknown setting {printable(repr(key), 60)} of dataset {name!r}{hint} (its "
                                 f"settings: {', '.join(fields) or 'none'})")
        try:
            json.dumps(settings, allow_nan=False)
            config_cls(**settings, seed=0, size=1).validate()
        except (AssertionError, ValueError, TypeError) as e:
            raise ValueError(f"dataset {name!r}: reasoning-gym refuses its settings: "
                             f"{printable(str(e) or type(e).__name__, 160)}") from None
        out[name] = {"weight": float(weight), **settings}
    return out


class ReasoningGymOptions(TaskOptions):
    datasets: dict[str, Any] = Field(default_factory=lambda: {"basic_arithmetic": {}})
    """The datasets to draw from, by reasoning-gym's name, each with its generator's settings and an optional
    ``weight`` (default 1: its share of the draws): ``{basic_arithmetic: {weight: 2, max_terms: 3}, leg_counting:
    {}}``."""
    scorer_timeout_s: float = Field(default=5.0, gt=0.0, le=600.0)
    """Seconds one call of a dataset's ``score_answer`` may take; a call out of time counts as not right."""
    instruction: str = Field(default=INSTRUCTION, min_length=1, max_length=2000)
    """Appended to each question (after a blank line): how to write the answer."""

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_datasets(value)


@dataclass(frozen=True)
class GymProblem:
    """One item: its ``question`` and ``answer``, the ``dataset`` and generator ``settings`` (JSON) it came from,
    the generator's ``seed`` and the item's ``index`` (which rebuild it), and how it is asked and scored."""

    question: str
    answer: str
    dataset: str
    settings: str
    seed: int
    index: int
    instruction: str = INSTRUCTION
    scorer_timeout_s: float = 5.0


_SCORERS: dict[float, BoundedVerifier] = {}


def _scorer(timeout_s: float) -> BoundedVerifier:
    if timeout_s not in _SCORERS:
        _SCORERS[timeout_s] = BoundedVerifier("rlcr.tasks.reasoning_gym_score:score", timeout_s=timeout_s,
                                              batch_base_s=max(2.0, timeout_s), memory_bytes=2 * 1024**3)
    return _SCORERS[timeout_s]


def _dataset_seed(seed: int, name: str) -> int:
    return int(hashlib.sha256(f"rlcr-reasoning-gym:{seed}:{name}".encode()).hexdigest()[:12], 16)


def _null(value: Any) -> bool:
    return value is None or type(value).__name__ == "NAType" or (isinstance(value, float) and math.isnan(value))


@register_task("reasoning_gym")
class ReasoningGymTask(Task):
    """reasoning-gym's generators as a task; answers scored by each dataset's ``score_answer``."""

    system_prompt = SYSTEM_PROMPT
    single_turn_system_prompt = SINGLE_TURN_SYSTEM_PROMPT
    stratum_label = "dataset"
    Options = ReasoningGymOptions

    def load(self, path: str, fields: Mapping[str, str] | None = None) -> list[GymProblem]:
        raise ValueError("task 'reasoning_gym' generates its problems (tasks.options.datasets); for problems in a "
                         "file use tasks.name: file")

    def candidates(self, seed: int, cfg: Any = None) -> Iterator[GymProblem | None]:
        o = self.options(cfg)
        gym = _gym()
        names = sorted(o.datasets)
        weights = [o.datasets[n]["weight"] for n in names]
        settings = {n: {k: v for k, v in o.datasets[n].items() if k != "weight"} for n in names}
        seeds = {n: _dataset_seed(seed, n) for n in names}
        made = {n: gym.create_dataset(n, seed=seeds[n], size=DATASET_SIZE, **settings[n]) for n in names}
        rng = random.Random(f"rlcr-reasoning-gym-mixture:{seed}")
        next_index = dict.fromkeys(names, 0)
        while True:
            name = rng.choices(names, weights)[0]
            index = next_index[name]
            next_index[name] += 1
            if index >= DATASET_SIZE:
                yield None
                continue
            try:
                item = made[name][index]
                question, answer = item["question"], item["answer"]
            except Exception:  # noqa: BLE001 — a generator that fails on a draw gives no problem
                yield None
                continue
            if not isinstance(question, str) or not question.strip() or answer is None or "\n" in str(answer):
                yield None
                continue
            yield GymProblem(question=question, answer=str(answer), dataset=name,
                             settings=json.dumps(settings[name], sort_keys=True), seed=seeds[name], index=index,
                             instruction=o.instruction, scorer_timeout_s=o.scorer_timeout_s)

    def strata(self, cfg: Any = None) -> list[Hashable]:
        return sorted(self.options(cfg).datasets)

    def identity(self, problem: GymProblem) -> Hashable:
        """The question with its whitespace collapsed."""
        return " ".join(problem.question.split())

    def stratum(self, problem: GymProblem) -> Hashable:
        return problem.dataset

    def to_record(self, problem: GymProblem) -> dict[str, Any]:
        return {"question": problem.question, "answer": problem.answer, "dataset": problem.dataset,
                "settings": problem.settings, "gen_seed": problem.seed, "gen_index": problem.index,
                "instruction": problem.instruction, "scorer_timeout_s": problem.scorer_timeout_s}

    def from_record(self, record: Mapping[str, Any]) -> GymProblem:
        instruction, timeout = record.get("instruction"), record.get("scorer_timeout_s")
        return GymProblem(question=str(record["question"]), answer=str(record["answer"]),
                          dataset=str(record["dataset"]), settings=str(record["settings"]),
                          seed=int(record["gen_seed"]), index=int(record["gen_index"]),
                          instruction=INSTRUCTION if _null(instruction) else str(instruction),
                          scorer_timeout_s=5.0 if _null(timeout) else float(timeout))

    def record_fields(self) -> list[Any]:
        import pyarrow as pa

        return [pa.field("question", pa.string(), nullable=False), pa.field("answer", pa.string(), nullable=False),
                pa.field("dataset", pa.string(), nullable=False), pa.field("settings", pa.string(), nullable=False),
                pa.field("gen_seed", pa.int64(), nullable=False), pa.field("gen_index", pa.int64(), nullable=False),
                pa.field("instruction", pa.string(), nullable=False),
                pa.field("scorer_timeout_s", pa.float64(), nullable=False)]

    def user_text(self, problem: GymProblem) -> str:
        return f"{problem.question}\n\n{problem.instruction}"

    def score(self, completion: Any, problem: GymProblem, *, format_score: float, score: float = 1.0) -> float:
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        scorer = in_batch(_scorer(problem.scorer_timeout_s))
        value = scorer(problem.dataset, problem.settings, problem.seed, DATASET_SIZE, problem.index, answer)
        return score if value == 1.0 else format_score

    def scoring(self, n: int) -> Any:
        """A batch of ``n`` answers shares the scorer's time budget (:meth:`BoundedVerifier.scoring`, entered
        when the batch first calls it)."""
        return scoring_batch(n)

    def warm_start(self, problem: GymProblem, rng: random.Random) -> WarmStart | None:
        """Format only: the item's own answer after an empty reasoning block, where its dataset scores it 1.0."""
        trace = WarmStart(reasoning="", answer=" ".join(problem.answer.split()))
        if self.score(self.warm_start_completion(trace), problem, format_score=0.0) != 1.0:
            return None
        return trace
