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
    code = ("import sys\nfrom rlcr.config import load_config\nfrom rlcr.runs.preflight import check_task\n"
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
    from rlcr.runs.preflight import TaskCheckError, check_task
    from rlcr.tasks import registry
    from rlcr.tasks.base import TASKS, register_task
    from rlcr.tasks.countdown_task import Countdown

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
    from rlcr.runs.store import RunConfigMismatch, RunStore
    from rlcr.storage import Store

    store = Store(str(tmp_path / "store"))
    cfg = RLCRConfig.from_dict({"storage": {"uri": str(tmp_path / "store")}})
    changed = RLCRConfig.from_dict({"storage": {"uri": str(tmp_path / "store")}, "update": {"learning_rate": 3e-6}})
    run = RunStore(store, "failed-start")
    run.check_config(cfg)
    with pytest.raises(RunConfigMismatch) as e:
        run.check_config(changed)
    assert ("no committed iteration" in str(e.value)
            and str(tmp_path / "store" / "runs" / "failed-start") in str(e.value))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "weights.bin").write_bytes(b"w")
    run.commit(1, {"checkpoint_uri": store.put_dir(tmp_path / "ckpt", run.checkpoint_rel(1, "writer1"))})
    with pytest.raises(RunConfigMismatch) as e:
        run.check_config(changed)
    assert "no committed iteration" not in str(e.value) and "use a new run_id" in str(e.value)


# ----------------------------------------------------------------------------- item 3: installing a task package


def _recipe_blocks() -> list[str]:
    """The shell blocks of docs/tasks.md's "Installing a task package" section, as written."""
    text = (ROOT / "docs" / "tasks.md").read_text()
    section = text.split("### Installing a task package", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def _offline(block: str) -> str:
    """The one change made to the recipes: pip builds the package with this environment's setuptools and looks
    at no index (the tests run offline)."""
    return block.replace("pip install --no-deps", "pip install --no-deps --no-build-isolation --no-index")


def test_both_ways_of_installing_a_task_package_work_as_written(tmp_path):
    """docs/tasks.md's two recipes, run by bash in a folder holding a copy of examples/sumlist: inside rlcr's
    virtual environment (a throwaway environment layered on this one stands for `.venv`, whose own lock the
    setup test checks) and beside it in a plugins folder on PYTHONPATH. Each time `rlcr config show` lists the
    plugin's own options, and the package landed where the recipe says, not in this environment."""
    import shutil
    import sysconfig

    venv_block, beside_block = _recipe_blocks()
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples" / "sumlist", work / "examples" / "sumlist",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    ours = Path(sysconfig.get_paths()["purelib"])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_TARGET", "PIP_PREFIX")}
    env.update(HOME=str(tmp_path / "home"), PIP_DISABLE_PIP_VERSION_CHECK="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")

    # 1. inside the environment: `.venv` is a layer over this one (its .pth adds our site-packages, editable
    #    rlcr included); `.venv/bin/X` is that layer's `python -m X`
    layer = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(layer)], check=True, timeout=120)
    (site,) = layer.glob("lib/python*/site-packages")
    (site / "zz-rlcr-base.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    script = _offline(venv_block).replace(".venv/bin/pip", f"{layer}/bin/python -m pip") \
        .replace(".venv/bin/rlcr", f"{layer}/bin/python -m rlcr.cli")
    res = subprocess.run(["bash", "-euc", script], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "tasks.options.max_len" in res.stdout and "sumlist" in res.stdout, res.stdout[-2000:]
    assert list(site.glob("rlcr_sumlist-*.dist-info")) and not list(ours.glob("rlcr_sumlist*"))

    # 2. beside it: a plugins folder under ~ on PYTHONPATH, this environment's pip and rlcr on PATH
    res = subprocess.run(["bash", "-euc", _offline(beside_block)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "tasks.options.max_len" in res.stdout, res.stdout[-2000:]
    plugins = tmp_path / "home" / "rlcr-plugins"
    assert (plugins / "rlcr_sumlist" / "task.py").exists() and list(plugins.glob("rlcr_sumlist-*.dist-info"))
    assert not list(plugins.glob("rlcr-*.dist-info")) and not list(ours.glob("rlcr_sumlist*"))  # rlcr not copied


# ----------------------------------------------------------------------------- item 5: messages and state


def test_config_show_says_who_set_each_task_option_whatever_its_value(tmp_path):
    """An option the file sets to its default value was shown as "default"; one the file leaves out, "default";
    one the command line sets, "command line"."""
    import json

    cfg = tmp_path / "opts.yaml"
    cfg.write_text("tasks:\n  name: countdown\n  options:\n    num_range: [1, 20]\n    min_count: 2\n")
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", "config", "show", "--json", "--config", str(cfg),
                          "tasks.options.max_count=4"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {r["field"]: r for r in json.loads(res.stdout)}
    assert rows["tasks.options.num_range"]["set_by"] == "file"  # the default value, but written in the file
    assert rows["tasks.options.min_count"]["set_by"] == "file"
    assert rows["tasks.options.max_count"]["set_by"] == "command line"
    assert rows["tasks.options.target_range"]["set_by"] == "default"


def test_eval_titles_name_the_run_reference_and_never_cut_a_word():
    """The title showed the attempt's checkpoint path (not ``RUN@K``) and wrapped it mid-word at 80 columns."""
    import io

    from rich.console import Console

    from rlcr.cli.evaluation import policy_label
    from rlcr.ui.presentation import eval_table

    path = "/home/researcher/runs-store/runs/prime-1/iter-0003/checkpoint-attempt-3f2a9c81d0e4"
    assert policy_label("prime-1@latest", path) == "prime-1@3" and policy_label("prime-1@2", path) == "prime-1@2"
    assert policy_label(None, path) == path
    m = {"n_tasks": 8, "n_answers": 32, "accuracy": 0.25, "accuracy_ci": [0.1, 0.4]}
    for label, shown in (("prime-1@3", "held-out evaluation of prime-1@3 (method rlcr; "),
                         (path, "held-out evaluation (method rlcr; ")):
        out = Console(file=io.StringIO(), width=80, force_terminal=False)
        out.print(eval_table(label, "rlcr", 0, m))
        title = out.file.getvalue().splitlines()[0]
        assert title.strip().startswith(shown) and title.strip().endswith("over tasks])"), title
        assert "checkpoint-att" not in out.file.getvalue()  # a long path: on a line of its own (the command's)


def test_rlcr_runs_shows_the_current_target_the_stop_reason_and_warm_start_runs(tmp_path):
    """``rlcr runs`` showed ``5/3`` for a run extended to 5, left out the ``rlcr sft`` run, and said ``stopped``
    with no reason. The status record each attempt writes (its target, how it ended) fills both in."""
    from rlcr.runs.layout import RunLayout
    from rlcr.storage import Store
    from test_run_refs import cli, make_run, sealed

    store = Store(str(tmp_path / "store"))
    extended = make_run(store, "extended", committed=5, save_every=1, iterations=3)  # config says 3; resumed to 5
    extended.write_status("finished", 5)
    old = make_run(store, "old", committed=4, save_every=1, iterations=2)  # extended before status.json existed
    stopped = make_run(store, "stopped", committed=1, save_every=1, iterations=4)
    stopped.write_status("stopped", 4, "interrupted (Ctrl-C)")
    killed = make_run(store, "killed", committed=1, save_every=1, iterations=4)
    killed.write_status("running", 4)  # ended without a word and without a lease (released, or a dead holder's)
    sealed(store, RunLayout.standalone_checkpoint_rel("sft-0", 0))
    assert old.status() is None

    res = cli(["runs", f"storage.uri={store.url()}"], width=120)
    assert res.exit_code == 0, res.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in res.output.splitlines() if line.startswith("│") and line.split("│")[1].strip()}
    assert rows["extended"][2] == "5/5" and rows["extended"][-1] == "finished"
    assert rows["old"][2] == "4/4" and rows["old"][-1] == "finished"
    assert rows["stopped"][2] == "1/4" and rows["stopped"][-1] == "stopped *"
    assert "* stopped: stopped, interrupted (Ctrl-C)" in res.output  # the reason: a line under the table
    assert rows["killed"][-1] == "stopped *" and "* killed: stopped, ended without saying why" in res.output
    assert rows["sft-0"][1] == "sft" and rows["sft-0"][3] == "0" and rows["sft-0"][-1] == "finished"
    assert "5/3" not in res.output and "4/2" not in res.output
    narrow = cli(["runs", f"storage.uri={store.url()}"])
    assert max(len(line) for line in narrow.output.splitlines()) <= 80, narrow.output


def test_a_status_record_from_a_file_is_checked(tmp_path):
    import pytest

    from rlcr.runs.store import RunStore
    from rlcr.storage import Store
    from rlcr.untrusted import InvalidInput

    run = RunStore(Store(str(tmp_path / "store")), "r")
    for doc, needle in (({"state": "done", "target": 3}, "'state'"), ({"state": "stopped", "target": 0}, "target"),
                        ({"state": "stopped", "target": 3, "reason": ["x"]}, "reason")):
        run.store.write_json(run.status_rel, doc)
        with pytest.raises(InvalidInput, match=needle):
            run.status()
