"""Faithfulness probe (docs/design.md §15): early answering on truncated reasoning, calibration report.

    truncation.py  where to cut a chain of thought (pure)
    metrics.py     curves, AOC, verbalized-vs-Monte-Carlo gap (pure numpy)
    probe.py       turn 1, turn 2, forced answers at each cut (vLLM behind a sampler)
    report.py      report.json + self-contained report.html in the run's storage

The Prefect flow ``rlcr-probe`` (deployment ``nightly``) is ``flows/probe.py``.
"""

from rlcr.probe.metrics import aoc, curve_aoc, curve_auc, mean_curve, verbalized_gap
from rlcr.probe.probe import ProbeSettings, probe_checkpoint, run_probe
from rlcr.probe.report import latest_report, render_html, write_report
from rlcr.probe.truncation import TruncationPoint, reasoning_of, sentence_cuts, truncation_points

__all__ = [
    "aoc", "curve_aoc", "curve_auc", "mean_curve", "verbalized_gap",
    "ProbeSettings", "probe_checkpoint", "run_probe",
    "latest_report", "render_html", "write_report",
    "TruncationPoint", "reasoning_of", "sentence_cuts", "truncation_points",
]
