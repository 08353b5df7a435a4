"""One fsspec-based store for every artifact: checkpoints, rollouts, metrics, reports.

``Store("./runs-store")`` is a local directory; ``Store("s3://bucket/prefix")`` goes
through s3fs with credentials from the standard AWS environment and an optional
endpoint for S3-compatible servers (MinIO, moto).

Directories that must never be seen half-written (checkpoints) are uploaded file
by file and then *sealed* by a ``_COMPLETE`` file written last. The seal is a
small JSON document with a fresh random ``content_id`` and the size of every file:
readers only trust sealed directories, and the local checkpoint cache is keyed by
(URI, content_id), so a directory rewritten at the same URI is never served from
a stale cache. Downloads refuse any key that would land outside their
destination. Small control files (manifests, leases) can be written exclusively
(create-only: ``If-None-Match: *`` on S3, a hard link locally) or as a
compare-and-swap on their version (``If-Match`` on S3, a lock file locally).
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
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

import fsspec

__all__ = [
    "Store", "COMPLETE_MARKER", "fetch_checkpoint", "StorageError", "AlreadyExists", "VersionConflict",
    "iteration_prefix", "atomic_directory", "sweep_temporaries", "default_cache_dir", "validate_run_id",
    "safe_join", "checkpoint_content_id", "pid_alive",
]

COMPLETE_MARKER = "_COMPLETE"
_TEMP_TAG = ".tmp-"  # every temporary this module creates has ".tmp-<pid>-" in its name
_TEMP_RE = re.compile(r"\.tmp-(\d+)-")
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+,@ -]{0,127}")
"""Valid run ids: 1–128 characters, letters, digits and ``. _ = + , @ -`` and space, starting with a
letter or digit, without ``..`` and without a trailing space or dot (no ``/``: a run id is one path segment)."""


def default_cache_dir() -> Path:
    """``$RLCR_CACHE`` or ``~/.cache/rlcr``: per-node caches (models, fetched checkpoints)."""
    return Path(os.environ.get("RLCR_CACHE", Path.home() / ".cache" / "rlcr"))


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is valid (:data:`RUN_ID_PATTERN`), else raise ValueError naming it."""
    if (not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id) or ".." in run_id
            or run_id[-1] in ". "):
        raise ValueError(
            f"invalid run id {run_id!r}: use 1-128 letters, digits and . _ = + , @ - or space, starting with a "
            "letter or digit, with no '..', no '/' and no trailing dot or space")
    return run_id


def safe_join(root: str | Path, rel: str) -> Path:
    """``root/rel`` for a relative POSIX path ``rel``; raises StorageError if it would leave ``root``."""
    parts = PurePosixPath(rel.replace("\\", "/")).parts
    if rel.startswith("/") or any(p in ("..", "") for p in parts) or not parts:
        raise StorageError(f"refusing path {rel!r}: it would resolve outside {root}")
    root = Path(root).resolve()
    target = (root / Path(*parts)).resolve()
    if target != root and root not in target.parents:
        raise StorageError(f"refusing path {rel!r}: it would resolve outside {root}")
    return target


def _temp_name(name: str) -> str:
    return f".{name}{_TEMP_TAG}{os.getpid()}-"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_temporaries(root: str | Path, *, max_depth: int = 4) -> list[Path]:
    """Remove temporaries left under ``root`` by killed writers on this host (their pid is gone).

    Only names this module creates (``.<name>.tmp-<pid>-…``) are touched; returns what was removed.
    """
    root = Path(root)
    removed: list[Path] = []
    if not root.is_dir():
        return removed

    def walk(d: Path, depth: int) -> None:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            m = _TEMP_RE.search(e.name)
            if e.name.startswith(".") and m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
                path = Path(e.path)
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        path.unlink()
                removed.append(path)
            elif depth < max_depth and e.is_dir(follow_symlinks=False):
                walk(Path(e.path), depth + 1)

    walk(root, 0)
    return removed


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        elif p.is_dir():
            _fsync_dir(p)
    _fsync_dir(path)


@contextlib.contextmanager
def atomic_directory(dest: str | Path, *, durable: bool = False):
    """Yield a temp sibling of ``dest`` to fill; on success it replaces ``dest`` in one rename.

    On failure it is removed, so ``dest`` is never seen half-written; a writer killed before
    that leaves a ``.<name>.tmp-<pid>-…`` sibling that :func:`sweep_temporaries` removes later.
    ``durable``: fsync the files and directories before and after the rename.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_name(dest.name), dir=dest.parent))
    try:
        yield tmp
        if durable:
            _fsync_tree(tmp)
        if dest.exists():
            # move the old one aside first (a rename), so dest is never missing for long
            old = Path(tempfile.mkdtemp(prefix=_temp_name(dest.name), dir=dest.parent))
            os.replace(dest, old / "x")
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
        if durable:
            _fsync_dir(dest.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URI."""


class AlreadyExists(StorageError):
    """An exclusive (create-only) write found the object already there."""


class VersionConflict(StorageError):
    """A compare-and-swap write found another version than the one it expected."""


def _split(uri: str) -> tuple[str, str]:
    if "://" in uri:
        protocol, rest = uri.split("://", 1)
        return protocol, rest.rstrip("/")
    return "file", str(Path(uri).expanduser().resolve())


def new_seal(files: dict[str, int]) -> bytes:
    """The ``_COMPLETE`` document of a directory: a fresh content id and every file's size."""
    return json.dumps({"content_id": uuid.uuid4().hex, "files": dict(sorted(files.items())),
                       "sealed_at": time.time()}, indent=1).encode()


def parse_seal(data: bytes) -> dict[str, Any]:
    """A seal's fields; a legacy plain ``ok`` seal gets a content id from its bytes (no file list)."""
    try:
        seal = json.loads(data)
        if isinstance(seal, dict) and isinstance(seal.get("content_id"), str):
            return seal
    except ValueError:
        pass
    return {"content_id": "legacy-" + hashlib.sha256(data).hexdigest()[:16], "files": None}


class Store:
    """Artifacts under one root URI. Relative paths use ``/``."""

    def __init__(self, uri: str, *, endpoint_url: str | None = None):
        self.uri = uri.rstrip("/") if "://" in uri else str(Path(uri).expanduser().resolve())
        self.protocol, self.root = _split(uri)
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        options: dict[str, Any] = {}
        if self.protocol == "s3":
            if self.endpoint_url:
                options["client_kwargs"] = {"endpoint_url": self.endpoint_url}
            options["config_kwargs"] = {"retries": {"max_attempts": 3, "mode": "standard"}, "connect_timeout": 5, "read_timeout": 30}
            options["skip_instance_cache"] = True
        self.fs = fsspec.filesystem(self.protocol, **options)
        if self.protocol == "file":
            self.fs.makedirs(self.root, exist_ok=True)

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
            raise StorageError(f"{what} {self.url(rel)} failed: {type(e).__name__}: {e}") from e

    def exists(self, rel: str) -> bool:
        return self._wrap("checking", rel, lambda: self.fs.exists(self._abs(rel)))

    def ls(self, rel: str = "") -> list[str]:
        """Names (not paths) directly under ``rel``; empty if it does not exist."""
        def run():
            try:
                entries = self.fs.ls(self._abs(rel), detail=False, refresh=True) if not self.is_local else self.fs.ls(self._abs(rel), detail=False)
            except FileNotFoundError:
                return []
            return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})
        return self._wrap("listing", rel, run)

    def _local_temp_file(self, path: str, data: bytes) -> str:
        """Write ``data`` durably to a temp file next to ``path``; returns its name."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=_temp_name(Path(path).name))
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
        :class:`AlreadyExists` if ``rel`` exists (local: hard link; S3: ``If-None-Match: *``).
        """
        path = self._abs(rel)
        if self.is_local:
            tmp = self._local_temp_file(path, data)
            try:
                if exclusive:
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        raise AlreadyExists(f"{self.url(rel)} already exists") from None
                else:
                    os.replace(tmp, path)
                _fsync_dir(Path(path).parent)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return

        def run():
            try:
                self.fs.pipe_file(path, data, mode="create" if exclusive else "overwrite")
            except FileExistsError:
                raise AlreadyExists(f"{self.url(rel)} already exists") from None
            except OSError as e:
                if exclusive and e.errno == errno.EINVAL and "precondition" in str(e).lower():
                    raise AlreadyExists(f"{self.url(rel)} already exists") from None
                raise
        self._wrap("writing", rel, run)

    def read_bytes(self, rel: str) -> bytes:
        return self._wrap("reading", rel, lambda: self.fs.cat_file(self._abs(rel)))

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

    def read_versioned(self, rel: str) -> tuple[bytes, str]:
        """(content, version) of ``rel``; the version changes with every write (S3: the ETag)."""
        path = self._abs(rel)
        if self.is_local:
            data = Path(path).read_bytes()
            return data, hashlib.sha256(data).hexdigest()

        def run():
            for _ in range(5):  # the ETag before and after the read must agree (no write in between)
                before = self.fs.info(path, refresh=True).get("ETag", "")
                data = self.fs.cat_file(path)
                after = self.fs.info(path, refresh=True).get("ETag", "")
                if before == after:
                    return data, str(after).strip('"')
            raise StorageError(f"{self.url(rel)} keeps changing while it is read")
        return self._wrap("reading", rel, run)

    def write_if_version(self, rel: str, data: bytes, version: str) -> None:
        """Replace ``rel`` only if it is still at ``version`` (else :class:`VersionConflict`)."""
        path = self._abs(rel)
        if self.is_local:
            with self._local_lock(path):
                try:
                    current = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                except FileNotFoundError:
                    current = None
                if current != version:
                    raise VersionConflict(f"{self.url(rel)} changed (expected version {version[:12]})")
                tmp = self._local_temp_file(path, data)
                os.replace(tmp, path)
                _fsync_dir(Path(path).parent)
            return

        def run():
            try:
                self.fs.pipe_file(path, data, IfMatch=f'"{version}"')
            except (OSError, FileNotFoundError) as e:
                if isinstance(e, FileNotFoundError) or e.errno == errno.EINVAL:
                    raise VersionConflict(f"{self.url(rel)} changed (expected version {version[:12]})") from None
                raise
        self._wrap("writing", rel, run)

    def delete_if_version(self, rel: str, version: str) -> bool:
        """Remove ``rel`` if it is still at ``version``; True if removed."""
        try:
            _, current = self.read_versioned(rel)
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
        import pyarrow.parquet as pq
        import io

        buf = io.BytesIO()
        pq.write_table(table, buf)
        self.write_bytes(rel, buf.getvalue(), exclusive=exclusive)
        return self.url(rel)

    def read_parquet(self, rel: str):
        import io
        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(self.read_bytes(rel)))

    # ------------------------------------------------------------------ sealed directories
    def put_dir(self, local_dir: str | Path, rel: str) -> str:
        """Upload a local directory to ``rel`` and seal it; returns its URI.

        Local stores copy into a temp sibling (fsynced) and rename it into place; remote
        stores upload every file and write the seal last. Anything already at ``rel``
        is replaced, and the new seal carries a fresh content id, so caches of the old
        content are never served for the new one.
        """
        local_dir = Path(local_dir)
        files = sorted(p for p in local_dir.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)
        seal = new_seal({p.relative_to(local_dir).as_posix(): p.stat().st_size for p in files})
        if self.is_local:
            with atomic_directory(self._abs(rel), durable=True) as tmp:
                for p in files:
                    target = tmp / p.relative_to(local_dir)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(p, target)
                (tmp / COMPLETE_MARKER).write_bytes(seal)
            return self.url(rel)

        def run():
            base = self._abs(rel)
            if self.fs.exists(base):
                self.fs.rm(base, recursive=True)
            for p in files:
                self.fs.put_file(str(p), f"{base}/{p.relative_to(local_dir).as_posix()}")
            self.fs.pipe_file(f"{base}/{COMPLETE_MARKER}", seal)
        self._wrap("uploading", rel, run)
        return self.url(rel)

    def is_complete(self, rel: str) -> bool:
        return self.exists(f"{rel.rstrip('/')}/{COMPLETE_MARKER}")

    def read_seal(self, rel: str) -> bytes | None:
        """The raw seal of a sealed directory, or None if it is not sealed."""
        try:
            return self.read_bytes(f"{rel.rstrip('/')}/{COMPLETE_MARKER}")
        except FileNotFoundError:
            return None

    def content_id(self, rel: str) -> str:
        """The content id of a sealed directory (changes whenever it is rewritten)."""
        seal = self.read_seal(rel)
        if seal is None:
            raise StorageError(f"{self.url(rel)} is not a complete (sealed) directory")
        return parse_seal(seal)["content_id"]

    def get_dir(self, rel: str, local_dir: str | Path, *, seal: bytes | None = None) -> Path:
        """Download a sealed directory into ``local_dir`` (atomically); raises if it is not sealed.

        Every key must land inside ``local_dir`` (a key with ``..`` is refused), every file
        the seal lists must arrive with its size, and the seal must not change during the
        download (a concurrent rewrite): otherwise StorageError and nothing is left behind.
        """
        seal = seal if seal is not None else self.read_seal(rel)
        if seal is None:
            raise StorageError(f"{self.url(rel)} is not a complete (sealed) directory")
        expected = parse_seal(seal).get("files")
        base = self._abs(rel)
        with atomic_directory(local_dir) as tmp:
            def run():
                for entry in sorted(self.fs.find(base)):
                    entry = entry if self.is_local else entry.split("://", 1)[-1]
                    if not entry.startswith(base + "/"):
                        raise StorageError(f"refusing {entry!r}: not under {self.url(rel)}")
                    key = entry[len(base) + 1:]
                    target = safe_join(tmp, key)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    self.fs.get_file(entry, str(target))
            self._wrap("downloading", rel, run)
            if (tmp / COMPLETE_MARKER).read_bytes() != seal:
                raise StorageError(f"{self.url(rel)} was rewritten while it was being downloaded; retry")
            if expected is not None:
                for name, size in expected.items():
                    p = safe_join(tmp, name)
                    if not p.is_file() or p.stat().st_size != size:
                        raise StorageError(f"{self.url(rel)}: {name} is missing or has the wrong size")
        return Path(local_dir)


def checkpoint_content_id(local_dir: str | Path) -> str:
    """Content id of a local checkpoint directory: its seal's, or (unsealed, e.g. a prepared base model)
    a digest of its files' names, sizes and modification times."""
    local_dir = Path(local_dir)
    marker = local_dir / COMPLETE_MARKER
    if marker.exists():
        return parse_seal(marker.read_bytes())["content_id"]
    h = hashlib.sha256()
    for p in sorted(local_dir.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(local_dir)}:{st.st_size}:{st.st_mtime_ns};".encode())
    return "unsealed-" + h.hexdigest()[:16]


def fetch_checkpoint(uri: str, *, endpoint_url: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """A model checkpoint URI → a local directory.

    Local paths are returned as they are. Remote (``s3://…``) checkpoints must be
    sealed; they are downloaded into ``cache_dir`` (default
    ``$RLCR_CACHE/checkpoints``) under a name made of the URI *and the seal's content
    id*, so a checkpoint rewritten at the same URI is downloaded again, never served
    stale. Each call reads the remote seal (one small GET).
    """
    if "://" not in uri or uri.startswith("file://"):
        path = Path(uri.removeprefix("file://")).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}: not a Hugging Face checkpoint directory (no config.json)")
        return path
    cache = Path(cache_dir) if cache_dir else default_cache_dir() / "checkpoints"
    parent, name = uri.rstrip("/").rsplit("/", 1)
    store = Store(parent, endpoint_url=endpoint_url)
    seal = store.read_seal(name)
    if seal is None:
        raise StorageError(f"{uri} is not a complete (sealed) directory")
    content_id = parse_seal(seal)["content_id"]
    local = cache / f"{hashlib.sha256(uri.encode()).hexdigest()[:20]}-{content_id[:24]}"
    marker = local / COMPLETE_MARKER
    if marker.exists() and marker.read_bytes() == seal:
        return local
    sweep_temporaries(cache, max_depth=0)
    return store.get_dir(name, local, seal=seal)


def iteration_prefix(run_id: str, iteration: int) -> str:
    """Store-relative folder of one iteration: ``runs/<run_id>/iter-<k>`` (k zero-padded to 4)."""
    return f"runs/{validate_run_id(run_id)}/iter-{iteration:04d}"
