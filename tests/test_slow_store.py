"""A slow store does not make rlcr mistake its own writes for another writer's (issue item 7).

A delaying proxy on 127.0.0.1 (``s3server.SlowProxy``) in front of the moto S3 server forwards a PUT at once but
holds its answer past the client's read timeout, so the client retries a request that already landed: the retry
of a create-only write gets 412 (the object exists: our own), and so does the retry of a compare-and-swap (the
version moved: by our own write). The store takes an existing object that holds exactly the bytes sent as that
write's success; an object with other bytes (a genuine other writer) still raises."""

import pytest

from rlcr.runs.store import AlreadyCommitted, RunLease, RunLocked, RunStore
from rlcr.storage import AlreadyExists, Store, VersionConflict
from s3server import BUCKET, SlowProxy

READ_TIMEOUT_S = 1.0  # the client gives up on an answer after this long, and retries
HELD_S = 2.5  # how long the proxy holds the chosen answer: longer than the read timeout
# The tests below that are not about the lease's timing hold it with a long timeout: a 6 s lease on the moto
# server of a loaded 2-core machine missed its heartbeat once (CI, 2026-11-28) and the test failed with LeaseLost.
CALM = {"timeout_s": 120.0, "heartbeat_s": 2.0}


@pytest.fixture
def proxy(s3):
    p = SlowProxy(s3.endpoint)
    yield p
    p.close()


@pytest.fixture
def slow_run(proxy, tmp_path):
    """A run on S3 reached through the proxy, with a short read timeout."""
    store = Store(f"s3://{BUCKET}/{tmp_path.name}", endpoint_url=proxy.endpoint, read_timeout_s=READ_TIMEOUT_S)
    return RunStore(store, "slow")


def test_a_late_answer_to_the_manifest_put_is_not_another_writers_commit(slow_run, proxy):
    run = slow_run
    proxy.hold("iter-0001/manifest.json", HELD_S)
    uri = run.commit(1, {"policy_in": "m", "who": "A"})
    assert proxy.puts["iter-0001/manifest.json"] >= 2  # the first answer came too late: the client retried
    assert uri == run.store.url(run.manifest_rel(1)) and run.manifest(1)["who"] == "A"
    # a genuine second commit of iteration 1 (other bytes) is still refused, and leaves A's manifest as it was
    with pytest.raises(AlreadyCommitted):
        run.commit(1, {"policy_in": "m", "who": "B"})
    assert run.manifest(1)["who"] == "A"


def test_a_late_answer_to_the_lease_puts_is_not_another_holder(slow_run, proxy):
    run = slow_run
    # timeout 6 s, heartbeat 2 s: the lease's own requests wait 1 s for an answer (rlcr.runs.lease._control_store)
    proxy.hold("slow/lease.json", HELD_S)
    lease = RunLease(run, owner="A", timeout_s=6.0, heartbeat_s=2.0).acquire()  # not RunLocked by itself
    try:
        assert proxy.puts["slow/lease.json"] >= 2
        lease.check()
        version = lease.version
        proxy.hold("slow/lease.json", HELD_S)  # the next renew (a compare-and-swap) answers late too
        lease._stop.set()  # renew by hand, not from the heartbeat thread
        lease._thread.join()
        lease.renew()
        assert proxy.puts["slow/lease.json"] >= 4  # the renew's first answer came too late: it was retried
        assert lease.lost is None and lease.version != version
        assert lease.version == run.store.read_versioned(run.lease_rel)[1]
        lease.check()
        # a genuine second writer is still refused, naming the holder
        with pytest.raises(RunLocked, match="A "):
            RunLease(run, owner="B", timeout_s=6.0, heartbeat_s=2.0).acquire()
    finally:
        lease.release()
    assert not run.store.exists(run.lease_rel)


def test_an_object_with_exactly_the_bytes_written_is_that_writes_success(store):
    """On both backends: a create-only write (or a compare-and-swap) finding exactly its own bytes already there
    succeeds; other bytes still raise AlreadyExists (VersionConflict)."""
    store.write_bytes("runs/r/manifest.json", b"mine", exclusive=True)
    store.write_bytes("runs/r/manifest.json", b"mine", exclusive=True)  # a retry whose first attempt landed
    for other in (b"theirs", b"mine!", b"min", b""):
        with pytest.raises(AlreadyExists):
            store.write_bytes("runs/r/manifest.json", other, exclusive=True)
    assert store.read_bytes("runs/r/manifest.json") == b"mine"
    store.write_bytes("lease.json", b"one", exclusive=True)
    _, v1 = store.read_versioned("lease.json")
    store.write_if_version("lease.json", b"two", v1)
    store.write_if_version("lease.json", b"two", v1)  # the version moved, but to exactly these bytes
    with pytest.raises(VersionConflict):
        store.write_if_version("lease.json", b"three", v1)
    assert store.read_bytes("lease.json") == b"two"


def test_a_renew_that_landed_unanswered_is_not_a_takeover(store):
    """A renew whose PUT landed but every answer was lost fails (StorageError), and the lease is left at a version
    the holder never learnt; the next renew finds the lease carrying its own token and carries on. A lease with
    another writer's token is still a takeover (the lease is lost)."""
    import json

    run = RunStore(store, "renew")
    lease = RunLease(run, owner="A", **CALM).acquire()
    lease._stop.set()  # renew by hand, not from the heartbeat thread
    lease._thread.join()
    try:
        store.write_bytes(run.lease_rel, lease._doc())  # what the unanswered renew left behind
        lease.renew()
        assert lease.lost is None and lease.version == store.read_versioned(run.lease_rel)[1]
        lease.check()
        other = {**json.loads(lease._doc()), "token": "b" * 32, "owner": "B"}
        store.write_bytes(run.lease_rel, json.dumps(other).encode())  # B took the lease over
        lease.renew()
        assert lease.lost and json.loads(store.read_bytes(run.lease_rel))["owner"] == "B"
    finally:
        lease.release()


def test_a_commit_retried_after_its_manifest_landed_unanswered_succeeds(store):
    """The manifest PUT landed but every answer was lost: the commit failed (StorageError) before the draft was
    removed, and the commit task is retried. The manifest there is this commit's own (same attempt, same fields but
    ``committed_at``): the retry succeeds. A manifest of another attempt, or with other fields, is still refused."""
    import json

    run = RunStore(store, "retry")
    lease = RunLease(run, owner="A", **CALM).acquire()
    try:
        run.stage(1, {"policy_in": "m"}, {"loss": 1.0}, lease=lease)
        with store.writing_dir(run.checkpoint_rel(1, lease.attempt)) as tmp:
            (tmp / "model.safetensors").write_bytes(b"A's weights")
        state = store.url(run.checkpoint_rel(1, lease.attempt))
        draft_rel = run.pending_rel(1, lease.attempt)
        draft = store.read_bytes(draft_rel)
        first = run.commit_staged([1], state, 1, lease=lease)
        committed = store.read_bytes(run.manifest_rel(1))
        store.write_bytes(draft_rel, draft)  # the failed commit never got to remove its draft
        assert run.commit_staged([1], state, 1, lease=lease) == first
        assert store.read_bytes(run.manifest_rel(1)) == committed and not store.exists(draft_rel)
        doc = run.manifest(1)  # its paths as URIs, as commit() takes them
        assert json.loads(committed)["attempt"] == doc["attempt"] == lease.attempt
        for other in ({**doc, "attempt": "b" * 12}, {**doc, "policy_in": "other"}):
            with pytest.raises(AlreadyCommitted):
                run.commit(1, other, lease=lease)
        assert store.read_bytes(run.manifest_rel(1)) == committed
    finally:
        lease.release()


def test_an_acquire_retried_after_its_create_landed_unanswered_is_not_locked_by_itself(store):
    """The lease's create landed but every answer was lost (acquire failed with StorageError); the caller calls
    acquire again, with a fresh document: the lease there carries this writer's own token, so it is taken as
    acquired, not as a live holder (``RunLocked`` naming this very process)."""
    run = RunStore(store, "again")
    lease = RunLease(run, owner="A", **CALM).acquire()  # the create that landed
    lease._stop.set()  # and no heartbeat: this writer does not know it holds the lease
    lease._thread.join()
    try:
        lease.acquire()
        lease.check()
        with pytest.raises(RunLocked, match="A "):
            RunLease(run, owner="B", **CALM).acquire()
    finally:
        lease.release()
    assert not store.exists(run.lease_rel)
