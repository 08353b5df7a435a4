"""Ctrl-C in a real terminal: a pseudo-terminal (80 × 24) runs ``rlcr train`` as a user would (its own local Ray
and temporary Prefect server) and types Ctrl-C into it, once during generation, and in a resume during the
update followed by a second Ctrl-C. Each time: the interrupt is acknowledged at once with what is cancelled, what
is committed and the command that resumes; the command ends within 15 s (a second Ctrl-C: at once) with exit
code 130; nothing but rlcr's lines reaches the screen (no traceback, no Prefect or Ray log line); the bar counted
only committed iterations. The resumed run then finishes with the same rollouts and weights as a run that was
never interrupted.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|[\x00-\x08\x0b\x0c\x0e-\x1f]")
"""What a terminal does not show as text: escape sequences, and control characters (a Ctrl-C echoed raw)."""
ACK = "stopping (Ctrl-C): "


@dataclass
class Session:
    rc: int
    screen: str  # everything written to the terminal, escape sequences removed
    after: str  # what was written after the first Ctrl-C
    ack_s: float | None  # first Ctrl-C → its acknowledgement on the screen
    exit_s: float  # first Ctrl-C → the process ended


def _controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def in_terminal(args: list[str], cwd: Path, env: dict, interrupt_at: str, second_after: float | None = None,
                limit_s: float = 600) -> Session:
    """Run ``args`` in a new session on a pseudo-terminal of 80 columns; type Ctrl-C once the screen matches
    ``interrupt_at`` (and again ``second_after`` seconds after the acknowledgement)."""
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, start_new_session=True,
                            preexec_fn=_controlling_terminal, env={**env, "TERM": "xterm-256color"})
    os.close(slave)
    raw, sent, acked, second, mark = b"", None, None, None, 0
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the other side closed
                    chunk = b""
                if not chunk:
                    break
                raw += chunk
            text = ANSI.sub("", raw.decode("utf-8", "replace"))
            if sent is None and re.search(interrupt_at, text):
                os.write(master, b"\x03")
                sent, mark = time.monotonic(), len(text)
            elif sent is not None and acked is None and ACK in text[mark:]:
                acked = time.monotonic()
            if acked is not None and second_after is not None and second is None and \
                    time.monotonic() - acked >= second_after:
                os.write(master, b"\x03")
                second = time.monotonic()
            if not ready and proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        os.close(master)
    ended = time.monotonic()
    text = ANSI.sub("", raw.decode("utf-8", "replace"))
    assert sent is not None, f"never reached {interrupt_at!r}:\n{text[-3000:]}"
    return Session(rc, text, text[mark:], acked - sent if acked else None, ended - sent)


def stored_run(store: Path, run_id: str):
    from rlcr.config import RLCRConfig
    from rlcr.runs.store import RunStore

    return RunStore.open(RLCRConfig.from_dict({"storage.uri": str(store)}), run_id)


def flattened(text: str) -> str:
    """The screen's words as one line: lines broken to fit (and shell continuations) joined again."""
    return " ".join(re.sub(r" \\\n", " ", text.replace("\r", "")).split())


def check_interrupt(s: Session, committed: int, doing: str, limit_s: float) -> None:
    tail = s.after[-4000:]
    assert s.rc == 130, (s.rc, tail)
    assert s.ack_s is not None and s.ack_s < 3.0, (s.ack_s, tail)
    assert s.exit_s < limit_s, (s.exit_s, tail)
    lines = s.after[s.after.find(ACK):].replace("\r", "").split("\n")  # from the acknowledgement on
    # broken between words, not by the terminal (a single word longer than a line stays whole)
    long = [line for line in lines if len(line) > 80 and len(line.removesuffix(" \\").split()) > 1]
    assert not long, (long, tail)
    flat = flattened(s.after)
    done = "no iteration is committed yet" if committed == 0 else "iteration 1 is committed" if committed == 1 \
        else f"iterations 1..{committed} are committed"
    assert f"{ACK}{doing} is cancelled; {done}; resume with: rlcr train --config " in flat, tail
    assert re.search(r"resume with: rlcr train --config \S+ --run-id ctrl-c model\.name=", flat), tail
    assert re.search(rf"stopped in \d+\.\d s: run ctrl-c, {re.escape(done)} \(exit code 130\)", flat), tail
    for leak in ("Traceback", "Error", "ERROR", "| INFO", "| WARNING", "Aborted", "httpx", "prefect", "(raylet)",
                 "^C"):
        assert leak not in s.after, (leak, tail)


def test_ctrl_c_in_a_terminal_answers_at_once_ends_in_seconds_and_the_run_resumes_exactly(tiny_model_dir, tmp_path,
                                                                                         ray_local, prefect_harness):
    import pyarrow.parquet as pq
    from safetensors.torch import load_file

    from flows.train import rlcr_train

    config = tmp_path / "ctrl-c.yaml"
    config.write_text((ROOT / "configs" / "tiny.yaml").read_text())
    settings = [f"model.name={tiny_model_dir}", "run.iterations=2", "eval.every=0", "tasks.num_train=32"]
    store, straight = tmp_path / "store", tmp_path / "straight"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    train = ["rlcr", "train", "--config", str(config), "--run-id", "ctrl-c", *settings, f"storage.uri={store}"]

    # during iteration 2's generation: iteration 1's save may still run in the background (not committed yet)
    first = in_terminal(train, tmp_path, env, r"iteration 2: generating")
    run = stored_run(store, "ctrl-c")
    committed = len(run.committed())
    check_interrupt(first, committed, "iteration 2's generation", 15.0)
    assert f"{committed}/2" in first.screen.split(ACK)[0][-400:], first.screen[-1500:]  # the bar: committed only

    # the resume, during iteration 2's update (iteration 1 is committed before it), then a second Ctrl-C
    second = in_terminal(train, tmp_path, env, r"iteration 2: GRPO update", second_after=0.2)
    check_interrupt(second, 1, "iteration 2's update", 15.0)
    assert "(a second Ctrl-C: ended at once)" in flattened(second.after) and second.exit_s < 5.0, second.after[-2000:]
    assert [m["iteration"] for m in run.committed()] == [1]
    print(f"Ctrl-C during generation: acknowledged in {first.ack_s:.2f} s, ended in {first.exit_s:.1f} s; during the "
          f"update: acknowledged in {second.ack_s:.2f} s, ended in {second.exit_s:.1f} s after a second Ctrl-C")

    # finish it, and a run never interrupted, in this process: the same rollouts and weights
    overrides = [s for s in settings if not s.startswith("run.iterations")]
    rlcr_train(config=str(config), overrides=[*overrides, f"storage.uri={store}"], run_id="ctrl-c", iterations=2)
    rlcr_train(config=str(config), overrides=[*overrides, f"storage.uri={straight}"], run_id="ctrl-c", iterations=2)
    ours, theirs = run.committed(), stored_run(straight, "ctrl-c").committed()
    assert [m["iteration"] for m in ours] == [m["iteration"] for m in theirs] == [1, 2]
    for a, b in zip(ours, theirs):
        ra, rb = (pq.read_table(m["rollouts_uri"]).column("completion_ids").to_pylist() for m in (a, b))
        assert ra == rb, a["iteration"]
    wa, wb = (load_file(f"{m['checkpoint_uri']}/model.safetensors") for m in (ours[-1], theirs[-1]))
    assert wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)


def test_a_block_that_swallows_the_interrupt_is_ended_after_the_grace_period():
    """The handler itself, in a child process: the acknowledgement and the last line on the terminal it started on,
    exit code 130, even when the block ignores the interrupt past the grace period (ended at once)."""
    script = (
        "import time\n"
        "from rlcr.cli.inputs import quiet\n"
        "import rlcr.cli.interrupt as i\n"
        "i.GRACE_S = 1.0\n"
        "import os, signal, threading\n"
        "threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "with quiet('eval', None, False):\n"
        "    try:\n"
        "        time.sleep(30)\n"
        "    except KeyboardInterrupt:\n"
        "        print('swallowed, still working', flush=True)\n"
        "        time.sleep(30)\n"
    )
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert res.returncode == 130, res.stdout + res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert "stopping (Ctrl-C): rlcr eval is cancelled" in lines and re.fullmatch(
        r"stopped in \d\.\d s \(exit code 130\) \(still stopping after 1 s: ended at once\)", lines[-1]), res.stdout
    assert "swallowed" not in res.stdout and "Traceback" not in res.stdout + res.stderr  # both in the log
    assert took < 20
