"""Exploratory readings of the addendum's records (bench/protocol-2.yaml), computed after every record was seen.

None of these changes a registered verdict; they are what a sceptical reader asks next, printed from the committed
records alone (``bench/results/grid/`` and ``bench/results/grid-2/``) so that docs/results.md's hand-written reading
can cite them:

1. **Accuracy at equal generated tokens**: RLCR − RLVR at G_a = 9 (the grid's RLVR, which generates as many tokens
   per prompt as RLCR's answers and confidences together), beside the registered comparison with RLVR at G_a = 4.
2. **The symmetric recalibration**: the same Platt map per stratum, fitted on each policy's own calibration answers,
   applied to RLCR and to RLVR, compared by Brier.
3. **Holm over the six registered goals**: each goal's seed-level one-sided p-value (t-test over seeds 1–5, df 4, in
   the direction of its rule; a non-inferiority goal tested against its margin), with Holm's step-down at one-sided
   α = 0.025 (the level a 95% two-sided interval tests each rule at).
4. **How far the accuracy verdict sits from its margin**, to four decimals.

Usage: ``python bench/addendum_readings.py [--resamples N]``; the last line is ``holm_goals_met: k/6``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.grid_addendum_table import GOALS, OOD_GOALS, SECOND_DIR, decide_goals, in_domain_rows, ood_rows, read_both  # noqa: E402
from bench.grid_protocol import load_addendum  # noqa: E402
from bench.grid_records import DEFAULT_DIR  # noqa: E402
from bench.grid_table import recalibrated_rows, scored_rows  # noqa: E402
from rlcr.evaluation.protocol_stats import NON_INFERIORITY_MARGIN, hierarchical_bootstrap, protocol_metrics, seed_level  # noqa: E402
from rlcr.evaluation.recalibration import apply_platt, fit_platt  # noqa: E402

ONE_SIDED_ALPHA = 0.025
"""Each registered rule reads one bound of a 95% two-sided interval: a one-sided test at 2.5%."""


def paired(rows, a: str, b: str, metric: str, seeds, n: int, level: float = 0.95) -> dict:
    """metric(a) − metric(b) on both intervals, with each seed's value."""
    runs = {k: {s: rows[k][s] for s in seeds} for k in (a, b)}
    result = hierarchical_bootstrap(runs, lambda m: {metric: protocol_metrics(m[a])[metric]
                                                     - protocol_metrics(m[b])[metric]},
                                    n_resamples=n, level=level, seed=0)
    return {"result": result, "seed_level": seed_level(result, level)}


def describe(r: dict, key: str, digits: int = 3) -> str:
    res, sl = r["result"], r["seed_level"]
    f = f"{{:+.{digits}f}}"
    ci, sci = res["ci"][key], sl["ci"][key]
    per = [v[key] for v in res["per_seed"].values()]
    return (f"{f.format(res['point'][key])} [{f.format(ci[0])}, {f.format(ci[1])}] pooled; seed level "
            f"{f.format(sl['point'][key])} [{f.format(sci[0])}, {f.format(sci[1])}]; per seed "
            + ", ".join(f"s{s} {f.format(v)}" for s, v in zip(res["per_seed"], per))
            + f"; {sum(v < 0 for v in per)} of {len(per)} negative")


def one_sided_p(values, rule: str, margin: float = 0.0) -> float:
    """The seed-level one-sided p-value of a rule: ``lower`` (H1: mean > −margin) or ``upper`` (H1: mean < 0)."""
    v = np.asarray(values, dtype=float)
    se = v.std(ddof=1) / math.sqrt(v.size)
    if rule == "lower":
        return float(stats.t.sf((v.mean() + margin) / se, df=v.size - 1))
    return float(stats.t.cdf(v.mean() / se, df=v.size - 1))


def holm(pvalues: dict[str, float], alpha: float) -> dict[str, bool]:
    """Holm's step-down: the k-th smallest p-value is compared with alpha / (m − k + 1); the first failure stops."""
    out, m = {}, len(pvalues)
    for k, (goal, p) in enumerate(sorted(pvalues.items(), key=lambda kv: kv[1])):
        out[goal] = p <= alpha / (m - k) and all(out.values())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resamples", type=int, default=None, help="bootstrap replicates (default: the protocol's)")
    args = ap.parse_args(argv)
    addendum = load_addendum(Path(__file__).with_name("protocol-2.yaml"))
    n = args.resamples or addendum.base.n_resamples
    records, _ = read_both(DEFAULT_DIR, SECOND_DIR)
    seeds = list(addendum.seeds)
    rows = in_domain_rows(records)

    r = paired(rows, "rlcr", "rlvr", "accuracy", seeds, n)
    print(f"accuracy RLCR − RLVR (G_a = 9, equal generated tokens): {describe(r, 'accuracy')}", flush=True)
    r4 = paired(rows, "rlcr", "rlvr_g4", "accuracy", seeds, n)
    print(f"accuracy RLCR − RLVR (G_a = 4, registered): {describe(r4, 'accuracy', 4)}", flush=True)
    lower = r4["seed_level"]["ci"]["accuracy"][0]
    print(f"accuracy verdict: seed-level lower bound {lower:+.4f} against the margin −{NON_INFERIORITY_MARGIN:g} "
          f"(short by {-NON_INFERIORITY_MARGIN - lower:.4f})", flush=True)

    for p in ("rlcr",):
        scored = {s: scored_rows(records, p, s, "primary", False) for s in seeds}
        rows[f"{p} + Platt per stratum"] = {s: recalibrated_rows(t, c, fit_platt, apply_platt, per_stratum=True)
                                            for s, (t, c) in scored.items()}
    r = paired(rows, "rlcr + Platt per stratum", "rlvr + Platt per stratum", "brier", seeds, n)
    print(f"Brier (RLCR + Platt per stratum) − (RLVR + Platt per stratum): {describe(r, 'brier')}", flush=True)

    r = paired(rows, "rlcr", "rlvr_g4", "auroc_within", seeds, n)
    print(f"within-stratum AUROC RLCR − RLVR (G_a = 4), sampled: {describe(r, 'auroc_within')}", flush=True)
    greedy = {p: {s: x[0] for s in seeds if (x := scored_rows(records, p, s, "paper", True)) is not None}
              for p in ("rlcr", "rlvr", "rlvr_g4")}
    for other in ("rlvr", "rlvr_g4"):
        have = [s for s in seeds if s in greedy["rlcr"] and s in greedy[other]]
        r = paired(greedy, "rlcr", other, "auroc_within", have, n)
        print(f"within-stratum AUROC RLCR − {other}, greedy (paper protocol, unparsed = 0; seeds "
              f"{', '.join(map(str, have))}): {describe(r, 'auroc_within')}", flush=True)
    print("distinct confidences of greedy RLCR per seed: " + ", ".join(
        f"s{s} {np.unique(a.confidence).size}" for s, a in sorted(greedy["rlcr"].items())), flush=True)

    ood = {w: ood_rows(records, w) for w in set(OOD_GOALS.values())}
    decided = decide_goals(rows, ood, seeds, list(addendum.new_seeds), n, addendum.level)
    pvalues = {}
    for goal, (key, _, rule, _, _) in GOALS.items():
        per = [v[key] for v in decided[goal]["read"]["result"]["per_seed"].values()]
        margin = NON_INFERIORITY_MARGIN if goal == "accuracy_non_inferior" else 0.0
        pvalues[goal] = one_sided_p(per, "lower" if rule.startswith("lower") else "upper", margin)
    passed = holm(pvalues, ONE_SIDED_ALPHA)
    for k, (goal, p) in enumerate(sorted(pvalues.items(), key=lambda kv: kv[1])):
        print(f"holm {goal}: one-sided p {p:.4f} against {ONE_SIDED_ALPHA / (len(pvalues) - k):.4f}; registered "
              f"verdict {'met' if decided[goal]['met'] else 'not met'}; with Holm at the seed level "
              f"{'holds' if passed[goal] else 'does not hold'}", flush=True)
    print(f"holm_goals_met: {sum(passed[g] and bool(decided[g]['met']) for g in GOALS)}/{len(GOALS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
