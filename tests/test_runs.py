"""Run bookkeeping: unique run ids, one writer per run (lease), create-only commits — local and S3 (moto)."""

import time

import pytest

from rlcr.runs.store import AlreadyCommitted, LeaseLost, RunLease, RunLocked, RunStore, new_run_id
from rlcr.storage import Store, validate_run_id


@pytest.fixture
def run(store):
    """A run on a local store and on S3 in turn."""
    return RunStore(store, "exp 1")


def test_generated_run_ids_are_unique_and_valid():
    ids = [new_run_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(validate_run_id(i) for i in ids)


def test_run_store_refuses_an_escaping_run_id(tmp_path):
    with pytest.raises(ValueError, match="invalid run id"):
        RunStore(Store(str(tmp_path)), "../../x")
    assert list(tmp_path.iterdir()) == []


def test_second_writer_fails_at_once_naming_the_holder(run):
    with RunLease(run, owner="flow run A"):
        t0 = time.monotonic()
        with pytest.raises(RunLocked, match="flow run A") as err:
            RunLease(run, owner="flow run B").acquire()
        assert time.monotonic() - t0 < 5
        assert "pid" in str(err.value) and "heartbeat" in str(err.value)
    # released: the next writer gets it
    with RunLease(run, owner="flow run C") as lease:
        lease.check()


def test_heartbeat_keeps_a_live_lease_and_a_dead_one_is_taken_over(run):
    live = RunLease(run, owner="live", timeout_s=1.0, heartbeat_s=0.2).acquire()
    time.sleep(1.5)  # longer than the timeout: only the heartbeat keeps it
    with pytest.raises(RunLocked, match="live"):
        RunLease(run, owner="other", timeout_s=1.0, heartbeat_s=0.2).acquire()
    live._stop.set()  # the holder dies: no more heartbeats, no release
    live._thread.join()
    time.sleep(1.3)
    heir = RunLease(run, owner="heir", timeout_s=1.0, heartbeat_s=0.2).acquire()
    with pytest.raises(LeaseLost, match="taken over"):
        live.check()
    with pytest.raises(LeaseLost):
        run.commit(1, {}, lease=live)  # the old writer can no longer commit
    assert run.manifest(1) is None
    run.commit(1, {}, lease=heir)
    heir.release()
    assert not run.store.exists(run.lease_rel)


def test_commit_is_create_only_and_in_order(run):
    with pytest.raises(RuntimeError, match="iteration 1 is not committed"):
        run.commit(2, {"x": 1})
    run.commit(1, {"x": "first"})
    with pytest.raises(AlreadyCommitted, match="already committed"):
        run.commit(1, {"x": "second"})
    assert run.manifest(1)["x"] == "first"
    assert [m["iteration"] for m in run.committed()] == [1]


def test_a_killed_holder_on_this_machine_is_taken_over_at_once(run):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    holder = RunLease(run, owner="killed flow").acquire()
    holder._stop.set()
    holder._thread.join()
    # rewrite the lease as if that dead process had held it (same machine, its pid gone, heartbeat fresh)
    import json

    raw, version = run.store.read_versioned(run.lease_rel)
    doc = json.loads(raw)
    doc["pid"] = proc.pid
    run.store.write_if_version(run.lease_rel, json.dumps(doc).encode(), version)
    with RunLease(run, owner="resumed flow") as heir:  # no wait for the timeout
        heir.check()


def test_resume_accepts_operational_changes_and_names_result_changing_ones(tmp_path):
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunConfigMismatch

    cfg = RLCRConfig(storage={"uri": str(tmp_path)}, model={"name": "m"})
    run = RunStore.open(cfg, "r")
    run.check_config(cfg)
    run.check_config(cfg.model_copy(update={"orchestration.retries": 7, "rollout.progress": True, "run.iterations": 9}))
    saved = run.store.read_json(run.config_rel)
    del saved["config"]["method"]["lambda_conf"]  # as if written before the field existed: its default reproduces it
    saved["config_hash"] = "older-version"
    run.store.write_json(run.config_rel, saved)
    run.check_config(cfg)
    with pytest.raises(RunConfigMismatch, match="method.lambda_conf") as err:
        run.check_config(cfg.model_copy(update={"method.lambda_conf": 0.5, "orchestration.retries": 1}))
    assert "retries" not in str(err.value)


@pytest.mark.parametrize("garbage", [b"{not json", b"[1, 2]",
                                     b'{"heartbeat_at": "soon", "pid": "x", "timeout_s": null}'])
def test_an_unreadable_lease_is_taken_over_not_a_crash(run, garbage):
    run.store.write_bytes(run.lease_rel, garbage)
    with RunLease(run, owner="next") as lease:
        lease.check()


def test_every_path_of_a_run_comes_from_its_layout(tmp_path):
    """Issue 31 item 5: the run's layout names the paths that other modules used to build themselves (the
    trainer's standalone checkpoint, the pipeline's standalone rollouts, the probe reports)."""
    from rlcr.runs.layout import RunLayout

    run = RunStore(Store(str(tmp_path)), "lr=1e-5 exp@1")
    assert RunStore.standalone_checkpoint_rel("lr=1e-5 exp@1", 3) == "runs/lr=1e-5 exp@1/iter-0003/checkpoint"
    assert RunStore.standalone_checkpoint_rel("sft-0", 0) == RunStore(run.store, "sft-0").checkpoint_rel(0)
    assert RunLayout.standalone_rollouts_rel("r", 2) == "runs/r/iter-0002/rollouts/rollouts.parquet"
    assert run.rollouts_rel(2, "abc") == f"{run.iteration_dir(2)}/attempt-abc/rollouts/rollouts.parquet"
    assert run.probe_rel("20260101T000000Z", "report.json") == \
        "runs/lr=1e-5 exp@1/probes/20260101T000000Z/report.json"
    for bad in ("../x", "a/b"):
        with pytest.raises(ValueError, match="invalid run id"):
            RunStore.standalone_checkpoint_rel(bad, 1)


def _save(run, k, attempt="a1b2c3d4e5f6", lease=None):
    """Commit iteration k as a save: a sealed checkpoint in its attempt's folder, named by its manifest."""
    rel = run.checkpoint_rel(k, attempt)
    with run.store.writing_dir(rel) as tmp:
        (tmp / "model.safetensors").write_bytes(b"weights %d" % k)
    uri = run.store.url(rel)
    run.commit(k, {"attempt": attempt, "checkpoint_uri": uri, "state_uri": uri, "state_iteration": k}, lease=lease)
    return rel


def test_pruning_keeps_the_newest_saves_and_every_manifest(run):
    rels = [_save(run, k) for k in (1, 2, 3)]
    covered = run.checkpoint_rel(5, "a1b2c3d4e5f6")  # iteration 4 staged, committed with the state saved after 5
    with run.store.writing_dir(covered) as tmp:
        (tmp / "model.safetensors").write_bytes(b"weights 5")
    uri = run.store.url(covered)
    run.commit(4, {"attempt": "a1b2c3d4e5f6", "checkpoint_uri": None, "state_uri": uri, "state_iteration": 5})
    run.commit(5, {"attempt": "a1b2c3d4e5f6", "checkpoint_uri": uri, "state_uri": uri, "state_iteration": 5})

    removed = run.prune_checkpoints(2)
    assert removed == [run.store.url(r) for r in rels[:2]]
    assert not run.store.exists(rels[0]) and not run.store.exists(rels[1])
    assert run.store.is_complete(rels[2]) and run.store.is_complete(covered)
    assert [m["iteration"] for m in run.committed()] == [1, 2, 3, 4, 5]  # the iterations stay committed
    assert run.verified_state(run.last_committed()) == uri  # the resume point is intact
    assert run.prune_checkpoints(2) == []  # nothing left to remove
    assert run.prune_checkpoints(1) == [run.store.url(rels[2])] and run.store.is_complete(covered)
    with pytest.raises(ValueError, match=">= 1"):
        run.prune_checkpoints(0)


def test_a_writer_that_lost_its_lease_prunes_nothing(run):
    stale = RunLease(run, owner="stale", timeout_s=1.0, heartbeat_s=0.2).acquire()
    rels = [_save(run, k, lease=stale) for k in (1, 2)]
    stale._stop.set()
    stale._thread.join()
    time.sleep(1.3)
    heir = RunLease(run, owner="heir", timeout_s=1.0, heartbeat_s=0.2).acquire()
    try:
        with pytest.raises(LeaseLost):
            run.prune_checkpoints(1, lease=stale)
        assert all(run.store.is_complete(r) for r in rels)
        assert run.prune_checkpoints(1, lease=heir) == [run.store.url(rels[0])]
    finally:
        heir.release()


def test_pruning_removes_only_a_manifests_own_checkpoint_folder(run, caplog):
    victim = RunStore(run.store, "victim")
    elsewhere = victim.checkpoint_rel(1, "a1b2c3d4e5f6")  # another run's sealed checkpoint
    with run.store.writing_dir(elsewhere) as tmp:
        (tmp / "model.safetensors").write_bytes(b"not yours")
    uri = run.store.url(elsewhere)
    run.commit(1, {"attempt": "a1b2c3d4e5f6", "checkpoint_uri": uri, "state_uri": uri, "state_iteration": 1})
    _save(run, 2)
    with caplog.at_level("WARNING"):
        assert run.prune_checkpoints(1) == []
    assert run.store.is_complete(elsewhere) and "left in place" in caplog.text


def test_the_checkpoints_of_attempts_that_died_before_committing_are_pruned(run):
    """Attempt ``dead`` saved iterations 2 and 3 and died before committing them; the next writer re-ran and
    committed 2. Only the dead attempt's checkpoint under the committed iteration goes (its other files stay,
    and an uncommitted iteration's attempts are never touched: one may be the live writer's)."""
    dead = "deadbeef0001"
    leftovers = [run.checkpoint_rel(k, dead) for k in (2, 3)]
    for rel in leftovers:
        with run.store.writing_dir(rel) as tmp:
            (tmp / "model.safetensors").write_bytes(b"never committed")
    run.store.write_json(run.metrics_rel(2, dead), {"loss": 1.0})
    _save(run, 1)
    committed = _save(run, 2)
    stale = RunLease(run, owner="stale", timeout_s=1.0, heartbeat_s=0.2).acquire()
    stale._stop.set()  # a writer that lost its lease removes nothing
    stale._thread.join()
    time.sleep(1.3)
    heir = RunLease(run, owner="heir", timeout_s=1.0, heartbeat_s=0.2).acquire()
    try:
        with pytest.raises(LeaseLost):
            run.prune_dead_attempts([1, 2, 3], lease=stale)
        assert run.store.is_complete(leftovers[0])
        assert run.prune_dead_attempts([1, 2, 3], lease=heir) == [run.store.url(leftovers[0])]
    finally:
        heir.release()
    assert not run.store.exists(leftovers[0]) and run.store.is_complete(leftovers[1])
    assert run.store.is_complete(committed) and run.store.exists(run.metrics_rel(2, dead))
    assert run.verified_state(run.last_committed()) == run.store.url(committed)
    assert run.prune_dead_attempts([1, 2, 3]) == []
