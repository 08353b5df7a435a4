"""The benchmarks' bookkeeping (bench/perf/iteration.py; bench/perf/generation.py's tail estimate; no flow run) and the
rollout stages' mode switch (no Ray)."""

import math

import pytest

from conftest import load_bench
from rlcr.rollout.pipeline import STAGES_ENV, stage_compute


def _bench():
    return load_bench("iteration")


def test_schedule_warms_up_each_mode_then_alternates_the_order():
    plan = _bench().schedule(["tasks", "actors"], 3)
    assert plan == {1: (0, "tasks"), 2: (0, "actors"), 3: (1, "actors"), 4: (1, "tasks"), 5: (2, "tasks"),
                    6: (2, "actors"), 7: (3, "actors"), 8: (3, "tasks")}
    assert _bench().schedule(["tasks"], 2) == {1: (0, "tasks"), 2: (1, "tasks"), 3: (2, "tasks")}


def test_figures_from_the_flows_metrics():
    metrics = {"timings": {"rollouts_s": 5.0, "advantages_s": 0.5, "update_s": 3.0, "sync_weights_s": 0.4,
                           "stage_s": 0.1, "rollout/pipeline_s": 4.5, "rollout/answer_generate_s": 2.5,
                           "rollout/confidence_generate_s": 1.0, "rollout/answer_init_s": 0.01},
               "update": {"train_s": 2.0, "prepass_s": 0.5, "loss": 0.1}}
    f = _bench().figures(metrics)
    assert f["iteration"] == pytest.approx(9.0)
    assert f["generation"] == pytest.approx(3.5) and f["fwd_bwd"] == pytest.approx(2.5)
    assert f["stages"] == pytest.approx(1.0)  # Ray Data's part of the rollout: pipeline − generation
    assert f["overhead"] == pytest.approx(3.0) and f["fraction"] == pytest.approx(3.0 / 9.0)


def test_the_overhead_fraction_spreads_the_save_over_save_every_iterations():
    """Medians without the save, plus the median save / save_every: with save_every 1 it is the fraction of an
    iteration that saves; with 3, a third of the save counts."""
    amortised = _bench().amortised
    rows = [{"iteration": 80.0, "overhead": 8.0, "save": 6.0}, {"iteration": 74.0, "overhead": 2.0},
            {"iteration": 75.0, "overhead": 2.5}, {"iteration": 82.0, "overhead": 8.5, "save": 6.0}]
    # without the save: overheads 2.0, 2.0, 2.5, 2.5 (median 2.25), iterations 74, 74, 75, 76 (median 74.5)
    assert amortised(rows, 3) == pytest.approx(((2.25 + 2.0) / (74.5 + 2.0), 74.5 + 2.0))  # (fraction, s)
    assert amortised(rows, 1) == pytest.approx(((2.25 + 6.0) / (74.5 + 6.0), 74.5 + 6.0))
    assert amortised([{"iteration": 10.0, "overhead": 1.0}], 3) == pytest.approx((0.1, 10.0))  # no save
    assert all(math.isnan(x) for x in amortised([], 3))


def test_stage_mode_switch(monkeypatch):
    monkeypatch.delenv(STAGES_ENV, raising=False)
    assert stage_compute(["rlcr-engine-0"]) == "tasks"  # shared engines: task-based stages by default
    assert stage_compute(None) == "actors"  # a stage that owns its engine is an actor
    monkeypatch.setenv(STAGES_ENV, "actors")
    assert stage_compute(["rlcr-engine-0"]) == "actors"
    monkeypatch.setenv(STAGES_ENV, "threads")
    with pytest.raises(ValueError, match="RLCR_ROLLOUT_STAGES='threads': expected one of tasks, actors"):
        stage_compute(["rlcr-engine-0"])


def test_the_generation_tail_is_costed_from_the_batch_curve():
    """bench/perf/generation.py --batch-curve: a step with k sequences decoding costs k / rate(k), the rate
    interpolated between measured batch sizes; the tail is the steps with at most two decoding."""
    g = load_bench("generation")
    curve = {1: 30.0, 2: 55.0, 4: 90.0, 8: 130.0, 16: 160.0, 32: 170.0}
    assert g.step_seconds(curve, 1) == pytest.approx(1 / 30)
    assert g.step_seconds(curve, 3) == pytest.approx(3 / 72.5)  # halfway between 55 and 90 tokens/s
    assert g.step_seconds(curve, 64) == pytest.approx(64 / 170)  # past the largest: its rate
    # 14 answers of 10 tokens and two of 50 and 60: 10 steps at 16, 40 at 2, 10 at 1
    total, tail, tail_tokens = g.tail_cost([10] * 14 + [50, 60], curve)
    assert total == pytest.approx(10 * 16 / 160 + 40 * 2 / 55 + 10 / 30)
    assert tail == pytest.approx(40 * 2 / 55 + 10 / 30) and tail_tokens == 90
    # every sequence the same length: no tail at all
    assert g.tail_cost([20] * 16, curve)[1:] == (0.0, 0)
