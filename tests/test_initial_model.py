"""A run holds its initial model (issue items 2 and 11): another run's checkpoint given as ``model.name`` is
copied into the store's ``models/`` (its run pruning it changes nothing here), dead attempts' checkpoints are
pruned, and a resume uses the model the run started with, whatever its source directory holds now."""

import json
import shutil

import pytest

from rlcr.models.source import import_model
from rlcr.runs.store import RunStore
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


def test_a_resume_uses_the_model_the_run_started_with_naming_both_digests(plain_model, tmp_path):
    """The run's model directory changes between its start and its resume: the resume keeps the initial policy
    (the KL reference, the tokenizer) it started with and says so, naming both digests; a store copy rewritten
    under the run is refused, naming both content ids."""
    from rlcr.config import RLCRConfig
    from rlcr.models.source import ModelSourceError, content_digest, run_initial_model
    from rlcr.runs.store import RunLease

    cfg = RLCRConfig.from_dict({"model.name": str(plain_model), "storage.uri": str(tmp_path / "store")})
    run, warnings, cache = RunStore.open(cfg, "r"), [], tmp_path / "cache"
    with RunLease(run, owner="start") as lease:
        started = run_initial_model(cfg, run, lease=lease, cache_dir=cache, warn=warnings.append)
    assert warnings == [] and started.startswith(run.store.url("models/"))
    assert run.initial_model()["model"] == run.store.rel(started)
    doc = json.loads((plain_model / "config.json").read_text())
    (plain_model / "config.json").write_text(json.dumps({**doc, "rlcr_edit": 1}))  # changed before the resume
    with RunLease(run, owner="resume") as lease:
        resumed = run_initial_model(cfg, run, lease=lease, cache_dir=cache, warn=warnings.append)
    assert resumed == started
    assert "rlcr_edit" not in json.loads((fetch_checkpoint(resumed) / "config.json").read_text())
    now = content_digest(plain_model, cache_dir=cache)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert started.rsplit("/", 1)[1] in warnings[0] and now in warnings[0] and now != started.rsplit("/", 1)[1]

    recorded = run.initial_model()["content_id"]
    run.store.put_dir(plain_model, run.store.rel(started))  # the copy rewritten under the run: a new seal
    with pytest.raises(ModelSourceError) as e:
        run_initial_model(cfg, run, cache_dir=cache)
    assert recorded in str(e.value) and run.store.content_id(run.store.rel(started)) in str(e.value)
