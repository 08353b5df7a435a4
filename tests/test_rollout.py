"""Two-stage rollouts on a local Ray with real vLLM (CPU) and the tiny model (docs/design.md §1–§5)."""

import json
import math

import pandas as pd
import pytest
import torch

from rlcr.config import RLCRConfig
from rlcr.rollout.pipeline import run_rollouts
from rlcr.rollout.records import table_to_rows, validate_rollouts
from rlcr.rollout.stages import expand_to_turn2, score_answers, score_confidences
from rlcr.storage import Store
from rlcr.tasks.countdown import CountdownTask, generate_tasks, turn2_messages

P, GA, GC = 3, 3, 2


def tiny_cfg(model_dir, store_dir, **kw):
    return RLCRConfig.from_dict({**kw, "model": {"name": str(model_dir)}, "storage": {"uri": str(store_dir)},
                                 "rollout": {"num_generations_answer": GA, "num_generations_confidence": GC,
                                             "temperature": 1.0, "max_answer_tokens": 20, "max_confidence_tokens": 10,
                                             "batch_size": 8},
                                 "engine": {"max_model_len": 512, "kv_cache_gib": 0.25}, "run": {"seed": 3}})


@pytest.fixture(scope="module")
def engine_pool(ray_local, tiny_model_dir):
    from rlcr.rollout.engine import EnginePool

    with EnginePool(tiny_cfg(tiny_model_dir, "unused"), str(tiny_model_dir)) as pool:
        yield pool


@pytest.fixture(scope="module")
def rollout_runs(ray_local, tiny_model_dir, tmp_path_factory, engine_pool):
    """The same iteration rolled out twice with the same seed: once with an engine owned by each
    stage actor, once through the long-lived shared engine pool."""
    store = Store(str(tmp_path_factory.mktemp("store")))
    cfg = tiny_cfg(tiny_model_dir, store.uri)
    tasks = list(enumerate(generate_tasks(P, seed=11)))
    first = run_rollouts(cfg, tasks, policy_uri=str(tiny_model_dir), run_id="t", iteration=0, store=store)
    second = run_rollouts(cfg, tasks, policy_uri=str(tiny_model_dir), run_id="t2", iteration=0, store=store,
                          engines=engine_pool)
    return cfg, store, tasks, first, second


def test_counts_and_tree(rollout_runs):
    _, _, _, res, _ = rollout_runs
    rows = res.rows
    assert validate_rollouts(rows, num_prompts=P, g_a=GA, g_c=GC) == (P, GA, GC)
    assert sum(r["sample_type"] == "answer" for r in rows) == P * GA
    assert sum(r["sample_type"] == "confidence" for r in rows) == P * GA * GC
    for r in rows:
        assert len(r["completion_ids"]) == len(r["completion_logprobs"]) == len(r["loss_mask"]) > 0
        assert r["advantage"] is not None and math.isfinite(r["advantage"])
        assert r["truncated"] == (r["finish_reason"] == "length")


def test_every_confidence_is_conditioned_on_exactly_its_answer(rollout_runs, tiny_tokenizer):
    _, _, tasks, res, _ = rollout_runs
    answers = {(r["prompt_id"], r["answer_id"]): r for r in res.rows if r["sample_type"] == "answer"}
    task_of = dict(tasks)
    for r in res.rows:
        if r["sample_type"] != "confidence":
            continue
        parent = answers[(r["prompt_id"], r["answer_id"])]
        want = tiny_tokenizer.apply_chat_template(
            turn2_messages(task_of[r["prompt_id"]], parent["completion_text"]), add_generation_prompt=True,
            tokenize=False)
        assert r["context_text"] == want
        assert r["context_ids"] == tiny_tokenizer(want, add_special_tokens=False)["input_ids"]
        others = [a["completion_text"] for k, a in answers.items() if k != (r["prompt_id"], r["answer_id"])]
        assert all(o not in r["context_text"] for o in others if o.strip() and o != parent["completion_text"])
        assert r["correct"] == parent["reward"]


def test_same_seed_same_rollouts(rollout_runs):
    _, _, _, a, b = rollout_runs
    def key(r):
        return (r["sample_type"], r["prompt_id"], r["answer_id"], r["confidence_id"] or 0)

    ra, rb = sorted(a.rows, key=key), sorted(b.rows, key=key)
    assert [r["completion_ids"] for r in ra] == [r["completion_ids"] for r in rb]
    assert [r["reward"] for r in ra] == [r["reward"] for r in rb]


def test_stage_actors_and_stage_tasks_sample_alike(rollout_runs, engine_pool, tiny_model_dir, monkeypatch):
    """With shared engines the stages are task-based functions (nothing starts per dataset); the former pool of
    stage actors (``RLCR_ROLLOUT_STAGES=actors``) draws the very same rollouts."""
    from rlcr.rollout.pipeline import STAGES_ENV, build_rollout_dataset

    cfg, _, tasks, _, shared = rollout_runs
    monkeypatch.delenv(STAGES_ENV, raising=False)
    plan = str(build_rollout_dataset(cfg, tasks, str(tiny_model_dir), 0, engines=engine_pool.names))
    assert "answer_batch" in plan and "confidence_batch" in plan and "Stage" not in plan, plan
    monkeypatch.setenv(STAGES_ENV, "actors")
    plan = str(build_rollout_dataset(cfg, tasks, str(tiny_model_dir), 0, engines=engine_pool.names))
    assert "AnswerStage" in plan and "ConfidenceStage" in plan, plan
    actors = run_rollouts(cfg, tasks, policy_uri=str(tiny_model_dir), run_id="t2", iteration=0, engines=engine_pool)
    assert [(r["sample_type"], r["prompt_id"], r["answer_id"], r["confidence_id"]) for r in actors.rows] == [
        (r["sample_type"], r["prompt_id"], r["answer_id"], r["confidence_id"]) for r in shared.rows]
    for a, b in zip(actors.rows, shared.rows):
        assert ((a["context_ids"], a["completion_ids"], a["reward"])
                == (b["context_ids"], b["completion_ids"], b["reward"]))
        assert a["completion_logprobs"] == pytest.approx(b["completion_logprobs"], abs=1e-5)


def assert_logprobs_match(rows, model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for r in rows[:: max(1, len(rows) // 6)]:
        ids = torch.tensor([r["context_ids"] + r["completion_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0]
        n = len(r["completion_ids"])
        logp = torch.log_softmax(logits[-n - 1:-1].float(), -1).gather(
            -1, torch.tensor(r["completion_ids"])[:, None]).squeeze(-1)
        assert torch.allclose(logp, torch.tensor(r["completion_logprobs"]), atol=2e-3), (logp, r["completion_logprobs"])


def test_sampling_logprobs_match_transformers(rollout_runs, tiny_model_dir):
    _, _, _, owned, shared = rollout_runs
    assert_logprobs_match(owned.rows, tiny_model_dir)
    assert_logprobs_match(shared.rows, tiny_model_dir)


def test_shared_engines_take_new_weights(rollout_runs, engine_pool, tiny_model_dir, tmp_path):
    """After the pool loads another checkpoint, samples come from the new weights (not stale ones)."""
    from rlcr.models.tiny import build_tiny_model

    cfg, _, tasks, _, before = rollout_runs
    other = build_tiny_model(tmp_path / "other", seed=1)
    try:
        info = engine_pool.load(str(other))
        assert all(i["policy_uri"] == str(other) for i in info)
        after = run_rollouts(cfg, tasks, policy_uri=str(other), run_id="t3", iteration=0, engines=engine_pool)
        assert [r["completion_ids"] for r in after.rows] != [r["completion_ids"] for r in before.rows]
        assert_logprobs_match(after.rows, other)
        # a stage never samples from a policy other than the one it was built for
        with pytest.raises(Exception, match="call load"):
            run_rollouts(cfg, tasks, policy_uri=str(tiny_model_dir), run_id="t4", iteration=0, engines=engine_pool)
    finally:
        engine_pool.load(str(tiny_model_dir))


def test_ray_data_progress_bars_follow_the_config(ray_local, tiny_model_dir, tmp_path):
    """Off by default (off a terminal they flood a flow's log); ``rollout.progress=true`` turns them on."""
    import ray.data

    from rlcr.rollout.pipeline import build_rollout_dataset

    tasks = list(enumerate(generate_tasks(2, seed=1)))
    ctx = ray.data.DataContext.get_current()
    # building is lazy: nothing runs. A config that says nothing turns bars that were on off.
    for kw, on in (({"rollout.progress": True}, True), ({}, False), ({"rollout.progress": True}, True),
                   ({"rollout.progress": False}, False)):
        build_rollout_dataset(tiny_cfg(tiny_model_dir, tmp_path, **kw), tasks, str(tiny_model_dir), 0)
        assert ctx.enable_progress_bars is on, kw


def test_parquet_round_trip(rollout_runs):
    _, store, _, res, _ = rollout_runs
    assert res.uri.endswith("runs/t/iter-0000/rollouts/rollouts.parquet")
    back = table_to_rows(store.read_parquet(store.rel(res.uri)))
    assert validate_rollouts(back, num_prompts=P, g_a=GA, g_c=GC) == (P, GA, GC)
    for a, b in zip(res.rows, back):
        for k in ("prompt_id", "answer_id", "confidence_id", "sample_type", "completion_ids", "loss_mask", "reward",
                  "context_text"):
            assert a[k] == b[k]
        assert b["completion_logprobs"] == pytest.approx(a["completion_logprobs"], abs=1e-6)


def test_scoring_steps_on_batches():
    batch = pd.DataFrame([
        {"prompt_id": 0, "answer_id": 0, "confidence_id": -1, "sample_type": "answer", "nums": [3, 5, 16], "target": 24,
         "completion_text": "<think>x</think>\n<answer>16 + 5 + 3</answer>"},
        {"prompt_id": 0, "answer_id": 1, "confidence_id": -1, "sample_type": "answer", "nums": [3, 5, 16], "target": 24,
         "completion_text": "<answer>16 - 5 + 3</answer>"},
    ])
    scored = score_answers(batch, format_score=0.1, task="countdown")
    assert scored["reward"].tolist() == [1.0, 0.0] and scored["score"].tolist() == [1.0, 0.1]
    expanded = expand_to_turn2(scored, "countdown")
    msgs = json.loads(expanded["turn2_messages"][1])
    assert msgs == turn2_messages(CountdownTask([3, 5, 16], 24), "<answer>16 - 5 + 3</answer>")
    conf = pd.DataFrame([
        {"sample_type": "confidence", "completion_text": "<confidence>0.9</confidence>", "correct": 1.0, "reward": 0.0,
         "confidence": math.nan},
        {"sample_type": "confidence", "completion_text": "<confidence>nan</confidence>", "correct": 0.0, "reward": 0.0,
         "confidence": math.nan},
        {"sample_type": "answer", "completion_text": "x", "correct": 1.0, "reward": 1.0, "confidence": math.nan},
    ])
    out = score_confidences(conf)
    assert out["reward"].tolist() == pytest.approx([1 - 0.01, 0.0, 1.0])
    assert out["confidence"][0] == 0.9 and math.isnan(out["confidence"][1])


def test_prompt_too_long_is_a_clear_error(ray_local, tiny_model_dir, tmp_path):
    cfg = tiny_cfg(tiny_model_dir, tmp_path, **{"rollout.max_prompt_tokens": 16})
    with pytest.raises(Exception, match="rollout.max_prompt_tokens=16"):
        run_rollouts(cfg, [(0, CountdownTask([1, 2, 3], 6))], policy_uri=str(tiny_model_dir), run_id="x", iteration=0)


def test_a_turn2_prompt_that_a_long_answer_can_overflow_is_refused_before_any_ray_work(tiny_model_dir, tmp_path):
    """The turn-2 prompt holds the answer: with room for the first turn but not for turn 2 with an answer of
    rollout.max_answer_tokens, the check refuses up front (it stopped a 4-hour evaluation at its end before), naming
    the row and the fields; one more token of room passes, and rlcr_single, which has no turn 2, passes."""
    from transformers import AutoTokenizer

    from rlcr.models.chat import render_prompt
    from rlcr.rollout.pipeline import check_prompt_lengths
    from rlcr.tasks.countdown import turn2_messages

    task = CountdownTask([1, 2, 3], 6)
    empty = len(render_prompt(AutoTokenizer.from_pretrained(tiny_model_dir), turn2_messages(task, ""))[1])
    base = tiny_cfg(tiny_model_dir, tmp_path)
    room = empty + base.rollout.max_answer_tokens
    short = base.model_copy(update={"rollout.max_prompt_tokens": room - 1})
    with pytest.raises(ValueError, match=rf"^prompt_id=7: its turn-2 prompt can reach {room} tokens .* "
                                         rf"> rollout.max_prompt_tokens={room - 1}: raise rollout.max_prompt_tokens"):
        check_prompt_lengths(short, [(7, task)], str(tiny_model_dir))
    check_prompt_lengths(base.model_copy(update={"rollout.max_prompt_tokens": room}), [(7, task)], str(tiny_model_dir))
    check_prompt_lengths(short.model_copy(update={"method.name": "rlcr_single"}), [(7, task)], str(tiny_model_dir))


def test_turn2_prompt_too_long_names_its_row(tiny_tokenizer):
    """Turn-2 contexts are rendered where the engine is; an overlong one names prompt and answer."""
    from rlcr.models.chat import render_prompt
    from rlcr.tasks.countdown import turn2_messages

    msgs = turn2_messages(CountdownTask([1, 2, 3], 6), "<think>" + "1+2 " * 200 + "</think><answer>1+2+3</answer>")
    text, ids = render_prompt(tiny_tokenizer, msgs, where="prompt_id=3 answer_id=1", max_prompt_tokens=100_000)
    assert ids == tiny_tokenizer(text, add_special_tokens=False)["input_ids"] and "1+2+3" in text
    with pytest.raises(ValueError,
                       match=r"prompt_id=3 answer_id=1: rendered prompt has \d+ tokens > rollout.max_prompt_tokens=64"):
        render_prompt(tiny_tokenizer, msgs, where="prompt_id=3 answer_id=1", max_prompt_tokens=64)


@pytest.mark.parametrize("method", ["rlcr_single", "rlvr"])
def test_each_methods_rollouts_and_evaluation(method, engine_pool, tiny_model_dir, tiny_tokenizer, tmp_path):
    """`rlcr_single`: one turn (the one-turn prompt, answer + confidence budget, the `single` mask), rewards
    acc + λ·Brier, per-prompt advantages; `rlvr`: turn 1 only in training, and a turn-2 confidence per answer
    at evaluation (`eval_samples` answers per task)."""
    from rlcr.core.masks import completion_mask
    from rlcr.evaluation.evaluate import evaluate_policy
    from rlcr.tasks.countdown import SINGLE_TURN_SYSTEM_PROMPT, SYSTEM_PROMPT

    cfg = tiny_cfg(tiny_model_dir, tmp_path,
                   **{"method.name": method, "eval.samples": 2, "eval.bootstrap_resamples": 200})
    tasks = list(enumerate(generate_tasks(P, seed=11)))
    res = run_rollouts(cfg, tasks, policy_uri=str(tiny_model_dir), run_id="m", iteration=1, engines=engine_pool)
    assert {r["sample_type"] for r in res.rows} == {"answer"} and len(res.rows) == P * GA
    single = method == "rlcr_single"
    budget = cfg.rollout.max_answer_tokens + (cfg.rollout.max_confidence_tokens if single else 0)
    assert max(len(r["completion_ids"]) for r in res.rows) == budget  # the random tiny model runs to the limit
    for r in res.rows:
        assert (SINGLE_TURN_SYSTEM_PROMPT if single else SYSTEM_PROMPT) in r["context_text"]
        assert r["loss_mask"] == completion_mask(tiny_tokenizer, r["completion_ids"], r["completion_text"],
                                                 "single" if single else "answer")
    for p, _ in tasks:  # per-prompt advantages
        group = [r["advantage"] for r in res.rows if r["prompt_id"] == p]
        assert len(group) == GA and abs(sum(group)) < 1e-5
    assert res.stats["tokens/generated"] == sum(len(r["completion_ids"]) for r in res.rows)

    metrics, rows = evaluate_policy(cfg, [t for _, t in tasks], policy_uri=str(tiny_model_dir), iteration=1,
                                    engines=engine_pool)
    answers = [r for r in rows if r["sample_type"] == "answer"]
    confidences = [r for r in rows if r["sample_type"] == "confidence"]
    assert len(answers) == P * 2 and metrics["n_tasks"] == P and metrics["n_answers"] == P * 2
    assert len(confidences) == (0 if single else P * 2)  # rlvr is asked in turn 2, rlcr_single in its answer
    assert set(metrics["ci"]) == {"accuracy", "ece", "brier", "auroc"} and metrics["ci_resamples"] == 200

    def texts(rs):
        return {(r["prompt_id"], r["answer_id"], r["sample_type"]): r["completion_text"] for r in rs}

    _, again = evaluate_policy(cfg, [t for _, t in tasks], policy_uri=str(tiny_model_dir), iteration=1,
                               engines=engine_pool)
    _, redrawn = evaluate_policy(cfg, [t for _, t in tasks], policy_uri=str(tiny_model_dir), iteration=1,
                                 engines=engine_pool, draw=1)
    assert texts(again) == texts(rows)  # draw 0 is the flow's draw, reproducible
    assert texts(redrawn).keys() == texts(rows).keys()  # the same tasks and answers…
    assert sum(texts(redrawn)[k] != v for k, v in texts(rows).items()) >= len(rows) // 2  # …sampled anew


def test_an_engine_call_past_its_limit_stops_with_a_one_line_error(engine_pool, tiny_model_dir):
    """Every wait on an engine actor is bounded by ``engine.call_timeout_s``: a call that has not answered by then
    (here a real generation of 64 tokens given a millisecond) is an EngineTimeout naming the call and the
    setting, and the engine itself goes on (the same call with the default limit answers)."""
    import time

    from rlcr.rollout.engine import EngineTimeout, engine_get

    actor = engine_pool.actors[0]
    call = dict(conversations=[[{"role": "user", "content": "Count to twenty."}]], policy_uri=engine_pool.policy_uri,
                labels=["t"], mask_kind="answer", seeds=[[5]], n=1, temperature=1.0, top_p=1.0, max_tokens=64,
                stop=None)
    short = tiny_cfg(tiny_model_dir, "unused").model_copy(update={"engine.call_timeout_s": 0.001})
    t0 = time.perf_counter()
    with pytest.raises(EngineTimeout, match=r"engine call generate_chats did not answer within 0\.001 s "
                                            r"\(engine\.call_timeout_s\)") as e:
        engine_get(actor.generate_chats.remote(**call), short, "generate_chats")
    assert "\n" not in str(e.value) and time.perf_counter() - t0 < 5
    contexts, samples = engine_get(actor.generate_chats.remote(**call), tiny_cfg(tiny_model_dir, "unused"),
                                   "generate_chats")
    assert len(contexts) == 1 and len(samples[0]) == 1
    with pytest.raises(ValueError, match="call_timeout_s"):
        RLCRConfig.from_dict({"engine": {"call_timeout_s": 0}})
