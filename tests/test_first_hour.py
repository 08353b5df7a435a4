"""What a new user meets in their first hour (issue 77): help texts that name the real options, set-up commands
that work as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_serve_help_names_the_config_field_it_defaults_to():
    """``flows.serve --help`` said ``probe_cron``, a field name from before the config was grouped."""
    out = subprocess.run([sys.executable, "-m", "flows.serve", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    assert "--probe-cron" in out and "probe.cron" in out and "probe_cron" not in out


def test_the_readmes_mlflow_command_runs_one_worker():
    """``mlflow ui`` starts 4 workers by default; on a loaded 2-core machine the page died until ``--workers 1``."""
    line = next(x for x in (ROOT / "README.md").read_text().splitlines() if "mlflow ui" in x and x.startswith("."))
    assert re.search(r"mlflow ui .*--workers 1\b", line), line


def _config_show(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", "config", "show", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = [x for x in (res.stdout + res.stderr).splitlines() if x.strip()]
    return line


def test_a_task_option_typo_is_attributed_to_where_it_was_set(tmp_path):
    """A typo on the command line was blamed on the config file ("… in the config file"), with a stray
    "did you mean 'tasks.options'" after the task's own, right, suggestion."""
    line = _config_show("--config", "configs/tiny.yaml", "tasks.options.max_lne=3")
    assert "set on the command line: tasks.options.max_lne=3" in line and "in the config file" not in line
    assert line.count("did you mean") == 1 and "'tasks.options.max_count'" in line
    typo = tmp_path / "typo.yaml"
    typo.write_text("tasks:\n  options:\n    max_lne: 3\n")
    line = _config_show("--config", str(typo))
    assert line.endswith("in the config file") and "command line" not in line and line.count("did you mean") == 1


def test_sft_on_a_task_without_warm_start_names_the_method(tmp_path):
    """``rlcr sft`` on a task with no ``warm_start`` was a traceback that did not name the method; now one line,
    exit 2, before any work (the example package's task, which has none)."""
    task_file = tmp_path / "nows_task.py"
    task_file.write_text("from rlcr.tasks.base import register_task\nfrom rlcr_sumlist.task import SumList\n\n\n"
                         "@register_task('sumlist')\nclass Registered(SumList):\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'examples' / 'sumlist'}{os.pathsep}{ROOT}"}
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", "sft", "--config", str(ROOT / "configs" / "tiny.yaml"),
                          "tasks.name=sumlist", f"tasks.module={task_file}", "model.name=tiny",
                          f"storage.uri={tmp_path / 'store'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    lines = [x for x in (res.stdout + res.stderr).splitlines() if x.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stdout + res.stderr
    assert "warm_start" in lines[0] and "'sumlist'" in lines[0]
    assert not (tmp_path / "store").exists()


# ----------------------------------------------------------------------------- the task, checked before the run

def _docs_task_source() -> str:
    """The complete task of docs/tasks.md's "A task in forty lines", as written there."""
    text = (ROOT / "docs" / "tasks.md").read_text()
    section = text.split("### A task in forty lines", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def _cli(tmp_path, *args: str, pythonpath: str = "") -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p)}
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    return res.returncode, [x for x in (res.stdout + res.stderr).splitlines() if x.strip()]


def test_the_docs_task_runs_as_written_and_one_without_load_is_named_before_the_run(tmp_path):
    """docs/tasks.md's short task left out ``load``, which is required: the first run died after 50 s with a
    ~100-line traceback. The docs' task is complete now (it passes the check that `rlcr train` runs first); the
    same task without ``load`` is one line naming ``load``, exit 2, before Prefect or Ray (nothing written)."""
    import yaml

    source = _docs_task_source()
    assert "def load(" in source
    (tmp_path / "sumlist_docs.py").write_text(source)
    without = tmp_path / "sumlist_noload.py"
    without.write_text(re.sub(r"    def load\(self.*\n.*\n\n", "", source))
    assert "def load(" not in without.read_text()
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"tasks": {"name": "sumlist", "num_train": 32, "num_eval": 8}}))
    example = str(ROOT / "examples" / "sumlist")  # its check.py: the verifier's module
    code = ("import sys\nfrom rlcr.config import load_config\nfrom rlcr.tasks.preflight import check_task\n"
            f"check_task(load_config({str(config)!r}, ['tasks.module=' + sys.argv[1]]))\nprint('checked')\n")
    ok = subprocess.run([sys.executable, "-c", code, str(tmp_path / "sumlist_docs.py")], cwd=tmp_path,
                        env={**os.environ, "PYTHONPATH": f"{example}{os.pathsep}{ROOT}"}, capture_output=True,
                        text=True, timeout=300)
    assert ok.returncode == 0 and ok.stdout.strip() == "checked", ok.stderr[-3000:]
    rc, lines = _cli(tmp_path, "train", "--config", str(config), f"tasks.module={without}", "model.name=tiny",
                     f"storage.uri={tmp_path / 'store'}", pythonpath=example)
    assert rc == 2 and len(lines) == 1, lines
    assert "task 'sumlist'" in lines[0] and "load" in lines[0] and "Traceback" not in lines[0]
    assert not (tmp_path / "store").exists()


def test_a_held_out_quota_the_task_space_cannot_fill_is_refused_before_the_run(tmp_path):
    """It failed after 47 s, once the engines had started; now one line before Ray."""
    rc, lines = _cli(tmp_path, "train", "--config", str(ROOT / "configs" / "tiny.yaml"), "model.name=tiny",
                     "tasks.options.min_count=2", "tasks.options.max_count=2", "tasks.options.num_range=[1,3]",
                     "tasks.options.target_range=[1,9]", "tasks.num_train=4", "tasks.num_eval=200",
                     "rollout.prompts_per_iteration=2", f"storage.uri={tmp_path / 'store'}")
    assert rc == 2 and len(lines) == 1, lines
    assert "task 'countdown'" in lines[0] and "held-out" in lines[0]


def test_each_method_at_fault_is_named(monkeypatch):
    """A record key without a field, a from_record that does not invert to_record, a warm-start trace that does
    not score full, a score out of [0, 1]: each one line naming the method."""
    import pytest

    from rlcr.config import RLCRConfig
    from rlcr.tasks import registry
    from rlcr.tasks.base import TASKS, register_task
    from rlcr.tasks.countdown_task import Countdown
    from rlcr.tasks.preflight import TaskCheckError, check_task

    broken = {
        "record_fields": {"record_fields": lambda self: []},
        "from_record": {"from_record": lambda self, r: Countdown.from_record(self, {**r, "target": r["target"] + 1})},
        "warm_start": {"warm_start_completion": lambda self, trace: "<answer>1 - 1</answer>"},
        "score": {"score": lambda self, c, p, *, format_score, score=1.0: 2.0},
    }
    for method, body in broken.items():
        name = f"countdown_{method}"
        register_task(name)(type(f"Broken_{method}", (Countdown,), body))
        try:
            cfg = RLCRConfig.from_dict({"tasks": {"name": name, "num_train": 16, "num_eval": 4},
                                        "rollout": {"prompts_per_iteration": 2}})
            with pytest.raises(TaskCheckError) as e:
                check_task(cfg)
            assert f"task '{name}': {method}:" in str(e.value) and "\n" not in str(e.value), str(e.value)
        finally:
            TASKS.pop(name, None)
            registry._INSTANCES.pop(name, None)


def test_a_run_that_committed_nothing_says_how_to_discard_it(tmp_path):
    """After a failed start the same run id refused the corrected settings with no way out but a new id; the
    refusal now says the run has nothing committed and which folder to delete (a run with commits keeps the old
    message: its iterations are worth keeping)."""
    import pytest

    from rlcr.config import RLCRConfig
    from rlcr.runs import RunConfigMismatch, RunStore
    from rlcr.storage import Store

    store = Store(str(tmp_path / "store"))
    cfg = RLCRConfig.from_dict({"storage": {"uri": str(tmp_path / "store")}})
    changed = RLCRConfig.from_dict({"storage": {"uri": str(tmp_path / "store")}, "update": {"learning_rate": 3e-6}})
    run = RunStore(store, "failed-start")
    run.check_config(cfg)
    with pytest.raises(RunConfigMismatch) as e:
        run.check_config(changed)
    assert "no committed iteration" in str(e.value) and str(tmp_path / "store" / "runs" / "failed-start") in str(e.value)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "weights.bin").write_bytes(b"w")
    run.commit(1, {"checkpoint_uri": store.put_dir(tmp_path / "ckpt", run.checkpoint_rel(1, "writer1"))})
    with pytest.raises(RunConfigMismatch) as e:
        run.check_config(changed)
    assert "no committed iteration" not in str(e.value) and "use a new run_id" in str(e.value)
