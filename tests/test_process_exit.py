"""How the `rlcr` command ends (rlcr.cli.end_process): as the interpreter would — non-daemon threads waited for,
exit handlers run, stdout and stderr flushed, SystemExit's code — but without the interpreter's final teardown."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    from pathlib import Path
    from rlcr.cli import end_process

    out = Path(sys.argv[1])
    atexit.register(lambda: out.with_suffix(".atexit").write_text("handler ran"))
    def late():
        time.sleep(0.5)
        out.with_suffix(".thread").write_text("thread finished")
    threading.Thread(target=late).start()  # non-daemon: waited for, as at a normal exit
    sys.stdout.write("partial line, no newline")  # buffered: must be flushed
    end_process(eval(sys.argv[2]))
    out.with_suffix(".after").write_text("never")
""")


def _run(tmp_path, code: str):
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "mark"), code], capture_output=True,
                          text=True, timeout=120)


def test_the_command_ends_with_its_code_after_its_threads_and_exit_handlers(tmp_path):
    res = _run(tmp_path, "3")
    assert res.returncode == 3, res.stderr[-2000:]
    assert res.stdout == "partial line, no newline"
    assert (tmp_path / "mark.atexit").read_text() == "handler ran"
    assert (tmp_path / "mark.thread").read_text() == "thread finished"
    assert not (tmp_path / "mark.after").exists()


def test_systemexits_other_codes_are_kept(tmp_path):
    assert _run(tmp_path, "None").returncode == 0
    res = _run(tmp_path, "'config error: x'")
    assert res.returncode == 1 and res.stderr.strip().endswith("config error: x")
