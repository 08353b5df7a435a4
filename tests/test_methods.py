"""The three methods (docs/design.md §9): rewards, advantages, masks and rows of `rlcr`, `rlcr_single` and `rlvr`,
and the evaluation's bootstrap intervals. Pure: no Ray, vLLM or Prefect."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from rlcr.config import ConfigError, RLCRConfig
from rlcr.core.advantages import METHOD_ADVANTAGES, answer_advantages, method_advantages
from rlcr.core.masks import completion_mask, single_span
from rlcr.core.metrics import auroc, bootstrap_intervals, calibration_metrics, paired_bootstrap_differences
from rlcr.core.rewards import ANSWER_REWARDS, METHODS, answer_reward
from rlcr.evaluation.evaluate import compare_evaluations, pool_draws, summarize_eval
from rlcr.rollout.pipeline import rollout_stats
from rlcr.rollout.records import answer_scores, assign_advantages, rollout_row, validate_rollouts
from rlcr.rollout.stages import score_answers
from rlcr.tasks.countdown import SINGLE_TURN_SYSTEM_PROMPT, CountdownTask, single_turn_messages
from rlcr.tasks.registry import get_task
from rlcr.ui.presentation import difference_text, with_ci

TASK = CountdownTask([3, 5, 2], 16)
COUNTDOWN = get_task("countdown")
RIGHT = "<think>3 + 5 = 8. 8 * 2 = 16.</think>\n<answer>(3 + 5) * 2</answer>"
WRONG = "<think>3 + 5 = 8. 8 + 2 = 10.</think>\n<answer>3 + 5 + 2</answer>"


def conf(c) -> str:
    return f"\n<analysis>check</analysis>\n<confidence>{c}</confidence>"


# ----------------------------------------------------------------------------- rewards


def test_every_method_has_a_registered_reward_and_advantage():
    assert set(ANSWER_REWARDS) == set(METHODS) == set(METHOD_ADVANTAGES) == {"rlcr", "rlcr_single", "rlvr"}
    with pytest.raises(ValueError, match="unknown method 'ppo'"):
        answer_reward("ppo")
    with pytest.raises(ValueError, match="unknown method 'ppo'"):
        method_advantages("ppo")


def test_one_record_says_what_each_method_is():
    """rlcr.core.methods is the one record of a method's shape: the config accepts exactly its methods, two-turn
    RLCR alone trains a confidence turn, one-turn RLCR alone has none, and an unknown name is one line."""
    import typing

    from rlcr.config.sections import Method
    from rlcr.core.methods import METHOD_RECORDS, method_record

    assert set(typing.get_args(Method)) == set(METHOD_RECORDS) == set(METHODS)
    assert [m for m, r in METHOD_RECORDS.items() if r.trains_confidence_turn] == ["rlcr"]
    assert [m for m, r in METHOD_RECORDS.items() if not r.has_confidence_turn] == ["rlcr_single"]
    assert method_record("rlcr").training_confidences(4) == 4 and method_record("rlvr").training_confidences(4) == 0
    with pytest.raises(ValueError, match="unknown method 'ppo' \\(one of rlcr, rlcr_single, rlvr\\)"):
        method_record("ppo")


@pytest.mark.parametrize("lam", [1.0, 0.5])
def test_single_turn_reward_is_accuracy_plus_weighted_brier(lam):
    r = answer_reward("rlcr_single")
    assert r(RIGHT + conf(0.9), TASK, lambda_conf=lam, kind=COUNTDOWN) == pytest.approx(1 + lam * (1 - 0.1 ** 2))
    assert r(WRONG + conf(0.9), TASK, lambda_conf=lam, kind=COUNTDOWN) == pytest.approx(0 + lam * (1 - 0.9 ** 2))
    # a confident "no" is rewarded
    assert r(WRONG + conf(0.0), TASK, lambda_conf=lam, kind=COUNTDOWN) == pytest.approx(lam)
    assert r(RIGHT, TASK, lambda_conf=lam, kind=COUNTDOWN) == 1.0  # no confidence: the Brier part is 0
    assert r(RIGHT + conf("80%"), TASK, lambda_conf=lam, kind=COUNTDOWN) == 1.0  # unparseable likewise


def test_rlvr_and_two_turn_rlcr_answers_earn_accuracy_only():
    for method in ("rlcr", "rlvr"):
        assert answer_reward(method)(RIGHT, TASK, lambda_conf=1.0, kind=COUNTDOWN) == 1.0
        assert answer_reward(method)(WRONG, TASK, lambda_conf=1.0, kind=COUNTDOWN) == 0.0
        # a turn-1 answer ends at </answer>: a confidence after it is not its format, and earns nothing
        assert answer_reward(method)(RIGHT + conf(0.9), TASK, lambda_conf=1.0, kind=COUNTDOWN) == 0.0


def test_answer_scores_per_method():
    s = answer_scores(WRONG + conf(0.25), TASK, format_score=0.1, method="rlcr_single", lambda_conf=1.0,
                      task_name="countdown")
    assert s == {"score": 0.1, "correct": 0.0, "reward": pytest.approx(1 - 0.25 ** 2), "confidence": 0.25}
    s = answer_scores(WRONG, TASK, format_score=0.1, method="rlvr", task_name="countdown")
    assert s == {"score": 0.1, "correct": 0.0, "reward": 0.0, "confidence": None}


def test_score_answers_batch_for_single_turn():
    batch = pd.DataFrame({"nums": [[3, 5, 2]] * 3, "target": [16] * 3,
                          "completion_text": [RIGHT + conf(0.8), WRONG + conf(0.3), RIGHT]})
    out = score_answers(batch, 0.1, "rlcr_single", 0.5, task="countdown")
    assert out["correct"].tolist() == [1.0, 0.0, 1.0]
    assert out["reward"].tolist() == pytest.approx([1 + 0.5 * (1 - 0.04), 0.5 * (1 - 0.09), 1.0])
    assert out["confidence"].tolist()[:2] == [0.8, 0.3] and math.isnan(out["confidence"].tolist()[2])
    # turn-1 scoring: the last line must hold the answer
    two_turn = score_answers(batch, 0.1, "rlcr", 0.5, task="countdown")
    assert two_turn["reward"].tolist() == [0.0, 0.0, 1.0] and two_turn["confidence"].isna().all()


# ----------------------------------------------------------------------------- advantages and rows


def answer_rows(rewards, correct=None, mask_kind="single"):
    """A P × G answers-only tree (the training rows of rlcr_single / rlvr)."""
    rows = []
    for p, group in enumerate(rewards):
        for k, r in enumerate(group):
            rows.append(rollout_row("answer", task=TASK, prompt_id=p, answer_id=k, context_text="c", context_ids=[1],
                                    completion_text="x", completion_ids=[5, 6, 7], loss_mask=[1, 1, 0],
                                    correct=float(r >= 1) if correct is None else correct, reward=float(r),
                                    task_name="countdown"))
    return rows


def test_single_turn_and_rlvr_advantages_are_per_prompt():
    rewards = [[1.99, 0.19, 0.96, 1.0], [0.5, 0.5, 0.5, 0.5]]
    for method in ("rlcr_single", "rlvr"):
        rows = assign_advantages(answer_rows(rewards), method=method)
        got = torch.tensor([r["advantage"] for r in rows]).reshape(2, 4)
        assert torch.allclose(got, answer_advantages(torch.tensor(rewards)), atol=1e-6)
        assert got[1].abs().max() == 0  # a flat group has no signal
    assert validate_rollouts(answer_rows(rewards)) == (2, 4, 0)


def test_methods_refuse_rows_of_another_method():
    with pytest.raises(ValueError, match="rlcr: the rollouts hold no confidences"):
        assign_advantages(answer_rows([[1, 0], [0, 1]]), method="rlcr")
    two_turn = answer_rows([[1, 0]])
    for a in range(2):
        for h in range(2):
            two_turn.append(rollout_row("confidence", task=TASK, prompt_id=0, answer_id=a, confidence_id=h,
                                        context_text="c", context_ids=[1], completion_text="y", completion_ids=[3],
                                        correct=float(a == 0), reward=0.5 + 0.1 * h, task_name="countdown"))
    with pytest.raises(ValueError, match="trains no confidence samples"):
        assign_advantages(two_turn, method="rlcr_single")
    assign_advantages(two_turn, method="rlcr")  # its own method accepts it
    assert all(r["advantage"] is not None for r in two_turn)


def test_rollout_stats_count_generated_and_trained_tokens():
    stats = rollout_stats(answer_rows([[1, 0]]))
    assert stats["tokens/generated"] == 6 and stats["tokens/trained"] == 4
    assert stats["answer/accuracy"] == 0.5


# ----------------------------------------------------------------------------- masks and prompts


def test_single_span_runs_from_think_through_the_confidence():
    text = "ok " + RIGHT + conf(0.7) + " trailing"
    start, end = single_span(text)
    assert text[start:end].startswith("<think>") and text[start:end].endswith("</confidence>")
    assert single_span("no tags at all") == (0, len("no tags at all"))
    assert single_span(RIGHT) == (0, len(RIGHT))  # no confidence yet: through the end


def test_single_mask_on_real_tokens(tiny_tokenizer):
    text = RIGHT + conf(0.7) + "<|im_end|>"
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    mask = completion_mask(tiny_tokenizer, ids, text, "single")
    kept = tiny_tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert kept.startswith("<think>") and kept.endswith("</confidence>")
    answer_only = completion_mask(tiny_tokenizer, ids, text, "answer")
    assert sum(answer_only) < sum(mask)  # the answer mask stops at </answer>
    with pytest.raises(ValueError, match="mask kind"):
        completion_mask(tiny_tokenizer, ids, text, "both")


def test_single_turn_prompt_asks_for_answer_and_confidence():
    msgs = single_turn_messages(TASK)
    assert msgs[0] == {"role": "system", "content": SINGLE_TURN_SYSTEM_PROMPT}
    assert "<confidence>" in msgs[0]["content"] and "<answer>" in msgs[0]["content"] and len(msgs) == 2


def test_method_is_a_checked_config_field():
    assert RLCRConfig().method.name == "rlcr"
    with pytest.raises(ConfigError, match="method"):
        RLCRConfig.from_dict({"method.name": "grpo"})


# ----------------------------------------------------------------------------- evaluation intervals


def test_bootstrap_interval_matches_the_binomial_width():
    rng = np.random.default_rng(1)
    y = (rng.random(400) < 0.3).astype(float)
    c = np.clip(0.3 + rng.normal(0, 0.1, 400), 0, 1)
    ci = bootstrap_intervals(c, y, range(400), n_resamples=2000, seed=0)
    half = 1.96 * math.sqrt(y.mean() * (1 - y.mean()) / 400)
    assert ci["accuracy"][0] < y.mean() < ci["accuracy"][1]
    assert (ci["accuracy"][1] - ci["accuracy"][0]) / 2 == pytest.approx(half, rel=0.15)
    for m, point in calibration_metrics(c, y).items():
        if m in ci:
            assert ci[m][0] <= point + 0.02 and point - 0.02 <= ci[m][1], m  # ECE's bootstrap is biased up a bit


def test_bootstrap_resamples_tasks_not_answers():
    """Two identical answers per task carry no more information than one: resampling tasks keeps the
    interval as wide as with one answer per task; treating answers as independent would narrow it ~√2."""
    rng = np.random.default_rng(2)
    y1 = (rng.random(200) < 0.5).astype(float)
    c1 = rng.random(200)
    one = bootstrap_intervals(c1, y1, range(200), seed=0)
    doubled = bootstrap_intervals(np.repeat(c1, 2), np.repeat(y1, 2), np.repeat(np.arange(200), 2), seed=0)
    as_if_independent = bootstrap_intervals(np.repeat(c1, 2), np.repeat(y1, 2), range(400), seed=0)

    def width(ci):
        return ci["accuracy"][1] - ci["accuracy"][0]

    assert width(doubled) == pytest.approx(width(one), rel=0.1)
    assert width(as_if_independent) < 0.8 * width(doubled)


def test_bootstrap_edge_cases():
    ci = bootstrap_intervals([0.9, 0.8, float("nan")], [1, 1, 0], ["a", "b", "c"], n_resamples=200)
    assert ci["auroc"] is None or 0 <= ci["auroc"][0] <= ci["auroc"][1] <= 1
    only_right = bootstrap_intervals([0.9, 0.8], [1, 1], ["a", "b"], n_resamples=200)
    assert only_right["auroc"] is None and only_right["accuracy"] == [1.0, 1.0]
    with pytest.raises(ValueError, match="one length"):
        bootstrap_intervals([0.5], [1, 0], ["a", "b"])
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        bootstrap_intervals([1.5], [1], ["a"])


def paired_evaluations(n_tasks=200, flipped=12):
    """A and B on the same tasks, 2 answers each, task difficulty spread from always right to always wrong;
    B differs from A only in ``flipped`` tasks, where one wrong answer of A is right in B."""
    rng = np.random.default_rng(3)
    p_right = rng.uniform(0, 1, n_tasks)
    a, b = [], []
    for t in range(n_tasks):
        for k in range(2):
            y = float(rng.uniform() < p_right[t])
            c = float(np.clip(p_right[t] + rng.normal(0, 0.1), 0, 1))
            a.append((t, y, c))
            b.append((t, 1.0 if (t < flipped and k == 0) else y, c))
    return a, b


def test_paired_bootstrap_resolves_a_difference_that_marginal_intervals_cannot():
    a, b = paired_evaluations()
    d = paired_bootstrap_differences(a, b, n_resamples=1000, seed=0)
    acc = d["differences"]["accuracy"]
    assert d["n_tasks"] == 200 and acc["difference"] < 0
    assert acc["ci"][1] < 0  # paired: every draw scores A and B on the same tasks, so B ≥ A on each draw
    ya, yb = [y for _, y, _ in a], [y for _, y, _ in b]
    ca = bootstrap_intervals([c for *_, c in a], ya, [t for t, *_ in a], seed=0)["accuracy"]
    cb = bootstrap_intervals([c for *_, c in b], yb, [t for t, *_ in b], seed=0)["accuracy"]
    assert ca[1] > cb[0]  # the two marginal intervals overlap
    assert acc["difference"] == pytest.approx(np.mean(ya) - np.mean(yb))


def test_paired_bootstrap_of_identical_evaluations_is_zero_and_keeps_shared_tasks_only():
    a, _ = paired_evaluations(n_tasks=50)
    d = paired_bootstrap_differences(a, a, n_resamples=100)
    assert all(v["difference"] == 0 and v["ci"] == [0, 0] for v in d["differences"].values())
    extra = a + [(999, 1.0, 0.9), (999, 0.0, float("nan"))]  # a task only A evaluated is left out
    assert paired_bootstrap_differences(extra, a, n_resamples=50)["n_tasks"] == 50
    assert paired_bootstrap_differences(extra, a, n_resamples=50)["differences"]["brier"]["difference"] == 0
    with pytest.raises(ValueError, match="share no task"):
        paired_bootstrap_differences([(1, 1.0, 0.5)], [(2, 1.0, 0.5)])
    with pytest.raises(ValueError, match="level"):
        paired_bootstrap_differences(a, a, level=1.5)


def test_compare_evaluations_pairs_two_methods_rows_by_task():
    two_turn, one_turn = eval_rows(single=False), eval_rows(single=True)
    cmp = compare_evaluations(two_turn, one_turn, n_resamples=200)
    assert cmp["n_tasks"] == 4 and cmp["differences"]["accuracy"]["difference"] == 0
    # task 0's turn-2 confidences did not parse: Brier over tasks 1–3 only vs all four in the one-turn rows
    assert cmp["differences"]["brier"]["difference"] is not None
    assert difference_text(cmp, "accuracy").startswith("+0.000 [")
    other = [dict(r, target=r["target"] + 1) if r["prompt_id"] == 2 else r for r in one_turn]
    with pytest.raises(ValueError, match="prompt_id 2"):
        compare_evaluations(two_turn, other)


def test_pooled_draws_are_one_evaluation_with_more_answers_per_task():
    """Two draws of 2 answers per task pool into 4 answers per task: every answer kept once with its own
    confidence, the bootstrap still over the 4 tasks; a draw of other tasks is refused by draw and prompt_id."""
    first, second = eval_rows(single=False), eval_rows(single=False)
    second = [dict(r, correct=1.0) for r in second]  # the same tasks, answered right this time
    pooled = pool_draws([first, second])
    assert len(pooled) == len(first) + len(second)
    answers = [(r["prompt_id"], r["answer_id"]) for r in pooled if r["sample_type"] == "answer"]
    assert len(set(answers)) == 16 and sorted({a for _, a in answers}) == [0, 1, 2, 3]
    parents = {(r["prompt_id"], r["answer_id"]) for r in pooled if r["sample_type"] == "confidence"}
    assert parents == set(answers)  # each confidence still follows its own answer
    m = summarize_eval(pooled, n_resamples=200)
    assert m["n_tasks"] == 4 and m["n_answers"] == 16 and m["accuracy"] == pytest.approx(0.75)  # (4 + 8) / 16
    cmp = compare_evaluations(pooled, first, n_resamples=200)
    assert cmp["n_tasks"] == 4 and cmp["differences"]["accuracy"]["difference"] == pytest.approx(0.25)
    other = [dict(r, target=r["target"] + 1) if r["prompt_id"] == 3 else r for r in second]
    with pytest.raises(ValueError, match="draw 1, prompt_id 3"):
        pool_draws([first, other])


def test_auroc_handles_ties_as_halves():
    assert auroc([0.5, 0.5, 0.2, 0.9], [1, 0, 0, 1]) == pytest.approx(0.875)
    assert auroc([0.5] * 4, [1, 0, 1, 0]) == pytest.approx(0.5)


def eval_rows(single: bool, samples: int = 2):
    """Evaluation rows of 4 tasks × ``samples`` answers, each with one stated confidence."""
    rows = []
    for p in range(4):
        for k in range(samples):
            right = (p + k) % 2 == 0
            c = 0.8 if right else 0.3
            rows.append(rollout_row("answer", task=TASK, prompt_id=p, answer_id=k, context_text="c", context_ids=[1],
                                    completion_text="x", completion_ids=[1], score=1.0 if right else 0.1,
                                    correct=float(right), reward=float(right), confidence=c if single else None,
                                    task_name="countdown"))
            if not single:
                rows.append(rollout_row("confidence", task=TASK, prompt_id=p, answer_id=k, confidence_id=0,
                                        context_text="c", context_ids=[1], completion_text="y", completion_ids=[1],
                                        correct=float(right), reward=0.0, confidence=c if p else None,
                                        task_name="countdown"))
    return rows


@pytest.mark.parametrize("single", [False, True])
def test_summarize_eval_reads_each_methods_confidences(single):
    m = summarize_eval(eval_rows(single), n_resamples=200)
    assert (m["n_tasks"], m["n_answers"], m["accuracy"]) == (4, 8, 0.5)
    # two-turn: task 0's confidences did not parse; one-turn: every answer stated one
    assert m["confidence_parse_rate"] == (1.0 if single else 0.75)
    assert m["auroc"] == 1.0 and m["ci_level"] == 0.95 and m["ci_resamples"] == 200
    assert set(m["ci"]) == {"accuracy", "ece", "brier", "auroc"}
    assert with_ci(m, "accuracy").startswith("0.500 [")
    assert with_ci({"accuracy": float("nan")}, "accuracy") == "–" and with_ci({"ece": 0.25}, "ece") == "0.250"


def test_evaluation_breaks_calibration_down_by_number_count():
    """On a mix of difficulties a confidence that only knows 2-number tasks are easier gets a pooled AUROC of 1
    here, yet tells right from wrong no better than chance within each count: ``by_count`` shows both."""
    easy, hard = CountdownTask([3, 5], 8), CountdownTask([3, 5, 2], 16)
    rows = []
    for p, (task, right, c) in enumerate([(easy, True, 0.9), (easy, True, 0.9), (hard, False, 0.2), (hard, False, 0.2),
                                          (easy, True, 0.9), (hard, False, 0.2)]):
        rows.append(rollout_row("answer", task=task, prompt_id=p, answer_id=0, context_text="c", context_ids=[1],
                                completion_text="x", completion_ids=[1], score=1.0 if right else 0.1,
                                correct=float(right), reward=float(right), task_name="countdown"))
        rows.append(rollout_row("confidence", task=task, prompt_id=p, answer_id=0, confidence_id=0, context_text="c",
                                context_ids=[1], completion_text="y", completion_ids=[1], correct=float(right),
                                reward=0.0, confidence=c, task_name="countdown"))
    m = summarize_eval(rows, n_resamples=100)
    assert m["auroc"] == 1.0
    assert m["by_count"] == {
        "2": {"n_answers": 3, "accuracy": 1.0, "mean_confidence": pytest.approx(0.9), "ece": pytest.approx(0.1),
              "auroc": None},
        "3": {"n_answers": 3, "accuracy": 0.0, "mean_confidence": pytest.approx(0.2), "ece": pytest.approx(0.2),
              "auroc": None}}
    mixed = summarize_eval(rows[:4] + [dict(r, correct=0.0) for r in rows[8:10]], n_resamples=100)["by_count"]["2"]
    assert mixed["accuracy"] == pytest.approx(2 / 3) and mixed["auroc"] == 0.5  # same confidence, both outcomes


def test_single_turn_answer_is_scored_on_its_answer_part():
    """The extraction reads the last line (docs/design.md §2–§4): the confidence after the answer must not hide it, and
    an <answer> written inside the confidence section does not count."""
    from rlcr.core.rewards import split_single_turn

    answer, stated = split_single_turn(RIGHT + conf(0.6))
    assert answer == RIGHT and stated.startswith("<analysis>")
    sneaky = WRONG + "\n<confidence>0.9</confidence> <answer>(3 + 5) * 2</answer>"
    s = answer_scores(sneaky, TASK, format_score=0.1, method="rlcr_single", task_name="countdown")
    assert s["correct"] == 0.0 and s["score"] == 0.1


def test_evaluation_draws_keep_the_flows_draw_and_differ_from_it():
    from rlcr.seeds import EVAL_SALT, eval_salt, rollout_seed

    assert eval_salt() == eval_salt(0) == EVAL_SALT  # draw 0 is what every flow evaluation has sampled
    salts = [eval_salt(k) for k in range(50)]
    assert len(set(salts)) == 50
    # no redraw of iteration i lands on another iteration's evaluation or on a training rollout's seed
    flow_seeds = {rollout_seed(0, i, salt=s) for i in range(100) for s in (0, EVAL_SALT)}
    assert not flow_seeds & {rollout_seed(0, i, salt=eval_salt(k)) for i in range(100) for k in range(1, 50)}
    with pytest.raises(ValueError, match="draw must be >= 0"):
        eval_salt(-1)
