"""bench/methods.py's report: its table, note, picture and headline from evaluation curves (the part that runs
after training; the training is `rlcr/train` itself, tested in test_flows.py). Pure: no Ray, vLLM or Prefect."""

import math

import pytest

from bench.methods import ece_ratio, plot_curves, results_table, table_note


def ev(acc: float, ece: float, *, by_count=None, seconds=None) -> dict:
    out = {"accuracy": acc, "ece": ece, "brier": 0.2, "auroc": 0.7, "confidence_parse_rate": 1.0,
           "ci": {"accuracy": [acc - 0.05, acc + 0.05], "ece": [ece - 0.01, ece + 0.01]},
           "by_count": by_count or {}, "n": 40, "n_tasks": 10, "n_answers": 40,
           "reliability": [{"mean_confidence": 0.3, "accuracy": 0.25, "count": 30},
                           {"mean_confidence": 0.8, "accuracy": 0.7, "count": 10}, {"count": 0}]}
    return {**out, **({"seconds": seconds} if seconds is not None else {})}


COST = {"generated": 1000.0, "generated_sd": 10.0, "trained": 900.0, "seconds": 30.0, "seconds_sd": 2.0}
CURVES = {"rlcr": [(0, ev(0.3, 0.2), {}), (5, ev(0.4, 0.10, seconds=12), {}), (10, ev(0.45, 0.08, seconds=11), {})],
          "rlvr": [(0, ev(0.3, 0.25), {}), (5, ev(0.42, 0.20, by_count={"3": {"accuracy": 0.6, "auroc": None}},
                                                   seconds=9), {})]}


def test_the_table_shows_each_method_at_the_start_the_last_common_and_its_own_last_evaluation():
    lines = results_table(["rlcr", "rlvr"], CURVES, {"rlcr": COST, "rlvr": COST}, {"rlcr": 4, "rlvr": 9}, 5)
    header, rule, *rows = lines
    assert "acc. / AUROC, 3 numbers" in header and header.count("|") == rule.count("|")
    assert [r.split(" | ")[:3] for r in rows] == [["| rlcr", "4", "0"], ["| rlcr", "4", "5"], ["| rlcr", "4", "10"],
                                                   ["| rlvr", "9", "0"], ["| rlvr", "9", "5"]]
    assert all(r.count("|") == header.count("|") for r in rows)
    assert "0.400 [0.350, 0.450]" in rows[1] and "0.60 / –" in rows[4] and "1000 ± 10 / 900" in rows[4]
    assert rows[0].endswith("– |") and rows[2].endswith("11 |")  # iteration 0 has no evaluation time


def test_the_headline_is_the_ece_ratio_at_the_last_iteration_both_evaluated():
    last, ece, ratio = ece_ratio(CURVES)
    assert last == 5 and ece == {"rlcr": 0.10, "rlvr": 0.20} and ratio == pytest.approx(0.5)
    last, _, ratio = ece_ratio({"rlcr": CURVES["rlcr"], "rlvr": []})
    assert last is None and math.isnan(ratio)


def test_the_note_names_the_held_out_size_and_the_variant():
    class Args:
        variant, config, overrides = "proper", "configs/methods.yaml", ["scale_by_std=false"]

    note = table_note(Args, 1000, ["rlcr", "rlvr"], CURVES)
    assert note.startswith("Held-out: 10 tasks × 4 answers; [95% bootstrap CI, 1000 resamples of tasks]")
    assert note.endswith("Variant 'proper' of configs/methods.yaml: scale_by_std=false.")


def test_the_picture_is_written_even_with_a_method_not_yet_evaluated(tmp_path):
    png = tmp_path / "methods.png"
    plot_curves(["rlcr", "rlvr"], {"rlcr": CURVES["rlcr"], "rlvr": []}, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
