"""A conversation (the tasks' chat messages, :mod:`rlcr.tasks.countdown`) as the prompt a policy is given.

:func:`render_prompt` is the one place a conversation becomes a prompt: the rollout stages, the prompt-length
check, the warm-start rows and the probe all render through it, so the token ids the trainer sees are the ones
the engine was given. The template is rendered with bounded work (:func:`rlcr.models.template.render_chat`): a
model's template is input from outside. Pure tokenizer work: no vLLM, no Ray.
"""

from __future__ import annotations

from rlcr.models.template import TemplateRefused, render_chat
from rlcr.untrusted import InvalidInput, printable

__all__ = ["render_prompt"]


def render_prompt(tokenizer, messages, *, where: str = "prompt",
                  max_prompt_tokens: int | None = None) -> tuple[str, list[int]]:
    """Chat template with the generation prompt → (context text, context token ids): the one place a
    conversation becomes a prompt (rollout stages, prompt-length check, warm-start rows, probe).

    The ids are the text's tokens without added special tokens (the template holds them), so
    ``context_ids`` is exactly what the engine is given. A prompt over ``max_prompt_tokens``
    (None: no limit) is an error naming ``where`` (the row).

    Rendered as ``apply_chat_template(..., add_generation_prompt=True, tokenize=False)`` renders it, within
    :mod:`rlcr.models.template`'s bounds: a template over them, or one that fails, is an
    :class:`~rlcr.untrusted.InvalidInput` naming the model and ``where``, in one line."""
    text = _rendered(tokenizer, messages, where)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        raise ValueError(f"{where}: rendered prompt has {len(ids)} tokens > "
                         f"rollout.max_prompt_tokens={max_prompt_tokens}")
    return text, ids


def _rendered(tokenizer, messages, where: str) -> str:
    from jinja2 import TemplateError

    model = f"model {printable(getattr(tokenizer, 'name_or_path', '') or '?')}"
    try:
        template = tokenizer.get_chat_template()
    except ValueError:
        raise InvalidInput(f"{model}: its tokenizer has no chat template") from None
    try:
        return render_chat(template, messages, add_generation_prompt=True, **tokenizer.special_tokens_map)
    except TemplateRefused as e:
        raise TemplateRefused(f"{model}: its chat template {e} ({printable(where)}); refusing it") from None
    except (TemplateError, TypeError, ValueError, LookupError, AttributeError) as e:
        raise InvalidInput(f"{model}: its chat template failed on {printable(where)} "
                           f"({type(e).__name__}: {printable(e, 200)})") from None
