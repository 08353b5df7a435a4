"""Weight sync into long-lived engines (issue 16): in place from Ray's object store and exact, or by re-creating
the engine; bad weights are refused before the engine is touched. Real vLLM (CPU), local Ray, tiny models."""

import shutil
import time

import numpy as np
import pytest
import torch

from rlcr.models.weights import (
    Bfloat16Bits,
    SameAs,
    WeightSpec,
    check_weights,
    checkpoint_weight_spec,
    frame_id,
    pack_weights,
    read_checkpoint_weights,
    read_frame,
)
from rlcr.rollout.pipeline import run_rollouts
from rlcr.tasks.countdown import generate_tasks, turn1_messages
from test_rollout import assert_logprobs_match, tiny_cfg

TASKS = list(enumerate(generate_tasks(3, seed=11)))


@pytest.fixture(scope="module")
def model_b(tiny_model_dir, tmp_path_factory):
    """Policy B: another tiny model's weights in A's config and tokenizer (what a training step changes)."""
    from rlcr.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("model-b")
    other = build_tiny_model(root / "other", seed=1)
    b = root / "b"
    shutil.copytree(tiny_model_dir, b)
    shutil.copy(other / "model.safetensors", b / "model.safetensors")
    return b


@pytest.fixture(scope="module")
def cfg(tiny_model_dir, tmp_path_factory):
    return tiny_cfg(tiny_model_dir, tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def pool(ray_local, cfg, tiny_model_dir):
    from rlcr.rollout.engine import EnginePool

    with EnginePool(cfg, str(tiny_model_dir)) as engines:
        yield engines


def sample_answers(pool, version: str):
    """Seeded answers straight from the (single) engine actor: [(completion ids, log-probs)] per sample."""
    import ray

    from rlcr.seeds import answer_seed

    conversations = [turn1_messages(t) for _, t in TASKS]
    _, samples = ray.get(pool.actors[0].generate_chats.remote(
        conversations, policy_uri=version, labels=[f"prompt_id={i}" for i, _ in TASKS], mask_kind="answer",
        seeds=[[answer_seed(7, i, k) for k in range(3)] for i, _ in TASKS], n=3, temperature=1.0, top_p=1.0,
        max_tokens=20))
    return [(s.completion_ids, s.completion_logprobs) for group in samples for s in group]


@pytest.fixture(scope="module")
def samples_a(pool, tiny_model_dir):
    """A's answers from the engine created from A's checkpoint (taken before any update)."""
    return sample_answers(pool, str(tiny_model_dir))


@pytest.fixture
def restore_a(pool, tiny_model_dir, samples_a):
    """Put A back after the test (a checkpoint load, in place) and check it is A again."""
    yield
    pool.load(str(tiny_model_dir))
    assert sample_answers(pool, str(tiny_model_dir)) == samples_a


def test_inplace_update_samples_exactly_as_an_engine_created_from_the_weights(
        ray_local, pool, cfg, tiny_model_dir, model_b, samples_a, restore_a):
    import ray

    ref = ray.put(pack_weights(read_checkpoint_weights(model_b)))
    info = pool.update_weights(ref, str(model_b))
    assert [i["mode"] for i in info] == ["inplace"] and info[0]["policy_uri"] == str(model_b)
    assert ray.get(pool.actors[0].current.remote()) == pool.policy_uri == str(model_b)
    rollouts = run_rollouts(cfg, TASKS, policy_uri=str(model_b), run_id="inplace", iteration=0, engines=pool)
    assert_logprobs_match(rollouts.rows, model_b)  # log π of B, not of A
    inplace = sample_answers(pool, str(model_b))
    assert inplace != samples_a

    # the reference: an engine created from B's checkpoint directory (as an owned engine would be)
    assert [i["mode"] for i in pool.load(str(model_b), mode="recreate")] == ["recreate"]
    assert sample_answers(pool, str(model_b)) == inplace  # same tokens, bit-identical log-probs

    # a stage built for another policy never samples from this one
    with pytest.raises(Exception, match="call load"):
        run_rollouts(cfg, TASKS, policy_uri=str(tiny_model_dir), run_id="stale", iteration=0, engines=pool)


def test_update_back_to_a_gives_a_samples(pool, tiny_model_dir, model_b, samples_a, restore_a):
    pool.update_weights(read_checkpoint_weights(model_b), "policy-b")
    assert sample_answers(pool, "policy-b") != samples_a
    # a plain state dict of torch tensors: the pool packs and puts it
    info = pool.update_weights(read_checkpoint_weights(tiny_model_dir), "policy-a-again")
    assert info[0]["mode"] == "inplace" and info[0]["content_id"] is None
    assert sample_answers(pool, "policy-a-again") == samples_a
    with pytest.raises(Exception, match="engine holds policy-a-again.*call load"):
        sample_answers(pool, "policy-b")


def test_layer_keys_cut_buckets_between_decoder_layers_only():
    from rlcr.models.weights import layer_key

    assert layer_key("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert layer_key("transformer.h.3.mlp.c_fc.weight") == "transformer.h.3"
    assert layer_key("model.embed_tokens.weight") == layer_key("lm_head.weight") == ""


def test_weights_in_buckets_load_as_one_update(pool, tiny_model_dir, model_b, samples_a, restore_a):
    """The trainer's weights a bounded bucket at a time (rlcr.models.weights.BucketWriter, ``engine.sync_bucket_mib``):
    whole decoder layers per bucket, none over the limit by more than one layer; the engines load them as one
    update and sample exactly as from the same weights in one piece. A weight in two buckets is refused and the
    engine keeps its weights."""
    import ray

    from rlcr.models.weights import BucketWriter, layer_key

    weights = read_checkpoint_weights(model_b)
    pool.update_weights(weights, "b-whole")
    whole = sample_answers(pool, "b-whole")
    assert whole != samples_a
    layer_bytes = {}
    for name, t in weights.items():
        layer_bytes[layer_key(name)] = layer_bytes.get(layer_key(name), 0) + t.numel() * t.element_size()
    limit = 40_000
    writer = BucketWriter(limit)
    for name, t in weights.items():
        writer.add(name, t)
    buckets = writer.close()
    assert len(buckets.refs) >= 3 and buckets.tensors == len(weights)
    assert buckets.bytes == sum(layer_bytes.values()) and buckets.largest <= limit + max(layer_bytes.values())
    seen = {}
    for k, bucket in enumerate(ray.get(buckets.refs)):
        for name in bucket:
            assert seen.setdefault(layer_key(name), k) == k or layer_key(name) == "", name  # a layer in one bucket
    pool.load(str(tiny_model_dir))
    info = pool.update_weights(buckets, "b-buckets")
    assert info[0]["buckets"] == len(buckets.refs) and info[0]["tensors"] == len(weights)
    assert sample_answers(pool, "b-buckets") == whole

    first = next(iter(weights))
    twice = BucketWriter(limit)
    twice.add(first, weights[first])
    twice._flush()
    for name, t in weights.items():
        twice.add(name, t)
    with pytest.raises(Exception, match="in two buckets"):
        pool.update_weights(twice.close(), "b-twice")
    assert sample_answers(pool, "b-buckets") == whole


def test_released_engines_restart_with_the_new_weights(pool, tiny_model_dir, model_b, samples_a, restore_a):
    """engine_release_during_update: release() stops the engines (their memory is freed, their names gone);
    the weight sync starts them again from the frame and samples exactly as the running engine did."""
    import ray

    pool.update_weights(read_checkpoint_weights(model_b), "policy-b")
    want_b = sample_answers(pool, "policy-b")
    old_names = list(pool.names)
    pool.release()
    assert pool.released and pool.actors == []
    deadline = time.monotonic() + 60  # ray.kill is asynchronous: the names go once the actors are dead
    for name in old_names:
        while True:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            assert time.monotonic() < deadline, f"engine {name} still alive after release()"
            time.sleep(0.2)
    info = pool.update_weights(read_checkpoint_weights(model_b), "policy-b")
    assert not pool.released and pool.names != old_names and [i["mode"] for i in info] == ["inplace"]
    assert sample_answers(pool, "policy-b") == want_b != samples_a


def _bad_weight_dicts(weights_b: dict) -> dict:
    """Name in the error → a state dict that must be refused."""
    q, o, up = ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                "model.layers.1.mlp.up_proj.weight")
    cases = {
        q: {**weights_b, q: weights_b[q][:-1]},  # wrong shape
        "model.layers.7.mlp.up_proj.weight": {**weights_b, "model.layers.7.mlp.up_proj.weight": weights_b[up]},
        o: {k: v for k, v in weights_b.items() if k != o},  # missing
        up: {**weights_b, up: weights_b[up].to(torch.int32)},  # not floating point
        "lm_head.weight": {**weights_b, "lm_head.weight": weights_b["model.embed_tokens.weight"] + 1.0},  # untied
    }
    return cases


def test_bad_weights_are_refused_and_the_engine_keeps_its_weights(pool, tiny_model_dir, model_b, samples_a):
    import ray

    for name, bad in _bad_weight_dicts(read_checkpoint_weights(model_b)).items():
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            pool.update_weights(bad, "policy-bad")
        assert ray.get(pool.actors[0].current.remote()) == str(tiny_model_dir), name
    assert sample_answers(pool, str(tiny_model_dir)) == samples_a
    with pytest.raises(ValueError, match="weight sync mode 'reload'"):
        pool.update_weights(read_checkpoint_weights(model_b), "policy-b", mode="reload")


def test_recreate_from_memory_samples_as_inplace(pool, model_b, samples_a, restore_a):
    weights = read_checkpoint_weights(model_b)
    assert pool.update_weights(weights, "policy-b-inplace")[0]["mode"] == "inplace"
    inplace = sample_answers(pool, "policy-b-inplace")
    assert pool.update_weights(weights, "policy-b-recreated", mode="recreate")[0]["mode"] == "recreate"
    assert sample_answers(pool, "policy-b-recreated") == inplace != samples_a


def test_checkpoint_load_is_inplace_only_for_the_same_config_and_tokenizer(pool, model_b, tmp_path, restore_a):
    """A checkpoint of the running model's frame loads in place; another tokenizer re-creates the engine."""
    from rlcr.models.tiny import build_tiny_model

    assert pool.load(str(model_b))[0]["mode"] == "inplace"
    assert pool.load(str(model_b))[0]["mode"] == "unchanged"
    other = build_tiny_model(tmp_path / "other", seed=1)  # its BPE is trained on another corpus sample
    assert read_frame(other)["tokenizer.json"] != read_frame(model_b)["tokenizer.json"]
    assert pool.load(str(other))[0]["mode"] == "recreate"


# ---------------------------------------------------------------- no engine


def test_check_weights_handles_the_tied_head(tiny_model_dir):
    spec = checkpoint_weight_spec(tiny_model_dir)
    weights = read_checkpoint_weights(tiny_model_dir)
    assert spec.tied_head and "lm_head.weight" not in spec.shapes and set(spec.shapes) == set(weights)
    embedding = weights["model.embed_tokens.weight"]
    # state_dict() of a tied model lists the head too: accepted when it is the embedding, and not loaded twice
    assert set(check_weights({**weights, "lm_head.weight": embedding.clone()}, spec)) == set(weights)
    untied = WeightSpec(shapes=spec.shapes, tied_head=False)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['lm_head\.weight'\]"):
        check_weights({**weights, "lm_head.weight": embedding}, untied)
    with pytest.raises(ValueError, match="expected a torch tensor or numpy array"):
        check_weights({**weights, "model.norm.weight": [1.0] * 128}, spec)


def test_packed_weights_are_numpy_and_load_as_the_same_tensors(tiny_model_dir):
    weights = read_checkpoint_weights(tiny_model_dir)
    packed = pack_weights(weights)
    assert all(isinstance(v, np.ndarray) for v in packed.values())
    back = check_weights(packed, checkpoint_weight_spec(tiny_model_dir))
    assert all(torch.equal(back[k], weights[k]) for k in weights)
    bf16 = {k: v.to(torch.bfloat16) for k, v in weights.items()}  # numpy has no bfloat16: its bits travel
    packed = pack_weights(bf16)
    assert all(isinstance(v, Bfloat16Bits) and isinstance(v.bits, np.ndarray) for v in packed.values())
    back = check_weights(packed, checkpoint_weight_spec(tiny_model_dir))
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(back[k], bf16[k]) for k in weights)


def test_a_trainer_state_dict_packs_to_the_checkpoint_names(tiny_model_dir):
    """What the trainer sends (``state_dict()``, tied head listed twice) is what the engine's checkpoint holds."""
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert "lm_head.weight" in state
    packed = pack_weights(state)
    spec = checkpoint_weight_spec(tiny_model_dir)
    assert packed["lm_head.weight"] == SameAs("model.embed_tokens.weight")  # the tied head is sent once
    assert set(check_weights(packed, spec)) == set(spec.shapes)
    # a tensor listed twice is still checked under both names
    twice = pack_weights({**state, "model.layers.5.mlp.up_proj.weight": state["model.layers.0.mlp.up_proj.weight"]})
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['model\.layers\.5\.mlp\.up_proj\.weight'\]"):
        check_weights(twice, spec)


def test_frame_ignores_weights_and_rlcr_files(tiny_model_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    (copy / "_COMPLETE").write_text("seal")
    (copy / "rlcr_update.json").write_text("{}")
    (copy / "model.safetensors").write_bytes(b"other weights")
    cfg_text = (copy / "config.json").read_text().replace('"transformers_version": "', '"transformers_version": "0.')
    (copy / "config.json").write_text(cfg_text)
    assert frame_id(read_frame(copy)) == frame_id(read_frame(tiny_model_dir))
    (copy / "config.json").write_text(cfg_text.replace('"rms_norm_eps"', '"rms_norm_eps_x"'))
    assert frame_id(read_frame(copy)) != frame_id(read_frame(tiny_model_dir))
