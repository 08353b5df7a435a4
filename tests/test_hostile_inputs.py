"""Hostile files and arguments (issue 30, items 4–7): nothing from a file reaches the terminal raw, parsing is
bounded, ranges are validated, evaluation files are checked. Each refusal is one line naming the file (or the
field), never a traceback; time bounds are generous guards, not speed goals."""

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from rlcr.cli import app
from rlcr.config import ConfigError, RLCRConfig
from rlcr.rollout.records import rollout_row, rows_to_table, with_provenance
from rlcr.tasks.countdown import CountdownTask, TaskFormatError, compute_score, load_tasks

# what a file could make a terminal do: clear the screen, set the window title, ring the bell
HOSTILE = "\x1b[2J\x1b[H\x1b]0;pwned\x07[red]x[/bold]\u202e"


def raw_control(text: str) -> bool:
    """Whether ``text`` holds one of HOSTILE's control sequences as it is."""
    return any(s in text for s in ("\x1b[2J", "\x1b]0;", "\x07", "\u202e"))


def one_line_refusal(e: BaseException, *needles: str) -> str:
    message = str(e)
    assert "\n" not in message and len(message) < 2000, message[:3000]
    assert not raw_control(message)
    for needle in needles:
        assert needle in message, message
    return message


def cli(*args: str):
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, list(args))
    took = time.perf_counter() - t0
    assert "Traceback" not in res.output and not raw_control(res.output), res.output[-3000:]
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res, took


def says(output: str, message: str) -> bool:
    """Whether a CLI error box holds ``message``, wherever rich broke its lines (spaces ignored)."""
    def squeeze(t):
        return "".join(t.replace("│", "").split())

    return squeeze(message) in squeeze(output)


def eval_rows(n_tasks=4, confidence=0.8, right=True):
    rows = []
    for p in range(n_tasks):
        task = CountdownTask([p + 1, 2], p + 3)
        rows.append(rollout_row("answer", task=task, prompt_id=p, answer_id=0, context_text=f"prompt {p}",
                                context_ids=[1], completion_text="x", completion_ids=[1], score=1.0,
                                correct=float(right), reward=float(right), task_name="countdown"))
        rows.append(rollout_row("confidence", task=task, prompt_id=p, answer_id=0, confidence_id=0,
                                context_text=f"prompt {p} x", context_ids=[1], completion_text="y", completion_ids=[1],
                                correct=float(right), reward=0.0, confidence=confidence, task_name="countdown"))
    return [dict(r, run_id="r", iteration=0) for r in rows]


def write_rows(path, rows, **provenance):
    table = rows_to_table(rows)
    pq.write_table(with_provenance(table, **provenance) if provenance else table, path)
    return str(path)


# ======================================================================= item 4: nothing raw on the terminal
def test_compare_prints_a_files_provenance_bounded_and_without_control_characters(tmp_path):
    a = write_rows(tmp_path / "a.parquet", eval_rows())
    b = write_rows(tmp_path / "b.parquet", eval_rows(right=False), policy=HOSTILE + "p" * 50_000, method=HOSTILE,
                   draw=1)
    res, took = cli("compare", a, b, f"storage.uri={tmp_path}")
    assert res.exit_code == 0, res.output
    shown = res.output[res.output.index("B: policy"):]
    assert says(shown, "[red]x[/bold]") and says(shown, "more characters)") and len(shown) < 2000
    assert took < 30


def test_config_errors_and_file_names_reach_the_terminal_escaped(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({HOSTILE: 1, "run": {"seed": HOSTILE}}))  # JSON is YAML; "\u001b" escapes become ESC
    res, _ = cli("eval", "--config", str(cfg))
    assert res.exit_code == 2 and "config error:" in res.output and "unknown field" in res.output
    assert "[red]x[/bold]" in res.output  # shown as it is, not read as markup
    missing = tmp_path / (HOSTILE.replace("/", "") + ".parquet")
    res, _ = cli("compare", str(missing), str(missing), f"storage.uri={tmp_path}")
    assert res.exit_code != 0 and says(res.output, "no such file")


# ======================================================================= item 5: bounded parsing
def laughs(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nmodel: [{', '.join([f'*a{levels - 1}'] * 10)}]\n"


@pytest.mark.parametrize("name, text, needle", [
    ("laughs.yaml", laughs(6), "anchors and aliases"),
    ("flow.yaml", "model: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested deeper than"),
    ("block.yaml", "model:\n  " + "- " * 5_000 + "x\n", "nested deeper than"),
    ("indented.yaml", "model:\n" + "".join(" " * (i + 1) + "-\n" for i in range(600)), "nested deeper than"),
    ("latin1.yaml", b"model: caf\xe9\n", "not UTF-8"),
    ("bigint.yaml", "run:\n  seed: " + "9" * 5000 + "\n", "not valid YAML"),
    ("huge.yaml", "model: " + "x" * 300_000 + "\n", "bytes a config file may hold"),
    ("long.yaml", "run:\n  seed: " + "x" * 200_000 + "\n", "field 'run.seed'"),  # the value is echoed, bounded
])
def test_hostile_config_files_give_one_line_naming_the_file(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(path)
    assert time.perf_counter() - t0 < 5
    one_line_refusal(e.value, str(path), needle)
    res, _ = cli("eval", "--config", str(path))  # the CLI: the same line, exit code 2
    assert res.exit_code == 2 and "config error:" in res.output


@pytest.mark.parametrize("override, needle", [
    ("model.name=[&a x, *a]", "anchors and aliases"),
    ("model.name=" + "[" * 5_000 + "]" * 5_000, "nested deeper than"),
    ("model.name=" + "- " * 5_000 + "x", "nested deeper than"),
    ("model.name=" + "x" * 100_000, "characters allowed"),
    ("run.seed=" + "x" * 10_000, "field 'run.seed'"),
    ("run.seed=" + "9" * 5000, "not valid YAML"),
])
def test_hostile_overrides_give_one_line_naming_the_override(override, needle):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [override])
    assert time.perf_counter() - t0 < 5
    one_line_refusal(e.value, needle)


def test_task_files_that_are_not_utf8_or_nest_deeply_are_named(tmp_path):
    bad = tmp_path / "held-out.jsonl"
    bad.write_bytes(b'{"nums": [1, 2, 3], "target": 6}\n{"nums": [1, 2], "target": 3, "solution": "caf\xe9"}\n')
    with pytest.raises(TaskFormatError) as e:
        load_tasks(bad)
    one_line_refusal(e.value, str(bad), "row 2", "not UTF-8")
    from rlcr.runs.task_sets import task_sets

    cfg = RLCRConfig(tasks={"eval_file": str(bad), "num_train": 20})
    with pytest.raises(TaskFormatError) as e:  # where a run reads it
        task_sets(cfg)
    one_line_refusal(e.value, str(bad), "row 2")
    res, _ = cli("eval", f"tasks.eval_file={bad}", "tasks.num_train=20", f"storage.uri={tmp_path}")
    assert res.exit_code == 2 and says(res.output, f"{bad}: row 2") and "Ray" not in res.output


def test_compare_refuses_deeply_nested_provenance_naming_the_file(tmp_path):
    a = write_rows(tmp_path / "a.parquet", eval_rows())
    table = rows_to_table(eval_rows()).replace_schema_metadata(
        {b"rlcr.provenance": b'{"policy": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"})
    pq.write_table(table, tmp_path / "deep.parquet")
    res, took = cli("compare", a, str(tmp_path / "deep.parquet"), f"storage.uri={tmp_path}")
    assert res.exit_code != 0 and says(res.output, "deep.parquet: provenance metadata: nested deeper than")
    assert took < 30


# ======================================================================= item 6: validated ranges
@pytest.mark.parametrize("override", ["run.seed=4294967296", "run.seed=-1", f"run.seed={2**31}", "tasks.eval_seed=-5",
                                      f"tasks.eval_seed={2**32}"])
def test_seeds_out_of_range_are_refused_naming_the_field(override):
    with pytest.raises(ConfigError) as e:
        RLCRConfig.from_yaml(None, [override])
    one_line_refusal(e.value, f"field '{override.split('=')[0]}'")


def test_the_largest_seed_is_safe_for_every_derived_seed():
    from rlcr.config import MAX_SEED
    from rlcr.seeds import eval_salt, mini_batch_seed, mix, rollout_seed, sft_seed, update_seed

    cfg = RLCRConfig(run={"seed": MAX_SEED}, tasks={"eval_seed": MAX_SEED})
    torch.manual_seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)  # the probe's engine seed
    np.random.default_rng(cfg.tasks.eval_seed)  # the bootstrap's
    for iteration in (1, 10**6):
        for epoch in (0, 99):  # the update's permutation: torch.Generator takes seeds below 2**64
            torch.Generator().manual_seed(mini_batch_seed(update_seed(cfg.run.seed, iteration), epoch))
        for draw in (0, 1, 12345):  # engine seeds (vLLM seeds NumPy with them): below 2**32
            seed = rollout_seed(cfg.run.seed, iteration, salt=eval_salt(draw))
            np.random.seed(seed)
            np.random.seed(mix(seed, 1, iteration))
    np.random.seed(sft_seed(cfg.run.seed))


def test_task_numbers_and_targets_share_the_scorers_limit(tmp_path):
    MAX_LITERAL_DIGITS, MAX_TASK_NUMBER = 12, 10**12 - 1  # the scorer's limit: literals of at most 12 digits
    assert compute_score(f"<answer>{MAX_TASK_NUMBER + 1} - 1</answer>",
                         CountdownTask([MAX_TASK_NUMBER + 1, 1], MAX_TASK_NUMBER).ground_truth) == 0.1
    at_limit = CountdownTask([MAX_TASK_NUMBER, 1], MAX_TASK_NUMBER - 1)
    assert compute_score(f"<answer>{MAX_TASK_NUMBER} - 1</answer>", at_limit.ground_truth) == 1.0
    path = tmp_path / "train.jsonl"
    for row, field in (({"nums": [10**20, 1], "target": 10**20 + 1}, "'nums' item 0"),
                       ({"nums": [1, 2], "target": -(MAX_TASK_NUMBER + 1)}, "'target'")):
        path.write_text(json.dumps({"nums": [MAX_TASK_NUMBER, 1], "target": 1}) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(TaskFormatError) as e:
            load_tasks(path)
        one_line_refusal(e.value, str(path), "row 2", field, str(MAX_LITERAL_DIGITS))
    parquet = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"nums": [10**13, 2], "target": 5}]), parquet)
    with pytest.raises(TaskFormatError) as e:
        load_tasks(parquet)
    one_line_refusal(e.value, str(parquet), "row 1", "'nums' item 0")
    with pytest.raises(ConfigError) as e:  # generated tasks too
        RLCRConfig.from_yaml(None, [f"tasks.options.num_range=[1, {10**13}]"])
    one_line_refusal(e.value, "tasks.options.num_range")
    from rlcr.tasks import countdown  # one constant: the loader's limit is the scorer's

    assert (countdown.MAX_LITERAL_DIGITS, countdown.MAX_TASK_NUMBER) == (MAX_LITERAL_DIGITS, MAX_TASK_NUMBER)


# ======================================================================= item 7: evaluation files are checked
def test_compare_refuses_duplicated_answers_merged_tasks_and_nan_confidences(tmp_path):
    good = write_rows(tmp_path / "good.parquet", eval_rows())
    rows = eval_rows()
    cases = {
        "dup.parquet": (rows + rows[:1], "row 9: the same answer as row 1"),
        "dupconf.parquet": (rows + rows[1:2], "row 9: the same confidence as row 2"),
        "merged.parquet": (rows + [dict(rows[2], prompt_id=0, answer_id=1)], "row 9: prompt_id 0 holds task"),
        "prompt.parquet": (rows + [dict(rows[0], answer_id=1, context_text="another")],
                           "row 9: prompt_id 0 was given another prompt"),
        "nan.parquet": (eval_rows(confidence=float("nan")), "row 2: confidence is nan"),
        "range.parquet": (eval_rows(confidence=3.0), "row 2: confidence is 3.0"),
    }
    for name, (bad_rows, needle) in cases.items():
        bad = write_rows(tmp_path / name, bad_rows)
        res, _ = cli("compare", good, bad, f"storage.uri={tmp_path}")
        assert res.exit_code != 0 and says(res.output, f"{bad}: {needle}"), (name, res.output)
    res, _ = cli("compare", good, write_rows(tmp_path / "also-good.parquet", eval_rows(right=False)),
                 f"storage.uri={tmp_path}")
    assert res.exit_code == 0, res.output


def test_eval_records_to_a_uri_are_checked_on_that_store_before_any_work(tmp_path, monkeypatch):
    """`rlcr eval --records <URI>` reads and writes the URI through the store (fsspec's in-memory filesystem
    here), not a local ``./<scheme>:/…`` directory: an existing file there is refused before any work."""
    import fsspec

    monkeypatch.chdir(tmp_path)
    fs = fsspec.filesystem("memory")
    fs.pipe("/rlcr-test-bucket/rows.parquet", b"kept")
    try:
        missing_tasks = f"tasks.eval_file={tmp_path / 'no-such-tasks.jsonl'}"  # old code fails here, after the check
        res, _ = cli("eval", "--records", "memory://rlcr-test-bucket/rows.parquet", missing_tasks)
        assert res.exit_code != 0 and says(res.output, "memory://rlcr-test-bucket/rows.parquet: exists")
        assert fs.cat("/rlcr-test-bucket/rows.parquet") == b"kept"
        res, _ = cli("eval", "--records", "memory://rlcr-test-bucket/rows.csv", missing_tasks)
        assert res.exit_code != 0 and says(res.output, "expected a .parquet file name")
        assert not any(p.name.endswith(":") for p in tmp_path.iterdir())  # no ./memory:/… directory
    finally:
        fs.rm("/rlcr-test-bucket", recursive=True)


def test_eval_writes_its_records_to_s3(s3, ray_local, tiny_model_dir, tmp_path, monkeypatch):
    """The whole command on the tiny model: the rows land in the bucket, create-only, with their provenance,
    and `rlcr compare` reads them back once fetched."""
    from rlcr.storage import Store
    from s3server import BUCKET

    monkeypatch.chdir(tmp_path)
    uri = f"s3://{BUCKET}/{tmp_path.name}/rows.parquet"
    args = ["eval", "--records", uri, f"model.name={tiny_model_dir}", f"storage.s3_endpoint_url={s3.endpoint}",
            f"storage.uri={tmp_path / 'store'}", "tasks.num_train=20", "tasks.num_eval=3",
            "rollout.max_answer_tokens=16", "rollout.max_confidence_tokens=8", "engine.max_model_len=512",
            "engine.kv_cache_gib=0.25", "eval.bootstrap_resamples=100"]
    res, _ = cli(*args)
    assert res.exit_code == 0, res.output
    assert says(res.output, f"per-answer rows: {uri}")
    store = Store(f"s3://{BUCKET}/{tmp_path.name}", endpoint_url=s3.endpoint)
    table = store.read_parquet("rows.parquet")
    assert table.num_rows == 6
    policy = json.loads(table.schema.metadata[b"rlcr.provenance"])["policy"]  # the store's copy of the model dir
    assert policy.startswith(str(tmp_path / "store" / "models")) and (Path(policy) / "config.json").read_bytes() == (
        Path(tiny_model_dir) / "config.json").read_bytes()
    assert not any(p.name.endswith(":") for p in tmp_path.iterdir())
    res = CliRunner().invoke(app, args)  # (the in-process moto server's own log lines may land in this output)
    assert res.exit_code == 2 and says(res.output, f"{uri}: exists; rows are never overwritten")
