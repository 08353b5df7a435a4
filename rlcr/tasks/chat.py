"""A conversation (the tasks' chat messages, :mod:`rlcr.tasks.countdown`) as the prompt a policy is given.

:func:`render_prompt` is the one place a conversation becomes a prompt: the rollout stages, the prompt-length
check, the warm-start rows and the probe all render through it, so the token ids the trainer sees are the ones
the engine was given. Pure tokenizer work: no vLLM, no Ray.
"""

from __future__ import annotations

__all__ = ["render_prompt"]


def render_prompt(tokenizer, messages, *, where: str = "prompt",
                  max_prompt_tokens: int | None = None) -> tuple[str, list[int]]:
    """Chat template with the generation prompt → (context text, context token ids): the one place a
    conversation becomes a prompt (rollout stages, prompt-length check, warm-start rows, probe).

    The ids are the text's tokens without added special tokens (the template holds them), so
    ``context_ids`` is exactly what the engine is given. A prompt over ``max_prompt_tokens``
    (None: no limit) is an error naming ``where`` (the row)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        raise ValueError(f"{where}: rendered prompt has {len(ids)} tokens > rollout.max_prompt_tokens={max_prompt_tokens}")
    return text, ids
