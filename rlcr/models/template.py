"""A model's chat template, rendered with bounded work: a template is input from outside (the model's files or
the config), and Jinja's sandbox stops escapes but not work — two nested ``range(100000)`` loops would render
for hours, ``'x' * 10**10`` would fill the memory.

:func:`render_chat` renders like ``tokenizer.apply_chat_template`` (the same sandbox settings, globals, filters
and variables, :mod:`transformers.utils.chat_template_utils`) under a deterministic budget, counted per render:

- at most :data:`MAX_STEPS` steps: every loop iteration (recursive loops included), call, filter, attribute or
  item access is one step, and every value built counts one more step per 256 characters or items;
- no string, list or output longer than :data:`MAX_CHARS`: ``*``, ``+``, ``~``, ``%``, ``str.format``, widths
  (``center``, ``ljust`` …), ``replace`` and ``join`` are checked before they build anything that large;
- a template that recurses without end stops at Python's recursion limit.

Over a bound, :class:`TemplateRefused` (one line). The budget is a count, not a clock: the same template and
conversation are refused everywhere, in any thread. :func:`check_template` renders a template once on the
shape of rlcr's conversations (model import); :func:`rlcr.models.chat.render_prompt` renders every prompt
through :func:`render_chat`.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
from datetime import datetime
from typing import Any

from rlcr.untrusted import InvalidInput, printable

__all__ = ["TemplateRefused", "render_chat", "check_template", "MAX_STEPS", "MAX_CHARS", "MAX_TEMPLATE_CHARS"]

MAX_STEPS = 1_000_000
"""Most steps one render may take (a real chat template takes a few hundred on rlcr's conversations)."""
MAX_CHARS = 1_000_000
"""Longest rendered prompt, and longest string or list built while rendering (characters or items)."""
MAX_TEMPLATE_CHARS = 200_000
"""Longest chat template compiled (the longest real ones, with tool calling, are about 20,000)."""
_WIDE = re.compile(r"\d{7,}")
_budget: contextvars.ContextVar[list[int]] = contextvars.ContextVar("rlcr_template_budget")


class TemplateRefused(InvalidInput):
    """A chat template went over a bound while rendering (or cannot be compiled); one line."""


def _spend(n: int = 1) -> None:
    left = _budget.get(None)
    if left is None:
        return  # outside render_chat (compiling): nothing to count
    left[0] -= n
    if left[0] < 0:
        raise TemplateRefused(f"takes more than {MAX_STEPS:,} steps to render")


def _sized(value: Any) -> Any:
    """``value`` after charging for its size; a string, list or mapping over :data:`MAX_CHARS` is refused."""
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        n = len(value)
        if n > MAX_CHARS:
            raise TemplateRefused(f"builds a value of {n:,} characters or items (at most {MAX_CHARS:,})")
        _spend(1 + n // 256)
    return value


def _counted(iterable: Any):
    """``iterable`` with one step charged per item."""
    if isinstance(iterable, (list, tuple, str, dict)):
        _sized(iterable)
    for item in iterable:
        _spend()
        yield item


def _wide_args(args, kwargs) -> None:
    """Refuse an int argument over :data:`MAX_CHARS` (a width, a repeat count) before the call builds it."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_CHARS:
            raise TemplateRefused(f"passes a number over {MAX_CHARS:,} to a function or filter")


def _wide_format(fmt: Any) -> None:
    if isinstance(fmt, str) and any(int(m) > MAX_CHARS for m in _WIDE.findall(fmt)):
        raise TemplateRefused(f"formats with a width over {MAX_CHARS:,}")


def _approx_len(x: Any) -> int:
    return len(x) if isinstance(x, str) else 8 * len(x) + 2 if hasattr(x, "__len__") else 24


def _check_builds(name: str, target: Any, args: tuple) -> None:
    """Before ``replace`` or ``join`` (method or filter) runs: the size of what it would build."""
    if name == "replace" and isinstance(target, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        size = len(target) + (len(target) // max(len(old), 1) + 1) * len(new)
    elif name == "join" and isinstance(target, str) and args and isinstance(args[0], (list, tuple)):
        size = sum(_approx_len(x) for x in args[0]) + len(target) * len(args[0])
    elif name == "join" and isinstance(target, (list, tuple)):  # the filter: value|join(sep)
        sep = str(args[0]) if args else ""
        size = sum(_approx_len(x) for x in target) + len(sep) * len(target)
    else:
        return
    if size > MAX_CHARS:
        raise TemplateRefused(f"{name} would build about {size:,} characters (at most {MAX_CHARS:,})")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Before ``*``, ``**``, ``+`` or ``%`` runs: the size of what it would build."""
    if operator == "*" and isinstance(left, int) and not isinstance(left, bool):
        left, right = right, left
    if operator == "*" and hasattr(left, "__len__") and isinstance(right, int):
        if len(left) * right > MAX_CHARS:
            raise TemplateRefused(f"repeats a value to over {MAX_CHARS:,} characters or items")
    elif operator == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)):
        if abs(left) > 1 and right > 4096:
            raise TemplateRefused("raises a number to a power over 4096")
    elif operator == "+" and hasattr(left, "__len__") and hasattr(right, "__len__"):
        if len(left) + len(right) > MAX_CHARS:
            raise TemplateRefused(f"builds a value of over {MAX_CHARS:,} characters or items")
    elif operator == "%" and isinstance(left, str):
        _wide_format(left)
        _wide_args(right if isinstance(right, tuple) else (right,), {})


def _bounded_filter(name: str, func):
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0  # a context comes first

    @functools.wraps(func)  # keeps jinja's pass_context / pass_eval_context marks
    def bounded(*args, **kwargs):
        _spend()
        _wide_args(args, kwargs)
        value = args[skip] if len(args) > skip else None
        _check_builds(name, value, args[skip + 1:])
        if name == "format":
            _wide_format(value)
        if isinstance(value, (list, tuple, str, dict)):
            _spend(len(value) // 256)  # the filter's own pass over its input
        result = func(*args, **kwargs)
        return _counted(result) if hasattr(result, "__next__") else _sized(result)
    return bounded


def _concat(parts: tuple) -> str:
    """``a ~ b ~ …``, its size checked before the string is built."""
    texts = [p if isinstance(p, str) else str(p) for p in parts]
    _sized(texts)
    size = sum(len(t) for t in texts)
    if size > MAX_CHARS:
        raise TemplateRefused(f"joins {size:,} characters with ~ (at most {MAX_CHARS:,})")
    return _sized("".join(texts))


def _raise_exception(message):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return _sized(json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys))


def _strftime_now(format):
    _wide_format(format)
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=1)
def _environment():
    """The bounded sandbox, built once (the budget lives in a context variable, so it is safe across threads)."""
    from jinja2 import ext, nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(ext.Extension):
        """transformers' ``{% generation %}`` block, rendered as its body (rlcr does not track assistant spans)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    class Generator(CodeGenerator):
        def visit_Concat(self, node, frame):  # `a ~ b`: sized before it is joined
            self.write("environment.rlcr_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Bounded(ImmutableSandboxedEnvironment):
        code_generator_class = Generator
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def _parse(self, source, name, filename):
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(nodes.For):  # every loop's items are counted
                loop.iter = nodes.Filter(loop.iter, "rlcr_counted", [], [], None, None, lineno=loop.lineno)
            return tree

        def call_binop(self, context, operator, left, right):
            _spend()
            _check_binop(operator, left, right)
            return _sized(super().call_binop(context, operator, left, right))

        def getattr(self, obj, attribute):
            _spend()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _spend()
            return super().getitem(obj, argument)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 — jinja's signature
            _spend()
            _wide_args(args, kwargs)
            if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
                args = (_counted(args[0]), *args[1:])
            target = getattr(__obj, "__self__", None)
            if target is None:  # the sandbox's str.format wrapper
                target = getattr(getattr(__obj, "__wrapped__", None), "__self__", None)
            name = getattr(__obj, "__name__", "")
            _check_builds(name, target, args)
            if name in ("format", "format_map"):
                _wide_format(target)
            result = super().call(__context, __obj, *args, **kwargs)
            return _counted(result) if hasattr(result, "__next__") else _sized(result)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.filters["rlcr_counted"] = _counted
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.rlcr_concat = _concat
    return env


@functools.lru_cache(maxsize=16)
def _compiled(template: str):
    from jinja2 import TemplateError

    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateRefused(f"is {len(template):,} characters long (at most {MAX_TEMPLATE_CHARS:,})")
    try:
        return _environment().from_string(template)
    except (TemplateError, RecursionError, MemoryError) as e:
        raise TemplateRefused(f"does not compile ({type(e).__name__}: {printable(e, 160)})") from None


def render_chat(template: str, messages, *, add_generation_prompt: bool = True, **variables: Any) -> str:
    """``template`` rendered on ``messages`` as ``apply_chat_template(tokenize=False)`` renders it (``variables``:
    the tokenizer's special tokens), within :data:`MAX_STEPS` and :data:`MAX_CHARS`; else :class:`TemplateRefused`.
    Errors the template raises itself (``raise_exception``) pass as jinja2's ``TemplateError``."""
    compiled = _compiled(template)
    token = _budget.set([MAX_STEPS])
    try:
        parts, size = [], 0
        for part in compiled.generate(messages=messages, tools=None, documents=None,
                                      add_generation_prompt=add_generation_prompt, **variables):
            size += len(part)
            if size > MAX_CHARS:
                raise TemplateRefused(f"renders more than {MAX_CHARS:,} characters")
            parts.append(part)
        return "".join(parts)
    except RecursionError:
        raise TemplateRefused("recurses too deeply") from None
    except MemoryError:
        raise TemplateRefused("runs out of memory") from None
    except OverflowError as e:  # the sandbox's own range() bound, huge numbers
        raise TemplateRefused(f"overflows ({printable(e, 120)})") from None
    finally:
        _budget.reset(token)


SAMPLE_CONVERSATIONS = (
    [{"role": "system", "content": "You solve puzzles."}, {"role": "user", "content": "Make 24 from 3 4 6 1."}],
    [{"role": "system", "content": "You solve puzzles."}, {"role": "user", "content": "Make 24 from 3 4 6 1."},
     {"role": "assistant", "content": "<answer>(3*(6+1+1))</answer>"},
     {"role": "user", "content": "How confident are you?"}],
)
"""The shapes of rlcr's conversations (a task; the answer and the confidence question): what a template is
tried on when a model is imported."""


def check_template(template: str, what: str, **variables: Any) -> None:
    """Render ``template`` on :data:`SAMPLE_CONVERSATIONS` within the bounds, or raise :class:`TemplateRefused`
    naming ``what`` (the model), in one line. Errors the template raises on purpose are left to the run."""
    from jinja2 import TemplateError
    from jinja2.sandbox import SecurityError

    for messages in SAMPLE_CONVERSATIONS:
        try:
            render_chat(template, messages, **variables)
        except TemplateRefused as e:
            raise TemplateRefused(f"{what}: its chat template {e}; refusing it") from None
        except SecurityError as e:
            raise TemplateRefused(f"{what}: its chat template breaks the sandbox ({printable(e, 160)}); "
                                  f"refusing it") from None
        except (TemplateError, TypeError, ValueError, LookupError, AttributeError):
            pass  # the template's own complaint about a sample; render_prompt reports it at the first real prompt
