"""The ``file`` task: problems from a data file and a checker function, no class to write (docs/tasks.md).

    tasks:
      name: file
      train_file: data/train.jsonl          # JSONL, Parquet or a `datasets` save_to_disk folder
      eval_file: data/test.jsonl            # its own held-out set (rows shared with train_file are dropped)
      field_map: {prompt: question, gold: answer, stratum: source}   # only where the columns are named otherwise
      options:
        checker: checks/exact.py:check      # or an importable module: my_pkg.checks:check

Each row gives a ``prompt`` (the user message), a ``gold`` answer (any JSON value: a string, a number, a list, an
object) and optionally a ``stratum`` (per-stratum metrics and tables; one stratum ``all`` without it) and a worked
``solution`` (the warm-start's reasoning). The checker is a plain function ``check(answer, gold) -> bool``: the
model's answer (the text inside the last ``<answer> </answer>`` of its last line) and the row's gold value. It runs
in rlcr's bounded verifier (:class:`rlcr.tasks.verify.BoundedVerifier`: a worker process under
``tasks.options.checker_timeout_s`` and ``checker_memory_mb``; a call out of time or that raises counts as not
right, and only results are cached), loaded from its file wherever the file is (its folder need not be on any path).

Scores, as for every task: no ``<answer>`` on the last line → 0; the checker returns ``True`` → the full score;
anything else (``False``, another value, out of time, raised) → ``format_score``. A problem's identity is its prompt
with whitespace collapsed, so the held-out set never repeats a training prompt.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import math
import os
import random
import threading
from dataclasses import dataclass, replace
from typing import Any, Hashable, Mapping

from pydantic import Field, field_validator

from rlcr.tasks.base import (
    Task,
    TaskFormatError,
    TaskOptions,
    WarmStart,
    check_text,
    extract_answer,
    mapped_field,
    problems_of,
    register_task,
)
from rlcr.tasks.verify import BoundedVerifier, in_batch, scoring_batch
from rlcr.untrusted import printable

__all__ = ["FileTask", "FileProblem", "FileOptions", "FIELDS", "NO_STRATUM", "MAX_PROMPT_CHARS", "MAX_GOLD_CHARS",
           "checker_parts"]

FIELDS = ("prompt", "gold", "stratum", "solution")
"""The task's field names, which ``tasks.field_map`` may map to a file's columns."""
NO_STRATUM = "all"
"""The stratum of a row without one."""
MAX_PROMPT_CHARS = 16_000
"""Longest prompt accepted from a file."""
MAX_GOLD_CHARS = 16_000
"""Longest gold answer accepted (as JSON text)."""
MAX_SOLUTION_CHARS = 32_000
"""Longest worked solution accepted."""
MAX_STRATUM_CHARS = 64
SYSTEM_PROMPT = (
    "Answer the question. Think step by step inside <think> </think>, "
    "then write only the final answer inside <answer> </answer>."
)
SINGLE_TURN_SYSTEM_PROMPT = (
    "Answer the question. Think step by step inside <think> </think>, "
    "then write only the final answer inside <answer> </answer>, "
    "then say how likely your answer is to be correct: optionally check it inside <analysis> </analysis>, "
    "then give a probability between 0 and 1 inside <confidence> </confidence>."
)
INSTRUCTION = "Reason in <think> </think>, then give only the final answer in <answer> </answer> on the last line."


def checker_parts(spec: str) -> tuple[str, str, str | None]:
    """``(module name, function name, file)`` of a checker spec: ``path/to/file.py:function`` (file: its absolute
    path; the module is named after a digest of it) or ``package.module:function`` (file None). ValueError, one
    line, for anything else."""
    if not isinstance(spec, str) or spec.count(":") < 1:
        raise ValueError(f"{printable(repr(spec), 120)}: a checker is 'path/to/file.py:function' or "
                         "'module:function'")
    where, _, function = spec.rpartition(":")
    if not function.isidentifier():
        raise ValueError(f"{printable(repr(spec), 120)}: {printable(repr(function), 60)} is not a function name")
    if where.endswith(".py"):
        path = os.path.abspath(os.path.expanduser(where))
        digest = hashlib.sha256(path.encode()).hexdigest()[:12]
        return f"rlcr_checker_{digest}", function, path
    if not all(part.isidentifier() for part in where.split(".")):
        raise ValueError(f"{printable(repr(spec), 120)}: {printable(repr(where), 80)} is neither a .py file nor "
                         "a module name")
    return where, function, None


def _check_checker(spec: str) -> None:
    """The checker can be found without running it: its file exists and defines ``function`` at the top level
    (read, not executed), or its module is importable. ValueError, one line, naming what is missing."""
    module, function, file = checker_parts(spec)
    if file is not None:
        if not os.path.isfile(file):
            raise ValueError(f"no such file {printable(file, 160)}")
        try:
            with open(file, "rb") as f:
                tree = ast.parse(f.read(1 << 22))
        except (OSError, SyntaxError, ValueError) as e:
            raise ValueError(f"{printable(file, 160)} cannot be read as Python ({printable(e, 100)})") from None
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        if function not in names:
            raise ValueError(f"defines no function {printable(repr(function), 60)} at its top level: "
                             f"{printable(file, 160)}")
        return
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ValueError(f"no module {printable(repr(module), 80)} on this Python's path (give the checker's file "
                         "instead: path/to/file.py:function)")


class FileOptions(TaskOptions):
    checker: str | None = None
    """The function that says whether an answer is right: ``path/to/file.py:function`` (relative to the working
    directory) or ``package.module:function``; called ``function(answer, gold)`` with the model's answer text and
    the row's gold value (JSON), right when it returns ``True``. Required."""
    checker_timeout_s: float = Field(default=2.0, gt=0.0, le=600.0)
    """Seconds one call of the checker may take; a call out of time counts as not right."""
    checker_memory_mb: int = Field(default=1024, ge=64, le=1 << 20)
    """Address-space limit of the checker's worker process, MiB."""
    instruction: str = Field(default=INSTRUCTION, min_length=1, max_length=2000)
    """Appended to each prompt (after a blank line): how to write the answer."""

    @field_validator("checker")
    @classmethod
    def _checker(cls, value: str | None) -> str | None:
        if value is not None:
            _check_checker(value)
        return value


@dataclass(frozen=True)
class FileProblem:
    """One row: its ``prompt``, its ``gold`` answer as JSON text, its ``stratum`` (None: none), a worked
    ``solution`` (None: none) and the checker that scores it (``checker``: the spec; its bounds)."""

    prompt: str
    gold: str
    stratum: str | None = None
    solution: str | None = None
    checker: str = ""
    checker_timeout_s: float = 2.0
    checker_memory_mb: int = 1024
    instruction: str = INSTRUCTION


_VERIFIERS: dict[tuple[str, float, int], BoundedVerifier] = {}
_VERIFIERS_LOCK = threading.Lock()


def _verifier(problem: FileProblem) -> BoundedVerifier:
    """The bounded verifier of a problem's checker (one per checker and bounds, per process)."""
    key = (problem.checker, problem.checker_timeout_s, problem.checker_memory_mb)
    with _VERIFIERS_LOCK:
        if key not in _VERIFIERS:
            module, function, file = checker_parts(problem.checker)
            _VERIFIERS[key] = BoundedVerifier(f"{module}:{function}", file=file, timeout_s=problem.checker_timeout_s,
                                              memory_bytes=problem.checker_memory_mb << 20)
        return _VERIFIERS[key]


def _gold(value: Any, where: str, column: str) -> str:
    """The gold value as canonical JSON text (strings, numbers, booleans, lists, objects; finite numbers)."""
    if value is None:
        raise TaskFormatError(f"{where}: field '{printable(column, 60)}' is missing")
    if hasattr(value, "tolist"):
        value = value.tolist()  # a NumPy array from Parquet
    if isinstance(value, float) and not math.isfinite(value):
        raise TaskFormatError(f"{where}: field '{printable(column, 60)}' is not a finite number")
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError):
        raise TaskFormatError(f"{where}: field '{printable(column, 60)}' is not a JSON value "
                              f"({type(value).__name__})") from None
    if len(text) > MAX_GOLD_CHARS:
        raise TaskFormatError(f"{where}: field '{printable(column, 60)}' is longer than {MAX_GOLD_CHARS:,} "
                              f"characters as JSON ({len(text):,})")
    return text


def _problem(row: Mapping[str, Any], where: str, fields: Mapping[str, str]) -> FileProblem:
    pcol, prompt = mapped_field(row, "prompt", fields)
    prompt = check_text(prompt, where, printable(pcol, 60), MAX_PROMPT_CHARS)
    if not prompt.strip():
        raise TaskFormatError(f"{where}: field '{printable(pcol, 60)}' is empty")
    gcol, gold = mapped_field(row, "gold", fields)
    scol, stratum = mapped_field(row, "stratum", fields)
    stratum = check_text(stratum, where, printable(scol, 60), MAX_STRATUM_CHARS, required=False)
    wcol, solution = mapped_field(row, "solution", fields)
    solution = check_text(solution, where, printable(wcol, 60), MAX_SOLUTION_CHARS, required=False)
    return FileProblem(prompt=prompt, gold=_gold(gold, where, gcol), stratum=stratum or None,
                       solution=solution or None)


def _null(value: Any) -> bool:
    return value is None or type(value).__name__ == "NAType" or (isinstance(value, float) and math.isnan(value))


@register_task("file")
class FileTask(Task):
    """Problems from a data file, answers judged by a checker function."""

    system_prompt = SYSTEM_PROMPT
    single_turn_system_prompt = SINGLE_TURN_SYSTEM_PROMPT
    stratum_label = "stratum"
    Options = FileOptions

    def load(self, path: str, fields: Mapping[str, str] | None = None) -> list[FileProblem]:
        fields = dict(fields or {})
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise ValueError(f"task 'file': unknown field {printable(unknown[0], 60)!r} in tasks.field_map "
                             f"(fields: {', '.join(FIELDS)})")
        for name, column in fields.items():
            if not isinstance(column, str) or not column:
                raise ValueError(f"task 'file': tasks.field_map.{name} must name a column, got "
                                 f"{printable(repr(column), 60)}")
        return problems_of(path, lambda row, where: _problem(row, where, fields))

    def bind(self, problems: list[FileProblem], cfg: Any) -> list[FileProblem]:
        """The problems with the run's checker and its bounds (``tasks.options``) attached: they travel with
        each problem's record to every process that scores it."""
        o = self.options(cfg)
        if not o.checker:
            raise ValueError("task 'file': tasks.options.checker is required (path/to/file.py:function or "
                             "module:function, called function(answer, gold) -> bool)")
        return [replace(p, checker=o.checker, checker_timeout_s=o.checker_timeout_s,
                        checker_memory_mb=o.checker_memory_mb, instruction=o.instruction) for p in problems]

    def identity(self, problem: FileProblem) -> Hashable:
        """The prompt with its whitespace collapsed."""
        return " ".join(problem.prompt.split())

    def stratum(self, problem: FileProblem) -> Hashable:
        return problem.stratum or NO_STRATUM

    def to_record(self, problem: FileProblem) -> dict[str, Any]:
        return {"prompt": problem.prompt, "gold": problem.gold, "stratum": problem.stratum,
                "checker": problem.checker, "checker_timeout_s": problem.checker_timeout_s,
                "checker_memory_mb": problem.checker_memory_mb, "instruction": problem.instruction}

    def from_record(self, record: Mapping[str, Any]) -> FileProblem:
        stratum = record.get("stratum")
        timeout, memory = record.get("checker_timeout_s"), record.get("checker_memory_mb")
        instruction = record.get("instruction")
        return FileProblem(prompt=str(record["prompt"]), gold=str(record["gold"]),
                           stratum=None if _null(stratum) else str(stratum),
                           checker=str(record.get("checker") or ""),
                           checker_timeout_s=2.0 if _null(timeout) else float(timeout),
                           checker_memory_mb=1024 if _null(memory) else int(memory),
                           instruction=INSTRUCTION if _null(instruction) else str(instruction))

    def record_fields(self) -> list[Any]:
        import pyarrow as pa

        return [pa.field("prompt", pa.string(), nullable=False), pa.field("gold", pa.string(), nullable=False),
                pa.field("stratum", pa.string(), nullable=True), pa.field("checker", pa.string(), nullable=False),
                pa.field("checker_timeout_s", pa.float64(), nullable=False),
                pa.field("checker_memory_mb", pa.int64(), nullable=False),
                pa.field("instruction", pa.string(), nullable=False)]

    def user_text(self, problem: FileProblem) -> str:
        return f"{problem.prompt}\n\n{problem.instruction}"

    def score(self, completion: Any, problem: FileProblem, *, format_score: float, score: float = 1.0) -> float:
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        if not problem.checker:
            raise ValueError("task 'file': a problem without its checker (load it through the run's task sets)")
        return score if in_batch(_verifier(problem))(answer, json.loads(problem.gold)) is True else format_score

    def scoring(self, n: int) -> Any:
        """A batch of ``n`` answers shares the time budget of their checker (:meth:`BoundedVerifier.scoring`,
        entered when the batch first calls it); yields the batch's timeouts."""
        return scoring_batch(n)

    def warm_start(self, problem: FileProblem, rng: random.Random) -> WarmStart | None:
        """The row's worked ``solution`` with its gold answer (a string gold as it is, another value as JSON),
        when the checker accepts that answer; None without a solution."""
        if not problem.solution:
            return None
        gold = json.loads(problem.gold)
        trace = WarmStart(reasoning=problem.solution, answer=gold if isinstance(gold, str) else problem.gold)
        if self.score(self.warm_start_completion(trace), problem, format_score=0.0) != 1.0:
            return None
        return trace
