"""The training flow on the ``math`` task (issue 32): the real `rlcr` Prefect flow, local Ray, real vLLM, the
tiny model, the shipped data (rlcr/tasks/data): one iteration, then a resume for a second. And the math
example configs, checked statically (no GPU here)."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlcr.config import load_config

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "rlcr" / "tasks" / "data"


def test_the_math_configs_load_and_name_the_math_task(monkeypatch):
    monkeypatch.chdir(REPO)  # configs/math.yaml names the shipped files relative to the repository root
    cpu = load_config(REPO / "configs" / "math.yaml")
    assert cpu.tasks.name == "math" and cpu.model.name == "smollm2-135m-instruct" and not cpu.update.use_gpu
    assert Path(cpu.tasks.train_file) == DATA / "gsm8k_style.jsonl" and Path(cpu.tasks.train_file).exists()
    gpu = load_config(REPO / "configs" / "gpu-math.yaml")
    assert gpu.tasks.name == "math" and gpu.update.use_gpu and gpu.model.dtype == "bfloat16"
    assert "Qwen2.5-1.5B-Instruct" in gpu.model.name and gpu.tasks.train_file.startswith("s3://")
    assert (gpu.rollout.max_answer_tokens + gpu.rollout.max_confidence_tokens + gpu.rollout.max_prompt_tokens
            <= gpu.engine.max_model_len)


def test_an_unknown_task_is_a_one_line_error_naming_the_tasks():
    from rlcr.config import RLCRConfig

    with pytest.raises(ValueError) as err:
        RLCRConfig(tasks={"name": "chess"})
    line = next(x for x in str(err.value).splitlines() if "unknown task" in x)
    assert "'chess'" in line and "countdown, file, math" in line


@pytest.mark.slow
def test_train_flow_on_math_then_resume(ray_local, prefect_harness, tiny_model_dir, tmp_path):
    from flows.train import rlcr_train
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunStore

    held_out = tmp_path / "held_out.jsonl"  # four of the shipped MATH-style rows: a short evaluation
    held_out.write_text("".join((DATA / "math_style.jsonl").read_text().splitlines(keepends=True)[:4]))
    overrides = {
        "tasks.name": "math", "model.name": str(tiny_model_dir), "storage.uri": str(tmp_path / "store"),
        "tasks.train_file": str(DATA / "gsm8k_style.jsonl"), "tasks.eval_file": str(held_out),
        "rollout.prompts_per_iteration": 2, "rollout.num_generations_answer": 2,
        "rollout.num_generations_confidence": 2, "eval.samples": 1, "rollout.temperature": 1.0,
        "rollout.max_answer_tokens": 16, "rollout.max_confidence_tokens": 8, "engine.max_model_len": 1024,
        "engine.kv_cache_gib": 0.25, "update.learning_rate": 1e-3, "orchestration.retries": 0,
    }
    first = rlcr_train(overrides=overrides, run_id="m", iterations=1)
    second = rlcr_train(overrides=overrides, run_id="m", iterations=2)  # resume: iteration 2 only
    assert first["iterations"] == [1] and second["iterations"] == [2]
    run = RunStore.open(RLCRConfig.from_dict(overrides), "m")
    m1, m2 = run.committed()
    assert m2["policy_in"] == m1["checkpoint_uri"]
    rows = pq.read_table(m2["rollouts_uri"]).to_pylist()
    assert {"question", "answer", "level"} <= set(rows[0]) and "nums" not in rows[0]
    questions = {json.loads(x)["question"] for x in (DATA / "gsm8k_style.jsonl").read_text().splitlines()}
    assert {r["question"] for r in rows} <= questions  # the prompts are the shipped training rows
    assert len(rows) == 2 * 2 * (1 + 2) and all(r["correct"] in (0.0, 1.0) for r in rows)
    ev = run.metrics(2)["eval"]
    assert ev["n_tasks"] == 4 and set(ev["by_count"]) <= {f"Level {k}" for k in range(1, 6)}
    records = pq.read_table(ev["records_uri"]).to_pylist()
    assert {r["question"] for r in records if r["sample_type"] == "answer"} == {
        json.loads(x)["problem"] for x in held_out.read_text().splitlines()}


def test_the_math_warm_start_is_worked_solutions_then_a_format_only_confidence():
    from rlcr.config import RLCRConfig
    from rlcr.core.rewards import parse_confidence
    from rlcr.tasks.base import FORMAT_ONLY_CONFIDENCES
    from rlcr.tasks.registry import get_task
    from rlcr.train.sft import task_examples

    cfg = RLCRConfig(tasks={"name": "math", "train_file": str(DATA / "math_style.jsonl")}, sft={"single_turn": True})
    examples = task_examples(cfg, 6, seed=3)
    assert [e["sample_type"] for e in examples] == ["answer", "confidence"] * 6 + ["answer"] * 6
    math = get_task("math")
    for turn1, turn2 in zip(examples[0:12:2], examples[1:12:2]):
        problem = turn1["task"]
        assert turn1["completion"].startswith(f"<think>{problem.solution}</think>")
        assert math.score(turn1["completion"], problem, format_score=0.0) == 1.0  # the trace's answer is right
        assert turn2["messages"][2] == {"role": "assistant", "content": turn1["completion"]}
        assert parse_confidence(turn2["completion"]) in FORMAT_ONLY_CONFIDENCES
        assert turn2["completion"].startswith("<confidence>")  # format only: no analysis to check
    assert examples == task_examples(cfg, 6, seed=3)  # seeded
