"""A LoRA run's base is recorded portably and checked by content; the engine's log-probs under truncated sampling;
S3 model folders with folder-marker keys or empty path segments (docs/design.md §11.1, docs/configuration.md)."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from rlcr.models.adapters import ADAPTER_FILE, base_content_id, base_dir, base_reference, export_merged, fetch_model
from rlcr.models.smollm2 import builtin_dir
from rlcr.models.weights import read_checkpoint_weights, read_frame
from rlcr.storage import Store, fetch_checkpoint
from rlcr.train.checkpoint import save_adapter_checkpoint
from rlcr.train.lora import lora_layers, wrap_lora
from test_lora import lora_cfg
from test_train import load_lm

# ----------------------------------------------------------------------------- a LoRA run's base


def _adapter_checkpoint(base: Path, tmp_path: Path, base_uri: str, content_id: str | None) -> Path:
    """An adapter checkpoint over ``base`` (B non-zero, so the merge changes weights) recording ``base_uri`` and
    ``content_id`` as its base, the way the trainer's worker writes one; its local directory."""
    torch.manual_seed(0)
    peft_model = wrap_lora(load_lm(base), lora_cfg(tmp_path))
    with torch.no_grad():
        for layer in lora_layers(peft_model).values():
            layer.lora_B["default"].weight.normal_(0.0, 0.05)
    uri = save_adapter_checkpoint(peft_model, Store(str(tmp_path / "store")), "runs/r/iter-0001/checkpoint",
                                  frame=read_frame(base), base_uri=base_uri, base_content_id=content_id)
    return fetch_checkpoint(uri)


def _node(cache: Path, tiny_model_dir: Path, monkeypatch) -> Path:
    """A node whose cache holds its own build of the built-in ``tiny`` (a copy: other paths, inodes, times)."""
    monkeypatch.setenv("RLCR_CACHE", str(cache))
    shutil.copytree(tiny_model_dir, builtin_dir("tiny"))
    return builtin_dir("tiny")


def _rebuild_with_other_bits(model_dir: Path) -> None:
    from safetensors.torch import save_file

    weights = read_checkpoint_weights(model_dir)
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3
    for p in model_dir.glob("*.safetensors"):
        p.unlink()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(model_dir / "model.safetensors"),
              metadata={"format": "pt"})


def test_a_builtin_base_is_recorded_by_name_and_content_and_resolved_on_another_node(tiny_model_dir, tmp_path,
                                                                                     monkeypatch):
    """Item 6: a LoRA run on a built-in model recorded its base as this node's cache path with
    ``base_content_id: null``. Now the record is the built-in's name and the sha256 digest of its weights: another
    node (another cache path) re-resolves it by name and exports the same bits; a base rebuilt there with other
    bits is refused, in one line, by export, evaluation (``fetch_model``) and resume (``base_dir``).
    Failed before: ``base_reference`` did not exist (the worker recorded the path and None)."""
    base = _node(tmp_path / "node-a", tiny_model_dir, monkeypatch)
    ref, content_id = base_reference(str(base), base)
    assert ref == "tiny" and content_id.startswith("sha256:") and len(content_id) == len("sha256:") + 32
    raw = _adapter_checkpoint(base, tmp_path, ref, content_id)
    record = json.loads((raw / ADAPTER_FILE).read_text())
    assert record["base"] == "tiny" and record["base_content_id"] == content_id
    first = export_merged(raw, tmp_path / "export-a")

    other = _node(tmp_path / "node-b", tiny_model_dir, monkeypatch)  # another machine: another path, same bits
    assert base_reference(str(other), other) == (ref, content_id)
    second = export_merged(raw, tmp_path / "export-b")
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    merged, plain = read_checkpoint_weights(second), read_checkpoint_weights(other)
    assert any(not torch.equal(merged[k], plain[k]) for k in plain)  # the adapter was merged

    _rebuild_with_other_bits(other)
    for read in (lambda: export_merged(raw, tmp_path / "export-c"), lambda: fetch_model(str(raw)),
                 lambda: base_dir(raw)):
        with pytest.raises(ValueError, match="has content id sha256:[0-9a-f]{32}, the adapter was trained on") as e:
            read()
        assert "\n" not in str(e.value) and content_id in str(e.value)
    assert not (tmp_path / "export-c").exists() or not any((tmp_path / "export-c").iterdir())


def test_a_base_recorded_without_a_content_id_is_refused_not_merged_silently(tiny_model_dir, tmp_path,
                                                                            monkeypatch):
    """Item 6: what the worker wrote before (the node-local path, ``base_content_id: null``) let a rebuilt base be
    merged silently (the export succeeded with the adapter on other weights). Such a record is now refused in one
    line naming the checkpoint and its base. Failed before: the export succeeded."""
    base = _node(tmp_path / "node", tiny_model_dir, monkeypatch)
    raw = _adapter_checkpoint(base, tmp_path, str(base), None)
    _rebuild_with_other_bits(base)
    with pytest.raises(ValueError, match="recorded without a content id") as e:
        export_merged(raw, tmp_path / "export")
    assert "\n" not in str(e.value) and str(base) in str(e.value)


def test_a_sealed_base_is_recorded_by_its_uri_and_its_seals_content_id(tiny_model_dir, tmp_path):
    """Item 6: a base in a store (a run's ``models/`` copy) keeps its URI and its seal's content id; a rewrite
    at that URI (a new seal) is refused. The refusal held before too; the test failed before only because
    ``base_reference`` (what the worker now records through) did not exist."""
    store = Store(str(tmp_path / "store"))
    store.put_dir(tiny_model_dir, "models/m")
    uri = store.url("models/m")
    local = fetch_checkpoint(uri)
    assert base_reference(uri, local) == (uri, store.content_id("models/m")) == (uri, base_content_id(local))
    raw = _adapter_checkpoint(local, tmp_path, *base_reference(uri, local))
    export_merged(raw, tmp_path / "export-a")
    store.rm("models/m")
    store.put_dir(tiny_model_dir, "models/m")  # the same files, sealed anew
    with pytest.raises(ValueError, match="the adapter was trained on"):
        export_merged(raw, tmp_path / "export-b")


# ----------------------------------------------------------------------------- S3 model folders (Small list)


def _upload(s3, model: Path, prefix: str, extra: dict[str, bytes]) -> None:
    """``model``'s files under ``prefix`` and ``extra`` keys, written with the S3 API as any tool would (no seal)."""
    from s3server import BUCKET

    client = s3.client()
    for p in model.iterdir():
        if p.is_file() and p.name != "_COMPLETE":
            client.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.name}", Body=p.read_bytes())
    for key, body in extra.items():
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=body)


def test_s3_folder_markers_are_ignored_and_empty_path_segments_refused(tiny_model_dir, s3, tmp_path):
    """Small list: a zero-byte ``sub/`` folder-marker key made the whole model refused, while a ``a//b`` key was
    silently left out of the copy (the delimiter walk hid it). Now markers are ignored (the model imports, the
    files under ``sub/`` with it) and a key with an empty path segment is refused in one line naming it.
    Failed before: the ``sub/`` folder was refused; the ``a//b`` folder was imported without that file."""
    from rlcr.models.source import ModelSourceError, import_model
    from s3server import BUCKET

    store = Store(f"s3://{BUCKET}/{tmp_path.name}", endpoint_url=s3.endpoint)
    _upload(s3, tiny_model_dir, f"theirs-{tmp_path.name}/marked", {"sub/": b"", "": b"", "sub/notes.txt": b"n"})
    uri = import_model(f"s3://{BUCKET}/theirs-{tmp_path.name}/marked", store, cache_dir=tmp_path / "cache")
    local = fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=tmp_path / "ckpt")
    assert (local / "sub" / "notes.txt").read_bytes() == b"n" and (local / "config.json").is_file()

    for key in ("a//b", "sub//c"):
        prefix = f"theirs-{tmp_path.name}/gap-{key.replace('/', '_')}"
        _upload(s3, tiny_model_dir, prefix, {key: b"xx"})
        with pytest.raises(ModelSourceError, match=f"key '{key}' has an empty path segment") as e:
            import_model(f"s3://{BUCKET}/{prefix}", store, cache_dir=tmp_path / "cache")
        assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- truncated sampling and the IS ratio


@pytest.mark.slow
def test_under_top_p_the_engine_records_the_untruncated_models_logprobs(tiny_model_dir, tiny_tokenizer):
    """Item 8: with ``rollout.top_p`` < 1 vLLM can report the log-probs of the truncated, renormalised
    distribution (TRL issue 6789), which would bias the mismatch figures and the IS weights by the kept mass. rlcr
    samples with ``raw_logprobs``: at top_p 0.3 every recorded log-prob is the untruncated model's (what the
    trainer computes, |Δ| < 1e-3), far from the renormalised one (−log kept mass ≈ 1 nat here); an engine set to
    another mode is refused at the sampling call, in one line. The first half passed before (the default mode); the
    refusal failed before (nothing checked the mode, so a processed engine's log-probs entered the update)."""
    import gc

    from rlcr.models.chat import render_prompt
    from rlcr.rollout.engine import create_engine
    from rlcr.rollout.sampling import sample
    from rlcr.tasks.countdown import generate_tasks, turn1_messages
    from test_rollout import tiny_cfg

    top_p = 0.3
    llm = create_engine(tiny_model_dir, tiny_cfg(tiny_model_dir, "unused"), seed=5)
    try:
        prompts = [render_prompt(tiny_tokenizer, turn1_messages(t))[1] for t in generate_tasks(3, seed=2)]
        outs = sample(llm, prompts, n=2, temperature=1.0, top_p=top_p, max_tokens=16,
                      seeds=[[10 * i, 10 * i + 1] for i in range(3)])
        config = llm.llm_engine.model_config
        config.logprobs_mode = "processed_logprobs"
        try:
            with pytest.raises(ValueError, match="'processed_logprobs' log-probs; rlcr records 'raw_logprobs'") as e:
                sample(llm, prompts[:1], n=1, temperature=1.0, top_p=top_p, max_tokens=4, seeds=[[1]])
            message = str(e.value)
            del e  # its traceback holds the engine (sample's frame): the engine must go with `del llm` below
            assert "\n" not in message
        finally:
            config.logprobs_mode = "raw_logprobs"
    finally:
        del llm
        gc.collect()
    lm = load_lm(tiny_model_dir)
    deltas, kept = [], []
    for prompt, samples in zip(prompts, outs):
        for s in samples:
            ids = torch.tensor([list(prompt) + s.completion_ids])
            with torch.no_grad():
                logp = torch.log_softmax(lm(ids).logits[0, len(prompt) - 1:-1].double(), dim=-1)
            for t, (tok, engine_lp) in enumerate(zip(s.completion_ids, s.completion_logprobs)):
                probs = logp[t].exp().sort(descending=True).values
                mass = float(probs[:int((probs.cumsum(0) < top_p).sum()) + 1].sum())  # vLLM's nucleus
                deltas.append(abs(float(logp[t, tok]) - engine_lp))
                kept.append(mass)
    assert len(deltas) > 20 and max(deltas) < 1e-3, max(deltas)
    assert min(-math.log(m) for m in kept) > 0.5  # the renormalised log-probs would be off by this much
