"""Generated math problems with computed answers: the ``math`` task's generator and its shipped files.

Two families, each answer computed exactly (``fractions.Fraction``) by the generator:

* **word problems** in GSM8K's format: a ``question``, and an ``answer`` holding the worked rationale
  (with GSM8K's ``<<a*b=c>>`` calculator annotations) and a last line ``#### <final>``;
* **exercises** in MATH's format: a ``problem``, a ``solution`` ending in ``\\boxed{<final>}``, a ``level``
  (``Level 1`` … ``Level 5``) and a ``type``.

``python -m rlcr.tasks.math_data [OUT_DIR]`` writes ``gsm8k_style.jsonl`` and ``math_style.jsonl``
(default: ``rlcr/tasks/data``, the files shipped with the package); the output is byte-for-byte the same
on every run. ``rlcr.tasks.math`` reads them with the same loader a user points at downloaded data.
"""

from __future__ import annotations

import json
import random
import sys
from fractions import Fraction
from math import gcd
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["word_problem", "exercise", "gsm8k_rows", "math_rows", "write_files", "rows_stream", "latex", "DATA_DIR",
           "GSM8K_FILE", "MATH_FILE", "ROWS_PER_FILE"]

DATA_DIR = Path(__file__).with_name("data")
GSM8K_FILE = "gsm8k_style.jsonl"
MATH_FILE = "math_style.jsonl"
ROWS_PER_FILE = 200
_NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farah", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Mateo",
          "Nora", "Omar", "Priya"]
_ITEMS = ["pencils", "apples", "stickers", "marbles", "cookies", "notebooks", "cards", "oranges"]


def latex(value: Fraction) -> str:
    """``value`` as MATH writes answers: an integer, or ``\\frac{p}{q}`` in lowest terms (sign in front)."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


# --------------------------------------------------------------------------- word problems (GSM8K format)


def _change(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    count, price = rng.randint(2, 12), rng.randint(1, 9)
    cost = count * price
    bill = next(b for b in (10, 20, 50, 100, 200) if b >= cost)
    q = f"{name} buys {count} {item} at ${price} each and pays with a ${bill} bill. How much change does {name} get?"
    steps = [f"The {item} cost {count} * {price} = <<{count}*{price}={cost}>>{cost} dollars.",
             f"The change is {bill} - {cost} = <<{bill}-{cost}={bill - cost}>>{bill - cost} dollars."]
    return q, steps, bill - cost


def _trip(rng: random.Random) -> tuple[str, list[str], int]:
    s1, h1, s2, h2 = rng.randint(20, 70), rng.randint(1, 5), rng.randint(20, 70), rng.randint(1, 5)
    d1, d2 = s1 * h1, s2 * h2
    q = (f"A bus travels at {s1} miles per hour for {h1} hours, then at {s2} miles per hour for {h2} hours. "
         "How many miles does it travel in all?")
    steps = [f"First it travels {s1} * {h1} = <<{s1}*{h1}={d1}>>{d1} miles.",
             f"Then it travels {s2} * {h2} = <<{s2}*{h2}={d2}>>{d2} miles.",
             f"In all it travels {d1} + {d2} = <<{d1}+{d2}={d1 + d2}>>{d1 + d2} miles."]
    return q, steps, d1 + d2


def _sharing(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    friends, each, more = rng.randint(2, 6), rng.randint(2, 8), rng.randint(1, 30)
    start = friends * each + rng.randint(0, 40)
    given = friends * each
    left = start - given
    q = (f"{name} has {start} {item}. {name} gives {each} {item} to each of {friends} friends and then buys {more} "
         f"more. How many {item} does {name} have now?")
    steps = [f"{name} gives away {each} * {friends} = <<{each}*{friends}={given}>>{given} {item}.",
             f"That leaves {start} - {given} = <<{start}-{given}={left}>>{left} {item}.",
             f"After buying more, {name} has {left} + {more} = <<{left}+{more}={left + more}>>{left + more} {item}."]
    return q, steps, left + more


def _savings(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(_NAMES)
    weekly, weeks = rng.randint(3, 25), rng.randint(2, 12)
    saved = weekly * weeks
    spent = rng.randint(1, saved)
    q = (f"{name} saves ${weekly} every week. After {weeks} weeks, {name} spends ${spent} on a gift. "
         "How many dollars does " + name + " have left?")
    steps = [f"{name} saves {weekly} * {weeks} = <<{weekly}*{weeks}={saved}>>{saved} dollars.",
             f"After the gift, {saved} - {spent} = <<{saved}-{spent}={saved - spent}>>{saved - spent} dollars are "
             "left."]
    return q, steps, saved - spent


def _discount(rng: random.Random) -> tuple[str, list[str], int]:
    pct = rng.choice([10, 20, 25, 50])
    price = rng.randint(2, 40) * (100 // gcd(100, pct))
    off = price * pct // 100
    q = f"A jacket costs ${price}. It is on sale for {pct}% off. What is the sale price in dollars?"
    steps = [f"The discount is {price} * {pct} / 100 = <<{price}*{pct}/100={off}>>{off} dollars.",
             f"The sale price is {price} - {off} = <<{price}-{off}={price - off}>>{price - off} dollars."]
    return q, steps, price - off


def _boxes(rng: random.Random) -> tuple[str, list[str], int]:
    item = rng.choice(_ITEMS)
    per, total = rng.randint(3, 12), rng.randint(20, 150)
    full, rest = divmod(total, per)
    boxes = full + (rest > 0)
    q = f"Each box holds {per} {item}. How many boxes are needed to pack {total} {item}?"
    steps = [f"{total} / {per} = {full} with {rest} left over, so {full} boxes are full."]
    steps.append(f"One more box holds the other {rest}, so {full} + 1 = <<{full}+1={boxes}>>{boxes} boxes are needed."
                 if rest else f"Nothing is left over, so {boxes} boxes are needed.")
    return q, steps, boxes


_WORD: list[Callable[[random.Random], tuple[str, list[str], int]]] = [_change, _trip, _sharing, _savings, _discount,
                                                                     _boxes]


def word_problem(rng: random.Random) -> dict[str, Any]:
    """One GSM8K-format row: ``question`` and ``answer`` (rationale lines, then ``#### <final>``)."""
    question, steps, final = rng.choice(_WORD)(rng)
    return {"question": question, "answer": "\n".join(steps) + f"\n#### {final}"}


# --------------------------------------------------------------------------- exercises (MATH format)


def _fraction_sum(rng: random.Random) -> tuple[str, str, Fraction, int, str]:
    a, b, c, d = rng.randint(1, 9), rng.randint(2, 12), rng.randint(1, 9), rng.randint(2, 12)
    value = Fraction(a, b) + Fraction(c, d)
    den = b * d // gcd(b, d)
    p = (f"Compute $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$. Express your answer as a common fraction "
         "(or an integer).")
    s = (f"Over the common denominator {den}: $\\frac{{{a * den // b}}}{{{den}}} + \\frac{{{c * den // d}}}{{{den}}} = "
         f"\\frac{{{a * den // b + c * den // d}}}{{{den}}}$, which is $\\boxed{{{latex(value)}}}$ in lowest terms.")
    return p, s, value, 1, "Prealgebra"


def _linear(rng: random.Random) -> tuple[str, str, Fraction, int, str]:
    a, b, c = rng.choice([n for n in range(-9, 10) if n not in (-1, 0, 1)]), rng.randint(-20, 20), rng.randint(-30, 30)
    x = Fraction(c - b, a)
    sign = "+" if b >= 0 else "-"
    p = f"Solve for $x$: ${a}x {sign} {abs(b)} = {c}$. Express your answer as a common fraction if needed."
    move = f"Subtracting {b} from" if b >= 0 else f"Adding {-b} to"
    s = f"{move} both sides gives ${a}x = {c - b}$, so $x = \\frac{{{c - b}}}{{{a}}} = \\boxed{{{latex(x)}}}$."
    return p, s, x, 2, "Algebra"


def _lcm(rng: random.Random) -> tuple[str, str, Fraction, int, str]:
    a, b = rng.randint(4, 60), rng.randint(4, 60)
    g = gcd(a, b)
    value = a * b // g
    p = f"What is the least common multiple of {a} and {b}?"
    s = (f"Their greatest common divisor is {g}, so the least common multiple is "
         f"$\\frac{{{a} \\cdot {b}}}{{{g}}} = \\boxed{{{value}}}$.")
    return p, s, Fraction(value), 2, "Number Theory"


def _powers(rng: random.Random) -> tuple[str, str, Fraction, int, str]:
    base, m, n = rng.randint(2, 5), rng.randint(2, 6), rng.randint(2, 6)
    k = rng.randint(1, m + n)
    e = m + n - k
    value = Fraction(base) ** e
    p = f"Evaluate $\\frac{{{base}^{{{m}}} \\cdot {base}^{{{n}}}}}{{{base}^{{{k}}}}}$."
    s = (f"Adding and subtracting exponents, this is ${base}^{{{m} + {n} - {k}}} = {base}^{{{e}}} = "
         f"\\boxed{{{latex(value)}}}$.")
    return p, s, value, 3, "Algebra"


def _roots(rng: random.Random) -> tuple[str, str, Fraction, int, str]:
    r1, r2 = rng.randint(-9, 9), rng.randint(-9, 9)
    s_, p_ = r1 + r2, r1 * r2
    value = r1 * r1 + r2 * r2
    lin = f" {'-' if s_ > 0 else '+'} {abs(s_)}x" if s_ else ""
    const = f" {'+' if p_ >= 0 else '-'} {abs(p_)}" if p_ else ""
    p = f"What is the sum of the squares of the roots of $x^2{lin}{const} = 0$?"
    s = (f"The roots $r$ and $s$ have $r + s = {s_}$ and $rs = {p_}$, so $r^2 + s^2 = (r+s)^2 - 2rs = {s_ * s_} - "
         f"{2 * p_ if p_ >= 0 else f'({2 * p_})'} = \\boxed{{{value}}}$.")
    return p, s, Fraction(value), 4, "Algebra"


def _system(rng: random.Random) -> tuple[str, str, Fraction, int, str]:
    while True:
        a, b, c, d = (rng.randint(1, 7) for _ in range(4))
        if a * d - b * c:
            break
    x, y = rng.randint(-9, 9), rng.randint(-9, 9)
    e, f = a * x + b * y, c * x + d * y
    p = f"If ${a}x + {b}y = {e}$ and ${c}x + {d}y = {f}$, what is $x + y$?"
    s = f"Solving the two equations gives $x = {x}$ and $y = {y}$, so $x + y = \\boxed{{{x + y}}}$."
    return p, s, Fraction(x + y), 4, "Algebra"


def _series(rng: random.Random) -> tuple[str, str, Fraction, int, str]:
    a, d, n = rng.randint(-10, 10), rng.randint(1, 9), rng.randint(5, 30)
    value = Fraction(n * (2 * a + (n - 1) * d), 2)
    p = (f"The first term of an arithmetic sequence is ${a}$ and its common difference is ${d}$. "
         f"What is the sum of its first ${n}$ terms?")
    s = (f"The sum is $\\frac{{n}}{{2}}(2a + (n-1)d) = \\frac{{{n}}}{{2}}({2 * a} + {(n - 1) * d}) = "
         f"\\boxed{{{latex(value)}}}$.")
    return p, s, value, 5, "Algebra"


_EXERCISES = [_fraction_sum, _linear, _lcm, _powers, _roots, _system, _series]


def exercise(rng: random.Random) -> dict[str, Any]:
    """One MATH-format row: ``problem``, ``solution`` (ending in ``\\boxed{}``), ``level``, ``type``."""
    problem, solution, _, level, kind = rng.choice(_EXERCISES)(rng)
    return {"problem": problem, "solution": solution, "level": f"Level {level}", "type": kind}


# --------------------------------------------------------------------------- files


def _distinct(make: Callable[[random.Random], dict[str, Any]], key: str, n: int, seed: int) -> list[dict[str, Any]]:
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < n:
        row = make(rng)
        if row[key] not in seen:
            seen.add(row[key])
            out.append(row)
    return out


def gsm8k_rows(n: int = ROWS_PER_FILE, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct GSM8K-format rows, deterministic in ``seed``."""
    return _distinct(word_problem, "question", n, seed)


def math_rows(n: int = ROWS_PER_FILE, seed: int = 1) -> list[dict[str, Any]]:
    """``n`` distinct MATH-format rows, deterministic in ``seed``."""
    return _distinct(exercise, "problem", n, seed)


def rows_stream(seed: int) -> Iterator[dict[str, Any]]:
    """Endless seeded stream mixing both formats, each row with a ``level`` (the ``math`` task's generator)."""
    rng = random.Random(seed)
    while True:
        if rng.random() < 0.5:
            yield exercise(rng)
        else:  # GSM8K has no levels; a generated word problem of 2 steps is Level 1, of 3 steps Level 2
            row = word_problem(rng)
            yield {**row, "level": "Level 1" if row["answer"].count("\n") <= 2 else "Level 2"}


def write_files(out_dir: Path = DATA_DIR) -> list[Path]:
    """Write the shipped files into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in ((GSM8K_FILE, gsm8k_rows()), (MATH_FILE, math_rows())):
        path = out_dir / name
        path.write_text("".join(json.dumps(r, ensure_ascii=True) + "\n" for r in rows), encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_files(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA_DIR):
        print(written)
