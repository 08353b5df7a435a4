"""Local files that are never seen half-written: temporaries named by host and pid (swept once their writer is
dead, on this host only), directories replaced in one rename, durable (fsynced) writes, and paths confined to a
root. Used by the local :class:`~rlcr.storage.Store`, the checkpoint cache and the model cache."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path, PurePosixPath

from rlcr.storage.errors import NoSuchStore, RefusedFile, StorageError
from rlcr.untrusted import printable

__all__ = ["safe_join", "pid_alive", "sweep_temporaries", "atomic_directory", "new_temp_directory",
           "publish_directory", "temp_name", "fsync_dir",
           "read_regular", "KERNEL_TREES", "check_store_root", "HOST_ID"]

KERNEL_TREES = ("/proc", "/sys", "/dev")
"""Kernel file systems: their files claim a size of 0 and read without end, so no store lives or is read there."""

_TEMP_TAG = ".tmp-"  # every temporary this module creates is named ".<name>.tmp-<host id>-<pid>-<random>"
_TEMP_RE = re.compile(r"\.tmp-([0-9a-f]{12})-([0-9]{1,10})-[A-Za-z0-9_]*$")


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


def _host_id() -> str:
    """12 hex digits naming this host *and* its pid namespace, the scope in which a pid means something.

    A digest of the host name, ``/etc/machine-id`` and the pid namespace (containers sharing a host name
    but not their pids get different ids). Stable across restarts of a process on the same host."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/etc/machine-id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return hashlib.sha256("\0".join(parts).encode("utf-8", "replace")).hexdigest()[:12]


HOST_ID = _host_id()
"""This host's id (:func:`_host_id`), the one its temporaries' names carry (:func:`temp_name`)."""


def temp_name(name: str) -> str:
    """Prefix of a temporary for ``name``: ``.<name>.tmp-<host id>-<pid>-`` (the caller adds a random tail)."""
    return f".{name}{_TEMP_TAG}{HOST_ID}-{os.getpid()}-"


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

    Only names this module creates (``.<name>.tmp-<host id>-<pid>-…``) *with this host's id* are touched:
    a pid says nothing about another host's processes, so on a shared cache or store other hosts'
    temporaries (possibly downloads in progress) are left alone, and so are names of the older
    ``.<name>.tmp-<pid>-…`` format, which do not say their host. Returns what was removed.
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
            pid = int(m.group(2)) if m and m.group(1) == HOST_ID else 0
            if e.name.startswith(".") and pid and pid != os.getpid() and not pid_alive(pid):
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


def _in_kernel_tree(real: str) -> bool:
    return any(real == t or real.startswith(t + "/") for t in KERNEL_TREES)


def read_regular(path: str | Path, limit: int, source: str) -> bytes:
    """The bytes of the local regular file ``path`` (``source``: how errors name it), at most ``limit`` of them.

    Absent (or a parent that is a file): ``FileNotFoundError`` / ``NotADirectoryError``, as a read would raise.
    Anything that is not a regular file, its links followed (a FIFO, which would block the read for ever, a
    device such as ``/dev/zero``, which never ends, a socket, a folder, a file under ``/proc``, ``/sys`` or
    ``/dev``), or a file larger than ``limit`` is :class:`RefusedFile`, one line naming it, decided from
    ``stat`` before a byte is read (the open does not block, and ``fstat`` checks what was opened); no more than
    ``limit + 1`` bytes are ever read (a file growing meanwhile)."""
    name = printable(source, 300)
    real = os.path.realpath(path)
    if _in_kernel_tree(real):
        raise RefusedFile(f"{name}: a kernel file (under /{real.split('/')[1]}); refusing to read it")
    special = f"{name}: not a regular file (a FIFO, device, socket or folder); refusing to read it"
    try:
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedFile(special)
        if st.st_size > limit:
            raise RefusedFile(f"{name}: {st.st_size:,} bytes, more than the {limit:,} allowed; refusing to read it")
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped for something else after the stat
                raise RefusedFile(special)
            data = f.read(limit + 1)
    except (FileNotFoundError, NotADirectoryError):  # not there: the caller's answer, as a plain read gives it
        raise
    except OSError as e:
        raise RefusedFile(f"{name}: cannot be read ({printable(e.strerror or type(e).__name__, 80)})") from None
    if len(data) > limit:
        raise RefusedFile(f"{name}: more than the {limit:,} bytes allowed; refusing to read it")
    return data


def check_store_root(root: str, *, create: bool) -> None:
    """A local store's root (resolved) can be used: never under ``/proc``, ``/sys`` or ``/dev``; created if
    ``create`` (a one-line :class:`NoSuchStore` if it cannot be), else it must already be a directory: a command
    that only reads creates nothing, so a mistyped path is refused instead of becoming an empty store."""
    if _in_kernel_tree(root):
        raise NoSuchStore(f"{printable(root, 300)}: under /{root.split('/')[1]}, a kernel file system; "
                          f"refusing it as a store")
    if create:
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as e:
            raise NoSuchStore(f"{printable(root, 300)}: cannot be created as a store "
                              f"({printable(e.strerror or type(e).__name__, 80)})") from None
    elif not os.path.isdir(root):
        what = "not a directory" if os.path.exists(root) else "no such directory"
        raise NoSuchStore(f"{printable(root, 300)}: {what}; a command that only reads creates no store "
                          f"(check storage.uri)")


def fsync_dir(path: str | Path) -> None:
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
            fsync_dir(p)
    fsync_dir(path)


def new_temp_directory(dest: str | Path) -> Path:
    """A fresh, empty temp sibling of ``dest`` (named by :func:`temp_name`), to fill and then
    :func:`publish_directory` as ``dest``. An existing ``dest`` must be a real directory: a symbolic link or anything
    else there is refused with StorageError before anything is written, never moved or deleted."""
    dest = Path(dest)
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise StorageError(f"refusing to replace {dest}: it is a symbolic link or not a directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=temp_name(dest.name), dir=dest.parent))


def publish_directory(tmp: str | Path, dest: str | Path, *, durable: bool = False) -> None:
    """Replace ``dest`` by the filled temp sibling ``tmp`` (:func:`new_temp_directory`) in one rename; an old
    ``dest`` is moved aside first (a rename, so ``dest`` is never missing for long), then removed. ``durable``:
    fsync the files and directories before and after the rename."""
    tmp, dest = Path(tmp), Path(dest)
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise StorageError(f"refusing to replace {dest}: it is a symbolic link or not a directory")
    if durable:
        _fsync_tree(tmp)
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=temp_name(dest.name), dir=dest.parent))
        os.replace(dest, old / "x")
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)
    if durable:
        fsync_dir(dest.parent)


@contextlib.contextmanager
def atomic_directory(dest: str | Path, *, durable: bool = False):
    """Yield a temp sibling of ``dest`` to fill; on success it replaces ``dest`` in one rename
    (:func:`new_temp_directory`, :func:`publish_directory`).

    On failure it is removed, so ``dest`` is never seen half-written; a writer killed before
    that leaves a ``.<name>.tmp-<host id>-<pid>-…`` sibling that :func:`sweep_temporaries` removes later.
    ``durable``: fsync the files and directories before and after the rename. An existing ``dest``
    must be a real directory (it is moved aside, then removed): a symbolic link or anything else
    there is refused with StorageError before anything is written, never moved or deleted.
    """
    tmp = new_temp_directory(dest)
    try:
        yield tmp
        publish_directory(tmp, dest, durable=durable)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
