"""One fsspec-based store for every artifact: checkpoints, rollouts, metrics, reports.

``Store("./runs-store")`` is a local directory; ``Store("s3://bucket/prefix")`` goes
through s3fs with credentials from the standard AWS environment and an optional
endpoint for S3-compatible servers (MinIO, moto).

Directories that must never be seen half-written (checkpoints) are uploaded file
by file and then *sealed* by a ``_COMPLETE`` file written last. The seal is a
small JSON document with a fresh random ``content_id`` and the size of every file:
readers only trust sealed directories, and the local checkpoint cache is keyed by
(URI, content_id), so a directory rewritten at the same URI is never served from
a stale cache. A seal is input from outside: :func:`parse_seal` checks every field
(a content id of 32 lowercase hex digits, safe relative file names, sizes) before
anything uses it, and a download fetches exactly the files the seal lists, each
inside its destination and of its listed size. Small control files (manifests,
leases) can be written exclusively (create-only: ``If-None-Match: *`` on S3, a hard
link locally) or as a compare-and-swap on their version (``If-Match`` on S3, a lock
file locally); either succeeds if refused by an object holding exactly its bytes
(on S3, a late-answered PUT's retry finds its own first attempt: :meth:`Store._holds`).

The package: :class:`Store` here; the checkpoint cache (:func:`fetch_checkpoint`) in :mod:`rlcr.storage.cache`;
the seal format in
:mod:`rlcr.storage.seals`; never-half-written local files and temporaries in :mod:`rlcr.storage.local`; the
errors in :mod:`rlcr.storage.errors`. Every public name of those is importable from :mod:`rlcr.storage`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import fsspec

from rlcr.storage.cache import default_cache_dir, fetch_checkpoint
from rlcr.storage.errors import AlreadyExists, NoSuchStore, RefusedFile, StorageError, VersionConflict
from rlcr.storage.local import (
    HOST_ID,
    atomic_directory,
    check_store_root,
    fsync_dir,
    new_temp_directory,
    pid_alive,
    publish_directory,
    read_regular,
    safe_join,
    sweep_temporaries,
    temp_name,
)
from rlcr.storage.seals import (
    COMPLETE_MARKER,
    MAX_FILE_BYTES,
    MAX_NAME_CHARS,
    MAX_SEAL_BYTES,
    MAX_SEAL_FILES,
    InvalidSeal,
    Unsealable,
    checkpoint_content_id,
    new_seal,
    parse_seal,
    read_bounded,
    sealable_files,
)
from rlcr.untrusted import printable

__all__ = [
    "Store", "COMPLETE_MARKER", "fetch_checkpoint", "StorageError", "AlreadyExists", "VersionConflict",
    "atomic_directory", "sweep_temporaries", "default_cache_dir", "validate_run_id",
    "safe_join", "checkpoint_content_id", "pid_alive", "InvalidSeal", "Unsealable", "parse_seal", "new_seal",
    "MAX_SEAL_BYTES", "MAX_SEAL_FILES", "MAX_NAME_CHARS", "MAX_FILE_BYTES", "RUN_ID_PATTERN",
    "RefusedFile", "NoSuchStore", "MAX_READ_BYTES", "validate_new_run_id", "HOST_ID", "SharedPart",
]

MAX_READ_BYTES = 512 << 20
"""Largest file a store read takes into memory unless the caller asks for less (bytes; the decoded-size budget of a
columnar file, :data:`rlcr.columnar.MAX_TABLE_BYTES`): a larger one is refused by its size, before it is read."""

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+,@ -]{0,127}")
"""Valid run ids: 1–128 characters, letters, digits and ``. _ = + , @ -`` and space, starting with a
letter or digit, without ``..`` and without a trailing space or dot (no ``/``: a run id is one path segment)."""


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is valid (:data:`RUN_ID_PATTERN`), else raise ValueError naming it."""
    if (not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id) or ".." in run_id
            or run_id[-1] in ". "):
        raise ValueError(
            f"invalid run id {run_id!r}: use 1-128 letters, digits and . _ = + , @ - or space, starting with a "
            "letter or digit, with no '..', no '/' and no trailing dot or space")
    return run_id


def validate_new_run_id(run_id: str) -> str:
    """:func:`validate_run_id`, and no ``@``: the id of a run being *created* must never read as a run reference
    (``RUN@2``, ``RUN@latest``; :mod:`rlcr.runs.refs`). Runs stored under such ids before stay readable."""
    validate_run_id(run_id)
    if "@" in run_id:
        raise ValueError(f"invalid run id {run_id!r} for a new run: it holds '@', so it could be read as a run "
                         "reference (RUN@ITERATION); choose an id without '@'")
    return run_id


def _split(uri: str) -> tuple[str, str]:
    if "://" in uri:
        protocol, rest = uri.split("://", 1)
        return protocol, rest.rstrip("/")
    return "file", str(Path(uri).expanduser().resolve())


class SharedPart:
    """One writer's share of a directory several processes write (:meth:`Store.shared_part`): ``dir``, the local
    directory to fill; after the block, ``files``: their names in the sealed directory → sizes."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.dir: Path = Path()
        self.files: dict[str, int] = {}


class Store:
    """Artifacts under one root URI. Relative paths use ``/``."""

    def __init__(self, uri: str, *, endpoint_url: str | None = None, read_timeout_s: float = 30.0,
                 create: bool = True):
        """``read_timeout_s``: S3 only, how long one request waits for its answer before it is retried. ``create``:
        a local root that is missing is created; False (a command that only reads): it must exist
        (:class:`NoSuchStore` otherwise, and for a root under ``/proc``, ``/sys`` or ``/dev`` either way)."""
        self.uri = uri.rstrip("/") if "://" in uri else str(Path(uri).expanduser().resolve())
        self.protocol, self.root = _split(uri)
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        options: dict[str, Any] = {}
        if self.protocol == "s3":
            if self.endpoint_url:
                options["client_kwargs"] = {"endpoint_url": self.endpoint_url}
            options["config_kwargs"] = {"retries": {"max_attempts": 3, "mode": "standard"}, "connect_timeout": 5,
                                        "read_timeout": read_timeout_s}
            options["skip_instance_cache"] = True
        self.fs = fsspec.filesystem(self.protocol, **options)
        if self.protocol == "file":
            check_store_root(self.root, create=create)

    # ------------------------------------------------------------------ paths
    @property
    def is_local(self) -> bool:
        return self.protocol == "file"

    def _abs(self, rel: str = "") -> str:
        rel = rel.strip("/")
        if rel and any(p in ("..", ".") for p in rel.split("/")):
            raise StorageError(f"refusing path {rel!r} under {self.uri}: '.' and '..' segments are not allowed")
        return f"{self.root}/{rel}" if rel else self.root

    def url(self, rel: str = "") -> str:
        """Full URI of ``rel`` (``s3://…`` or an absolute local path)."""
        path = self._abs(rel)
        return path if self.is_local else f"{self.protocol}://{path}"

    def rel(self, uri: str) -> str:
        """Inverse of :meth:`url` for URIs under this store."""
        _, path = _split(uri)
        if path != self.root and not path.startswith(self.root + "/"):
            raise StorageError(f"{uri} is not under {self.uri}")
        return path[len(self.root):].strip("/")

    # ------------------------------------------------------------------ basic IO
    def _wrap(self, what: str, rel: str, fn):
        try:
            return fn()
        except (FileNotFoundError, StorageError):
            raise
        except Exception as e:  # network, credentials, endpoint down …
            raise StorageError(f"{what} {printable(self.url(rel), 300)} failed: {type(e).__name__}: "
                               f"{printable(e, 300)}") from e

    def exists(self, rel: str) -> bool:
        return self._wrap("checking", rel, lambda: self.fs.exists(self._abs(rel)))

    def ls(self, rel: str = "") -> list[str]:
        """Names (not paths) directly under ``rel``; empty if it does not exist."""
        def run():
            try:
                entries = (self.fs.ls(self._abs(rel), detail=False, refresh=True) if not self.is_local
                           else self.fs.ls(self._abs(rel), detail=False))
            except FileNotFoundError:
                return []
            return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})
        return self._wrap("listing", rel, run)

    def _local_temp_file(self, path: str, data: bytes) -> str:
        """Write ``data`` durably to a temp file next to ``path``; returns its name."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=temp_name(Path(path).name))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp

    def write_bytes(self, rel: str, data: bytes, *, exclusive: bool = False) -> None:
        """Write a whole file, atomically and (locally) durably: fsynced file and directory.

        Local: temp file + rename; S3: one PUT. ``exclusive``: create-only — raises
        :class:`AlreadyExists` if ``rel`` exists (local: hard link; S3: ``If-None-Match: *``) holding
        other bytes than ``data`` (exactly ``data`` there: this write's own retried PUT landed first).
        """
        path = self._abs(rel)
        if self.is_local:
            tmp = self._local_temp_file(path, data)
            try:
                if exclusive:
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        if not self._holds(rel, data):
                            raise AlreadyExists(f"{self.url(rel)} already exists") from None
                else:
                    os.replace(tmp, path)
                fsync_dir(Path(path).parent)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return

        def run():
            try:
                self.fs.pipe_file(path, data, mode="create" if exclusive else "overwrite")
            except OSError as e:
                refused = isinstance(e, FileExistsError) or (e.errno == errno.EINVAL and
                                                             "precondition" in str(e).lower())
                if not (exclusive and refused):
                    raise
                if not self._holds(rel, data):  # else: a retry of this very PUT, whose first attempt landed
                    raise AlreadyExists(f"{self.url(rel)} already exists") from None
        self._wrap("writing", rel, run)

    def _holds(self, rel: str, data: bytes) -> bool:
        """Whether ``rel`` holds exactly ``data`` (reading at most one byte more), asked when a create-only write or
        compare-and-swap of ``data`` was refused: on S3 a PUT whose answer came too late is retried, and the retry
        finds the first attempt's object, its own. Any other bytes are another writer's."""
        path = self._abs(rel)
        if self.is_local:
            try:
                return read_bounded(path, len(data)) == data
            except OSError:  # gone, or a folder: not these bytes
                return False

        def run():
            try:
                if not data:  # a range cannot be asked of an empty object
                    return self.fs.info(path, refresh=True).get("size") == 0
                return self.fs.cat_file(path, start=0, end=len(data) + 1) == data
            except FileNotFoundError:
                return False
        return self._wrap("reading", rel, run)

    def read_bytes(self, rel: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        """The bytes of ``rel``, at most ``max_bytes`` of them (``FileNotFoundError`` if it is not there).

        Bounded in time and memory: locally only a regular file is read (a FIFO, a device, a link to one, a
        kernel file is :class:`RefusedFile` by name, without blocking), and its size is checked before it is read;
        on S3 one ranged GET asks for ``max_bytes + 1`` bytes at most. Larger: :class:`RefusedFile`, one line."""
        path = self._abs(rel)
        if self.is_local:
            return read_regular(path, max_bytes, self.url(rel))

        def run():
            try:
                data = self.fs.cat_file(path, start=0, end=max_bytes + 1)
            except OSError as e:  # a range of an empty object is "not satisfiable"
                if e.errno != errno.EINVAL or self.fs.info(path, refresh=True).get("size") != 0:
                    raise
                data = b""
            if len(data) > max_bytes:
                raise RefusedFile(f"{self.url(rel)}: more than the {max_bytes:,} bytes allowed; refusing to read it")
            return data
        return self._wrap("reading", rel, run)

    # ------------------------------------------------------------------ versioned (compare-and-swap) IO
    @contextlib.contextmanager
    def _local_lock(self, path: str):
        lock = Path(path).with_name(Path(path).name + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def read_versioned(self, rel: str, *, max_bytes: int = MAX_READ_BYTES) -> tuple[bytes, str]:
        """(content, version) of ``rel``; the version changes with every write (S3: the ETag). Bounded as
        :meth:`read_bytes` is (on S3 the object's size is checked before it is read)."""
        path = self._abs(rel)
        if self.is_local:
            data = read_regular(path, max_bytes, self.url(rel))
            return data, hashlib.sha256(data).hexdigest()

        def run():
            for _ in range(5):  # the ETag before and after the read must agree (no write in between)
                info = self.fs.info(path, refresh=True)
                before = info.get("ETag", "")
                if (info.get("size") or 0) > max_bytes:
                    raise RefusedFile(f"{self.url(rel)}: {info['size']:,} bytes, more than the {max_bytes:,} "
                                      f"allowed; refusing to read it")
                data = self.fs.cat_file(path, start=0, end=max_bytes + 1) if info.get("size") else b""
                after = self.fs.info(path, refresh=True).get("ETag", "")
                if before == after:
                    return data, str(after).strip('"')
            raise StorageError(f"{self.url(rel)} keeps changing while it is read")
        return self._wrap("reading", rel, run)

    def write_if_version(self, rel: str, data: bytes, version: str) -> None:
        """Replace ``rel`` only if it is still at ``version`` (else :class:`VersionConflict`, unless ``rel``
        holds exactly ``data``: this write's own retried PUT landed first)."""
        path = self._abs(rel)
        if self.is_local:
            with self._local_lock(path):
                try:
                    current = hashlib.sha256(read_regular(path, MAX_READ_BYTES, self.url(rel))).hexdigest()
                except FileNotFoundError:
                    current = None
                if current != version and self._holds(rel, data):
                    return
                if current != version:
                    raise VersionConflict(f"{self.url(rel)} changed (expected version {version[:12]})")
                tmp = self._local_temp_file(path, data)
                os.replace(tmp, path)
                fsync_dir(Path(path).parent)
            return

        def run():
            try:
                self.fs.pipe_file(path, data, IfMatch=f'"{version}"')
            except (OSError, FileNotFoundError) as e:
                if isinstance(e, FileNotFoundError) or e.errno == errno.EINVAL:
                    if self._holds(rel, data):  # a retry of this very PUT, whose first attempt landed
                        return
                    raise VersionConflict(f"{self.url(rel)} changed (expected version {version[:12]})") from None
                raise
        self._wrap("writing", rel, run)

    def delete_if_version(self, rel: str, version: str, *, max_bytes: int = MAX_READ_BYTES) -> bool:
        """Remove ``rel`` if it is still at ``version`` (read as :meth:`read_versioned` does); True if removed."""
        try:
            _, current = self.read_versioned(rel, max_bytes=max_bytes)
        except FileNotFoundError:
            return False
        if current != version:
            return False
        self.rm(rel)
        return True

    # ------------------------------------------------------------------ JSON & text
    def write_json(self, rel: str, obj: Any, *, exclusive: bool = False) -> None:
        self.write_bytes(rel, json.dumps(obj, indent=2, sort_keys=True, default=str).encode(), exclusive=exclusive)

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_bytes(rel))

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def rm(self, rel: str) -> None:
        def run():
            if self.fs.exists(self._abs(rel)):
                self.fs.rm(self._abs(rel), recursive=True)
        self._wrap("removing", rel, run)

    def sweep_temporaries(self, rel: str = "") -> list[Path]:
        """Local stores: remove temporaries of killed writers under ``rel`` (see :func:`sweep_temporaries`)."""
        return sweep_temporaries(self._abs(rel)) if self.is_local else []

    # ------------------------------------------------------------------ parquet
    def write_parquet(self, rel: str, table, *, exclusive: bool = False) -> str:
        import io

        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(table, buf)
        self.write_bytes(rel, buf.getvalue(), exclusive=exclusive)
        return self.url(rel)

    def read_parquet(self, rel: str):
        """The table of a Parquet file in the store, read in bounded memory (rows and decoded size within
        :mod:`rlcr.columnar`'s limits, else an ``InvalidInput`` naming the file): a shared store is outside."""
        import io

        from rlcr.columnar import read_parquet_table

        return read_parquet_table(io.BytesIO(self.read_bytes(rel)), self.url(rel))

    # ------------------------------------------------------------------ sealed directories
    def put_dir(self, local_dir: str | Path, rel: str) -> str:
        """Upload a local directory to ``rel`` and seal it; returns its URI.

        Local stores copy into a temp sibling (fsynced) and rename it into place; remote
        stores upload every file and write the seal last. Anything already at ``rel``
        is replaced, and the new seal carries a fresh content id, so caches of the old
        content are never served for the new one.

        What is copied and sealed is every file the directory shows: symbolic links to files
        and directories are followed (their content is copied, not the link). A dangling link,
        a link loop or a FIFO/socket/device raises StorageError naming it, before anything is
        written (see :func:`~rlcr.storage.seals.sealable_files`); so does a file whose size changes while copied.
        """
        local_dir = Path(local_dir)
        files = sealable_files(local_dir)
        seal = new_seal({name: size for name, _, size in files})
        if self.is_local:
            with atomic_directory(self._abs(rel), durable=True) as tmp:
                for name, src, size in files:
                    target = tmp / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, target)
                    if target.stat().st_size != size:
                        raise StorageError(f"{printable(str(src), 300)} changed while it was copied to "
                                           f"{printable(self.url(rel), 300)}")
                (tmp / COMPLETE_MARKER).write_bytes(seal)
            return self.url(rel)

        def run():
            base = self._abs(rel)
            if self.fs.exists(base):
                self.fs.rm(base, recursive=True)
            for name, src, _ in files:
                self.fs.put_file(str(src), f"{base}/{name}")
            self.fs.pipe_file(f"{base}/{COMPLETE_MARKER}", seal)
        self._wrap("uploading", rel, run)
        return self.url(rel)

    @contextlib.contextmanager
    def writing_dir(self, rel: str):
        """A local directory to fill; when the block ends it is sealed and published at ``rel`` with
        :meth:`put_dir`'s guarantees (readers never see it partial; an error in the block publishes nothing).

        Local stores hand out the atomic temp sibling of ``rel`` itself, so what is written there is written
        once — a checkpoint of weights and optimizer state (1.6 GB for SmolLM2) is not first written to a
        temporary directory and then copied; remote stores hand out a temporary directory and upload it."""
        if not self.is_local:
            with tempfile.TemporaryDirectory(prefix="rlcr-put-") as d:
                yield Path(d)
                self.put_dir(d, rel)
            return
        with atomic_directory(self._abs(rel), durable=True) as tmp:
            yield tmp
            seal = new_seal({name: size for name, _, size in sealable_files(tmp)})
            (tmp / COMPLETE_MARKER).write_bytes(seal)

    # ------------------------------------------------------------------ a directory several processes write
    def open_shared(self, rel: str) -> str:
        """Begin a sealed directory that several processes fill (the ranks of a sharded save, each its own files:
        :meth:`shared_part`) and one seals (:meth:`seal_shared`); returns where the parts go, the string every
        writer is handed. Readers see nothing new until the seal, and the old directory at ``rel`` until then
        (local) or no sealed directory (S3).

        Local: a fresh temp sibling of ``rel``, renamed into place by the seal (the writers must share this file
        system); S3: ``rel`` itself, its old seal removed first and then its files, so nothing half-written is
        ever sealed."""
        if self.is_local:
            return str(new_temp_directory(self._abs(rel)))

        def run():
            base = self._abs(rel)
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(f"{base}/{COMPLETE_MARKER}")
            if self.fs.exists(base):
                self.fs.rm(base, recursive=True)
        self._wrap("clearing", rel, run)
        return self._abs(rel)

    @contextlib.contextmanager
    def shared_part(self, where: str, prefix: str, *, before_upload=None):
        """A local directory to fill with one writer's files of the shared directory ``where``
        (:meth:`open_shared`), under ``prefix`` there; when the block ends they are in place (local: written
        there already; S3: ``before_upload()`` is called, e.g. the lease check, then each file is uploaded) and
        the yielded :class:`SharedPart`'s ``files`` maps their names in the sealed directory to their sizes (local:
        every file under the part's folder when the block ends, other writers' of the same folder too; the seal
        takes the union of the lists)."""
        self._under_root(where)
        part = SharedPart(prefix.strip("/"))
        if self.is_local:
            part.dir = safe_join(where, part.prefix) if part.prefix else Path(where)
            part.dir.mkdir(parents=True, exist_ok=True)
            yield part
            part.files = {f"{part.prefix}/{n}" if part.prefix else n: size
                          for n, _, size in sealable_files(part.dir)}
            return
        with tempfile.TemporaryDirectory(prefix="rlcr-part-") as d:
            part.dir = Path(d)
            yield part
            files = sealable_files(part.dir)
            if before_upload is not None:
                before_upload()
            names = {n: f"{part.prefix}/{n}" if part.prefix else n for n, _, _ in files}

            def run():
                for n, src, _ in files:
                    self.fs.put_file(str(src), f"{where}/{names[n]}")
            self._wrap("uploading", f"{self._under_root(where)}/{part.prefix}", run)
            part.files = {names[n]: size for n, _, size in files}

    def seal_shared(self, rel: str, where: str, files: dict[str, int]) -> str:
        """Seal the shared directory ``where`` (:meth:`open_shared`) as ``rel``, listing ``files`` (every writer's
        :attr:`SharedPart.files`): each must be there with its size, and (local) nothing else, or StorageError
        naming it and nothing is published. Local: fsynced and renamed into place. Returns the URI."""
        self._under_root(where)
        seal = new_seal(files)
        if self.is_local:
            tmp = Path(where)
            found = {n: size for n, _, size in sealable_files(tmp)}
            if found != files:
                odd = sorted(set(found.items()) ^ set(files.items()))[:1]
                raise StorageError(f"{self.url(rel)}: the parts written are not the ones listed "
                                   f"(e.g. {printable(str(odd), 200)}); not sealing it")
            (tmp / COMPLETE_MARKER).write_bytes(seal)
            publish_directory(tmp, self._abs(rel), durable=True)
            return self.url(rel)

        def run():
            found = {k[len(where) + 1:]: int(v.get("size") or 0)
                     for k, v in self.fs.find(where, detail=True).items() if v.get("type") != "directory"}
            for name, size in files.items():
                if found.get(name) != size:
                    raise StorageError(f"{self.url(rel)}: {printable(name)} is missing or not {size:,} bytes; "
                                       f"not sealing it")
            self.fs.pipe_file(f"{where}/{COMPLETE_MARKER}", seal)
        self._wrap("sealing", rel, run)
        return self.url(rel)

    def _under_root(self, where: str) -> str:
        """``where`` (from :meth:`open_shared`) relative to the root; StorageError if it is not under it."""
        rel = where[len(self.root):].strip("/") if where.startswith(self.root + "/") else ""
        if not rel or any(p in ("", ".", "..") for p in rel.split("/")):
            raise StorageError(f"{printable(where, 300)}: not a shared directory under {self.uri}")
        return rel

    def abandon_shared(self, where: str) -> None:
        """Give up a shared directory before its seal: local, its temp sibling is removed; S3, it stays unsealed
        (no reader trusts it; the next :meth:`open_shared` of it clears it)."""
        if self.is_local:
            self._under_root(where)
            shutil.rmtree(where, ignore_errors=True)

    def is_complete(self, rel: str) -> bool:
        return self.exists(f"{rel.rstrip('/')}/{COMPLETE_MARKER}")

    def read_seal(self, rel: str) -> bytes | None:
        """The raw seal of a sealed directory, or None if it is not sealed.

        Bounded: a seal over :data:`MAX_SEAL_BYTES` raises :class:`InvalidSeal` after reading no more
        than one byte past the limit. The bytes are not checked here: :func:`parse_seal` does that."""
        marker = f"{rel.rstrip('/')}/{COMPLETE_MARKER}"
        path = self._abs(marker)

        def run():
            if self.is_local:
                return read_bounded(path)
            return self.fs.cat_file(path, start=0, end=MAX_SEAL_BYTES + 1)
        try:
            data = self._wrap("reading", marker, run)
        except FileNotFoundError:
            return None
        if len(data) > MAX_SEAL_BYTES:
            raise InvalidSeal(f"{self.url(marker)}: more than the {MAX_SEAL_BYTES:,} bytes allowed for a seal")
        return data

    def parse_seal(self, rel: str, seal: bytes | None = None) -> dict[str, Any]:
        """The checked fields (:func:`parse_seal`) of the seal of ``rel`` (``seal``: its bytes, if already read).

        Raises StorageError if ``rel`` is not sealed, :class:`InvalidSeal` if its seal fails a check."""
        seal = seal if seal is not None else self.read_seal(rel)
        if seal is None:
            raise StorageError(f"{self.url(rel)} is not a complete (sealed) directory")
        return parse_seal(seal, self.url(f"{rel.rstrip('/')}/{COMPLETE_MARKER}"))

    def content_id(self, rel: str) -> str:
        """The content id of a sealed directory (changes whenever it is rewritten): 32 lowercase hex digits.

        Raises StorageError if it is not sealed, :class:`InvalidSeal` if its seal fails a check."""
        return self.parse_seal(rel)["content_id"]

    def get_dir(self, rel: str, local_dir: str | Path, *, seal: bytes | None = None) -> Path:
        """Download a sealed directory into ``local_dir`` (atomically); raises if it is not sealed.

        Exactly the files the seal lists are downloaded (anything else in the store directory is left
        there), each to its own name inside ``local_dir`` and checked to have its listed size; the seal
        is checked first (:func:`parse_seal`) and must not change during the download (a concurrent
        rewrite). Otherwise StorageError (:class:`InvalidSeal` for a bad seal) and ``local_dir`` is left
        as it was, with nothing half-written. ``seal``: the seal's bytes, if the caller read them already.
        """
        seal = seal if seal is not None else self.read_seal(rel)
        files = self.parse_seal(rel, seal)["files"]
        with atomic_directory(local_dir) as tmp:
            for name, size in files.items():
                self._get_sealed_file(rel, name, size, tmp)
            if self.read_seal(rel) != seal:
                raise StorageError(f"{self.url(rel)} was rewritten while it was being downloaded; retry")
            (tmp / COMPLETE_MARKER).write_bytes(seal)
        return Path(local_dir)

    def _get_sealed_file(self, rel: str, name: str, size: int, dest_root: Path) -> None:
        """Download the file ``name`` (a checked seal name) of the sealed directory ``rel`` to ``dest_root/name``.

        The target must stay inside ``dest_root`` and, on a local store, the source inside ``rel`` (a
        symbolic link there leading out is refused); the file must exist and have ``size`` bytes."""
        target = safe_join(dest_root, name)
        source = str(safe_join(self._abs(rel), name)) if self.is_local else f"{self._abs(rel)}/{name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        what = f"{rel.rstrip('/')}/{name}"
        try:
            self._wrap("downloading", what, lambda: self.fs.get_file(source, str(target)))
        except FileNotFoundError:
            raise StorageError(f"{self.url(rel)}: {printable(name)} is missing (the seal lists it)") from None
        if not target.is_file() or target.stat().st_size != size:
            raise StorageError(f"{self.url(rel)}: {printable(name)} has the wrong size (the seal says {size:,} bytes)")
