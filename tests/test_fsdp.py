"""FSDP2 in the Ray Train workers (rlcr/train/fsdp.py, docs/design.md §11, issue 78): the same update as DDP, on CPU.

Two real gloo workers each way, on the same rows, through :class:`rlcr.train.trainer.PolicyTrainer` (the flow's own
path: shard, update, weight sync, save, restore). The Ray starts are shared between the assertions (one start
≈ 10–15 s on the 2-core machine): DDP and FSDP with the KL reference off and on; FSDP's checkpoint resumed by a
fresh FSDP trainer; FSDP with the bf16 mixed-precision policy.
"""

import json

import pytest
import torch

from rlcr.config import RLCRConfig
from rlcr.train.sharded_state import read_optimizer_shards
from test_train import load_lm, make_rows, unpacked

FLOAT_RTOL = 1e-4
"""The update's loss and gradient norm across reduction orders (docs/reproducibility.md)."""
DELTA_RTOL = 0.05
"""The weights after an update: each tensor's change within 5% of its norm (docs/reproducibility.md)."""


# ----------------------------------------------------------------------------- the config (no Ray)


def test_fsdp_needs_no_gpu_and_refuses_lora_and_stray_precision_in_one_line():
    cfg = RLCRConfig.from_dict({"update.fsdp": True, "update.num_workers": 2})
    assert cfg.update.fsdp and not cfg.update.use_gpu and cfg.update.fsdp_param_dtype == "float32"
    assert RLCRConfig.from_dict({"update.fsdp": True, "update.fsdp_param_dtype": "bfloat16"}).update.fsdp
    for bad, says in (({"update.fsdp": True, "lora.enabled": True}, "lora.enabled with update.fsdp: not supported"),
                      ({"update.fsdp_param_dtype": "bfloat16"}, "needs update.fsdp")):
        with pytest.raises(ValueError, match=says) as e:
            RLCRConfig.from_dict(bad)
        assert "\n" not in str(e.value)


def test_the_decoder_layers_are_found_or_their_absence_named(tiny_model_dir):
    from rlcr.train.fsdp import decoder_layers

    lm = load_lm(tiny_model_dir)
    assert decoder_layers(lm) is lm.model.layers and len(lm.model.layers) == 2
    with pytest.raises(ValueError, match=r"update.fsdp: no decoder layers found in Linear \(looked for"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_adamw_state_converts_between_ddp_positions_and_fsdp_names(tiny_model_dir):
    """DDP saves AdamW's state by position, FSDP (torch.distributed.checkpoint) by name: each converts into the
    other exactly, so either resumes the other's checkpoint."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from rlcr.train.fsdp import optimizer_state_by_index, optimizer_state_by_name
    from rlcr.train.logprobs import CompletionLogProbs
    from rlcr.train.update import make_optimizer

    policy = CompletionLogProbs(load_lm(tiny_model_dir))
    opt = make_optimizer(policy, RLCRConfig())
    for p in policy.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    by_name = get_optimizer_state_dict(policy, opt, options=StateDictOptions(full_state_dict=True))
    converted = optimizer_state_by_name(opt.state_dict(), names)
    assert converted["param_groups"] == by_name["param_groups"] and converted["state"].keys() == by_name["state"].keys()
    for name, state in by_name["state"].items():
        for key, t in state.items():
            assert torch.equal(converted["state"][name][key], t), (name, key)
    back = optimizer_state_by_index(by_name, names)
    assert back["param_groups"] == opt.state_dict()["param_groups"]
    with pytest.raises(ValueError, match="holds 20 parameters, the model 19"):
        optimizer_state_by_name(opt.state_dict(), names[:-1])


# ----------------------------------------------------------------------------- Ray Train: DDP vs FSDP


def _cfg(root, kl_coef=0.0, engine=None, storage=None, **update):
    return RLCRConfig(storage=storage or {"uri": str(root)}, run={"iterations": 2}, engine=engine or {},
                      update={"num_workers": 2, "learning_rate": 1e-3, "micro_batch_tokens": 64,
                              "mini_batches_per_epoch": 8, **update},
                      loss={"kl_coef": kl_coef, "kl_type": "k3"})


@pytest.fixture(scope="module")
def fsdp_runs(ray_local, s3_server, tiny_model_dir, tmp_path_factory):
    """Four trainer starts, of two workers each but ``ddp_kl`` (≈ 20–25 s a start on the 2-core machine), on the
    same rows (iteration 1: 14 rows in 8 mini-batches of 1–2 rows, some leaving a rank no rows, in uneven micro-batches;
    iteration 2: 12 others):

    * ``ddp``, ``fsdp``: iteration 1 from the tiny model, β = 0; FSDP then saves the training state (after a
      save refused by its fence, a lease that is not there);
    * ``ddp_kl`` (one worker), ``fsdp_kl``: both resumed from that two-worker FSDP save (DDP reading FSDP's AdamW
      state: N → M workers), iteration 2 with
      β = 0.5 (k3) against the tiny model (the reference sharded too under FSDP); ``fsdp_kl``, its store on S3
      (the moto server), first writes the restored state straight back, each rank uploading its own shard."""

    from rlcr.runs.store import LeaseLost
    from rlcr.storage import fetch_checkpoint
    from rlcr.train.trainer import PolicyTrainer
    from s3server import BUCKET

    batches = [make_rows(n_prompts=2, g_a=2, g_c=3, seed=3)[:14], make_rows(n_prompts=2, g_a=2, g_c=2, seed=4)]
    model, out = str(tiny_model_dir), {}

    def run(name, cfg, *, policy_uri=model, restore=False, save=None, resave=None):
        with PolicyTrainer(cfg, policy_uri=policy_uri, restore=restore, ref_uri=model) as trainer:
            res = {"restored": trainer.restored}
            if resave:  # the restored state written straight back, before any update
                res["resaved"] = trainer.save(resave)
                res["resaved_local"] = fetch_checkpoint(res["resaved"], endpoint_url=cfg.storage.s3_endpoint_url)
            if save:  # a writer whose lease is gone: refused before anything is published
                fence = {"lease_rel": "runs/f/lease.json", "token": "gone", "manifest_rel": "runs/f/m.json"}
                with pytest.raises(LeaseLost, match="taken over") as lost:
                    trainer.save(save + "-fenced", fence=fence)
                res["fenced"] = str(lost.value)
            k = 2 if restore else 1
            u = trainer.update(batches[k - 1], k)
            packed = u.weights.resolve()  # what the engines load (rlcr.models.weights.WeightBuckets)
            res["update"] = (u.metrics, unpacked(packed))
            res["packed"] = {k: type(v).__name__ for k, v in packed.items()}
            if save:
                res["saved"] = trainer.save(save)
        out[name] = res

    root = tmp_path_factory.mktemp("fsdp")
    run("ddp", _cfg(root))
    # FSDP's weight sync in buckets of ~100 KB: each weight gathered from its shards as it goes (the tiny model: 1.4 MB)
    run("fsdp", _cfg(root, fsdp=True, engine={"sync_bucket_mib": 0.1}), save="runs/f/iter-0001/checkpoint")
    saved = out["fsdp"]["saved"]
    run("ddp_kl", _cfg(root, kl_coef=0.5, num_workers=1), policy_uri=saved, restore=True)  # 2 workers' state on 1
    s3 = {"uri": f"s3://{BUCKET}/fsdp-{root.name}", "s3_endpoint_url": s3_server.endpoint}
    run("fsdp_kl", _cfg(root, kl_coef=0.5, fsdp=True, storage=s3), policy_uri=saved, restore=True,
        resave="runs/f/iter-0001/again")
    return out


def _assert_same_update(a, b, w0):
    """Two updates of the same rows from the same state: loss and every step's gradient norm within FLOAT_RTOL,
    each tensor's change within DELTA_RTOL of its norm."""
    (ma, wa), (mb, wb) = a, b
    assert ma["optimizer_steps"] == mb["optimizer_steps"] == 8 and mb["skipped_steps"] == 0
    assert mb["world_size"] == 2 and ma["schedule_step"] == mb["schedule_step"]
    assert mb["loss"] == pytest.approx(ma["loss"], rel=FLOAT_RTOL)
    for ha, hb in zip(ma["history"], mb["history"]):
        assert hb["grad_norm"] == pytest.approx(ha["grad_norm"], rel=FLOAT_RTOL), (ha, hb)
        assert hb["lr"] == ha["lr"] and hb["global_tokens"] == ha["global_tokens"]
    assert wa.keys() == wb.keys() == w0.keys()
    moved = 0.0
    for k in w0:
        da, db = (wa[k] - w0[k]).double(), (wb[k] - w0[k]).double()
        assert float((da - db).norm()) <= DELTA_RTOL * max(float(da.norm()), 1e-12), k
        moved = max(moved, float(da.abs().max()))
    assert moved > 1e-3  # eight AdamW steps of lr 1e-3 did move the weights


def test_fsdp_and_ddp_give_the_same_update(fsdp_runs, tiny_model_dir):
    ddp, fsdp = fsdp_runs["ddp"]["update"], fsdp_runs["fsdp"]["update"]
    _assert_same_update(ddp, fsdp, load_lm(tiny_model_dir).state_dict())
    assert any(h["global_sequences"] == 1 for h in fsdp[0]["history"])  # a rank had no rows in a mini-batch
    # the engines get the gathered weights packed as under DDP (the tied head as a reference to the embedding),
    # from FSDP a bucket at a time: rank 0 never held more than a bucket of ~100 KB and one layer (0.6 MB)
    assert fsdp_runs["fsdp"]["packed"] == fsdp_runs["ddp"]["packed"]
    assert ddp[0]["weights_buckets"] == 1 and fsdp[0]["weights_buckets"] >= 3
    layer = max(sum(p.numel() * 4 for p in m.parameters()) for m in load_lm(tiny_model_dir).model.layers)
    assert fsdp[0]["weights_bytes"] == ddp[0]["weights_bytes"] == ddp[0]["weights_bucket_max_bytes"]
    assert fsdp[0]["weights_bucket_max_bytes"] <= 0.1 * 2 ** 20 + layer < fsdp[0]["weights_bytes"]
    assert fsdp_runs["fsdp"]["packed"]["lm_head.weight"] == "SameAs"
    assert all(h["grad_norm"] > 1.0 for h in fsdp[0]["history"])  # every step clipped (at 1): the same global norm


def test_fsdp_and_ddp_give_the_same_update_with_the_kl_reference(fsdp_runs, tiny_model_dir):
    """β > 0 from the state two FSDP workers saved, resumed by two FSDP workers and by one DDP worker (AdamW's
    moments by name become by position; the update does not depend on the number of workers)."""
    ddp, fsdp = fsdp_runs["ddp_kl"], fsdp_runs["fsdp_kl"]
    assert ddp["restored"] and fsdp["restored"]
    _assert_same_update(ddp["update"], fsdp["update"], fsdp_runs["fsdp"]["update"][1])
    kl_ddp, kl_fsdp = ([h["ref_kl"] for h in r["update"][0]["history"]] for r in (ddp, fsdp))
    assert 0.0 < kl_fsdp[0] < kl_fsdp[-1]  # π_ref is the tiny model, one iteration behind, and left further
    assert kl_fsdp == pytest.approx(kl_ddp, rel=1e-3)


def test_an_fsdp_checkpoint_is_a_transformers_model_and_resumes_with_its_adamw_state(fsdp_runs, tiny_tokenizer):
    from pathlib import Path

    from rlcr.storage import COMPLETE_MARKER

    fsdp, resumed = fsdp_runs["fsdp"], fsdp_runs["fsdp_kl"]
    ckpt = Path(fsdp["saved"])
    assert {COMPLETE_MARKER, "config.json", "model.safetensors", "tokenizer.json", "training_state.pt"} <= {
        p.name for p in ckpt.iterdir()}
    lm = load_lm(ckpt)  # an ordinary Hugging Face directory: the gathered full weights, the embedding tied
    for k, v in lm.state_dict().items():
        assert torch.equal(v, fsdp["update"][1][k]), k  # the weights the engines got after iteration 1
    assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()
    ids = tiny_tokenizer("<think>", return_tensors="pt")["input_ids"]
    assert torch.isfinite(lm(ids).logits).all()

    # AdamW's state by shard (torch.distributed.checkpoint): each rank wrote its own file, about half, sealed with
    # the weights; never gathered whole
    sealed = json.loads((ckpt / COMPLETE_MARKER).read_text())["files"]
    shards = {n: size for n, size in sealed.items() if n.startswith("optimizer/")}
    assert set(shards) == {"optimizer/.metadata", "optimizer/__0_0.distcp", "optimizer/__1_0.distcp"}
    moments = sum(p.numel() * 4 * 2 for p in lm.parameters())  # exp_avg and exp_avg_sq in fp32
    assert shards["optimizer/__0_0.distcp"] + shards["optimizer/__1_0.distcp"] >= moments
    assert max(shards["optimizer/__0_0.distcp"], shards["optimizer/__1_0.distcp"]) < 0.6 * moments

    # the training state: the schedule, the RNG and where AdamW is; restored by two FSDP workers (and, in
    # test_fsdp_and_ddp_give_the_same_update_with_the_kl_reference, by one DDP worker), written back unchanged
    assert resumed["restored"]
    assert fsdp["fenced"] and resumed["resaved"].startswith("s3://")
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint"]  # the fenced save left nothing
    again = resumed["resaved_local"]
    assert json.loads((again / COMPLETE_MARKER).read_text())["files"].keys() == sealed.keys()
    a, b = (torch.load(Path(d) / "training_state.pt", weights_only=False) for d in (ckpt, again))
    assert a["schedule"] == b["schedule"] == {"done": 8, "total": 16}
    assert a["format"] == 2 and a["optimizer"] == "optimizer" and a["world_size"] == 2
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    sa, sb = (read_optimizer_shards(Path(d) / "optimizer") for d in (ckpt, again))
    names = [n for n, _ in lm.named_parameters()]  # the tied lm_head once
    assert sorted(sa) == sorted(sb)
    assert sorted(k for k in sa if k.endswith(".exp_avg")) == sorted(f"optimizer.state.lm.{n}.exp_avg" for n in names)
    for key, value in sa.items():
        if key.endswith(".step"):
            assert float(value) == 8, key
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, sb[key]), key
        else:
            assert value == sb[key], key
    assert any(float(v.abs().max()) > 0 for k, v in sa.items() if k.endswith(".exp_avg_sq"))
    assert (again / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()


def test_the_bf16_mixed_precision_policy_runs_on_cpu(tiny_model_dir, tiny_tokenizer, tmp_path):
    """``update.fsdp_param_dtype: bfloat16`` (bf16 compute, fp32 reductions and master weights) on CPU, in this
    process as a one-rank gloo group (no Ray start): the same update as fp32 FSDP from the same weights, its loss
    and gradient norms near fp32's, its weights fp32 and finite, moved the same way."""
    import torch.distributed as dist

    from rlcr.train.batching import prepare_samples
    from rlcr.train.fsdp import shard
    from rlcr.train.logprobs import CompletionLogProbs
    from rlcr.train.update import train_update

    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        out = {}
        samples = prepare_samples(make_rows(n_prompts=2, g_a=2, g_c=3, seed=3), tiny_tokenizer)
        for dtype in ("float32", "bfloat16"):
            cfg = _cfg(tmp_path, fsdp=True, fsdp_param_dtype=dtype, num_workers=1)
            lm = load_lm(tiny_model_dir)
            policy = shard(CompletionLogProbs(lm), lm, param_dtype=dtype)
            m = train_update(policy, samples, cfg, pad_id=tiny_tokenizer.pad_token_id)
            out[dtype] = (m, {k: v.full_tensor() for k, v in lm.state_dict().items()})
    finally:
        dist.destroy_process_group()
    (m32, w32), (m16, w16) = out["float32"], out["bfloat16"]
    assert m16["optimizer_steps"] == 8 and m16["skipped_steps"] == 0
    assert m16["loss"] == pytest.approx(m32["loss"], rel=0.01) and m16["loss"] != m32["loss"]  # bf16 did round
    for h16, h32 in zip(m16["history"], m32["history"]):
        assert h16["grad_norm"] == pytest.approx(h32["grad_norm"], rel=0.02)
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in w16.values())
    w0 = load_lm(tiny_model_dir).state_dict()
    d16, d32 = (torch.cat([(w[k] - w0[k]).double().flatten() for k in w0]) for w in (w16, w32))
    assert float(d16 @ d32 / (d16.norm() * d32.norm())) > 0.99  # the update points the same way


# ----------------------------------------------------------------------------- SIGKILL under FSDP


@pytest.mark.extended
def test_sigkill_during_the_sharded_update_and_the_save_resumes_exactly(ray_local, prefect_harness, tiny_model_dir,
                                                                        tmp_path):
    """Two FSDP workers, a save every iteration: the flow's process SIGKILLed as iteration 2's update starts, then
    (resumed) as iteration 2's save starts, then resumed to the end. Its committed rollouts, losses, final weights
    and AdamW moments equal an uninterrupted FSDP run's bit for bit."""
    import os
    from pathlib import Path

    import ray
    from prefect.settings import PREFECT_API_URL
    from safetensors.torch import load_file

    from flows.train import rlcr_train
    from rlcr.runs.store import RunStore
    from test_one_step_off import overrides, records, run_flow

    def over(name):
        o = {**overrides(tiny_model_dir, tmp_path / name), "orchestration.mode": "sync", "update.fsdp": True,
             "update.num_workers": 2, "orchestration.save_every": 1, "engine.sync_bucket_mib": 0.2}
        o.pop("loss.tis_cap")
        return o

    rlcr_train(overrides=over("ref"), run_id="r", iterations=3)
    ref = RunStore.open(RLCRConfig.from_dict(over("ref")), "r")
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(Path(__file__).parent.parent)}
    run = RunStore.open(RLCRConfig.from_dict(over("killed")), "r")
    for stage, committed in (("update", [1]), ("save", [1])):
        p = run_flow(env, over("killed"), "r", 3, stage, 2, 0)
        assert p.returncode == -9 and f"KILL {stage}@2" in p.stdout + p.stderr, (stage, (p.stdout + p.stderr)[-4000:])
        assert [x["iteration"] for x in run.committed()] == committed, stage
    p = run_flow(env, over("killed"), "r", 3)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    m, n = ref.committed(), run.committed()
    assert [x["iteration"] for x in n] == [1, 2, 3]
    for a, b in zip(m, n):
        assert records(ref, a) == records(run, b), a["iteration"]
        assert ref.metrics(a["iteration"])["update"]["loss"] == run.metrics(b["iteration"])["update"]["loss"]
    wa, wb = (load_file(f"{x['checkpoint_uri']}/model.safetensors") for x in (m[2], n[2]))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = (torch.load(f"{x['checkpoint_uri']}/training_state.pt", weights_only=False) for x in (m[2], n[2]))
    assert sa["schedule"] == sb["schedule"] and sa["format"] == sb["format"] == 2
    oa, ob = (read_optimizer_shards(f"{x['checkpoint_uri']}/optimizer") for x in (m[2], n[2]))
    assert oa.keys() == ob.keys() and any(k.endswith(".exp_avg_sq") for k in oa)
    for key, value in oa.items():
        assert torch.equal(value, ob[key]) if isinstance(value, torch.Tensor) else value == ob[key], key


@pytest.mark.extended
def test_fsdp_and_ddp_give_the_same_update_on_smollm2(ray_local, smollm2_dir, tmp_path):
    """test_fsdp_and_ddp_give_the_same_update at SmolLM2-135M's size (30 decoder layers, tied 49k embedding): two
    gloo workers each way, the same rows, four optimizer steps."""
    from rlcr.train.trainer import PolicyTrainer

    rows = make_rows(n_prompts=2, g_a=2, g_c=3, seed=5, vocab=(100, 49000))
    out = {}
    for name, fsdp in (("ddp", False), ("fsdp", True)):
        cfg = RLCRConfig(storage={"uri": str(tmp_path)}, run={"iterations": 1},
                         update={"num_workers": 2, "learning_rate": 1e-5, "micro_batch_tokens": 256,
                                 "mini_batches_per_epoch": 4, "fsdp": fsdp}, engine={"sync_bucket_mib": 64})
        with PolicyTrainer(cfg, policy_uri=str(smollm2_dir)) as trainer:
            u = trainer.update(rows, 1)
            out[name] = (u.metrics, unpacked(u.weights.resolve()))
    (md, wd), (mf, wf) = out["ddp"], out["fsdp"]
    assert md["optimizer_steps"] == mf["optimizer_steps"] == 4 and mf["world_size"] == 2
    assert mf["loss"] == pytest.approx(md["loss"], rel=FLOAT_RTOL)
    for hd, hf in zip(md["history"], mf["history"]):
        assert hf["grad_norm"] == pytest.approx(hd["grad_norm"], rel=FLOAT_RTOL), (hd, hf)
    assert md["weights_buckets"] == mf["weights_buckets"] >= 8  # 540 MB in buckets of 64 MiB, cut alike
    w0 = load_lm(smollm2_dir).state_dict()
    assert wd.keys() == wf.keys() == w0.keys()
    for k in w0:
        dd, df = (wd[k] - w0[k]).double(), (wf[k] - w0[k]).double()
        assert float((dd - df).norm()) <= DELTA_RTOL * max(float(dd.norm()), 1e-12), k
