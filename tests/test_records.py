"""Rollout records: tree building, validation, advantages and the Parquet round trip."""

import pyarrow.parquet as pq
import pytest
import torch

from rlcr.core.advantages import answer_advantages, confidence_advantages
from rlcr.rollout.records import (
    ROLLOUT_SCHEMA,
    RolloutValidationError,
    answer_scores,
    assign_advantages,
    confidence_scores,
    rollout_row,
    rows_to_table,
    table_to_rows,
    validate_rollouts,
)
from rlcr.tasks.countdown import CountdownTask, turn2_messages

P, GA, GC = 3, 4, 2
TASKS = [CountdownTask([3, 5, 16], 24), CountdownTask([2, 3, 4], 24), CountdownTask([1, 2, 3], 6)]
ANSWERS = [["16 + 5 + 3", "16 - 5 + 3", "oops", "3 + 5 + 16"], ["2 * 3 * 4", "4 * 3 * 2", "2 + 3 + 4", ""],
           ["1 + 2 + 3"] * 4]
CONFS = ["0.9", "0.2", "nan", "1", "0.5"]


def tree(run_id="run", iteration=0):
    """A scored P × G_a × G_c tree, built and scored as the rollout stages do: answers, then confidences."""
    answers, confs = [], []
    for j, task in enumerate(TASKS):
        for k in range(GA):
            text = f"<think>try</think>\n<answer>{ANSWERS[j][k]}</answer>"
            ans = rollout_row("answer", task=task, run_id=run_id, iteration=iteration, prompt_id=j, answer_id=k,
                              context_text="ctx", context_ids=[1, 2, 3], completion_text=text,
                              completion_ids=[7] * (k + 1), completion_logprobs=[-0.5] * (k + 1),
                              finish_reason="stop" if k else "length", task_name="countdown",
                              **answer_scores(text, task, format_score=0.1, task_name="countdown"))
            answers.append(ans)
            ctx = "\n".join(m["content"] for m in turn2_messages(task, text))
            for h in range(GC):
                ctext = f"<confidence>{CONFS[(j + k + h) % len(CONFS)]}</confidence>"
                confs.append(rollout_row(
                    "confidence", task=task, run_id=run_id, iteration=iteration, prompt_id=j, answer_id=k,
                    confidence_id=h, context_text=ctx, context_ids=[1, 2], completion_text=ctext, completion_ids=[9, 9],
                    correct=ans["correct"], **confidence_scores(ctext, ans["correct"]), task_name="countdown"))
    return answers + confs


def test_build_counts_and_rewards():
    rows = tree("run", 2)
    assert all(list(r) == ROLLOUT_SCHEMA.names for r in rows)  # every field, in the schema's order
    assert validate_rollouts(rows, num_prompts=P, g_a=GA, g_c=GC) == (P, GA, GC)
    ans = [r for r in rows if r["sample_type"] == "answer"]
    conf = [r for r in rows if r["sample_type"] == "confidence"]
    assert len(ans) == P * GA and len(conf) == P * GA * GC
    assert [r["reward"] for r in ans[:4]] == [1.0, 0.0, 0.0, 1.0]
    assert ans[2]["score"] == 0.1 and ans[0]["truncated"] and not ans[1]["truncated"]
    by_answer = {(r["prompt_id"], r["answer_id"]): r for r in ans}
    for r in conf:
        parent = by_answer[(r["prompt_id"], r["answer_id"])]
        assert r["correct"] == parent["reward"]
        c = r["confidence"]
        assert r["reward"] == (0.0 if c is None else pytest.approx(1 - (parent["reward"] - c) ** 2))


def test_advantages_match_the_formulas():
    rows = assign_advantages(tree(), conf_mode="answer_then_prompt")
    ans = sorted((r for r in rows if r["sample_type"] == "answer"), key=lambda r: (r["prompt_id"], r["answer_id"]))
    conf = sorted((r for r in rows if r["sample_type"] == "confidence"),
                  key=lambda r: (r["prompt_id"], r["answer_id"], r["confidence_id"]))
    want_a = answer_advantages(torch.tensor([r["reward"] for r in ans]).reshape(P, GA)).flatten()
    want_c = confidence_advantages(torch.tensor([r["reward"] for r in conf]).reshape(P, GA, GC),
                                   mode="answer_then_prompt").flatten()
    assert [r["advantage"] for r in ans] == pytest.approx(want_a.tolist(), abs=1e-6)
    assert [r["advantage"] for r in conf] == pytest.approx(want_c.tolist(), abs=1e-6)
    assert all(r["advantage"] == 0 for r in ans if r["prompt_id"] == 2)  # all correct: flat group


def test_parquet_round_trip(tmp_path):
    rows = assign_advantages(tree("run", 1))
    pq.write_table(rows_to_table(rows), tmp_path / "r.parquet")
    back = table_to_rows(pq.read_table(tmp_path / "r.parquet"))
    assert len(back) == len(rows)
    for a, b in zip(rows, back):
        for key in ("prompt_id", "answer_id", "confidence_id", "sample_type", "nums", "completion_ids",
                    "completion_text", "finish_reason", "truncated", "reward", "correct", "confidence", "context_ids"):
            assert a[key] == b[key], key
        assert b["advantage"] == pytest.approx(a["advantage"])
        if a["completion_logprobs"] is None:
            assert b["completion_logprobs"] is None
        else:
            assert b["completion_logprobs"] == pytest.approx(a["completion_logprobs"])
    validate_rollouts(back, num_prompts=P, g_a=GA, g_c=GC)


def test_validation_errors():
    rows = tree()
    orphan = [r for r in rows if not (r["sample_type"] == "answer" and r["prompt_id"] == 1 and r["answer_id"] == 2)]
    with pytest.raises(RolloutValidationError, match="parent answer prompt_id=1 answer_id=2 is missing"):
        validate_rollouts(orphan)
    wrong_ctx = [dict(r) for r in rows]
    wrong_ctx[-1]["context_text"] = "some other answer"
    with pytest.raises(RolloutValidationError, match="does not contain its parent answer"):
        validate_rollouts(wrong_ctx)
    with pytest.raises(RolloutValidationError, match="duplicate"):
        validate_rollouts(rows + [rows[-1]])
    with pytest.raises(RolloutValidationError, match="different numbers of confidences"):
        validate_rollouts(rows[:-1])
    with pytest.raises(RolloutValidationError, match="expected G_c=3"):
        validate_rollouts(rows, g_c=3)
    bad = [dict(r) for r in rows]
    bad[0]["reward"] = float("nan")
    with pytest.raises(RolloutValidationError, match="finite"):
        validate_rollouts(bad)
