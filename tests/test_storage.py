"""The artifact store: content-aware checkpoint cache, confined paths, exclusive and versioned writes,
temporaries of killed writers, durable local writes. Local directories and a real S3 endpoint (moto)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlcr.runs.layout import RunLayout
from rlcr.storage import (
    COMPLETE_MARKER,
    HOST_ID,
    AlreadyExists,
    StorageError,
    Store,
    VersionConflict,
    fetch_checkpoint,
    sweep_temporaries,
    validate_run_id,
)
from s3server import BUCKET


def checkpoint_dir(path, weights: str):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_text(weights)
    return path


def test_rewritten_checkpoint_is_fetched_again_not_served_from_cache(s3, tmp_path):
    """Same URI written twice (an iteration re-run, a repeated `rlcr sft`): the second fetch sees the new weights."""
    store = Store(f"s3://{BUCKET}/stale", endpoint_url=s3.endpoint)
    uri = store.put_dir(checkpoint_dir(tmp_path / "a", "old weights"), "runs/r/iter-0001/checkpoint")
    cache = tmp_path / "cache"
    first = fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=cache)
    assert (first / "model.safetensors").read_text() == "old weights"
    store.put_dir(checkpoint_dir(tmp_path / "b", "new weights"), "runs/r/iter-0001/checkpoint")
    second = fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=cache)
    assert (second / "model.safetensors").read_text() == "new weights"
    assert first != second and (first / "model.safetensors").read_text() == "old weights"  # never modified in place
    assert fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=cache) == second  # cached while unchanged


def test_seal_lists_files_and_a_fresh_content_id(store, tmp_path):
    src = checkpoint_dir(tmp_path / "src", "w")
    store.put_dir(src, "ck")
    first = store.content_id("ck")
    seal = json.loads(store.read_bytes(f"ck/{COMPLETE_MARKER}"))
    assert seal["files"] == {"config.json": 2, "model.safetensors": 1}
    store.put_dir(src, "ck")
    assert store.content_id("ck") != first


def test_download_ignores_a_key_that_escapes_its_destination(s3, tmp_path):
    """A key with ``..`` that the seal does not list is never downloaded (a listed one: see test_seals.py)."""
    store = Store(f"s3://{BUCKET}/escape", endpoint_url=s3.endpoint)
    uri = store.put_dir(checkpoint_dir(tmp_path / "src", "w"), "ck")
    s3.client().put_object(Bucket=BUCKET, Key="escape/ck/../../../evil.txt", Body=b"pwned")
    cache = tmp_path / "a" / "b" / "cache"
    got = fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=cache)
    assert sorted(p.name for p in got.iterdir()) == [COMPLETE_MARKER, "config.json", "model.safetensors"]
    assert not [p for p in tmp_path.rglob("evil.txt")]


def test_download_checks_the_files_the_seal_lists(s3, tmp_path):
    store = Store(f"s3://{BUCKET}/partial", endpoint_url=s3.endpoint)
    uri = store.put_dir(checkpoint_dir(tmp_path / "src", "weights"), "ck")
    s3.client().delete_object(Bucket=BUCKET, Key="partial/ck/model.safetensors")
    with pytest.raises(StorageError, match="model.safetensors"):
        fetch_checkpoint(uri, endpoint_url=s3.endpoint, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("run_id", ["../../x", "a/b", "..", ".hidden", "", "x" * 129, "trailing.", "tab\tid",
                                    "new\nline"])
def test_invalid_run_ids_are_refused(run_id):
    with pytest.raises(ValueError, match="invalid run id"):
        validate_run_id(run_id)
    with pytest.raises(ValueError, match="invalid run id"):
        RunLayout.iteration_dir_of(run_id, 1)


@pytest.mark.parametrize("run_id", ["demo", "lr=1e-5", "exp 1", "run-20261123-120000-ab12cd", "A.b_c+d,e@f"])
def test_valid_run_ids(run_id):
    assert validate_run_id(run_id) == run_id


def test_store_paths_cannot_climb_out(store):
    with pytest.raises(StorageError, match="not allowed"):
        store.write_bytes("runs/../../outside.json", b"x")
    with pytest.raises(StorageError):
        store.rel(store.uri + "-sibling/x")


def test_exclusive_write_refuses_an_existing_object(store):
    store.write_bytes("runs/r/manifest.json", b"first", exclusive=True)
    with pytest.raises(AlreadyExists):
        store.write_bytes("runs/r/manifest.json", b"second", exclusive=True)
    assert store.read_bytes("runs/r/manifest.json") == b"first"
    import pyarrow as pa

    store.write_parquet("rows.parquet", pa.table({"x": [1]}), exclusive=True)
    with pytest.raises(AlreadyExists):
        store.write_parquet("rows.parquet", pa.table({"x": [2]}), exclusive=True)
    assert store.read_parquet("rows.parquet").column("x").to_pylist() == [1]


def test_versioned_write_is_a_compare_and_swap(store):
    store.write_bytes("lease.json", b"one", exclusive=True)
    data, v1 = store.read_versioned("lease.json")
    assert data == b"one"
    store.write_if_version("lease.json", b"two", v1)
    with pytest.raises(VersionConflict):
        store.write_if_version("lease.json", b"three", v1)  # someone else's write happened in between
    data, v2 = store.read_versioned("lease.json")
    assert data == b"two" and v2 != v1
    assert not store.delete_if_version("lease.json", v1)
    assert store.delete_if_version("lease.json", v2) and not store.exists("lease.json")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_of_dead_writers_are_swept(tmp_path):
    """Only this host's temporaries whose pid is gone; other hosts' and old-format names are left alone."""
    dead, live = _dead_pid(), os.getpid()
    litter = tmp_path / "runs" / "r" / "iter-0001" / f".checkpoint.tmp-{HOST_ID}-{dead}-abc"
    litter.mkdir(parents=True)
    (litter / "model.safetensors").write_bytes(b"0" * 1000)
    stray = tmp_path / "runs" / "r" / f".metrics.json.tmp-{HOST_ID}-{dead}-xyz"
    stray.write_text("{")
    mine = tmp_path / "runs" / "r" / f".checkpoint.tmp-{HOST_ID}-{live}-def"
    mine.mkdir()
    other_host = tmp_path / "runs" / "r" / f".checkpoint.tmp-{'0' * 12}-{dead}-ghi"
    other_host.mkdir()
    old_format = tmp_path / "runs" / "r" / f".checkpoint.tmp-{dead}-jkl"
    old_format.mkdir()
    keep = tmp_path / "runs" / "r" / ".hidden-by-user"
    keep.mkdir()
    removed = Store(str(tmp_path)).sweep_temporaries("runs/r")
    assert sorted(removed) == sorted([litter, stray])
    assert not litter.exists() and not stray.exists() and mine.exists() and keep.exists()
    assert other_host.exists() and old_format.exists()
    assert sweep_temporaries(tmp_path / "missing") == []


def test_another_hosts_download_in_progress_is_not_swept_from_a_shared_cache(tmp_path):
    """Issue 30 item 9: a pid is only meaningful on its own host. A writer of another host (simulated: a
    process with another host id) killed, or just unknown here, keeps its temporary; one of this host goes."""
    code = """
import os, signal, sys
import rlcr.storage.local as s  # the module whose temporaries carry the host id
if sys.argv[2] != "this":
    s.HOST_ID = sys.argv[2]
with s.atomic_directory(sys.argv[1]) as tmp:
    (tmp / "model.safetensors").write_bytes(b"half")
    os.kill(os.getpid(), signal.SIGKILL)
"""
    cache = tmp_path / "shared-cache"
    for who, entry in (("feedfacecafe", "a"), ("this", "b")):
        proc = subprocess.run([sys.executable, "-c", code, str(cache / entry), who], capture_output=True)
        assert proc.returncode == -9, proc.stderr
    before = sorted(p.name for p in cache.iterdir())
    assert len(before) == 2 and all(".tmp-" in n for n in before)
    removed = sweep_temporaries(cache, max_depth=0)
    assert [p.name for p in removed] == [n for n in before if n.startswith(".b.")]
    left = [p for p in cache.iterdir()]
    assert [p.name for p in left] == [n for n in before if n.startswith(".a.")]
    assert (left[0] / "model.safetensors").read_bytes() == b"half"


@pytest.fixture
def linked_checkpoint(tmp_path):
    """A checkpoint whose tokenizer directory and one weight file are symbolic links."""
    src = checkpoint_dir(tmp_path / "src", "w")
    shared = tmp_path / "shared-tokenizer"
    (shared / "nested").mkdir(parents=True)
    (shared / "tokenizer.json").write_text('{"v": 1}')
    (shared / "nested" / "merges.txt").write_text("a b")
    (src / "tokenizer").symlink_to(shared, target_is_directory=True)
    (tmp_path / "extra.bin").write_bytes(b"12345")
    (src / "extra.bin").symlink_to(tmp_path / "extra.bin")
    return src


def test_put_dir_copies_the_content_of_symbolic_links(store, linked_checkpoint, tmp_path):
    """Issue 30 item 9: a symlinked ``tokenizer/`` was left out of the checkpoint and its seal."""
    store.put_dir(linked_checkpoint, "ck")
    seal = json.loads(store.read_seal("ck"))
    assert seal["files"] == {"config.json": 2, "extra.bin": 5, "model.safetensors": 1,
                             "tokenizer/nested/merges.txt": 3, "tokenizer/tokenizer.json": 8}
    got = store.get_dir("ck", tmp_path / "out")
    assert (got / "tokenizer" / "nested" / "merges.txt").read_text() == "a b"
    assert not (got / "tokenizer").is_symlink() and not (got / "extra.bin").is_symlink()
    assert (got / "extra.bin").read_bytes() == b"12345"


def test_put_dir_refuses_a_dangling_link(store, tmp_path):
    src = checkpoint_dir(tmp_path / "src", "w")
    (src / "tokenizer.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(StorageError, match=re.escape(str(src / "tokenizer.json")) + ": a dangling symbolic link"):
        store.put_dir(src, "ck")
    assert not store.exists("ck") and not store.is_complete("ck")


@pytest.mark.parametrize("loop", ["parent", "self"])
def test_put_dir_refuses_a_symlink_loop(loop, tmp_path):
    src = checkpoint_dir(tmp_path / "src", "w")
    (src / "sub").mkdir()
    link = src / "sub" / "loop"
    link.symlink_to(src if loop == "parent" else link)
    store = Store(str(tmp_path / "store"))
    with pytest.raises(StorageError, match=re.escape(str(link)) + ": a symbolic link loop"):
        store.put_dir(src, "ck")
    assert not store.exists("ck")
    assert not [p for p in (tmp_path / "store").rglob("*") if ".tmp-" in p.name]


def test_put_dir_refuses_a_fifo(tmp_path):
    src = checkpoint_dir(tmp_path / "src", "w")
    os.mkfifo(src / "pipe")
    with pytest.raises(StorageError, match="neither a file nor a directory"):
        Store(str(tmp_path / "store")).put_dir(src, "ck")


def test_a_killed_upload_leaves_only_sweepable_litter(tmp_path):
    """SIGKILL a process in the middle of copying a checkpoint: nothing at the destination, litter swept."""
    src = checkpoint_dir(tmp_path / "src", "w" * 10)
    for i in range(200):
        (src / f"shard-{i}.bin").write_bytes(os.urandom(20_000))
    code = f"""
import os, signal, shutil
import rlcr.storage as s
real = shutil.copy2
n = [0]
def copy(a, b, **k):
    n[0] += 1
    if n[0] == 50:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(a, b, **k)
s.shutil.copy2 = copy
s.Store({str(tmp_path / 'store')!r}).put_dir({str(src)!r}, "runs/r/iter-0001/checkpoint")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert proc.returncode == -9
    parent = tmp_path / "store" / "runs" / "r" / "iter-0001"
    assert not (parent / "checkpoint").exists()
    assert [p.name for p in parent.iterdir() if ".tmp-" in p.name]  # litter of the killed writer
    Store(str(tmp_path / "store")).sweep_temporaries("runs/r")
    assert list(parent.iterdir()) == []


def test_local_writes_are_fsynced(tmp_path, monkeypatch):
    """A manifest and a sealed directory are fsynced (file and directory) before the call returns."""
    synced = []
    real = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store = Store(str(tmp_path / "store"))
    store.write_json("runs/r/iter-0001/manifest.json", {"k": 1}, exclusive=True)
    assert any("manifest.json" in p for p in synced)
    assert str(tmp_path / "store" / "runs" / "r" / "iter-0001") in synced
    synced.clear()
    store.put_dir(checkpoint_dir(tmp_path / "src", "w"), "runs/r/iter-0001/checkpoint")
    assert any(p.endswith("model.safetensors") for p in synced) and any(p.endswith(COMPLETE_MARKER) for p in synced)
    assert str(tmp_path / "store" / "runs" / "r" / "iter-0001") in synced


def test_a_written_directory_is_published_sealed_and_only_at_the_end(store, tmp_path):
    """``Store.writing_dir`` (how checkpoints are written): nothing at ``rel`` until the block ends, then the
    files sealed; an error in the block publishes nothing and leaves what was there. A local store hands out
    the checkpoint's own temp sibling (written once, renamed into place: nothing copied)."""
    store.put_dir(checkpoint_dir(tmp_path / "old", "old weights"), "ck")
    old_id = store.content_id("ck")
    with pytest.raises(RuntimeError, match="killed mid-write"):
        with store.writing_dir("ck") as d:
            checkpoint_dir(d, "half")
            raise RuntimeError("killed mid-write")
    assert store.content_id("ck") == old_id and store.read_bytes("ck/model.safetensors") == b"old weights"
    with store.writing_dir("ck") as d:
        checkpoint_dir(d, "new weights")
        (d / "sub").mkdir()
        (d / "sub" / "state.pt").write_bytes(b"x" * 10)
        assert store.read_bytes("ck/model.safetensors") == b"old weights"  # not yet published
        if store.is_local:
            assert d.parent == Path(store.url("ck")).parent and d.name.startswith(".")  # the store's own temp sibling
    seal = json.loads(store.read_bytes(f"ck/{COMPLETE_MARKER}"))
    assert seal["files"] == {"config.json": 2, "model.safetensors": 11, "sub/state.pt": 10}
    assert store.content_id("ck") != old_id and store.read_bytes("ck/model.safetensors") == b"new weights"
    assert fetch_checkpoint(store.url("ck"), endpoint_url=store.endpoint_url, cache_dir=tmp_path / "cache").is_dir()
