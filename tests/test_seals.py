"""A seal (``_COMPLETE``) is input from outside: every field is checked before it names a path, a download
fetches exactly the files it lists, and the checkpoint cache never replaces what it did not write.
Local stores and a real S3 endpoint (moto)."""

import hashlib
import json
import os

import pytest

from rlcr.storage import (
    COMPLETE_MARKER,
    MAX_SEAL_BYTES,
    InvalidSeal,
    StorageError,
    Store,
    checkpoint_content_id,
    fetch_checkpoint,
    parse_seal,
)
from s3server import BUCKET

GOOD_ID = "0123456789abcdef0123456789abcdef"


def checkpoint_dir(path, weights: str = "w"):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_text(weights)
    return path


def seal_bytes(content_id=GOOD_ID, files=None, **extra) -> bytes:
    doc = {"content_id": content_id, "files": {"config.json": 2, "model.safetensors": 1} if files is None else files}
    doc.update(extra)
    return json.dumps(doc).encode()


def a_home_with_secrets(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret key")
    return home


def test_a_hostile_content_id_cannot_replace_a_directory_outside_the_s3_cache(s3, tmp_path):
    """Issue 30 item 1: ``content_id: "/../../../../.ssh"`` once made fetch_checkpoint replace ``~/.ssh``."""
    store = Store(f"s3://{BUCKET}/hostile-id", endpoint_url=s3.endpoint)
    uri = store.put_dir(checkpoint_dir(tmp_path / "src"), "ck")
    s3.client().put_object(Bucket=BUCKET, Key=f"hostile-id/ck/{COMPLETE_MARKER}",
                           Body=seal_bytes("/../../../../.ssh"))
    home = a_home_with_secrets(tmp_path)
    cache = home / ".cache" / "rlcr" / "checkpoints"
    with pytest.raises(InvalidSeal, match=r"content_id .* is not 32 lowercase hex digits") as err:
        fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=cache)
    assert "hostile-id/ck/_COMPLETE" in str(err.value) and "\n" not in str(err.value)
    assert sorted(p.name for p in (home / ".ssh").iterdir()) == ["id_ed25519"]
    assert (home / ".ssh" / "id_ed25519").read_text() == "secret key"
    assert not cache.exists() or not any(cache.iterdir())


def test_a_hostile_file_list_cannot_write_outside_the_s3_cache(s3, tmp_path):
    store = Store(f"s3://{BUCKET}/hostile-files", endpoint_url=s3.endpoint)
    uri = store.put_dir(checkpoint_dir(tmp_path / "src"), "ck")
    s3.client().put_object(Bucket=BUCKET, Key="hostile-files/ck/../../../evil.txt", Body=b"pwned")
    s3.client().put_object(Bucket=BUCKET, Key=f"hostile-files/ck/{COMPLETE_MARKER}",
                           Body=seal_bytes(files={"config.json": 2, "../../../evil.txt": 5}))
    cache = tmp_path / "a" / "b" / "cache"
    with pytest.raises(InvalidSeal, match="outside"):
        fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=cache)
    assert not list(tmp_path.rglob("evil.txt"))
    assert not cache.exists() or not any(cache.iterdir())


def test_files_the_seal_does_not_list_are_not_downloaded(store, tmp_path):
    """Exactly the listed files arrive: a key slipped in next to a sealed checkpoint stays in the store."""
    store.put_dir(checkpoint_dir(tmp_path / "src"), "ck")
    store.write_bytes("ck/extra.py", b"import os; os.system('pwned')")
    store.write_bytes("ck/sub/more.bin", b"x")
    got = store.get_dir("ck", tmp_path / "out")
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*")) == [
        COMPLETE_MARKER, "config.json", "model.safetensors"]
    assert (got / COMPLETE_MARKER).read_bytes() == store.read_seal("ck")


def test_a_hostile_seal_in_a_local_store_is_refused_everywhere(tmp_path):
    """Store.content_id / read_seal / get_dir and checkpoint_content_id (what the engine calls on a local
    checkpoint) all check the seal before using it, and leave the destination as it was."""
    store = Store(str(tmp_path / "store"))
    store.put_dir(checkpoint_dir(tmp_path / "src"), "ck")
    hostile = seal_bytes("/../../../../.ssh")
    store.write_bytes(f"ck/{COMPLETE_MARKER}", hostile)
    assert store.read_seal("ck") == hostile  # raw bytes, checked by whoever uses them
    with pytest.raises(InvalidSeal, match=r"ck/_COMPLETE: content_id"):
        store.content_id("ck")
    dest = checkpoint_dir(tmp_path / "dest", "mine")
    with pytest.raises(InvalidSeal):
        store.get_dir("ck", dest)
    assert (dest / "model.safetensors").read_text() == "mine"
    with pytest.raises(InvalidSeal, match="content_id"):
        checkpoint_content_id(store.url("ck"))
    store.write_bytes(f"ck/{COMPLETE_MARKER}", seal_bytes(files={"config.json": 2, "/etc/passwd": 1}))
    with pytest.raises(InvalidSeal, match="is absolute"):
        store.get_dir("ck", dest)
    assert (dest / "model.safetensors").read_text() == "mine"


def test_a_local_store_link_leading_out_of_the_checkpoint_is_not_followed(tmp_path):
    store = Store(str(tmp_path / "store"))
    store.put_dir(checkpoint_dir(tmp_path / "src"), "ck")
    (tmp_path / "secret").write_text("s")
    ck = tmp_path / "store" / "ck"
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors").symlink_to(tmp_path / "secret")
    with pytest.raises(StorageError, match="outside"):
        store.get_dir("ck", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_oversized_seal_is_refused_without_reading_it_all(store, tmp_path):
    store.write_bytes(f"ck/{COMPLETE_MARKER}", b" " * (MAX_SEAL_BYTES + 10) + seal_bytes())
    with pytest.raises(InvalidSeal, match="more than"):
        store.read_seal("ck")
    with pytest.raises(InvalidSeal, match="more than"):
        store.content_id("ck")


@pytest.mark.parametrize("doc, problem", [
    ({"content_id": "/../../../../.ssh"}, "32 lowercase hex"),
    ({"content_id": GOOD_ID.upper()}, "32 lowercase hex"),
    ({"content_id": GOOD_ID + "0"}, "32 lowercase hex"),
    ({"content_id": "legacy-0123456789abcdef"}, "32 lowercase hex"),
    ({"content_id": 7}, "'content_id' must be str"),
    ({"files": None}, "'files' must be dict"),
    ({"files": ["config.json"]}, "'files' must be dict"),
    ({"files": {"../x": 1}}, "outside"),
    ({"files": {"a/../../x": 1}}, "outside"),
    ({"files": {"/abs": 1}}, "absolute"),
    ({"files": {"a//b": 1}}, "empty"),
    ({"files": {"a/./b": 1}}, "empty or '.'"),
    ({"files": {"a/": 1}}, "empty"),
    ({"files": {"": 1}}, "non-empty"),
    ({"files": {"a\\..\\..\\x": 1}}, "backslash"),
    ({"files": {"a\nb": 1}}, "control"),
    ({"files": {"a\x1b[31mb": 1}}, "control"),
    ({"files": {"x" * 2000: 1}}, "longer than"),
    ({"files": {"a/" + "y" * 300: 1}}, "segment longer"),
    ({"files": {COMPLETE_MARKER: 1}}, "seal itself"),
    ({"files": {"a": 1, "a/b": 1}}, "file and as a directory"),
    ({"files": {"a": -1}}, "int in"),
    ({"files": {"a": 1.5}}, "int in"),
    ({"files": {"a": True}}, "int in"),
    ({"files": {"a": "1"}}, "int in"),
    ({"files": {"a": 2 ** 80}}, "int in"),
    ({"files": {f"f{i}": 1 for i in range(100_001)}}, "more than"),
    ({"sealed_at": "yesterday"}, "'sealed_at' must be float"),
])
def test_parse_seal_checks_every_field(doc, problem):
    full = {"content_id": GOOD_ID, "files": {"config.json": 2}, **doc}
    with pytest.raises(InvalidSeal, match=problem) as err:
        parse_seal(json.dumps(full).encode(), "s3://b/ck/_COMPLETE")
    assert str(err.value).startswith("s3://b/ck/_COMPLETE: ") and "\n" not in str(err.value)


@pytest.mark.parametrize("data, problem", [
    (b"ok", "not valid JSON.*write the directory again"),
    (b"", "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[" * 10_000, "nested deeper"),
    (b'["content_id"]', "expected a JSON object"),
    (b'{"content_id": "' + GOOD_ID.encode() + b'"}', "'files' is missing"),
    (b'{"files": {}}', "'content_id' is missing"),
])
def test_parse_seal_refuses_what_is_not_a_seal(data, problem):
    with pytest.raises(InvalidSeal, match=problem):
        parse_seal(data, "ck/_COMPLETE")


def test_parse_seal_accepts_what_put_dir_writes(tmp_path):
    store = Store(str(tmp_path / "store"))
    src = checkpoint_dir(tmp_path / "src")
    (src / "tokenizer").mkdir()
    (src / "tokenizer" / "vocab file (1).json").write_text("{}")
    store.put_dir(src, "ck")
    seal = parse_seal(store.read_seal("ck"), "ck")
    assert len(seal["content_id"]) == 32 and isinstance(seal["sealed_at"], float)
    assert seal["files"] == {"config.json": 2, "model.safetensors": 1, "tokenizer/vocab file (1).json": 2}
    assert checkpoint_content_id(store.url("ck")) == store.content_id("ck") == seal["content_id"]


def test_the_cache_never_replaces_an_entry_it_did_not_write(s3, tmp_path):
    """Whatever sits at a cache entry's name without a seal (a link to elsewhere, a file) is refused, not moved."""
    store = Store(f"s3://{BUCKET}/squatted", endpoint_url=s3.endpoint)
    uri = store.put_dir(checkpoint_dir(tmp_path / "src"), "ck")
    cache = tmp_path / "cache"
    cache.mkdir()
    name = f"{hashlib.sha256(uri.encode()).hexdigest()[:20]}-{store.content_id('ck')[:24]}"
    home = a_home_with_secrets(tmp_path)
    (cache / name).symlink_to(home / ".ssh")
    with pytest.raises(StorageError, match="refusing to replace"):
        fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=cache)
    assert (cache / name).is_symlink() and os.readlink(cache / name) == str(home / ".ssh")
    assert sorted(p.name for p in (home / ".ssh").iterdir()) == ["id_ed25519"]
    (cache / name).unlink()
    (cache / name).write_text("not a directory")
    with pytest.raises(StorageError, match="refusing to replace"):
        fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=cache)
    assert (cache / name).read_text() == "not a directory"
    (cache / name).unlink()
    got = fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=cache)
    assert got == cache / name and (got / "model.safetensors").read_text() == "w"
