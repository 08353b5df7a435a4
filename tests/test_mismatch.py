"""The engine–trainer log-prob mismatch (issue 49 item 1) and the behaviour-policy correction, truncated
importance sampling and sequence masking (item 2): docs/design.md §8, §11."""

import math
import os

import numpy as np
import pytest
import torch

from rlcr.config import RLCRConfig
from rlcr.core.loss import importance_weights, policy_loss, sequence_band_mask, truncated_is_weights
from rlcr.train.batching import Sample, collate
from rlcr.train.mismatch import BAND, WARN_MEAN_ABS, MismatchStats, mismatch_warning
from rlcr.train.objectives import LossInputs, get_objective


def _random_batch(seed, b=6, t=9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    behaviour = old + torch.randn(b, t, generator=g) * 0.6
    logp = old + torch.randn(b, t, generator=g) * 0.3
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[0] = 0.0  # a row without masked tokens
    adv = torch.randn(b, generator=g)
    return logp, old, behaviour, mask, adv


# ----------------------------------------------------------------------------- item 2: the formulas


def _reference_weights(old, behaviour, mask, cap, band):
    """An independent implementation: plain loops over numpy arrays (docs/design.md §8)."""
    old, mu, m = old.double().numpy(), behaviour.double().numpy(), mask.numpy()
    w = np.ones_like(old)
    capped = masked = 0
    for i in range(old.shape[0]):
        diffs = [old[i, t] - mu[i, t] for t in range(old.shape[1]) if m[i, t] > 0]
        keep = True
        if band is not None and diffs:
            r = math.exp(sum(diffs) / len(diffs))  # geometric mean of the token ratios
            keep = band[0] <= r <= band[1]
            masked += not keep
        for t in range(old.shape[1]):
            if m[i, t] == 0:
                continue
            ratio = math.exp(old[i, t] - mu[i, t])
            if cap is not None:
                capped += ratio > cap
                ratio = min(ratio, cap)
            else:
                ratio = 1.0
            w[i, t] = ratio * keep
    return w, capped, masked


def _reference_loss(logp, old, adv, mask, w, clip=0.2, c=3.0):
    """The dual-clip loss with weights, token-mean, one token at a time."""
    total, n = 0.0, 0
    for i in range(logp.shape[0]):
        a = float(adv[i])
        for t in range(logp.shape[1]):
            if mask[i, t] == 0:
                continue
            r = math.exp(float(logp[i, t]) - float(old[i, t]))
            pg = max(-a * r, -a * min(max(r, 1 - clip), 1 + clip))
            if a < 0:
                pg = min(pg, -a * c)
            total += w[i, t] * pg
            n += 1
    return total / max(n, 1)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cap,band", [(2.0, None), (None, (0.7, 1.3)), (1.5, (0.8, 1.25)), (1.0, (1.0, 1.0))])
def test_correction_matches_an_independent_implementation(seed, cap, band):
    logp, old, behaviour, mask, adv = _random_batch(seed)
    w, stats = importance_weights(old, behaviour, mask, tis_cap=cap, seq_band=band)
    ref_w, capped, masked = _reference_weights(old, behaviour, mask, cap, band)
    np.testing.assert_allclose((w * mask).double().numpy(), ref_w * mask.numpy(), rtol=1e-5, atol=1e-7)
    assert stats["is/capped"] == capped and stats["is/masked_sequences"] == masked
    assert stats["is/weight_sum"] == pytest.approx(float((ref_w * mask.numpy()).sum()), rel=1e-5)
    loss, _ = policy_loss(logp, old, adv, mask, is_weights=w)
    assert loss.item() == pytest.approx(_reference_loss(logp, old, adv, mask, ref_w), rel=1e-5, abs=1e-7)
    if band is not None and cap is not None:
        assert masked > 0 or capped > 0  # the random data exercises the correction


def test_weights_carry_no_gradient_and_an_exact_match_weighs_one():
    logp, old, behaviour, mask, adv = _random_batch(7)
    old.requires_grad_(True)
    w = truncated_is_weights(old, behaviour, mask, cap=2.0)
    assert not w.requires_grad
    same = truncated_is_weights(old, old, mask, cap=1.0)
    assert torch.equal(same, torch.ones_like(same))
    assert torch.equal(sequence_band_mask(old, old, mask, (1.0, 1.0)), torch.ones(old.shape[0]))
    with pytest.raises(ValueError, match="tis_cap"):
        truncated_is_weights(old, behaviour, mask, cap=0.5)
    with pytest.raises(ValueError, match="seq_mask_band"):
        sequence_band_mask(old, behaviour, mask, (1.2, 2.0))


# the loss of main's policy_loss (before the correction existed) on _random_batch(11), all options on, as
# float.hex: the default (no correction) must stay bit-identical
_MAIN_LOSS = {"token-mean": "-0x1.65b0d00000000p-2", "seq-mean-token-mean": "-0x1.4abdb00000000p-2"}


@pytest.mark.parametrize("agg", sorted(_MAIN_LOSS))
def test_default_off_leaves_the_loss_bit_identical(agg):
    logp, old, behaviour, mask, adv = _random_batch(11)
    ref = old - 0.1
    ent = -logp
    kw = dict(agg=agg, ref_logp=ref, kl_coef=0.05, entropy=ent, entropy_coef=0.01,
              is_confidence=torch.tensor([False, True] * 3), clip_high=0.28)
    plain, m_plain = policy_loss(logp, old, adv, mask, **kw)
    assert plain.item().hex() == _MAIN_LOSS[agg]
    ones, m_ones = policy_loss(logp, old, adv, mask, is_weights=torch.ones_like(logp), **kw)
    assert torch.equal(plain, ones) and m_plain == m_ones  # × 1.0 is exact

    # through the grpo objective: the default config adds no weights and no is/ metrics
    samples = [Sample(index=i, context_ids=[1, 2], completion_ids=list(range(3, 12)), loss_mask=mask[i].int().tolist(),
                      advantage=float(adv[i]), is_confidence=bool(i % 2), rollout_logprobs=behaviour[i].tolist())
               for i in range(6)]
    mb = collate(samples, pad_id=0)
    inputs = LossInputs(logp=logp, entropy=None, mb=mb, old_logp=old, ref_logp=None, global_tokens=float(mask.sum()),
                        global_sequences=6, max_response_len=None)
    cfg = RLCRConfig()
    loss, metrics = get_objective("grpo").loss(inputs, cfg)
    direct, _ = policy_loss(logp, old * mask, mb.advantages, mask, agg=cfg.loss.agg, is_confidence=mb.is_confidence,
                            global_tokens=float(mask.sum()), global_sequences=6,
                            clip_c=cfg.loss.clip_c, clip_low=cfg.loss.clip_low, clip_high=cfg.loss.clip_high)
    assert torch.equal(loss, direct) and not any(k.startswith("is/") for k in metrics)
    on = RLCRConfig.from_dict({"loss": {"tis_cap": 2.0, "seq_mask_band": [0.5, 2.0]}})
    loss_on, metrics_on = get_objective("grpo").loss(inputs, on)
    assert not torch.equal(loss, loss_on) and metrics_on["is/capped"] > 0


def test_config_fields_are_checked_and_marked_as_changing_results():
    from rlcr.config.fields import changes_results

    for bad, match in (({"loss": {"tis_cap": 0.9}}, "tis_cap"),
                       ({"loss": {"seq_mask_band": [1.5, 2.0]}}, "seq_mask_band"),
                       ({"loss": {"tis_cap": 2.0}, "update": {"old_logp_source": "rollout"}}, "old_logp_source")):
        with pytest.raises(ValueError, match=match):
            RLCRConfig.from_dict(bad)
    fields = dict(RLCRConfig.dotted_fields())
    assert changes_results(fields["loss.tis_cap"]) and changes_results(fields["loss.seq_mask_band"])
    assert RLCRConfig().loss.tis_cap is None and RLCRConfig().loss.seq_mask_band is None


# ----------------------------------------------------------------------------- item 1: the mismatch's figures


def _synthetic(seed):
    """Samples with engine log-probs and the trainer's, of uneven lengths and masks."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(9):
        n = 3 + i % 4
        mask = (torch.rand(n, generator=g) > 0.25).int().tolist()
        trainer = -torch.rand(n, generator=g) * 2
        engine = trainer + torch.randn(n, generator=g) * (0.9 if i % 3 == 0 else 0.05)
        out.append((Sample(index=i, context_ids=[1], completion_ids=[5] * n, loss_mask=mask, advantage=0.0,
                           is_confidence=i % 2 == 1, rollout_logprobs=engine.tolist()), trainer))
    out.append((Sample(index=9, context_ids=[1], completion_ids=[5], loss_mask=[1], advantage=0.0), torch.zeros(1)))
    return out  # the last one has no engine log-probs: left out


def _expected(pairs):
    per = {"answer": [], "confidence": []}
    for s, trainer in pairs:
        if s.rollout_logprobs is None:
            continue
        for t, m in enumerate(s.loss_mask):
            if m:
                per["confidence" if s.is_confidence else "answer"].append(float(trainer[t]) - s.rollout_logprobs[t])
    per[""] = per["answer"] + per["confidence"]
    out = {}
    for t, d in per.items():
        p = f"mismatch/{t}/" if t else "mismatch/"
        out.update({p + "mean_abs": sum(map(abs, d)) / len(d), p + "max_abs": max(map(abs, d)), p + "tokens": len(d),
                    p + "out_of_band": sum(1 for x in d if not BAND[0] <= math.exp(x) <= BAND[1]) / len(d)})
    return out


def _local_reduce(values, device, op="sum"):
    return values


def test_mismatch_figures_per_turn_respect_the_masks():
    pairs = _synthetic(0)
    stats = MismatchStats()
    for s, trainer in pairs:
        # the trainer's log-probs come padded and with junk where the mask is 0: neither may count
        padded = torch.cat([torch.where(torch.tensor(s.loss_mask, dtype=torch.bool), trainer, torch.tensor(99.0)),
                            torch.full((3,), -50.0)])
        stats.add(padded, s.rollout_logprobs, s.loss_mask, s.is_confidence)
    got, want = stats.reduce(_local_reduce, "cpu"), _expected(pairs)
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6), key
    assert 0 < got["mismatch/out_of_band"] < 1 and got["mismatch/answer/tokens"] > 0
    assert MismatchStats().reduce(_local_reduce, "cpu") == {"mismatch/tokens": 0.0}


def _two_ranks(rank, port, out_dir):
    import torch.distributed as dist

    from rlcr.train.update import _reduce

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        stats = MismatchStats()
        for s, trainer in _synthetic(0)[rank::2]:
            stats.add(trainer, s.rollout_logprobs, s.loss_mask, s.is_confidence)
        got = stats.reduce(_reduce, torch.device("cpu"))
        torch.save(got, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_mismatch_is_all_reduced_over_ranks(tmp_path):
    """Two gloo ranks, each with half of the samples, report the figures of all of them."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_two_ranks, args=(port, str(tmp_path)), nprocs=2, join=True)
    want = _expected(_synthetic(0))
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert set(got) == set(want)
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-6), (rank, key)


def test_warning_past_the_threshold_and_the_progress_line():
    from rlcr.ui.presentation import progress_line

    quiet = {"mismatch/mean_abs": WARN_MEAN_ABS / 2, "mismatch/answer/mean_abs": 0.004}
    assert mismatch_warning(quiet) is None and mismatch_warning({}) is None
    loud = {"mismatch/mean_abs": 0.05, "mismatch/answer/mean_abs": 0.06, "mismatch/confidence/mean_abs": 0.02,
            "mismatch/max_abs": 1.5}
    line = mismatch_warning(loud)
    assert line and "\n" not in line and "0.05" in line and "answer 0.06" in line and "0.01" in line
    ev = {"accuracy": 0.25, "ece": 0.125}
    assert "logπ mismatch 0.004" in progress_line({"eval": ev, "rollout": {}, "update": quiet})
    assert "mismatch" not in progress_line({"eval": ev, "rollout": {}, "update": {}})


# ----------------------------------------------------------------------------- in an update (the tiny model)


def _rows_with_engine_logprobs(tiny_model_dir, shift_confidence):
    """The synthetic rollout tree of test_train with "engine" log-probs: the trainer's own (a plain full forward)
    for answers, shifted by ``-shift_confidence`` nats for confidences (Δ = log π_trainer − log μ = +shift)."""
    from rlcr.core.loss import token_logprobs
    from test_train import load_lm, make_rows

    lm = load_lm(tiny_model_dir)
    rows = make_rows(n_prompts=2, g_a=2, g_c=2)
    for r in rows:
        ids = torch.tensor([r["context_ids"] + r["completion_ids"]])
        with torch.no_grad():
            logits = lm(ids).logits[0, len(r["context_ids"]) - 1:-1]
        lp = token_logprobs(logits, torch.tensor(r["completion_ids"]))[0]
        r["completion_logprobs"] = (lp - (shift_confidence if r["sample_type"] == "confidence" else 0.0)).tolist()
    return lm, rows


def test_an_update_reports_the_mismatch_on_every_path(tiny_model_dir, tiny_tokenizer, tmp_path):
    """One on-policy step (measured in the step), several steps (measured in the pre-pass) and ``rollout`` π_old
    (measured on the first mini-batch): the figures per turn, with the masks respected."""
    from rlcr.train.batching import prepare_samples
    from rlcr.train.logprobs import CompletionLogProbs
    from rlcr.train.update import train_update
    from test_train import cfg_for, load_lm

    _, rows = _rows_with_engine_logprobs(tiny_model_dir, 0.8)
    samples = prepare_samples(rows, tiny_tokenizer)
    tokens = {t: sum(s.masked_tokens for s in samples if s.is_confidence == (t == "confidence"))
              for t in ("answer", "confidence")}
    paths = {"one step": {}, "pre-pass": {"update.mini_batches_per_epoch": 2, "update.epochs_per_iteration": 2},
             "rollout": {"update.mini_batches_per_epoch": 2, "update.old_logp_source": "rollout"}}
    for name, kw in paths.items():
        m = train_update(CompletionLogProbs(load_lm(tiny_model_dir)), samples, cfg_for(tmp_path, **kw),
                         pad_id=tiny_tokenizer.pad_token_id)
        assert m["mismatch/answer/mean_abs"] < 1e-4 and m["mismatch/answer/out_of_band"] == 0.0, name
        assert m["mismatch/confidence/mean_abs"] == pytest.approx(0.8, abs=1e-4), name
        assert m["mismatch/confidence/max_abs"] == pytest.approx(0.8, abs=1e-4), name
        assert m["mismatch/confidence/out_of_band"] == 1.0 and m["mismatch/max_abs"] == m["mismatch/confidence/max_abs"]
        if name == "rollout":  # the first mini-batch's tokens, at no extra forward
            assert 0 < m["mismatch/tokens"] < sum(tokens.values())
        else:
            assert {t: m[f"mismatch/{t}/tokens"] for t in tokens} == tokens, name
        assert not any(k.startswith("is/") for k in m), name


def test_the_correction_caps_and_masks_in_an_update(tiny_model_dir, tiny_tokenizer, tmp_path):
    """Confidence tokens 0.8 nats more likely under π_old than under μ: ratio e^0.8 ≈ 2.2 > C = 2 caps every one
    of them, and their geometric mean leaves [0.5, 2] (masked); answers (ratio 1) are untouched."""
    from rlcr.train.batching import prepare_samples
    from rlcr.train.logprobs import CompletionLogProbs
    from rlcr.train.update import train_update
    from test_train import cfg_for, load_lm

    _, rows = _rows_with_engine_logprobs(tiny_model_dir, 0.8)
    samples = prepare_samples(rows, tiny_tokenizer)
    conf_tokens = sum(s.masked_tokens for s in samples if s.is_confidence)
    all_tokens = sum(s.masked_tokens for s in samples)
    results = {}
    for name, kw in (("off", {}), ("tis", {"loss.tis_cap": 2.0}),
                     ("both", {"loss.tis_cap": 2.0, "loss.seq_mask_band": [0.5, 2.0]})):
        results[name] = train_update(CompletionLogProbs(load_lm(tiny_model_dir)), samples, cfg_for(tmp_path, **kw),
                                     pad_id=tiny_tokenizer.pad_token_id)
    tis, both = results["tis"], results["both"]
    assert tis["is/capped"] == pytest.approx(conf_tokens / all_tokens) and tis["is/masked_samples"] == 0.0
    assert tis["is/weight_mean"] == pytest.approx(((all_tokens - conf_tokens) + 2.0 * conf_tokens) / all_tokens,
                                                  rel=1e-5)
    assert both["is/masked_samples"] == pytest.approx(sum(s.is_confidence for s in samples) / len(samples))
    assert both["is/weight_mean"] == pytest.approx((all_tokens - conf_tokens) / all_tokens, rel=1e-5)
    # confidences masked: the answer part alone is the loss; capped: the confidence part counts twice
    assert both["answer/pg_loss"] == pytest.approx(results["off"]["answer/pg_loss"], rel=1e-5)
    assert both["confidence/pg_loss"] == 0.0 != results["off"]["confidence/pg_loss"]
    assert tis["confidence/pg_loss"] == pytest.approx(2.0 * results["off"]["confidence/pg_loss"], rel=1e-4)
    rows[0]["completion_logprobs"] = None
    with pytest.raises(ValueError, match="completion_logprobs"):
        train_update(CompletionLogProbs(load_lm(tiny_model_dir)), prepare_samples(rows, tiny_tokenizer),
                     cfg_for(tmp_path, **{"loss.tis_cap": 2.0}), pad_id=tiny_tokenizer.pad_token_id)


@pytest.mark.slow
def test_a_real_engine_and_the_trainer_agree(tiny_model_dir, tiny_tokenizer, tmp_path):
    """Real vLLM (CPU, float32) samples answers and confidences at temperature 0.7 and records its log-probs;
    the update's mismatch figures are finite and tiny: the engine's log-probs are the untempered model's, the
    distribution the trainer computes (log-probs of the tempered distribution would differ by far more)."""
    import gc

    from rlcr.models.chat import render_prompt
    from rlcr.rollout.engine import create_engine
    from rlcr.rollout.sampling import sample
    from rlcr.tasks.countdown import generate_tasks, turn1_messages
    from rlcr.train.batching import prepare_samples
    from rlcr.train.logprobs import CompletionLogProbs
    from rlcr.train.update import train_update
    from test_rollout import tiny_cfg
    from test_train import cfg_for, load_lm

    llm = create_engine(tiny_model_dir, tiny_cfg(tiny_model_dir, "unused"), seed=5)
    prompts = [render_prompt(tiny_tokenizer, turn1_messages(t))[1] for t in generate_tasks(4, seed=2)]
    kw = dict(temperature=0.7, top_p=1.0)
    answers = sample(llm, prompts, n=2, max_tokens=24, seeds=[[10 * i, 10 * i + 1] for i in range(4)], **kw)
    suffix = tiny_tokenizer.encode("\nConfidence:", add_special_tokens=False)
    contexts = [(p, i, a, list(p) + s.completion_ids + suffix)
                for i, (p, outs) in enumerate(zip(prompts, answers)) for a, s in enumerate(outs)]
    confs = sample(llm, [c for *_, c in contexts], n=1, max_tokens=8, seeds=[[100 + j] for j in range(len(contexts))],
                   **kw)
    rows = []
    for (p, i, a, ctx), (conf,) in zip(contexts, confs):
        ans = answers[i][a]
        for st, context, s, h in (("answer", p, ans, None), ("confidence", ctx, conf, 0)):
            if st == "answer" or s.completion_ids:
                rows.append(dict(iteration=0, prompt_id=i, answer_id=a, confidence_id=h, sample_type=st,
                                 context_ids=list(context), completion_ids=s.completion_ids, completion_text="",
                                 completion_logprobs=s.completion_logprobs, loss_mask=[1] * len(s.completion_ids),
                                 advantage=1.0 if a else -1.0))
    del llm
    gc.collect()  # now: a dead engine collected later tears down vLLM's process-wide groups under another test's
    m = train_update(CompletionLogProbs(load_lm(tiny_model_dir)), prepare_samples(rows, tiny_tokenizer),
                     cfg_for(tmp_path, **{"update.mini_batches_per_epoch": 2}), pad_id=tiny_tokenizer.pad_token_id)
    assert m["mismatch/tokens"] == sum(len(r["completion_ids"]) for r in rows)
    for t in ("answer", "confidence"):
        assert m[f"mismatch/{t}/tokens"] > 0
        assert 0 <= m[f"mismatch/{t}/mean_abs"] < 1e-3 and m[f"mismatch/{t}/max_abs"] < 1e-2, m
        assert m[f"mismatch/{t}/out_of_band"] == 0.0
    assert mismatch_warning(m) is None
