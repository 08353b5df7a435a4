"""Countdown: tasks, an exact solver, a strict scorer and the two chat prompts (SPEC §3).

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
import random
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = [
    "CountdownTask",
    "TaskFormatError",
    "solve",
    "generate_tasks",
    "load_tasks",
    "save_tasks",
    "extract_solution",
    "evaluate_expression",
    "compute_score",
    "turn1_messages",
    "turn2_messages",
    "SYSTEM_PROMPT",
    "CONFIDENCE_QUERY",
]

# An extracted equation longer than this is not a plausible answer for 3-6
# small numbers; it scores format_score without being parsed.
MAX_EQUATION_CHARS = 256
# Integer literals longer than this cannot be one of the task's numbers.
MAX_LITERAL_DIGITS = 12
ABS_TOL = 1e-5


# --------------------------------------------------------------------------- tasks


@dataclass
class CountdownTask:
    """One Countdown problem. ``solution`` is a reference expression (or None when unknown)."""

    nums: list[int]
    target: int
    solution: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ground_truth(self) -> dict[str, Any]:
        """The ``ground_truth`` dict that :func:`compute_score` takes."""
        return {"target": self.target, "numbers": list(self.nums)}

    def to_row(self) -> dict[str, Any]:
        return {"nums": list(self.nums), "target": self.target, "solution": self.solution}


class TaskFormatError(ValueError):
    """A task file has a malformed row; the message names file, row, field and reason."""


# --------------------------------------------------------------------------- solver

_OPS = ("+", "-", "*", "/")


def _combine(a: Fraction, b: Fraction) -> Iterable[tuple[str, Fraction]]:
    yield "+", a + b
    yield "-", a - b
    yield "*", a * b
    if b != 0:
        yield "/", a / b


def _reachable(nums: Sequence[int]) -> dict[Fraction, str]:
    """All values reachable using every number exactly once, with one expression each.

    Depth-first over "pick an ordered pair, combine it, recurse" with exact rationals.
    """
    found: dict[Fraction, str] = {}
    seen: set[tuple] = set()

    def rec(items: list[tuple[Fraction, str]]) -> None:
        key = tuple(sorted(v for v, _ in items))
        if key in seen:
            return
        seen.add(key)
        if len(items) == 1:
            value, expr = items[0]
            found.setdefault(value, expr)
            return
        for i, j in combinations(range(len(items)), 2):
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            for (va, ea), (vb, eb) in (((items[i]), (items[j])), ((items[j]), (items[i]))):
                for op, value in _combine(va, vb):
                    rec(rest + [(value, f"({ea} {op} {eb})")])

    rec([(Fraction(n), str(n)) for n in nums])
    return {v: _strip_outer(e) for v, e in found.items()}


def _strip_outer(expr: str) -> str:
    if expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for i, ch in enumerate(expr):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(expr) - 1:
                return expr
        return expr[1:-1]
    return expr


def solve(nums: Sequence[int], target: int) -> str | None:
    """An expression using every number in ``nums`` once that equals ``target``, or None.

    Exhaustive exact-rational search over pairs combined with ``+ - * /``.
    """
    return _reachable(list(nums)).get(Fraction(target))


def generate_tasks(
    n: int,
    seed: int,
    *,
    min_count: int = 3,
    max_count: int = 4,
    num_range: tuple[int, int] = (1, 20),
    target_range: tuple[int, int] = (1, 100),
) -> list[CountdownTask]:
    """``n`` solvable tasks, reproducible from ``seed``.

    Each task draws ``min_count..max_count`` numbers uniformly from ``num_range``
    (inclusive) and a target uniformly among the *integers in target_range that
    the numbers can reach*, so every task has a reference solution by construction.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 2 <= min_count <= max_count <= 6:
        raise ValueError(f"need 2 <= min_count <= max_count <= 6, got {min_count}, {max_count}")
    lo, hi = num_range
    tlo, thi = target_range
    if not 0 < lo <= hi:
        raise ValueError(f"num_range must be positive and ordered, got {num_range}")
    if tlo > thi:
        raise ValueError(f"target_range must be ordered, got {target_range}")
    rng = random.Random(seed)
    tasks: list[CountdownTask] = []
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 1000 * max(n, 1):
            raise RuntimeError("could not generate solvable tasks with these ranges")
        count = rng.randint(min_count, max_count)
        nums = [rng.randint(lo, hi) for _ in range(count)]
        reachable = _reachable(nums)
        targets = sorted(
            int(v) for v in reachable if v.denominator == 1 and tlo <= v <= thi
        )
        if not targets:
            continue
        target = rng.choice(targets)
        tasks.append(CountdownTask(nums=nums, target=target, solution=reachable[Fraction(target)]))
    return tasks


# --------------------------------------------------------------------------- files


def _check_row(row: Any, path: str, index: int) -> CountdownTask:
    where = f"{path}: row {index}"
    if not isinstance(row, dict):
        raise TaskFormatError(f"{where}: expected an object with fields 'nums' and 'target', got {type(row).__name__}")
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
        if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
            raise TaskFormatError(f"{where}: field 'nums' item {k} must be a positive integer, got {x!r}")
    target = row["target"]
    if hasattr(target, "item"):
        target = target.item()
    if isinstance(target, bool) or not isinstance(target, int):
        raise TaskFormatError(f"{where}: field 'target' must be an integer, got {target!r}")
    solution = row.get("solution")
    if solution is not None and not isinstance(solution, str):
        raise TaskFormatError(f"{where}: field 'solution' must be a string, got {type(solution).__name__}")
    return CountdownTask(nums=[int(x) for x in nums], target=int(target), solution=solution)


def load_tasks(path: str | Path) -> list[CountdownTask]:
    """Read tasks from JSONL or Parquet rows with fields ``nums`` and ``target``.

    Accepts local paths and fsspec URIs (``s3://…``). Rows are numbered from 1
    (JSONL: the line number). A malformed row raises :class:`TaskFormatError`
    naming the file, the row, the field and the reason.
    """
    import fsspec

    path = str(path)
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        with fsspec.open(path, "rb") as f:
            table = pq.read_table(f)
        missing = [c for c in ("nums", "target") if c not in table.column_names]
        if missing:
            raise TaskFormatError(f"{path}: field '{missing[0]}' is missing (columns: {table.column_names})")
        return [_check_row(row, path, i + 1) for i, row in enumerate(table.to_pylist())]
    if not (path.endswith(".jsonl") or path.endswith(".json")):
        raise TaskFormatError(f"{path}: unsupported task file type (expected .jsonl or .parquet)")
    tasks = []
    with fsspec.open(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFormatError(f"{path}: row {lineno}: not valid JSON ({e.msg})") from None
            tasks.append(_check_row(row, path, lineno))
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


def extract_solution(solution_str: str) -> str | None:
    """The reference extraction rule (SPEC §3).

    Text after the first ``Assistant:`` (else all of it) → its last line → the
    content of the last ``<answer>…</answer>`` on that line, stripped. The
    non-greedy, left-to-right matching of the reference regex is reproduced with
    linear ``str.find`` scans.
    """
    if not isinstance(solution_str, str):
        return None
    marker = solution_str.find("Assistant:")
    if marker >= 0:
        solution_str = solution_str[marker + len("Assistant:"):]
    line = solution_str[solution_str.rfind("\n") + 1:]
    last = None
    pos = 0
    while True:
        start = line.find("<answer>", pos)
        if start < 0:
            break
        end = line.find("</answer>", start + 8)
        if end < 0:
            break
        last = (start + 8, end)
        pos = end + 9
    return None if last is None else line[last[0]:last[1]].strip()


class _Invalid(Exception):
    pass


_DIGITS = frozenset("0123456789")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def _tokenize(expr: str) -> list[str | int]:
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


def _parse(tokens: list[str | int]) -> tuple[list[str | int], list[int]]:
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
        postfix, _ = _parse(_tokenize(expr))
        return _eval_postfix(postfix)
    except _Invalid:
        return None


def compute_score(
    solution_str: str,
    ground_truth: dict[str, Any],
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """Score a response on a Countdown task (SPEC §3).

    Returns 0 if no equation can be extracted; ``format_score`` if one was
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
        postfix, literals = _parse(_tokenize(equation))
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

CONFIDENCE_QUERY = (
    "How likely is your answer above to be correct? Optionally check it inside <analysis> </analysis>, "
    "then give a probability between 0 and 1 inside <confidence> </confidence>."
)


def _task_text(task: CountdownTask) -> str:
    return (
        f"Numbers: {list(task.nums)}. Target: {task.target}. "
        "Use each number exactly once with +, -, *, / and parentheses. "
        "Reason in <think> </think>, then give the equation in <answer> </answer>, e.g. <answer>(1 + 2) * 3</answer>."
    )


def turn1_messages(task: CountdownTask, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """Turn-1 conversation: system + user (the task). Render with the tokenizer's chat template."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": _task_text(task)},
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
