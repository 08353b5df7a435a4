"""The CLI's progress off a terminal (``make demo > demo.log``, CI): plain, timestamped lines per stage."""

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from rlcr.cli import StageProgress, committed_figures
from rlcr.config import RLCRConfig
from rlcr.events import StageEvent
from rlcr.runs.store import RunStore
from rlcr.ui.progress import step as _step

TS = r"\[\d\d:\d\d:\d\d\] "


def log_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    # a file, not a TTY: rich's bars and spinners print nothing here
    return Console(file=buf, width=60, force_terminal=False), buf


def lines(buf: io.StringIO) -> list[str]:
    return buf.getvalue().splitlines()


def test_stage_events_become_plain_lines_with_times_and_figures(tmp_path):
    """The flow's event sequence for a fresh 1-iteration run (baseline evaluation first, an update
    retried once), with the files the flow commits written where the flow writes them."""
    cfg = RLCRConfig(storage={"uri": str(tmp_path / "store")})
    run = RunStore.open(cfg, "r")
    out, buf = log_console()
    assert not out.is_terminal
    bar = StageProgress(1, 1, figures=committed_figures(cfg, "r"), out=out)
    with bar:
        bar("evaluate", 0)
        run.store.write_json(f"{run.prefix}/baseline.json", {"eval": {"accuracy": 0.25, "ece": 0.1}})
        for stage in ("rollouts", "advantages", "update", "update", "evaluate", "stage"):
            bar(stage, 1)
        it = run.iteration_dir(1)
        run.store.write_json(f"{it}/metrics.json", {
            "rollout": {"answer/reward_mean": 0.31, "confidence/reward_mean": -0.12}, "update": {"loss": 0.05},
            "eval": {"accuracy": 0.5, "ece": 0.2}, "timings": {}})
        bar("save", 1)
        bar("commit", 1)
        run.commit(1, {"metrics_uri": run.store.url(f"{it}/metrics.json")})
    got = lines(buf)
    assert all(re.match(TS, line) for line in got), got
    text = [line[11:] for line in got]  # without the "[hh:mm:ss] "
    assert text[0] == "training: started (iterations 1..1)"
    assert text[1] == "baseline evaluation: started — held-out evaluation"
    assert re.fullmatch(r"baseline evaluation: done in \d+\.\d s \(accuracy 0\.250, ECE 0\.100\)", text[2])
    assert text[3] == "iteration 1 rollouts: started — generating answers → confidences"
    assert re.fullmatch(r"iteration 1 rollouts: done in \d+\.\d s", text[4])
    assert re.fullmatch(r"iteration 1 update: failed after \d+\.\d s, retrying", text[8])
    assert re.fullmatch(
        r"iteration 1 stage: done in \d+\.\d s \(iteration 1/1 in \d+\.\d s; answer reward 0\.310, "
        r"confidence reward -0\.120, loss 0\.050, held-out accuracy 0\.500, ECE 0\.200\)", text[-6])
    assert re.fullmatch(r"iteration 1 commit: done in \d+\.\d s", text[-2])
    assert re.fullmatch(r"training: done in \d+\.\d s", text[-1])
    assert len(text) == 19  # started/done per stage, the retry, the title's start and end


def test_a_failed_stage_and_a_broken_figure_source():
    """The stage in progress when the flow raises is reported failed; a figure source that raises
    is reported, never passed on to the flow's stage."""
    def figures(stage, iteration):
        raise OSError("storage unreachable")

    out, buf = log_console()
    bar = StageProgress(3, 2, figures=figures, out=out, title="4/5 RLCR")
    with pytest.raises(RuntimeError):
        with bar:
            bar("rollouts", 2)
            bar("advantages", 2)  # finishing rollouts asks for its figure: the source raises
            raise RuntimeError("injected")
    text = [line[11:] for line in lines(buf)]
    assert text[0] == "4/5 RLCR: started (iterations 2..3)"
    assert "(progress display error: OSError: storage unreachable)" in text
    assert re.fullmatch(r"iteration 2 rollouts: done in \d+\.\d s", text[3])
    assert re.fullmatch(r"iteration 2 advantages: failed after \d+\.\d s \(RuntimeError: injected\)", text[-2])
    assert re.fullmatch(r"4/5 RLCR: failed after \d+\.\d s \(RuntimeError\)", text[-1])


def test_end_events_give_done_lines_at_once_with_their_figures():
    """The flow's stage events (``rlcr.events``) as the CLI subscribes to them: the baseline has no end
    event (done when iteration 1 starts), the other stages end with their elapsed time and figures."""
    from rlcr import events
    from rlcr.events import StageEvent

    out, buf = log_console()
    bar = StageProgress(1, 1, out=out)
    with events.subscribed(bar.on_event), bar:
        events.emit(StageEvent("baseline", 0, "start"))
        events.emit(StageEvent("rollouts", 1, "start"))
        events.emit(StageEvent("rollouts", 1, "end", 27.1, {"samples": 24}))
        events.emit(StageEvent("advantages", 1, "start"))
        events.emit(StageEvent("advantages", 1, "end", 0.4, {"answer reward": 0.31, "confidence reward": None}))
        assert lines(buf)[-1][11:] == "iteration 1 advantages: done in 0.4 s (answer reward 0.310)"
        events.emit(StageEvent("update", 1, "start"))
    events.emit(StageEvent("update", 1, "start"))  # unsubscribed: not shown
    text = [line[11:] for line in lines(buf)]
    assert text[1] == "baseline evaluation: started — held-out evaluation of the starting policy"
    assert re.fullmatch(r"baseline evaluation: done in \d+\.\d s", text[2])
    assert text[3:5] == ["iteration 1 rollouts: started — generating answers → confidences",
                         "iteration 1 rollouts: done in 27.1 s (samples 24)"]
    assert re.fullmatch(r"iteration 1 update: done in \d+\.\d s", text[-2])  # no end event: done at the flow's end
    assert len(text) == 10


def test_one_step_off_rollouts_beside_the_update_leave_both_running():
    """``orchestration.mode: one-step-off``: iteration 2's rollouts start while iteration 1's update runs; the
    update is not reported done then, and the rollouts' done line comes when the next stage starts."""
    from rlcr import events
    from rlcr.events import StageEvent

    out, buf = log_console()
    bar = StageProgress(2, 1, out=out)
    with events.subscribed(bar.on_event), bar:
        events.emit(StageEvent("update", 1, "start"))
        events.emit(StageEvent("rollouts", 2, "start"))
        events.emit(StageEvent("update", 1, "end", 40.0, {"loss": 0.5}))
        events.emit(StageEvent("advantages", 2, "start"))
    text = [line[11:] for line in lines(buf)]
    assert text[1:5] == ["iteration 1 update: started — GRPO update (Ray Train)",
                         "iteration 2 rollouts: started — generating answers → confidences (beside the update)",
                         "iteration 1 update: done in 40.0 s (loss 0.500)",
                         text[4]]
    assert re.fullmatch(r"iteration 2 rollouts: done in \d+\.\d s", text[4])
    assert text[5] == "iteration 2 advantages: started — advantages + rollouts Parquet"


def test_steps_print_start_and_done_off_a_terminal_only():
    out, buf = log_console()
    with _step("2/5 evaluating", out=out):
        pass
    with pytest.raises(KeyError), _step("5/5 probe", out=out):
        raise KeyError("x")
    assert [line[11:] for line in lines(buf)][0] == "2/5 evaluating: started"
    assert re.fullmatch(TS + r"2/5 evaluating: done in \d+\.\d s", lines(buf)[1])
    assert re.fullmatch(TS + r"5/5 probe: failed after \d+\.\d s \(KeyError\)", lines(buf)[3])

    tty = Console(file=io.StringIO(), force_terminal=True, width=60)
    with _step("2/5 evaluating", out=tty):
        pass
    bar = StageProgress(2, 1, out=tty)  # on a terminal: the rich bar; it counts committed iterations only
    with bar:
        bar("rollouts", 1)
        bar("stage", 1)
        bar("rollouts", 2)  # one-step-off: iteration 1 is staged, its commit still pending
        assert bar.progress.tasks[0].completed == 0 and bar.doing() == "iteration 2's generation"
        bar.on_event(StageEvent("commit", 1, "end", elapsed_s=0.1))
    assert bar.progress.tasks[0].completed == 1 and bar.committed == 1 and "started" not in tty.file.getvalue()


def test_progress_inside_a_long_stage_is_k_of_n_lines_off_a_terminal_and_the_label_on_one():
    """Progress events (rlcr.events.progress) of the work inside a step or a training stage: off a terminal a
    line for the first of each part, at most one per PROGRESS_EVERY_S, and the one completing it; on a terminal
    the spinner's or the bar's label. A broken event never fails the work."""
    from rlcr import events
    from rlcr.events import StageEvent

    out, buf = log_console()
    with _step("probing", out=out):
        for part, unit, n in (("answers", "tasks", 3), ("forced answers", "truncation points", 2)):
            for k in range(n + 1):
                events.progress("probe", 0, k, n, unit, part)
        events.progress("probe", 0, 2, 2, "truncation points", "forced answers")  # said twice: one line
        events.emit(StageEvent("probe", 0, "progress", figures=None))  # broken: no line, no error
    said = [line[11:] for line in lines(buf)]
    assert said[1:5] == ["probing: answers 0/3 tasks", "probing: answers 3/3 tasks",
                         "probing: forced answers 0/2 truncation points",
                         "probing: forced answers 2/2 truncation points"]
    assert len(said) == 6 and said[5].startswith("probing: done in")

    out, buf = log_console()
    bar = StageProgress(1, 1, out=out)
    with events.subscribed(bar.on_event), bar:
        events.started("baseline", 0)
        events.progress("evaluate", 0, 0, 4)
        events.progress("evaluate", 0, 4, 4)
    assert "baseline evaluation: 4/4 tasks" in [line[11:] for line in lines(buf)]

    tty = Console(file=io.StringIO(), force_terminal=True, width=100)
    bar = StageProgress(1, 1, out=tty)
    with events.subscribed(bar.on_event), bar:
        events.started("evaluate", 1)
        events.progress("evaluate", 1, 2, 4)
        assert bar.progress.tasks[0].description == "iteration 1: held-out evaluation 2/4 tasks"


def test_a_cli_command_logs_plain_lines(smollm2_dir):
    """``rlcr models prepare`` through typer, its stdout a pipe (as under ``make demo > demo.log``)."""
    from typer.testing import CliRunner

    from rlcr.cli import app

    res = CliRunner().invoke(app, ["models", "prepare"])
    assert res.exit_code == 0, res.output
    out = res.output.splitlines()
    assert re.fullmatch(TS + "converting GGUF → safetensors: started", out[0]), out
    assert re.fullmatch(TS + r"converting GGUF → safetensors: done in \d+\.\d s", out[1]), out
    assert "SmolLM2-135M-Instruct:" in res.output


def test_sft_options_override_the_configs_warm_start_settings(monkeypatch, tmp_path):
    """``rlcr sft``: the warm-start's settings are the config's sft_* fields; --tasks/--epochs and field=value
    arguments override them (run_sft stubbed: no training here)."""
    from pathlib import Path

    from typer.testing import CliRunner

    import rlcr.train.sft
    from rlcr.cli import app

    seen = []
    monkeypatch.setattr(rlcr.train.sft, "run_sft",
                        lambda cfg, out=None: seen.append((cfg, out)) or ("uri", {"loss": 1.0}))
    demo = str(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    store = f"storage.uri={tmp_path}"
    assert CliRunner().invoke(app, ["sft", "--config", demo, store]).exit_code == 0
    assert CliRunner().invoke(app, ["sft", "--config", demo, "--tasks", "5", "--epochs", "3", "--out", "o", store,
                                    "sft.learning_rate=5e-5"]).exit_code == 0
    assert CliRunner().invoke(app, ["sft", store]).exit_code == 0
    (cfg, out), (over, over_out), (default, _) = seen
    assert (cfg.sft.tasks, cfg.sft.epochs, cfg.sft.learning_rate, out) == (60, 2, 1e-4, None)  # configs/demo.yaml
    assert (over.sft.tasks, over.sft.epochs, over.sft.learning_rate, over_out) == (5, 3, 5e-5, "o")
    assert (default.sft.tasks, default.sft.epochs) == (RLCRConfig().sft.tasks, RLCRConfig().sft.epochs)


def says(output: str, message: str) -> bool:
    """Whether a CLI error box holds ``message``, wherever rich broke its lines (spaces ignored)."""
    def squeeze(t):
        return "".join(t.replace("│", "").split())

    return squeeze(message) in squeeze(output)


def write_eval_rows(cfg, run_id: str, iteration: int, right: bool, tasks: int = 6) -> None:
    """Held-out rows of run ``run_id`` after ``iteration``: one answer per task, all right or all wrong."""
    from rlcr.rollout.records import rollout_row, rows_to_table
    from rlcr.tasks.countdown import CountdownTask

    run, rows = RunStore.open(cfg, run_id), []
    for p in range(tasks):
        task = CountdownTask([p + 1, 2], p + 3)
        rows.append(rollout_row("answer", task=task, prompt_id=p, answer_id=0, context_text="c", context_ids=[1],
                                completion_text="x", completion_ids=[1], score=1.0, correct=float(right),
                                reward=float(right), task_name="countdown"))
        rows.append(rollout_row("confidence", task=task, prompt_id=p, answer_id=0, confidence_id=0,
                                context_text="c", context_ids=[1], completion_text="y", completion_ids=[1],
                                correct=float(right), reward=0.0, confidence=0.9, task_name="countdown"))
    rows = [dict(r, run_id=run_id, iteration=iteration) for r in rows]
    run.store.write_parquet(run.eval_records_rel(iteration), rows_to_table(rows))


def test_compare_pairs_two_runs_evaluations_on_the_same_tasks(tmp_path):
    """`rlcr compare A B`: A − B from the per-answer rows the flow keeps, at the last iteration both evaluated;
    a run without rows is refused by name."""
    from typer.testing import CliRunner

    from rlcr.cli import app

    cfg = RLCRConfig(storage={"uri": str(tmp_path / "store")})
    for run_id, right in (("a", True), ("b", False)):
        write_eval_rows(cfg, run_id, 0, right)
    runner = CliRunner()
    res = runner.invoke(app, ["compare", "a", "b", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code == 0, res.output
    assert "a − b at iteration 0: 6 shared held-out tasks" in res.output
    acc = next(line for line in res.output.splitlines() if "accuracy" in line)
    assert "+1.000 [+1.000, +1.000]" in acc and "yes" in acc
    assert "A (6 answers)" in res.output and acc.split("│")[2:4] == [" 1.000 [1.000, 1.000] ", " 0.000 [0.000, 0.000] "]
    res = runner.invoke(app, ["compare", "a", "c", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code != 0 and says(res.output, "'c'")
    # a side may be the rows `rlcr eval --records` wrote: here b's, so b − a = −1 on every draw
    b_file = tmp_path / "b.parquet"
    b_file.write_bytes(RunStore.open(cfg, "b").store.read_bytes(RunStore.open(cfg, "b").eval_records_rel(0)))
    res = runner.invoke(app, ["compare", str(b_file), "a", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code == 0, res.output
    assert "-1.000 [-1.000, -1.000]" in next(line for line in res.output.splitlines() if "accuracy" in line)
    assert "A: " not in res.output  # rows written without provenance: none is made up
    # rows that say where they came from (as `rlcr eval --records` writes them): compare names each file's source
    import pyarrow.parquet as pq

    from rlcr.rollout.records import provenance, with_provenance

    drawn = tmp_path / "b-draw1.parquet"
    pq.write_table(with_provenance(pq.read_table(b_file), policy="ckpt/b", method="rlvr", draw=1, eval_samples=8),
                   drawn)
    assert provenance(pq.read_table(drawn)) == {"policy": "ckpt/b", "method": "rlvr", "draw": 1, "eval_samples": 8}
    assert provenance(pq.read_table(b_file)) == {}
    damaged = pq.read_table(drawn).replace_schema_metadata({b"rlcr.provenance": b"{not json"})
    assert provenance(damaged) == {} and provenance(damaged.replace_schema_metadata({b"rlcr.provenance": b"[1]"})) == {}
    res = runner.invoke(app, ["compare", "a", str(drawn), f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code == 0, res.output
    assert "B: policy ckpt/b, method rlvr, draw 1, eval_samples 8" in res.output and "A: " not in res.output
    assert "+1.000 [+1.000, +1.000]" in next(line for line in res.output.splitlines() if "accuracy" in line)
    # several draws of one policy joined by '+': pooled, 2 answers per task here; a's rows as a second draw of b
    # would be another policy's, refused by what the files say of themselves, as is one draw named twice
    a_file = tmp_path / "a.parquet"
    a_file.write_bytes(RunStore.open(cfg, "a").store.read_bytes(RunStore.open(cfg, "a").eval_records_rel(0)))
    drawn2 = tmp_path / "b-draw2.parquet"
    pq.write_table(with_provenance(pq.read_table(a_file), policy="ckpt/b", method="rlvr", draw=2, eval_samples=8),
                   drawn2)
    res = runner.invoke(app, ["compare", f"{drawn}+{drawn2}", "a", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code == 0, res.output
    assert "-0.500 [" in next(line for line in res.output.splitlines() if "accuracy" in line)  # (0 + 1) / 2 − 1
    assert "pooled b-draw1.parquet (draw 1) + b-draw2.parquet (draw 2)" in res.output
    other = tmp_path / "other-policy.parquet"
    pq.write_table(with_provenance(pq.read_table(a_file), policy="ckpt/a", method="rlvr", draw=2), other)
    res = runner.invoke(app, ["compare", f"{drawn}+{other}", "a", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code != 0 and says(res.output, "pooled files must be draws of one policy")
    again = tmp_path / "b-draw1-copy.parquet"
    again.write_bytes(drawn.read_bytes())
    res = runner.invoke(app, ["compare", f"{drawn}+{again}", "a", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code != 0 and says(res.output, "sample draw 1, as")
    res = runner.invoke(app, ["compare", f"{drawn}+{drawn}", "a", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code != 0 and says(res.output, "a file is named twice")
    # a hand-written file's provenance is its own words: printed as they are (no rich markup), any JSON draw
    hostile = tmp_path / "hostile.parquet"
    pq.write_table(with_provenance(pq.read_table(a_file), policy="[/bold] x", method="rlvr", draw=[1]), hostile)
    res = runner.invoke(app, ["compare", "a", str(hostile), f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code == 0, res.output
    assert "B: policy [/bold] x, method rlvr, draw [1]" in res.output
    hostile2 = tmp_path / "hostile2.parquet"
    pq.write_table(with_provenance(pq.read_table(a_file), policy="[/bold] x", method="rlvr", draw=[1]), hostile2)
    res = runner.invoke(app, ["compare", "a", f"{hostile}+{hostile2}", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code != 0 and says(res.output, "sample draw [1], as")
    plus = tmp_path / "b+c.parquet"  # one file whose name holds '+' is read as that file, not split
    plus.write_bytes(b_file.read_bytes())
    res = runner.invoke(app, ["compare", str(plus), "a", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code == 0, res.output
    assert "-1.000 [-1.000, -1.000]" in next(line for line in res.output.splitlines() if "accuracy" in line)
    res = runner.invoke(app, ["compare", str(tmp_path / "missing.parquet"), "a", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code != 0 and says(res.output, "missing.parquet: no such file")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    res = runner.invoke(app, ["compare", str(junk), "a", f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code != 0 and says(res.output, "junk.parquet: not per-answer evaluation rows")
    res = runner.invoke(app, ["compare", str(b_file), str(b_file), "--iteration", "3",
                              f"storage.uri={cfg.storage.uri}"])
    assert res.exit_code != 0 and says(res.output, "applies to runs, not to .parquet files")


def test_compare_reads_each_side_at_the_iteration_its_reference_names(tmp_path):
    """`rlcr compare RUN@K RUN@J`: two committed iterations of one run (what training changed) or of two runs; a
    bare run beside a pinned one is read at --iteration or its last evaluated iteration. Refused, naming the side:
    the same rows twice, --iteration with every run pinned, an iteration not committed or without rows, and a
    reference that is also the id of a run in the store (ambiguous)."""
    from typer.testing import CliRunner

    from rlcr.cli import app
    from test_run_refs import make_run

    cfg = RLCRConfig(storage={"uri": str(tmp_path / "store")})
    make_run(RunStore.open(cfg, "a").store, "a", committed=2, save_every=2, iterations=4)
    write_eval_rows(cfg, "a", 0, False)
    write_eval_rows(cfg, "a", 2, True)
    write_eval_rows(cfg, "a", 3, True)  # rows of an iteration that was never committed
    write_eval_rows(cfg, "b", 0, True)
    store, runner = f"storage.uri={cfg.storage.uri}", CliRunner()

    def accuracy(res) -> str:
        assert res.exit_code == 0, res.output
        return next(line for line in res.output.splitlines() if "accuracy" in line)

    def refused(args, *messages) -> None:
        res = runner.invoke(app, ["compare", *args, store])
        assert res.exit_code != 0 and all(says(res.output, m) for m in messages), res.output

    res = runner.invoke(app, ["compare", "a@2", "a@0", store])
    assert "+1.000 [+1.000, +1.000]" in accuracy(res)
    assert "a@2 − a@0 (A at iteration 2, B at iteration 0): 6 shared held-out tasks" in res.output
    res = runner.invoke(app, ["compare", "b@0", "a", store])  # a bare: its last evaluated iteration, 2
    assert " +0.000 [" in accuracy(res) and "b@0 − a (A at iteration 0, B at iteration 2)" in res.output
    res = runner.invoke(app, ["compare", "b", "a@latest", "--iteration", "0", store])
    assert " +0.000 [" in accuracy(res) and "b − a@latest (A at iteration 0, B at iteration 2)" in res.output
    assert "-1.000 [" in accuracy(runner.invoke(app, ["compare", "a@0", "b", store]))
    refused(["a@2", "a@latest"], "both sides are run 'a' at iteration 2: the same answers twice")
    refused(["a@2", "b@0", "--iteration", "2"], "applies to runs given without @ITERATION")
    refused(["b", "a@3"], "run 'a' kept no held-out rows for committed iteration 3 (it has them for [0, 2])",
            "RUN_B")
    refused(["a@5", "b"], "committed iteration 5", "RUN_A")
    refused(["c@1", "b"], "RUN_A: 'c@1' is read as iteration 1 of run 'c'", "run 'c' not found")
    refused(["c" * 128 + "@latest", "b"], "is read as iteration latest of run", "not found")  # too long for an id
    write_eval_rows(cfg, "b@0", 0, True)  # a run whose id is a reference to another
    refused(["a", "b@0"], "RUN_B: 'b@0' is read as iteration 0 of run 'b', but a run 'b@0' exists too")


def test_eval_refuses_to_overwrite_its_records_before_any_work(tmp_path):
    from typer.testing import CliRunner

    from rlcr.cli import app

    existing = tmp_path / "rows.parquet"
    existing.write_bytes(b"kept")
    res = CliRunner().invoke(app, ["eval", "--records", str(existing), f"storage.uri={tmp_path}"])
    assert res.exit_code != 0 and says(res.output, "exists; rows are never overwritten")
    assert existing.read_bytes() == b"kept"
    res = CliRunner().invoke(app, ["eval", "--records", str(tmp_path / "rows.csv"), f"storage.uri={tmp_path}"])
    assert res.exit_code != 0 and says(res.output, "expected a .parquet file name")


# ----------------------------------------------------------------------------- issue 33 items 5 and 8


def test_config_show_lists_every_field_with_its_value_source_effect_and_documentation(tmp_path):
    """`rlcr config show`: the resolved config, each field documented (its docstring) and marked as changing
    results or operational (the marking on the field), and where its value came from; `--json` the same as data;
    fields are listed by dotted name, section by section."""
    import json

    from typer.testing import CliRunner

    from rlcr.cli import app
    from rlcr.config import changes_results

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("run:\n  seed: 7\norchestration:\n  retries: 4\n")
    res = CliRunner().invoke(app, ["config", "show", "--json", "--config", str(cfg_file), "orchestration.retries=5",
                                   "run.iterations=3"])
    assert res.exit_code == 0, res.output
    rows = {r["field"]: r for r in json.loads(res.output)}
    fields = dict(RLCRConfig.dotted_fields())
    # the task's own settings are listed one by one, under tasks.options (their docs: the task's Options model)
    options = [f for f in rows if f.startswith("tasks.options.")]
    assert options == ["tasks.options.min_count", "tasks.options.max_count", "tasks.options.num_range",
                       "tasks.options.target_range"]
    assert [f for f in rows if f not in options] == [f for f in fields if f != "tasks.options"]
    assert "rollout.temperature" in rows
    rows = {f: r for f, r in rows.items() if f not in options}
    assert rows["run.seed"] == {"field": "run.seed", "value": 7, "set_by": "file", "changes_results": True,
                                "doc": " ".join(fields["run.seed"].description.split())}
    assert (rows["orchestration.retries"]["value"], rows["orchestration.retries"]["set_by"],
            rows["orchestration.retries"]["changes_results"]) == (5, "command line", False)
    assert (rows["run.iterations"]["value"], rows["run.iterations"]["set_by"]) == (3, "command line")
    assert rows["update.learning_rate"]["set_by"] == "default"
    assert rows["update.learning_rate"]["doc"].startswith("AdamW learning rate")
    assert all(r["changes_results"] == changes_results(fields[name]) and r["doc"] for name, r in rows.items())
    res = CliRunner().invoke(app, ["config", "show", "run.seed=3"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    seed = next(line for line in res.output.splitlines() if line.startswith("│ run.seed "))
    assert "│ 3 " in seed and "command line" in seed and "changes" in seed and "Master seed" in seed
    retries = next(line for line in res.output.splitlines() if line.startswith("│ orchestration.retries "))
    assert "default" in retries and "operational" in retries


def test_version_prints_the_package_version():
    from importlib.metadata import version

    from typer.testing import CliRunner

    from rlcr.cli import app

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"rlcr {version('rlcr')}", res.output


def test_the_ray_dashboard_follows_its_packages_or_the_environment(monkeypatch):
    """On for a local Ray when ray[default]'s dashboard packages import; RLCR_RAY_DASHBOARD=0/1 decides otherwise
    (1 without the packages, or a value that is neither, is a one-line config error)."""
    import rlcr.runs.cluster as cluster
    from rlcr.config import ConfigError

    monkeypatch.delenv("RLCR_RAY_DASHBOARD", raising=False)
    installed = not cluster._missing_dashboard_modules()
    assert cluster.ray_dashboard()[0] == installed
    monkeypatch.setenv("RLCR_RAY_DASHBOARD", "0")
    assert cluster.ray_dashboard() == (False, "RLCR_RAY_DASHBOARD=0")
    monkeypatch.setenv("RLCR_RAY_DASHBOARD", "1")
    if installed:
        assert cluster.ray_dashboard()[0] is True
    else:
        with pytest.raises(ConfigError, match="pip install 'ray\\[default\\]'"):
            cluster.ray_dashboard()
    monkeypatch.setenv("RLCR_RAY_DASHBOARD", "sometimes")
    with pytest.raises(ConfigError, match="expected 1, 0 or auto"):
        cluster.ray_dashboard()
    monkeypatch.setattr(cluster, "_DASHBOARD_MODULES", ("json", "no_such_module_rlcr"))
    monkeypatch.delenv("RLCR_RAY_DASHBOARD")
    assert cluster.ray_dashboard() == (False, "needs ray[default]: missing no_such_module_rlcr")
    monkeypatch.setattr(cluster, "_DASHBOARD_MODULES", ("json",))
    assert cluster.ray_dashboard() == (True, "ray[default] installed")


def test_train_says_where_the_logs_go_once_before_it_starts(tmp_path):
    """`rlcr train` prints one line naming its log file before the flow starts; the file starts with where the
    Ray workers' (engines, trainer) and the flow's logs go and the dashboard: here the flow cannot reach its
    Prefect API (a closed port), so nothing heavy starts after the line, and the error reaches the terminal."""
    import os
    import subprocess
    import sys

    from rlcr.runs.cluster import ray_log_dir
    from s3server import free_port

    api = f"http://127.0.0.1:{free_port()}/api"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RLCR_LOG_DIR")}
    env.update(PREFECT_API_URL=api, RLCR_RAY_DASHBOARD="0", COLUMNS="80")
    res = subprocess.run([sys.executable, "-m", "rlcr.cli", "train", "--run-id", "logs", f"storage.uri={tmp_path}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    lines = [line for line in res.stdout.splitlines() if line.startswith("logs: ")]
    assert len(lines) == 1, res.stdout + res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[0] == lines[0]  # first, before the flow
    match = re.fullmatch(r"logs: (rlcr-logs/logs/train-\d{8}-\d{6}\.log) \(Prefect, Ray, vLLM; -v shows them here\)",
                         lines[0])
    assert match, lines[0]
    line = (tmp_path / match.group(1)).read_text().splitlines()[0]
    assert f"engines and trainer (Ray workers) → {ray_log_dir()} (worker-*.out/.err)" in line
    assert f"flow runs → Prefect, {api}" in line and f"driver → {match.group(1)}" in line
    assert line.endswith("Ray dashboard: off (RLCR_RAY_DASHBOARD=0)")
    assert res.returncode != 0 and res.stderr.strip()  # the flow could not reach Prefect: said on the terminal


NOISE = re.compile(r"Execution plan|Running Dataset|Starting execution of|streaming_executor|ray\.data"  # Ray Data
                   r"|Task run|Finished in state|Flow run '|Starting temporary server|prefect - |Prefect collects"
                   r"|\bvllm\b|Initializing a V1 LLM engine"  # vLLM's own lines (lower case: its logger's name)
                   r"|Started a local Ray instance|Token authentication|usage stats|telemetry"  # Ray's banners
                   r"|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}|^\d\d:\d\d:\d\d\.\d{3} \| ")  # Ray's, Prefect's log format


@pytest.mark.slow
def test_train_on_a_terminal_shows_rlcrs_own_lines_only(tiny_model_dir, tmp_path):
    """`rlcr train` on the tiny model, 80 columns: its start-up phases with their times, its stages and the
    summary tables (nothing cut), the held-out evaluations' progress (k/n tasks), and no line from Ray Data,
    Prefect's task runner, vLLM or Ray's start-up: those are in the log file it names. Run again, the finished run
    is one "nothing to do" line. Then `rlcr probe` of the run: the same quiet screen (one 'logs:' line, its own
    log file) with the probe's progress (answers, confidences, forced answers: k/n)."""
    import os
    import subprocess
    import sys
    import tempfile

    from rlcr.ui.progress import StageProgress

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "PREFECT_")) and k not in ("RLCR_LOG_DIR", "DO_NOT_TRACK")}
    with tempfile.TemporaryDirectory(prefix="rlcr-q-", dir="/tmp") as tmp:  # short: Ray's socket paths
        env.update(PYTHONPATH=str(root), RAY_TMPDIR=tmp, PREFECT_HOME=str(Path(tmp) / "prefect"),
                   RLCR_RAY_DASHBOARD="0", COLUMNS="80")
        cmd = [sys.executable, "-m", "rlcr.cli", "train", "--config", str(root / "configs" / "tiny.yaml"),
               "--run-id", "quiet", f"model.name={tiny_model_dir}", f"storage.uri={tmp_path / 'store'}"]
        first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        probe = subprocess.run([*cmd[:3], "probe", *cmd[4:]], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=600) if first.returncode == 0 else first
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-4000:]
    noisy = [line for line in out.splitlines() if NOISE.search(line)]
    assert not noisy, noisy[:10]
    log = re.match(r"logs: (\S+\.log) ", out).group(1)
    text = (tmp_path / log).read_text(errors="replace")
    assert "Task run" in text and "Execution plan" in text  # what the terminal does not show is in the file
    for name in StageProgress.STARTUP.values():  # each phase named when it starts, and its time when it is done
        assert f"start-up: {name}…" in out and re.search(rf"start-up: {re.escape(name)} ready in \d", out), name
    assert "baseline evaluation: done" in out and "training: done in" in out
    n = re.search(r"baseline evaluation: (\d+)/(\d+) tasks", out)
    assert n and re.search(rf"baseline evaluation: {n.group(2)}/{n.group(2)} tasks", out), out[-3000:]
    table = out[out.index("run quiet"):].splitlines()
    assert all(len(line) <= 80 for line in table) and "…" not in "\n".join(table), table
    assert "accuracy" in "\n".join(table) and "AUROC" in "\n".join(table)
    # where to look at the runs: MLflow's page on the training runs (a bare experiment link opens its GenAI page)
    assert "MLflow: mlflow ui --backend-store-uri" in out and "workflowType=machine_learning" in "".join(table)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip() == "nothing to do: run quiet has 2 committed iterations (run.iterations = 2)"
    seen = probe.stdout + probe.stderr
    assert probe.returncode == 0, seen[-4000:]
    assert not [line for line in seen.splitlines() if NOISE.search(line)], seen[-3000:]
    log = re.match(r"logs: (rlcr-logs/quiet/probe-\d{8}-\d{6}\.log) ", seen)
    assert log and seen.count("logs: ") == 1, seen[:2000]
    assert "vllm" in (tmp_path / log.group(1)).read_text(errors="replace").lower()  # in the file, not here
    for part in ("answers", "confidences"):
        assert re.search(rf"probing \(.*\): {part} (\d+)/\1 tasks", seen), (part, seen[-3000:])
    assert re.search(r"probing \(.*\): forced answers (\d+)/\1 truncation points", seen), seen[-3000:]
    assert "report: " in seen


def test_the_demos_larger_held_out_set_is_stratified_and_apart_from_training_and_warm_start():
    """`rlcr demo` step 5 evaluates the warm-start and the final policy on 256 held-out tasks drawn like the run's
    held-out set: none is a training task or a warm-start task, and both number counts have equal shares."""
    from rlcr.config import load_config
    from rlcr.runs.task_sets import held_out_set, sft_tasks, training_pool
    from rlcr.tasks.registry import get_task

    cfg = load_config("configs/demo.yaml").model_copy(update={"tasks.num_eval": 256})
    task = get_task(cfg.tasks.name)
    train = training_pool(cfg)
    held = held_out_set(cfg, train)
    ids = [task.identity(t) for t in held]
    assert len(ids) == len(set(ids)) == 256
    assert not set(ids) & {task.identity(t) for t in train}
    assert not set(ids) & {task.identity(t) for t in sft_tasks(cfg, cfg.sft.tasks, train)}
    assert sorted(task.stratum(t) for t in held).count(2) == 128


def test_a_stored_demo_summary_is_checked_before_it_is_shown():
    """A ``final-eval/<key>/summary.json`` that is not what the demo wrote (hand-edited, truncated, hostile) is
    one line naming the file, not a traceback in the middle of the summary."""
    import json

    from rlcr.cli.demo import read_summary
    from rlcr.untrusted import InvalidInput

    good = {"n_tasks": 256, "iteration": 3, "before": {"ece": 0.3}, "after": {"ece": 0.1},
            "comparison": {"differences": {k: {"difference": -0.1, "ci": [-0.2, -0.05]}
                                           for k in ("accuracy", "ece", "brier", "auroc")}}}
    assert read_summary(json.dumps(good).encode(), "s/summary.json")["n_tasks"] == 256
    for bad in ({**good, "n_tasks": "256"}, {**good, "comparison": {"differences": {"ece": {"difference": "x"}}}},
                {**good, "comparison": []}, {k: v for k, v in good.items() if k != "before"}):
        with pytest.raises(InvalidInput, match=r"^s/summary\.json: not a before → after evaluation summary"):
            read_summary(json.dumps(bad).encode(), "s/summary.json")
    with pytest.raises(InvalidInput, match="s/summary.json"):
        read_summary(b"{" * 10_000, "s/summary.json")
