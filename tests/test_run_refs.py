"""Issue 48 item 1: runs by name. ``RUN@ITERATION`` resolves through the manifest to the committed, sealed
checkpoint (a one-line error naming the iterations that have one otherwise); ``rlcr eval --checkpoint``,
``rlcr probe --run-id`` and ``model.name`` take it; ``rlcr runs`` lists a store's runs with their state and
``rlcr runs show RUN`` one run's iterations. Runs are built through RunStore's own commits (local store, and
S3 on the moto server for the resolution)."""

import json
import os
import re
import time

import pytest
from typer.testing import CliRunner

from rlcr.config import load_config
from rlcr.runs.lease import RunLease
from rlcr.runs.refs import RunRefError, is_run_ref, iteration_rows, parse_ref, resolve_checkpoint, store_summaries
from rlcr.runs.store import RunStore
from rlcr.storage import Store
from test_user_errors import assert_one_line, run_cli

ATTEMPT = "a1b2c3d4e5f6"


def sealed(store, rel, text="w"):
    """A sealed stand-in checkpoint at ``rel`` (config, weights, tokenizer, a training state)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for name in ("config.json", "tokenizer.json"):
            with open(f"{d}/{name}", "w") as f:
                f.write("{}")
        for name in ("model.safetensors", "training_state.pt"):
            with open(f"{d}/{name}", "w") as f:
                f.write(text)
        os.makedirs(f"{d}/optimizer")  # AdamW by shard, as a sharded (FSDP) save writes it
        for name in (".metadata", "__0_0.distcp", "__1_0.distcp"):
            with open(f"{d}/optimizer/{name}", "w") as f:
                f.write(text)
        return store.put_dir(d, rel)


def make_run(store, run_id="first", *, committed=4, save_every=2, iterations=4, metrics=True):
    """A run whose iterations 1..committed are committed in groups of ``save_every`` (only the last of each
    group saves a checkpoint), with its config and held-out metrics."""
    run = RunStore(store, run_id)
    run.check_config(load_config(None, [f"run.iterations={iterations}", f"orchestration.save_every={save_every}"]))
    k = 1
    while k <= committed:
        last = min(k + save_every - 1, committed)
        uri = sealed(store, run.checkpoint_rel(last, ATTEMPT), f"after {last}")
        for j in range(k, last + 1):
            met = run.write_metrics(j, {"eval": {"accuracy": j / 10, "ece": 0.5 - j / 100}}) if metrics else None
            run.commit(j, {"attempt": ATTEMPT, "metrics_uri": met, "state_uri": uri, "state_iteration": last,
                           "checkpoint_uri": uri if j == last else None})
        k = last + 1
    return run


@pytest.fixture
def local(tmp_path):
    return Store(str(tmp_path / "store"))


def test_a_reference_resolves_to_the_checkpoint_the_manifest_names(store):
    run = make_run(store)
    two = resolve_checkpoint(store, "first@2")
    assert two == run.manifest(2)["checkpoint_uri"] and f"attempt-{ATTEMPT}/checkpoint" in two
    assert store.is_complete(store.rel(two))
    assert resolve_checkpoint(store, "first@latest") == run.manifest(4)["checkpoint_uri"]


def test_an_iteration_without_a_checkpoint_names_those_that_have_one(local):
    make_run(local)
    with pytest.raises(RunRefError, match=r"iteration 3: no checkpoint was saved after it "
                                          r"\(orchestration.save_every\); iterations with a checkpoint: 2, 4"):
        resolve_checkpoint(local, "first@3")
    with pytest.raises(RunRefError, match="no committed iteration 9 .4 committed; iterations with a checkpoint: 2, 4"):
        resolve_checkpoint(local, "first@9")
    with pytest.raises(RunRefError, match="run 'nope' not found under .*runs there: first"):
        resolve_checkpoint(local, "nope@1")


def test_a_pruned_checkpoint_is_named_as_pruned(local):
    run = make_run(local)
    run.prune_checkpoints(1)
    with pytest.raises(RunRefError, match="iteration 2: its checkpoint was pruned .*with a checkpoint: 4$"):
        resolve_checkpoint(local, "first@2")
    assert resolve_checkpoint(local, "first@latest") == run.manifest(4)["checkpoint_uri"]


def test_iteration_zero_is_the_runs_starting_point(local):
    run = make_run(local, committed=1, save_every=1)
    with pytest.raises(RunRefError, match="no checkpoint at iteration 0"):
        resolve_checkpoint(local, "first@0")
    copy = sealed(local, "models/" + "0" * 32)
    run.record_initial_model({"source": "x", "model": "models/" + "0" * 32, "content_id": local.content_id(
        "models/" + "0" * 32)})
    assert resolve_checkpoint(local, "first@0") == copy
    warm = sealed(local, RunStore.standalone_checkpoint_rel("sft-0", 0))  # where `rlcr sft` saves
    assert resolve_checkpoint(local, "sft-0@0") == warm


def test_what_is_a_reference():
    assert parse_ref("first@2") == ("first", 2) and parse_ref("first@latest") == ("first", None)
    assert parse_ref("a@b@3") == ("a@b", 3)  # a run id may hold '@': the iteration follows the last one
    for other in ("Qwen/Qwen2.5-0.5B@2", "s3://bucket/runs/first@2", "./first@2", "first", "first@x",
                  "smollm2-135m-instruct", "first@", "/abs/first@2"):
        assert not is_run_ref(other) and parse_ref(other) is None, other
    with pytest.raises(RunRefError, match="invalid run id"):
        parse_ref("..@2")


def test_model_name_reference_is_copied_into_models(local):
    from rlcr.models.source import import_model, model_kind

    make_run(local)
    assert model_kind("first@2") == "run"
    uri = import_model("first@2", local)
    rel = local.rel(uri)
    assert re.fullmatch(r"models/[0-9a-f]{32}", rel) and local.is_complete(rel)
    files = set(local.parse_seal(rel)["files"])
    assert "model.safetensors" in files and "training_state.pt" not in files
    assert not [f for f in files if f.startswith("optimizer/")]  # a new run starts a fresh AdamW


# ------------------------------------------------------------------------------------------ listing
def test_states_of_runs(local, tmp_path):
    make_run(local, "done", committed=2, save_every=1, iterations=2)
    make_run(local, "stopped", committed=1, save_every=1, iterations=4)
    crashed = make_run(local, "crashed", committed=1, save_every=1, iterations=4)
    doc = {"token": "f" * 32, "owner": "flow", "user": "u", "host": "elsewhere", "machine": "other/boot", "pid": 7,
           "heartbeat_at": time.time() - 3600, "timeout_s": 60}
    local.write_json(crashed.lease_rel, doc)
    live = make_run(local, "live", committed=1, save_every=1, iterations=4)
    bad = make_run(local, "bad", committed=1, save_every=1, iterations=4)
    local.write_bytes(bad.manifest_rel(1), b'{"iteration": "\\u001b[31mone"}')  # a terminal escape in a field
    (tmp_path / "store" / "runs" / "..hidden").mkdir()
    with RunLease(live, owner="test"):
        rows, total = store_summaries(local)
    by = {r["id"]: r for r in rows}
    assert total == 5 and set(by) == {"done", "stopped", "crashed", "live", "bad"}
    assert {k: by[k]["state"] for k in by} == {"done": "finished", "stopped": "stopped", "crashed": "crashed",
                                                 "live": "running", "bad": "invalid"}
    assert "\x1b" not in by["bad"]["problem"] and "iteration" in by["bad"]["problem"]
    assert by["done"]["checkpoints"] == [1, 2] and by["done"]["accuracy"] == 0.2
    assert by["done"]["task"] == "countdown" and by["done"]["method"] == "rlcr"
    assert store_summaries(local, limit=2)[0][-1]["id"] == "stopped"  # bounded: the last names only


def cli(args, width=80):
    """The CLI in-process, its console as wide as an 80-column terminal."""
    from rlcr.cli import app
    from rlcr.ui.presentation import console

    before, console.width = console.width, width
    try:
        return CliRunner().invoke(app, args, terminal_width=width)
    finally:
        console.width = before


def test_rlcr_runs_lists_the_store_within_80_columns(local):
    make_run(local, "first")
    make_run(local, "a-rather-long-run-name-for-the-table-20250101", committed=1, save_every=1)
    res = cli(["runs", f"storage.uri={local.url()}"])
    assert res.exit_code == 0, res.output
    assert "first" in res.output and "stopped" in res.output and "2, 4" in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80, res.output


def test_rlcr_runs_show_lists_references(local):
    make_run(local, "first")
    res = cli(["runs", "show", "first", f"storage.uri={local.url()}"])
    assert res.exit_code == 0, res.output
    assert "first@2" in res.output and "first@4" in res.output and "first@3" not in res.output
    assert [r["checkpoint"] for r in iteration_rows(local, "first")] == [None, "first@2", None, "first@4"]
    assert max(len(line) for line in res.output.splitlines()) <= 80, res.output


@pytest.mark.parametrize("args, needle", [
    (["eval", "--checkpoint", "first@3"], "--checkpoint: run 'first', iteration 3: no checkpoint was saved"),
    (["probe", "--run-id", "first@3"], "--run-id: run 'first', iteration 3: no checkpoint was saved"),
    (["train", "--run-id", "new", "model.name=first@3"], "model.name: run 'first', iteration 3"),
    (["runs", "show", "nope"], "run 'nope' not found"),
    (["eval", "--checkpoint", "ghost@latest"], "--checkpoint: run 'ghost' not found"),
])
def test_a_reference_that_names_nothing_is_one_line_before_ray(tmp_path, args, needle):
    make_run(Store(str(tmp_path / "store")))
    rc, lines, imported, took = run_cli([*args, f"storage.uri={tmp_path / 'store'}"], tmp_path)
    assert_one_line(rc, lines, imported, took, needle)
    assert "2, 4" in lines[0] or "not found" in lines[0]
    assert json.dumps(lines)  # nothing unprintable
