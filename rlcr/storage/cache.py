"""The per-node cache of remote checkpoints: a sealed ``s3://…`` checkpoint downloaded once per (URI, seal
content id), so a directory rewritten at the same URI is fetched again and never served stale. Every name in
the cache is derived from checked values only (a parsed seal, a hash of the URI)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from rlcr.storage.errors import StorageError
from rlcr.storage.local import sweep_temporaries
from rlcr.storage.seals import COMPLETE_MARKER, read_bounded
from rlcr.untrusted import printable

__all__ = ["default_cache_dir", "fetch_checkpoint"]

_CACHE_ENTRY_RE = re.compile(r"[0-9a-f]{20}-[0-9a-f]{24}")


def default_cache_dir() -> Path:
    """``$RLCR_CACHE`` or ``~/.cache/rlcr``: per-node caches (models, fetched checkpoints)."""
    return Path(os.environ.get("RLCR_CACHE", Path.home() / ".cache" / "rlcr"))


def fetch_checkpoint(uri: str, *, endpoint_url: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """A model checkpoint URI → a local directory, as stored (an adapter checkpoint of a LoRA run as its adapter:
    :func:`rlcr.models.adapters.fetch_model` gives every checkpoint as a model).

    Local paths are returned as they are. Remote (``s3://…``) checkpoints must be
    sealed; they are downloaded into ``cache_dir`` (default
    ``$RLCR_CACHE/checkpoints``) under a name made of the URI *and the seal's content
    id*, so a checkpoint rewritten at the same URI is downloaded again, never served
    stale. Each call reads the remote seal (one small GET).

    The seal is checked (:func:`parse_seal`, else :class:`InvalidSeal`) before its content id names
    anything, and the cache entry is always a direct child of the cache named
    ``<20 hex>-<24 hex>``. An entry already there is replaced only if it is a real directory with a
    seal (one this cache wrote); anything else at that name raises StorageError and is left alone.
    """
    return _fetch_dir(uri, endpoint_url=endpoint_url, cache_dir=cache_dir)


def _fetch_dir(uri: str, *, endpoint_url: str | None, cache_dir: str | Path | None) -> Path:
    if "://" not in uri or uri.startswith("file://"):
        path = Path(uri.removeprefix("file://")).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}: not a Hugging Face checkpoint directory (no config.json)")
        return path
    cache = Path(cache_dir) if cache_dir else default_cache_dir() / "checkpoints"
    parent, name = uri.rstrip("/").rsplit("/", 1)
    from rlcr.storage import Store  # the package imports this module first

    store = Store(parent, endpoint_url=endpoint_url)
    seal = store.read_seal(name)
    if seal is None:
        raise StorageError(f"{uri} is not a complete (sealed) directory")
    content_id = store.parse_seal(name, seal)["content_id"]
    local = _cache_entry(cache, uri, content_id)
    marker = local / COMPLETE_MARKER
    if not local.is_symlink() and marker.is_file() and read_bounded(marker) == seal:
        return local
    if local.is_symlink() or local.exists():
        if local.is_symlink() or not local.is_dir() or not marker.is_file() or marker.is_symlink():
            raise StorageError(f"{printable(str(local), 300)}: in the checkpoint cache but not a checkpoint it "
                               f"wrote; refusing to replace it (remove it to fetch {uri} again)")
    sweep_temporaries(cache, max_depth=0)
    return store.get_dir(name, local, seal=seal)


def _cache_entry(cache: Path, uri: str, content_id: str) -> Path:
    """``cache/<sha256(uri)[:20]>-<content_id[:24]>`` for a checked content id; refuses any other shape."""
    name = f"{hashlib.sha256(uri.encode()).hexdigest()[:20]}-{content_id[:24]}"
    local = cache / name
    if not _CACHE_ENTRY_RE.fullmatch(name) or local.parent != cache:
        raise StorageError(f"refusing cache entry {printable(name)!r} for {printable(uri)}: not a plain name")
    return local

