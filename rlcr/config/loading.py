"""Reading a config from outside: the bounded YAML loader, ``section.field=value`` overrides and one-line
:class:`ConfigError` messages that name the field (dotted) and the file. Everything here is hostile input."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from pydantic import ValidationError

from rlcr.config.legacy import FLAT_NAMES, MOVED_NAMES
from rlcr.untrusted import MAX_DEPTH, InvalidInput, decode_text, printable

MAX_CONFIG_BYTES = 256 * 1024
"""Largest YAML config file read, in bytes (configs are a few kB)."""
MAX_OVERRIDE_CHARS = 16 * 1024
"""Longest ``section.field=value`` override accepted."""
_MAX_ERRORS = 10
"""Validation errors listed in one :class:`ConfigError` (the rest are counted)."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


def read_config_text(path: str | Path) -> str:
    """The text of a config file: at most :data:`MAX_CONFIG_BYTES`, UTF-8; else a :class:`ConfigError`."""
    name = printable(path)
    try:
        with open(Path(path).expanduser(), "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{name}: config file not found") from None
    except OSError as e:
        reason = printable(e.strerror or type(e).__name__)
        raise ConfigError(f"{name}: cannot read the config file ({reason})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name}: more than the {MAX_CONFIG_BYTES:,} bytes a config file may hold")
    try:
        return decode_text(data, name)
    except InvalidInput as e:
        raise ConfigError(str(e)) from None


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses anchors and aliases (no exponential expansion: "billion laughs") and
    collections nested deeper than :data:`~rlcr.untrusted.MAX_DEPTH`, block or flow style alike. Both are
    checked in the composer, as each node starts, before it is built: the constructor never recurses
    further than that. A mapping that holds a key twice, at any depth, is refused naming the key and its
    line (PyYAML would keep the last value without a word); so is a merge key (``<<:``), through which a key
    could be given twice unseen."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(None, None, "anchors and aliases (& and *) are not allowed",
                                              event.start_mark)
        if not isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # its keys would silently give way to the mapping's
                    raise yaml.constructor.ConstructorError(
                        None, None, "merge keys (<<) are not allowed: write each key once", key_node.start_mark)
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first_line
                except TypeError:  # an unhashable key: the constructor refuses it below
                    continue
                if seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {printable(repr(key), 80)}: first at line {first_line[key]}, again",
                        key_node.start_mark)
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _yaml_reason(e: Exception) -> str:
    """One line for a YAML error: the problem and where (PyYAML's own message spans several lines)."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return printable(" ".join(str(e.problem or e.context or "invalid YAML").split()), 160) + where
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return printable(" ".join(str(e).split()) or type(e).__name__, 160)


class _YAMLProblem(ValueError):
    """A YAML text was refused; the message is the one-line reason."""


def _load_yaml(text: str) -> Any:
    """Parse YAML text from outside with :class:`_BoundedLoader`, or raise :class:`_YAMLProblem` (one line) for
    invalid YAML, anchors or aliases, too deep nesting, or a value Python will not build (an integer beyond
    its int-string limit)."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 — a SafeLoader subclass
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError) as e:
        raise _YAMLProblem(_yaml_reason(e)) from None


def safe_yaml(text: str, source: str) -> Any:
    """:func:`_load_yaml`, or a :class:`ConfigError` naming ``source``."""
    try:
        return _load_yaml(text)
    except _YAMLProblem as e:
        raise ConfigError(f"{source}: not valid YAML ({e})") from None


def parse_overrides(overrides: Mapping[str, Any] | Sequence[str] | None) -> dict[str, Any]:
    if overrides is None:
        return {}
    if isinstance(overrides, Mapping):
        return dict(overrides)
    out: dict[str, Any] = {}
    for item in overrides:
        shown = printable(repr(item), 120)
        if "=" not in item:
            raise ConfigError(f"override {shown}: expected section.field=value")
        if len(item) > MAX_OVERRIDE_CHARS:
            raise ConfigError(f"override {shown}: longer than the {MAX_OVERRIDE_CHARS:,} characters allowed")
        key, raw = item.split("=", 1)
        key = key.strip()
        try:
            out[key] = _load_yaml(raw) if raw.strip() else None
        except _YAMLProblem as e:
            raise ConfigError(f"override {shown}: the value of {printable(repr(key), 80)} is not valid YAML "
                              f"({e})") from None
    return out


def describe(error: ValidationError, source: str) -> str:
    """One line per validation error (the first :data:`_MAX_ERRORS`), joined by ``; ``; field names and the
    values that failed are shown bounded and without control characters (they come from the file)."""
    lines = []
    errors = error.errors()
    for err in errors[:_MAX_ERRORS]:
        loc = printable(".".join(str(p) for p in err["loc"]), 80)
        msg = printable(err["msg"], 420)
        if err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        if not loc or (err["type"] == "value_error" and f"{loc}." in msg):  # a check naming its fields
            lines.append(f"{source}: {msg}")
        elif err["type"] == "extra_forbidden":
            hint = lookalike_hint(str(err["loc"][-1]) if err["loc"] else "")
            lines.append(f"{source}: unknown field '{loc}'" + (f" ({hint})" if hint else ""))
        else:
            got = err.get("input")
            got_text = "" if isinstance(got, dict) else f" (got {_bounded_repr(got)})"
            lines.append(f"{source}: field '{loc}': {msg}{got_text}")
    if len(errors) > _MAX_ERRORS:
        lines.append(f"and {len(errors) - _MAX_ERRORS} more errors")
    return "; ".join(lines)


_LOOKALIKES = str.maketrans({
    **dict(zip("\u0430\u0435\u0456\u0458\u043e\u0440\u0441\u0455\u0443\u0445\u0501\u051b\u051d", "aeijopcsyxdqw")),
    **dict(zip("\u0410\u0412\u0415\u041d\u0406\u0408\u041a\u041c\u041e\u0420\u0421\u0405\u0422\u0425",
               "ABEHIJKMOPCSTX")),
    **dict(zip("\u03bf\u03b1\u03bd\u0391\u0392\u0395\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5"
               "\u03a7\u0396", "oavABEHIKMNOPTYXZ")),
})
"""Letters of other scripts drawn like Latin ones (Cyrillic, Greek), mapped to the Latin letter they look like."""


def lookalike_hint(name: str) -> str | None:
    """For a field name with characters outside ASCII, what they are, shown by code point and Unicode name (a
    look-alike letter shows as the letter it imitates), and the ASCII name it looks like; None for an ASCII name."""
    odd = sorted({c for c in name if ord(c) > 127}, key=name.index)
    if not odd:
        return None
    shown = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed character')}" for c in odd[:3])
    more = f" and {len(odd) - 3} more" if len(odd) > 3 else ""
    guess = unicodedata.normalize("NFKC", name).translate(_LOOKALIKES)
    mean = f"; did you mean {guess!r}?" if guess.isascii() and guess.isprintable() and guess != name else ""
    return printable(f"contains {shown}{more}, not ASCII{mean}", 300)


def _bounded_repr(value: Any, limit: int = 80, depth: int = 0) -> str:
    """``repr(value)`` in at most ``limit`` characters, built in time bounded by ``limit`` (a value from a file
    may be a long string or a large collection): long strings are cut, collections show a few items."""
    if isinstance(value, str):
        extra = len(value) - limit
        text = printable(repr(value[:limit]), 4 * limit + 2)
        return text + (f"… ({extra} more characters)" if extra > 0 else "")
    if isinstance(value, (list, tuple, dict)):
        items = list(value.items())[:4] if isinstance(value, dict) else list(value[:4])
        if depth >= 2 or not items:
            inner = "…" if value else ""
        elif isinstance(value, dict):
            inner = ", ".join(f"{_bounded_repr(k, 20, depth + 1)}: {_bounded_repr(v, 20, depth + 1)}" for k, v in items)
        else:
            inner = ", ".join(_bounded_repr(v, 20, depth + 1) for v in items)
        more = f", … ({len(value)} items)" if len(value) > len(items) else ""
        opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
        return printable(opening + inner + more + closing, limit + 30)
    return printable(repr(value), limit)


def flat_name_hint(name: str) -> str | None:
    """For a field name of the flat layout (``temperature``), the line that says its dotted name now."""
    dotted = FLAT_NAMES.get(name) or MOVED_NAMES.get(name)
    if dotted is None:
        return None
    return (f"{printable(repr(name), 80)} is now {dotted!r}: did you mean {dotted!r}? "
            "(the config is grouped in sections)")


def merge_dotted(data: dict[str, Any], updates: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``data`` (a nested config mapping, copied) with ``updates`` applied: a ``section.field`` key sets that
    field of its section, a ``section`` key with a mapping updates the section's fields. A field name of the
    flat layout is a :class:`ConfigError` naming its dotted name."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    tasks = out.get("tasks")
    if isinstance(tasks, dict) and "tasks.name" in updates:
        from rlcr.config.sections import TasksSection

        if updates["tasks.name"] != tasks.get("name", TasksSection.model_fields["name"].default):
            tasks.pop("options", None)  # another task: its own options (those given here), not the other task's
    for key, value in updates.items():
        key = str(key)
        section, dot, name = key.partition(".")
        if not dot:
            if isinstance(value, Mapping):
                current = out.get(section)
                out[section] = {**current, **value} if isinstance(current, Mapping) else dict(value)
                continue
            hint = flat_name_hint(key)
            if hint is not None:
                raise ConfigError(f"{source}: {hint}")
            out[key] = value  # not a section: validation names it (unknown field or not a mapping)
            continue
        current = out.get(section)
        if current is None:
            current = out[section] = {}
        if not isinstance(current, dict):
            raise ConfigError(f"{source}: {printable(repr(section), 80)} is not a section, cannot set "
                              f"{printable(repr(key), 120)}")
        *inner, leaf = name.split(".")  # a field of a mapping field: tasks.options.min_count
        for part in inner:
            child = current.get(part)
            current[part] = child = dict(child) if isinstance(child, Mapping) else {}
            current = child
        current[leaf] = value
    return out


def check_sections(data: Mapping[str, Any], sections: set[str], source: str) -> None:
    """A :class:`ConfigError` for a top-level key of a config mapping that is a field name of the flat layout
    given a plain value (``temperature: 1.0`` instead of ``rollout: {temperature: 1.0}``), naming the dotted
    name; other keys are left to validation."""
    for key, value in data.items():
        if isinstance(key, str) and (key not in sections or not isinstance(value, Mapping)):
            hint = flat_name_hint(key)
            if hint is not None:
                raise ConfigError(f"{source}: {hint}")
