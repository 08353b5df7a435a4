"""A run's task sets: a held-out set that is held out, distinct prompts per iteration (rlcr.runs.task_sets)."""

import json
import logging
from collections import Counter
from pathlib import Path

import pytest

from rlcr.config import RLCRConfig, load_config
from rlcr.runs.task_sets import prompts_for_iteration, sft_tasks, task_sets, training_pool
from rlcr.tasks.countdown import CountdownTask, compute_score, generate_tasks, save_tasks

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def ids(tasks):
    return {t.identity for t in tasks}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ----------------------------------------------------------------- held-out set
@pytest.mark.parametrize("n_sft", [60, 160])  # the demo's and bench/learning.py's warm-start sizes
def test_demo_held_out_shares_nothing_with_training_or_sft(n_sft):
    cfg = load_config(DEMO)
    train, held_out = task_sets(cfg)
    assert len(held_out) == cfg.tasks.num_eval and len(ids(held_out)) == len(held_out)
    assert len(ids(train)) == len(train)  # each training identity once
    assert not ids(held_out) & ids(train)
    sft = sft_tasks(cfg, n_sft)
    assert len(ids(sft)) == n_sft and ids(sft) <= ids(train) and not ids(sft) & ids(held_out)
    for t in sft:
        assert compute_score(f"<answer>{t.solution}</answer>", t.ground_truth) == 1.0
    assert sft_tasks(cfg, n_sft) == sft  # seeded


def test_held_out_keeps_the_configured_mix_of_number_counts():
    """A 2-/3-number mix whose small 2-number space is half taken by the training pool: the held-out set still
    holds each count in equal shares (eval_stratify_counts), disjoint from training; taken as drawn, 2-number
    tasks would be a third of it (a harder held-out set than the training distribution)."""
    cfg = RLCRConfig(tasks={"options": {"min_count": 2, "max_count": 3, "num_range": (1, 20), "target_range": (1, 60)},
                            "num_train": 600, "num_eval": 257})
    train, held_out = task_sets(cfg)
    counts = Counter(len(t.nums) for t in held_out)
    assert counts == {2: 129, 3: 128}  # the odd one goes to the smallest count
    assert len(ids(held_out)) == 257 and not ids(held_out) & ids(train)
    _, as_drawn = task_sets(cfg.model_copy(update={"tasks.eval_stratify_counts": False}))
    assert Counter(len(t.nums) for t in as_drawn)[2] < 0.4 * 257
    # one count: the same set either way
    one = RLCRConfig(tasks={"options": {"min_count": 3, "max_count": 3}, "num_eval": 40})
    assert task_sets(one)[1] == task_sets(one.model_copy(update={"tasks.eval_stratify_counts": False}))[1]


def test_sft_rows_train_on_training_tasks_only(tiny_tokenizer):
    """What run_sft trains on (sft_rows with its seed) is drawn from the run's training pool."""
    from rlcr.train.sft import sft_rows

    cfg = load_config(DEMO)
    train, held_out = task_sets(cfg)
    rows = sft_rows(cfg, tiny_tokenizer, 40, seed=cfg.run.seed + 17)
    row_ids = {(tuple(sorted(r["nums"])), r["target"]) for r in rows}
    assert len(row_ids) == 40 and row_ids <= ids(train) and not row_ids & ids(held_out)


def test_held_out_file_drops_training_tasks_and_repeats(tmp_path, caplog):
    train_file = write_jsonl(tmp_path / "train.jsonl", [
        {"nums": [1, 2, 3], "target": 6}, {"nums": [2, 2, 5], "target": 9},
        {"nums": [3, 2, 1], "target": 6},  # a repeat of row 1 (same multiset and target)
        {"nums": [4, 6, 1], "target": 10},
    ])
    eval_file = write_jsonl(tmp_path / "eval.jsonl", [
        {"nums": [5, 2, 2], "target": 9},  # a training task, numbers in another order
        {"nums": [1, 2, 3], "target": 7},  # same numbers, other target: a different task
        {"nums": [7, 3, 2], "target": 12},
        {"nums": [2, 3, 7], "target": 12},  # a repeat of the row above
        {"nums": [6, 4, 1], "target": 10},  # a training task
    ])
    cfg = RLCRConfig(tasks={"train_file": train_file, "eval_file": eval_file}, rollout={"prompts_per_iteration": 2})
    with caplog.at_level(logging.WARNING, logger="rlcr.runs.task_sets"):
        train, held_out = task_sets(cfg)
    assert [t.identity for t in train] == [((1, 2, 3), 6), ((2, 2, 5), 9), ((1, 4, 6), 10)]
    assert [t.identity for t in held_out] == [((1, 2, 3), 7), ((2, 3, 7), 12)]
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(train_file in m and "dropped 1 of 4 training rows" in m for m in messages), messages
    assert any(eval_file in m and "dropped 2 of 5 held-out rows" in m and "training task" in m for m in messages)
    assert any(eval_file in m and "dropped 1 of 5 held-out rows" in m and "repeat" in m for m in messages)


def test_held_out_file_with_nothing_left_is_refused(tmp_path):
    train_file = write_jsonl(tmp_path / "train.jsonl",
                             [{"nums": [1, 2, 3], "target": 6}, {"nums": [2, 2, 5], "target": 9}])
    eval_file = write_jsonl(tmp_path / "eval.jsonl",
                            [{"nums": [3, 2, 1], "target": 6}, {"nums": [2, 5, 2], "target": 9}])
    cfg = RLCRConfig(tasks={"train_file": train_file, "eval_file": eval_file}, rollout={"prompts_per_iteration": 1})
    with pytest.raises(ValueError, match="no held-out task left.*2 share numbers and target with a training task"):
        task_sets(cfg)


def test_generated_held_out_skips_training_tasks_from_a_file(tmp_path):
    """A training file that holds the first generated held-out candidates: they are skipped, not reused."""
    base = RLCRConfig(tasks={"num_eval": 6, "options": {"min_count": 3, "max_count": 3, "num_range": (1, 9),
                                                        "target_range": (1, 30)}},
                      rollout={"prompts_per_iteration": 2})
    gen = dict(min_count=3, max_count=3, num_range=(1, 9), target_range=(1, 30))
    candidates = generate_tasks(6, base.tasks.eval_seed, **gen)
    save_tasks(candidates, tmp_path / "train.jsonl")
    cfg = base.model_copy(update={"tasks.train_file": str(tmp_path / "train.jsonl")})
    train, held_out = task_sets(cfg)
    assert ids(train) == ids(candidates)
    assert len(held_out) == 6 and len(ids(held_out)) == 6 and not ids(held_out) & ids(train)
    assert task_sets(cfg)[1] == held_out  # reproducible


def test_held_out_generation_in_a_too_small_task_space_fails_clearly():
    cfg = RLCRConfig(tasks={"options": {"min_count": 3, "max_count": 3, "num_range": (1, 2), "target_range": (1, 3)},
                            "num_train": 300, "num_eval": 4},
                     rollout={"prompts_per_iteration": 1})
    with pytest.raises(ValueError, match="held-out tasks apart from the .* training tasks.*too small"):
        task_sets(cfg)


# ----------------------------------------------------------------- SFT tasks
def test_sft_tasks_refuse_more_than_the_training_pool(tmp_path):
    train_file = write_jsonl(tmp_path / "t.jsonl", [{"nums": [1, 2, 3], "target": 6}, {"nums": [3, 1, 2], "target": 6},
                                                    {"nums": [2, 2, 5], "target": 9}])
    cfg = RLCRConfig(tasks={"train_file": train_file}, rollout={"prompts_per_iteration": 1})
    with pytest.raises(ValueError, match="asks for 3 tasks but the training pool has only 2 distinct tasks"):
        sft_tasks(cfg, 3)


def test_sft_tasks_from_a_file_get_checked_solutions(tmp_path):
    """Public datasets carry no solution, a file's solution may be wrong; unsolvable rows are passed over."""
    train_file = write_jsonl(tmp_path / "t.jsonl", [
        {"nums": [1, 2, 3], "target": 6}, {"nums": [2, 2, 5], "target": 9, "solution": "2 * 2 * 5"},
        {"nums": [1, 1, 1], "target": 50},  # unsolvable
    ])
    cfg = RLCRConfig(tasks={"train_file": train_file}, rollout={"prompts_per_iteration": 1})
    got = sft_tasks(cfg, 2)
    assert ids(got) == {((1, 2, 3), 6), ((2, 2, 5), 9)}
    for t in got:
        assert compute_score(f"<answer>{t.solution}</answer>", t.ground_truth) == 1.0
    with pytest.raises(ValueError, match="only 2 of the 3 distinct training tasks are solvable"):
        sft_tasks(cfg, 3)


# ----------------------------------------------------------------- prompts of an iteration
@pytest.mark.parametrize("n, p", [(10, 4), (7, 3), (9, 5), (6, 6), (5, 4)])
def test_prompts_are_distinct_in_each_iteration_and_even_over_time(n, p):
    cfg = RLCRConfig(rollout={"prompts_per_iteration": p}, run={"seed": 3})
    train = [CountdownTask([1, 2, k], k + 3) for k in range(1, n + 1)]
    uses = Counter()
    for k in range(1, 200):
        chosen = [i for i, _ in prompts_for_iteration(cfg, train, k)]
        assert len(chosen) == p and len(set(chosen)) == p, (k, chosen)
        uses.update(chosen)
        assert max(uses.values()) - min(uses[i] for i in range(n)) <= 1  # every task once per epoch
        if (k * p) % n == 0:
            assert set(uses.values()) == {k * p // n}
    assert prompts_for_iteration(cfg, train, 57) == prompts_for_iteration(cfg, train, 57)  # deterministic
    other = cfg.model_copy(update={"run.seed": 4})
    assert [prompts_for_iteration(other, train, k) for k in range(1, 6)] != [
        prompts_for_iteration(cfg, train, k) for k in range(1, 6)]


def test_repeated_tasks_never_share_an_iteration(tmp_path):
    rows = [{"nums": [1, 2, k], "target": k + 3} for k in range(1, 6)]
    rows += [{"nums": [k, 2, 1], "target": k + 3} for k in range(1, 6)]  # the same five tasks again
    cfg = RLCRConfig(tasks={"train_file": write_jsonl(tmp_path / "t.jsonl", rows), "num_eval": 2},
                     rollout={"prompts_per_iteration": 4})
    train, _ = task_sets(cfg)
    assert len(train) == 5
    for k in range(1, 50):
        prompts = [t.identity for _, t in prompts_for_iteration(cfg, train, k)]
        assert len(set(prompts)) == 4


def test_more_prompts_than_distinct_training_tasks_is_refused(tmp_path):
    rows = [{"nums": [1, 2, 3], "target": 6}, {"nums": [3, 2, 1], "target": 6}, {"nums": [2, 2, 5], "target": 9},
            {"nums": [4, 6, 1], "target": 10}]
    cfg = RLCRConfig(tasks={"train_file": write_jsonl(tmp_path / "t.jsonl", rows)},
                     rollout={"prompts_per_iteration": 4})
    with pytest.raises(ValueError, match="rollout.prompts_per_iteration=4 exceeds the 3 distinct training tasks"):
        task_sets(cfg)
    with pytest.raises(ValueError, match="rollout.prompts_per_iteration=4 exceeds the 3 training tasks"):
        prompts_for_iteration(cfg, training_pool(cfg), 1)
