"""The ``file`` task: a data file and a checker function, no class (docs/tasks.md). The checker is a plain function
in a file outside the repository, run in rlcr's bounded verifier; bad inputs are one line naming the field, row or
file; the real flow trains and evaluates on it and ``rlcr compare`` pairs two of its evaluations."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlcr.config import RLCRConfig
from rlcr.tasks.base import TaskFormatError
from rlcr.tasks.registry import get_task

REPO = Path(__file__).resolve().parents[1]
CHECKER = '''
import time

def check(answer, gold):
    """Right when the answer, case and spaces aside, is the gold (a string or a number)."""
    return " ".join(answer.split()).lower() == str(gold).lower()

def slow(answer, gold):
    time.sleep(30)
    return True

def boom(answer, gold):
    raise RuntimeError("no")
'''
TRAIN = [{"question": f"What is {a} plus {b}?", "answer": a + b, "kind": "add"} for a in range(1, 7) for b in (1, 2)]
TEST = [{"question": f"What is {a} times {b}?", "answer": a * b, "kind": "mul"} for a in range(2, 5) for b in (2, 3)]


@pytest.fixture
def task_files(tmp_path):
    """A checker and a training and test file in a folder outside the repository (and on no sys.path); the test
    file repeats one training question, which the held-out set must drop."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "my_checks.py").write_text(CHECKER)
    train = outside / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    test = outside / "test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in [*TEST, TRAIN[0]]))
    return outside


def _cfg(files: Path, checker: str = "check", **extra) -> RLCRConfig:
    tasks = {"name": "file", "train_file": str(files / "train.jsonl"), "eval_file": str(files / "test.jsonl"),
             "field_map": {"prompt": "question", "gold": "answer", "stratum": "kind"},
             "options": {"checker": f"{files / 'my_checks.py'}:{checker}", **extra}}
    return RLCRConfig(tasks=tasks)


def test_a_data_file_and_a_checker_make_a_task(task_files):
    from rlcr.runs.task_sets import held_out_set, training_pool

    cfg = _cfg(task_files)
    task = get_task("file")
    pool = training_pool(cfg)
    held = held_out_set(cfg, pool)
    assert len(pool) == len(TRAIN) and len(held) == len(TEST)  # the repeated training question is dropped
    assert not {task.identity(p) for p in pool} & {task.identity(p) for p in held}
    assert {task.stratum(p) for p in pool} == {"add"} and {task.stratum(p) for p in held} == {"mul"}
    p = held[0]
    assert task.user_text(p).startswith("What is 2 times 2?\n\n") and "<answer>" in task.user_text(p)
    assert task.from_record(task.to_record(p)) == p
    assert [f.name for f in task.record_fields()] == list(task.to_record(p))
    assert task.score("<think>x</think>\n<answer> 4 </answer>", p, format_score=0.1) == 1.0
    assert task.score("<answer>5</answer>", p, format_score=0.1) == 0.1
    assert task.score("four", p, format_score=0.1) == 0.0  # no answer on the last line
    assert task.accuracy("<answer>4</answer>", p) == 1.0


def test_a_checker_out_of_time_or_raising_is_not_right_and_counted(task_files):
    from rlcr.runs.task_sets import training_pool

    task = get_task("file")
    slow = training_pool(_cfg(task_files, "slow", checker_timeout_s=0.5))[0]
    t0 = time.monotonic()
    with task.scoring(2) as stats:
        assert task.score("<answer>2</answer>", slow, format_score=0.1) == 0.1
        assert task.score("<answer>3</answer>", slow, format_score=0.1) == 0.1
    assert stats.timeouts == 2 and time.monotonic() - t0 < 10
    boom = training_pool(_cfg(task_files, "boom"))[0]
    with task.scoring(1) as stats:
        assert task.score("<answer>2</answer>", boom, format_score=0.1) == 0.1
    assert stats.timeouts == 0


@pytest.mark.parametrize("options, words", [
    ({"checker": "nowhere/checks.py:check"}, ["tasks.options.checker", "no such file"]),
    ({"checker": "{dir}/my_checks.py:missing"}, ["tasks.options.checker", "defines no function 'missing'"]),
    ({"checker": "no_such_module_here:check"}, ["tasks.options.checker", "no module 'no_such_module_here'"]),
    ({"checker": "just-a-name"}, ["tasks.options.checker", "'path/to/file.py:function'"]),
    ({"checker": "{dir}/my_checks.py:check", "checker_timeout_s": 0}, ["tasks.options.checker_timeout_s"]),
])
def test_a_bad_checker_is_one_line_at_config_time(task_files, options, words):
    options = {k: v.format(dir=task_files) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(ValueError) as err:
        RLCRConfig(tasks={"name": "file", "train_file": str(task_files / "train.jsonl"), "options": options})
    line = next(x for x in str(err.value).splitlines() if words[0] in x)
    assert all(w in line for w in words), line


def test_bad_rows_and_settings_name_the_row_field_or_setting(task_files, tmp_path):
    from rlcr.runs.task_sets import training_pool

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "ok?", "answer": "yes"}) + "\n" + '{"question": "x", "answer": NaN}\n')
    cfg = _cfg(task_files).model_copy(update={"tasks.train_file": str(bad)})
    with pytest.raises(TaskFormatError, match=r"bad.jsonl: row 2: field 'answer'"):
        training_pool(cfg)
    with pytest.raises(ValueError, match="unknown field 'question' in tasks.field_map"):
        training_pool(cfg.model_copy(update={"tasks.field_map": {"question": "q"}}))
    no_checker = RLCRConfig(tasks={"name": "file", "train_file": str(task_files / "train.jsonl"),
                                   "field_map": {"prompt": "question", "gold": "answer"}})
    with pytest.raises(ValueError, match="tasks.options.checker is required"):
        training_pool(no_checker)


def test_the_warm_start_uses_a_worked_solution_the_checker_accepts(task_files, tmp_path):
    from rlcr.runs.task_sets import training_pool

    data = tmp_path / "worked.jsonl"
    data.write_text(json.dumps({"prompt": "2+2?", "gold": 4, "solution": "Two and two."}) + "\n"
                    + json.dumps({"prompt": "3+3?", "gold": 6, "solution": "Three and three make seven."}) + "\n"
                    + json.dumps({"prompt": "4+4?", "gold": 8}) + "\n")
    cfg = RLCRConfig(tasks={"name": "file", "train_file": str(data),
                            "options": {"checker": f"{task_files / 'my_checks.py'}:check"}})
    task = get_task("file")
    right, _, bare = training_pool(cfg)
    trace = task.warm_start(right, None)
    assert trace.answer == "4" and task.score(task.warm_start_completion(trace), right, format_score=0.0) == 1.0
    assert task.warm_start(bare, None) is None and task.sft_problem(bare) is None


def test_the_task_check_before_a_run_accepts_it(task_files):
    from rlcr.runs.preflight import check_task

    check_task(_cfg(task_files))


@pytest.mark.slow
def test_train_evaluate_and_compare_on_a_file_task(ray_local, prefect_harness, tiny_model_dir, task_files, tmp_path):
    """The real flow on the file task (tiny model, one iteration, held-out evaluations before and after), then
    `rlcr compare RUN@0 RUN@1` on the stored rows; the rows name the task's columns and its checker."""
    from flows.train import rlcr_train
    from rlcr.runs.store import RunStore

    store = tmp_path / "store"
    overrides = {
        "tasks.name": "file", "model.name": str(tiny_model_dir), "storage.uri": str(store),
        "tasks.train_file": str(task_files / "train.jsonl"), "tasks.eval_file": str(task_files / "test.jsonl"),
        "tasks.field_map": {"prompt": "question", "gold": "answer", "stratum": "kind"},
        "tasks.options": {"checker": f"{task_files / 'my_checks.py'}:check"},
        "rollout.prompts_per_iteration": 2, "rollout.num_generations_answer": 2,
        "rollout.num_generations_confidence": 2, "eval.samples": 1, "rollout.max_answer_tokens": 16,
        "rollout.max_confidence_tokens": 8, "engine.max_model_len": 1024, "engine.kv_cache_gib": 0.25,
        "orchestration.retries": 0,
    }
    assert rlcr_train(overrides=overrides, run_id="f", iterations=1)["iterations"] == [1]
    run = RunStore.open(RLCRConfig.from_dict(overrides), "f")
    (m1,) = run.committed()
    rows = pq.read_table(m1["rollouts_uri"]).to_pylist()
    assert {"prompt", "gold", "stratum", "checker"} <= set(rows[0]) and "nums" not in rows[0]
    assert {r["prompt"] for r in rows} <= {r["question"] for r in TRAIN}
    task = get_task("file")
    p = task.from_record(rows[0])  # the stored record scores on its own: it carries its checker
    assert task.score(f"<answer>{json.loads(p.gold)}</answer>", p, format_score=0.1) == 1.0
    ev = run.metrics(1)["eval"]
    assert ev["n_tasks"] == len(TEST) and set(ev["by_count"]) == {"mul"}
    out = subprocess.run([sys.executable, "-m", "rlcr.cli", "compare", "f@0", "f@1", f"storage.uri={store}"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "f@0" in out.stdout and "f@1" in out.stdout and str(len(TEST)) in out.stdout
