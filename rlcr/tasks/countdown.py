"""Countdown: tasks, an exact solver, a strict scorer and the two chat prompts (docs/design.md §2–§4).

A task is a few positive integers ``nums`` and an integer ``target``; an answer is
an arithmetic expression that uses every number exactly once with ``+ - * /`` and
parentheses and equals the target.

``compute_score`` keeps the reference's *semantics* (extraction rule and the
0 / format_score / score outcomes) but not its evaluator: the reference runs
``eval`` behind a character whitelist, which lets ``9**9**9`` hang the reward
worker and accepts decimals (``1.5*16``), unary minus, ``//`` and so on. Here the
equation is tokenised and parsed by a small iterative parser that accepts only
non-negative integer literals, binary ``+ - * /`` and parentheses, and evaluates
with :class:`fractions.Fraction`. Every step is linear in the (bounded) input, so
scoring is bounded in time by construction; model text never reaches ``eval``.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlcr.tasks.base import CONFIDENCE_QUERY, TaskFormatError, extract_answer
from rlcr.tasks.countdown_solver import CountdownTask, generate_tasks, solve, task_candidates
from rlcr.tasks.limits import DEFAULT_FORMAT_SCORE, MAX_LITERAL_DIGITS, MAX_TASK_NUMBER
from rlcr.untrusted import DuplicateKey, InvalidInput, check_depth, decode_text, loads_unique, printable

__all__ = [
    "CountdownTask",
    "TaskFormatError",
    "MAX_LITERAL_DIGITS",
    "MAX_TASK_NUMBER",
    "solve",
    "generate_tasks",
    "task_candidates",
    "load_tasks",
    "save_tasks",
    "extract_solution",
    "evaluate_expression",
    "compute_score",
    "turn1_messages",
    "turn2_messages",
    "single_turn_messages",
    "SINGLE_TURN_SYSTEM_PROMPT",
    "SYSTEM_PROMPT",
    "CONFIDENCE_QUERY", "parse_expression", "tokenize_expression", "task_text"]

# An extracted equation longer than this is not a plausible answer for 3-6
# small numbers; it scores format_score without being parsed.
MAX_EQUATION_CHARS = 256
# MAX_LITERAL_DIGITS / MAX_TASK_NUMBER (rlcr.tasks.limits): the scorer refuses longer integer literals and
# the task loader refuses a task whose numbers or target are longer, so every task it accepts can be solved.
# A JSONL task row longer than this (in bytes) is refused before it is parsed.
MAX_TASK_ROW_BYTES = 64 * 1024
ABS_TOL = 1e-5
# compute_score's default format_score: the config's (RLCRConfig.format_score), set in one place.
_FORMAT_SCORE: float = DEFAULT_FORMAT_SCORE


# --------------------------------------------------------------------------- files


def _integer(value: Any) -> Any:
    """A NumPy/Arrow scalar as a Python value (other values unchanged)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, tuple, dict)) else value


FIELDS = ("nums", "target", "solution")
"""Countdown's field names, which a ``fields`` mapping may map to a file's columns."""


def _check_row(row: Any, path: str, index: int, fields: Mapping[str, str] | None = None) -> CountdownTask:
    where = f"{printable(path)}: row {index}"
    if not isinstance(row, dict):
        raise TaskFormatError(f"{where}: expected an object with fields 'nums' and 'target', got {type(row).__name__}")
    if fields:  # the task's fields under their own names (an unmapped field keeps its name)
        row = {name: row.get(fields.get(name, name)) for name in FIELDS}
    for name in ("nums", "target"):
        if name not in row or row[name] is None:
            raise TaskFormatError(f"{where}: field '{name}' is missing")
    nums = row["nums"]
    if hasattr(nums, "tolist"):
        nums = nums.tolist()
    if not isinstance(nums, (list, tuple)):
        raise TaskFormatError(f"{where}: field 'nums' must be a list of integers, got {type(nums).__name__}")
    if not 2 <= len(nums) <= 6:
        raise TaskFormatError(f"{where}: field 'nums' must hold 2 to 6 numbers, got {len(nums)}")
    for k, x in enumerate(nums):
        x = _integer(x)
        if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
            raise TaskFormatError(f"{where}: field 'nums' item {k} must be a positive integer, got "
                                  f"{printable(repr(x), 60)}")
        if x > MAX_TASK_NUMBER:
            raise TaskFormatError(f"{where}: field 'nums' item {k} has more than {MAX_LITERAL_DIGITS} digits (at "
                                  f"most {MAX_TASK_NUMBER}: the scorer reads no longer number)")
    target = _integer(row["target"])
    if isinstance(target, bool) or not isinstance(target, int):
        raise TaskFormatError(f"{where}: field 'target' must be an integer, got {printable(repr(target), 60)}")
    if abs(target) > MAX_TASK_NUMBER:
        raise TaskFormatError(f"{where}: field 'target' has more than {MAX_LITERAL_DIGITS} digits (at most "
                              f"{MAX_TASK_NUMBER} in absolute value, as the task's numbers)")
    solution = row.get("solution")
    if solution is not None and not isinstance(solution, str):
        raise TaskFormatError(f"{where}: field 'solution' must be a string, got {type(solution).__name__}")
    return CountdownTask(nums=[int(_integer(x)) for x in nums], target=int(target), solution=solution)


def load_tasks(path: str | Path, fields: Mapping[str, str] | None = None) -> list[CountdownTask]:
    """Read tasks from JSONL or Parquet rows with fields ``nums`` and ``target``.

    Accepts local paths and fsspec URIs (``s3://…``). Rows are numbered from 1
    (JSONL: the line number). A malformed row raises :class:`TaskFormatError`
    naming the file, the row, the field and the reason, in one line: a value out of
    range (numbers and target of at most :data:`MAX_LITERAL_DIGITS` digits), a JSONL
    row that is not UTF-8, longer than :data:`MAX_TASK_ROW_BYTES` or nested deeper
    than :data:`rlcr.untrusted.MAX_DEPTH`, a file that is not Parquet. ``fields`` maps ``nums``/``target``/
    ``solution`` to the file's column names (:data:`FIELDS`).
    """
    import fsspec

    path = str(path)
    if path.endswith(".parquet"):
        return _load_parquet_tasks(path, fields)
    if not (path.endswith(".jsonl") or path.endswith(".json")):
        raise TaskFormatError(f"{printable(path)}: unsupported task file type (expected .jsonl or .parquet)")
    tasks = []
    try:
        with fsspec.open(path, "rb") as f:
            lineno = 0
            while line := f.readline(MAX_TASK_ROW_BYTES + 1):
                lineno += 1
                if len(line) > MAX_TASK_ROW_BYTES:
                    raise TaskFormatError(f"{printable(path)}: row {lineno}: longer than the "
                                          f"{MAX_TASK_ROW_BYTES:,} bytes a task row may hold")
                row = _json_row(line, path, lineno)
                if row is not _BLANK:
                    tasks.append(_check_row(row, path, lineno, fields))
    except OSError as e:  # missing, unreadable, a name too long …
        raise TaskFormatError(f"{printable(path)}: cannot read the task file ({_reason(e)})") from None
    return tasks


def _reason(e: OSError) -> str:
    return printable(e.strerror or f"{type(e).__name__}: {e}", 160)


_BLANK = object()


def _json_row(line: bytes, path: str, lineno: int) -> Any:
    """One JSONL row, parsed after the checks that keep the parser bounded (UTF-8, bracket depth)."""
    where = f"{printable(path)}: row {lineno}"
    try:
        text = decode_text(line, where)
        if not text.strip():
            return _BLANK
        check_depth(text, where)
    except InvalidInput as e:
        raise TaskFormatError(str(e)) from None
    try:
        return loads_unique(text)
    except DuplicateKey as e:
        raise TaskFormatError(f"{where}: {e}") from None
    except json.JSONDecodeError as e:
        raise TaskFormatError(f"{where}: not valid JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:
        # valid JSON Python will not read: an integer beyond the int-string conversion limit (4300 digits)
        reason = printable(e, 120) if isinstance(e, ValueError) else "nested too deeply"
        raise TaskFormatError(f"{where}: not readable ({reason})") from None


def _load_parquet_tasks(path: str, fields: Mapping[str, str] | None = None) -> list[CountdownTask]:
    """Tasks of a Parquet file, read in bounded memory (:func:`rlcr.columnar.parquet_batches`: the footer's
    columns, rows and sizes checked first, then batches whose decoded size is counted before they are decoded)."""
    import fsspec

    from rlcr.columnar import parquet_batches

    required = [(fields or {}).get(c, c) for c in ("nums", "target")]
    tasks: list[CountdownTask] = []
    try:
        with fsspec.open(path, "rb") as f:
            for batch in parquet_batches(f, path, required=required):
                for row in batch.to_pylist():
                    tasks.append(_check_row(row, path, len(tasks) + 1, fields))
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
        raise TaskFormatError(f"{printable(path)}: cannot read the task file ({_reason(e)})") from None
    except InvalidInput as e:
        raise TaskFormatError(str(e)) from None
    return tasks


def save_tasks(tasks: Sequence[CountdownTask], path: str | Path) -> None:
    """Write tasks as JSONL (or Parquet if the name ends in ``.parquet``)."""
    import fsspec

    path = str(path)
    rows = [t.to_row() for t in tasks]
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        with fsspec.open(path, "wb") as f:
            pq.write_table(pa.Table.from_pylist(rows), f)
        return
    with fsspec.open(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


# --------------------------------------------------------------------------- scoring


extract_solution = extract_answer
"""The reference extraction rule (docs/design.md §2–§4): :func:`rlcr.tasks.base.extract_answer`, shared by
every task (after the first ``Assistant:``, the last line, the last ``<answer>…</answer>`` on it)."""


class _Invalid(Exception):
    pass


_DIGITS = frozenset("0123456789")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def tokenize_expression(expr: str) -> list[str | int]:
    tokens: list[str | int] = []
    i, n = 0, len(expr)
    while i < n:
        ch = expr[i]
        if ch in " \t":
            i += 1
        elif ch in _DIGITS:
            j = i
            while j < n and expr[j] in _DIGITS:
                j += 1
            literal = expr[i:j]
            if len(literal) > MAX_LITERAL_DIGITS or (len(literal) > 1 and literal[0] == "0"):
                raise _Invalid(f"bad integer literal {literal[:20]!r}")
            tokens.append(int(literal))
            i = j
        elif ch in "+-*/()":
            tokens.append(ch)
            i += 1
        else:
            raise _Invalid(f"character {ch!r} is not allowed")
    return tokens


def parse_expression(tokens: list[str | int]) -> tuple[list[str | int], list[int]]:
    """Shunting-yard into postfix; rejects unary operators, `**`, `//`, empty parens.

    Grammar: expr := operand (binop operand)*; operand := INT | '(' expr ')'.
    Returns (postfix, literals). Iterative: nesting depth cannot overflow the stack.
    """
    out: list[str | int] = []
    ops: list[str] = []
    literals: list[int] = []
    expect_operand = True
    for tok in tokens:
        if isinstance(tok, int):
            if not expect_operand:
                raise _Invalid("two operands in a row")
            out.append(tok)
            literals.append(tok)
            expect_operand = False
        elif tok == "(":
            if not expect_operand:
                raise _Invalid("'(' after an operand")
            ops.append(tok)
        elif tok == ")":
            if expect_operand:
                raise _Invalid("')' where an operand was expected")
            while ops and ops[-1] != "(":
                out.append(ops.pop())
            if not ops:
                raise _Invalid("unbalanced ')'")
            ops.pop()
        else:  # binary operator
            if expect_operand:
                raise _Invalid(f"operator {tok!r} where an operand was expected (unary or doubled operator)")
            while ops and ops[-1] != "(" and _PRECEDENCE[ops[-1]] >= _PRECEDENCE[tok]:
                out.append(ops.pop())
            ops.append(tok)
            expect_operand = True
    if expect_operand:
        raise _Invalid("expression ends where an operand was expected")
    while ops:
        op = ops.pop()
        if op == "(":
            raise _Invalid("unbalanced '('")
        out.append(op)
    return out, literals


def _eval_postfix(postfix: list[str | int]) -> Fraction:
    stack: list[Fraction] = []
    for tok in postfix:
        if isinstance(tok, int):
            stack.append(Fraction(tok))
            continue
        b = stack.pop()
        a = stack.pop()
        if tok == "+":
            stack.append(a + b)
        elif tok == "-":
            stack.append(a - b)
        elif tok == "*":
            stack.append(a * b)
        else:
            if b == 0:
                raise _Invalid("division by zero")
            stack.append(a / b)
    return stack[0]


def evaluate_expression(expr: str) -> Fraction | None:
    """Exact value of ``expr`` under the strict grammar, or None if it is not valid."""
    if len(expr) > MAX_EQUATION_CHARS:
        return None
    try:
        postfix, _ = parse_expression(tokenize_expression(expr))
        return _eval_postfix(postfix)
    except _Invalid:
        return None


def compute_score(
    solution_str: str,
    ground_truth: dict[str, Any],
    format_score: float = _FORMAT_SCORE,
    score: float = 1.0,
) -> float:
    """Score a response on a Countdown task (docs/design.md §2–§4).

    ``format_score`` defaults to the config's (:attr:`rlcr.config.RLCRConfig.format_score`); a run
    passes its ``cfg.method.format_score``. Returns 0 if no equation can be extracted; ``format_score`` if one was
    extracted but it does not use exactly ``numbers`` (as a multiset), is not a
    valid expression (integer literals, binary ``+ - * /``, parentheses), cannot
    be evaluated, or its value is not ``target``; ``score`` if it equals the
    target exactly (rational arithmetic).
    """
    equation = extract_solution(solution_str)
    if equation is None:
        return 0
    if len(equation) > MAX_EQUATION_CHARS:
        return format_score
    try:
        postfix, literals = parse_expression(tokenize_expression(equation))
    except _Invalid:
        return format_score
    if sorted(literals) != sorted(int(x) for x in ground_truth["numbers"]):
        return format_score
    try:
        value = _eval_postfix(postfix)
    except _Invalid:
        return format_score
    target = ground_truth["target"]
    if isinstance(target, float) and not target.is_integer():
        # A non-integer target (never produced here) is compared as the reference does.
        return score if abs(float(value) - target) < ABS_TOL else format_score
    return score if value == Fraction(int(target)) else format_score


# --------------------------------------------------------------------------- prompts

SYSTEM_PROMPT = (
    "Solve the arithmetic puzzle. Think step by step inside <think> </think>, "
    "then write only the equation inside <answer> </answer>."
)

SINGLE_TURN_SYSTEM_PROMPT = (
    "Solve the arithmetic puzzle. Think step by step inside <think> </think>, "
    "then write only the equation inside <answer> </answer>, "
    "then say how likely your answer is to be correct: optionally check it inside <analysis> </analysis>, "
    "then give a probability between 0 and 1 inside <confidence> </confidence>."
)
"""System prompt of the one-turn method ``rlcr_single`` (docs/design.md §9): answer and confidence in one response."""


def task_text(task: CountdownTask) -> str:
    return (
        f"Numbers: {list(task.nums)}. Target: {task.target}. "
        "Use each number exactly once with +, -, *, / and parentheses. "
        "Reason in <think> </think>, then give the equation in <answer> </answer>, e.g. <answer>(1 + 2) * 3</answer>."
    )


def turn1_messages(task: CountdownTask, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """Turn-1 conversation: system + user (the task). Render with the tokenizer's chat template."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": task_text(task)},
    ]


def turn2_messages(
    task: CountdownTask,
    answer_text: str,
    system_prompt: str = SYSTEM_PROMPT,
    confidence_query: str = CONFIDENCE_QUERY,
) -> list[dict[str, str]]:
    """Turn-2 conversation: turn 1 + that exact answer as the assistant message + the confidence query."""
    return turn1_messages(task, system_prompt) + [
        {"role": "assistant", "content": answer_text},
        {"role": "user", "content": confidence_query},
    ]


def single_turn_messages(task: CountdownTask) -> list[dict[str, str]]:
    """The one-turn conversation of ``rlcr_single``: answer, then its confidence, in the same response."""
    return turn1_messages(task, SINGLE_TURN_SYSTEM_PROMPT)
