"""The math verifier under stalls and hostile batches, and gold answers that are well-formed (docs/tasks.md).

A timeout never becomes a wrong reward that sticks (nothing decided through a timeout is cached); a batch of
hostile answers is scored within a bound; the cheap checks refuse power towers, powers of powers, nested
factorials and unbalanced brackets; a float gold that is NaN, infinite or float noise is refused at load.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlcr.tasks import math_verifier
from rlcr.tasks.base import TaskFormatError
from rlcr.tasks.math import MathTask
from rlcr.tasks.math_verifier import answer_problem, equivalent

# x^12 + 12x^11 + … + 1, expanded: its parse takes a good part of a second, so a stall lands inside it
EXPANDED = ("x^{12} + 12 x^{11} + 66 x^{10} + 220 x^{9} + 495 x^{8} + 792 x^{7} + 924 x^{6} + 792 x^{5} + "
            "495 x^{4} + 220 x^{3} + 66 x^{2} + 12 x + {c}")


def _worker_pid() -> int:
    assert equivalent("1", "1")  # started and ready
    return math_verifier._WORKER._proc.pid


def test_a_stalled_worker_never_turns_into_a_wrong_reward_that_sticks():
    """The worker is paused (SIGSTOP) for 1.6 s while it parses a new gold: past math-verify's 1 s alarm
    (the original code then cached the gold as unparseable and the pair as wrong, for good)."""
    pid, gold = _worker_pid(), EXPANDED.replace("{c}", "1")

    def stall():
        time.sleep(0.05)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.6)
        os.kill(pid, signal.SIGCONT)

    pause = threading.Thread(target=stall)
    pause.start()
    first = equivalent(gold, gold)
    pause.join()
    assert first  # the timed-out attempt was retried with a fresh deadline
    assert equivalent(gold, gold)  # the gold string itself still scores right
    assert equivalent(gold, "(x+1)^{12}")  # and so does another form of it


def test_a_timed_out_attempt_is_neither_cached_nor_retried_past_once():
    gold = EXPANDED.replace("{c}", "2")
    _worker_pid()
    with math_verifier.batch(1) as counts:
        assert not equivalent(gold, gold, deadline_s=0.02)  # the worker's timer fires in the gold's parse
        assert (counts.timeouts, counts.retries) == (1, 1)  # retried once, then counted
        assert not equivalent(gold, gold, deadline_s=0.02)  # in this batch the answer costs once
        assert counts.retries == 1
    assert (gold, gold) not in math_verifier._WORKER._cache
    assert equivalent(gold, gold)  # neither the gold's parse nor the pair was kept as "wrong"
    assert equivalent(gold, "(x+1)^{12} + 1")


def _hostile(k: int) -> str:
    """64 distinct hostile answers: slow ones that pass the cheap checks, and the checks' former bypasses."""
    return [f"(x+y+{k})^{{100}}", f"(k^{{99{k:02d}}})^{{9999}}", f"{k}^{{9}}^{{9}}", "}" * 12 + "{" * 20 + str(k)
            + "}" * 20, f"){k}", f"({k}!)!"][k % 6]


def test_a_batch_of_64_hostile_answers_is_scored_within_5_seconds():
    from rlcr.rollout.stages import score_answers

    assert equivalent("5", "5")  # the worker's start is not the batch's
    answers = [_hostile(k) for k in range(64)]
    assert len(set(answers)) == 64
    batch = pd.DataFrame({"question": ["q"] * 64, "answer": ["5"] * 64, "level": [None] * 64,
                          "completion_text": [f"<think>x</think>\n<answer>{a}</answer>" for a in answers]})
    start = time.perf_counter()
    out = score_answers(batch, 0.1, "rlvr", task="math")
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, elapsed  # the bound the issue asks for (the budget is 4.06 s)
    assert out["correct"].tolist() == [0.0] * 64
    assert out["verifier_timeouts"].sum() >= 1  # the slow ones ran out of the batch's budget, counted
    assert set(out["verifier_timeouts"]) <= {0, 1}
    with math_verifier.batch(1):  # an honest answer in the next batch is not hurt
        assert equivalent("5", "5.0")


@pytest.mark.parametrize("text", ["a^{b}^{c}", "2^9^9", "7^{9} ^{9}", "(k^{9999})^{9999}", "{(x^{200})}^{100}",
                                  "}" * 12 + "{" * 20 + "1" + "}" * 20, ")" * 12 + "(" * 20 + "1" + ")" * 20,
                                  "}5", ")5", "(99!)!", "99999!", "9!!", "\\binom{99999999}{4}"])
def test_the_cheap_checks_refuse_former_bypasses(text):
    assert answer_problem(text) is not None


@pytest.mark.parametrize("text", ["(x^2+1)^2", "[0, 1)", "(-\\infty, 2]", "(n+1)!", "5!", "x^{2005}",
                                  "(2^{10})^{3}", "1\\!000", "\\binom{10}{3}", "e^{i\\pi}"])
def test_the_cheap_checks_keep_ordinary_answers(text):
    assert answer_problem(text) is None


def _parquet(tmp_path, answers: list) -> str:
    path = tmp_path / "golds.parquet"
    pq.write_table(pa.table({"question": [f"q{i}" for i in range(len(answers))],
                             "answer": pa.array(answers, type=pa.float64())}), path)
    return str(path)


@pytest.mark.parametrize("bad, says", [(float("nan"), "missing (NaN)"), (float("inf"), "not a finite number"),
                                       (0.1 + 0.2, "over 15 significant digits")])
def test_a_non_finite_or_noisy_float_gold_is_refused_naming_the_row(tmp_path, bad, says):
    path = _parquet(tmp_path, [0.5, bad])
    with pytest.raises(TaskFormatError) as e:
        MathTask().load(path)
    message = str(e.value)
    assert "row 2" in message and "'answer'" in message and says in message and "\n" not in message


def test_float_golds_are_written_as_plain_decimals(tmp_path):
    problems = MathTask().load(_parquet(tmp_path, [0.25, 42.0, 1e-05, -3.5]))
    assert [p.answer for p in problems] == ["0.25", "42", "0.00001", "-3.5"]
    assert equivalent(problems[2].answer, "10^{-5}")


def test_a_nan_written_as_text_is_refused(tmp_path):
    path = tmp_path / "golds.jsonl"
    path.write_text('{"question": "q", "answer": "4"}\n{"question": "r", "answer": "NaN"}\n')
    with pytest.raises(TaskFormatError, match="row 2.*NaN"):
        MathTask().load(str(path))


def test_a_nan_level_is_no_level(tmp_path):
    path = tmp_path / "levels.parquet"
    pq.write_table(pa.table({"question": ["q"], "answer": ["4"], "level": pa.array([math.nan])}), path)
    assert MathTask().load(str(path))[0].level is None


def test_verifier_timeouts_reach_the_rollout_metrics():
    from rlcr.rollout.pipeline import rollout_stats

    rows = [{"sample_type": "answer", "completion_ids": [1, 2], "loss_mask": [1, 1], "reward": 0.0, "truncated": False,
             "score": 0.1, "correct": 0.0, "confidence": None, "verifier_timeouts": n} for n in (0, 2, 1)]
    rows.append({"sample_type": "confidence", "completion_ids": [3], "loss_mask": [1], "reward": 1.0,
                 "truncated": False, "confidence": 0.5, "verifier_timeouts": math.nan})
    assert rollout_stats(rows)["verifier/timeouts"] == 3.0  # logged as rollout/verifier/timeouts
