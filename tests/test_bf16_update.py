"""bf16 where the CPU has it (issue 78 item 9): ``update.autocast: bfloat16`` runs the update's forward and backward
under bf16 autocast over fp32 master weights, on CPU as on a GPU, and ``model.dtype: bfloat16`` samples in bf16
(docs/update-performance.md, "bf16 on a CPU")."""

import math

import pytest
import torch

from rlcr.config import RLCRConfig
from rlcr.train.throughput import autocast_warning, cpu_has_bf16
from rlcr.train.update import _autocast, autocast_dtype


def test_the_setting_its_values_and_the_cpu_check(tmp_path):
    assert RLCRConfig().update.autocast == "auto"
    for value in ("auto", "bfloat16", "off"):
        assert RLCRConfig.from_dict({"update.autocast": value}).update.autocast == value
    with pytest.raises(ValueError, match="autocast"):
        RLCRConfig.from_dict({"update.autocast": "float16"})
    cpu = torch.device("cpu")
    with _autocast(cpu, "bfloat16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    for mode in ("auto", "off"):  # fp32 on CPU unless asked
        with _autocast(cpu, mode):
            assert not torch.is_autocast_enabled("cpu")
    assert autocast_dtype(cpu, "bfloat16") == torch.bfloat16
    assert autocast_dtype(cpu, "auto") == autocast_dtype(cpu, "off") == torch.float32
    assert autocast_dtype(torch.device("cuda"), "off") == torch.float32
    # the CPU's flags: bf16 instructions or not, unreadable = not
    with_bf16, without = tmp_path / "with", tmp_path / "without"
    with_bf16.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    assert cpu_has_bf16(str(with_bf16)) and cpu_has_bf16(str(arm)) and not cpu_has_bf16(str(without))
    assert not cpu_has_bf16(str(tmp_path / "missing"))
    bf16 = RLCRConfig.from_dict({"update.autocast": "bfloat16"})
    assert "slower than fp32" in autocast_warning(bf16, has_bf16=False)
    assert autocast_warning(bf16, has_bf16=True) is None
    assert autocast_warning(RLCRConfig(), has_bf16=False) is None  # fp32 on CPU: nothing to say
    assert autocast_warning(bf16.model_copy(update={"update.use_gpu": True}), has_bf16=False) is None


def _flat(lm):
    return torch.cat([p.detach().reshape(-1) for p in lm.parameters()])


def test_a_bf16_update_on_cpu_is_the_fp32_update_within_bf16_rounding(tiny_model_dir, tiny_tokenizer, tmp_path):
    """The same rows from the same weights, three steps: ``auto`` on CPU is fp32 bit for bit; ``bfloat16`` keeps the
    weights, gradients and AdamW moments fp32, measures the engine mismatch at bf16's size, and moves the weights the
    same way (loss and gradient norms within 5%, update direction cosine > 0.98), but not identically."""
    from rlcr.train.batching import prepare_samples
    from rlcr.train.logprobs import CompletionLogProbs
    from rlcr.train.update import make_optimizer, train_update
    from test_mismatch import _rows_with_engine_logprobs
    from test_train import cfg_for, load_lm

    _, rows = _rows_with_engine_logprobs(tiny_model_dir, 0.0)  # "engine" log-probs: the fp32 model's own
    samples = prepare_samples(rows, tiny_tokenizer)
    start = _flat(load_lm(tiny_model_dir))
    out = {}
    for mode in ("off", "auto", "bfloat16"):
        cfg = cfg_for(tmp_path, **{"update.autocast": mode, "update.mini_batches_per_epoch": 3})
        lm = load_lm(tiny_model_dir)
        opt = make_optimizer(lm, cfg)
        m = train_update(CompletionLogProbs(lm), samples, cfg, pad_id=tiny_tokenizer.pad_token_id, optimizer=opt)
        assert all(p.dtype == torch.float32 and bool(torch.isfinite(p).all()) for p in lm.parameters()), mode
        assert all(v.dtype == torch.float32 for s in opt.state.values() for v in s.values() if v.is_floating_point())
        out[mode] = (m, _flat(lm) - start)
    (off, d_off), (auto, d_auto), (bf16, d_bf16) = out["off"], out["auto"], out["bfloat16"]
    assert torch.equal(d_off, d_auto) and off["loss"] == auto["loss"]
    assert off["mismatch/mean_abs"] < 1e-5 < bf16["mismatch/mean_abs"] < 0.05  # the pre-pass ran in bf16
    assert bf16["optimizer_steps"] == off["optimizer_steps"] == 3
    assert math.isclose(bf16["loss"], off["loss"], rel_tol=0.05, abs_tol=1e-3)
    assert math.isclose(bf16["grad_norm"], off["grad_norm"], rel_tol=0.05)
    assert not torch.equal(d_bf16, d_off)
    assert float(torch.nn.functional.cosine_similarity(d_bf16, d_off, dim=0)) > 0.98


def test_tree_attention_in_bf16_on_cpu_runs_in_fp32(tiny_model_dir, tiny_tokenizer, monkeypatch):
    """Under CPU bf16 autocast the prefix-tree attention's SDPA gets fp32 queries, keys and values with autocast off
    (else it would cast them back to bf16) and returns bf16, the layer's dtype; the tree's log-probs stay within bf16
    rounding of fp32's, forward and backward."""
    from rlcr.train.batching import collate_prefix_tree, pack_prefix_trees, prepare_samples
    from rlcr.train.logprobs import CompletionLogProbs
    from test_train import load_lm, make_rows

    samples = prepare_samples(make_rows(n_prompts=2, g_a=3, g_c=2), tiny_tokenizer)
    (tree,) = pack_prefix_trees(samples, 10_000)
    mb = collate_prefix_tree(tree, tiny_tokenizer.pad_token_id)
    policy = CompletionLogProbs(load_lm(tiny_model_dir))
    sdpa, calls = torch.nn.functional.scaled_dot_product_attention, []

    def recording(q, k, v, *args, **kwargs):
        out = sdpa(q, k, v, *args, **kwargs)
        calls.append((q.dtype, k.dtype, v.dtype, torch.is_autocast_enabled("cpu"), out.dtype))
        return out
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    got = {}
    for mode in ("off", "bfloat16"):
        policy.zero_grad(set_to_none=True)
        with _autocast(torch.device("cpu"), mode):
            logp, _ = policy(**mb.model_inputs())
        logp.sum().backward()
        got[mode] = (logp.detach().float(), torch.cat([p.grad.reshape(-1) for p in policy.parameters()]))
    (lp32, g32), (lp16, g16) = got["off"], got["bfloat16"]
    assert calls and set(calls) == {(torch.float32,) * 3 + (False, torch.float32)}  # both modes: fp32, autocast off
    assert not torch.equal(lp32, lp16)
    torch.testing.assert_close(lp16, lp32, rtol=0, atol=0.1)
    assert float(torch.nn.functional.cosine_similarity(g16, g32, dim=0)) > 0.99


def test_a_run_with_bf16_engines_and_a_bf16_update_on_cpu(ray_local, prefect_harness, tmp_path):
    """The tiny flow, one iteration, with ``model.dtype: bfloat16`` (vLLM samples in bf16 on CPU) and
    ``update.autocast: bfloat16``: the weights synced into the engines are bf16, the measured engine–trainer
    mismatch is bf16's (~1e-3 nats, not fp32's ~1e-7), and the checkpoint keeps fp32 weights."""
    import json
    from pathlib import Path

    from flows.train import rlcr_train
    from rlcr.config import load_config
    from rlcr.runs.store import RunStore

    overrides = [f"storage.uri={tmp_path / 'store'}", "model.dtype=bfloat16", "update.autocast=bfloat16",
                 "eval.every=0"]
    assert rlcr_train(config="configs/tiny.yaml", overrides=overrides, run_id="bf16", iterations=1)["iterations"] == [1]
    run = RunStore.open(load_config("configs/tiny.yaml", overrides), "bf16")
    (manifest,) = run.committed()
    update = run.metrics(1)["update"]
    assert update["optimizer_steps"] >= 1 and math.isfinite(update["loss"])
    assert 1e-5 < update["mismatch/mean_abs"] < 0.05
    config = json.loads((Path(manifest["checkpoint_uri"]) / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
