"""The format warm-start's supervised examples (rlcr.sft)."""

from pathlib import Path

from hypothesis import given, settings, strategies as st

from rlcr.rewards import parse_confidence
from rlcr.sft import answer_trace, sft_examples, sft_rows, sft_update_config, solution_steps
from rlcr.tasks.countdown import CountdownTask, compute_score, evaluate_expression


def test_solution_steps_and_trace():
    assert solution_steps("(3 + 5) * 2") == ["3 + 5 = 8", "8 * 2 = 16"]
    assert solution_steps("8 / (3 - 8 / 3)") == ["8 / 3 = 8/3", "3 - 8/3 = 1/3", "8 / 1/3 = 24"]
    t = CountdownTask([3, 5, 2], 16, "(3 + 5) * 2")
    trace = answer_trace(t, t.solution)
    assert trace.startswith("<think>") and "8 * 2 = 16" in trace
    assert compute_score(trace, t.ground_truth) == 1.0


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6))
def test_examples_are_well_formed(seed):
    examples = sft_examples(6, seed, min_count=3, max_count=4)
    assert [e["sample_type"] for e in examples] == ["answer", "confidence"] * 6
    for e in examples:
        task = e["task"]
        if e["sample_type"] == "answer":
            assert compute_score(e["completion"], task.ground_truth) == 1.0  # only correct answers are targets
        else:
            c = parse_confidence(e["completion"])
            shown = e["messages"][2]["content"]
            correct = compute_score(shown, task.ground_truth) == 1.0
            equation = shown.rsplit("<answer>", 1)[1].split("</answer>")[0]
            assert evaluate_expression(equation) is not None  # wrong answers are still valid arithmetic
            assert c is not None and (c >= 0.6 if correct else c <= 0.4)


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

    cfg = RLCRConfig(sft_tasks=3, seed=4, num_train_tasks=50)
    rows = sft_rows(cfg, tiny_tokenizer)
    assert len(rows) == 2 * cfg.sft_tasks
    assert rows == sft_rows(cfg, tiny_tokenizer, 3, seed=sft_seed(4))


def test_sft_update_settings_come_from_the_config():
    """The warm-start's update: the config's sft_* fields in place of the RL ones, one iteration's schedule."""
    from rlcr.config import RLCRConfig, load_config

    cfg = RLCRConfig(sft_learning_rate=3e-4, sft_epochs=3, sft_batch_size=4, sft_lr_schedule="linear",
                     sft_warmup_steps=1, iterations=5, kl_coef=0.1, learning_rate=2e-6, weight_decay=0.01)
    u = sft_update_config(cfg, 22, storage_uri="/elsewhere")
    assert (u.objective, u.learning_rate, u.epochs_per_iteration, u.mini_batches_per_epoch, u.lr_schedule,
            u.warmup_steps, u.kl_coef, u.iterations, u.storage_uri) == ("sft", 3e-4, 3, 5, "linear", 1, 0.0, 1,
                                                                        "/elsewhere")
    assert u.weight_decay == 0.01 and sft_update_config(cfg, 3).mini_batches_per_epoch == 1
    assert sft_update_config(cfg, 3).storage_uri == cfg.storage_uri
    # the defaults are the values the warm-start always used: 1e-4, 2 epochs, 8 rows a step, cosine, 2 warm-up steps
    d = sft_update_config(RLCRConfig(), 80)
    assert (d.learning_rate, d.epochs_per_iteration, d.mini_batches_per_epoch, d.lr_schedule, d.warmup_steps) == (
        1e-4, 2, 10, "cosine", 2)
    assert RLCRConfig().sft_tasks == 600
    demo = load_config(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    assert (demo.sft_tasks, demo.sft_epochs) == (40, 2)  # the demo's warm-start: 40 tasks × 2 epochs


def test_sft_objective_lowers_the_nll_of_the_targets(tiny_model_dir, tiny_tokenizer):
    """One in-process SFT update (the objective `rlcr sft` runs on Ray Train) makes the targets likelier."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcr.config import RLCRConfig
    from rlcr.train.batching import prepare_samples
    from rlcr.train.update import CompletionLogProbs, train_update

    cfg = RLCRConfig(objective="sft", learning_rate=1e-3, mini_batches_per_epoch=1, epochs_per_iteration=3)
    rows = sft_rows(cfg, tiny_tokenizer, n_tasks=4, seed=1)
    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)

    def nll():
        with torch.no_grad():
            total = 0.0
            for r in rows:
                ids = torch.tensor([r["context_ids"] + r["completion_ids"]])
                logits = lm(ids).logits[0, len(r["context_ids"]) - 1:-1]
                total -= torch.log_softmax(logits, -1).gather(-1, torch.tensor(r["completion_ids"])[:, None]).sum().item()
            return total

    before = nll()
    metrics = train_update(CompletionLogProbs(lm), prepare_samples(rows, tiny_tokenizer), cfg, pad_id=tiny_tokenizer.pad_token_id)
    assert metrics["skipped_steps"] == 0 and metrics["optimizer_steps"] == 3
    assert nll() < before * 0.9


def test_single_turn_examples_serve_rlcr_single(tiny_tokenizer):
    """With sft_single_turn each task gets a third, one-turn example: the rlcr_single prompt, trace + answer +
    check + confidence in one response; a wrong shown answer carries no loss, only its check and confidence.
    The two-turn examples are the same as without it."""
    from rlcr.config import RLCRConfig
    from rlcr.rollout.records import answer_scores
    from rlcr.tasks.countdown import SINGLE_TURN_SYSTEM_PROMPT

    base = RLCRConfig(sft_tasks=12, num_train_tasks=200, seed=2)
    plain = sft_rows(base, tiny_tokenizer)
    rows = sft_rows(base.model_copy(update={"sft_single_turn": True}), tiny_tokenizer)
    assert len(rows) == 3 * 12 and rows[:24] == plain
    single = rows[24:]
    assert {r["prompt_id"] for r in single} == set(range(12, 24))  # its own prompts, apart from the pairs'
    wrong = 0
    for r in single:
        assert SINGLE_TURN_SYSTEM_PROMPT in r["context_text"] and r["sample_type"] == "answer"
        assert tiny_tokenizer.decode(r["completion_ids"], skip_special_tokens=True) == r["completion_text"]
        scores = answer_scores(r["completion_text"], r_task(r), format_score=0.1, method="rlcr_single")
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
