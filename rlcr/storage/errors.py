"""The storage's errors: each message names the URI (or path) it is about."""

from __future__ import annotations

from rlcr.untrusted import InvalidInput

__all__ = ["StorageError", "AlreadyExists", "VersionConflict", "RefusedFile", "NoSuchStore"]


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URI."""


class AlreadyExists(StorageError):
    """An exclusive (create-only) write found the object already there."""


class VersionConflict(StorageError):
    """A compare-and-swap write found another version than the one it expected."""


class RefusedFile(StorageError, InvalidInput):
    """A file of the store refused before it was read: larger than the read allows, or not a regular file (a FIFO,
    a device, a socket, a folder, a kernel file). One line naming it; a StorageError and an InvalidInput."""


class NoSuchStore(StorageError, InvalidInput):
    """A store location that cannot be used: missing where a command only reads (nothing is created), under
    ``/proc``, ``/sys`` or ``/dev``, or not creatable. One line naming it."""
