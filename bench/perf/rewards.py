"""Benchmark of the Countdown reward, rlcr.tasks.countdown.compute_score.

Measures:
1. throughput: scores per second over N (default 100,000) model-like completions
   (correct, wrong, malformed, multi-line with an ``Assistant:`` marker) built from
   generated tasks, with the 0 / 0.1 / 1.0 distribution as a sanity check;
2. worst case: the slowest single call, over 20 repeats, on an adversarial set
   (the docs/design.md §2–§4 holes of the reference scorer, 10k-char inputs, deep nesting,
   huge literals, unicode digits, thousands of ``<answer>`` tags). Every docs/design.md §2–§4
   hole must score the format score 0.1, else the script exits non-zero.

3. the math task's verifier (rlcr.tasks.math, math-verify in a worker process): scores per second on
   typical answers to the shipped problems (right in equivalent forms, wrong, malformed; each answer new,
   so no cached result), and the slowest call on the hostile answers (power towers, huge factorials,
   megabytes of LaTeX, deep braces), which must all score the format score.

Run from the repo root:  python bench/perf/rewards.py [--n 100000] [--math-n 2000] [--seed 0]
The last four lines are ``adversarial slowest call us: <n>``, ``math hostile slowest call s: <n>``,
``math verifier scores/s: <n>`` and ``compute_score scores/s: <n>``.
"""

import argparse
import os
import random
import re
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from rlcr.config import RLCRConfig  # noqa: E402
from rlcr.tasks.countdown import compute_score, generate_tasks  # noqa: E402
from rlcr.tasks.math_data import DATA_DIR, GSM8K_FILE, MATH_FILE  # noqa: E402
from rlcr.tasks.registry import get_task  # noqa: E402

FORMAT_SCORE = RLCRConfig().method.format_score  # the config's default (0.1)
N_TASKS = 500
REPEATS = 20

# ----------------------------------------------------------------------------- model-like completions

REASONING = [
    "Let me look at the numbers {nums} and the target {target}.",
    "I need to use every number exactly once.",
    "Try multiplying the two largest numbers first.",
    "That overshoots, so subtract one of the smaller numbers.",
    "Maybe a division helps to get closer to {target}.",
    "Adding them all gives {total}, which is not {target}.",
    "Let me check the result again step by step.",
    "So the equation should work.",
]
NUMBER = re.compile(r"\d+")
SWAP_OP = str.maketrans("+-*/", "-+/*")


def think(rng, task):
    k = rng.randint(2, 6)
    lines = [s.format(nums=task.nums, target=task.target, total=sum(task.nums)) for s in rng.sample(REASONING, k)]
    return "<think>" + "\n".join(lines) + "</think>"


def wrong_numbers(rng, sol):
    """Change one literal (off by one), or drop/duplicate a number."""
    literals = list(NUMBER.finditer(sol))
    m = rng.choice(literals)
    if rng.random() < 0.7:
        return sol[: m.start()] + str(int(m.group()) + 1) + sol[m.end():]
    return sol + " + " + m.group()  # uses a number twice


def wrong_value(rng, sol):
    """Same numbers, operators swapped (almost always a different value)."""
    return sol.translate(SWAP_OP)


def completion(rng, task):
    """One model-like response; the mix is roughly what an early-training policy emits."""
    sol = task.solution
    if rng.random() < 0.5:
        sol = sol.replace(" ", "")
    r = rng.random()
    if r < 0.35:  # correct
        body = f"{think(rng, task)}\n<answer>{sol}</answer>"
    elif r < 0.50:  # wrong numbers
        body = f"{think(rng, task)}\n<answer>{wrong_numbers(rng, sol)}</answer>"
    elif r < 0.65:  # wrong value
        body = f"{think(rng, task)}\n<answer>{wrong_value(rng, sol)}</answer>"
    else:  # malformed
        kind = rng.randrange(6)
        if kind == 0:  # missing tags
            body = f"{think(rng, task)}\nThe answer is {sol}"
        elif kind == 1:  # unclosed answer tag
            body = f"{think(rng, task)}\n<answer>{sol}"
        elif kind == 2:  # text after the answer line
            body = f"{think(rng, task)}\n<answer>{sol}</answer>\nI hope this helps!"
        elif kind == 3:  # empty answer
            body = f"{think(rng, task)}\n<answer></answer>"
        elif kind == 4:  # unclosed think, answer inside it
            body = f"<think>{think(rng, task)[7:-8]}\n<answer>{sol}</answer>"
        else:  # answer with prose around the equation
            body = f"{think(rng, task)}\n<answer>{sol} = {task.target}</answer>"
    if rng.random() < 0.25:  # multi-line transcript with an Assistant: marker prefix
        user = f"User: Using the numbers {task.nums}, create an equation that equals {task.target}."
        body = f"System: You are a helpful assistant.\n{user}\nAssistant: Let me solve this step by step.\n{body}"
    return body


def build_completions(n, seed):
    tasks = generate_tasks(N_TASKS, seed)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        out.append((completion(rng, task), task.ground_truth))
    return out


# ----------------------------------------------------------------------------- adversarial set


def adversarial_cases():
    """(name, solution_str, ground_truth, expected score, is a docs/design.md §2–§4 hole)."""
    gt24 = {"target": 24, "numbers": [1, 2, 8]}
    think_line = "<think>Let me think about this carefully.</think>\n"
    ans = lambda eq: think_line + f"<answer>{eq}</answer>"  # noqa: E731
    long_reasoning = ("I try one more combination of the numbers. " * 10 + "\n") * 23
    cases = [
        # docs/design.md §2–§4 holes of the reference scorer: must be format_score and fast.
        ("hole 9**9**9", ans("9**9**9"), {"target": 24, "numbers": [9, 9, 9]}, FORMAT_SCORE, True),
        ("hole 1.5*16", ans("1.5*16"), {"target": 24, "numbers": [1, 5, 16]}, FORMAT_SCORE, True),
        ("hole -1+25", ans("-1+25"), {"target": 24, "numbers": [1, 25]}, FORMAT_SCORE, True),
        ("hole 8//3*9", ans("8//3*9"), {"target": 18, "numbers": [8, 3, 9]}, FORMAT_SCORE, True),
        ("hole (1+2)*8 = 24", ans("(1+2)*8 = 24"), gt24, FORMAT_SCORE, True),
        # controls
        ("control (1+2)*8", ans("(1+2)*8"), gt24, 1.0, False),
        ("control 8*(2+1) + Assistant:", "User: hi\nAssistant: ok\n" + ans("8 * (2 + 1)"), gt24, 1.0, False),
        # 10,000-character inputs
        ("10k reasoning, <answer> x125 unclosed last line",
         long_reasoning[:9000] + "\n" + "<answer>" * 125, gt24, 0, False),
        ("10k single-line answer", "<answer>" + "1+" * 4995 + "1</answer>", gt24, FORMAT_SCORE, False),
        ("10k digits in <answer>", "<answer>" + "7" * 10_000 + "</answer>", gt24, FORMAT_SCORE, False),
        ("10k spaces in <answer>", "<answer>" + " " * 10_000 + "(1+2)*8</answer>", gt24, 1.0, False),
        ("10k newlines then answer", "\n" * 10_000 + "<answer>(1+2)*8</answer>", gt24, 1.0, False),
        ("10k Assistant: markers", "Assistant:" * 1000 + "<answer>(1+2)*8</answer>", gt24, 1.0, False),
        # deep nesting
        ("5000 nested parens", "<answer>" + "(" * 5000 + "1+2" + ")" * 5000 + "*8</answer>", gt24, FORMAT_SCORE, False),
        ("5000 unbalanced '('", "<answer>" + "(" * 5000 + "</answer>", gt24, FORMAT_SCORE, False),
        ("120 nested parens (under length cap)",
         "<answer>" + "(" * 120 + "1+2" + ")" * 120 + "*8</answer>", gt24, 1.0, False),
        # huge integer literals
        ("5000-digit literal", ans("9" * 5000 + "*1*2*8"), gt24, FORMAT_SCORE, False),
        ("13-digit literal", ans("1234567890123*1+2*8"), gt24, FORMAT_SCORE, False),
        ("12-digit literals, max power", ans("*".join(["999999999999"] * 19)),
         {"target": 24, "numbers": [999999999999] * 19}, FORMAT_SCORE, False),
        ("12-digit literals, tiny fraction", ans("/".join(["999999999999"] * 19)),
         {"target": 24, "numbers": [999999999999] * 19}, FORMAT_SCORE, False),
        # unicode digits and other lookalikes
        ("arabic-indic digits", ans("(\u0661+\u0662)*\u0668"), gt24, FORMAT_SCORE, False),
        ("fullwidth digits", ans("(\uff11+\uff12)*\uff18"), gt24, FORMAT_SCORE, False),
        ("superscript two", ans("(1+\u00b2)*8"), gt24, FORMAT_SCORE, False),
        ("unicode multiply sign", ans("(1+2)\u00d78"), gt24, FORMAT_SCORE, False),
        ("no-break space", ans("(1+2)\u00a0*8"), gt24, FORMAT_SCORE, False),
        # other syntax the whitelist reference would pass to eval
        ("leading zero 08", ans("(1+2)*08"), gt24, FORMAT_SCORE, False),
        ("unary plus", ans("+(1+2)*8"), gt24, FORMAT_SCORE, False),
        ("empty parens", ans("()(1+2)*8"), gt24, FORMAT_SCORE, False),
        ("division by zero", ans("8/(2-2)"), {"target": 24, "numbers": [8, 2, 2]}, FORMAT_SCORE, False),
        # many tags
        ("<answer> x5000 no close", "<answer>" * 5000, gt24, 0, False),
        ("<answer>1</answer> x550 then real (10k)", "<answer>1</answer>" * 550 + "<answer>(1+2)*8</answer>", gt24, 1.0,
         False),
        ("<answer>1</answer> x5000 then real", "<answer>1</answer>" * 5000 + "<answer>(1+2)*8</answer>", gt24, 1.0,
         False),
        ("<answer> x5000 then one close", "<answer>" * 5000 + "(1+2)*8</answer>", gt24, FORMAT_SCORE, False),
        ("</answer> x5000", "</answer>" * 5000, gt24, 0, False),
        ("not a str (None)", None, gt24, 0, False),
    ]
    return cases


def time_call(text, gt):
    """(best, worst) microseconds of one compute_score call over REPEATS repeats, and the score."""
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        s = compute_score(text, gt)
        times.append(time.perf_counter() - t0)
    return min(times) * 1e6, max(times) * 1e6, s


# ----------------------------------------------------------------------------- the math verifier

MATH_HOSTILE = {
    "power tower 10^{10^{10}}": "10^{10^{10}}",
    "(10^{9999})^{9999}": "(10^{9999})^{9999}",
    "99999999!": "99999999!",
    "binom(99999999, 49999999)": "\\binom{99999999}{49999999}",
    "1 MB of LaTeX": "\\frac{1}{2}+" * 100_000,
    "50k nested braces": "{" * 50_000 + "1" + "}" * 50_000,
    "2^{2}, 50 times": "2^{2}" * 50,
}


def math_answers(n, seed):
    """(completion, problem) pairs: a new answer each (no cached result), right, wrong or malformed."""
    task = get_task("math")
    problems = task.load(str(DATA_DIR / GSM8K_FILE)) + task.load(str(DATA_DIR / MATH_FILE))
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = problems[i % len(problems)]
        r = rng.random()
        if r < 0.4:  # right, in a form of its own: the gold plus a unique zero term
            answer = f"{p.answer} + 0 \\cdot {i}"
        elif r < 0.8:  # wrong
            answer = f"{p.answer} + {i + 1}"
        else:  # malformed
            answer = f"\\frac{{{i}}}{{"
        out.append((f"<think>Let me work it out.</think>\n<answer>{answer}</answer>", p))
    return task, out


def bench_math(n, seed):
    """(scores/s on typical answers, slowest hostile call in s); exits non-zero if a hostile answer scores."""
    task, data = math_answers(n, seed)
    task.score(*data[0], format_score=FORMAT_SCORE)  # starts the worker
    t0 = time.perf_counter()
    scores = [task.score(text, p, format_score=FORMAT_SCORE) for text, p in data[1:]]
    rate = (len(data) - 1) / (time.perf_counter() - t0)
    dist = Counter(scores)
    print(f"math verifier: scored {len(scores)} answers at {rate:,.0f} scores/s; "
          + ", ".join(f"score {v}: {dist[v]}" for v in sorted(dist)))
    print("math hostile answers (gold 5; each must score the format score):")
    slowest, failures = 0.0, []
    for name, answer in MATH_HOSTILE.items():
        t0 = time.perf_counter()
        s = task.score(f"<answer>{answer}</answer>", data[0][1], format_score=FORMAT_SCORE)
        took = time.perf_counter() - t0
        slowest = max(slowest, took)
        print(f"  {name:<32} {len(answer):>9} chars  score {s:<4} {took:8.3f} s", flush=True)
        if s != FORMAT_SCORE:
            failures.append(f"{name}: got {s}")
    if failures:
        sys.exit("FAIL: hostile math answers must score the format score: " + "; ".join(failures))
    return rate, slowest


# ----------------------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="number of model-like completions to score")
    parser.add_argument("--math-n", type=int, default=2000, help="number of math answers to verify")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # 1. throughput over model-like completions
    data = build_completions(args.n, args.seed)
    for text, gt in data[:200]:  # warm-up
        compute_score(text, gt)
    t0 = time.perf_counter()
    scores = [compute_score(text, gt) for text, gt in data]
    elapsed = time.perf_counter() - t0
    rate = len(data) / elapsed
    mean_len = sum(len(t) for t, _ in data) / len(data)
    print(f"scored {len(data)} completions (mean {mean_len:.0f} chars) in {elapsed:.3f} s: {rate:,.0f} scores/s")
    dist = Counter(scores)
    for value in sorted(dist):
        print(f"  score {value:<4}: {dist[value]:>7} ({100 * dist[value] / len(data):.1f}%)")
    unexpected = set(dist) - {0, FORMAT_SCORE, 1.0}
    if unexpected:
        sys.exit(f"FAIL: compute_score returned values other than 0 / 0.1 / 1.0: {sorted(unexpected)}")

    # 2. adversarial set: slowest single call
    print()
    print(f"adversarial inputs ({REPEATS} repeats each):")
    print(f"  {'case':<48} {'len':>7} {'score':>6} {'expect':>6} {'best us':>9} {'worst us':>9}")
    slowest, slowest_name = 0.0, ""
    failures, surprises = [], []
    for name, text, gt, expect, is_hole in adversarial_cases():
        best, worst, s = time_call(text, gt)
        if worst > slowest:
            slowest, slowest_name = worst, name
        flag = "" if s == expect else "  <-- unexpected"
        length = len(text) if isinstance(text, str) else 0
        print(f"  {name:<48} {length:>7} {s:>6} {expect:>6} {best:>9.1f} {worst:>9.1f}{flag}")
        if s != expect:
            (failures if is_hole else surprises).append(f"{name}: got {s}, expected {expect}")
    print()
    for msg in surprises:
        print(f"WARNING: {msg}")
    if failures:
        sys.exit("FAIL: docs/design.md §2–§4 holes must return the format score 0.1:\n  " + "\n  ".join(failures))

    print(f"slowest adversarial case: {slowest_name}")
    print()
    # 3. the math verifier
    math_rate, math_slowest = bench_math(args.math_n, args.seed)
    print()
    print(f"adversarial slowest call us: {slowest:.1f}")
    print(f"math hostile slowest call s: {math_slowest:.3f}")
    print(f"math verifier scores/s: {math_rate:.0f}")
    print(f"compute_score scores/s: {rate:.0f}")


if __name__ == "__main__":
    main()
