"""A run holds its initial model (issue items 2 and 11): another run's checkpoint given as ``model.name`` is
copied into the store's ``models/`` (its run pruning it changes nothing here), dead attempts' checkpoints are
pruned, and a resume uses the model the run started with, whatever its source directory holds now."""

import json
import shutil

import pytest

from rlcr.model_source import import_model
from rlcr.runs import RunStore
from rlcr.storage import COMPLETE_MARKER, fetch_checkpoint


@pytest.fixture
def plain_model(tiny_model_dir, tmp_path):
    d = tmp_path / "my-model"
    shutil.copytree(tiny_model_dir, d, ignore=shutil.ignore_patterns(COMPLETE_MARKER))
    return d


def _save_model(run, k, model_dir, tmp_path, attempt="a1b2c3d4e5f6"):
    """Commit iteration k of ``run`` as a save whose checkpoint is the model (plus a training state)."""
    src = tmp_path / f"ckpt-{run.run_id}-{k}"
    shutil.copytree(model_dir, src)
    (src / "training_state.pt").write_bytes(b"adamw state %d" % k)
    rel = run.checkpoint_rel(k, attempt)
    uri = run.store.put_dir(src, rel)
    run.commit(k, {"attempt": attempt, "checkpoint_uri": uri, "state_uri": uri, "state_iteration": k})
    return uri


def test_another_runs_checkpoint_as_the_model_survives_that_run_pruning_it(store, plain_model, tmp_path):
    source = RunStore(store, "teacher")
    first = _save_model(source, 1, plain_model, tmp_path)
    _save_model(source, 2, plain_model, tmp_path)
    initial = import_model(first, store, cache_dir=tmp_path / "cache")  # the student run's model.name
    assert initial.startswith(store.url("models/")) and initial != first
    assert source.prune_checkpoints(1) == [first]  # the teacher keeps only its newest save
    assert store.is_complete(store.rel(initial))  # the student's initial policy and KL reference stay
    local = fetch_checkpoint(initial, endpoint_url=store.endpoint_url, cache_dir=tmp_path / "ckpt")
    assert (local / "model.safetensors").read_bytes() == (plain_model / "model.safetensors").read_bytes()
    if not store.is_local:  # a copy of a sealed checkpoint leaves its training state behind
        assert not (local / "training_state.pt").exists()
    assert import_model(first.replace("iter-0001", "iter-0002"), store, cache_dir=tmp_path / "cache") != initial
