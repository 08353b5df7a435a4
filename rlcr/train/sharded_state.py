"""AdamW's state saved by shard (docs/design.md §11): under FSDP each rank writes its own shard of the optimizer's
moments with ``torch.distributed.checkpoint`` (DCP) into the checkpoint's :data:`OPTIMIZER_DIR` folder
(``__<rank>_0.distcp`` files and rank 0's ``.metadata``), so the full state (12 bytes a parameter: 84 GB for a
7B model) is never gathered on one rank. Any number of workers reads it back, sharded (FSDP) or whole (DDP):
DCP reads each rank's part of every tensor from the chunks it overlaps, so a checkpoint written by N workers
resumes with M.

The files are input from outside, like every checkpoint: :class:`CheckedReader` reads the ``.metadata`` (a pickle,
in DCP's format) with an unpickler that builds only DCP's own metadata classes, within
:data:`MAX_METADATA_BYTES`, and checks it before DCP plans anything from it: every tensor's chunks lie inside it
and cover it exactly once (at most :data:`MAX_CHUNKS` in all), every chunk and object is stored in a shard file of
this folder by a plain name, and each such file is a regular file (not a link) holding the bytes it is said to;
:class:`CheckedLoadPlanner` reads the non-tensor entries (the parameter groups) with ``weights_only``, as DCP
already reads the tensors, and refuses a tensor recorded as an object. A checkpoint that does not fit the model
(a parameter missing, a shape changed) is an error from :func:`load_optimizer_shards`, never a partial restore.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import stat
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from rlcr.models.weights import OPTIMIZER_DIR
from rlcr.storage.local import read_regular
from rlcr.untrusted import printable

__all__ = ["OPTIMIZER_DIR", "MAX_METADATA_BYTES", "optimizer_shards", "save_optimizer_shards",
           "load_optimizer_shards", "read_optimizer_shards", "CheckedReader", "CheckedLoadPlanner"]

MAX_METADATA_BYTES = 64 << 20
"""Largest DCP ``.metadata`` read (bytes): ~100 bytes an entry, so room for ~600k tensors' chunks."""
MAX_CHUNKS = 1 << 20
"""Most tensor chunks one ``.metadata`` may list (a 7B model's AdamW state on 1,024 ranks: ~600k)."""
MAX_PAIRWISE = 256
"""Most chunks of one tensor checked pairwise for overlap when they are not row slices."""
_SHARD_FILE = re.compile(r"__[0-9]{1,6}_[0-9]{1,6}\.distcp")

_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, ``torch.Size``, dtypes and layouts, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"names {printable(module, 80)}.{printable(name, 80)}, not a class of DCP's "
                                     f"metadata")


def _size(value: Any, dims: int | None = None) -> bool:
    """Whether ``value`` is a ``torch.Size`` of non-negative ints (of ``dims`` dimensions)."""
    return (isinstance(value, torch.Size) and all(type(d) is int and 0 <= d < 2 ** 48 for d in value)
            and (dims is None or len(value) == dims))


class CheckedReader(FileSystemReader):
    """DCP's file reader with the ``.metadata`` and the shard files checked before DCP uses them (module
    docstring); ``source`` names the folder in errors. The metadata is read and checked once per reader."""

    def __init__(self, path: str | Path, source: str | None = None):
        super().__init__(path)
        self.source = printable(source or str(path), 300)
        self._checked = None

    def read_metadata(self):  # no ``rank``: DCP's per-rank fallback would let ranks diverge
        from torch.distributed.checkpoint.metadata import StorageMeta

        if self._checked is None:
            self._checked = self._read_checked()
        self._checked.storage_meta = StorageMeta()
        self._checked.storage_meta.load_id = self.load_id
        return self._checked

    def _read_checked(self):
        """The metadata, refused in one line (ValueError naming the file) unless: only DCP's classes; every
        tensor a size of non-negative ints, in at most :data:`MAX_CHUNKS` chunks in all that lie inside it,
        overlap nowhere and cover it, each chunk and every object stored in a shard file of this folder by a
        plain name — a regular file, not a link, that holds the bytes it is said to hold."""
        from torch.distributed.checkpoint.filesystem import _StorageInfo
        from torch.distributed.checkpoint.metadata import (
            BytesStorageMetadata,
            ChunkStorageMetadata,
            Metadata,
            MetadataIndex,
            TensorStorageMetadata,
        )

        where = f"{self.source}/.metadata"
        data = read_regular(Path(self.path) / ".metadata", MAX_METADATA_BYTES, where)
        try:
            md = _MetadataUnpickler(io.BytesIO(data)).load()
        except Exception as e:  # noqa: BLE001 - any failure to decode is the file's fault
            raise ValueError(f"{where}: not DCP metadata ({type(e).__name__}: {printable(e, 200)})") from None
        if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict) \
                or not isinstance(md.storage_data, dict):
            raise ValueError(f"{where}: not DCP metadata (a {type(md).__name__})")

        files: dict[str, int] = {}  # shard file -> the end of the furthest entry in it
        stored: set[tuple[str, tuple[int, ...] | None]] = set()
        for index, info in md.storage_data.items():
            if not isinstance(index, MetadataIndex) or not isinstance(index.fqn, str) \
                    or not (index.offset is None or _size(index.offset)) or not isinstance(info, _StorageInfo) \
                    or not isinstance(info.relative_path, str) or not _SHARD_FILE.fullmatch(info.relative_path) \
                    or type(info.offset) is not int or type(info.length) is not int \
                    or info.offset < 0 or info.length < 0 or info.transform_descriptors:
                raise ValueError(f"{where}: entry {printable(repr(getattr(index, 'fqn', index)), 120)} points "
                                 f"outside this folder's shard files")
            files[info.relative_path] = max(files.get(info.relative_path, 0), info.offset + info.length)
            stored.add((index.fqn, None if index.offset is None else tuple(index.offset)))

        chunks_seen = 0
        for key, entry in md.state_dict_metadata.items():
            name = printable(repr(key), 120)
            if not isinstance(key, str):
                raise ValueError(f"{where}: entry {name} is not named by a string")
            if isinstance(entry, BytesStorageMetadata):
                if (key, None) not in stored:
                    raise ValueError(f"{where}: entry {name} is stored nowhere")
                continue
            if not isinstance(entry, TensorStorageMetadata) or not _size(entry.size) \
                    or not isinstance(getattr(entry.properties, "dtype", None), torch.dtype) \
                    or not isinstance(entry.chunks, list):
                raise ValueError(f"{where}: entry {name} is not a tensor's or an object's")
            chunks_seen += len(entry.chunks)
            if chunks_seen > MAX_CHUNKS:
                raise ValueError(f"{where}: more than {MAX_CHUNKS:,} chunks")
            boxes = []
            for chunk in entry.chunks:
                dims = len(entry.size)
                if not isinstance(chunk, ChunkStorageMetadata) or not _size(chunk.offsets, dims) \
                        or not _size(chunk.sizes, dims) \
                        or any(o + n > d for o, n, d in zip(chunk.offsets, chunk.sizes, entry.size)):
                    raise ValueError(f"{where}: entry {name} has a chunk outside its size {list(entry.size)}")
                if (key, tuple(chunk.offsets)) not in stored:
                    raise ValueError(f"{where}: entry {name} has a chunk stored nowhere")
                boxes.append((tuple(chunk.offsets), tuple(chunk.sizes)))
            if sum(_volume(n) for _, n in boxes) != entry.size.numel() or _overlap(boxes, tuple(entry.size)):
                raise ValueError(f"{where}: the chunks of entry {name} do not cover it exactly once")

        for rel, end in files.items():
            path = Path(self.path) / rel
            try:
                st = os.lstat(path)
            except OSError:
                raise ValueError(f"{self.source}/{rel}: missing (the metadata points at it)") from None
            if not stat.S_ISREG(st.st_mode) or st.st_size < end:
                raise ValueError(f"{self.source}/{rel}: not a regular file of at least {end:,} bytes")
        return md


def _volume(sizes: tuple[int, ...]) -> int:
    out = 1
    for n in sizes:
        out *= n
    return out


def _overlap(boxes: list[tuple[tuple[int, ...], tuple[int, ...]]], size: tuple[int, ...]) -> bool:
    """Whether two of the boxes (offsets, sizes) inside a tensor of ``size`` share an element (empty boxes share
    none). Row slices (what FSDP's dim-0 shards are): sorted, O(k log k); other boxes pairwise, at most
    :data:`MAX_PAIRWISE` of them (more is refused as overlapping: no DCP save of rlcr's makes them)."""
    boxes = [b for b in boxes if _volume(b[1]) > 0]
    if not size:
        return len(boxes) > 1
    rest = tuple(size[1:])
    if all(o[1:] == (0,) * len(rest) and n[1:] == rest for o, n in boxes):
        rows = sorted((o[0], o[0] + n[0]) for o, n in boxes)
        return any(a[1] > b[0] for a, b in zip(rows, rows[1:]))
    if len(boxes) > MAX_PAIRWISE:
        return True
    for i, (oa, na) in enumerate(boxes):
        for ob, nb in boxes[i + 1:]:
            if all(a < b + m and b < a + n for a, n, b, m in zip(oa, na, ob, nb)):
                return True
    return False


class CheckedLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, reading the non-tensor entries with ``weights_only`` (DCP's own uses a full unpickle)."""

    def create_local_plan(self):
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        for fqn, obj in self.state_dict.items():  # a tensor stored as an object would skip DCP's size check
            if isinstance(obj, torch.Tensor) and fqn in self.metadata.state_dict_metadata \
                    and not isinstance(self.metadata.state_dict_metadata[fqn], TensorStorageMetadata):
                raise ValueError(f"{printable(fqn, 120)} is a tensor here but not in the checkpoint")
        return super().create_local_plan()

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import set_element  # noqa: PLC0415

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _first_failure(e) -> str:
    """The first failed rank of a DCP ``CheckpointException`` and its error, in one line."""
    failures = sorted(e.failures.items(), key=lambda kv: kv[0])
    if not failures:
        return "failed"
    rank, (exc, _) = failures[0]
    text = str(exc).strip().splitlines()
    return f"rank {rank}: {type(exc).__name__}: {printable(text[0] if text else '', 300)}"


def optimizer_shards(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's AdamW state, keyed by parameter name, its tensors this rank's shards (DTensors under FSDP):
    what :func:`save_optimizer_shards` writes. Taken on every rank before a (background) save; the tensors are the
    optimizer's own, so the next step must wait for the write."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return {"optimizer": get_optimizer_state_dict(model, optimizer)}


def save_optimizer_shards(state: dict[str, Any], directory: str | Path, *, process_group=None) -> None:
    """Write ``state`` (:func:`optimizer_shards`) into ``directory`` with DCP: this rank's ``__<rank>_0.distcp``, and
    on rank 0 the ``.metadata`` that maps every tensor's chunks to files (a collective over ``process_group``:
    every rank calls it; ``directory`` may differ between ranks, each writing its own files there)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.save(state, storage_writer=FileSystemWriter(str(directory)), process_group=process_group)
    except CheckpointException as e:  # a BaseException, with every failed rank's traceback: one line instead
        raise RuntimeError(f"writing AdamW's shards failed: {_first_failure(e)}") from None


def load_optimizer_shards(model: nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path, *,
                          source: str | None = None) -> None:
    """Restore ``optimizer``'s state from a sharded save in ``directory`` (``source``: how errors name it), in this
    run's layout: FSDP keeps its shards, DDP the whole (a collective under either: every rank calls it). The state
    AdamW would have after a step of learning rate 0 is the template DCP fills, so a tensor missing from the
    files, or of another shape, is an error, not a silent fresh moment."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    reader = CheckedReader(directory, source)
    reader.read_metadata()  # its refusal in its own words, before DCP wraps it
    state = optimizer_shards(model, optimizer)
    try:
        dcp.load(state, storage_reader=reader, planner=CheckedLoadPlanner())
    except CheckpointException as e:  # a BaseException, with every failed rank's traceback: one line instead
        raise ValueError(f"{printable(source or str(directory), 300)}: {_first_failure(e)}") from None
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"])


def read_optimizer_shards(directory: str | Path, *, max_bytes: int = 1 << 32) -> dict[str, Any]:
    """A sharded save's whole AdamW state in this process, without a process group or a model: a flat dict from
    DCP's keys (``optimizer.state.<parameter>.<exp_avg|exp_avg_sq|step>``, ``optimizer.param_groups.<i>.<key>``) to
    full tensors and values. For inspection and tests; refuses a state of more than ``max_bytes``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = CheckedReader(directory)
    md = reader.read_metadata()
    shapes = {k: m for k, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    total = sum(m.size.numel() * m.properties.dtype.itemsize for m in shapes.values())
    if total > max_bytes:
        raise ValueError(f"{printable(str(directory), 300)}: {total:,} bytes of optimizer state, over {max_bytes:,}")
    state: dict[str, Any] = {k: torch.empty(m.size, dtype=m.properties.dtype) if k in shapes else None
                             for k, m in md.state_dict_metadata.items()}
    dcp.load(state, storage_reader=reader, planner=CheckedLoadPlanner(), no_dist=True)
    return state
