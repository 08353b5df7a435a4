"""Masked GRPO update (docs/design.md §8): batching, in-process update, Ray Train, checkpoints.

The in-process tests call :func:`rlcr.train.update.train_update` directly; the
Ray tests run two real ``TorchTrainer`` fits (1 and 2 gloo workers) on a local
Ray and share their checkpoints with the transformers/vLLM load test.
"""

import gc
import json
import math
from pathlib import Path

import pytest
import torch

from rlcr.config import RLCRConfig
from rlcr.core.loss import policy_loss, token_logprobs
from rlcr.storage import COMPLETE_MARKER, Store
from rlcr.train.batching import (
    collate,
    collate_prefix_tree,
    pack_micro_batches,
    pack_prefix_trees,
    plan_mini_batches,
    prefix_tree,
    prepare_samples,
    shard_rows,
)
from rlcr.train.checkpoint import NonFiniteError, save_checkpoint
from rlcr.train.logprobs import CompletionLogProbs
from rlcr.train.update import train_update

# ----------------------------------------------------------------------------- helpers


def make_rows(n_prompts=2, g_a=2, g_c=2, seed=0, ctx_len=12, vocab=(5, 500)):
    """A small synthetic rollout tree (answers + confidences) with random tokens and advantages."""
    g = torch.Generator().manual_seed(seed)
    rows = []

    def rand(n):
        return torch.randint(vocab[0], vocab[1], (n,), generator=g).tolist()

    for p in range(n_prompts):
        ctx = rand(ctx_len + p)
        for a in range(g_a):
            comp = rand(6 + 2 * a + p)
            rows.append(dict(
                run_id="t", iteration=0, prompt_id=p, answer_id=a, confidence_id=None, sample_type="answer",
                context_ids=ctx, completion_ids=comp, completion_text="", completion_logprobs=None,
                loss_mask=[0] + [1] * (len(comp) - 2) + [0], reward=float(a % 2), advantage=1.0 if a % 2 else -1.0,
            ))
            for h in range(g_c):
                conf = rand(4 + h)
                rows.append(dict(
                    run_id="t", iteration=0, prompt_id=p, answer_id=a, confidence_id=h, sample_type="confidence",
                    context_ids=ctx + comp + rand(3), completion_ids=conf, completion_text="",
                    completion_logprobs=None, loss_mask=[1] * len(conf), reward=0.5 + 0.1 * h,
                    advantage=0.7 if h % 2 else -0.7,
                ))
    return rows


def load_lm(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def seq_logprob(lm, context, completion):
    """Σ log π(completion | context) with a plain full forward (the reference computation)."""
    ids = torch.tensor([context + completion])
    with torch.no_grad():
        logits = lm(ids).logits[0, len(context) - 1:-1]
    logp, _ = token_logprobs(logits, torch.tensor(completion))
    return float(logp.sum())


def cfg_for(tmp_path, **kw):
    base = {"storage.uri": str(tmp_path / "store"), "update.learning_rate": 1e-3, "update.micro_batch_tokens": 96,
            "update.grad_clip": 1.0}
    base.update(kw)
    return RLCRConfig.from_dict(base)


# ----------------------------------------------------------------------------- batching (pure)


def test_packing_respects_budget_and_keeps_every_row_once(tiny_tokenizer):
    samples = prepare_samples(make_rows(n_prompts=3, g_a=3, g_c=2), tiny_tokenizer)
    plan = plan_mini_batches(len(samples), epochs=2, mini_batches=3, seed=1)
    for epoch in plan:
        assert sorted(i for mb in epoch for i in mb) == list(range(len(samples)))  # a partition, per epoch
        for mb in epoch:
            shards = [shard_rows(mb, samples, r, 2) for r in range(2)]
            assert sorted(shards[0] + shards[1]) == sorted(mb)  # no row dropped or duplicated across ranks
    micro = pack_micro_batches(samples, 96)
    assert sorted(s.index for g in micro for s in g) == list(range(len(samples)))
    for group in micro:
        assert len(group) == 1 or len(group) * max(s.length for s in group) <= 96
    mb = collate(micro[0], pad_id=0)
    # every selected position predicts exactly its label, and only masked tokens are selected
    assert torch.equal(mb.input_ids[mb.sel_row, mb.sel_pos + 1], mb.sel_label)
    assert mb.loss_mask[mb.sel_row, mb.sel_col].eq(1).all() and len(mb.sel_row) == mb.masked_tokens


def test_prefix_tree_stores_each_shared_prefix_once(tiny_tokenizer):
    samples = prepare_samples(make_rows(n_prompts=2, g_a=3, g_c=2), tiny_tokenizer)
    samples.append(samples[0])  # an exact duplicate shares its whole path
    seqs = [s.tokens for s in samples]
    tokens, depth, end, paths = prefix_tree(seqs)
    distinct_prefixes = {tuple(q[: t + 1]) for q in seqs for t in range(len(q))}
    assert len(tokens) == len(distinct_prefixes) < sum(map(len, seqs))
    assert paths[-1] == paths[0]
    for seq, path in zip(seqs, paths):
        assert [tokens[k] for k in path] == seq and [depth[k] for k in path] == list(range(len(seq)))
        for t, k in enumerate(path):  # the nodes k may see are exactly the path up to it
            assert [j for j in range(len(tokens)) if j <= k < end[j]] == path[: t + 1]
    # packing: every sample once, each tree within the budget (or a single sample)
    trees = pack_prefix_trees(samples, 60)
    assert sorted(s.index for g in trees for s in g) == sorted(s.index for s in samples)
    assert len(trees) > 1
    for g in trees:
        assert len(g) == 1 or len(prefix_tree([s.tokens for s in g])[0]) <= 60
    mb = collate_prefix_tree(trees[0], pad_id=0)
    assert mb.loss_mask[mb.sel_row, mb.sel_col].eq(1).all() and len(mb.sel_row) == mb.masked_tokens


def test_prefix_tree_gives_the_log_probs_and_gradients_of_unpacked_rows(tiny_model_dir, tiny_tokenizer):
    """Tree attention + depth positions reproduce each sample's own sequence exactly (forward and backward)."""
    lm = load_lm(tiny_model_dir)
    policy = CompletionLogProbs(lm)
    samples = prepare_samples(make_rows(n_prompts=2, g_a=3, g_c=2), tiny_tokenizer)
    padded, tree = collate(samples, pad_id=0), collate_prefix_tree(samples, pad_id=0)
    assert tree.input_ids.shape[0] == 1 and tree.padded_tokens < sum(s.length for s in samples) < padded.padded_tokens

    def loss_and_grads(mb):
        lm.zero_grad()
        lp, _ = policy(**mb.model_inputs())
        full = torch.zeros(mb.loss_mask.shape).index_put((mb.sel_row, mb.sel_col), lp)
        loss, _ = policy_loss(full, full.detach(), mb.advantages, mb.loss_mask)
        loss.backward()
        return full.detach(), [p.grad.clone() for p in lm.parameters()]

    lp_pad, g_pad = loss_and_grads(padded)
    lp_tree, g_tree = loss_and_grads(tree)
    assert torch.equal(padded.loss_mask, tree.loss_mask)
    torch.testing.assert_close(lp_tree, lp_pad, rtol=0, atol=2e-5)
    for a, b in zip(g_tree, g_pad):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # and the same as an independent full forward of one confidence sample
    s = next(x for x in samples if x.is_confidence)
    row = samples.index(s)
    assert abs(float(lp_tree[row].sum()) - seq_logprob(lm, s.context_ids, s.completion_ids)) < 1e-4


def test_prepare_samples_validates_and_computes_null_masks(tiny_tokenizer):
    rows = make_rows(n_prompts=1, g_a=2, g_c=2)
    rows[0]["advantage"] = float("nan")
    with pytest.raises(ValueError, match="non-finite advantage"):
        prepare_samples(rows, tiny_tokenizer)
    rows[0]["advantage"] = None
    with pytest.raises(ValueError, match="advantage is missing"):
        prepare_samples(rows, tiny_tokenizer)
    # a null loss_mask is computed from the text with the docs/design.md §6 span rule
    text = "<think>try 3+4</think>\n<answer>3+4</answer>"
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    row = dict(make_rows(1, 1, 2)[0], completion_ids=ids, completion_text=text, loss_mask=None, advantage=1.0)
    (s,) = prepare_samples([row], tiny_tokenizer)
    assert s.loss_mask[:-1] == [1] * (len(ids) - 1) and s.loss_mask[-1] == 0  # EOS after </answer> is outside


# ----------------------------------------------------------------------------- objectives


def test_objectives_are_registered_by_name():
    from types import SimpleNamespace

    from rlcr.train.objectives import OBJECTIVES, get_objective, register_objective

    assert {"grpo", "sft"} <= set(OBJECTIVES)
    assert OBJECTIVES["grpo"].uses_old_logp and not OBJECTIVES["sft"].uses_old_logp
    assert all("docs/design.md §" in (o.loss.__doc__ or "") for o in OBJECTIVES.values())
    with pytest.raises(ValueError, match="unknown objective 'nope'"):
        get_objective("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_objective("grpo")(lambda inputs, cfg: None)
    with pytest.raises(TypeError, match="RLCRConfig"):  # no ad-hoc configs: their defaults would drift
        train_update(None, [], SimpleNamespace(objective="grpo", share_prefixes=True), pad_id=0)


# ----------------------------------------------------------------------------- loss + model


def test_context_and_padding_get_no_gradient(tiny_model_dir, tiny_tokenizer):
    """Only masked completion positions receive gradient from the loss; padding content changes nothing."""
    lm = load_lm(tiny_model_dir)
    samples = prepare_samples(make_rows(n_prompts=2, g_a=2, g_c=1), tiny_tokenizer)
    mb = collate(samples, pad_id=tiny_tokenizer.pad_token_id)
    b, t = mb.input_ids.shape
    lengths = torch.tensor([s.length for s in samples])
    assert (lengths < t).any()  # some rows are padded

    # reference path: full logits at every position, log-probs of every completion token
    logits = lm(mb.input_ids).logits
    logits.retain_grad()
    ctx_len = torch.tensor([len(s.context_ids) for s in samples])
    cols = torch.arange(mb.loss_mask.shape[1])
    pos = (ctx_len[:, None] + cols[None, :] - 1).clamp(max=t - 2)
    labels = mb.input_ids.gather(1, pos + 1)
    logp_full = torch.log_softmax(logits.float(), -1)[torch.arange(b)[:, None], pos, labels]
    loss, _ = policy_loss(logp_full, logp_full.detach(), mb.advantages, mb.loss_mask)
    loss.backward()
    grad_rows = logits.grad.abs().sum(-1)  # [B, T]: gradient reaching each position's logits
    selected = torch.zeros(b, t, dtype=torch.bool)
    selected[mb.sel_row, mb.sel_pos] = True
    assert (grad_rows[selected] > 0).all()
    assert (grad_rows[~selected] == 0).all()  # context, unmasked completion tokens, padding: exactly 0

    # the efficient path (lm_head only at the selected positions) computes the same log-probs
    policy = CompletionLogProbs(lm)
    with torch.no_grad():
        fast, _ = policy(mb.input_ids, mb.sel_row, mb.sel_pos, mb.sel_label)
    torch.testing.assert_close(fast, logp_full.detach()[mb.sel_row, mb.sel_col], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        fast2, ent = policy(mb.input_ids, mb.sel_row, mb.sel_pos, mb.sel_label, entropy="metric")
        _, ent_ref = token_logprobs(logits.detach()[mb.sel_row, mb.sel_pos], mb.sel_label, return_entropy=True)
    torch.testing.assert_close(fast2, fast, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-5, atol=1e-5)

    # input embeddings: padding positions get exactly zero gradient; padding CONTENT changes nothing
    def grads(pad_id):
        m = collate(samples, pad_id=pad_id)
        lm.zero_grad()
        emb = lm.get_input_embeddings()(m.input_ids).detach().requires_grad_(True)
        hidden = lm.base_model(inputs_embeds=emb).last_hidden_state
        lp, _ = token_logprobs(lm.get_output_embeddings()(hidden[m.sel_row, m.sel_pos]), m.sel_label)
        full = torch.zeros(m.loss_mask.shape).index_put((m.sel_row, m.sel_col), lp)
        out, _ = policy_loss(full, full.detach(), m.advantages, m.loss_mask)
        out.backward()
        return out.detach(), emb.grad, [p.grad.clone() for p in lm.parameters()]

    loss_a, emb_grad, pgrads_a = grads(tiny_tokenizer.pad_token_id)
    loss_b, _, pgrads_b = grads(7)
    pad = torch.arange(t)[None, :] >= lengths[:, None]
    assert emb_grad.abs().sum(-1)[pad].eq(0).all()
    assert emb_grad.abs().sum(-1)[~pad].gt(0).any()
    assert torch.equal(loss_a, loss_b)
    for ga, gb in zip(pgrads_a, pgrads_b):
        torch.testing.assert_close(ga, gb, rtol=0, atol=1e-7)


def test_update_raises_positive_and_lowers_negative_answer(tiny_model_dir, tiny_tokenizer, tmp_path):
    lm = load_lm(tiny_model_dir)
    rows = make_rows(n_prompts=1, g_a=2, g_c=2)
    for r in rows:  # masks over whole completions keep the check direct
        r["loss_mask"] = [1] * len(r["completion_ids"])
    good = next(r for r in rows if r["sample_type"] == "answer" and r["advantage"] > 0)
    bad = next(r for r in rows if r["sample_type"] == "answer" and r["advantage"] < 0)
    before = [seq_logprob(lm, r["context_ids"], r["completion_ids"]) for r in (good, bad)]
    cfg = cfg_for(tmp_path, **{"update.learning_rate": 3e-4})
    m = train_update(CompletionLogProbs(lm), prepare_samples(rows, tiny_tokenizer), cfg,
                     pad_id=tiny_tokenizer.pad_token_id)
    after = [seq_logprob(lm, r["context_ids"], r["completion_ids"]) for r in (good, bad)]
    assert m["optimizer_steps"] == 1 and m["skipped_steps"] == 0
    assert m["ratio_mean_first"] == 1.0 and m["clipfrac_high"] == 0.0  # recompute: exactly on-policy
    assert after[0] > before[0] + 1e-3
    assert after[1] < before[1] - 1e-3


def test_recompute_prepass_is_exact_and_rollout_logprobs_are_used(tiny_model_dir, tiny_tokenizer, tmp_path):
    """Several steps: the pre-pass π_old makes the first ratio exactly 1; ``rollout`` takes the rows' log-probs."""
    lm = load_lm(tiny_model_dir)
    rows = make_rows(n_prompts=2, g_a=2, g_c=2)
    m = train_update(CompletionLogProbs(lm), prepare_samples(rows, tiny_tokenizer),
                     cfg_for(tmp_path, **{"update.mini_batches_per_epoch": 2, "update.epochs_per_iteration": 2,
                                          "update.lr_schedule": "cosine", "update.warmup_steps": 1}),
                     pad_id=tiny_tokenizer.pad_token_id)
    first = m["history"][0]
    assert first["ratio_mean"] == 1.0 and first["approx_kl"] == 0.0
    assert m["optimizer_steps"] == 4 and any(h["approx_kl"] != 0 for h in m["history"][1:])
    assert [round(h["lr"] / 1e-3, 4) for h in m["history"]] == [1.0, 1.0, 0.75, 0.25]  # warm-up 1, cosine

    # rollout log-probs shifted by +0.5 nats → the first ratio is exp(-0.5), not 1
    lm = load_lm(tiny_model_dir)
    for r in rows:
        ids = torch.tensor([r["context_ids"] + r["completion_ids"]])
        with torch.no_grad():
            logits = lm(ids).logits[0, len(r["context_ids"]) - 1:-1]
        r["completion_logprobs"] = (token_logprobs(logits, torch.tensor(r["completion_ids"]))[0] + 0.5).tolist()
    m = train_update(CompletionLogProbs(lm), prepare_samples(rows, tiny_tokenizer),
                     cfg_for(tmp_path,
                             **{"update.old_logp_source": "rollout", "loss.clip_low": 0.9, "loss.clip_high": 9.0}),
                     pad_id=tiny_tokenizer.pad_token_id)
    assert m["ratio_mean_first"] == pytest.approx(math.exp(-0.5), rel=1e-4)
    rows[0]["completion_logprobs"] = None
    with pytest.raises(ValueError, match="completion_logprobs"):
        train_update(CompletionLogProbs(lm), prepare_samples(rows, tiny_tokenizer),
                     cfg_for(tmp_path, **{"update.old_logp_source": "rollout"}), pad_id=tiny_tokenizer.pad_token_id)


def test_kl_to_frozen_reference(tiny_model_dir, tiny_tokenizer, tmp_path):
    """β > 0: the reference is scored once; it equals the policy at step 1 and drifts after."""
    lm, ref = load_lm(tiny_model_dir), load_lm(tiny_model_dir)
    m = train_update(CompletionLogProbs(lm), prepare_samples(make_rows(1, 2, 2), tiny_tokenizer),
                     cfg_for(tmp_path,
                             **{"loss.kl_coef": 0.5, "loss.kl_type": "k3", "update.mini_batches_per_epoch": 2}),
                     pad_id=tiny_tokenizer.pad_token_id, ref=CompletionLogProbs(ref.requires_grad_(False)))
    assert m["history"][0]["ref_kl"] == 0.0 and m["history"][1]["ref_kl"] > 0.0
    assert all(torch.equal(a, b)
               for a, b in zip(ref.state_dict().values(), load_lm(tiny_model_dir).state_dict().values()))


def test_nonfinite_step_is_skipped_and_never_checkpointed(tiny_model_dir, tiny_tokenizer, tmp_path):
    lm = load_lm(tiny_model_dir)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    rows = make_rows(n_prompts=1, g_a=2, g_c=2)
    rows[1]["advantage"] = float("nan")  # injected past validation
    samples = prepare_samples(rows, tiny_tokenizer, check_finite=False)
    m = train_update(CompletionLogProbs(lm), samples, cfg_for(tmp_path), pad_id=tiny_tokenizer.pad_token_id)
    assert m["skipped_steps"] == 1 and m["optimizer_steps"] == 0
    assert not math.isfinite(m["loss"])
    for k, v in lm.state_dict().items():
        assert torch.equal(v, before[k]), k

    # non-finite weights: refused, and nothing (complete or partial) appears in the store
    store = Store(str(tmp_path / "store"))
    with torch.no_grad():
        next(lm.parameters())[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match="non-finite"):
        save_checkpoint(lm, tiny_tokenizer, store, "runs/r/iter-0/checkpoint")
    assert not store.exists("runs/r/iter-0/checkpoint") and store.ls("runs") == []


# ----------------------------------------------------------------------------- the workers' RPC


def test_a_served_worker_runs_the_calls_in_order_until_stop_and_ends_on_an_unknown_call():
    import queue

    from rlcr.train.rpc import Call, Reply, serve

    class Counter:
        METHODS = ("add", "stop")

        def __init__(self):
            self.total = 0

        def add(self, k):
            self.total += k
            return self.total

        def stop(self):
            return "bye"

    inbox, outbox = queue.Queue(), queue.Queue()
    for call in (Call(1, "add", {"k": 2}), Call(2, "add", {"k": 3}), Call(3, "stop"), Call(4, "add", {"k": 9})):
        inbox.put(call)
    serve(Counter(), Counter.METHODS, inbox, outbox, rank=1)
    assert [outbox.get_nowait() for _ in range(3)] == [Reply(1, 1, 2), Reply(2, 1, 5), Reply(3, 1, "bye")]
    assert outbox.empty() and inbox.qsize() == 1  # returned at stop: the call after it was never read
    for bad in (Call(5, "__init__"), Call(6, "total"), {"op": "add", "seq": 1}):
        inbox = queue.Queue()
        inbox.put(bad)
        with pytest.raises(ValueError, match="worker 0: unknown call"):
            serve(Counter(), Counter.METHODS, inbox, outbox, rank=0)


def test_a_call_is_checked_against_the_trainer_worker_before_it_is_sent():
    from rlcr.train.rpc import check_call
    from rlcr.train.worker import TrainerWorker

    check_call(TrainerWorker, "update", {"rows": None, "iteration": 3})
    check_call(TrainerWorker, "save", {"rel": "x", "extra": {}, "with_optimizer": True, "fence": None})
    with pytest.raises(TypeError):
        check_call(TrainerWorker, "update", {"row": None, "iteration": 3})  # a misspelt argument
    with pytest.raises(TypeError):
        check_call(TrainerWorker, "save", {"rel": "x"})  # a missing one
    for method in ("_restore", "weights", "nope"):  # private, or not served on its own
        with pytest.raises(AttributeError, match="serves no method"):
            check_call(TrainerWorker, method, {})


# ----------------------------------------------------------------------------- Ray Train


@pytest.fixture(scope="module")
def ray_updates(ray_local, tiny_model_dir, tmp_path_factory):
    """The same rollouts updated with 1 and with 2 gloo workers (two TorchTrainer fits)."""
    from rlcr.train.trainer import run_update

    # 14 rows (answers + confidences of uneven sizes) in 8 mini-batches of 1–2 rows: with 2 workers
    # some mini-batches leave a rank with no rows at all; micro-batches are small enough that
    # the ranks run different numbers of them
    rows = make_rows(n_prompts=2, g_a=2, g_c=3, seed=3)[:14]
    results = {}
    for workers in (1, 2):
        root = tmp_path_factory.mktemp(f"store{workers}")
        cfg = RLCRConfig(storage={"uri": str(root)}, update={"num_workers": workers, "learning_rate": 1e-3,
                                                             "micro_batch_tokens": 64, "mini_batches_per_epoch": 8})
        results[workers] = (run_update(cfg, rows, policy_uri=str(tiny_model_dir), run_id="r", iteration=1), root)
    return results


def test_one_and_two_workers_give_the_same_update(ray_updates, tiny_model_dir):
    (one, root1), (two, root2) = ray_updates[1], ray_updates[2]
    for res, root in ((one, root1), (two, root2)):
        assert res.checkpoint_uri == str(root / "runs" / "r" / "iter-0001" / "checkpoint")
        assert res.metrics["optimizer_steps"] == 8 and res.metrics["skipped_steps"] == 0
    assert two.metrics["world_size"] == 2
    assert any(h["global_sequences"] == 1 for h in two.metrics["history"])  # a rank had zero rows
    for key in ("loss", "masked_tokens", "answer/reward_mean", "confidence/masked_tokens"):
        assert one.metrics[key] == pytest.approx(two.metrics[key], rel=1e-5, abs=1e-7), key
    # the gradient itself (pre-clip norm of the DDP-averaged gradient) is the whole-batch gradient at every
    # step: AdamW is scale-invariant, so this is what catches a mis-normalised loss (e.g. no × world_size)
    for h1, h2 in zip(one.metrics["history"], two.metrics["history"]):
        assert h1["grad_norm"] == pytest.approx(h2["grad_norm"], rel=1e-4), (h1, h2)
    w0, w1, w2 = (load_lm(p).state_dict() for p in (tiny_model_dir, one.checkpoint_uri, two.checkpoint_uri))
    moved = max(float((w1[k] - w0[k]).abs().max()) for k in w0)
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w0)
    d1 = torch.cat([(w1[k] - w0[k]).flatten() for k in w0])
    d2 = torch.cat([(w2[k] - w0[k]).flatten() for k in w0])
    rel = float((d1 - d2).norm() / d1.norm())
    assert moved > 1e-3  # eight AdamW steps of lr 1e-3 did change the weights
    # … identically on 1 and 2 workers, up to float summation order (which AdamW's g/√v
    # normalisation amplifies for near-zero gradient entries)
    assert diff < 0.02 * moved and rel < 1e-3, (diff, moved, rel)


def test_checkpoint_is_sealed_and_loads_in_transformers_and_vllm(ray_updates, tiny_tokenizer):
    ckpt = Path(ray_updates[2][0].checkpoint_uri)
    names = {p.name for p in ckpt.iterdir()}
    assert {COMPLETE_MARKER, "config.json", "model.safetensors", "tokenizer.json", "rlcr_update.json"} <= names
    meta = json.loads((ckpt / "rlcr_update.json").read_text())
    assert meta["iteration"] == 1 and meta["optimizer_steps"] == 8

    lm = load_lm(ckpt)
    ids = tiny_tokenizer("<think>", return_tensors="pt")["input_ids"]
    hf_next = int(lm(ids).logits[0, -1].argmax())

    from vllm import SamplingParams

    from rlcr.config import RLCRConfig
    from rlcr.rollout.engine import create_engine

    llm = create_engine(ckpt, RLCRConfig(model={"dtype": "float32"},
                                         engine={"max_model_len": 512, "kv_cache_gib": 0.25}), seed=0)
    try:
        out = llm.generate({"prompt_token_ids": ids[0].tolist()}, SamplingParams(temperature=0.0, max_tokens=4))
        gen = out[0].outputs[0].token_ids
        assert len(gen) >= 1 and gen[0] == hf_next  # same weights: greedy token agrees with transformers
    finally:
        del llm
        gc.collect()


# ----------------------------------------------------------------------------- one optimizer for the whole run


def _in_process_updates(model_dir, batches, tokenizer, cfg, *, continuous: bool):
    """The reference: the iterations' updates in this process, with one AdamW (``continuous``) or a fresh one each."""
    from rlcr.seeds import update_seed
    from rlcr.train.update import Schedule, make_optimizer

    lm = load_lm(model_dir)
    policy = CompletionLogProbs(lm)
    opt, sched = make_optimizer(policy, cfg), Schedule.for_run(cfg)
    for k, rows in enumerate(batches, start=1):
        train_update(policy, prepare_samples(rows, tokenizer), cfg, pad_id=tokenizer.pad_token_id,
                     seed=update_seed(cfg.run.seed, k), **(dict(optimizer=opt, schedule=sched) if continuous else {}))
    return {k: v.detach().clone() for k, v in lm.state_dict().items()}


def unpacked(weights) -> dict[str, torch.Tensor]:
    """The trainer's object-store weights as tensors (a tied parameter is sent as a reference to its twin)."""
    from rlcr.models.weights import SameAs

    out = {k: torch.tensor(v) for k, v in weights.items() if not isinstance(v, SameAs)}
    out.update({k: out[v.name] for k, v in weights.items() if isinstance(v, SameAs)})
    return out


@pytest.fixture(scope="module")
def continuous_trainer(ray_local, tiny_model_dir, tmp_path_factory):
    """Three iterations on one long-lived trainer (state saved after 2), and iteration 3 again on a trainer
    restored from that save (what a resume does)."""

    from rlcr.train.trainer import PolicyTrainer

    root = tmp_path_factory.mktemp("continuous")
    cfg = RLCRConfig(storage={"uri": str(root)}, run={"iterations": 3},
                     update={"learning_rate": 1e-3, "micro_batch_tokens": 64, "mini_batches_per_epoch": 2,
                             "lr_schedule": "cosine", "warmup_steps": 2})
    batches = [make_rows(n_prompts=2, g_a=2, g_c=2, seed=20 + k) for k in range(3)]
    with PolicyTrainer(cfg, policy_uri=str(tiny_model_dir)) as trainer:
        with open(f"/proc/{trainer.workers[0]['pid']}/environ", "rb") as f:  # the worker process's start-up env
            started_with = dict(kv.decode().split("=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        first = trainer.update(batches[0], 1)
        trainer.update(batches[1], 2)
        saved = trainer.save("runs/c/iter-0002/checkpoint")
        assert trainer.save("runs/c/iter-0002/background", background=True) is None  # written while we go on
        third = trainer.update(batches[2], 3)  # waits for the background write before it changes the state
        background = trainer.saved()
        with pytest.raises(RuntimeError, match="no background save"):
            trainer.saved()
        straight = unpacked(third.weights.resolve())
    with PolicyTrainer(cfg, policy_uri=saved, restore=True) as restored:
        again = restored.update(batches[2], 3)
        resumed = unpacked(again.weights.resolve())
        was_restored = restored.restored
    return cfg, batches, first, third, again, straight, resumed, saved, was_restored, background, started_with


def test_iterations_share_one_adamw_like_a_single_loop(continuous_trainer, tiny_model_dir, tiny_tokenizer):
    cfg, batches, first, third, _, straight, _, _, _, _, _ = continuous_trainer
    reference = _in_process_updates(tiny_model_dir, batches, tiny_tokenizer, cfg, continuous=True)
    restarted = _in_process_updates(tiny_model_dir, batches, tiny_tokenizer, cfg, continuous=False)
    w0 = load_lm(tiny_model_dir).state_dict()
    moved = max(float((reference[k] - w0[k]).abs().max()) for k in w0)
    diff = max(float((straight[k] - reference[k]).abs().max()) for k in w0)
    fresh_gap = max(float((restarted[k] - reference[k]).abs().max()) for k in w0)
    assert moved > 1e-3
    assert diff < 1e-5, diff  # three iterations on the trainer == one 6-step loop with one AdamW
    assert fresh_gap > 100 * max(diff, 1e-7), fresh_gap  # … and not what a fresh AdamW per iteration gives
    # the LR schedule runs over the run's 6 steps: warm-up 1/2, 2/2 in iteration 1, cosine decay after
    assert [h["lr"] for h in first.metrics["history"]] == pytest.approx([5e-4, 1e-3])
    assert third.metrics["schedule_step"] == 6 and third.metrics["lr_last"] < 2e-4


def test_a_trainer_restored_from_a_save_continues_exactly(continuous_trainer):
    _, _, _, third, again, straight, resumed, saved, was_restored, _, _ = continuous_trainer
    assert was_restored and (Path(saved) / "training_state.pt").exists()
    assert again.metrics["loss"] == pytest.approx(third.metrics["loss"], rel=1e-6)
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_a_background_save_writes_the_state_of_its_call(continuous_trainer):
    """Started after iteration 2, collected after iteration 3's update: it holds iteration 2's state, the
    same files as the save the flow waited for (weights byte for byte, AdamW moments, schedule, RNG)."""
    *_, saved, _, (background, write_s), _ = continuous_trainer
    assert write_s > 0 and background.endswith("runs/c/iter-0002/background")
    assert (Path(saved) / "model.safetensors").read_bytes() == (Path(background) / "model.safetensors").read_bytes()
    a, b = (torch.load(Path(d) / "training_state.pt", weights_only=False) for d in (saved, background))
    assert a["schedule"] == b["schedule"] == {"done": 4, "total": 6}
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    for i, state in a["optimizer"]["state"].items():
        for key, t in state.items():
            assert torch.equal(t, b["optimizer"]["state"][i][key]), (i, key)


def test_a_trainer_worker_keeps_its_freed_memory_for_the_next_update(continuous_trainer):
    """``placement.trainer_keeps_memory`` (on by default): each Ray Train worker process starts with glibc's
    allocator told to keep freed memory (one arena, no mmap, no trim), so an update reuses the last one's pages
    instead of faulting them in again; off, the workers start with Ray's environment alone."""
    from rlcr.runs.cluster import KEEP_MEMORY_ENV, trainer_runtime_env

    cfg, started_with = continuous_trainer[0], continuous_trainer[-1]
    assert cfg.placement.trainer_keeps_memory
    assert {k: started_with.get(k) for k in KEEP_MEMORY_ENV} == KEEP_MEMORY_ENV
    assert trainer_runtime_env(cfg.model_copy(update={"placement.trainer_keeps_memory": False})) == {}


def test_restoring_a_checkpoint_without_training_state_fails_naming_the_file(ray_local, tiny_model_dir, tmp_path):
    """A resume needs AdamW, schedule and RNG: a checkpoint without them is refused, not a silent fresh AdamW."""
    from rlcr.train.trainer import PolicyTrainer, TrainerLost

    cfg = RLCRConfig(storage={"uri": str(tmp_path / "store")})
    with pytest.raises(TrainerLost, match=f"{tiny_model_dir}: no training_state.pt to restore"):
        PolicyTrainer(cfg, policy_uri=str(tiny_model_dir), restore=True)
