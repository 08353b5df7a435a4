"""One fsspec-based store for every artifact: checkpoints, rollouts, metrics, reports.

``Store("./runs-store")`` is a local directory; ``Store("s3://bucket/prefix")`` goes
through s3fs with credentials from the standard AWS environment and an optional
endpoint for S3-compatible servers (MinIO, moto). Directories that must never be
seen half-written (checkpoints) are uploaded file by file and then sealed with a
``_COMPLETE`` marker written last; readers only trust sealed directories.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import fsspec

__all__ = ["Store", "COMPLETE_MARKER", "fetch_checkpoint", "StorageError", "iteration_prefix", "atomic_directory"]

COMPLETE_MARKER = "_COMPLETE"


@contextlib.contextmanager
def atomic_directory(dest: str | Path):
    """Yield a temp sibling of ``dest`` to fill; on success it replaces ``dest`` in one rename.

    On failure it is removed, so ``dest`` is never seen half-written.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URI."""


def _split(uri: str) -> tuple[str, str]:
    if "://" in uri:
        protocol, rest = uri.split("://", 1)
        return protocol, rest.rstrip("/")
    return "file", str(Path(uri).expanduser().resolve())


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
        return f"{self.root}/{rel}" if rel else self.root

    def url(self, rel: str = "") -> str:
        """Full URI of ``rel`` (``s3://…`` or an absolute local path)."""
        path = self._abs(rel)
        return path if self.is_local else f"{self.protocol}://{path}"

    def rel(self, uri: str) -> str:
        """Inverse of :meth:`url` for URIs under this store."""
        _, path = _split(uri)
        if not path.startswith(self.root):
            raise StorageError(f"{uri} is not under {self.uri}")
        return path[len(self.root):].strip("/")

    # ------------------------------------------------------------------ basic IO
    def _wrap(self, what: str, rel: str, fn):
        try:
            return fn()
        except FileNotFoundError:
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

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a whole file. Local: temp file + rename (atomic); S3: one PUT (atomic)."""
        path = self._abs(rel)
        if self.is_local:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return
        self._wrap("writing", rel, lambda: self.fs.pipe_file(path, data))

    def read_bytes(self, rel: str) -> bytes:
        return self._wrap("reading", rel, lambda: self.fs.cat_file(self._abs(rel)))

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_bytes(rel))

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def rm(self, rel: str) -> None:
        def run():
            if self.fs.exists(self._abs(rel)):
                self.fs.rm(self._abs(rel), recursive=True)
        self._wrap("removing", rel, run)

    # ------------------------------------------------------------------ parquet
    def write_parquet(self, rel: str, table) -> str:
        import pyarrow.parquet as pq
        import io

        buf = io.BytesIO()
        pq.write_table(table, buf)
        self.write_bytes(rel, buf.getvalue())
        return self.url(rel)

    def read_parquet(self, rel: str):
        import io
        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(self.read_bytes(rel)))

    # ------------------------------------------------------------------ sealed directories
    def put_dir(self, local_dir: str | Path, rel: str) -> str:
        """Upload a local directory to ``rel`` and seal it; returns its URI.

        Local stores copy into a temp sibling and rename it into place; remote
        stores upload every file and write ``_COMPLETE`` last. Anything already at
        ``rel`` that is not sealed (a crashed earlier attempt) is replaced.
        """
        local_dir = Path(local_dir)
        files = sorted(p for p in local_dir.rglob("*") if p.is_file())
        if self.is_local:
            with atomic_directory(self._abs(rel)) as tmp:
                for p in files:
                    target = tmp / p.relative_to(local_dir)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(p, target)
                (tmp / COMPLETE_MARKER).write_text("ok")
            return self.url(rel)

        def run():
            base = self._abs(rel)
            if self.fs.exists(base):
                self.fs.rm(base, recursive=True)
            for p in files:
                self.fs.put_file(str(p), f"{base}/{p.relative_to(local_dir).as_posix()}")
            self.fs.pipe_file(f"{base}/{COMPLETE_MARKER}", b"ok")
        self._wrap("uploading", rel, run)
        return self.url(rel)

    def is_complete(self, rel: str) -> bool:
        return self.exists(f"{rel.rstrip('/')}/{COMPLETE_MARKER}")

    def get_dir(self, rel: str, local_dir: str | Path) -> Path:
        """Download a sealed directory into ``local_dir`` (atomically); raises if it is not sealed."""
        if not self.is_complete(rel):
            raise StorageError(f"{self.url(rel)} is not a complete (sealed) directory")
        base = self._abs(rel)
        with atomic_directory(local_dir) as tmp:
            if self.is_local:
                shutil.copytree(base, tmp, dirs_exist_ok=True)
            else:
                def run():
                    for entry in self.fs.find(base):
                        target = tmp / entry[len(base):].lstrip("/")
                        target.parent.mkdir(parents=True, exist_ok=True)
                        self.fs.get_file(entry, str(target))
                self._wrap("downloading", rel, run)
        return Path(local_dir)


def fetch_checkpoint(uri: str, *, endpoint_url: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """A model checkpoint URI → a local directory.

    Local paths are returned as they are. Remote (``s3://…``) checkpoints must be
    sealed; they are downloaded once into ``cache_dir`` (default
    ``$RLCR_CACHE/checkpoints``), keyed by the URI, and reused afterwards.
    """
    if "://" not in uri or uri.startswith("file://"):
        path = Path(uri.removeprefix("file://")).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}: not a Hugging Face checkpoint directory (no config.json)")
        return path
    from rlcr.models import default_cache_dir

    cache = Path(cache_dir) if cache_dir else default_cache_dir() / "checkpoints"
    local = cache / hashlib.sha256(uri.encode()).hexdigest()[:20]
    if (local / COMPLETE_MARKER).exists():
        return local
    parent, name = uri.rstrip("/").rsplit("/", 1)
    return Store(parent, endpoint_url=endpoint_url).get_dir(name, local)


def iteration_prefix(run_id: str, iteration: int) -> str:
    """Store-relative folder of one iteration: ``runs/<run_id>/iter-<k>`` (k zero-padded to 4)."""
    return f"runs/{run_id}/iter-{iteration:04d}"
