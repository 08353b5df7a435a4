"""A run reference brings its task (evaluations and probes of a run are on the task it was trained on, and say
so), and records carry their task by name (an installed plugin with another task's columns cannot take them)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlcr.config import RLCRConfig
from rlcr.evaluation.evaluate import by_stratum
from rlcr.rollout.records import (
    RolloutValidationError,
    read_records_table,
    record_task,
    rollout_row,
    rows_to_table,
    table_to_rows,
)
from rlcr.runs.store import RunStore
from rlcr.storage import Store
from rlcr.tasks import registry
from rlcr.tasks.base import TASKS, register_task
from rlcr.tasks.countdown_task import Countdown
from rlcr.tasks.math import MathTask


@pytest.fixture
def registered():
    """Register test tasks for one test; removed after, so no other test sees them."""
    added = []

    def add(name, cls):
        register_task(name)(type(f"Test_{name}", (cls,), {}))
        added.append(name)
        return TASKS[name]

    yield add
    for name in added:
        TASKS.pop(name, None)
        registry._INSTANCES.pop(name, None)


def _math_rows(n: int = 2) -> list[dict]:
    """Answer rows of the math task (its problems from rlcr's own data file), levels differing."""
    from rlcr.tasks.math_data import DATA_DIR, MATH_FILE

    problems = registry.get_task("math").load(str(DATA_DIR / MATH_FILE))
    picked = list({p.level: p for p in problems}.values())[:n]
    return [rollout_row("answer", task=p, task_name="math", prompt_id=i, answer_id=0, context_text="q",
                        context_ids=[1], completion_text="a", completion_ids=[2], score=0.0, correct=float(i % 2),
                        reward=0.0, run_id="r", iteration=0)
            for i, p in enumerate(picked)]


def test_a_plugin_with_maths_columns_does_not_capture_math_records(registered, tmp_path):
    """Finding: record_task() took the first registered task whose columns a table held, so a plugin sorting
    before math with fields (question, answer) captured math's rows: the table lost ``level`` and the strata
    collapsed. Records now name their task (column ``task_name`` and schema metadata ``rlcr.task``)."""

    class TwoFields(MathTask):
        def record_fields(self):
            return [f for f in super().record_fields() if f.name in ("question", "answer")]

    registered("aamath", TwoFields)
    rows = _math_rows()
    table = rows_to_table(rows)  # no task given: the rows name theirs
    assert "level" in table.column_names and table.schema.metadata[b"rlcr.task"] == b"math"
    pq.write_table(table, tmp_path / "rows.parquet")
    back = table_to_rows(read_records_table(str(tmp_path / "rows.parquet"), "rows.parquet"))
    assert {r["task_name"] for r in back} == {"math"} and [r["level"] for r in back] == [r["level"] for r in rows]
    assert len(by_stratum(back)) == len({r["level"] for r in rows}) > 1  # per level, not one stratum


def test_a_file_without_a_task_name_is_guessed_only_when_one_task_fits(registered):
    """Finding (old record files): the guess took the first fitting task. A qa file (whose columns hold math's)
    was read as math's; now the task whose columns hold every other fitting task's is taken, and a tie between
    two tasks with the same columns is refused in one line naming both."""
    qa_columns = ["prompt_id", "sample_type", "question", "answer", "paragraphs", "support", "evidence", "hops"]
    assert record_task(qa_columns).name == "qa"
    math_columns = ["prompt_id", "sample_type", "question", "answer", "level"]
    assert record_task(math_columns).name == "math"
    registered("aamath", MathTask)  # the same record columns as math
    with pytest.raises(RolloutValidationError) as e:
        record_task(math_columns)
    assert "\n" not in str(e.value) and "aamath" in str(e.value) and "math" in str(e.value)
    assert "ambiguous" in str(e.value)
    assert record_task(math_columns, "math").name == "math"  # a name settles it
    # a table of several tasks' rows is refused, naming them
    table = rows_to_table(_math_rows())
    mixed = table.set_column(table.schema.get_field_index("task_name"), "task_name",
                             pa.array(["math", "aamath"][:table.num_rows]))
    with pytest.raises(RolloutValidationError, match="several tasks"):
        table_to_rows(mixed.replace_schema_metadata({}))


def _stored_run(tmp_path, run_cfg: RLCRConfig, model_dir) -> RunStore:
    """A run whose recorded config is ``run_cfg`` and whose iteration 1 is committed with ``model_dir``."""
    store = Store(str(tmp_path / "store"))
    run = RunStore(store, "trained")
    run.check_config(run_cfg)  # records config.json
    run.commit(1, {"checkpoint_uri": store.put_dir(model_dir, run.checkpoint_rel(1, "writer1"))})
    return run


def _tiny(model_dir, storage, **kw) -> RLCRConfig:
    return RLCRConfig.from_dict({**kw, "model": {"name": str(model_dir)}, "storage": {"uri": str(storage)},
                                 "rollout": {"temperature": 1.0, "max_answer_tokens": 32, "max_confidence_tokens": 12},
                                 "engine": {"max_model_len": 512, "kv_cache_gib": 0.25}, "run": {"seed": 3},
                                 "tasks": {"num_train": 8, "num_eval": 4, **kw.pop("tasks", {})},
                                 "probe": {"samples": 2}})


def test_a_run_reference_brings_its_task_and_a_contradiction_is_refused(tmp_path, tiny_model_dir):
    """Finding: `rlcr eval --checkpoint RUN@K` / `rlcr probe --run-id RUN` used the config's task. The run's task
    and options are taken now (a line says so); a command line naming another one is refused in one line, before
    any work (no Ray, no Prefect: exit code 2)."""
    from typer.testing import CliRunner

    from rlcr.cli import app
    from rlcr.runs.refs import TaskMismatch, with_run_task

    run_cfg = _tiny(tiny_model_dir, tmp_path / "store", tasks={"name": "math"})
    run = _stored_run(tmp_path, run_cfg, tiny_model_dir)
    cfg, note = with_run_task(_tiny(tiny_model_dir, tmp_path / "store"), run.stored_config(), "trained")
    assert cfg.tasks.name == "math" and cfg.tasks.options == run_cfg.tasks.options
    assert "math" in note and "countdown" in note
    with pytest.raises(TaskMismatch, match="tasks.name 'countdown'.*trained on task 'math'"):
        with_run_task(_tiny(tiny_model_dir, tmp_path / "store"), run.stored_config(), "trained", ["tasks.name"])
    store = f"storage.uri={tmp_path / 'store'}"
    for argv in (["eval", "--checkpoint", "trained@1", store, "tasks.name=countdown"],
                 ["probe", "--run-id", "trained", store, "tasks.name=countdown"]):
        res = CliRunner().invoke(app, argv, env={"COLUMNS": "400"})
        assert res.exit_code == 2, res.output
        assert "'countdown'" in res.output and "'math'" in res.output and "trained" in res.output
    # options the run was not trained with, on the command line: refused too
    count_run = RunStore(Store(str(tmp_path / "store")), "counts")
    count_run.check_config(_tiny(tiny_model_dir, tmp_path / "store", tasks={"options": {"max_count": 3}}))
    with pytest.raises(TaskMismatch, match="max_count: 3 → 4"):
        with_run_task(_tiny(tiny_model_dir, tmp_path / "store", tasks={"options": {"max_count": 4}}),
                      count_run.stored_config(), "counts", ["tasks.options.max_count"])


PROBE_SCRIPT = """
import json, sys
from rlcr.tasks.base import register_task
from rlcr.tasks.countdown_task import Countdown

register_task("twincount")(type("TwinCount", (Countdown,), {}))  # a plugin task, in the probing process
from flows.probe import rlcr_probe

out = rlcr_probe(overrides=json.loads(sys.argv[1]), run_id="trained", num_tasks=2, samples=2)  # the config: countdown
print("RESULT " + json.dumps(out, default=str))
"""


def test_the_probe_flow_probes_a_run_on_its_own_task_and_the_report_names_it(registered, tiny_model_dir, tmp_path,
                                                                            prefect_harness):
    """Finding: the nightly probe (flows/probe.py) probed a run trained on a plugin task on the config's task,
    stored that report in the run and attached it to its MLflow run, naming no task. It probes the run's task
    with the run's options now (here: only 2-number problems), and the report, its HTML and the MLflow params
    name them. The flow runs in a process of its own (its in-process vLLM engine: one per process, none left
    from other tests), against this session's Prefect API."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from mlflow.tracking import MlflowClient
    from prefect.settings import PREFECT_API_URL

    from rlcr.probe.report import latest_report

    registered("twincount", Countdown)  # the run's config names it: registered here to record the run
    run_cfg = _tiny(tiny_model_dir, tmp_path / "store", tasks={"name": "twincount",
                                                                "options": {"min_count": 2, "max_count": 2}})
    run = _stored_run(tmp_path, run_cfg, tiny_model_dir)
    overrides = {k: run_cfg.get(k) for k in ("storage.uri", "model.name", "rollout.temperature",
                                             "rollout.max_answer_tokens", "rollout.max_confidence_tokens",
                                             "engine.max_model_len", "engine.kv_cache_gib", "run.seed")}
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, "-c", PROBE_SCRIPT, json.dumps(overrides)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")] or [None]
    assert res.returncode == 0 and line, (res.stdout[-2000:], res.stderr[-4000:])
    out = json.loads(line.removeprefix("RESULT "))
    assert out["task"] == "twincount" and out["task_options"]["max_count"] == 2
    _, rep = latest_report(run.store, "trained")
    assert rep["task"] == "twincount" and rep["task_options"] == run_cfg.tasks.options
    assert rep["tasks"] and all(len(t["nums"]) == 2 for t in rep["tasks"])
    html = run.store.read_bytes(run.store.rel(out["report"]["html"])).decode()
    assert "twincount" in html and "max_count=2" in html
    client = MlflowClient(tracking_uri=f"sqlite:///{run.store.uri}/mlflow.db")
    (tracked,) = client.search_runs([client.get_experiment_by_name("rlcr").experiment_id],
                                    filter_string="tags.`rlcr.run_id` = 'trained'")
    assert tracked.data.params["tasks.name"] == "twincount" and tracked.data.params["tasks.options.max_count"] == "2"
