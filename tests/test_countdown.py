"""Countdown tasks, solver, loader and the strict scorer (docs/design.md §2–§4)."""

from fractions import Fraction

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given, settings, strategies as st

from rlcr.tasks.countdown import (
    CountdownTask,
    TaskFormatError,
    compute_score,
    evaluate_expression,
    extract_solution,
    generate_tasks,
    load_tasks,
    save_tasks,
    solve,
    turn1_messages,
    turn2_messages,
)

GT = {"target": 24, "numbers": [1, 5, 16]}


# ----------------------------------------------------------------- docs/design.md §2–§4 score table
@pytest.mark.parametrize(
    "text, expected",
    [
        ("no tags at all", 0),
        ("<answer>16 + 5 + 1</answer>\n", 0),  # last line is empty: nothing extracted
        ("<answer>16 + 5 + 1", 0),  # unclosed
        ("<answer>16 + 5 + 3</answer>", 0.1),  # wrong numbers
        ("<answer>16 + 5</answer>", 0.1),  # a number missing
        ("<answer>16 + 5 + 1 + 1</answer>", 0.1),  # a number used twice
        ("<answer>16 * 5 * 1</answer>", 0.1),  # right numbers, wrong value
        ("<answer>16 / (5 - 5)</answer>", 0.1),
        ("<answer></answer>", 0.1),  # extracted but empty
        ("<answer>16 + 5 + 1 + x</answer>", 0.1),
        ("<answer>(16 + 5) + 1</answer>", 1.0 * 0 + 0.1),  # 22 != 24
        ("<answer>16 + 5 + 1 + 2</answer>", 0.1),
        ("<think>1+5=6</think>\n<answer>16 + (5 + 1) + 2</answer>", 0.1),
        ("<think>x</think>\n<answer>16 + 5 + 1</answer>", 0.1),
        ("<think>x</think>\n<answer>(5 - 1) * 16 / 4</answer>", 0.1),
    ],
)
def test_score_table(text, expected):
    assert compute_score(text, GT) == expected


def test_correct_answers_score_full():
    assert compute_score("<think>16+8</think>\n<answer>16 + 8 * (5 - 1) / 4</answer>",
                         {"target": 24, "numbers": [16, 8, 5, 1, 4]}) == 1.0
    assert compute_score("<answer>(5 - 1) * (16 / 8)</answer>", {"target": 8, "numbers": [5, 1, 16, 8]}) == 1.0
    assert compute_score("<answer> 16 + 5 + 3 </answer>", {"target": 24, "numbers": [3, 5, 16]}) == 1.0
    # exact rationals: 1/3 * 3 is exactly 1
    assert compute_score("<answer>1 / 3 * 3 + 6</answer>", {"target": 7, "numbers": [1, 3, 3, 6]}) == 1.0


def test_custom_scores():
    assert compute_score("<answer>16 + 5 + 3</answer>", {"target": 24, "numbers": [3, 5, 16]}, format_score=0.2,
                         score=2.0) == 2.0
    assert compute_score("<answer>16 + 5 + 4</answer>", {"target": 24, "numbers": [3, 5, 16]}, format_score=0.2,
                         score=2.0) == 0.2


def test_default_format_score_is_the_configs():
    """One source: ``compute_score``'s default format_score is ``RLCRConfig.format_score``'s default."""
    import inspect

    from rlcr.config import RLCRConfig

    assert inspect.signature(compute_score).parameters["format_score"].default == RLCRConfig().method.format_score
    assert (compute_score("<answer>16 + 5 + 4</answer>", {"target": 24, "numbers": [3, 5, 16]})
            == RLCRConfig().method.format_score)


@pytest.mark.parametrize(
    "answer, nums, target",
    [
        ("9**9**9", [9, 9, 9], 0),
        ("1.5*16", [1, 5, 16], 24),
        ("-1+25", [1, 25], 24),
        ("8//3*9", [8, 3, 9], 18),
        ("(1+2)*8 = 24", [1, 2, 8], 24),
        ("(1+2)*8 == 24", [1, 2, 8, 24], 24),
        ("+1+23", [1, 23], 24),
        ("2**3*3", [2, 3, 3], 24),
        ("(1+2)*(8)", [1, 2, 8], 24),  # valid: parenthesised literal
    ],
)
def test_reference_holes_score_format(answer, nums, target):
    expected = 1.0 if answer == "(1+2)*(8)" else 0.1
    assert compute_score(f"<answer>{answer}</answer>", {"target": target, "numbers": nums}) == expected


def test_extraction_rule_matches_reference():
    # text after the first "Assistant:" marker, its last line, last <answer> on that line
    s = "User: <answer>1+2</answer>\nAssistant: thinking\n<answer>3 + 4</answer> then <answer>4 + 3</answer>"
    assert extract_solution(s) == "4 + 3"
    assert extract_solution("Assistant: a\nb <answer> 7 </answer> tail") == "7"
    # non-greedy left-to-right: the nested opening belongs to the first match
    assert extract_solution("<answer>a<answer>b</answer>") == "a<answer>b"
    assert extract_solution("<answer>a</answer><answer>b") == "a"
    assert extract_solution("<answer>x</answer>\nno answer here") is None
    assert extract_solution(None) is None


def test_never_evaluates_model_text():
    assert evaluate_expression("__import__('os').system('true')") is None
    assert compute_score("<answer>__import__('os')</answer>", GT) == 0.1


def test_big_inputs_return():
    long_line = "<answer>" * 2000 + "1+5+16"
    assert compute_score(long_line, GT) == 0
    assert compute_score("<answer>" + "(" * 5000 + "1+5+16" + ")" * 5000 + "</answer>", GT) == 0.1
    assert compute_score("<answer>" + "9" * 5000 + "</answer>", GT) == 0.1
    nested = "(" * 60 + "16" + ")" * 60 + " + 5 + 1"
    assert evaluate_expression(nested) == 22


def test_unicode_digits_rejected():
    assert compute_score("<answer>١٦ + 5 + 3</answer>", {"target": 24, "numbers": [16, 5, 3]}) == 0.1


# ----------------------------------------------------------------- solver & generation
def test_solve_known_cases():
    sol = solve([4, 7, 8, 8], 24)
    assert sol is not None and compute_score(f"<answer>{sol}</answer>", {"target": 24, "numbers": [4, 7, 8, 8]}) == 1.0
    assert solve([1, 1, 1], 100) is None
    # needs a fractional intermediate: 8 / (3 - 8/3) = 24
    sol = solve([3, 3, 8, 8], 24)
    assert sol is not None and evaluate_expression(sol) == 24


def test_generate_tasks_reproducible_and_in_range():
    a = generate_tasks(30, seed=7, num_range=(2, 30), target_range=(10, 60))
    b = generate_tasks(30, seed=7, num_range=(2, 30), target_range=(10, 60))
    c = generate_tasks(30, seed=8, num_range=(2, 30), target_range=(10, 60))
    assert a == b and a != c
    for t in a:
        assert 3 <= len(t.nums) <= 4 and all(2 <= x <= 30 for x in t.nums) and 10 <= t.target <= 60


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), count=st.integers(3, 4))
def test_generated_tasks_are_solvable(seed, count):
    (task,) = generate_tasks(1, seed, min_count=count, max_count=count)
    assert len(task.nums) == count
    assert compute_score(f"<think>ok</think>\n<answer>{task.solution}</answer>", task.ground_truth) == 1.0
    assert solve(task.nums, task.target) is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=2, max_size=4), st.integers(-20, 120))
def test_generation_shortcuts_agree_with_the_full_search(nums, target):
    """Generation lists reachable values without expressions and solves one target with early exit:
    same values, same expression as the full search (so generated tasks are unchanged)."""
    from rlcr.tasks.countdown_solver import _reachable, _values

    reachable = _reachable(nums)
    assert {Fraction(n, d) for n, d in _values(nums)} == set(reachable)
    assert solve(nums, target) == reachable.get(Fraction(target))


@st.composite
def expression_over(draw):
    nums = draw(st.lists(st.integers(1, 30), min_size=2, max_size=4))
    order = draw(st.permutations(nums))
    items = [(str(n), Fraction(n)) for n in order]
    while len(items) > 1:
        i = draw(st.integers(0, len(items) - 2))
        (ea, va), (eb, vb) = items[i], items[i + 1]
        op = draw(st.sampled_from("+-*/"))
        if op == "/" and vb == 0:
            op = "+"
        value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else None}[op]
        items[i : i + 2] = [(f"({ea} {op} {eb})", value)]
    target = draw(st.integers(-50, 200))
    return nums, items[0][0], items[0][1], target


@settings(max_examples=200, deadline=None)
@given(expression_over())
def test_score_is_one_iff_exact_value_equals_target(case):
    nums, expr, value, target = case
    got = compute_score(f"<answer>{expr}</answer>", {"target": target, "numbers": nums})
    assert got == (1.0 if value == target else 0.1)
    # and the expression's own value is always accepted
    if value.denominator == 1:
        assert compute_score(f"<answer>{expr}</answer>", {"target": int(value), "numbers": nums}) == 1.0


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=10_000))
def test_any_text_is_scored(text):
    assert compute_score(text, GT) in (0, 0.1, 1.0)
    inner = text.replace("\n", " ")
    assume("Assistant:" not in "<answer>" + inner)  # the answer is looked for after "Assistant:" (design §4)
    assert compute_score("<answer>" + inner + "</answer>", GT) in (0.1, 1.0)


# ----------------------------------------------------------------- files
def test_load_jsonl_and_parquet_roundtrip(tmp_path):
    tasks = generate_tasks(5, seed=1)
    save_tasks(tasks, tmp_path / "t.jsonl")
    save_tasks(tasks, tmp_path / "t.parquet")
    assert load_tasks(tmp_path / "t.jsonl") == tasks
    assert load_tasks(tmp_path / "t.parquet") == tasks
    # the public datasets' format: nums + target only
    pq.write_table(pa.Table.from_pylist([{"target": 9, "nums": [2, 3, 4]}]), tmp_path / "pub.parquet")
    assert load_tasks(tmp_path / "pub.parquet") == [CountdownTask([2, 3, 4], 9, None)]


@pytest.mark.parametrize(
    "line, needle",
    [
        ('{"nums": [1, 2, 3]}', "row 2: field 'target' is missing"),
        ('{"nums": [1, 2, "x"], "target": 3}', "row 2: field 'nums' item 2 must be a positive integer"),
        ('{"nums": 5, "target": 3}', "row 2: field 'nums' must be a list"),
        ('{"nums": [1, 2, 3], "target": 2.5}', "row 2: field 'target' must be an integer"),
        ('{"nums": [1, 2, 3], "target": true}', "row 2: field 'target' must be an integer"),
        ('{"nums": [1, -2, 3], "target": 3}', "row 2: field 'nums' item 1"),
        ("{not json", "row 2: not valid JSON"),
        ('{"nums": [1, 2, 3], "target": ' + "9" * 5000 + "}", "row 2: not readable"),  # int-string limit
        ('{"nums": [' + "1" * 4400 + ', 2, 3], "target": 3}', "row 2: not readable"),
        ('{"nums": ' + "[" * 100_000 + "]" * 100_000 + ', "target": 3}', "row 2"),
    ],
)
def test_malformed_rows_are_named(tmp_path, line, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"nums": [1, 2, 3], "target": 6}\n' + line + "\n")
    with pytest.raises(TaskFormatError) as e:
        load_tasks(path)
    assert str(path) in str(e.value) and needle in str(e.value)


def test_identity_is_the_multiset_of_numbers_and_the_target():
    assert CountdownTask([3, 1, 2], 6, "1 + 2 + 3").identity == CountdownTask([1, 2, 3], 6).identity
    assert CountdownTask([1, 2, 3], 6).identity != CountdownTask([1, 2, 3], 7).identity
    assert CountdownTask([1, 1, 2], 4).identity != CountdownTask([1, 2, 2], 4).identity


def test_generated_tasks_are_a_prefix_of_the_candidate_stream():
    from itertools import islice

    from rlcr.tasks.countdown import task_candidates

    gen = dict(min_count=3, max_count=3, num_range=(1, 4), target_range=(20, 40))  # most draws reach no target
    draws = list(islice(task_candidates(5, **gen), 400))
    stream = [t for t in draws if t is not None]
    assert None in draws[:len(draws) // 2] and len(stream) >= 20
    assert generate_tasks(20, 5, **gen) == stream[:20]
    with pytest.raises(ValueError, match="num_range"):
        task_candidates(0, num_range=(0, 3))  # checked before the first item


def test_parquet_missing_column(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"numbers": [1, 2], "target": 3}]), tmp_path / "x.parquet")
    with pytest.raises(TaskFormatError, match="field 'nums' is missing"):
        load_tasks(tmp_path / "x.parquet")


# ----------------------------------------------------------------- prompts
def test_prompts():
    task = CountdownTask([3, 5, 2], 16)
    m1 = turn1_messages(task)
    assert [m["role"] for m in m1] == ["system", "user"]
    assert "[3, 5, 2]" in m1[1]["content"] and "16" in m1[1]["content"]
    assert "<think>" in m1[0]["content"] + m1[1]["content"] and "<answer>" in m1[1]["content"]
    answer = "<think>3*5=15, 15+2=17</think>\n<answer>3 * 5 + 2</answer>"
    m2 = turn2_messages(task, answer)
    assert m2[:2] == m1 and m2[2] == {"role": "assistant", "content": answer}
    assert m2[3]["role"] == "user" and "<confidence>" in m2[3]["content"]


# ----------------------------------------------------------------------------- behind the task interface


def test_countdown_is_a_registered_task_sharing_the_base_pieces():
    import rlcr.tasks.base as base
    import rlcr.tasks.countdown as cd
    from rlcr.tasks.registry import get_task, task_names

    assert "countdown" in task_names()
    task = get_task("countdown")
    assert cd.TaskFormatError is base.TaskFormatError and cd.CONFIDENCE_QUERY is base.CONFIDENCE_QUERY
    assert cd.extract_solution is base.extract_answer
    t = cd.CountdownTask([3, 5, 2], 13, "3 * 5 - 2")
    assert task.to_record(t) == {"nums": [3, 5, 2], "target": 13}  # the rollouts' columns, unchanged
    assert task.from_record({"nums": [3, 5, 2], "target": 13, "extra": 1}) == cd.CountdownTask([3, 5, 2], 13)
    assert task.identity(t) == ((2, 3, 5), 13) and task.stratum(t) == 3
    assert [f.name for f in task.record_fields()] == ["nums", "target"]
    assert task.turn1_messages(t) == cd.turn1_messages(t) and task.single_turn_messages(t) == cd.single_turn_messages(t)
    assert task.turn2_messages(t, "a") == cd.turn2_messages(t, "a")
    for text in ("<answer>3 * 5 - 2</answer>", "<answer>3 * 5 + 2</answer>", "no answer", "<answer>9**9**9</answer>"):
        assert task.score(text, t, format_score=0.1) == cd.compute_score(text, t.ground_truth, format_score=0.1)
    assert task.generate(5, 11) == cd.generate_tasks(5, 11)


def test_countdown_task_loads_mapped_columns_and_warm_starts_with_a_right_trace(tmp_path):
    import random

    from rlcr.tasks.registry import get_task

    task = get_task("countdown")
    path = tmp_path / "t.jsonl"
    path.write_text('{"numbers": [4, 6, 1], "goal": 25}\n{"numbers": [2, 2], "goal": 99}\n')
    rows = task.load(str(path), {"nums": "numbers", "target": "goal"})
    assert [(r.nums, r.target) for r in rows] == [([4, 6, 1], 25), ([2, 2], 99)]
    with pytest.raises(TaskFormatError, match="row 1: field 'target' is missing"):
        task.load(str(path), {"nums": "numbers"})
    with pytest.raises(ValueError, match="unknown field 'question'"):
        task.load(str(path), {"question": "numbers"})
    trace = task.warm_start(rows[0], random.Random(1))
    assert task.score(task.warm_start_completion(trace), rows[0], format_score=0.0) == 1.0
    assert task.sft_problem(rows[1]) is None and task.warm_start(rows[1], random.Random(1)) is None  # unsolvable
