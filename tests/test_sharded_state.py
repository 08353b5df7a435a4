"""AdamW's state saved by shard (rlcr/train/sharded_state.py, docs/design.md §11) and the store's directory that
several processes write (rlcr.storage.Store.open_shared … seal_shared), without Ray: the files a sharded save writes
are read back whole or into another model's layout, and everything in them is checked as input from outside.
The sharded save itself, by two FSDP workers, is in tests/test_fsdp.py."""

import os
import pickle

import pytest
import torch

from rlcr.storage import StorageError
from rlcr.train import sharded_state
from rlcr.train.sharded_state import CheckedReader, load_optimizer_shards, read_optimizer_shards


# ----------------------------------------------------------------------------- a directory several writers fill
def test_a_shared_directory_is_sealed_with_every_writers_part_and_not_before(store, tmp_path):
    """Two writers' parts and a third's top-level files, sealed as one directory; a reader sees the old sealed one
    (local) or none (S3) until the seal; a seal that lists a part not written publishes nothing."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "weights").write_bytes(b"old")
    store.put_dir(old, "ckpt")
    old_id = store.content_id("ckpt")

    where = store.open_shared("ckpt")
    files: dict[str, int] = {}
    for rank in (0, 1):
        checks = []
        with store.shared_part(where, "optimizer", before_upload=lambda c=checks, r=rank: c.append(r)) as part:
            (part.dir / f"__{rank}_0.distcp").write_bytes(b"x" * (10 + rank))
            if rank == 0:
                (part.dir / ".metadata").write_bytes(b"m")
        mine = {"optimizer/__0_0.distcp": 10, "optimizer/.metadata": 1} if rank == 0 else {"optimizer/__1_0.distcp": 11}
        assert mine.items() <= part.files.items() and (store.is_local or part.files == mine)  # local: one folder
        assert checks == ([] if store.is_local else [rank])  # S3: the lease is checked before each upload
        files.update(part.files)
    # nothing new is readable yet: the old checkpoint stays whole (local), or there is none (S3: unsealed)
    if store.is_local:
        assert store.content_id("ckpt") == old_id
    else:
        assert store.read_seal("ckpt") is None
    with store.shared_part(where, "") as part:
        (part.dir / "weights").write_bytes(b"new")
    assert "weights" in part.files
    with pytest.raises(StorageError, match="not"):
        store.seal_shared("ckpt", where, {**files, **part.files, "optimizer/__2_0.distcp": 12})
    uri = store.seal_shared("ckpt", where, {**files, **part.files})
    assert uri == store.url("ckpt") and store.content_id("ckpt") != old_id
    got = store.get_dir("ckpt", tmp_path / "got")
    assert (got / "weights").read_bytes() == b"new" and (got / "optimizer" / "__1_0.distcp").read_bytes() == b"x" * 11
    assert sorted(store.parse_seal("ckpt")["files"]) == sorted({**files, "weights": 3})


def test_an_abandoned_shared_directory_leaves_the_old_one_and_no_temporary(tmp_path):
    from rlcr.storage import Store

    store = Store(str(tmp_path / "store"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "w").write_bytes(b"1")
    store.put_dir(src, "runs/r/ckpt")
    where = store.open_shared("runs/r/ckpt")
    with store.shared_part(where, "optimizer") as part:
        (part.dir / "__0_0.distcp").write_bytes(b"half")
    store.abandon_shared(where)
    assert sorted(os.listdir(tmp_path / "store" / "runs" / "r")) == ["ckpt"]
    assert store.get_dir("runs/r/ckpt", tmp_path / "got").joinpath("w").read_bytes() == b"1"
    with pytest.raises(StorageError, match="not a shared directory"):
        store.shared_part(str(tmp_path / "elsewhere"), "x").__enter__()


# ----------------------------------------------------------------------------- AdamW by shard, read back
def _trained(shape=(6, 4), seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(shape[1], shape[0]), torch.nn.Linear(shape[0], 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        model(torch.randn(5, shape[1])).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


@pytest.fixture
def saved(tmp_path):
    """AdamW's state after three steps, written by DCP as one rank writes it (no process group)."""
    import torch.distributed.checkpoint as dcp

    model, opt = _trained()
    d = tmp_path / "optimizer"
    dcp.save(sharded_state.optimizer_shards(model, opt), storage_writer=dcp.FileSystemWriter(str(d)), no_dist=True)
    return d, model, opt


def test_the_shards_restore_adamw_exactly_and_refuse_another_model(saved):
    d, model, opt = saved
    whole = read_optimizer_shards(d)
    assert float(whole["optimizer.state.0.weight.step"]) == 3
    assert torch.equal(whole["optimizer.state.0.weight.exp_avg"], opt.state[model[0].weight]["exp_avg"])
    assert whole["optimizer.param_groups.0.betas"] == (0.9, 0.999)

    fresh, fresh_opt = _trained(seed=1)  # same shapes, other moments: restored to the saved ones
    load_optimizer_shards(fresh, fresh_opt, d)
    for p, q in zip(model.parameters(), fresh.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], fresh_opt.state[q][key]), key

    other, other_opt = _trained(shape=(8, 4))  # a layer of another width: refused, not half-restored
    with pytest.raises(ValueError, match=r"optimizer: rank 0: ValueError: Size mismatch .*\[6, 4\].*\[8, 4\]"):
        load_optimizer_shards(other, other_opt, d)
    with pytest.raises(ValueError, match="over 100"):
        read_optimizer_shards(d, max_bytes=100)


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_the_metadata_is_read_as_input_from_outside(saved, monkeypatch):
    """DCP's ``.metadata`` is a pickle: only DCP's own classes are built, every entry must point at a shard file of
    the folder by a plain name, and it is read within a size limit; each refusal is one line naming the file."""
    d, _, _ = saved
    md = CheckedReader(d).read_metadata()
    meta = d / ".metadata"

    meta.write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(ValueError, match=r"optimizer/\.metadata: not DCP metadata .*system, not a class"):
        CheckedReader(d).read_metadata()
    meta.write_bytes(pickle.dumps({"not": "metadata"}))
    with pytest.raises(ValueError, match="not DCP metadata"):
        CheckedReader(d).read_metadata()

    index, info = next(iter(md.storage_data.items()))
    for bad in ("../../etc/passwd", "/etc/passwd", "__0_0.distcp/../x", "x.distcp"):
        md.storage_data[index] = type(info)(relative_path=bad, offset=info.offset, length=info.length)
        meta.write_bytes(pickle.dumps(md))
        with pytest.raises(ValueError, match="points outside this folder's shard files"):
            CheckedReader(d, "s3://b/ckpt/optimizer").read_metadata()
    md.storage_data[index] = info
    meta.write_bytes(pickle.dumps(md))
    assert CheckedReader(d).read_metadata().state_dict_metadata.keys() == md.state_dict_metadata.keys()

    # chunks that do not cover a tensor exactly once (none: a silent zero moment; one repeated: unbounded plans)
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    key = "optimizer.state.0.weight.exp_avg"
    entry = md.state_dict_metadata[key]
    for chunks in ([], entry.chunks * 3000):
        md.state_dict_metadata[key] = type(entry)(properties=entry.properties, size=entry.size, chunks=chunks)
        meta.write_bytes(pickle.dumps(md))
        with pytest.raises(ValueError, match="chunks of entry .*exp_avg.* do not cover it exactly once"):
            CheckedReader(d).read_metadata()
    md.state_dict_metadata[key] = type(entry)(properties=entry.properties, size=torch.Size([6, 5]),
                                              chunks=entry.chunks)
    meta.write_bytes(pickle.dumps(md))
    with pytest.raises(ValueError, match="do not cover it"):
        CheckedReader(d).read_metadata()
    md.state_dict_metadata[key] = entry

    # a tensor recorded as an object would skip DCP's size check
    md.state_dict_metadata[key] = BytesStorageMetadata()
    md.storage_data[type(index)(fqn=key)] = next(v for k, v in md.storage_data.items() if k.fqn == key)
    meta.write_bytes(pickle.dumps(md))
    model, opt = _trained()
    with pytest.raises(ValueError, match="exp_avg is a tensor here but not in the checkpoint"):
        load_optimizer_shards(model, opt, d)
    md.state_dict_metadata[key] = entry
    meta.write_bytes(pickle.dumps(md))

    # the shard file itself: a link (to a FIFO, /dev/zero …) or a file shorter than the metadata says
    shard = d / "__0_0.distcp"
    data = shard.read_bytes()
    shard.unlink()
    shard.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"__0_0\.distcp: not a regular file"):
        CheckedReader(d).read_metadata()
    shard.unlink()
    shard.write_bytes(data[:-1])
    with pytest.raises(ValueError, match=r"__0_0\.distcp: not a regular file of at least"):
        CheckedReader(d).read_metadata()
    shard.write_bytes(data)
    assert CheckedReader(d).read_metadata()

    monkeypatch.setattr(sharded_state, "MAX_METADATA_BYTES", 100)
    from rlcr.storage import RefusedFile

    with pytest.raises(RefusedFile, match=r"\.metadata"):
        CheckedReader(d).read_metadata()
