"""The format warm-start's supervised examples (rlcr.train.sft)."""

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rlcr.core.rewards import parse_confidence
from rlcr.tasks.countdown import CountdownTask, compute_score, evaluate_expression
from rlcr.tasks.countdown_sft import MAX_ATTEMPTS, answer_trace, check_answer, sft_examples, solution_steps
from rlcr.tasks.registry import get_task
from rlcr.train.sft import sft_rows, sft_update_config

COUNTDOWN = get_task("countdown")


def test_solution_steps_and_trace():
    assert solution_steps("(3 + 5) * 2") == ["3+5=8", "8*2=16"]
    assert solution_steps("8 / (3 - 8 / 3)") == ["8/3=(8/3)", "3-(8/3)=(1/3)", "8/(1/3)=24"]
    t = CountdownTask([3, 5, 2], 16, "(3 + 5) * 2")
    trace = answer_trace(t, t.solution, failed=["3 + 5 + 2"])
    assert trace == ("<think>I need 16 from [3, 5, 2]. 3+5=8. 8+2=10. 10 vs 16: no. 3+5=8. 8*2=16. 16 vs 16: "
                     "yes.</think>\n<answer>(3 + 5) * 2</answer>")
    assert compute_score(trace, t.ground_truth) == 1.0
    # a claimed last step (how a small model's wrong answer reads) and a trace that gives up
    assert "5*2=10. 3+10=16. 16 vs 16: yes." in answer_trace(t, "3 + 5 * 2", claim=16)  # true value 13
    gave_up = answer_trace(t, "3 * 5 * 2", failed=["3 + 5 + 2", "3 * 5 * 2"], gave_up=True)
    assert gave_up.endswith("30 vs 16: no. No try reaches 16.</think>\n<answer>3 * 5 * 2</answer>")
    with pytest.raises(ValueError):
        answer_trace(t, "3 * 5 * 2", failed=["3 + 5 + 2"], gave_up=True)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6))
def test_examples_are_well_formed(seed):
    examples = sft_examples(6, seed, min_count=2, max_count=4)
    assert [e["sample_type"] for e in examples] == ["answer", "confidence"] * 6
    for e in examples:
        task = e["task"]
        if e["sample_type"] == "answer":  # the solver's answer after 0-2 honest misses, or 3 misses and a give-up
            right = compute_score(e["completion"], task.ground_truth) == 1.0
            assert right == ("No try reaches" not in e["completion"])
            assert e["completion"].count(" vs ") <= MAX_ATTEMPTS
            assert not right or f"{task.target} vs {task.target}: yes." in e["completion"]
        else:
            c = parse_confidence(e["completion"])
            shown = e["messages"][2]["content"]
            correct = compute_score(shown, task.ground_truth) == 1.0
            equation = shown.rsplit("<answer>", 1)[1].split("</answer>")[0]
            assert evaluate_expression(equation) is not None  # wrong answers are still valid arithmetic
            assert c is not None and (c >= 0.6 if correct else c <= 0.4)
            # the check's verdict is the scorer's, and it is stated in the analysis
            analysis = e["completion"].split("<analysis>")[1].split("</analysis>")[0]
            assert analysis == check_answer(task, equation)[0]
            assert analysis.endswith(": right.") == correct


def test_check_names_what_is_wrong():
    """The turn-2 check re-derives the numbers used and the value, each compared side by side with what it
    should be; it never trusts the answer's claims."""
    t = CountdownTask([19, 8, 16], 21)
    assert check_answer(t, "16 + (19 - 8)") == (
        "Uses 16, 19, 8; given 19, 8, 16: each once. 19-8=11. 16+11=27. 27 vs 21: wrong.", False)
    assert check_answer(t, "(19 - 8) + 16 - 6")[0] == "Uses 19, 8, 16, 6; given 19, 8, 16: 6 is not given."
    assert check_answer(t, "19 + 8 - 8")[0] == "Uses 19, 8, 8; given 19, 8, 16: 8 is used 2 times."
    assert check_answer(t, "19 + 8")[0] == "Uses 19, 8; given 19, 8, 16: 16 is not used."
    assert check_answer(t, "8 / (19 - 19) + 16") == ("The equation divides by zero.", False)
    assert check_answer(t, "19 ** 8") == ("The answer is not a valid equation.", False)
    assert check_answer(t, None) == ("There is no equation in the answer.", False)
    ok = CountdownTask([3, 5, 2], 16)
    assert check_answer(ok, "(3 + 5) * 2") == ("Uses 3, 5, 2; given 3, 5, 2: each once. 3+5=8. 8*2=16. "
                                               "16 vs 16: right.", True)
    assert check_answer(CountdownTask([6, 4], 2), "6 - 4")[1] is True


def test_wrong_answers_look_like_the_models_own():
    """Wrong answers shown in turn 2 are never right, come in every kind, and most claim the target in their
    last attempt (as the warm-started model's own wrong answers do), so the check cannot copy the answer's
    claim; the others give up after missing every attempt."""
    import collections
    import random

    from rlcr.core.rewards import accuracy_reward
    from rlcr.tasks.countdown import generate_tasks
    from rlcr.tasks.countdown_sft import WRONG_KINDS, wrong_answer

    rng = random.Random(0)
    kinds, claims, gave_up, n = collections.Counter(), 0, 0, 0
    for task in generate_tasks(400, 5, min_count=2, max_count=3, num_range=(1, 20), target_range=(1, 60)):
        got = wrong_answer(task, rng)
        assert got is not None
        expression, trace = got
        assert accuracy_reward(trace, task, COUNTDOWN) == 0.0 and trace.endswith(f"<answer>{expression}</answer>")
        verdict = check_answer(task, expression)[0]
        kinds["value" if "each once" in verdict else "numbers"] += 1
        n += 1
        claims += trace.endswith(f"{task.target} vs {task.target}: yes.</think>\n<answer>{expression}</answer>")
        gave_up += f"No try reaches {task.target}." in trace
    assert kinds["value"] > 0.4 * n and kinds["numbers"] > 0.2 * n
    assert claims + gave_up == n and 0.1 * n < gave_up < 0.3 * n
    assert abs(sum(WRONG_KINDS.values()) - 1.0) < 1e-9


def test_rows_carry_loss_on_the_whole_completion(tiny_tokenizer):
    from rlcr.config import RLCRConfig

    rows = sft_rows(RLCRConfig(), tiny_tokenizer, n_tasks=3, seed=0)
    assert len(rows) == 6
    for r in rows:
        assert r["completion_ids"][-1] == tiny_tokenizer.eos_token_id
        assert r["loss_mask"] == [1] * len(r["completion_ids"]) and r["advantage"] == 1.0
        assert tiny_tokenizer.decode(r["completion_ids"], skip_special_tokens=True) == r["completion_text"]
        assert r["context_text"].endswith("<|im_start|>assistant\n")


def test_sft_rows_default_to_the_configs_tasks_and_seed(tiny_tokenizer):
    from rlcr.config import RLCRConfig
    from rlcr.seeds import sft_seed

    cfg = RLCRConfig(sft={"tasks": 3}, run={"seed": 4}, tasks={"num_train": 50})
    rows = sft_rows(cfg, tiny_tokenizer)
    assert len(rows) == 2 * cfg.sft.tasks
    assert rows == sft_rows(cfg, tiny_tokenizer, 3, seed=sft_seed(4))


def test_sft_update_settings_come_from_the_config():
    """The warm-start's update: the config's sft_* fields in place of the RL ones, one iteration's schedule."""
    from rlcr.config import RLCRConfig, load_config

    cfg = RLCRConfig(sft={"learning_rate": 3e-4, "epochs": 3, "batch_size": 4, "lr_schedule": "linear",
                          "warmup_steps": 1},
                     run={"iterations": 5}, loss={"kl_coef": 0.1}, update={"learning_rate": 2e-6, "weight_decay": 0.01})
    u = sft_update_config(cfg, 22, storage_uri="/elsewhere")
    assert (u.update.objective, u.update.learning_rate, u.update.epochs_per_iteration, u.update.mini_batches_per_epoch,
            u.update.lr_schedule, u.update.warmup_steps, u.loss.kl_coef, u.run.iterations,
            u.storage.uri) == ("sft", 3e-4, 3, 5, "linear", 1, 0.0, 1, "/elsewhere")
    assert u.update.weight_decay == 0.01 and sft_update_config(cfg, 3).update.mini_batches_per_epoch == 1
    assert sft_update_config(cfg, 3).storage.uri == cfg.storage.uri
    # the defaults are the values the warm-start always used: 1e-4, 2 epochs, 8 rows a step, cosine, 2 warm-up steps
    d = sft_update_config(RLCRConfig(), 80)
    assert (d.update.learning_rate, d.update.epochs_per_iteration, d.update.mini_batches_per_epoch,
            d.update.lr_schedule, d.update.warmup_steps) == (1e-4, 2, 10, "cosine", 2)
    assert RLCRConfig().sft.tasks == 600
    demo = load_config(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    assert (demo.sft.tasks, demo.sft.epochs) == (60, 2)  # the demo's warm-start: 60 tasks × 2 epochs


def test_sft_objective_lowers_the_nll_of_the_targets(tiny_model_dir, tiny_tokenizer):
    """One in-process SFT update (the objective `rlcr sft` runs on Ray Train) makes the targets likelier."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcr.config import RLCRConfig
    from rlcr.train.batching import prepare_samples
    from rlcr.train.logprobs import CompletionLogProbs
    from rlcr.train.update import train_update

    cfg = RLCRConfig(update={"objective": "sft", "learning_rate": 1e-3, "mini_batches_per_epoch": 1,
                             "epochs_per_iteration": 3})
    rows = sft_rows(cfg, tiny_tokenizer, n_tasks=4, seed=1)
    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)

    def nll():
        with torch.no_grad():
            total = 0.0
            for r in rows:
                ids = torch.tensor([r["context_ids"] + r["completion_ids"]])
                logits = lm(ids).logits[0, len(r["context_ids"]) - 1:-1]
                total -= torch.log_softmax(logits, -1).gather(
                    -1, torch.tensor(r["completion_ids"])[:, None]).sum().item()
            return total

    before = nll()
    metrics = train_update(CompletionLogProbs(lm), prepare_samples(rows, tiny_tokenizer), cfg,
                           pad_id=tiny_tokenizer.pad_token_id)
    assert metrics["skipped_steps"] == 0 and metrics["optimizer_steps"] == 3
    assert nll() < before * 0.9


def test_single_turn_examples_serve_rlcr_single(tiny_tokenizer):
    """With sft_single_turn each task gets a third, one-turn example: the rlcr_single prompt, trace + answer +
    check + confidence in one response; a wrong shown answer carries no loss, only its check and confidence.
    The two-turn examples are the same as without it."""
    from rlcr.config import RLCRConfig
    from rlcr.rollout.records import answer_scores
    from rlcr.tasks.countdown import SINGLE_TURN_SYSTEM_PROMPT

    base = RLCRConfig(sft={"tasks": 12}, tasks={"num_train": 200}, run={"seed": 2})
    plain = sft_rows(base, tiny_tokenizer)
    rows = sft_rows(base.model_copy(update={"sft.single_turn": True}), tiny_tokenizer)
    assert len(rows) == 3 * 12 and rows[:24] == plain
    single = rows[24:]
    assert {r["prompt_id"] for r in single} == set(range(12, 24))  # its own prompts, apart from the pairs'
    wrong = 0
    for r in single:
        assert SINGLE_TURN_SYSTEM_PROMPT in r["context_text"] and r["sample_type"] == "answer"
        assert tiny_tokenizer.decode(r["completion_ids"], skip_special_tokens=True) == r["completion_text"]
        scores = answer_scores(r["completion_text"], r_task(r), format_score=0.1, method="rlcr_single",
                               task_name="countdown")
        learned = tiny_tokenizer.decode([t for t, m in zip(r["completion_ids"], r["loss_mask"]) if m],
                                        skip_special_tokens=True)
        assert scores["confidence"] is not None
        if scores["correct"]:
            assert all(r["loss_mask"]) and scores["confidence"] >= 0.6
        else:
            wrong += 1
            assert learned.startswith("<analysis>") and "<answer>" not in learned and scores["confidence"] <= 0.4
    assert 2 <= wrong <= 10  # about half show a wrong answer


def r_task(row):
    from rlcr.tasks.countdown import CountdownTask

    return CountdownTask(row["nums"], row["target"])
