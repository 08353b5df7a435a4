"""Bit-identity of the task port (issue 32 item 2): one iteration of the real pipeline on the tiny model —
task sets, the iteration's prompts, ``run_rollouts`` (both vLLM stages, scoring, advantages) and one
in-process ``train_update`` — against reference values recorded from the code *before* Countdown went
behind the task interface (tests/data/task_port_reference.json).

The fast test recomputes the rewards, accuracies and advantages of the recorded completions with the current
code (machine-independent: pure Python). The slow test reruns the whole iteration: the sampled tokens depend
on vLLM's CPU kernels, so it is exact on the machine that recorded it (and any with the same kernels); the
weights after the update are compared by hash and, should the hash differ, that is reported with the largest
weight difference. ``RLCR_RECORD_PORT_REFERENCE=1`` rewrites the file (only ever from the pre-port code).
"""

import hashlib
import json
import os
from pathlib import Path

import pytest

from rlcr.config import FLAT_NAMES, RLCRConfig, nested_from_flat

REFERENCE = Path(__file__).parent / "data" / "task_port_reference.json"


def reference_cfg(model_dir, store_dir) -> RLCRConfig:
    return RLCRConfig(model={"name": str(model_dir)}, storage={"uri": str(store_dir)}, rollout={"num_generations_answer": 2, "num_generations_confidence": 2, "temperature": 1.0, "max_answer_tokens": 24, "max_confidence_tokens": 12, "batch_size": 8, "prompts_per_iteration": 3}, engine={"max_model_len": 512, "kv_cache_gib": 0.25}, run={"seed": 7}, tasks={"num_train": 24, "num_eval": 6}, update={"learning_rate": 1e-3, "micro_batch_tokens": 128})


def _key(r):
    return f"{r['sample_type']}/{r['prompt_id']}/{r['answer_id']}/{r['confidence_id']}"


def _summary(rows):
    return {_key(r): {k: r[k] for k in ("nums", "target", "context_ids", "completion_ids", "completion_text",
                                         "loss_mask", "score", "correct", "confidence", "reward", "advantage")}
            for r in rows}


def _weights_sha(state_dict) -> str:
    h = hashlib.sha256()
    for name in sorted(state_dict):
        h.update(name.encode())
        h.update(state_dict[name].detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def test_recorded_completions_score_and_normalise_as_recorded():
    """The current scoring, rewards and advantages on the recorded completions give the recorded values."""
    from rlcr.rollout.records import answer_scores, assign_advantages, confidence_scores, rollout_row
    from rlcr.tasks.countdown import CountdownTask

    ref = json.loads(REFERENCE.read_text())
    cfg = RLCRConfig.from_dict(nested_from_flat(ref["cfg"]))  # recorded by the pre-port (flat-config) code
    rows, by_key = [], ref["rows"]
    correct = {}
    for key in sorted(by_key, key=lambda k: k.startswith("confidence")):
        r = by_key[key]
        kind, p, a, h = key.split("/")
        problem = CountdownTask(nums=r["nums"], target=r["target"])
        if kind == "answer":
            scores = answer_scores(r["completion_text"], problem, format_score=cfg.method.format_score, method=cfg.method.name)
            correct[(p, a)] = scores["correct"]
        else:
            scores = {**confidence_scores(r["completion_text"], correct[(p, a)]), "correct": correct[(p, a)]}
        for name, value in scores.items():
            assert value == r[name], (key, name)
        rows.append(rollout_row(kind, task=problem, prompt_id=int(p), answer_id=int(a),
                                confidence_id=None if h == "None" else int(h), context_text="",
                                context_ids=r["context_ids"], completion_text=r["completion_text"],
                                completion_ids=r["completion_ids"], **scores))
    assign_advantages(rows, method=cfg.method.name, eps=cfg.method.adv_eps, scale_by_std=cfg.method.scale_by_std,
                      conf_mode=cfg.method.conf_norm_mode)
    for r in rows:
        assert r["advantage"] == by_key[_key(r)]["advantage"], _key(r)
        assert (r["nums"], r["target"]) == (by_key[_key(r)]["nums"], by_key[_key(r)]["target"])


CRAFTED_ANSWERS = ("<think>x</think>\n<answer>{solution}</answer>", "<answer>1 + 2</answer>", "no answer",
                   "<answer>{solution}</answer>\n<analysis>ok</analysis><confidence>0.8</confidence>")
CRAFTED_CONFIDENCES = ("<confidence>0.7</confidence>", "<analysis>no</analysis><confidence>abc</confidence>")


def _crafted(prompts) -> dict:
    """Scores and advantages of crafted completions (right, wrong, no answer, one-turn) on the reference
    prompts: the rollouts of the tiny random model score 0 throughout, these exercise every outcome."""
    from rlcr.rollout.records import answer_scores, assign_advantages, confidence_scores, rollout_row

    out, rows = {}, []
    for p, (pid, t) in enumerate(prompts):
        for a, template in enumerate(CRAFTED_ANSWERS):
            text = template.format(solution=t.solution)
            for method in ("rlcr", "rlcr_single"):
                out[f"answer/{pid}/{a}/{method}"] = answer_scores(text, t, format_score=0.1, method=method,
                                                                  lambda_conf=0.5)
            scores = answer_scores(text, t, format_score=0.1)
            rows.append(rollout_row("answer", task=t, prompt_id=p, answer_id=a, context_text="", context_ids=[1],
                                    completion_text=text, completion_ids=[2], **scores))
            for h, conf in enumerate(CRAFTED_CONFIDENCES):
                c = confidence_scores(conf, scores["correct"])
                out[f"confidence/{pid}/{a}/{h}"] = c
                rows.append(rollout_row("confidence", task=t, prompt_id=p, answer_id=a, confidence_id=h,
                                        context_text="", context_ids=[1], completion_text=conf, completion_ids=[3],
                                        correct=scores["correct"], **c))
    for mode in ("answer", "answer_then_prompt"):
        assign_advantages(rows, method="rlcr", conf_mode=mode)
        out[f"advantages/{mode}"] = [r["advantage"] for r in rows]
    return out


def test_crafted_completions_score_and_normalise_as_recorded():
    """Every scoring outcome (right, wrong, no answer, one-turn, parsed and unparsed confidences) and the
    advantages of both confidence normalisations, on the reference prompts, as recorded."""
    from rlcr.tasks.countdown import CountdownTask, solve

    ref = json.loads(REFERENCE.read_text())
    prompts = [(i, CountdownTask(nums, target, solve(nums, target))) for i, nums, target in ref["sets"]["prompts"]]
    assert _crafted(prompts) == ref["crafted"]


def _iteration(model_dir, store_dir, tokenizer):
    """The reference iteration: task sets, prompts of iteration 1, rollouts, one update in this process."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcr.rollout.pipeline import run_rollouts
    from rlcr.seeds import update_seed
    from rlcr.tasks.sets import prompts_for_iteration, task_sets
    from rlcr.train.batching import prepare_samples
    from rlcr.train.logprobs import CompletionLogProbs
    from rlcr.train.update import train_update

    cfg = reference_cfg(model_dir, store_dir)
    train, held_out = task_sets(cfg)
    prompts = prompts_for_iteration(cfg, train, 1)
    res = run_rollouts(cfg, prompts, policy_uri=str(model_dir), run_id="ref", iteration=1)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = [dict(r) for r in res.rows]
    # the tiny random model's rollouts all score 0 (advantages 0): the update also runs on the same rows with
    # fixed nonzero advantages, so the weights move and their hash covers the tokens and masks of every row
    for k, r in enumerate(rows):
        r["advantage"] = r["advantage"] + (1.0 if k % 2 else -1.0)
    metrics = train_update(CompletionLogProbs(lm), prepare_samples(rows, tokenizer), cfg,
                           pad_id=tokenizer.pad_token_id, seed=update_seed(cfg.run.seed, 1))
    sets = {"train": [[list(t.nums), t.target] for t in train], "held_out": [[list(t.nums), t.target] for t in held_out],
            "prompts": [[i, list(t.nums), t.target] for i, t in prompts]}
    return cfg, sets, res.rows, metrics, lm.state_dict()


def _prompts(model_dir, store_dir):
    from rlcr.tasks.sets import prompts_for_iteration, task_sets

    cfg = reference_cfg(model_dir, store_dir)
    return prompts_for_iteration(cfg, task_sets(cfg)[0], 1)


@pytest.mark.slow
def test_one_iteration_is_bit_identical_to_the_pre_port_reference(ray_local, tiny_model_dir, tiny_tokenizer, tmp_path):
    cfg, sets, rows, metrics, weights = _iteration(tiny_model_dir, tmp_path / "store", tiny_tokenizer)
    got = {"cfg": {flat: cfg.get(FLAT_NAMES[flat]) for flat in ("seed", "method", "format_score", "adv_eps",
                                                                "scale_by_std", "conf_norm_mode")},
           "sets": sets, "rows": _summary(rows), "loss": metrics["loss"], "weights_sha256": _weights_sha(weights),
           "crafted": _crafted([(i, t) for i, t in _prompts(tiny_model_dir, tmp_path)])}
    if os.environ.get("RLCR_RECORD_PORT_REFERENCE") == "1":
        REFERENCE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    ref = json.loads(REFERENCE.read_text())
    assert got["sets"] == ref["sets"]
    assert got["rows"].keys() == ref["rows"].keys()
    for key, r in ref["rows"].items():
        for field, value in r.items():
            assert got["rows"][key][field] == value, (key, field)
    assert got["crafted"] == ref["crafted"]
    assert got["loss"] == ref["loss"] and got["loss"] != 0.0
    assert got["weights_sha256"] == ref["weights_sha256"]
