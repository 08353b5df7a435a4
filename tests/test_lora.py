"""LoRA (issue 50): only the adapters train, the frozen base is π_ref, adapter checkpoints are small and read merged
everywhere, the engines merge an adapter update into their base bit-identically to an engine created from the merged
checkpoint, a LoRA run commits adapter checkpoints and evaluates the merged policy, and (``extended``: `make
test-extended`) a LoRA run killed with SIGKILL resumes exactly. Tiny models; the Ray/vLLM/flow tests are slow."""

import json
import os
from pathlib import Path

import pytest
import torch

from rlcr.config import RLCRConfig
from rlcr.models.adapters import (
    ADAPTER_WEIGHTS,
    base_content_id,
    export_merged,
    fetch_model,
    is_adapter_dir,
    merged_dir,
    read_adapter,
)
from rlcr.models.weights import read_checkpoint_weights, read_frame
from rlcr.storage import Store, fetch_checkpoint
from rlcr.train.batching import prepare_samples
from rlcr.train.checkpoint import TRAINING_STATE_FILE, save_adapter_checkpoint
from rlcr.train.logprobs import CompletionLogProbs
from rlcr.train.lora import AdapterOff, adapter_update, load_adapter_state, lora_layers, wrap_lora
from rlcr.train.update import make_optimizer, train_update
from test_train import load_lm, make_rows

HERE = Path(__file__).parent


def lora_cfg(tmp_path, **kw):
    base = {"storage.uri": str(tmp_path / "store"), "update.learning_rate": 1e-2, "update.micro_batch_tokens": 96,
            "lora.enabled": True, "lora.rank": 4, "lora.alpha": 8.0}
    base.update(kw)
    return RLCRConfig.from_dict(base)


def trained(tiny_model_dir, tiny_tokenizer, cfg, *, seed=0):
    """(peft model, policy, optimizer, metrics) after one LoRA update of synthetic rows."""
    torch.manual_seed(seed)
    peft_model = wrap_lora(load_lm(tiny_model_dir), cfg)
    policy = CompletionLogProbs(peft_model.base_model.model)
    optimizer = make_optimizer(policy, cfg)
    ref = AdapterOff(policy, peft_model) if cfg.loss.kl_coef > 0 else None
    m = train_update(policy, prepare_samples(make_rows(2, 2, 2), tiny_tokenizer), cfg, ref=ref,
                     pad_id=tiny_tokenizer.pad_token_id, optimizer=optimizer)
    return peft_model, policy, optimizer, m


def test_a_lora_update_trains_only_the_adapters(tiny_model_dir, tiny_tokenizer, tmp_path):
    cfg = lora_cfg(tmp_path)
    base = load_lm(tiny_model_dir).state_dict()
    peft_model, policy, optimizer, m = trained(tiny_model_dir, tiny_tokenizer, cfg)
    assert m["optimizer_steps"] == 1
    adapters = {id(p) for n, p in peft_model.named_parameters() if ".lora_" in n}
    in_adamw = [p for g in optimizer.param_groups for p in g["params"]]
    assert adapters and {id(p) for p in in_adamw} == adapters  # AdamW holds the adapters, nothing else
    assert set(map(id, optimizer.state)) == adapters
    trained_sd = peft_model.base_model.model.state_dict()
    for name, w in base.items():  # every base weight is untouched (LoRA layers keep it as base_layer.weight)
        key = name if name in trained_sd else name.replace(".weight", ".base_layer.weight")
        assert torch.equal(trained_sd[key], w), name
    assert all(float(layer.lora_B["default"].weight.abs().max()) > 0 for layer in lora_layers(peft_model).values())


def test_the_kl_reference_is_the_frozen_base(tiny_model_dir, tiny_tokenizer, tmp_path):
    cfg = lora_cfg(tmp_path, **{"loss.kl_coef": 0.1})
    peft_model, policy, _, m = trained(tiny_model_dir, tiny_tokenizer, cfg)
    assert "ref_kl" in m and m["ref_kl"] == 0.0  # step 1: the adapters start at B = 0, so π = π_ref
    from rlcr.train.batching import collate

    samples = prepare_samples(make_rows(1, 2, 1, seed=5), tiny_tokenizer)
    mb = collate(samples, tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        ref_lp, _ = AdapterOff(policy, peft_model)(**mb.model_inputs())
        base_lp, _ = CompletionLogProbs(load_lm(tiny_model_dir))(**mb.model_inputs())
        policy_lp, _ = policy(**mb.model_inputs())
    assert torch.equal(ref_lp, base_lp)  # the base's log-probs exactly, from the one model
    assert not torch.allclose(policy_lp, base_lp, atol=1e-4)  # the adapters did move the policy


def save_lora(peft_model, optimizer, tmp_path, base_uri, rel="runs/r/iter-0001/checkpoint"):
    store = Store(str(tmp_path / "store"))
    state = {"optimizer": optimizer.state_dict(), "format": 1}
    return save_adapter_checkpoint(peft_model, store, rel, frame=read_frame(base_uri), base_uri=base_uri,
                                   base_content_id=base_content_id(base_uri), extra={"iteration": 1},
                                   training_state=state)


def _bytes(d: Path, names) -> int:
    return sum((d / n).stat().st_size for n in names)


def test_an_adapter_checkpoint_is_small_and_reads_as_the_merged_model(tiny_model_dir, tiny_tokenizer, tmp_path):
    cfg = lora_cfg(tmp_path)
    peft_model, _, optimizer, _ = trained(tiny_model_dir, tiny_tokenizer, cfg)
    uri = save_lora(peft_model, optimizer, tmp_path, str(tiny_model_dir))
    raw = fetch_checkpoint(uri)
    assert is_adapter_dir(raw) and not (raw / "model.safetensors").exists()
    # the training state (adapter + its AdamW moments) against a full one (weights + two moments)
    lora_state = _bytes(raw, [ADAPTER_WEIGHTS, TRAINING_STATE_FILE])
    full_state = 3 * (tiny_model_dir / "model.safetensors").stat().st_size
    assert lora_state < 0.15 * full_state, (lora_state, full_state)

    merged = fetch_model(uri)  # what every reader of a model gets
    assert merged != raw and read_frame(merged) == read_frame(tiny_model_dir)
    got = read_checkpoint_weights(merged)
    expected = peft_model.merge_and_unload().state_dict()
    base = read_checkpoint_weights(tiny_model_dir)
    targeted = set(read_adapter(raw).factors)
    assert targeted and targeted == {n for n in base if n.endswith("_proj.weight")}
    for name, w in got.items():
        if name in targeted:
            assert torch.allclose(w, expected[name], atol=1e-6) and not torch.equal(w, base[name]), name
        else:
            assert torch.equal(w, base[name]), name
    assert fetch_model(uri) == merged  # built once, then read from the cache


def test_a_resumed_model_gets_the_saved_adapters(tiny_model_dir, tiny_tokenizer, tmp_path):
    cfg = lora_cfg(tmp_path)
    peft_model, _, optimizer, _ = trained(tiny_model_dir, tiny_tokenizer, cfg)
    raw = fetch_checkpoint(save_lora(peft_model, optimizer, tmp_path, str(tiny_model_dir)))
    torch.manual_seed(123)  # another A initialisation: the load must replace it
    fresh = wrap_lora(load_lm(tiny_model_dir), cfg)
    load_adapter_state(fresh, raw)
    want, got = adapter_update(peft_model), adapter_update(fresh)
    assert want.tensors.keys() == got.tensors.keys() and want.scale == got.scale == 2.0
    assert all((want.tensors[k] == got.tensors[k]).all() for k in want.tensors)
    with pytest.raises(ValueError, match="does not match lora"):
        load_adapter_state(wrap_lora(load_lm(tiny_model_dir),
                                     lora_cfg(tmp_path, **{"lora.target_modules": ["q_proj"]})),
                           raw)


def test_export_writes_a_plain_hf_model_of_the_merged_weights(tiny_model_dir, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = lora_cfg(tmp_path)
    peft_model, _, optimizer, _ = trained(tiny_model_dir, tiny_tokenizer, cfg)
    uri = save_lora(peft_model, optimizer, tmp_path, str(tiny_model_dir))
    out = export_merged(fetch_checkpoint(uri), tmp_path / "export")
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in names and "config.json" in names
    assert not {ADAPTER_WEIGHTS, TRAINING_STATE_FILE, "rlcr_adapter.json", "adapter_config.json"} & set(names)
    ids = torch.tensor([[5, 17, 33, 2, 90, 7]])
    with torch.no_grad():
        exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(ids).logits
        via_merged = load_lm(merged_dir(fetch_checkpoint(uri)))(ids).logits
        trainer = peft_model(input_ids=ids).logits
    assert torch.equal(exported, via_merged)
    assert torch.allclose(exported, trainer, atol=1e-4)
    with pytest.raises(FileExistsError):
        export_merged(fetch_checkpoint(uri), out)

    from typer.testing import CliRunner

    from rlcr.cli import app

    result = CliRunner().invoke(app, ["export", str(fetch_checkpoint(uri)), "--out", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    again = CliRunner().invoke(app, ["export", str(tiny_model_dir), "--out", str(tmp_path / "cli")])
    assert again.exit_code == 2 and "not an empty directory" in again.output


def test_lora_config_is_off_by_default_changes_results_and_refuses_fsdp():
    from rlcr.config.fields import changes_results

    assert RLCRConfig().lora.enabled is False
    assert all(changes_results(f) for n, f in RLCRConfig.dotted_fields() if n.startswith("lora."))
    with pytest.raises(Exception, match="lora.enabled with update.fsdp"):
        RLCRConfig.from_dict({"lora.enabled": True, "update.use_gpu": True, "update.fsdp": True})
    with pytest.raises(Exception, match="target_modules"):
        RLCRConfig.from_dict({"lora.target_modules": ["q_proj; rm"]})


# ----------------------------------------------------------------------------- engines (vLLM), Ray Train


def test_an_adapter_update_samples_exactly_as_an_engine_created_from_the_merged_checkpoint(
        ray_local, tiny_model_dir, tiny_tokenizer, tmp_path):
    import ray

    from rlcr.rollout.engine import EnginePool
    from test_rollout import tiny_cfg
    from test_weight_sync import sample_answers

    cfg = lora_cfg(tmp_path)
    peft_model, _, optimizer, _ = trained(tiny_model_dir, tiny_tokenizer, cfg)
    for layer in lora_layers(peft_model).values():  # a bigger move than one step: the samples must change
        torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.05)
    update = adapter_update(peft_model)
    uri = save_lora(peft_model, optimizer, tmp_path, str(tiny_model_dir))
    with EnginePool(tiny_cfg(tiny_model_dir, tmp_path / "engine-store"), str(tiny_model_dir)) as pool:
        base = sample_answers(pool, str(tiny_model_dir))
        info = pool.update_weights(ray.put(update), "lora-v1")[0]
        assert info["mode"] == "inplace" and info["adapter_bytes"] < info["bytes"]
        synced = sample_answers(pool, "lora-v1")
        assert synced != base
        # the reference: an engine created from the merged checkpoint (as eval, the probe or a restart get it)
        assert pool.load(uri, mode="recreate")[0]["mode"] == "recreate"
        assert sample_answers(pool, uri) == synced  # same tokens, bit-identical log-probs
        # the next version merges into the base again (not into the engine's current weights)
        assert pool.update_weights(update, "lora-v2")[0]["mode"] == "inplace"
        assert sample_answers(pool, "lora-v2") == synced
        pool.load(str(tiny_model_dir))
        assert sample_answers(pool, str(tiny_model_dir)) == base


def test_a_lora_update_on_one_and_two_workers(ray_local, tiny_model_dir, tmp_path):
    from rlcr.train.trainer import run_update

    rows = make_rows(n_prompts=2, g_a=2, g_c=3, seed=3)[:14]
    adapters = {}
    for workers in (1, 2):
        cfg = lora_cfg(tmp_path / f"w{workers}", **{"update.num_workers": workers, "update.learning_rate": 1e-3,
                                                    "update.micro_batch_tokens": 64,
                                                    "update.mini_batches_per_epoch": 4})
        res = run_update(cfg, rows, policy_uri=str(tiny_model_dir), run_id="r", iteration=1, with_optimizer=True)
        assert res.metrics["optimizer_steps"] == 4 and res.metrics["world_size"] == workers
        raw = fetch_checkpoint(res.checkpoint_uri)
        assert (is_adapter_dir(raw)
                and json.loads((raw / "rlcr_adapter.json").read_text())["base"] == str(tiny_model_dir))
        state = torch.load(raw / TRAINING_STATE_FILE, weights_only=False)
        assert len(state["optimizer"]["state"]) == 2 * 7 * 2  # A and B of 7 modules × 2 layers: nothing else
        adapters[workers] = read_adapter(raw).factors
    for name, (a1, b1) in adapters[1].items():
        a2, b2 = adapters[2][name]
        # the same seeded initialisation on every rank, the same steps up to float summation order
        assert torch.allclose(a1, a2, atol=2e-4, rtol=0.02), name
        assert float(b1.abs().max()) > 0 and torch.allclose(b1, b2, atol=2e-4, rtol=0.02), name


def lora_flow_overrides(tiny_model_dir, store) -> dict:
    return {
        "model.name": str(tiny_model_dir), "storage.uri": str(store), "rollout.prompts_per_iteration": 2,
        "rollout.num_generations_answer": 2, "rollout.num_generations_confidence": 2, "tasks.num_train": 16,
        "tasks.num_eval": 4, "rollout.temperature": 1.0, "rollout.max_answer_tokens": 16,
        "rollout.max_confidence_tokens": 8, "engine.max_model_len": 512, "engine.kv_cache_gib": 0.25,
        "update.learning_rate": 1e-2, "orchestration.retries": 0, "eval.every": 2, "loss.kl_coef": 0.05,
        "lora.enabled": True, "lora.rank": 4,
    }


def test_a_lora_run_commits_adapter_checkpoints_and_evaluates_the_merged_policy(ray_local, prefect_harness,
                                                                                tiny_model_dir, tmp_path):
    """The real flow with ``lora.enabled``, in this process: every committed checkpoint is an adapter (no full
    weights) with its AdamW state over the adapters only, and the held-out evaluation ran on the merged policy."""
    from flows.train import rlcr_train
    from rlcr.runs.store import RunStore

    overrides = lora_flow_overrides(tiny_model_dir, tmp_path / "store")
    rlcr_train(overrides=overrides, run_id="straight", iterations=2)
    run = RunStore.open(RLCRConfig.from_dict(overrides), "straight")
    committed = run.committed()
    assert [m["iteration"] for m in committed] == [1, 2]
    for m in committed:
        raw = fetch_checkpoint(m["checkpoint_uri"])
        assert is_adapter_dir(raw) and not (raw / "model.safetensors").exists()
        # its base: the run's starting model, the store's copy of the plain model directory (docs/models.md)
        assert json.loads((raw / "rlcr_adapter.json").read_text())["base"] == committed[0]["policy_in"]
        state = torch.load(raw / TRAINING_STATE_FILE, weights_only=False)
        assert len(state["optimizer"]["state"]) == 2 * 7 * 2  # A and B of 7 modules × 2 layers: nothing else
    evaluated = run.store.read_json(run.store.rel(committed[-1]["metrics_uri"]))
    assert "accuracy" in evaluated["eval"] and evaluated["engines"]["policy"] == committed[-1]["checkpoint_uri"]
    merged = fetch_model(committed[-1]["checkpoint_uri"])
    assert merged != fetch_checkpoint(committed[-1]["checkpoint_uri"]) and (merged / "model.safetensors").exists()


@pytest.mark.extended
def test_a_lora_run_killed_during_its_update_resumes_exactly(ray_local, prefect_harness, tiny_model_dir, tmp_path):
    """The real flow with ``lora.enabled``: one run straight through, one SIGKILLed as iteration 2's update
    starts and resumed; both commit the same adapters, AdamW state and rollouts."""
    import ray
    from prefect.settings import PREFECT_API_URL

    from rlcr.runs.store import RunStore
    from test_kill import run_flow

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(HERE.parent)}
    overrides = lora_flow_overrides(tiny_model_dir, tmp_path / "store")
    straight = run_flow(env, overrides, "straight", 2)
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]
    killed = run_flow(env, overrides, "killed", 2, "update", 2, 0)
    assert killed.returncode == -9 and "KILL update@2" in killed.stdout + killed.stderr
    resumed = run_flow(env, overrides, "killed", 2)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    cfg = RLCRConfig.from_dict(overrides)
    runs = [RunStore.open(cfg, name) for name in ("straight", "killed")]
    for a, b in zip(*(run.committed() for run in runs)):
        raw_a, raw_b = (fetch_checkpoint(m["checkpoint_uri"]) for m in (a, b))
        assert is_adapter_dir(raw_a) and not (raw_a / "model.safetensors").exists()
        fa, fb = read_adapter(raw_a).factors, read_adapter(raw_b).factors
        assert fa.keys() == fb.keys() and all(torch.equal(x, y) for k in fa for x, y in zip(fa[k], fb[k]))
        sa, sb = (torch.load(d / TRAINING_STATE_FILE, weights_only=False) for d in (raw_a, raw_b))
        assert sa["schedule"] == sb["schedule"]
        for k, v in sa["optimizer"]["state"].items():
            assert all(torch.equal(v[x], sb["optimizer"]["state"][k][x]) for x in ("exp_avg", "exp_avg_sq")), k
    evals = [run.store.read_json(run.store.rel(run.committed()[-1]["metrics_uri"]))["eval"] for run in runs]
    for key in ("accuracy", "brier", "ece"):  # the policy the engines merged, evaluated alike
        if key in evals[0]:  # (NaN where nothing is answered: equal as well)
            assert json.dumps(evals[0][key]) == json.dumps(evals[1][key]), key
    assert "accuracy" in evals[0]
    last = runs[1].committed()[-1]
    assert fetch_model(last["checkpoint_uri"]) != fetch_checkpoint(last["checkpoint_uri"])
