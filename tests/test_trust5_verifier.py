"""The bounded verifier's batch budget, per-batch memory, private reply channel and process groups."""

from __future__ import annotations

import os
import time

from rlcr.tasks.verify import BoundedVerifier


def test_two_slow_answers_cost_only_themselves_and_count_once():
    """Items 2 and 3: before, each slow answer was run three times (score, accuracy, reward) and spent the
    shared budget, so none of the 30 right answers after them were credited and 96 timeouts were counted."""
    verify = BoundedVerifier("trust5_verifier_functions:slow_or_same", timeout_s=2.0)
    answers = ["slow"] + [f"{k}" for k in range(31)]
    with verify.scoring(32) as stats:
        verdicts = [[verify(a, a if a != "slow" else "x") for _ in range(3)] for a in answers]
    assert verdicts[0] == [None] * 3
    assert sum(v == [True] * 3 for v in verdicts[1:]) == 31
    assert stats.timeouts == 1


def test_stray_output_on_fd1_cannot_forge_a_verdict():
    """Item 4: before, a line on fd 1 from os.write or a child was read as the reply."""
    verify = BoundedVerifier("trust5_verifier_functions:forges", timeout_s=5.0)
    with verify.scoring(2) as stats:
        assert verify("1", "2") is False
        assert verify("3", "3") is True
    assert stats.timeouts == 0


def test_a_killed_workers_children_die_with_it(tmp_path):
    """Items 4 and 15: before, only the worker's pid was killed and its spinning child lived on."""
    pidfile = tmp_path / "pid"
    verify = BoundedVerifier("trust5_verifier_functions:spawns_spinner", timeout_s=1.0)
    with verify.scoring(1):
        assert verify(str(pidfile), 0) is None
    verify._stop()
    pid = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError("the worker's child still runs")


def test_a_resource_module_in_the_working_directory_is_not_imported(tmp_path, monkeypatch):
    """Item 4: before, the worker ran without -I and a resource.py in the cwd replaced the standard one."""
    (tmp_path / "resource.py").write_text("raise SystemExit('shadowed')\n")
    monkeypatch.chdir(tmp_path)
    verify = BoundedVerifier("trust5_verifier_functions:slow_or_same", timeout_s=2.0)
    assert verify("1", "1") is True
