"""The storage's errors: each message names the URI (or path) it is about."""

from __future__ import annotations

__all__ = ["StorageError", "AlreadyExists", "VersionConflict"]


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URI."""


class AlreadyExists(StorageError):
    """An exclusive (create-only) write found the object already there."""


class VersionConflict(StorageError):
    """A compare-and-swap write found another version than the one it expected."""
