"""The ``qa`` task's data (docs/tasks.md, "The QA task"): short-answer questions over generated fictional
entities, with 0, 1 or 2 of the supporting paragraphs missing, and the answer checks (SQuAD-style
normalised exact match, token F1).

In the spirit of the RLCR paper's HotpotQA-modified set (HotpotQA with supporting paragraphs removed, so a
model must learn to be unsure when the evidence is missing), on data rlcr can ship: no file, a seeded
generator. Each problem is a small world of made-up people, towns and companies (names built from
syllables), four relations (born in, works for, based in, founded by), and a question whose answer needs
one fact (1-hop) or two chained facts (2-hop, through a *bridge* entity). Its context is a fixed number of
one-sentence paragraphs: the supporting ones that are kept plus distractors about other entities, shuffled.
A removed supporting paragraph is replaced by a distractor, so the paragraph count says nothing.

The *evidence* state is the stratum: ``full`` (every supporting paragraph), ``partial`` (a 2-hop question
with one of its two missing), ``none`` (all missing). Distractor objects are drawn from a small pool that
holds the gold answer, so with missing evidence a guess among the names in the context can still be right.

Everything here is pure Python and deterministic in the seed (``random.Random``): a test checks it.

``python -m rlcr.tasks.qa_data [OUT_DIR]`` writes ``qa_heldout.jsonl`` (default: ``rlcr/tasks/data``, the file
shipped with the package): :data:`HELD_OUT_PROBLEMS` distinct problems from seed :data:`HELD_OUT_SEED`, in equal
shares per evidence state, the same bytes on every run. It is the question-answering set the methods grid's
addendum evaluates out of domain (bench/protocol-2.yaml); ``tasks.name=qa tasks.eval_file=...`` reads it.
"""

from __future__ import annotations

import json
import random
import re
import string
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

__all__ = ["QAProblem", "EVIDENCE_STATES", "problem_stream", "normalize_answer", "exact_match", "token_f1",
           "held_out_rows", "write_held_out", "HELD_OUT_FILE", "HELD_OUT_SEED", "HELD_OUT_PROBLEMS"]

DATA_DIR = Path(__file__).with_name("data")
HELD_OUT_FILE = "qa_heldout.jsonl"
HELD_OUT_SEED = 9_000_051
"""The shipped set's generator seed: used by nothing else (training pools and held-out sets draw from ``run.seed``
and ``tasks.eval_seed``), so no run of rlcr trains on these questions unless it is pointed at the file."""
HELD_OUT_PROBLEMS = 120
"""Problems in the shipped set: 40 per evidence state."""

EVIDENCE_STATES = ("full", "partial", "none")
"""The evidence strata, in order: every supporting paragraph; one of two missing; all missing."""

DISTRACTOR_NAMES = 3
"""Names of each type the distractor paragraphs' objects are drawn from (the answer's type: these and the gold)."""

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kl", "st", "tr", "th")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "or")
_FIRST_ENDS = ("", "a", "n", "el", "is", "o")
_LAST_ENDS = ("son", "ard", "ov", "ell", "ane", "wick", "ton", "ek")
_TOWN_ENDS = ("ford", "mouth", "by", "holm", "dale", "stead", "port", "wick")
_COMPANY_ENDS = ("Works", "Group", "Mills", "Foundry", "Labs", "Traders")
_OCCUPATIONS = ("painter", "engineer", "teacher", "sailor", "baker", "doctor", "poet", "chemist")
_INDUSTRIES = ("shipping", "textile", "software", "mining", "glass", "toy", "printing", "seed")

# relation → the answer's entity type and the paragraph of one fact (subject, object)
_OBJECT_TYPE = {"born": "town", "works": "company", "based": "town", "founded": "person"}
_SUBJECT_TYPE = {"born": "person", "works": "person", "based": "company", "founded": "company"}

# question kinds: the chain of relations (1 or 2) and the question about the first subject
_QUESTIONS = {
    ("born",): "In which town was {s} born?",
    ("works",): "Which company does {s} work for?",
    ("based",): "In which town is {s} based?",
    ("founded",): "Who founded {s}?",
    ("works", "based"): "In which town is the company that {s} works for based?",
    ("works", "founded"): "Who founded the company that {s} works for?",
    ("founded", "born"): "In which town was the founder of {s} born?",
}
_ONE_HOP = sorted(k for k in _QUESTIONS if len(k) == 1)
_TWO_HOP = sorted(k for k in _QUESTIONS if len(k) == 2)


@dataclass(frozen=True)
class QAProblem:
    """One question: its text, the gold ``answer`` (an entity name), the ``paragraphs`` of its context in the
    order shown, every ``support`` paragraph the answer needs (kept or removed, in chain order), the
    ``evidence`` state (the stratum) and the ``hops`` (1 or 2)."""

    question: str
    answer: str
    paragraphs: tuple[str, ...]
    support: tuple[str, ...]
    evidence: str
    hops: int

    @property
    def removed(self) -> tuple[str, ...]:
        """The supporting paragraphs missing from the context."""
        return tuple(p for p in self.support if p not in self.paragraphs)


# --------------------------------------------------------------------------- names and facts


def _syllables(rng: random.Random, k: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(k))


def _name(rng: random.Random, kind: str) -> str:
    if kind == "person":
        return f"{(_syllables(rng, 2) + rng.choice(_FIRST_ENDS)).capitalize()} " \
               f"{(_syllables(rng, 1) + rng.choice(_LAST_ENDS)).capitalize()}"
    if kind == "town":
        return (_syllables(rng, 1) + rng.choice(_TOWN_ENDS)).capitalize()
    return f"{_syllables(rng, 2).capitalize()} {rng.choice(_COMPANY_ENDS)}"


def _names(rng: random.Random, kind: str, n: int, taken: set[str]) -> list[str]:
    """``n`` new names of ``kind``, none in ``taken`` (which they join)."""
    out: list[str] = []
    while len(out) < n:
        name = _name(rng, kind)
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _paragraph(relation: str, subject: str, obj: str, rng: random.Random) -> str:
    if relation == "born":
        return f"{subject} is {_a(rng.choice(_OCCUPATIONS))} who was born in {obj}."
    if relation == "works":
        return f"{subject} is {_a(rng.choice(_OCCUPATIONS))} who works for {obj}."
    if relation == "based":
        return f"{obj} is home to {subject}, {_a(rng.choice(_INDUSTRIES))} company."
    return f"{subject} is {_a(rng.choice(_INDUSTRIES))} company founded by {obj}."


# --------------------------------------------------------------------------- one problem


def _chain(rng: random.Random, relations: tuple[str, ...], taken: set[str]) -> tuple[list[tuple[str, str, str]], str]:
    """The supporting facts (relation, subject, object) of a question of ``relations``, and its answer."""
    subject = _names(rng, _SUBJECT_TYPE[relations[0]], 1, taken)[0]
    facts = []
    for rel in relations:
        obj = _names(rng, _OBJECT_TYPE[rel], 1, taken)[0]
        facts.append((rel, subject, obj))
        subject = obj
    return facts, subject


def make_problem(rng: random.Random, n_paragraphs: int, evidence: str, hops: int, *,
                 gold_in_distractors: bool = True) -> QAProblem:
    """A problem of ``hops`` hops in the ``evidence`` state whose context holds ``n_paragraphs`` paragraphs
    (``gold_in_distractors`` False: no distractor names the gold, so without evidence it is not in the context)."""
    taken: set[str] = set()
    relations = rng.choice(_ONE_HOP if hops == 1 else _TWO_HOP)
    facts, answer = _chain(rng, relations, taken)
    support = [_paragraph(rel, s, o, rng) for rel, s, o in facts]
    if evidence == "full":
        kept = list(support)
    elif evidence == "partial" and hops == 2:
        drop = rng.randrange(2)
        kept = [p for i, p in enumerate(support) if i != drop]
    else:
        kept = []
    # distractors: facts of the chain's relations about other subjects; their objects come from a small pool
    # of the answer's type that holds the gold answer, so a guess can be right by chance
    pools = {kind: _names(rng, kind, DISTRACTOR_NAMES, taken) for kind in ("person", "town", "company")}
    if gold_in_distractors:
        pools[_OBJECT_TYPE[relations[-1]]].append(answer)
    paragraphs = list(kept)
    while len(paragraphs) < n_paragraphs:
        rel = rng.choice(relations)
        subject = _names(rng, _SUBJECT_TYPE[rel], 1, taken)[0]
        paragraphs.append(_paragraph(rel, subject, rng.choice(pools[_OBJECT_TYPE[rel]]), rng))
    rng.shuffle(paragraphs)
    question = _QUESTIONS[relations].format(s=facts[0][1])
    return QAProblem(question=question, answer=answer, paragraphs=tuple(paragraphs), support=tuple(support),
                     evidence=evidence, hops=hops)


def problem_stream(seed: int, *, n_paragraphs: int = 4, evidence: Sequence[str] = EVIDENCE_STATES,
                   two_hop_share: float = 0.5, gold_in_distractors: bool = True) -> Iterator[QAProblem]:
    """Endless problems, deterministic in ``seed`` and the settings: the evidence state cycles through
    ``evidence`` (equal shares, in order); a ``partial`` problem is 2-hop, the others 2-hop with probability
    ``two_hop_share``."""
    rng = random.Random(seed)
    while True:
        for state in evidence:
            hops = 2 if state == "partial" or rng.random() < two_hop_share else 1
            yield make_problem(rng, n_paragraphs, state, hops, gold_in_distractors=gold_in_distractors)


# --------------------------------------------------------------------------- answer checks (SQuAD style)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, punctuation removed, the articles a/an/the removed, whitespace collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(gold: str, answer: str) -> bool:
    """Whether the two are equal after :func:`normalize_answer`."""
    return normalize_answer(gold) == normalize_answer(answer)


def token_f1(gold: str, answer: str) -> float:
    """SQuAD's token F1 of the normalised answers (1.0 when both are empty, 0.0 when only one is)."""
    g, a = normalize_answer(gold).split(), normalize_answer(answer).split()
    if not g or not a:
        return float(g == a)
    common = sum((Counter(g) & Counter(a)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(g)
    return 2 * precision * recall / (precision + recall)


# --------------------------------------------------------------------------- the shipped held-out set


def held_out_rows(n: int = HELD_OUT_PROBLEMS, seed: int = HELD_OUT_SEED) -> list[dict]:
    """The first ``n`` problems of :func:`problem_stream` (default settings) with distinct questions and answers
    (a repeat is skipped, so the evidence states stay in equal shares only while none repeats), as file rows
    (the ``qa`` task's fields)."""
    rows, seen = [], set()
    for p in problem_stream(seed):
        if len(rows) == n:
            return rows
        key = (" ".join(p.question.split()), normalize_answer(p.answer))
        if key in seen:
            continue
        seen.add(key)
        rows.append({"question": p.question, "answer": p.answer, "paragraphs": list(p.paragraphs),
                     "support": list(p.support), "evidence": p.evidence, "hops": p.hops})
    raise AssertionError("unreachable: the stream is endless")


def write_held_out(directory: Path = DATA_DIR) -> Path:
    """:func:`held_out_rows` to ``directory/qa_heldout.jsonl``, one JSON object a line, byte-for-byte reproducible."""
    path = Path(directory) / HELD_OUT_FILE
    path.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in held_out_rows()))
    return path


if __name__ == "__main__":
    print(write_held_out(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA_DIR))
