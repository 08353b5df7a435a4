"""The ``reasoning_gym`` task: reasoning-gym's seeded generators (the real package, offline) as rlcr's task source. A
mixture by weight, deterministic by seed, the held-out set disjoint and split by dataset; answers scored by each
dataset's own ``score_answer`` in the bounded worker; an unknown dataset or setting is one line with the nearest
names."""

import pytest

from rlcr.config import RLCRConfig
from rlcr.tasks.registry import get_task

MIXTURE = {"basic_arithmetic": {"weight": 2, "max_terms": 3, "max_digits": 2}, "leg_counting": {}}


def _cfg(**tasks) -> RLCRConfig:
    return RLCRConfig(tasks={"name": "reasoning_gym", "num_train": 30, "num_eval": 8,
                             "options": {"datasets": MIXTURE}, **tasks})


def test_a_mixture_is_drawn_by_seed_and_the_held_out_set_is_disjoint_and_split_by_dataset():
    from rlcr.runs.task_sets import held_out_set, training_pool

    task = get_task("reasoning_gym")
    cfg = _cfg()
    pool = training_pool(cfg)
    assert [task.identity(p) for p in pool] == [task.identity(p) for p in training_pool(cfg)]  # by seed
    other = training_pool(cfg.model_copy(update={"run.seed": cfg.run.seed + 1}))
    assert [task.identity(p) for p in pool] != [task.identity(p) for p in other]
    counts = {d: sum(p.dataset == d for p in pool) for d in MIXTURE}
    assert counts["basic_arithmetic"] > counts["leg_counting"] > 0  # weight 2 against 1
    held = held_out_set(cfg, pool)
    assert not {task.identity(p) for p in held} & {task.identity(p) for p in pool}
    assert sorted(task.stratum(p) for p in held) == ["basic_arithmetic"] * 4 + ["leg_counting"] * 4
    assert task.strata(cfg) == ["basic_arithmetic", "leg_counting"]
    p = held[0]
    assert task.from_record(task.to_record(p)) == p
    assert [f.name for f in task.record_fields()] == list(task.to_record(p))


def test_answers_are_scored_by_the_dataset_in_the_bounded_worker():
    from rlcr.runs.task_sets import training_pool

    task = get_task("reasoning_gym")
    p = training_pool(_cfg())[0]
    with task.scoring(3) as stats:
        assert task.score(f"<think>ok</think>\n<answer>{p.answer}</answer>", p, format_score=0.1) == 1.0
        assert task.score("<answer>not it</answer>", p, format_score=0.1) == 0.1
        assert task.score(p.answer, p, format_score=0.1) == 0.0  # no <answer> on the last line
    assert stats.timeouts == 0
    trace = task.warm_start(p, None)
    assert trace.answer == p.answer and task.score(task.warm_start_completion(trace), p, format_score=0.0) == 1.0


@pytest.mark.parametrize("datasets, words", [
    ({"basic_arithmetc": {}}, ["unknown reasoning-gym dataset 'basic_arithmetc'", "nearest: basic_arithmetic"]),
    ({"basic_arithmetic": {"max_term": 3}}, ["unknown setting 'max_term'", "did you mean max_terms"]),
    ({"basic_arithmetic": {"min_terms": 5, "max_terms": 2}}, ["reasoning-gym refuses its settings"]),
    ({"leg_counting": {"weight": 0}}, ["weight must be a positive number"]),
    ({}, ["name one dataset at least"]),
])
def test_a_bad_mixture_is_one_line_naming_the_field(datasets, words):
    with pytest.raises(ValueError) as err:
        RLCRConfig(tasks={"name": "reasoning_gym", "options": {"datasets": datasets}})
    line = next(x for x in str(err.value).splitlines() if "tasks.options.datasets" in x)
    assert all(w in line for w in words), line


def test_files_are_refused_and_the_task_check_passes():
    from rlcr.runs.preflight import check_task

    with pytest.raises(ValueError, match="generates its problems"):
        get_task("reasoning_gym").load("x.jsonl")
    check_task(_cfg())
