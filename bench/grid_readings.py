"""The first grid's round-2 readings (issue 51; exploratory, added after its records were seen, never changing a
verdict), used by :func:`bench.grid_table.build_table`: RLCR and RLVR recalibrated per stratum compared pairwise,
and the goals' figures under the paper protocol (greedy) with the distinct confidences each policy states."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from bench.grid_records import POLICIES
from bench.grid_table import EXPLORATORY, GOAL_TEXT, decide_goals, interval_text, seed_text

RECALIBRATION_PAIRS = {"RLCR − (RLVR + Platt per stratum)": ("rlcr", "rlvr + Platt per stratum"),
                       "RLCR − (RLVR + isotonic per stratum)": ("rlcr", "rlvr + isotonic per stratum"),
                       "(RLCR + Platt per stratum) − (RLVR + Platt per stratum)":
                           ("rlcr + Platt per stratum", "rlvr + Platt per stratum"),
                       "(RLCR + isotonic per stratum) − (RLVR + isotonic per stratum)":
                           ("rlcr + isotonic per stratum", "rlvr + isotonic per stratum")}
"""The exploratory comparisons with stratum-aware recalibration (row labels without their mark)."""
DIFFERENCE_COLUMNS = (("brier", "Brier"), ("ece", "ECE (10 equal-width)"), ("auroc_within", "AUROC within stratum"))


def recalibration_comparison(rows: Mapping[str, Mapping[int, Any]], n_resamples: int,
                             level: float) -> dict[str, Any] | None:
    """Paired differences (Brier, ECE, within-stratum AUROC) of :data:`RECALIBRATION_PAIRS` on the seeds every
    row has, by the hierarchical bootstrap, and their seed-level reading; None without the rows."""
    from rlcr.protocol_stats import difference_statistic, hierarchical_bootstrap, seed_level

    labels = {k: k if k in POLICIES else f"{k} {EXPLORATORY}" for pair in RECALIBRATION_PAIRS.values() for k in pair}
    if any(v not in rows for v in labels.values()):
        return None
    seeds = sorted(set.intersection(*(set(rows[v]) for v in labels.values())))
    runs = {k: {s: rows[v][s] for s in seeds} for k, v in labels.items()}
    result = hierarchical_bootstrap(runs, difference_statistic(RECALIBRATION_PAIRS, [k for k, _ in DIFFERENCE_COLUMNS]),
                                    n_resamples=n_resamples, level=level, seed=0)
    return {"result": result, "seed_level": seed_level(result, level), "seeds": seeds}


def recalibration_lines(c: Mapping[str, Any] | None) -> list[str]:
    """The stratum-aware recalibration comparisons as a table: each difference pooled with its bootstrap
    interval and per-seed values, then its seed-level mean and t-interval."""
    if c is None:
        return []
    df = len(c["seeds"]) - 1
    lines = ["| comparison (paired) | " + " | ".join(t for _, t in DIFFERENCE_COLUMNS) + " |",
             "|---|" + "---|" * len(DIFFERENCE_COLUMNS)]
    for name in RECALIBRATION_PAIRS:
        cells = [f"{interval_text(c['result'], f'{name}:{k}')}; seed level {seed_text(c['seed_level'], f'{name}:{k}')}"
                 for k, _ in DIFFERENCE_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + ["", f"Seed level: mean of the per-seed differences [95% t-interval, df {df}]."]


def paper_flags(paper: Mapping[str, Mapping[int, Any]], protocol_seeds: Sequence[int], n: int,
                level: float) -> tuple[list[str], str]:
    """The goals' figures under greedy decoding (no decision: the rules read the primary protocol), with their
    seed-level reading, and how many distinct confidences each policy states per seed. Returns (lines, the
    README's one-line flag)."""
    d = decide_goals(paper, protocol_seeds, n, level)
    if d is None:
        return [], ""
    df = len(d["seeds"]) - 1
    lines = [f"| figure (greedy; no decision) | pooled [bootstrap] (per seed; mean) | the primary protocol's rule | "
             f"would it hold | seed level: mean [95% t, df {df}] |", "|---|---|---|---|---|"]
    for goal, items in d["parts"].items():
        for i, (key, g) in enumerate(items):
            lines.append(f"| {GOAL_TEXT[key][0]} | {interval_text(d['result'], key)} | {GOAL_TEXT[key][1]} | "
                         f"{'yes' if g['met'] else '**no**'} | {seed_text(d['seed_level'], key)} |")
    counts = {p: {s: int(np.unique(a.confidence[np.isfinite(a.confidence)]).size) for s, a in paper[p].items()}
              for p in POLICIES if p in paper}
    lines += ["", "Distinct stated confidences per seed on the greedy test answers (one per task; unparsed = 0 "
                  "counted as a value): " + "; ".join(f"{p} " + ", ".join(f"s{s} {k}" for s, k in v.items())
                                        for p, v in counts.items()) + "."]
    r = d["result"]
    short = (f"{EXPLORATORY} Under the paper protocol (greedy, one answer per task; no decision) RLCR's Brier skill is "
             f"{interval_text(r, 'brier_skill', False)} and RLCR − RLVR within-stratum AUROC "
             f"{interval_text(r, 'auroc_within_vs_rlvr', False)}; greedy RLCR states "
             + ", ".join(str(k) for k in counts.get("rlcr", {}).values()) + " distinct confidences on seeds "
             + ", ".join(map(str, counts.get("rlcr", {}))) + ".")
    return lines, short
