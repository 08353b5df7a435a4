"""Issue 30: fenced writes, clock-independent takeover, validated manifests, a movable store, any run id.

Local stores (fast); the lease's behaviour on S3 is covered by tests/test_runs.py's ``run[s3]`` cases."""

import json
import os
import re
import shutil
import time

import pytest

from rlcr.runs.store import PROCESS_ATTEMPT, AlreadyCommitted, LeaseLost, RunLease, RunLocked, RunStore
from rlcr.storage import Store


@pytest.fixture
def run(tmp_path):
    return RunStore(Store(str(tmp_path / "store")), "exp 1")


def seal_dir(run, rel, text):
    """A sealed directory at ``rel`` with one file (a stand-in for a checkpoint upload)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/weights.txt", "w") as f:
            f.write(text)
        return run.store.put_dir(d, rel)


def stall(lease):
    """The holder stops heartbeating (as if SIGSTOPped): its thread ends, nothing is released."""
    lease._stop.set()
    lease._thread.join()


def test_a_writer_that_lost_its_lease_can_write_nothing(run):
    """Item 2: A stages iteration 1, stalls past the timeout; B takes over and commits 1; A resumes."""
    a = RunLease(run, owner="A", timeout_s=1.0, heartbeat_s=0.2).acquire()
    run.stage(1, {"policy_in": "m"}, {"who": "A"}, lease=a)
    stall(a)
    time.sleep(1.2)
    b = RunLease(run, owner="B", timeout_s=1.0, heartbeat_s=0.2).acquire()
    run.stage(1, {"policy_in": "m"}, {"who": "B"}, lease=b)
    uri = seal_dir(run, run.checkpoint_rel(1, b.attempt), "B's weights")
    run.commit_staged([1], uri, 1, lease=b)
    committed = run.manifest(1)
    b_seal = run.store.read_bytes(f"{run.checkpoint_rel(1)}/_COMPLETE")
    # A resumes: every write it tries is refused with LeaseLost, and B's artifacts stay as they are
    for attempt in (lambda: run.checkpoint_fence(1, a), lambda: run.write_metrics(1, {"who": "A"}, lease=a),
                    lambda: run.write_eval_records(1, None, lease=a), lambda: run.write_rollouts(1, None, lease=a),
                    lambda: run.write_baseline({"who": "A"}, lease=a),
                    lambda: run.stage(2, {}, {"who": "A"}, lease=a), lambda: run.commit(2, {}, lease=a)):
        with pytest.raises(LeaseLost):
            attempt()
    assert run.metrics(1) == {"who": "B"} and run.metrics_rel(1) == run.metrics_rel(1, b.attempt)
    assert run.store.read_bytes(f"{run.checkpoint_rel(1)}/_COMPLETE") == b_seal
    assert run.manifest(1) == committed and run.manifest(2) is None
    assert not run.store.exists(run.baseline_rel)
    # and the holder itself may not rewrite a committed iteration's artifacts either
    for attempt in (lambda: run.write_metrics(1, {}, lease=b), lambda: run.checkpoint_fence(1, b),
                    lambda: run.stage(1, {}, {}, lease=b)):
        with pytest.raises(AlreadyCommitted):
            attempt()
    b.release()


def test_a_stalled_writer_past_its_checks_cannot_replace_what_another_committed(run, monkeypatch):
    """Item 2: A stages iteration 1 and passes every check, then stalls (SIGSTOP) past the lease timeout; B takes
    over and commits 1; A wakes *after* its checks and uploads its checkpoint, metrics, rollouts, held-out rows
    and draft anyway. Everything B committed is unchanged and resume from B's manifest verifies: A's writes
    land in A's attempt's paths, which no manifest names."""
    import pyarrow as pa

    from flows.tasks import save_task
    from rlcr.runs.store import check_fence

    class Uploader:  # the trainer's rank 0: its fence check (passed before the stall), then the upload
        def __init__(self, text):
            self.text = text

        def ensure_running(self):
            pass

        def save(self, rel, *, extra=None, fence=None, background=False):
            assert not background  # save_task's default: the write is waited for
            if fence is not None and not passed.get(fence["token"]):
                check_fence(run.store, fence)
            return seal_dir(run, rel, self.text)

    passed = {}
    a = RunLease(run, owner="A", timeout_s=1.0, heartbeat_s=0.2).acquire()
    run.stage(1, {"policy_in": "m"}, {"who": "A"}, lease=a)
    check_fence(run.store, run.checkpoint_fence(1, a))  # A's last checks pass …
    passed[a.token] = True
    stall(a)  # … and then it stalls past the timeout
    time.sleep(1.2)
    b = RunLease(run, owner="B", timeout_s=1.0, heartbeat_s=0.2).acquire()
    run.stage(1, {"policy_in": "m", "rollouts_uri": run.write_rollouts(1, pa.table({"who": ["B"]}), lease=b),
                  "records_uri": run.write_eval_records(1, pa.table({"who": ["B"]}), lease=b)}, {"who": "B"}, lease=b)
    uri = save_task.fn(Uploader("B's weights"), run, 1, {}, b)
    run.commit_staged([1], uri, 1, lease=b)
    committed = run.manifest(1)
    files = {key: run.store.read_bytes(run.store.rel(committed[key]))
             for key in ("metrics_uri", "rollouts_uri", "records_uri")}
    b_seal = run.store.read_bytes(run.store.rel(committed["checkpoint_uri"]) + "/_COMPLETE")

    # A wakes up past its checks (they passed before the stall): its writes go through unchecked
    monkeypatch.setattr(RunStore, "guard", lambda self, iteration, lease, what: None)
    monkeypatch.setattr(RunStore, "checkpoint_fence", lambda self, iteration, lease: {
        "lease_rel": self.lease_rel, "token": lease.token, "manifest_rel": self.manifest_rel(iteration)})
    a_uri = save_task.fn(Uploader("A's late weights"), run, 1, {}, a)
    run.stage(1, {"policy_in": "m"}, {"who": "A"}, lease=a)
    run.write_metrics(1, {"who": "A", "late": True}, lease=a)
    run.write_rollouts(1, pa.table({"who": ["A"]}), lease=a)
    run.write_eval_records(1, pa.table({"who": ["A"]}), lease=a)
    monkeypatch.undo()

    assert a_uri != committed["checkpoint_uri"]
    assert run.manifest(1) == committed and committed["attempt"] == b.attempt
    assert run.store.read_bytes(run.store.rel(committed["checkpoint_uri"]) + "/_COMPLETE") == b_seal
    assert {key: run.store.read_bytes(run.store.rel(committed[key])) for key in files} == files
    assert (run.metrics(1) == {"who": "B"}
            and run.store.read_parquet(run.eval_records_rel(1)).to_pylist() == [{"who": "B"}])
    assert run.verified_state(run.last_committed()) == committed["checkpoint_uri"] == uri
    b.release()


def test_a_run_from_before_attempts_still_reads_and_finishes_its_group(run):
    """Old manifests name ``iter-<k>/checkpoint`` and ``iter-<k>/metrics.json``; old drafts are
    ``iter-<k>/pending.json``: all still resolve, and a group a crash interrupted is finished from them."""
    for k in (1, 2):
        run.store.write_json(f"{run.iteration_dir(k)}/metrics.json", {"k": k})
        run.store.write_json(f"{run.iteration_dir(k)}/pending.json",
                             {"policy_in": "m", "metrics_uri": f"iter-{k:04d}/metrics.json"})
    uri = seal_dir(run, f"{run.iteration_dir(2)}/checkpoint", "w")
    draft = run.store.read_json(f"{run.iteration_dir(1)}/pending.json")
    run.store.write_json(run.manifest_rel(1), {**draft, "run_id": run.run_id, "iteration": 1, "state_uri":
                                               "iter-0002/checkpoint", "state_iteration": 2,
                                               "state_content_id": run.store.content_id(run.store.rel(uri))})
    run.store.rm(f"{run.iteration_dir(1)}/pending.json")
    assert run.pending() == [2] and run.metrics(2) == {"k": 2}  # staged: its legacy draft names its metrics
    assert run.finish_group() and [m["iteration"] for m in run.committed()] == [1, 2]
    assert [run.metrics(k) for k in (1, 2)] == [{"k": 1}, {"k": 2}] and run.pending() == []
    assert run.checkpoint_rel(2) == f"{run.iteration_dir(2)}/checkpoint" and run.verified_state(run.manifest(2)) == uri
    assert run.eval_records_rel(2) == f"{run.iteration_dir(2)}/eval.parquet" and run.eval_table(2) is None


def test_the_worker_side_fence_refuses_after_a_takeover(run):
    """Item 2: the trainer worker's last check before an upload (check_fence) sees a lost lease and a commit."""
    from rlcr.runs.store import check_fence

    a = RunLease(run, owner="A", timeout_s=1.0, heartbeat_s=0.2).acquire()
    fence = run.checkpoint_fence(1, a)
    check_fence(run.store, fence)
    stall(a)
    time.sleep(1.2)
    with RunLease(run, owner="B", timeout_s=1.0, heartbeat_s=0.2):
        with pytest.raises(LeaseLost, match="taken over"):
            check_fence(run.store, fence)


def test_a_rewritten_state_stops_resume_and_finish_group_naming_both_ids(run):
    """Item 2 (read side): the manifest's state_content_id must be the checkpoint's seal."""
    for k in (1, 2):
        run.stage(k, {"policy_in": "m"}, {"k": k})
    uri = seal_dir(run, run.checkpoint_rel(2, PROCESS_ATTEMPT), "B")
    run.commit_staged([1], uri, 2)  # a crash after committing 1 of the group {1, 2}
    recorded = run.manifest(1)["state_content_id"]
    seal_dir(run, run.store.rel(uri), "tampered")  # the committed state rewritten after the commit (by hand)
    actual = run.store.content_id(run.store.rel(uri))
    for attempt in (run.finish_group, lambda: run.verified_state(run.last_committed())):
        with pytest.raises(RuntimeError) as err:
            attempt()
        assert recorded in str(err.value) and actual in str(err.value)
    assert run.manifest(2) is None


def _fake_holder(run, **fields):
    doc = {"run_id": run.run_id, "owner": "other machine", "token": "t" * 32, "host": "elsewhere",
           "machine": "elsewhere/boot", "pid": 4242, "user": "u", "acquired_at": time.time(),
           "heartbeat_at": time.time(), "timeout_s": 60.0}
    doc.update(fields)
    run.store.write_bytes(run.lease_rel, json.dumps(doc).encode())


def test_a_live_holder_with_a_skewed_clock_is_not_taken_over(run, monkeypatch):
    """Item 3: the taker's clock is 61 s ahead of a holder that heartbeats every 0.2 s: no takeover."""
    import threading

    holder = RunLease(run, owner="holder", timeout_s=60.0, heartbeat_s=0.2).acquire()
    main = threading.main_thread()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + (61 if threading.current_thread() is main else 0))
    time.sleep(0.3)  # a renew with the holder's (real) clock
    t0 = time.monotonic()
    with pytest.raises(RunLocked, match="holder") as err:
        RunLease(run, owner="taker", timeout_s=60.0, heartbeat_s=0.2).acquire()
    assert time.monotonic() - t0 < 10 and "-" not in str(err.value).split("heartbeat", 1)[-1].split(";")[0]
    holder.check()  # still ours
    holder.release()


def test_a_holder_clock_an_hour_ahead_is_not_printed_as_a_negative_age(run, monkeypatch):
    """Item 3: a live holder whose clock is 1 h ahead: not taken over, and never "-3600 s ago"."""
    import threading

    holder = RunLease(run, owner="holder", timeout_s=5.0, heartbeat_s=0.2).acquire()
    main, real = threading.main_thread(), time.time
    monkeypatch.setattr(time, "time", lambda: real() + (0 if threading.current_thread() is main else 3600))
    time.sleep(0.3)  # a renew by the holder's clock
    with pytest.raises(RunLocked, match="holder") as err:
        RunLease(run, owner="taker", timeout_s=5.0, heartbeat_s=1.0).acquire()
    assert "-3600" not in str(err.value) and "-359" not in str(err.value) and "ahead" in str(err.value)
    holder.check()
    holder.release()


@pytest.mark.parametrize("timeout", ["Infinity", "1e308"])
def test_a_dead_holders_own_timeout_cannot_lock_the_run_forever(run, timeout):
    """Item 3: a dead holder on another machine claiming timeout_s Infinity / 1e308 is taken over after the
    taker's own timeout of watching an unchanged lease."""
    _fake_holder(run, heartbeat_at=time.time() - 30)
    raw = run.store.read_bytes(run.lease_rel).replace(b'"timeout_s": 60.0', f'"timeout_s": {timeout}'.encode())
    run.store.write_bytes(run.lease_rel, raw)
    t0 = time.monotonic()
    with RunLease(run, owner="heir", timeout_s=1.0, heartbeat_s=0.2) as heir:
        heir.check()
    assert time.monotonic() - t0 < 10


def test_a_stalled_holder_fences_itself_before_any_taker_can_take_over(run):
    """Item 3: the holder trusts its lease only for 0.9 × timeout after its last renew (monotonic clock)."""
    lease = RunLease(run, owner="A", timeout_s=1.0, heartbeat_s=0.2).acquire()
    stall(lease)
    time.sleep(0.95)
    with pytest.raises(LeaseLost, match="no heartbeat"):
        lease.check()


@pytest.mark.parametrize("pid", [2 ** 70, -5, "12"])
def test_a_lease_with_an_impossible_pid_is_no_crash(run, pid):
    """Item 6: a pid of 2^70 gave OverflowError; an invalid lease is taken over (its holder cannot renew it)."""
    import socket

    from rlcr.runs.lease import machine_id

    _fake_holder(run, pid=pid, machine=machine_id(), host=socket.gethostname())
    with RunLease(run, owner="next") as lease:
        lease.check()


@pytest.mark.parametrize("edit, problem", [
    (lambda raw: raw[:20], "not valid JSON"),
    (lambda raw: b"[1, 2]", "expected a JSON object"),
    (lambda raw: raw.replace(b'"iteration": 1', b'"iteration": "one"'), "'iteration'"),
    (lambda raw: raw.replace(b'"state_iteration": 1', b'"state_iteration": 1e6'), "'state_iteration'"),
    (lambda raw: raw.replace(b'"state_iteration": 1', b'"state_iteration": 1000000'), "does not match"),
    (lambda raw: re.sub(rb'"state_uri": "[^"]*"', b'"state_uri": 7', raw), "'state_uri'"),
    (lambda raw: raw.replace(b'"attempt": "', b'"attempt": "../'), "'attempt'"),
    (lambda raw: raw.replace(b'"rollouts_uri": "r"', b'"rollouts_uri": {"a": 1}'), "'rollouts_uri'"),
])
def test_a_corrupt_manifest_gives_one_line_naming_the_file(run, edit, problem):
    """Item 5: JSONDecodeError / KeyError / TypeError / a long loop became one line naming the manifest."""
    from rlcr.untrusted import InvalidInput

    run.stage(1, {"policy_in": "m", "rollouts_uri": "r"}, {})
    run.commit_staged([1], seal_dir(run, run.checkpoint_rel(1, PROCESS_ATTEMPT), "w"), 1)
    rel = run.manifest_rel(1)
    raw = json.dumps(json.loads(run.store.read_bytes(rel)), sort_keys=True).encode()
    assert (b'"state_iteration": 1' in raw
            and f'"state_uri": "iter-0001/attempt-{PROCESS_ATTEMPT}/checkpoint"'.encode() in raw)
    os.unlink(run.store._abs(rel))
    run.store.write_bytes(rel, edit(raw))
    for read in (run.committed, run.finish_group, lambda: run.pending()):
        t0 = time.monotonic()
        with pytest.raises(InvalidInput) as err:
            read()
        assert time.monotonic() - t0 < 1
        msg = str(err.value)
        assert run.store.url(rel) in msg and problem in msg and "\n" not in msg and len(msg) < 600


@pytest.mark.parametrize("draft", [b"{oops", b'{"policy_in": 3}', b'{"metrics_uri": ["x"]}'])
def test_a_corrupt_pending_draft_gives_one_line_naming_the_file(run, draft):
    """Item 5: a hand-edited pending.json: InvalidInput naming it, not KeyError / TypeError."""
    from rlcr.untrusted import InvalidInput

    run.store.write_bytes(run.pending_rel(1, PROCESS_ATTEMPT), draft)
    uri = seal_dir(run, run.checkpoint_rel(1, PROCESS_ATTEMPT), "w")
    with pytest.raises(InvalidInput, match="pending.json") as err:
        run.commit_staged([1], uri, 1)
    assert run.store.url(run.pending_rel(1)) in str(err.value)
    assert run.manifest(1) is None


def test_a_moved_store_resumes_reads_metrics_and_finishes_a_group(tmp_path):
    """Item 8: manifests record paths relative to the run; a moved store (and an old manifest with absolute
    URIs of the old place) resolves onto the new one."""
    old = RunStore(Store(str(tmp_path / "old")), "r")
    for k in (1, 2, 3):
        old.stage(k, {"policy_in": "base-model", "rollouts_uri": old.store.url(f"{old.iteration_dir(k)}/r.parquet")},
                  {"k": k})
    uri = seal_dir(old, old.checkpoint_rel(3, PROCESS_ATTEMPT), "w")
    old.commit_staged([1], uri, 3)  # a crash in the middle of committing the group {1, 2, 3}
    m1 = old.store.read_json(old.manifest_rel(1))
    assert m1["state_uri"] == f"iter-0003/attempt-{PROCESS_ATTEMPT}/checkpoint"
    assert m1["metrics_uri"] == f"iter-0001/attempt-{PROCESS_ATTEMPT}/metrics.json"
    assert m1["policy_in"] == "base-model"  # not under the run: kept as it is
    # an older manifest written with absolute URIs (of the old location) is mapped too
    legacy = {**m1, "rollouts_uri": old.store.url(f"{old.iteration_dir(1)}/r.parquet")}
    os.unlink(old.store._abs(old.manifest_rel(1)))
    old.store.write_json(old.manifest_rel(1), legacy)
    shutil.move(str(tmp_path / "old"), str(tmp_path / "new"))

    new = RunStore(Store(str(tmp_path / "new")), "r")
    assert new.finish_group() and [m["iteration"] for m in new.committed()] == [1, 2, 3]
    for m in new.committed():
        assert (new.store.read_json(new.store.rel(m["metrics_uri"])) == {"k": m["iteration"]}
                == new.metrics(m["iteration"]))
        assert m["rollouts_uri"] == new.store.url(f"{new.iteration_dir(m['iteration'])}/r.parquet")
    assert new.verified_state(new.last_committed()) == new.store.url(new.checkpoint_rel(3))


def test_list_runs_skips_entries_that_are_not_runs(tmp_path):
    """Item 8: the probe's run search skips .DS_Store, a README and folders with invalid names."""
    from rlcr.runs.refs import newest_run

    store = Store(str(tmp_path / "store"))
    run = RunStore(store, "real")
    run.commit(1, {})
    for name in (".DS_Store", "README"):
        store.write_bytes(f"runs/{name}", b"x")
    store.write_bytes("runs/.hidden dir/config.json", b"{}")
    store.write_bytes("runs/notes/iter-0001/manifest.json", b"{broken")  # a run with a corrupt manifest
    assert newest_run(store) == "real"


def test_manifest_policy_in_names_a_saved_state(tmp_path):
    """Item 8: with save_every, policy_in is the last *saved* state and policy_in_updates the iterations
    applied to it in memory since (the flow records these; here the draft is checked to round-trip)."""
    run = RunStore(Store(str(tmp_path / "s")), "r")
    run.stage(1, {"policy_in": "base", "policy_in_updates": [], "policy_out": None}, {})
    out = run.checkpoint_rel(2, PROCESS_ATTEMPT)
    run.stage(2, {"policy_in": "base", "policy_in_updates": [1], "policy_out": run.store.url(out)}, {})
    run.commit_staged([1, 2], seal_dir(run, out, "w"), 2)
    m1, m2 = run.committed()
    assert m2["policy_in_updates"] == [1] and m2["policy_out"] == m2["checkpoint_uri"] and m1["policy_out"] is None


def test_the_probe_artifact_key_takes_every_valid_run_id():
    """Item 10: the probe's Prefect artifact key is valid and distinct for any valid run id."""
    from prefect.types.names import raise_on_name_alphanumeric_dashes_only

    from flows.probe import probe_artifact_key

    ids = ["lr=1e-5", "exp 1", "a@b,c+d", "lr-1e-5", "Exp_1", "flow-run"]
    keys = [probe_artifact_key(i) for i in ids]
    for key in keys:
        raise_on_name_alphanumeric_dashes_only(key, "artifact key")
    assert len(set(keys)) == len(keys) and keys[-1] == "rlcr-probe-flow-run"
