"""Span loss masks over completion tokens (docs/design.md §6).

Only tokens the model generated in a turn can carry loss, and within them:

* answer sample: from the first ``<think>`` (or the completion start if there is
  none, e.g. when the prompt already ends with ``<think>``) through the end of the
  last ``</answer>``; without ``</answer>``, through the end of the completion;
* confidence sample: from ``<analysis>`` if present, else ``<confidence>``,
  through the end of the last ``</confidence>``; without ``<confidence>``, the
  whole completion (without ``</confidence>``: through its end);
* one-turn sample of ``rlcr_single`` (docs/design.md §9): from the first ``<think>`` (or the
  completion start) through the end of the last ``</confidence>``; without it,
  through the end of the completion.

Reasoning and analysis tokens are inside the span on purpose. Character spans
are mapped to tokens with the tokenizer's offset mapping; a token that overlaps
a span is inside it. Works with any Hugging Face *fast* tokenizer.
"""

from __future__ import annotations

from typing import Literal, Sequence

__all__ = [
    "answer_span",
    "confidence_span",
    "single_span",
    "completion_offsets",
    "span_to_token_mask",
    "completion_mask",
]

MaskKind = Literal["answer", "confidence", "single"]


def answer_span(text: str) -> tuple[int, int]:
    """Character span ``[start, end)`` of the answer sample's learnable region."""
    start = text.find("<think>")
    if start < 0:
        start = 0
    close = text.rfind("</answer>")
    end = close + len("</answer>") if close >= 0 and close >= start else len(text)
    return start, end


def confidence_span(text: str) -> tuple[int, int]:
    """Character span ``[start, end)`` of the confidence sample's learnable region."""
    conf = text.find("<confidence>")
    if conf < 0:
        return 0, len(text)
    analysis = text.find("<analysis>")
    start = analysis if 0 <= analysis < conf else conf
    close = text.rfind("</confidence>")
    end = close + len("</confidence>") if close >= start and close >= 0 else len(text)
    return start, end


def single_span(text: str) -> tuple[int, int]:
    """Character span ``[start, end)`` of a one-turn (answer + confidence) sample's learnable region."""
    start = text.find("<think>")
    if start < 0:
        start = 0
    close = text.rfind("</confidence>")
    end = close + len("</confidence>") if close >= 0 and close >= start else len(text)
    return start, end


def completion_offsets(tokenizer, completion_ids: Sequence[int], completion_text: str) -> list[tuple[int, int]]:
    """Character offsets into ``completion_text`` of each generated token.

    Fast path: re-tokenising the text with ``return_offsets_mapping`` yields the
    same ids (possibly followed by trailing special tokens such as EOS, which the
    text omits; they get the empty span at the end). Otherwise (a non-canonical
    sampled tokenisation) the offsets are rebuilt by decoding growing prefixes.
    """
    ids = list(completion_ids)
    enc = tokenizer(completion_text, add_special_tokens=False, return_offsets_mapping=True)
    re_ids = list(enc["input_ids"])
    n = len(completion_text)
    if ids[: len(re_ids)] == re_ids:
        tail = ids[len(re_ids):]
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        if all(t in special for t in tail):
            return [tuple(o) for o in enc["offset_mapping"]] + [(n, n)] * len(tail)
    offsets: list[tuple[int, int]] = []
    prev = 0
    for i in range(len(ids)):
        cur = len(tokenizer.decode(ids[: i + 1], skip_special_tokens=True, clean_up_tokenization_spaces=False))
        cur = min(cur, n)
        offsets.append((prev, max(cur, prev)))
        prev = max(cur, prev)
    return offsets


def span_to_token_mask(
    offsets: Sequence[tuple[int, int]], span: tuple[int, int], *, open_ended: bool = False
) -> list[int]:
    """1 for every token whose character range overlaps ``span``.

    ``open_ended``: the span has no closing tag and runs "through the end of the
    completion", so the trailing zero-width tokens (EOS) are covered too.
    """
    start, end = span
    mask = []
    for tok_start, tok_end in offsets:
        overlaps = tok_start < end and tok_end > start
        trailing = open_ended and tok_start >= end
        mask.append(1 if overlaps or trailing else 0)
    return mask


def completion_mask(
    tokenizer, completion_ids: Sequence[int], completion_text: str, kind: MaskKind
) -> list[int]:
    """Loss mask (0/1 per completion token) for one answer, confidence or one-turn (``single``) sample."""
    spans = {"answer": (answer_span, "</answer>"), "confidence": (confidence_span, "</confidence>"),
             "single": (single_span, "</confidence>")}
    if kind not in spans:
        raise ValueError(f"mask kind must be 'answer', 'confidence' or 'single', got {kind!r}")
    span_of, closing = spans[kind]
    span = span_of(completion_text)
    closed = completion_text[span[0]:span[1]].endswith(closing)
    offsets = completion_offsets(tokenizer, completion_ids, completion_text)
    return span_to_token_mask(offsets, span, open_ended=not closed)
