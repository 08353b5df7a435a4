"""The ``_COMPLETE`` seal of a directory that must never be seen half-written (a checkpoint): a small JSON
document written last, with a fresh random ``content_id`` and every file's size. A seal is input from outside:
:func:`parse_seal` checks every field (a content id of 32 lowercase hex digits, safe relative file names, sizes)
before anything uses it. :func:`sealable_files` lists what a local directory would be sealed with."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any

from rlcr.storage.errors import StorageError
from rlcr.untrusted import InvalidInput, field, parse_json, printable, read_local

__all__ = ["COMPLETE_MARKER", "MAX_SEAL_BYTES", "MAX_SEAL_FILES", "MAX_NAME_CHARS", "MAX_FILE_BYTES", "InvalidSeal",
           "Unsealable",
           "new_seal", "parse_seal", "read_bounded", "sealable_files", "checkpoint_content_id"]

COMPLETE_MARKER = "_COMPLETE"
MAX_SEAL_BYTES = 4 * 1024 * 1024
"""Largest ``_COMPLETE`` document read (bytes); a larger one is refused before it is parsed."""
MAX_SEAL_FILES = 100_000
"""Most files one sealed directory may hold."""
MAX_NAME_CHARS = 1024
"""Longest relative file name in a seal (characters); each ``/``-separated segment: at most 255 bytes."""
MAX_FILE_BYTES = 2 ** 44
"""Largest size a seal may give a file (16 TiB)."""
_CONTENT_ID_RE = re.compile(r"[0-9a-f]{32}")


class InvalidSeal(StorageError, InvalidInput):
    """A ``_COMPLETE`` seal failed a check; the one-line message names it and what is wrong."""


class Unsealable(StorageError, InvalidInput):
    """A local directory cannot be sealed as it is (a dangling link, a special file, a name a seal refuses …);
    the one-line message names the entry, shown through :func:`printable`."""


def _shown(path: Any) -> str:
    return printable(str(path), 300)


def _name_problem(name: Any) -> str | None:
    """Why ``name`` is not a safe relative file name for a sealed directory, or None if it is.

    Safe: a non-empty string of at most :data:`MAX_NAME_CHARS` printable characters, not absolute,
    no backslash, ``/``-separated segments that are neither empty nor ``.`` nor ``..`` and at most
    255 bytes each, and not the seal's own name."""
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if len(name) > MAX_NAME_CHARS:
        return f"is longer than {MAX_NAME_CHARS} characters"
    if name.startswith("/"):
        return "is absolute"
    if "\\" in name:
        return "holds a backslash"
    if not name.isprintable():
        return "holds a control or non-printing character"
    parts = name.split("/")
    if ".." in parts:
        return "climbs out with '..' (it would resolve outside the directory)"
    if any(p in ("", ".") for p in parts):
        return "has an empty or '.' segment"
    if any(len(p.encode("utf-8", "surrogatepass")) > 255 for p in parts):
        return "has a segment longer than 255 bytes"
    if name == COMPLETE_MARKER:
        return "is the seal itself"
    return None


def new_seal(files: dict[str, int]) -> bytes:
    """The ``_COMPLETE`` document of a directory: a fresh content id and every file's size.

    Raises StorageError if a name or size would not pass :func:`parse_seal`."""
    for name, size in files.items():
        problem = _name_problem(name)
        if problem:
            raise StorageError(f"cannot seal a file named {printable(repr(name), 120)}: the name {problem}")
        if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
            raise StorageError(f"cannot seal {printable(name)}: size {size!r} is not an int in [0, {MAX_FILE_BYTES}]")
    if len(files) > MAX_SEAL_FILES:
        raise StorageError(f"cannot seal {len(files):,} files: at most {MAX_SEAL_FILES:,}")
    return json.dumps({"content_id": uuid.uuid4().hex, "files": dict(sorted(files.items())),
                       "sealed_at": time.time()}, indent=1).encode()


def parse_seal(data: bytes, source: str = COMPLETE_MARKER) -> dict[str, Any]:
    """The checked fields of a seal read from ``source`` (a URI or path, named in errors).

    Guaranteed on return: ``content_id`` is 32 lowercase hex digits (what :func:`new_seal` writes);
    ``files`` maps at most :data:`MAX_SEAL_FILES` safe relative names (see :func:`_name_problem`; no
    name is also another's directory) to int sizes in ``[0, MAX_FILE_BYTES]``; ``sealed_at`` is a
    finite number or None. Anything else — too large, not JSON, a missing or ill-typed field — raises
    :class:`InvalidSeal` in one line. Plain ``ok`` seals of the first storage version are refused too:
    they list no files and all share one content id, so neither the download check nor the cache key
    could be trusted; writing the directory again (:meth:`Store.put_dir`) seals it anew."""
    try:
        doc = parse_json(data, source, max_bytes=MAX_SEAL_BYTES)
        content_id = field(doc, "content_id", str, source)
        files = field(doc, "files", dict, source)
        sealed_at = field(doc, "sealed_at", float, source, default=None)
    except InvalidInput as e:
        hint = "; a plain seal from before content ids: write the directory again to reseal it" \
            if data.strip() == b"ok" else ""
        raise InvalidSeal(f"{e}{hint}") from None
    where = printable(source)
    if not _CONTENT_ID_RE.fullmatch(content_id):
        raise InvalidSeal(f"{where}: content_id {printable(repr(content_id[:100]), 80)} is not 32 lowercase hex digits")
    if len(files) > MAX_SEAL_FILES:
        raise InvalidSeal(f"{where}: lists {len(files):,} files, more than the {MAX_SEAL_FILES:,} allowed")
    for name, size in files.items():
        problem = _name_problem(name)
        if problem:
            raise InvalidSeal(f"{where}: file name {printable(repr(name), 120)} {problem}")
        if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
            raise InvalidSeal(f"{where}: size of {printable(name, 120)} must be an int in [0, {MAX_FILE_BYTES}], "
                              f"found {printable(repr(size), 40)}")
    for name in files:
        cut = name.rfind("/")
        while cut > 0:
            if name[:cut] in files:
                raise InvalidSeal(f"{where}: {printable(name[:cut], 120)} is listed as a file and as a directory")
            cut = name.rfind("/", 0, cut)
    return {"content_id": content_id, "files": dict(files), "sealed_at": sealed_at}


def read_bounded(path: str | Path, limit: int = MAX_SEAL_BYTES) -> bytes:
    """At most ``limit + 1`` bytes of a local regular file (enough to tell that it is too large).

    ``FileNotFoundError`` if it is not there (nothing sealed); anything else that cannot be read as a regular
    file — a link to a FIFO, a device or ``/proc/self/pagemap`` — is :class:`InvalidSeal`, one line naming it."""
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
    try:
        return read_local(path, limit, overflow=True)
    except InvalidInput as e:
        raise InvalidSeal(str(e)) from None


def sealable_files(root: Path) -> list[tuple[str, Path, int]]:
    """(name, path, size) of every regular file under ``root``, symbolic links followed, sorted by name.

    The top-level ``_COMPLETE`` (a seal already there) is left out. Raises StorageError naming the
    entry for a dangling link, a link loop (a directory reached again inside itself), anything not a
    file or directory (FIFO, socket, device), a name :func:`parse_seal` would refuse, or more than
    :data:`MAX_SEAL_FILES` files; so what is sealed is everything the directory shows, or nothing. These
    refusals are :class:`Unsealable` (a StorageError and an InvalidInput: one line on the command line),
    every name shown through :func:`printable`."""
    found: list[tuple[str, Path, int]] = []

    def walk(d: Path, prefix: str, ancestors: frozenset) -> None:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            raise Unsealable(f"cannot list {_shown(d)}: {e.strerror}") from None
        for e in entries:
            name, path = prefix + e.name, Path(e.path)
            if name == COMPLETE_MARKER:
                continue
            try:
                st = os.stat(path)  # follows symbolic links
            except OSError as err:
                if path.is_symlink():
                    what = "a symbolic link loop" if err.errno == errno.ELOOP else "a dangling symbolic link"
                    raise Unsealable(f"{_shown(path)}: {what} (to {printable(repr(os.readlink(path)), 200)}); "
                                     f"refusing to seal {_shown(root)} without its target") from None
                raise Unsealable(f"{_shown(path)}: {err.strerror}") from None
            problem = _name_problem(name)
            if problem:
                raise Unsealable(f"{_shown(path)}: cannot be sealed, its name {problem}")
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in ancestors:
                    raise Unsealable(f"{_shown(path)}: a symbolic link loop "
                                     "(it leads back to a directory that holds it)")
                walk(path, name + "/", ancestors | {(st.st_dev, st.st_ino)})
            elif stat.S_ISREG(st.st_mode):
                found.append((name, path, st.st_size))
                if len(found) > MAX_SEAL_FILES:
                    raise Unsealable(f"{_shown(root)}: more than {MAX_SEAL_FILES:,} files; refusing to seal it")
            else:
                raise Unsealable(f"{_shown(path)}: neither a file nor a directory; refusing to seal it")

    try:
        st = os.stat(root)
    except OSError as e:
        raise Unsealable(f"{_shown(root)}: {e.strerror}") from None
    walk(root, "", frozenset({(st.st_dev, st.st_ino)}))
    return sorted(found)


def checkpoint_content_id(local_dir: str | Path) -> str:
    """Content id of a local checkpoint directory: its seal's (checked by :func:`parse_seal`, else
    :class:`InvalidSeal`), or (unsealed, e.g. a prepared base model) ``unsealed-`` and a digest of its
    files' names, sizes and modification times."""
    local_dir = Path(local_dir)
    marker = local_dir / COMPLETE_MARKER
    if marker.exists():
        return parse_seal(read_bounded(marker), str(marker))["content_id"]
    h = hashlib.sha256()
    for p in sorted(local_dir.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(local_dir)}:{st.st_size}:{st.st_mtime_ns};".encode())
    return "unsealed-" + h.hexdigest()[:16]
