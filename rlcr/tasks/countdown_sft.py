"""Countdown's warm-start examples: solver traces, exact checks and wrong answers (rlcr.train.sft trains on them).

Out of the box SmolLM2-135M-Instruct writes the ``<answer>`` format 0% of the
time on Countdown (docs/design.md §17), so RL alone has no signal. This module writes
supervised examples for both turns from the exact solver and trains on them with
the same Ray Train update machinery (objective ``sft``: token-mean NLL over the
completion):

* turn 1 — a ``<think>`` trace of attempts, each a few exact steps and its value
  against the target (``"4+12=16. 9+16=25. 25 vs 48: no."``), 0–2 misses then the
  solver's solution (``"… 48 vs 48: yes."``), and the equation; on tasks of 3+
  numbers, 1 in 5 traces misses :data:`MAX_ATTEMPTS` times and says so
  (``"No try reaches 48."``) before answering its last attempt;
* turn 2 — after an answer, an ``<analysis>`` that checks it and a ``<confidence>``.
  The check is computed exactly (:func:`check_answer`), each comparison written with
  both sides next to each other: the numbers the equation uses against the given
  ones, and, if those match, the value of each step and the last one against the
  target (``"… 28 vs 41: wrong."``). Half of the turn-2 examples are conditioned on a
  *wrong* answer written the way the warm-started model writes its own
  (:func:`wrong_answer`: a last attempt that claims the target it misses, a trace
  that gave up, a foreign, repeated, extra or missing number; present only as
  context: its tokens carry no loss, so the model never learns to produce it) and
  state a low confidence; right ones state a high one.

Why this shape (docs/results.md has the measurements): with one attempt per trace, the model's
wrong answers nearly all "reached" the target in a last step it made up, and a check that echoed the answer
("the equation gives 28, which matches the target 28") could not tell them from right ones; a check that
recomputed the value but compared it with the target only implicitly ("13+15=28, the target" for target 41)
barely could.

With ``sft.single_turn`` each task also gets a one-turn example in the ``rlcr_single`` format (docs/design.md §9):
the trace and equation, then the check and confidence in the same response. Half show a wrong answer; for
those only the check and the confidence carry loss, as in turn 2. One warm-start then serves every method.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction
from typing import Any, Sequence

from rlcr.tasks.countdown import (
    compute_score,
    evaluate_expression,
    parse_expression,
    single_turn_messages,
    tokenize_expression,
    turn1_messages,
    turn2_messages,
)
from rlcr.tasks.countdown_solver import CountdownTask, generate_tasks, strip_outer

__all__ = ["solution_steps", "attempt_text", "answer_trace", "random_expression", "missed_attempts", "solver_trace",
           "wrong_answer", "WRONG_KINDS", "MAX_ATTEMPTS", "GIVE_UP_SHARE", "check_answer", "confidence_trace",
           "sft_examples"]


def _fmt(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"({v.numerator}/{v.denominator})"


def solution_steps(expression: str) -> list[str]:
    """The binary operations of ``expression`` in evaluation order, as compact ``a<op>b=c`` strings (exact values;
    a fraction in parentheses). Compact: a space before each digit is a token of its own for SmolLM2's tokenizer.
    Raises ZeroDivisionError for a division by zero, and the parser's error for text that is no expression."""
    postfix, _ = parse_expression(tokenize_expression(expression))
    stack: list[Fraction] = []
    steps = []
    for tok in postfix:
        if isinstance(tok, int):
            stack.append(Fraction(tok))
            continue
        b, a = stack.pop(), stack.pop()
        c = a + b if tok == "+" else a - b if tok == "-" else a * b if tok == "*" else a / b
        steps.append(f"{_fmt(a)}{tok}{_fmt(b)}={_fmt(c)}")
        stack.append(c)
    return steps


def attempt_text(task: CountdownTask, expression: str, *, claim: int | None = None) -> str:
    """One attempt of a turn-1 trace: the expression's steps, then its value against the target,
    ``"a+b=c. c*d=e. e vs T: yes|no."`` (the comparison written with both sides next to each other). ``claim``: the
    value the last step *claims* instead of its true one (how a small model's wrong answer reads: the last step
    "reaches" the target)."""
    steps = solution_steps(expression)
    value = str(claim) if claim is not None else _fmt(evaluate_expression(expression)).strip("()")
    if claim is not None and steps:
        steps[-1] = f"{steps[-1].rsplit('=', 1)[0]}={claim}"
    head = " ".join(f"{s}." for s in steps)
    verdict = "yes" if value == str(task.target) else "no"
    return f"{head + ' ' if head else ''}{value} vs {task.target}: {verdict}."


def answer_trace(task: CountdownTask, expression: str, *, failed: Sequence[str] = (), claim: int | None = None,
                 gave_up: bool = False) -> str:
    """A turn-1 response: ``<think>`` with the attempts (each :func:`attempt_text`), then the equation.

    ``failed``: attempts that missed the target, in order, before ``expression`` is tried. ``gave_up``: no
    attempt reached the target; the trace says so and answers its last attempt (``expression`` must be
    ``failed[-1]``)."""
    parts = [f"I need {task.target} from {list(task.nums)}."] + [attempt_text(task, e) for e in failed]
    if gave_up:
        if not failed or failed[-1] != expression:
            raise ValueError("a trace that gives up answers its last failed attempt")
        parts.append(f"No try reaches {task.target}.")
    else:
        parts.append(attempt_text(task, expression, claim=claim))
    return f"<think>{' '.join(parts)}</think>\n<answer>{expression}</answer>"


def random_expression(nums: Sequence[int], rng: random.Random) -> str:
    """An expression that combines ``nums`` (each once) in a random order with random operators, written as the
    solver writes its solutions. Subtraction never goes below zero and division only where it is exact, as in
    the warm-started model's own attempts."""
    items = [(Fraction(n), str(n)) for n in nums]
    rng.shuffle(items)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (va, ea), (vb, eb) = items[i], items[j]
        ops = ["+", "*"] + (["-"] if va >= vb else []) + (["/"] if vb != 0 and (va / vb).denominator == 1 else [])
        op = rng.choice(ops)
        value = va + vb if op == "+" else va - vb if op == "-" else va * vb if op == "*" else va / vb
        items = [x for k, x in enumerate(items) if k not in (i, j)] + [(value, f"({ea} {op} {eb})")]
    return strip_outer(items[0][1])


MAX_ATTEMPTS = 3
"""Most attempts in a warm-start trace; a trace on a task of 3+ numbers that has missed this many gives up."""
GIVE_UP_SHARE = 0.2
"""Share of the warm-start's turn-1 traces on tasks of 3+ numbers that miss :data:`MAX_ATTEMPTS` times and
give up (their answer is the last attempt, wrong): the model learns to stop and to say that it missed."""


def missed_attempts(task: CountdownTask, rng: random.Random, k: int) -> list[str]:
    """Up to ``k`` random expressions over the task's numbers, with distinct values none of which is the target."""
    out: list[str] = []
    values = {Fraction(task.target)}
    for _ in range(20 * k):
        if len(out) == k:
            break
        e = random_expression(task.nums, rng)
        if evaluate_expression(e) not in values:
            values.add(evaluate_expression(e))
            out.append(e)
    return out


def solver_trace(task: CountdownTask, rng: random.Random) -> tuple[str, str]:
    """The turn-1 target of a warm-start example → (equation, trace): 0 to ``MAX_ATTEMPTS − 1`` missed attempts
    (true values, "no"), then the solver's solution ("yes"); or, for :data:`GIVE_UP_SHARE` of the tasks of 3+
    numbers, ``MAX_ATTEMPTS`` misses and the trace gives up."""
    if len(task.nums) >= 3 and rng.random() < GIVE_UP_SHARE:
        failed = missed_attempts(task, rng, MAX_ATTEMPTS)
        if failed:
            return failed[-1], answer_trace(task, failed[-1], failed=failed, gave_up=True)
    failed = missed_attempts(task, rng, rng.randrange(MAX_ATTEMPTS))
    return task.solution, answer_trace(task, task.solution, failed=failed)


WRONG_KINDS = {"value": 0.45, "give_up": 0.2, "foreign": 0.15, "extra": 0.1, "missing": 0.1}
"""Kinds of wrong answers the warm-start shows before a low confidence, and their shares: the task's numbers
whose last step claims the target it misses (``value``), a trace that misses every attempt and says so
(``give_up``), one number replaced by another (``foreign``: a number not given, or a given one twice), one
number too many (``extra``: often the target itself) and one too few (``missing``). Of 417 wrong held-out
answers of a warm-started SmolLM2 whose traces held one attempt, 59% had the right numbers and a last step
claiming the target, 17% a foreign or repeated number, 16% one too many and 8% one too few."""


def wrong_answer(task: CountdownTask, rng: random.Random) -> tuple[str, str] | None:
    """A wrong answer of a randomly drawn kind (:data:`WRONG_KINDS`) → (equation, turn-1 trace), or None when
    none was found in a few draws. Before the wrong last attempt come 0 to 2 honest misses."""
    hi = max(max(task.nums), 20)
    for _ in range(20):
        kind = rng.choices(list(WRONG_KINDS), weights=list(WRONG_KINDS.values()))[0]
        if kind == "give_up":
            failed = missed_attempts(task, rng, MAX_ATTEMPTS)
            if failed:
                return failed[-1], answer_trace(task, failed[-1], failed=failed, gave_up=True)
            continue
        nums = list(task.nums)
        if kind == "foreign":
            k = rng.randrange(len(nums))
            others = [x for j, x in enumerate(nums) if j != k]
            nums[k] = rng.choice(others) if rng.random() < 0.5 else rng.randint(1, hi)
        elif kind == "extra":
            nums.append(task.target if rng.random() < 0.5 else rng.choice(nums))
        elif kind == "missing":
            nums.pop(rng.randrange(len(nums)))
        expression = random_expression(nums, rng)
        if compute_score(f"<answer>{expression}</answer>", task.ground_truth, format_score=0.0) == 1.0:
            continue
        failed = [e for e in missed_attempts(task, rng, rng.randrange(MAX_ATTEMPTS)) if e != expression]
        return expression, answer_trace(task, expression, failed=failed, claim=task.target)
    return None


def check_answer(task: CountdownTask, expression: str | None) -> tuple[str, bool]:
    """The turn-2 check of an equation, computed exactly → (analysis text, the equation is right).

    It re-derives what the answer's own reasoning may have got wrong, writing each comparison with both sides
    next to each other: the numbers the equation uses against the given ones, and, if those match, the value
    of each step and the last one against the target. The verdict is the accuracy reward's."""
    if expression is None:
        return "There is no equation in the answer.", False
    try:
        _, literals = parse_expression(tokenize_expression(expression))
        steps = solution_steps(expression)
    except ZeroDivisionError:
        return "The equation divides by zero.", False
    except Exception:
        return "The answer is not a valid equation.", False
    used = ", ".join(str(x) for x in literals)
    head = f"Uses {used}; given {', '.join(str(x) for x in task.nums)}:"
    given, got = Counter(task.nums), Counter(literals)
    problem = next((f"{x} is not given" if not given[x] else f"{x} is used {got[x]} times"
                    for x in dict.fromkeys(literals) if got[x] > given[x]), None)
    problem = problem or next((f"{x} is not used" for x in dict.fromkeys(task.nums) if got[x] < given[x]), None)
    if problem:
        return f"{head} {problem}.", False
    value = _fmt(evaluate_expression(expression)).strip("()")
    right = value == str(task.target)
    work = " ".join(f"{s}." for s in steps)
    return f"{head} each once. {work} {value} vs {task.target}: {'right' if right else 'wrong'}.", right


def confidence_trace(task: CountdownTask, expression: str | None, correct: bool, rng: random.Random) -> str:
    """Turn-2 target: the check of :func:`check_answer`, then a confidence that leans its way. The stated values
    are spread (not all 0.9 / 0.1) so that the G_c confidences of one answer differ and RL's confidence
    advantages have signal."""
    analysis, right = check_answer(task, expression)
    if right != correct:
        raise ValueError(f"check of {expression!r} for {task.nums} -> {task.target} says {right}, expected {correct}")
    c = rng.choice([0.6, 0.7, 0.8, 0.9, 0.95]) if correct else rng.choice([0.05, 0.1, 0.2, 0.3, 0.4])
    return f"<analysis>{analysis}</analysis>\n<confidence>{c}</confidence>"


def sft_examples(n_tasks: int, seed: int, *, tasks: list[CountdownTask] | None = None, single_turn: bool = False,
                 **task_kwargs) -> list[dict[str, Any]]:
    """Chat examples ``{"messages": [...], "completion": str, "sample_type": ..., "loss_from": int}``: two per
    task (turn 1, turn 2), then, with ``single_turn``, one more per task in the one-turn format.
    ``loss_from``: the character of ``completion`` where the loss starts (0: all of it).

    On ``tasks`` (each with a correct ``solution``; a run passes :func:`rlcr.runs.task_sets.sft_tasks`, drawn from
    its training pool) or, without them, on ``n_tasks`` tasks generated from ``seed``."""
    rng = random.Random(seed)
    tasks = generate_tasks(n_tasks, seed, **task_kwargs) if tasks is None else tasks
    out = []
    for task in tasks:
        solved, answer = solver_trace(task, rng)
        out.append({"messages": turn1_messages(task), "completion": answer, "sample_type": "answer", "task": task,
                    "loss_from": 0})
        shown_right = solved == task.solution
        wrong = wrong_answer(task, rng) if rng.random() < 0.5 else None
        expression, shown = wrong if wrong else (solved, answer)
        out.append({"messages": turn2_messages(task, shown), "sample_type": "confidence", "task": task,
                    "completion": confidence_trace(task, expression, wrong is None and shown_right, rng),
                    "loss_from": 0})
    if single_turn:  # its own random stream: the two-turn examples are the same with or without it
        rng = random.Random(f"single-turn-{seed}")
        for task in tasks:
            wrong = wrong_answer(task, rng) if rng.random() < 0.5 else None
            if wrong is None:  # a solved trace (no give-up: a wrong answer's response carries loss on its check only)
                wrong_free = answer_trace(task, task.solution,
                                          failed=missed_attempts(task, rng, rng.randrange(MAX_ATTEMPTS)))
            expression, shown = wrong if wrong else (task.solution, wrong_free)
            shown += "\n"
            check = confidence_trace(task, expression, wrong is None, rng)
            out.append({"messages": single_turn_messages(task), "completion": shown + check, "sample_type": "answer",
                        "task": task, "loss_from": len(shown) if wrong else 0})
    return out
