"""Any Hugging Face model as ``model`` (issue 32 item 5): a plain local directory, an s3:// directory rlcr did
not write, a hub id (offline here: a one-line error before anything starts), a tokenizer without a chat
template."""

import json
import shutil
import time

import pytest

from rlcr.models.source import ModelSourceError, check_model, import_model, local_digest, model_kind
from rlcr.storage import COMPLETE_MARKER, Store, fetch_checkpoint


@pytest.fixture
def plain_model(tiny_model_dir, tmp_path):
    """The tiny model as a user would have it: a plain directory, no rlcr seal."""
    d = tmp_path / "my-model"
    shutil.copytree(tiny_model_dir, d, ignore=shutil.ignore_patterns(COMPLETE_MARKER))
    return d


def test_the_four_kinds_of_model():
    assert model_kind("tiny") == "builtin" and model_kind("smollm2-135m-instruct") == "builtin"
    assert model_kind("s3://bucket/models/x") == "remote"
    assert model_kind("Qwen/Qwen2.5-0.5B-Instruct") == "hub"
    assert model_kind("./not-here") == "local"
    with pytest.raises(ModelSourceError, match="not a hub id"):
        model_kind("no such thing at all")


def test_a_hub_id_offline_is_one_line_before_anything_starts(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: as offline as it gets
    import importlib

    import huggingface_hub.constants as constants
    importlib.reload(constants)
    try:
        t0 = time.monotonic()
        with pytest.raises(ModelSourceError) as e:
            check_model("Qwen/Qwen2.5-0.5B-Instruct", hub_timeout_s=2)
        assert time.monotonic() - t0 < 10
        msg = str(e.value)
        assert "\n" not in msg and "cannot be reached" in msg and "model.name=DIR" in msg
    finally:
        monkeypatch.delenv("HF_ENDPOINT")
        importlib.reload(constants)


def test_a_plain_local_directory_is_sealed_into_the_store_by_content(plain_model, tmp_path):
    store = Store(str(tmp_path / "store"))
    uri = import_model(str(plain_model), store, cache_dir=tmp_path / "cache")
    assert uri.startswith(store.url("models/")) and store.is_complete(store.rel(uri))
    sealed_at = store.parse_seal(store.rel(uri))["sealed_at"]
    assert import_model(str(plain_model), store, cache_dir=tmp_path / "cache") == uri  # no second copy
    assert store.parse_seal(store.rel(uri))["sealed_at"] == sealed_at
    cfg = json.loads((plain_model / "config.json").read_text())
    cfg["rlcr_edit"] = 1
    (plain_model / "config.json").write_text(json.dumps(cfg))
    changed = import_model(str(plain_model), store, cache_dir=tmp_path / "cache")
    assert changed != uri  # a changed directory is a new model, never the stale copy
    local = fetch_checkpoint(changed)
    assert json.loads((local / "config.json").read_text())["rlcr_edit"] == 1


def test_the_digest_follows_content_not_timestamps(plain_model, tmp_path):
    d1 = local_digest(plain_model, cache_dir=tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(plain_model, copy)
    assert local_digest(copy, cache_dir=tmp_path) == d1
    (copy / "extra.txt").write_text("x")
    assert local_digest(copy, cache_dir=tmp_path) != d1


def test_a_directory_without_a_chat_template_needs_one_in_the_config(plain_model):
    (plain_model / "chat_template.jinja").unlink(missing_ok=True)
    tc = json.loads((plain_model / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (plain_model / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(ModelSourceError, match="no chat template"):
        check_model(str(plain_model))
    assert check_model(str(plain_model), chat_template="{{ messages }}") == "local"


@pytest.mark.parametrize("remove, message", [("config.json", "no config.json"),
                                             ("model.safetensors", "no weights")])
def test_a_local_directory_that_is_not_a_checkpoint_is_refused(plain_model, remove, message):
    (plain_model / remove).unlink()
    with pytest.raises(ModelSourceError, match=message):
        check_model(str(plain_model))


def test_an_unsealed_s3_directory_is_imported_and_sealed(plain_model, s3, tmp_path):
    from s3server import BUCKET

    theirs = Store(f"s3://{BUCKET}/someone-else", endpoint_url=s3.endpoint)
    for p in plain_model.iterdir():  # uploaded by hand, as any tool would: no seal
        theirs.fs.put_file(str(p), f"{theirs.root}/hf-model/{p.name}")
    assert not theirs.is_complete("hf-model")
    store = Store(f"s3://{BUCKET}/{tmp_path.name}", endpoint_url=s3.endpoint)
    uri = import_model(theirs.url("hf-model"), store, cache_dir=tmp_path / "cache")
    assert store.is_complete(store.rel(uri))
    local = fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=tmp_path / "ckpt")
    assert (local / "config.json").read_bytes() == (plain_model / "config.json").read_bytes()
    # a key no seal could name is refused, naming it
    theirs.fs.pipe_file(f"{theirs.root}/bad-model/config.json", b"{}")
    theirs.fs.pipe_file(f"{theirs.root}/bad-model/a\x01b", b"x")
    with pytest.raises(ModelSourceError, match="bad-model"):
        import_model(theirs.url("bad-model"), store, cache_dir=tmp_path / "cache")


def test_a_configured_chat_template_travels_with_the_imported_copy(plain_model, tmp_path):
    from transformers import AutoTokenizer

    (plain_model / "chat_template.jinja").unlink(missing_ok=True)
    tc = json.loads((plain_model / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (plain_model / "tokenizer_config.json").write_text(json.dumps(tc))
    store = Store(str(tmp_path / "store"))
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    uri = import_model(str(plain_model), store, chat_template=template, cache_dir=tmp_path / "cache")
    tok = AutoTokenizer.from_pretrained(fetch_checkpoint(uri))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<user>hi"
    other = import_model(str(plain_model), store, chat_template=template + " ", cache_dir=tmp_path / "cache")
    assert other != uri  # another template is another model copy


def test_smollm2_from_a_plain_directory_is_imported_and_renders_its_chat(smollm2_dir, tmp_path):
    """The real model as a user would download it: a plain Hugging Face directory, no rlcr seal."""
    from transformers import AutoTokenizer

    plain = tmp_path / "SmolLM2-135M-Instruct"
    shutil.copytree(smollm2_dir, plain, ignore=shutil.ignore_patterns(COMPLETE_MARKER))
    assert check_model(str(plain)) == "local"
    store = Store(str(tmp_path / "store"))
    uri = import_model(str(plain), store, cache_dir=tmp_path / "cache")
    local = fetch_checkpoint(uri)
    assert (local / "model.safetensors").read_bytes() == (plain / "model.safetensors").read_bytes()
    text = AutoTokenizer.from_pretrained(local).apply_chat_template([{"role": "user", "content": "2+2?"}],
                                                                    tokenize=False)
    assert "2+2?" in text and "<|im_start|>" in text


@pytest.fixture
def stand_in_hub(plain_model, tmp_path, monkeypatch):
    """A stand-in hub on 127.0.0.1 serving the tiny model as ``org/tiny`` (``HF_ENDPOINT``), with a fresh
    ``HF_HOME``."""
    import importlib

    import huggingface_hub.constants as constants

    from hubserver import HubServer

    with HubServer({"org/tiny": plain_model}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        importlib.reload(constants)
        try:
            yield hub
        finally:
            monkeypatch.undo()
            importlib.reload(constants)


def test_a_hub_id_is_imported_following_the_links_into_its_cache(stand_in_hub, plain_model, tmp_path):
    """``snapshot_download`` gives a folder of links into the hub cache's ``blobs/``: they are followed, and the
    store's copy holds the files themselves, named by the same content digest as the plain directory."""
    assert check_model("org/tiny") == "hub"
    store = Store(str(tmp_path / "store"))
    uri = import_model("org/tiny", store, cache_dir=tmp_path / "cache")
    assert any(r.startswith("GET /org/tiny/resolve/") for r in stand_in_hub.requests)
    snapshots = list((tmp_path / "cache" / "hub").glob("models--org--tiny/snapshots/*"))
    assert snapshots and (snapshots[0] / "config.json").is_symlink()  # what the hub cache really holds
    local = fetch_checkpoint(uri)
    assert not (local / "model.safetensors").is_symlink()
    assert (local / "model.safetensors").read_bytes() == (plain_model / "model.safetensors").read_bytes()
    assert uri == import_model(str(plain_model), store, cache_dir=tmp_path / "cache")  # same content, same copy


def test_a_hub_snapshot_link_leading_outside_the_hub_cache_is_refused(stand_in_hub, tmp_path):
    import_model("org/tiny", Store(str(tmp_path / "store")), cache_dir=tmp_path / "cache")
    snapshot = next((tmp_path / "cache" / "hub").glob("models--org--tiny/snapshots/*"))
    outside = tmp_path / "elsewhere.json"
    outside.write_text((snapshot / "config.json").read_text())
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(outside)  # a tampered cache: the link leads out of it
    with pytest.raises(ModelSourceError) as e:
        import_model("org/tiny", Store(str(tmp_path / "store2")), cache_dir=tmp_path / "cache")
    msg = str(e.value)
    assert "\n" not in msg and "config.json" in msg and "outside the hub cache" in msg
