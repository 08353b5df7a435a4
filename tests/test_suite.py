"""Evaluation suites (``rlcr eval --suite``): a file of reasoning-gym families, checked before any work; the same
problems for every checkpoint, in equal shares, none of a reasoning-gym run's training problems; each family's
figures with intervals and the pooled ones; two evaluations compared per family; a hostile answer bounded; and, end
to end on the tiny model, one training iteration, the suite on its two checkpoints, and their comparison."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcr.config import RLCRConfig
from rlcr.evaluation.suite import (
    compare_suite,
    load_suite,
    suite_config,
    suite_metrics,
    suite_tasks,
    summarize_suite,
)
from rlcr.untrusted import InvalidInput

ROOT = Path(__file__).resolve().parents[1]
SUITE = """name: three
seed: 11
n: 4
families:
  basic_arithmetic: {min_terms: 2, max_terms: 2, max_digits: 1}
  leg_counting: {min_animals: 1, max_animals: 2}
  syllogism: {}
"""


def write(tmp_path, text: str, name: str = "suite.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_shipped_suite_loads_and_draws_its_problems():
    suite = load_suite(ROOT / "configs" / "suites" / "ood.yaml")
    assert len(suite.families) >= 6
    problems = suite_tasks(RLCRConfig(), suite)
    assert len(problems) == suite.n * len(suite.families)
    assert sorted({p.dataset for p in problems}) == sorted(suite.families)


def test_a_suite_is_the_same_problems_for_every_checkpoint_in_equal_shares(tmp_path):
    suite = load_suite(write(tmp_path, SUITE))
    cfg = RLCRConfig()
    first, again = suite_tasks(cfg, suite), suite_tasks(cfg.model_copy(update={"run.seed": 5}), suite)
    assert [p.question for p in first] == [p.question for p in again]  # the run's seed does not move it
    assert sorted(p.dataset for p in first) == ["basic_arithmetic"] * 4 + ["leg_counting"] * 4 + ["syllogism"] * 4
    other = load_suite(write(tmp_path, SUITE.replace("seed: 11", "seed: 12"), "other.yaml"))
    assert [p.question for p in suite_tasks(cfg, other)] != [p.question for p in first]
    sc = suite_config(cfg, suite)
    assert (sc.tasks.name, sc.method, sc.eval) == ("reasoning_gym", cfg.method, cfg.eval)  # the run's method kept


def test_a_suite_shares_no_problem_with_a_reasoning_gym_runs_training_pool(tmp_path):
    from rlcr.runs.task_sets import training_pool
    from rlcr.tasks.registry import get_task

    suite = load_suite(write(tmp_path, SUITE.replace("n: 4", "n: 30")))
    run = RLCRConfig(tasks={"name": "reasoning_gym", "num_train": 400, "eval_seed": 11,
                            "options": {"datasets": {"leg_counting": {"min_animals": 1, "max_animals": 2}}}})
    task = get_task("reasoning_gym")
    pool = {task.identity(p) for p in training_pool(run)}
    unfenced = {task.identity(p) for p in suite_tasks(RLCRConfig(), suite)}
    assert unfenced & pool  # a small space: without the fence the two would share problems
    fenced = suite_tasks(RLCRConfig(), suite, trained_on=run)
    assert len(fenced) == 90 and not {task.identity(p) for p in fenced} & pool


@pytest.mark.parametrize("text, words", [
    (SUITE.replace("syllogism", "sylogism"), ["families", "unknown reasoning-gym dataset 'sylogism'",
                                              "nearest: syllogism"]),
    (SUITE.replace("max_digits: 1", "max_digit: 1"), ["families", "unknown setting 'max_digit'",
                                                      "did you mean max_digits"]),
    (SUITE.replace("{}", "{weight: 2}"), ["families", "no weight"]),
    (SUITE.replace("n: 4", "n: 0"), ["n:", "greater than or equal to 1"]),
    (SUITE.replace("seed: 11", "seed: -1"), ["seed:"]),
    (SUITE + "extra: 1\n", ["extra:", "Extra inputs are not permitted"]),
    (SUITE.replace("name: three", "name: ../x"), ["name:", "pattern"]),
    ("- a\n- b\n", ["a suite file is a mapping"]),
    ("name: [\n", ["not valid YAML"]),
])
def test_a_bad_suite_file_is_one_line_naming_the_file_and_the_field(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(InvalidInput) as err:
        load_suite(path)
    line = str(err.value)
    assert "\n" not in line and str(path) in line and all(w in line for w in words), line


def test_a_missing_or_huge_suite_file_is_refused_by_name(tmp_path):
    with pytest.raises(InvalidInput, match="not found"):
        load_suite(tmp_path / "nope.yaml")
    with pytest.raises(InvalidInput, match="more than"):
        load_suite(write(tmp_path, "name: x\n" + "#" * 300_000))


def _rows(family_answers: dict[str, list[tuple[float, float]]], shift: int = 0) -> list[dict]:
    """Evaluation rows: per family, (correct, confidence) per problem, one answer each."""
    rows, pid = [], 0
    for family, answers in family_answers.items():
        for correct, conf in answers:
            base = {"prompt_id": pid, "answer_id": 0, "dataset": family, "question": f"{family} {pid}",
                    "answer": "1", "settings": "{}", "gen_seed": 1, "gen_index": pid, "instruction": "i",
                    "scorer_timeout_s": 5.0, "task_name": "reasoning_gym"}
            rows.append({**base, "sample_type": "answer", "correct": correct, "score": correct})
            rows.append({**base, "sample_type": "confidence", "confidence_id": 0, "confidence": conf,
                         "correct": correct, "score": 0.0})
            pid += 1
    return rows


def test_each_family_has_its_figures_with_intervals_and_the_pool_has_all_of_them():
    good = [(1.0, 0.9), (0.0, 0.2)] * 10
    bad = [(1.0, 0.1), (0.0, 0.9)] * 10
    result = summarize_suite(_rows({"a": good, "b": bad}), n_resamples=200, seed=0)
    a, b, pooled = result["families"]["a"], result["families"]["b"], result["pooled"]
    assert (a["n_tasks"], b["n_tasks"], pooled["n_tasks"]) == (20, 20, 40)
    assert a["auroc"] == 1.0 and b["auroc"] == 0.0 and 0.0 < pooled["auroc"] < 1.0
    assert a["ece"] < b["ece"] and a["ci"]["ece"][0] <= a["ece"] <= a["ci"]["ece"][1]
    flat = suite_metrics(result, "ood")
    assert flat["ood/a/auroc"] == 1.0 and flat["ood/pooled/accuracy"] == 0.5 and "ood/b/brier" in flat
    diff = compare_suite(_rows({"a": good, "b": bad}), _rows({"a": bad, "b": bad}), n_resamples=200, seed=0)
    assert diff["families"]["a"]["differences"]["brier"]["difference"] < 0  # A is better calibrated on a
    assert diff["families"]["b"]["differences"]["brier"]["difference"] == 0.0
    assert diff["pooled"]["n_tasks"] == 40


def test_the_suite_table_fits_80_columns():
    from rich.console import Console

    from rlcr.ui.presentation import suite_table

    result = summarize_suite(_rows({"basic_arithmetic": [(1.0, 0.9), (0.0, 0.3)] * 5,
                                    "game_of_life_halting": [(0.0, 0.5)] * 10}), n_resamples=100)
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(suite_table("first@3", "ood", result))
    text = console.export_text()
    assert "game_of_life_halting" in text and "pooled" in text and "…" not in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_a_hostile_or_slow_answer_to_a_suite_problem_is_bounded():
    from rlcr.tasks.registry import get_task

    suite_cfg = suite_config(RLCRConfig(), load_suite(ROOT / "configs" / "suites" / "ood.yaml"))
    task = get_task("reasoning_gym")
    problem = suite_tasks(RLCRConfig(), load_suite(ROOT / "configs" / "suites" / "ood.yaml"))[0]
    assert suite_cfg.tasks.options["datasets"]
    huge = "<answer>" + "9" * 2_000_000 + "</answer>"
    with task.scoring(2) as stats:
        assert task.score(huge, problem, format_score=0.1) in (0.0, 0.1)
        assert task.score(f"<answer>{problem.answer}</answer>", problem, format_score=0.1) == 1.0
    assert stats.timeouts <= 1


def _cli(*args: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PREFECT_"))}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="80")
    return subprocess.run([sys.executable, "-m", "rlcr.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_a_suite_naming_a_dataset_that_does_not_exist_is_one_line_exit_2_before_ray(tmp_path):
    bad = write(tmp_path, SUITE.replace("leg_counting", "leg_countng"))
    t0 = time.perf_counter()
    out = _cli("eval", "--suite", str(bad), f"storage.uri={tmp_path / 'store'}", cwd=tmp_path, timeout=120)
    lines = [x for x in (out.stdout + out.stderr).splitlines() if x.strip(" │╭╰─")]
    assert out.returncode == 2, out.stdout + out.stderr
    text = " ".join(x.strip(" │") for x in lines)
    assert "unknown reasoning-gym dataset 'leg_countng'" in text and "nearest: leg_counting" in text, text
    assert "Traceback" not in text and not (tmp_path / "store").exists()
    assert time.perf_counter() - t0 < 60  # no Ray, no engine: the check comes first


@pytest.mark.slow
def test_three_families_end_to_end_train_evaluate_the_suite_and_compare(ray_local, prefect_harness, tiny_model_dir,
                                                                       tmp_path):
    """One training iteration on the tiny model on the three families (the flow, in this process), then `rlcr eval
    --suite` of its two checkpoints with their rows (none of the run's training problems among the suite's), and
    `rlcr compare` of the two files: the pooled comparison and one row per family."""
    from typer.testing import CliRunner

    from flows.train import rlcr_train
    from rlcr.cli import app

    suite = write(tmp_path, SUITE)
    store = f"storage.uri={tmp_path / 'store'}"
    overrides = [f"model.name={tiny_model_dir}", store, "orchestration.retries=0"]
    config = str(ROOT / "configs" / "tiny.yaml")
    trained_on = ["tasks.name=reasoning_gym", "tasks.num_train=40", "tasks.num_eval=6",  # the three, in training
                  "tasks.options={datasets: {basic_arithmetic: {min_terms: 2, max_terms: 2, max_digits: 1}, "
                  "leg_counting: {min_animals: 1, max_animals: 2}, syllogism: {}}}"]
    assert rlcr_train(config=config, overrides=overrides + trained_on, run_id="s",
                      iterations=1)["iterations"] == [1]
    for k in (0, 1):
        out = CliRunner().invoke(app, ["eval", "--config", config, "--checkpoint", f"s@{k}", "--suite", str(suite),
                                       "--records", str(tmp_path / f"s{k}.parquet"), *overrides],
                                 env={"COLUMNS": "80"})
        assert out.exit_code == 0, out.output[-3000:]
        assert f"suite three: s@{k}" in out.output, out.output[-3000:]
        assert all(f in out.output for f in ("basic_arithmetic", "leg_counting", "syllogism", "pooled"))
        table = out.output[out.output.index(f"suite three: s@{k}"):].split("checkpoint:")[0].splitlines()
        assert all(len(line) <= 80 for line in table), [line for line in table if len(line) > 80]
    import pyarrow.parquet as pq

    first, second = (pq.read_table(tmp_path / f"s{k}.parquet").to_pylist() for k in (0, 1))
    assert [r["question"] for r in first] == [r["question"] for r in second]  # the same problems for both
    assert {r["dataset"] for r in first} == {"basic_arithmetic", "leg_counting", "syllogism"}
    from rlcr.runs.store import RunStore

    trained = {r["question"] for r in pq.read_table(RunStore.open(RLCRConfig.from_dict(
        {"storage": {"uri": str(tmp_path / "store")}}), "s").committed()[0]["rollouts_uri"]).to_pylist()}
    assert trained and not trained & {r["question"] for r in first}  # none of the run's training problems
    cmp = CliRunner().invoke(app, ["compare", str(tmp_path / "s1.parquet"), str(tmp_path / "s0.parquet"), store],
                             env={"COLUMNS": "80"})
    assert cmp.exit_code == 0, cmp.output[-3000:]
    assert "12 shared held-out tasks" in " ".join(cmp.output.split()), cmp.output
    assert "suite three, per family: A − B" in cmp.output, cmp.output
    for family in ("basic_arithmetic", "leg_counting", "syllogism"):
        assert re.search(rf"{family}\s+│", cmp.output), cmp.output


def test_the_suites_record_is_of_this_suite():
    """bench/results/ood-suite/record.json was measured on configs/suites/ood.yaml as it is: the same families,
    seed and n (a suite edited after its record no longer matches it), each family with its interval."""
    import json

    sys.path.insert(0, str(ROOT / "bench"))
    from suite_record import OUT, SUITE, suite_digest

    record = json.loads(OUT.read_text())
    suite = load_suite(SUITE)
    assert record["suite_digest"] == suite_digest(SUITE), "the suite changed after its record: measure it again"
    assert sorted(record["families"]) == sorted(suite.families) and record["n_per_family"] == suite.n
    for family in record["families"].values():
        low, high = family["accuracy_ci95"]
        assert family["n_problems"] == suite.n and low <= family["accuracy"] <= high
        assert family["in_band"] == (record["band"][0] <= family["accuracy"] <= record["band"][1])
