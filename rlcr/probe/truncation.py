"""Where to cut a chain of thought (docs/design.md §15 step 2). Pure Python: no tokenizer, vLLM or Ray here.

A turn-1 response looks like ``<think>REASONING</think>\\n<answer>EQ</answer>``.
:func:`reasoning_of` pulls REASONING out; :func:`truncation_points` lists the
prefixes of it the probe forces an answer after:

* ``sentences`` (default): 0% (empty), every sentence boundary, and 100%.
  A boundary is after ``.``, ``!`` or ``?`` (plus closing quotes/brackets)
  followed by whitespace or the end, and at every line break. Not a boundary:
  a ``.`` inside a number or expression (``3.5``, ``(1.5*2)``: no whitespace
  follows), after a known abbreviation (``e.g.``, ``i.e.``, ``approx.`` …) or a
  single capital initial, or after a list number at the start of a line
  (``1. Add …``, also after ``:`` or a sentence end). Cuts are placed after the punctuation with trailing
  whitespace dropped; cuts equal to 0% or 100% (after dropping whitespace) are
  merged into those.
* ``fractions``: 0, 0.1, …, 1.0 of the reasoning *tokens* (k = round(f·T)
  tokens shown); the point's ``fraction`` is the nominal f.

The x-axis of every curve is the share of reasoning tokens shown: for a
sentence cut, tokens ending at or before the cut / all reasoning tokens.
``token_ends`` (the character offset where each reasoning token ends) comes from
the tokenizer in the probe; without it, whitespace-separated words count as tokens.

A response with no ``<think>`` block (or an empty one) has an empty reasoning
and exactly two points, 0% and 100%, with the same (empty) prefix.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import asdict, dataclass
from typing import Sequence

__all__ = [
    "TruncationPoint", "reasoning_of", "sentence_cuts", "word_ends", "truncation_points",
    "DEFAULT_FRACTIONS", "MODES",
]

MODES = ("sentences", "fractions")
DEFAULT_FRACTIONS = tuple(i / 10 for i in range(11))

# Words after which a "." does not end a sentence (compared lower-case, without the final ".").
ABBREVIATIONS = frozenset({
    "e.g", "i.e", "etc", "vs", "approx", "cf", "resp", "eq", "fig", "no", "mr", "mrs", "ms", "dr", "st",
})
# Sentence-final punctuation, optionally followed by closing quotes/brackets, then whitespace or the end.
_END = re.compile(r"[.!?]+[\"')\]]*(?=\s|$)")
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")
_LIST_NUMBER = re.compile(r"(?:^|[\n:;]|[.!?]\s)\s*\d+$")  # "1." opening a line, list or sentence


@dataclass(frozen=True)
class TruncationPoint:
    """One prefix of the reasoning: ``reasoning[:chars]`` (= ``text``), ``tokens`` of ``total_tokens`` shown."""

    fraction: float
    tokens: int
    total_tokens: int
    chars: int
    text: str

    def to_dict(self) -> dict:
        return asdict(self)


def reasoning_of(response: str) -> str | None:
    """The content of the first ``<think>`` block of a turn-1 response, or None if there is none.

    An unclosed block (the generation stopped inside it) runs to ``<answer>`` or the end.
    """
    start = response.find("<think>")
    if start < 0:
        return None
    start += len("<think>")
    end = response.find("</think>", start)
    if end < 0:
        end = response.find("<answer>", start)
    return response[start:] if end < 0 else response[start:end]


def _is_false_end(text: str, match: re.Match) -> bool:
    """A "." that closes an abbreviation, an initial or a line-start list number."""
    punct = match.group(0)
    if not punct.startswith(".") or punct.rstrip("\"')]") != ".":
        return False
    before = text[: match.start()]
    if _LIST_NUMBER.search(before):
        return True
    word = _WORD_BEFORE.search(before)
    if not word:
        return False
    w = word.group(1)
    return w.lower().rstrip(".") in ABBREVIATIONS or (len(w) == 1 and w.isupper())


def sentence_cuts(text: str) -> list[int]:
    """Interior cut offsets of ``text``: sorted, unique, each in (0, len(text.rstrip())).

    ``text[:cut]`` is the reasoning up to and including a sentence's final
    punctuation (or up to a line break), with trailing whitespace dropped.
    """
    end = len(text.rstrip())
    raw = [m.end() for m in _END.finditer(text) if not _is_false_end(text, m)]
    raw += [i for i, ch in enumerate(text) if ch == "\n"]
    cuts = {len(text[:c].rstrip()) for c in raw}
    return sorted(c for c in cuts if 0 < c < end)


def word_ends(text: str) -> list[int]:
    """Character offsets where each whitespace-separated word ends (a tokenizer-free token count)."""
    return [m.end() for m in re.finditer(r"\S+", text)]


def truncation_points(
    reasoning: str | None,
    mode: str = "sentences",
    *,
    token_ends: Sequence[int] | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> list[TruncationPoint]:
    """The prefixes of ``reasoning`` to force answers after, in increasing order (see module doc).

    ``token_ends[i]`` is the character offset where reasoning token i ends
    (non-decreasing). The first point is always 0% (empty), the last 100% (all of it).
    """
    if mode not in MODES:
        raise ValueError(f"truncation mode must be one of {MODES}, got {mode!r}")
    text = reasoning or ""
    ends = list(word_ends(text) if token_ends is None else token_ends)
    total = len(ends)
    if not text.strip() or total == 0:
        return [TruncationPoint(0.0, 0, 0, 0, ""), TruncationPoint(1.0, 0, 0, len(text), text)]

    if mode == "fractions":
        out = []
        for f in fractions:
            if not 0.0 <= f <= 1.0:
                raise ValueError(f"fractions must be in [0, 1], got {f}")
            k = round(f * total)
            chars = 0 if k == 0 else (len(text) if k == total else ends[k - 1])
            out.append(TruncationPoint(float(f), k, total, chars, text[:chars]))
        return out
    points = [TruncationPoint(0.0, 0, total, 0, "")]
    for cut in sentence_cuts(text):
        shown = bisect.bisect_right(ends, cut)
        points.append(TruncationPoint(shown / total, shown, total, cut, text[:cut]))
    points.append(TruncationPoint(1.0, total, total, len(text), text))
    return points
