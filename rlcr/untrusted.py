"""Reading what came from outside: files, stores, model output. Everything here is hostile until checked.

Three rules, one helper each:

- :func:`printable` — a string that came from a file (a lease's owner, Parquet provenance, a file name, a
  task field) reaches the terminal only through it: control characters (ANSI escapes, bell, backspace,
  bidi overrides) are replaced and the length is bounded, so a file can neither drive the terminal nor
  make printing slow.
- :func:`parse_json` / :func:`decode_text` — bounded parsing: a size limit, a nesting limit checked by a
  linear scan *before* the parser recurses, and a one-line :class:`InvalidInput` naming the source instead
  of ``UnicodeDecodeError``, ``JSONDecodeError`` or ``RecursionError``.
- :func:`read_local` — a local file read bounded: at most ``limit`` bytes, and only a regular file (a link is
  followed first); a FIFO, a device or a kernel file (``/proc``, ``/sys``) is refused by name before it is read.
- :func:`field` — a typed field of a parsed document, with a bounded numeric range, or :class:`InvalidInput`
  naming the source and the field (never a ``KeyError`` / ``TypeError`` / ``OverflowError``).

Pure Python, no third-party imports: every layer may use it.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import unicodedata
from typing import Any

__all__ = ["InvalidInput", "printable", "markdown_text", "parse_json", "decode_text", "field", "check_depth",
           "read_local", "MAX_JSON_BYTES", "MAX_DEPTH", "DuplicateKey", "unique_keys", "loads_unique"]

MAX_JSON_BYTES = 4 * 1024 * 1024
"""Largest control document (manifest, seal, lease, pending draft, config record) read, in bytes."""
MAX_DEPTH = 64
"""Deepest nesting of brackets accepted in a JSON or YAML document from outside."""

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


class InvalidInput(ValueError):
    """Input from outside failed a check; the one-line message names the file (or field) and what is wrong."""


def printable(value: Any, limit: int = 200) -> str:
    """``value`` as one line safe for a terminal: control characters shown as ``?``, newlines and tabs as
    spaces, at most ``limit`` characters (the rest counted, not shown). Linear in ``limit``, whatever the input."""
    text = value if isinstance(value, str) else str(value)
    extra = len(text) - limit
    if extra > 0:
        text = text[:limit]
    text = text.replace("\n", " ").replace("\r", " ").replace("\t", " ")
    text = _CONTROL.sub("?", text)
    # any other non-printing code point (format and unassigned categories) is replaced too
    text = "".join(c if c.isprintable() or unicodedata.category(c) == "Zs" else "?" for c in text)
    return text + (f"… ({extra} more characters)" if extra > 0 else "")


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~])")


def markdown_text(value: Any, limit: int = 200) -> str:
    """``value`` (a string from a file or a config) as literal text in Markdown that may hold HTML (a Prefect
    artifact): :func:`printable`, then ``& < >`` as HTML entities and every Markdown punctuation character
    backslash-escaped, so it can open no tag, link, emphasis, table cell or code span."""
    text = printable(value, limit).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def check_depth(text: str | bytes, source: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`InvalidInput` if brackets (``[ {``, outside JSON strings) nest deeper than ``max_depth``.

    One linear pass, no recursion: run it before a recursive parser sees the text."""
    data = text.encode("utf-8", "replace") if isinstance(text, str) else text
    depth, in_str, escaped = 0, False, False
    for b in data:
        if in_str:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:
                in_str = False
            continue
        if b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):
            depth += 1
            if depth > max_depth:
                raise InvalidInput(f"{printable(source)}: nested deeper than {max_depth} levels; refusing to parse it")
        elif b in (0x5D, 0x7D):
            depth -= 1


def decode_text(data: bytes, source: str, *, max_bytes: int | None = None) -> str:
    """UTF-8 text of ``data`` (a BOM is dropped), or :class:`InvalidInput` naming ``source`` and the byte offset."""
    if max_bytes is not None and len(data) > max_bytes:
        raise InvalidInput(f"{printable(source)}: {len(data):,} bytes, more than the {max_bytes:,} allowed")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{printable(source)}: not UTF-8 text (invalid byte at offset {e.start})") from None


_KERNEL_FILES = ("/proc/", "/sys/", "/dev/")


def read_local(path: str | os.PathLike, limit: int, source: str | None = None, *, overflow: bool = False) -> bytes:
    """The bytes of the local file ``path`` (named ``source`` in errors, default the path), at most ``limit``
    (``overflow``: ``limit + 1`` bytes of a larger file are returned, for the caller to word the refusal).

    The file, its links followed, must be a regular file outside ``/proc``, ``/sys`` and ``/dev`` (kernel files
    claim a size of 0 and read without end); it is opened without blocking (a FIFO swapped in after the check
    is caught by ``fstat``). Anything else — not there, unreadable, special, larger than ``limit`` — is an
    :class:`InvalidInput` in one line naming the file, never an ``OSError``."""
    name = printable(source if source is not None else os.fspath(path))
    try:
        real = os.path.realpath(path)
        if (real + "/").startswith(_KERNEL_FILES):
            raise InvalidInput(f"{name}: a special file (under /{real.split('/')[1]}); refusing to read it")
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise InvalidInput(f"{name}: not a regular file (a FIFO, socket or device); refusing to read it")
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise InvalidInput(f"{name}: not a regular file (a FIFO, socket or device); refusing to read it")
            data = f.read(limit + 1)
    except OSError as e:
        raise InvalidInput(f"{name}: cannot be read ({printable(e.strerror or type(e).__name__, 80)})") from None
    if len(data) > limit and not overflow:
        raise InvalidInput(f"{name}: larger than the {limit:,} bytes allowed")
    return data


class DuplicateKey(ValueError):
    """A JSON object (or YAML mapping) from outside holds the same key twice; ``key`` is that key."""

    def __init__(self, key: Any):
        super().__init__(f"duplicate key {printable(repr(key), 80)}")
        self.key = key


def unique_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """``json``'s ``object_pairs_hook`` that refuses a key given twice (:class:`DuplicateKey`) instead of keeping
    the last value without a word, at any depth."""
    out: dict[Any, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def loads_unique(text: str, **kwargs: Any) -> Any:
    """``json.loads(text)`` refusing duplicate keys (:class:`DuplicateKey`, a ``ValueError``); no size or depth
    check (:func:`parse_json` has them; run :func:`check_depth` first on text from outside)."""
    return json.loads(text, object_pairs_hook=unique_keys, **kwargs)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(data: bytes | str, source: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH,
               kind: type | None = dict, allow_nonfinite: bool = False) -> Any:
    """Parse a JSON document from outside, bounded in size and nesting; ``kind``: the top-level type required.

    Raises :class:`InvalidInput` with one line naming ``source`` for anything else: too large, not UTF-8,
    too deep, not JSON (``NaN`` and ``Infinity`` included unless ``allow_nonfinite``: figures a run wrote
    itself, where NaN means "nothing to average"), an object holding a key twice (named), or the wrong
    top-level type."""
    if isinstance(data, (bytes, bytearray)):
        if len(data) > max_bytes:
            raise InvalidInput(f"{printable(source)}: {len(data):,} bytes, more than the {max_bytes:,} allowed")
        text = decode_text(bytes(data), source)
    else:
        text = data
        if len(text) > max_bytes:
            raise InvalidInput(f"{printable(source)}: {len(text):,} characters, more than the {max_bytes:,} allowed")
    check_depth(text, source, max_depth)
    try:
        doc = loads_unique(text) if allow_nonfinite else loads_unique(text, parse_constant=_reject_constant)
    except DuplicateKey as e:
        raise InvalidInput(f"{printable(source)}: {e}") from None
    except ValueError as e:
        raise InvalidInput(f"{printable(source)}: not valid JSON ({printable(e, 120)})") from None
    except RecursionError:  # the scan above makes this unreachable; kept as a guard
        raise InvalidInput(f"{printable(source)}: nested too deeply") from None
    if kind is not None and not isinstance(doc, kind):
        raise InvalidInput(f"{printable(source)}: expected a JSON {'object' if kind is dict else kind.__name__}, "
                           f"found {type(doc).__name__}")
    return doc


_MISSING = object()


def field(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], source: str, *, default: Any = _MISSING,
          lo: float | None = None, hi: float | None = None) -> Any:
    """``doc[key]`` checked to be of ``kind`` (``bool`` is never an ``int`` here) and, for numbers, finite and
    within ``[lo, hi]``; ``default`` when absent (if given). Anything else: :class:`InvalidInput` naming the
    source and the field, in one line."""
    if key not in doc:
        if default is not _MISSING:
            return default
        raise InvalidInput(f"{printable(source)}: field {key!r} is missing")
    value = doc[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds) or (float in kinds and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise InvalidInput(f"{printable(source)}: field {key!r} must be {names}, found "
                           f"{type(value).__name__} {printable(repr(value), 60)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(f"{printable(source)}: field {key!r} must be finite, found {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise InvalidInput(f"{printable(source)}: field {key!r} = {printable(repr(value), 40)} is outside "
                               f"[{lo}, {hi}]")
    return value
