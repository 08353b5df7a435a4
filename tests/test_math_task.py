"""The task interface and registry (rlcr/tasks/base.py) and the math task (rlcr/tasks/math.py, docs/tasks.md)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
from fractions import Fraction

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlcr.tasks import math_data
from rlcr.tasks.base import (
    CONFIDENCE_QUERY,
    MAX_ROW_BYTES,
    TASKS,
    Task,
    TaskFormatError,
    extract_answer,
    register_task,
)
from rlcr.tasks.countdown import CONFIDENCE_QUERY as COUNTDOWN_CONFIDENCE_QUERY, extract_solution
from rlcr.tasks.math import MathProblem, MathTask, last_boxed
from rlcr.tasks.math_verifier import MAX_ANSWER_CHARS, equivalent
from rlcr.tasks.registry import get_task, task_names

FORMAT = 0.1


@pytest.fixture(scope="module")
def task() -> MathTask:
    return get_task("math")


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _one_line_error(task, path, *parts, fields=None):
    with pytest.raises(TaskFormatError) as err:
        task.load(str(path), fields)
    message = str(err.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message
    return message


# --------------------------------------------------------------------------- registry


def test_registry_returns_one_instance_per_name(task):
    assert isinstance(task, MathTask) and task.name == "math"
    assert get_task("math") is task
    assert "math" in task_names()


def test_unknown_task_is_a_one_line_error_listing_the_names():
    with pytest.raises(ValueError) as err:
        get_task("chess\n\x1b[31m")
    message = str(err.value)
    assert "\n" not in message and "\x1b" not in message
    assert "unknown task" in message and "registered: " in message and "math" in message


def test_register_refuses_a_taken_name_and_a_non_task():
    with pytest.raises(ValueError, match="already registered"):
        register_task("math")(MathTask)
    with pytest.raises(TypeError):
        register_task("not-a-task")(dict)
    assert "not-a-task" not in TASKS


def test_a_registered_subclass_gets_the_shared_prompts_and_accuracy():
    class Echo(Task):
        system_prompt, single_turn_system_prompt = "sys", "single"

        def load(self, path, fields=None):
            return []

        def identity(self, problem):
            return problem

        def stratum(self, problem):
            return 0

        def to_record(self, problem):
            return {"p": problem}

        def from_record(self, record):
            return record["p"]

        def user_text(self, problem):
            return f"say {problem}"

        def score(self, completion, problem, *, format_score, score=1.0):
            got = extract_answer(completion)
            return 0.0 if got is None else (score if got == problem else format_score)

    register_task("echo-test")(Echo)
    try:
        echo = get_task("echo-test")
        assert echo.turn1_messages("x") == [{"role": "system", "content": "sys"}, {"role": "user", "content": "say x"}]
        assert echo.turn2_messages("x", "a")[2:] == [{"role": "assistant", "content": "a"},
                                                     {"role": "user", "content": CONFIDENCE_QUERY}]
        assert echo.single_turn_messages("x")[0]["content"] == "single"
        assert echo.accuracy("<answer>x</answer>", "x") == 1.0 and echo.accuracy("<answer>y</answer>", "x") == 0.0
        assert echo.warm_start("x", random.Random(0)) is None
        with pytest.raises(ValueError, match="no generator"):
            echo.generate(1, 0)
    finally:
        TASKS.pop("echo-test")


def test_extraction_and_confidence_query_are_countdowns():
    assert CONFIDENCE_QUERY == COUNTDOWN_CONFIDENCE_QUERY
    rng = random.Random(0)
    pieces = ["<answer>", "</answer>", "Assistant:", "\n", "1+2", " ", "x", "<answer></answer>"]
    cases = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(2000)] + [None, 3]
    for text in cases:
        assert extract_answer(text) == extract_solution(text), repr(text)


# --------------------------------------------------------------------------- shipped data and the generator


def test_shipped_files_are_the_generators_output(tmp_path):
    for written in math_data.write_files(tmp_path):
        shipped = math_data.DATA_DIR / written.name
        assert shipped.read_bytes() == written.read_bytes(), written.name
        assert shipped.stat().st_size < 150_000


def test_shipped_files_load_with_right_answers_and_traces(task):
    gsm = task.load(str(math_data.DATA_DIR / math_data.GSM8K_FILE))
    exercises = task.load(str(math_data.DATA_DIR / math_data.MATH_FILE))
    assert len(gsm) == len(exercises) == math_data.ROWS_PER_FILE
    assert {task.stratum(p) for p in gsm} == {"all"}
    assert {task.stratum(p) for p in exercises} == {f"Level {k}" for k in range(1, 6)}
    assert len({task.identity(p) for p in gsm + exercises}) == 2 * math_data.ROWS_PER_FILE
    for p in gsm + exercises:
        trace = task.warm_start(p, random.Random(0))
        assert trace is not None and "<<" not in trace.reasoning, p
        assert task.score(task.warm_start_completion(trace), p, format_score=FORMAT) == 1.0


def test_generated_answers_are_computed_right():
    rows = [r for r in math_data.math_rows(80, seed=5) if r["problem"].startswith("Compute")]
    assert rows
    for row in rows:  # "Compute $\frac{a}{b} + \frac{c}{d}$": the boxed answer is the exact sum in lowest terms
        (a, b), (c, d) = re.findall(r"\\frac\{(\d+)\}\{(\d+)\}", row["problem"])
        assert last_boxed(row["solution"]) == math_data.latex(Fraction(int(a), int(b)) + Fraction(int(c), int(d)))
    for row in math_data.gsm8k_rows(40, seed=5):  # every <<a op b=c>> annotation is right
        for expr, value in re.findall(r"<<([^=<>]+)=([^<>]+)>>", row["answer"]):
            assert _left_to_right(expr) == Fraction(value), expr


def _left_to_right(expr):
    """``a op b op c …`` folded left to right (the annotations hold one operator, or a ``*``/``/`` chain)."""
    tokens = re.split(r"([+\-*/])", expr)
    value = Fraction(int(tokens[0]))
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        b = Fraction(int(operand))
        value = {"+": value + b, "-": value - b, "*": value * b, "/": value / b if b else None}[op]
    return value


def test_generation_is_deterministic_and_stratified(task):
    first, again = task.generate(40, 7), task.generate(40, 7)
    assert first == again and first != task.generate(40, 8)
    assert {task.stratum(p) for p in first} <= set(task.strata())
    assert all(task.warm_start(p, random.Random(0)) for p in first[:10])


def test_record_round_trip(task):
    p = MathProblem(question="What is $1+1$?", answer="2", solution="1+1=2", level="Level 1")
    record = task.to_record(p)
    json.dumps(record)
    back = task.from_record({**record, "extra": 1})
    assert (back.question, back.answer, back.level) == (p.question, p.answer, p.level)
    assert task.identity(MathProblem("What  is\n$1+1$?", "3")) == task.identity(p)
    assert task.stratum(MathProblem("q", "1")) == "all"


def test_a_missing_level_from_a_mixed_batch_reads_as_none(task):
    """GSM8K rows (no level) and MATH rows (a level) in one Ray Data batch: pandas gives the missing level as
    ``pandas.NA`` (or NaN), which has no truth value; each reads back as no level, stratum "all"."""
    import pandas as pd

    for missing in (None, float("nan"), pd.NA):
        back = task.from_record({"question": "q", "answer": "1", "level": missing})
        assert back.level is None and task.stratum(back) == "all"


# --------------------------------------------------------------------------- loaders

GSM_ROW = {"question": "Tom has 3 apples and buys 2. How many?", "answer": "3 + 2 = <<3+2=5>>5\n#### 5"}
MATH_ROW = {"problem": "Compute $\\frac{1}{4}+\\frac{1}{4}$.", "solution": "It is $\\boxed{\\frac{1}{2}}$.",
            "level": "Level 2", "type": "Prealgebra"}
BIG_MATH_ROW = {"problem": "What is $2^{10}$?", "answer": "1024", "source": "x"}


def test_loads_gsm8k_math_and_big_math_rows(task, tmp_path):
    gsm, exercise, big = task.load(str(_jsonl(tmp_path / "t.jsonl", [GSM_ROW, MATH_ROW, BIG_MATH_ROW])))
    assert (gsm.question, gsm.answer, gsm.solution, gsm.level) == (GSM_ROW["question"], "5", "3 + 2 = 5", None)
    assert (exercise.answer, exercise.level, exercise.solution) == ("\\frac{1}{2}", "Level 2", MATH_ROW["solution"])
    assert (big.answer, big.solution) == ("1024", None)


def test_field_mapping(task, tmp_path):
    rows = [{"prompt": "What is 6*7?", "target": "42", "difficulty": 3}]
    (p,) = task.load(str(_jsonl(tmp_path / "m.jsonl", rows)), {"question": "prompt", "answer": "target",
                                                              "level": "difficulty"})
    assert (p.question, p.answer, p.level) == ("What is 6*7?", "42", "3")
    _one_line_error(task, tmp_path / "m.jsonl", "row 1", "'prompt2'", "missing", fields={"question": "prompt2"})
    with pytest.raises(ValueError, match="unknown field 'prompt'"):
        task.load(str(tmp_path / "m.jsonl"), {"prompt": "question"})


def test_parquet(task, tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([MATH_ROW, {**MATH_ROW, "problem": "Again?"}]), path)
    assert [p.question for p in task.load(str(path))] == [MATH_ROW["problem"], "Again?"]
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    _one_line_error(task, tmp_path / "bad.parquet", "bad.parquet", "not a readable Parquet file")


def _uniform(rows):
    """``rows`` with every column in each (None where absent): Arrow takes its columns from the first row."""
    names = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in names} for r in rows]


def _save_to_disk_by_hand(directory, rows):
    """The layout ``datasets.Dataset.save_to_disk`` writes: state.json naming Arrow stream files."""
    directory.mkdir()
    table = pa.Table.from_pylist(_uniform(rows))
    with pa.OSFile(str(directory / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    return directory


def test_save_to_disk_layout(task, tmp_path):
    saved = _save_to_disk_by_hand(tmp_path / "ds", [GSM_ROW, MATH_ROW])
    assert [p.answer for p in task.load(str(saved))] == ["5", "\\frac{1}{2}"]
    (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../../etc/passwd"}]}))
    _one_line_error(task, saved, "state.json", "'_data_files' item 0")
    (tmp_path / "empty").mkdir()
    _one_line_error(task, tmp_path / "empty", "without state.json")


def test_datasets_save_to_disk(task, tmp_path):
    datasets = pytest.importorskip("datasets", reason="the datasets package is not installed")
    ds = datasets.Dataset.from_list(_uniform([MATH_ROW, BIG_MATH_ROW]))
    ds.save_to_disk(str(tmp_path / "one"))
    assert [(p.answer, p.level) for p in task.load(str(tmp_path / "one"))] == [("\\frac{1}{2}", "Level 2"),
                                                                              ("1024", None)]
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dict"))
    _one_line_error(task, tmp_path / "dict", "DatasetDict", "test, train")
    assert len(task.load(str(tmp_path / "dict" / "train"))) == 2


HOSTILE_ROWS = [
    ("not json", "{'question': 1}", "row 1", "not valid JSON"),
    ("not an object", "[1, 2]", "row 1", "expected an object"),
    ("no question", json.dumps({"answer": "1"}), "row 1", "'question' (or 'problem') is missing"),
    ("no answer", json.dumps({"question": "q"}), "row 1", "'answer' is missing"),
    ("no boxed", json.dumps({"problem": "q", "solution": "It is 4."}), "row 1", "'solution' holds no closed \\boxed"),
    ("unclosed boxed", json.dumps({"problem": "q", "solution": "\\boxed{\\frac{1}{2}"}), "row 1", "'solution'"),
    ("answer too long", json.dumps({"problem": "q", "answer": "1" * (MAX_ANSWER_CHARS + 1)}), "row 1",
     "'answer': the final answer is longer than"),
    ("gsm8k final empty", json.dumps({"question": "q", "answer": "work\n####  "}), "row 1", "'answer'"),
    ("answer nested deep", json.dumps({"problem": "q", "answer": "{" * 40 + "}" * 40}), "row 1", "nested deeper"),
    ("question a list", json.dumps({"question": ["q"], "answer": "1"}), "row 1", "'question' must be a string"),
    ("question too long", json.dumps({"question": "q" * 9000, "answer": "1"}), "row 1", "'question' is longer"),
    ("json nested deep", "[" * 100 + "]" * 100, "row 1", "nested deeper"),
    ("level too long", json.dumps({"problem": "q", "answer": "1", "level": "L" * 100}), "row 1", "'level'"),
]


@pytest.mark.parametrize("case", HOSTILE_ROWS, ids=[c[0] for c in HOSTILE_ROWS])
def test_hostile_rows_give_one_line_errors(task, tmp_path, case):
    _, line, *parts = case
    path = _jsonl(tmp_path / "h.jsonl", [GSM_ROW, line])
    message = _one_line_error(task, path, "h.jsonl", *[p.replace("row 1", "row 2") for p in parts])
    assert len(message) < 400


def test_hostile_files_give_one_line_errors(task, tmp_path):
    (tmp_path / "big.jsonl").write_bytes(b'{"question": "' + b"x" * (MAX_ROW_BYTES + 10) + b'"}\n')
    _one_line_error(task, tmp_path / "big.jsonl", "row 1", "longer than")
    (tmp_path / "bin.jsonl").write_bytes(b'{"question": "\xff"}\n')
    _one_line_error(task, tmp_path / "bin.jsonl", "row 1", "not UTF-8")
    (tmp_path / "t.csv").write_text("a,b\n")
    _one_line_error(task, tmp_path / "t.csv", "unsupported task file type")
    _one_line_error(task, tmp_path / "missing.jsonl", "missing.jsonl", "cannot read")
    (tmp_path / "esc\x1b[2J.jsonl").write_text("[]\n")
    assert "\x1b" not in _one_line_error(task, tmp_path / "esc\x1b[2J.jsonl", "expected an object")


def test_last_boxed():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\boxed{3}}") == "\\boxed{3}"
    assert last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed{1} and \\boxed{2") == "1"
    assert last_boxed("no box") is None
    start = time.perf_counter()
    assert last_boxed("\\boxed{" * 20_000) is None
    assert time.perf_counter() - start < 5


# --------------------------------------------------------------------------- the verifier and the score


@pytest.mark.parametrize("gold, answer", [
    ("\\frac{1}{2}", "0.5"), ("\\frac{1}{2}", "1/2"), ("0.5", "\\frac{1}{2}"), ("\\frac12", "\\dfrac{2}{4}"),
    ("1000", "1,000"), ("18", "\\$18"), ("18", "$18$"), ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}"), ("2^{10}", "1024"),
])
def test_equivalent_forms_are_right(gold, answer):
    assert equivalent(gold, answer)


@pytest.mark.parametrize("gold, answer", [("\\frac{1}{2}", "0.6"), ("18", "17"), ("1024", "2^{11}"), ("5", ""),
                                          ("5", "five apples"), ("5", None)])
def test_wrong_answers_are_wrong(gold, answer):
    assert not equivalent(gold, answer)


def test_score_keeps_the_format_score_semantics(task):
    p = MathProblem(question="Half of one?", answer="\\frac{1}{2}")
    assert task.score("<think>so</think>\n<answer>0.5</answer>", p, format_score=FORMAT) == 1.0
    assert task.score("<answer>0.5</answer>", p, format_score=FORMAT, score=2.0) == 2.0
    assert task.score("<answer>0.6</answer>", p, format_score=FORMAT) == FORMAT
    assert task.score("<answer>\\frac{</answer>", p, format_score=FORMAT) == FORMAT
    assert task.score("The answer is 0.5", p, format_score=FORMAT) == 0
    assert task.score("<answer>0.5</answer>\nDone.", p, format_score=FORMAT) == 0  # not on the last line
    assert task.score("<answer>0.5", p, format_score=FORMAT) == 0
    assert task.score("User: x\nAssistant: <answer>1/2</answer>", p, format_score=FORMAT) == 1.0
    assert task.score(None, p, format_score=FORMAT) == 0
    assert task.accuracy("<answer>0.5</answer>", p) == 1.0
    assert task.accuracy("<answer>0.6</answer>", p) == 0.0


HOSTILE_ANSWERS = {
    "power tower": "10^{10^{10}}",
    "huge power of a power": "(10^{9999})^{9999}",
    "huge factorial": "99999999!",
    "huge binomial": "\\binom{99999999}{49999999}",
    "megabyte of LaTeX": "\\frac{1}{2}+" * 100_000,
    "deep braces": "{" * 50_000 + "1" + "}" * 50_000,
    "deep fractions": "\\frac{1}{" * 10 + "2" + "}" * 10,
    "many exponents": "2^{2}" * 50,
    "control characters": "\x1b[2J\x07\u202e5",
}


@pytest.mark.parametrize("name", HOSTILE_ANSWERS)
def test_hostile_answers_return_in_bounded_time(task, name):
    p = MathProblem(question="q", answer="5")
    start = time.perf_counter()
    s = task.score(f"<think>x</think>\n<answer>{HOSTILE_ANSWERS[name]}</answer>", p, format_score=FORMAT)
    assert time.perf_counter() - start < 30  # generous: a bound, not a speed claim
    assert s in (FORMAT, 1.0)
    assert s == FORMAT or name == "control characters"


def test_megabyte_completion_without_tags_scores_zero(task):
    p = MathProblem(question="q", answer="5")
    assert task.score("x" * 5_000_000 + "<answer>", p, format_score=FORMAT) == 0


def test_verification_works_off_the_main_thread(task):
    p = MathProblem(question="q", answer="\\frac{3}{4}")
    results = []

    def work():
        results.append(task.score("<answer>0.75</answer>", p, format_score=FORMAT))
        results.append(task.score("<answer>(10^{9999})^{9999}</answer>", p, format_score=FORMAT))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [FORMAT] * 3 + [1.0] * 3


def test_past_the_deadline_the_worker_is_killed_and_the_answer_retried_on_a_fresh_one():
    from rlcr.tasks import math_verifier

    assert equivalent("1", "1")
    stuck = math_verifier._WORKER._proc.pid
    os.kill(stuck, signal.SIGSTOP)  # a worker that never answers (its own timer cannot fire either)
    start = time.perf_counter()
    assert equivalent("\\frac{1}{3}", "2/6", deadline_s=0.5)  # killed past 0.5 s + grace, retried once
    assert time.perf_counter() - start < 60  # generous: a bound, not a speed claim
    assert math_verifier._WORKER._proc.pid != stuck
