"""Trust round 5, store items: every read of a run's files is bounded and refuses special files by name before
reading (local: ``stat`` first; S3: a ranged read or the object's size first); ``rlcr runs`` lists a run it cannot
read as one ``invalid`` row and reads only the runs it shows; the commands that only read (``runs``, ``runs
show``, ``compare``, ``export``) work on a read-only store and create no mistyped one; ``rlcr export`` writes
into a temporary folder and renames it (no truncated model on a full disk), refusing a dangling ``--out`` link
and an ``--out`` inside the store; a new run's id that could read as a reference (``A@2``) is refused."""

import contextlib
import os
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlcr.cli import app
from rlcr.config import RLCRConfig
from rlcr.runs.lease import RunLease
from rlcr.runs.refs import store_summaries
from rlcr.runs.store import PROCESS_ATTEMPT, RunStore
from rlcr.storage import Store
from rlcr.untrusted import InvalidInput
from test_cli import write_eval_rows
from test_run_refs import make_run

ROOT = Path(__file__).resolve().parents[1]


def bounded(fn, seconds: float = 20.0):
    """``fn()``'s result (or the exception it raised, returned), failing the test if it is still running after
    ``seconds``: a read blocked on a FIFO never returns, so the call runs in a daemon thread."""
    out: list = []

    def call():
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out.append(e)
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s (a read of a FIFO?)"
    return out[0]


def fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def unblock(path: Path) -> None:
    """Let a reader blocked on FIFO ``path`` (the old code) go: open its write end once, then close it."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def cli(args):
    return CliRunner().invoke(app, args)


# ------------------------------------------------------------------------------------------------ item 11
def test_a_fifo_manifest_or_lease_is_refused_by_name_not_waited_on(tmp_path):
    """Item 11: a FIFO at ``iter-0002/manifest.json`` or ``lease.json`` hung every reader (``rlcr runs``, resume:
    the old reads opened it blocking and waited for a writer for ever). Now each is refused unread, by name."""
    store = Store(str(tmp_path / "store"))
    run = make_run(store, committed=2, save_every=1, iterations=4)
    manifest = fifo(Path(store.url(run.manifest_rel(2))))
    lease = fifo(Path(store.url(run.lease_rel)))
    try:
        err = bounded(lambda: run.manifest(2))
        assert isinstance(err, InvalidInput) and "manifest.json: not a regular file" in str(err), err
        assert bounded(run.current_attempt) == PROCESS_ATTEMPT  # the lease is unreadable: no holder
        rows, total = bounded(lambda: store_summaries(store))
        assert total == 1 and rows[0]["state"] == "invalid" and "manifest.json" in rows[0]["problem"], rows
        taken = bounded(lambda: RunLease(RunStore(store, "first")).acquire())  # a resume: one line, no hang
        assert isinstance(taken, InvalidInput) and "lease.json" in str(taken), taken
    finally:
        unblock(manifest)
        unblock(lease)


_REFUSE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from rlcr.runs.store import RunStore
from rlcr.storage import Store
from rlcr.untrusted import InvalidInput
run = RunStore(Store(sys.argv[1]), "first")
for name, read in (("manifest", lambda: run.manifest(1)), ("baseline", run.baseline)):
    try:
        read()
        print(name, "read")
    except InvalidInput as e:
        print(name, "refused:", e)
"""


def test_a_huge_sparse_manifest_and_a_link_to_dev_zero_are_refused_unread(tmp_path):
    """Item 11: a 6 GB sparse manifest and a ``baseline.json`` linked to ``/dev/zero`` were read whole before their
    size was looked at (a MemoryError under a 3 GiB address-space limit; ``/dev/zero`` never ends). Now each is
    refused by its ``stat``, in one line naming it."""
    store = Store(str(tmp_path / "store"))
    run = make_run(store, committed=1, save_every=1, iterations=2)
    with open(store.url(run.manifest_rel(1)), "r+b") as f:
        f.truncate(6_000_000_000)
    Path(store.url(run.baseline_rel)).symlink_to("/dev/zero")
    res = subprocess.run([sys.executable, "-c", _REFUSE, store.url()], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("manifest refused:") and "6,000,000,000 bytes, more than the 4,194,304" in lines[0]
    assert lines[1].startswith("baseline refused:") and "kernel file" in lines[1], lines
    assert len(lines) == 2 and all(len(line) < 400 for line in lines)


def test_next_rollouts_larger_than_a_table_may_be_is_refused_by_its_size(tmp_path):
    """Item 11: the file ``next_rollouts_uri`` names was read whole (a 3 GiB file cost 3.4 GiB) before its digest
    was checked. Now a file over :data:`rlcr.columnar.MAX_TABLE_BYTES` is refused by its size, nothing read."""
    from rlcr.columnar import MAX_TABLE_BYTES
    from rlcr.rollout.ahead import read_ahead

    store = Store(str(tmp_path / "store"))
    run = RunStore(store, "first")
    rel = run.rollouts_rel(2, "a1b2c3d4e5f6")
    Path(store.url(rel)).parent.mkdir(parents=True)
    with open(store.url(rel), "wb") as f:
        f.truncate(MAX_TABLE_BYTES + 1)
    manifest = {"iteration": 1, "next_rollouts_uri": store.url(rel), "next_rollouts_sha256": "0" * 64,
                "next_rollouts_version": 0}
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput, match="more than the 536,870,912 (bytes )?allowed"):
            read_ahead(run, manifest, [(0, None)], g_a=2, g_c=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak:,} bytes allocated to refuse it"


def test_s3_reads_are_bounded_by_a_ranged_read_or_the_objects_size(store):
    """Item 11 on S3 (and locally): ``read_bytes``/``read_versioned`` take a byte cap; a larger object is refused
    in one line naming it (on S3 by one ranged GET, or the size ``info`` gives first), an empty one reads as
    empty. Before, both read every object whole (no cap could be given)."""
    from rlcr.storage import RefusedFile

    store.write_bytes("x/big", b"0123456789" * 100)
    store.write_bytes("x/empty", b"")
    with pytest.raises(RefusedFile, match="x/big: .*more than the 100 .*allowed"):
        store.read_bytes("x/big", max_bytes=100)
    with pytest.raises(RefusedFile, match="x/big: .*more than the 100 .*allowed"):
        store.read_versioned("x/big", max_bytes=100)
    assert store.read_bytes("x/big", max_bytes=1000) == b"0123456789" * 100
    assert store.read_bytes("x/empty", max_bytes=10) == b""
    assert store.read_versioned("x/empty", max_bytes=10)[0] == b""
    with pytest.raises(FileNotFoundError):
        store.read_bytes("x/missing", max_bytes=10)


# ------------------------------------------------------------------------------------------------ item 12
def test_rlcr_runs_lists_a_run_it_cannot_read_as_one_invalid_row(tmp_path):
    """Item 12: a run whose config.json is a folder made ``rlcr runs`` a traceback (a StorageError from the
    read, not caught per run). Now it is one ``invalid`` row naming the file, and the other runs are listed."""
    store = Store(str(tmp_path / "store"))
    make_run(store, "good")
    broken = make_run(store, "broken")
    Path(store.url(broken.config_rel)).unlink()
    Path(store.url(broken.config_rel)).mkdir()
    res = cli(["runs", f"storage.uri={store.url()}"])
    assert res.exit_code == 0, res.output
    assert "invalid: " in res.output and "config.json: not a regular" in res.output, res.output
    rows = {r["id"]: r for r in store_summaries(store)[0]}
    assert rows["broken"]["state"] == "invalid" and "config.json: not a regular file" in rows["broken"]["problem"]
    assert rows["good"]["state"] == "finished"


def test_rlcr_runs_reads_only_the_runs_it_shows(tmp_path, monkeypatch):
    """Item 12: listing checked every run folder of the store (two requests each on S3: 1,000 runs took 54 s)
    before reading the newest 200. Now one listing names the folders and only the shown ones are opened."""
    store = Store(str(tmp_path / "store"))
    for i in range(12):
        make_run(store, f"run-{i:02d}", committed=1, save_every=1, iterations=1)
    (tmp_path / "store" / "runs" / "run-11-not-a-run").mkdir()  # newest name, holds nothing
    touched: set[str] = set()
    for name in ("exists", "read_bytes", "ls"):
        original = getattr(Store, name)

        def spy(self, rel="", *a, _original=original, **k):
            parts = rel.split("/")
            if len(parts) > 1 and parts[0] == "runs":
                touched.add(parts[1])
            return _original(self, rel, *a, **k)
        monkeypatch.setattr(Store, name, spy)
    rows, total = store_summaries(store, limit=3)
    assert [r["id"] for r in rows] == ["run-09", "run-10", "run-11"] and total == 12
    assert touched == {"run-09", "run-10", "run-11", "run-11-not-a-run"}, sorted(touched)


@pytest.fixture
def read_only_store(tmp_path):
    """A store with runs 'first' (checkpoints at 2 and 4) and 'a', 'b' (held-out rows at iteration 0), mounted
    read-only at ``tmp_path / 'ro'`` (needs root and mount; skipped otherwise)."""
    src = tmp_path / "store"
    store = Store(str(src))
    make_run(store)
    cfg = RLCRConfig(storage={"uri": str(src)})
    write_eval_rows(cfg, "a", 0, True)
    write_eval_rows(cfg, "b", 0, False)
    ro = tmp_path / "ro"
    ro.mkdir()
    try:
        subprocess.run(["mount", "--bind", str(src), str(ro)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True, capture_output=True)
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=False, capture_output=True)


def test_the_reading_commands_work_on_a_read_only_store(read_only_store, tmp_path):
    """Item 12: ``runs``, ``runs show``, ``compare`` and ``export`` refused a read-only store ("the directory is
    not writable"), though they write nothing. Now they read it."""
    uri = f"storage.uri={read_only_store}"
    res = cli(["runs", uri])
    assert res.exit_code == 0 and "first" in res.output, res.output
    res = cli(["runs", "show", "first", uri])
    assert res.exit_code == 0 and "first@4" in res.output, res.output
    res = cli(["compare", "a", "b", uri])
    assert res.exit_code == 0 and "shared held-out tasks" in res.output, res.output
    res = cli(["export", "first@4", "--out", str(tmp_path / "model"), uri])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "model" / "model.safetensors").read_text() == "after 4"


@pytest.mark.parametrize("command", [["runs"], ["runs", "show", "first"], ["compare", "a", "b"],
                                     ["export", "first@2", "--out", "OUT"]])
def test_a_mistyped_or_kernel_store_path_is_one_line_and_creates_nothing(tmp_path, command):
    """Item 12: a mistyped storage.uri was created (an empty store) by commands that only read, and one under
    /proc was a traceback (makedirs failing). Both are now one line, exit code 2, nothing created."""
    command = [str(tmp_path / "out") if c == "OUT" else c for c in command]
    typo = tmp_path / "stroe"
    res = cli([*command, f"storage.uri={typo}"])
    assert res.exit_code == 2 and "no such directory" in res.output and "Traceback" not in res.output, res.output
    assert not typo.exists() and not (tmp_path / "out").exists()
    res = cli([*command, "storage.uri=/proc/rlcr-store"])
    assert res.exit_code == 2 and "Traceback" not in res.output and "/proc/rlcr-store" in res.output, res.output
    with pytest.raises(InvalidInput, match="kernel file system"):
        Store("/proc/self")


def test_a_new_run_id_that_reads_as_a_reference_is_refused_before_anything_is_written(tmp_path):
    """Small item: ``A@2`` was accepted as a new run's id (then ``A@2`` named iteration 2 of run A, not it). Now
    a new run's lease (its first write) and ``rlcr train``'s checks refuse it in one line; a run stored under
    such an id before is still read."""
    from rlcr.cli.app import UserError
    from rlcr.cli.inputs import check_resume

    store = Store(str(tmp_path / "store"))
    with pytest.raises(InvalidInput, match="holds '@'"):
        RunLease(RunStore(store, "A@2")).acquire()
    assert not (tmp_path / "store" / "runs").exists()
    with pytest.raises(UserError, match="run id: .*holds '@', so it could be read as a run reference"):
        check_resume(RunStore(store, "A@2"), RLCRConfig(storage={"uri": store.url()}))
    make_run(store, "old@run", committed=1, save_every=1, iterations=2)
    with RunLease(RunStore(store, "old@run")):
        pass


# ------------------------------------------------------------------------------------------------ item 13
def test_export_refuses_a_dangling_out_link_and_an_out_inside_the_store(tmp_path):
    """Item 13: a dangling ``--out`` link was a traceback (mkdir on the link), and ``--out`` inside the store wrote
    a model there (a bogus run). Both are one line now, before anything is fetched or written."""
    store = Store(str(tmp_path / "store"))
    make_run(store)
    uri = f"storage.uri={store.url()}"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere" / "model")
    res = cli(["export", "first@2", "--out", str(link), uri])
    assert res.exit_code == 2 and "symbolic link to nothing" in res.output, res.output
    assert not (tmp_path / "nowhere").exists()
    inside = tmp_path / "store" / "runs" / "exported"
    res = cli(["export", "first@2", "--out", str(inside), uri])
    assert res.exit_code == 2 and "inside the store" in res.output, res.output
    assert not inside.exists()


def test_export_on_a_full_disk_is_one_line_and_leaves_nothing_at_out(tmp_path):
    """Item 13: a full disk during ``rlcr export`` was a traceback that left a truncated model.safetensors at
    --out. Now the model is written in a temporary folder beside --out and renamed at the end: on ENOSPC one
    line, and nothing at --out (nor any temporary beside it). A 1 MiB tmpfs holds --out (needs root)."""
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(os.urandom(2 << 20))
    store = Store(str(tmp_path / "store"))
    run = make_run(store, committed=0)
    store.put_dir(src, run.checkpoint_rel(0))
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        res = cli(["export", "first@0", "--out", str(disk / "model"), f"storage.uri={store.url()}"])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert "No space left on device" in res.output and "nothing was written" in res.output, res.output
        assert os.listdir(disk) == [], os.listdir(disk)
        (disk / "model").mkdir()  # an empty --out that exists is replaced whole on success
        small = tmp_path / "small"
        small.mkdir()
        (small / "config.json").write_text("{}")
        (small / "model.safetensors").write_bytes(b"w" * 1000)
        res = cli(["export", str(small), "--out", str(disk / "model")])
        assert res.exit_code == 0, res.output
        assert sorted(os.listdir(disk / "model")) == ["config.json", "model.safetensors"]
        assert sorted(os.listdir(disk)) == ["model"]
    finally:
        subprocess.run(["umount", str(disk)], check=False, capture_output=True)

