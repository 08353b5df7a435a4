"""The addendum's table (bench/protocol-2.yaml, issue 51), from committed records alone.

Records: the first grid's (``bench/results/grid/``: seeds 1–3, warm_start, rlcr and rlvr in domain) and the
addendum's (``bench/results/grid-2/``, bench/grid_addendum.py: seeds 4–5 of those three, ``rlvr_g4`` on seeds 1–5,
and every policy on the math and QA tasks' shipped sets). An evaluation on record in both directories is an error: the
addendum never redoes one of the first grid's.

1. **In domain** (test split, primary protocol): each policy, RLVR recalibrated per stratum (the Platt map the
   addendum names as its baseline, and the isotonic one it reports), and each policy's difficulty prior, with the
   hierarchical bootstrap (seeds, then tasks) and the per-seed values.
2. **Out of domain** (the math set, and the QA set since the addendum's amendment 1; primary protocol): each
   policy's accuracy and calibration.
3. **The six goals**, each a paired figure read on both intervals the addendum fixes — the hierarchical bootstrap
   and the seed-level t-interval (df = n − 1) over seeds 1–5 — met only if its rule holds on both; decided once
   every seed has the records the goal reads. Beside them, the same figures on the fresh seeds 4 and 5 alone
   (descriptive).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from bench.grid_protocol import OUT_OF_DOMAIN
from bench.grid_records import DEFAULT_DIR, RecordError, read_records
from bench.grid_table import (
    METRIC_COLUMNS,
    interval_text,
    metrics_table,
    recalibrated_rows,
    row_results,
    scored_rows,
    seed_text,
    warm_start_lines,
)
from rlcr.evaluation.protocol_stats import NON_INFERIORITY_MARGIN

SECOND_DIR = DEFAULT_DIR.parent / "grid-2"
BEGIN = ("<!-- grid-2-table: begin (written by `python bench/grid.py --protocol bench/protocol-2.yaml --table-only "
         "--docs docs/results.md`; do not edit by hand) -->")
END = "<!-- grid-2-table: end -->"
POLICIES = ("warm_start", "rlcr", "rlvr", "rlvr_g4")
BASELINE = "rlvr + Platt per stratum"

GOALS: dict[str, tuple[str, str, str, Callable[[Sequence[float]], bool], tuple[str, ...]]] = {
    "within_stratum_auroc": ("auroc_within_vs_rlvr", "RLCR − RLVR, mean within-stratum AUROC", "lower bound > 0",
                             lambda i: i[0] > 0, ("rlcr", "rlvr")),
    "recalibrated_brier": ("brier_vs_recalibrated", f"RLCR − ({BASELINE}), Brier", "upper bound < 0",
                           lambda i: i[1] < 0, ("rlcr", BASELINE)),
    "brier_skill": ("brier_skill", "RLCR's Brier skill over its difficulty prior", "lower bound > 0",
                    lambda i: i[0] > 0, ("rlcr",)),
    "accuracy_non_inferior": ("accuracy_vs_rlvr_g4", "RLCR − RLVR at G_a = 4, accuracy",
                              f"lower bound > −{NON_INFERIORITY_MARGIN:g}", lambda i: i[0] > -NON_INFERIORITY_MARGIN,
                              ("rlcr", "rlvr_g4")),
    "out_of_domain_ece": ("ood_ece_vs_rlvr", "math set: RLCR − RLVR, ECE (10 equal-width)", "upper bound < 0",
                          lambda i: i[1] < 0, ("rlcr", "rlvr")),
    "out_of_domain_ece_qa": ("ood_ece_vs_rlvr", "QA set: RLCR − RLVR, ECE (10 equal-width)", "upper bound < 0",
                             lambda i: i[1] < 0, ("rlcr", "rlvr")),
}
"""Per goal of bench/protocol-2.yaml: (its figure's key, what it is, its rule, the rule on an interval, the rows
it pairs — of an out-of-domain set's records for the goals in :data:`OOD_GOALS`, of the in-domain rows for the
others)."""
OOD_GOALS = {"out_of_domain_ece": "math", "out_of_domain_ece_qa": "qa"}
"""The out-of-domain goals, each with the split name of the set it reads."""
OOD_NAMES = {"math": "the math task's shipped set",
             "qa": "the `qa` task's shipped set, rlcr/tasks/data/qa_heldout.jsonl"}
OOD_SETS = {split: (key, OOD_NAMES[split]) for key, split in OUT_OF_DOMAIN.items()}
"""Per out-of-domain split (bench/grid_protocol.py's :data:`OUT_OF_DOMAIN`): its key under the addendum's
``out_of_domain`` and how the table names it."""


def read_both(first: Path, second: Path) -> tuple[dict, dict]:
    """Both directories' records and warm-start digests, merged; an evaluation on record in both is an error."""
    digests_a: dict = {}
    digests_b: dict = {}
    a, b = read_records(first, digests_a), read_records(second, digests_b)
    twice = sorted(set(a) & set(b))
    if twice:
        s, p, sp, pr = twice[0]
        raise RecordError(f"{second}: s{s}-{p}-{sp}-{pr} is also on record under {first}; the addendum never "
                          "redoes the first grid's evaluations")
    return {**a, **b}, {**digests_a, **digests_b}


def in_domain_rows(records: Mapping) -> dict[str, dict[int, Any]]:
    """``{label: {seed: Answers}}`` of the primary protocol's test answers: each policy (its difficulty prior set),
    RLVR mapped per stratum (Platt, isotonic: fitted on its calibration answers of the same seed), each prior."""
    from rlcr.evaluation.recalibration import apply_isotonic, apply_platt, fit_isotonic, fit_platt

    seeds = sorted({k[0] for k in records})
    scored = {p: {s: x for s in seeds if (x := scored_rows(records, p, s, "primary", False)) is not None}
              for p in POLICIES}
    rows: dict[str, dict[int, Any]] = {p: {s: t for s, (t, _) in v.items()} for p, v in scored.items() if v}
    for name, fit, apply in (("Platt", fit_platt, apply_platt), ("isotonic", fit_isotonic, apply_isotonic)):
        if scored["rlvr"]:
            rows[f"rlvr + {name} per stratum"] = {s: recalibrated_rows(t, c, fit, apply, per_stratum=True)
                                                  for s, (t, c) in scored["rlvr"].items()}
    for p in POLICIES:
        if scored[p]:
            rows[f"difficulty prior of {p}"] = {s: t.with_confidence(t.prior) for s, (t, _) in scored[p].items()}
    return rows


def ood_rows(records: Mapping, which: str) -> dict[str, dict[int, Any]]:
    """``{policy: {seed: Answers}}`` of one out-of-domain set's records (``which``: ``math``, ``qa``; primary
    protocol)."""
    out: dict[str, dict[int, Any]] = {}
    for (s, p, split, protocol), a in sorted(records.items()):
        if split == which and protocol == "primary":
            out.setdefault(p, {})[s] = a
    return out


def _statistic(m: Mapping[str, Any]) -> dict[str, float]:
    """Every goal's figure that the rows in ``m`` allow (a bootstrap passes one goal's rows)."""
    from rlcr.evaluation.protocol_stats import protocol_metrics

    s = {k: protocol_metrics(v) for k, v in m.items()}
    out = {"brier_skill": s["rlcr"]["brier_skill"]}
    if "rlvr" in s:
        out["auroc_within_vs_rlvr"] = s["rlcr"]["auroc_within"] - s["rlvr"]["auroc_within"]
        out["ood_ece_vs_rlvr"] = s["rlcr"]["ece"] - s["rlvr"]["ece"]
    if BASELINE in s:
        out["brier_vs_recalibrated"] = s["rlcr"]["brier"] - s[BASELINE]["brier"]
    if "rlvr_g4" in s:
        out["accuracy_vs_rlvr_g4"] = s["rlcr"]["accuracy"] - s["rlvr_g4"]["accuracy"]
    return out


def _paired(rows: Mapping, need: Sequence[str], seeds: Sequence[int], statistic, n: int, level: float):
    """The bootstrap and the seed-level reading of ``statistic`` over the ``seeds`` where every one of ``need``
    has answers (None if no seed has them all)."""
    from rlcr.evaluation.protocol_stats import hierarchical_bootstrap, seed_level

    have = [s for s in seeds if all(s in rows.get(k, {}) for k in need)]
    if not have:
        return None
    runs = {k: {s: rows[k][s] for s in have} for k in need}
    result = hierarchical_bootstrap(runs, statistic, n_resamples=n, level=level, seed=0)
    return {"result": result, "seed_level": seed_level(result, level), "seeds": have}


def decide_goals(rows: Mapping, ood: Mapping, seeds: Sequence[int], new_seeds: Sequence[int], n: int,
                 level: float) -> dict[str, Any]:
    """Per goal: its figure on both intervals over those of ``seeds`` that have its rows (``ood``: per
    out-of-domain split, its rows), whether the rule holds
    on each, and the verdict (``met``: True/False once every seed is in, None before); ``new``: the same over
    ``new_seeds`` alone (descriptive)."""
    out = {}
    for goal, (key, _, _, holds, need) in GOALS.items():
        source = ood.get(OOD_GOALS[goal], {}) if goal in OOD_GOALS else rows
        r = _paired(source, need, seeds, _statistic, n, level)
        new = _paired(source, need, new_seeds, _statistic, n, level)
        if r is None:
            out[goal] = {"read": None, "new": new, "met": None}
            continue
        boot, at_seed = r["result"]["ci"].get(key), r["seed_level"]["ci"].get(key)
        ok = [bool(i is not None and holds(i)) for i in (boot, at_seed)]
        out[goal] = {"read": r, "new": new, "holds": ok, "met": all(ok) if set(seeds) <= set(r["seeds"]) else None}
    return out


def goal_lines(d: Mapping[str, Any], seeds: Sequence[int], new_seeds: Sequence[int]) -> tuple[list[str], str]:
    """The goals as a markdown table, and the headline value (``k/6`` once all are decided)."""
    lines = ["| goal | figure: pooled point [bootstrap interval] (per seed; their mean) | seed level: mean "
             "[95% t-interval] | rule | holds (bootstrap / seed level) | goal | seeds "
             f"{', '.join(map(str, new_seeds))} alone (descriptive) |", "|---|---|---|---|---|---|---|"]
    for goal, (key, what, rule, _, _) in GOALS.items():
        g = d[goal]
        if g["read"] is None:
            lines.append(f"| {goal} | {what}: no seed has its records yet | – | {rule} | – | not decided | – |")
            continue
        r, new = g["read"], g["new"]
        holds = " / ".join("yes" if h else "no" for h in g["holds"])
        verdict = {True: "**met**", False: "**not met**", None: "not decided"}[g["met"]]
        fresh = (f"{interval_text(new['result'], key, per_seed=False)}; seed level {seed_text(new['seed_level'], key)}"
                 if new is not None else "–")
        lines.append(f"| {goal} | {what}: {interval_text(r['result'], key)} | {seed_text(r['seed_level'], key)} | "
                     f"{rule} | {holds} | {verdict} | {fresh} |")
    decided = [g for g in GOALS if d[g]["met"] is not None]
    if len(decided) == len(GOALS):
        return lines, f"{sum(bool(d[g]['met']) for g in GOALS)}/{len(GOALS)}"
    lines += ["", f"Not decided: each rule reads seeds {', '.join(map(str, seeds))}; a goal whose records do not yet "
                  "cover them all is shown on the seeds that have them, as provisional figures."]
    return lines, f"undecided ({len(decided)}/{len(GOALS)} goals decided)"


def presence(records: Mapping, seeds: Sequence[int]) -> list[str]:
    """Per seed, which policies have their in-domain (test and calibration, primary), math and QA records."""
    out = []
    for s in seeds:
        inside = [p for p in POLICIES if all((s, p, sp, "primary") in records for sp in ("test", "calibration"))]
        ood = {w: [p for p in POLICIES if (s, p, w, "primary") in records] for w in OOD_SETS}
        out.append(f"seed {s}: in domain {', '.join(inside) or 'none'}; "
                   + "; ".join(f"{w} {', '.join(v) or 'none'}" for w, v in ood.items()))
    return out


MIN_AUROC_CLASS = 5
"""An AUROC interval is shown only where at least this many answers are right and as many wrong, pooled over the
seeds: an AUROC ranks the right answers against the wrong ones, and from one or two right answers its bootstrap
interval only says which few were drawn (added after the records were seen; it changes no figure)."""


def _auroc_intervals_withheld(results: Mapping[str, Any], rows: Mapping) -> tuple[dict[str, Any], list[str]]:
    """``results`` with the AUROC intervals of rows with too few right (or wrong) answers removed, and a note per
    such row naming the counts."""
    out, notes = dict(results), []
    for label, runs in rows.items():
        right = int(sum(float(a.correct.sum()) for a in runs.values()))
        wrong = int(sum(a.correct.size for a in runs.values())) - right
        if min(right, wrong) >= MIN_AUROC_CLASS:
            continue
        r = dict(results[label])
        r["ci"] = {k: (None if k.startswith("auroc") else v) for k, v in r["ci"].items()}
        out[label] = r
        notes.append(f"{label}: {right} right and {wrong} wrong answers")
    return out, notes


def ood_section(rows: Mapping, named: str, answers: int, n: int, level: float) -> list[str]:
    """One out-of-domain set's table: each policy's accuracy and calibration, its parse rate, per seed."""
    rate = {p: float(np.mean([np.isfinite(a.confidence).mean() for a in runs.values()])) for p, runs in rows.items()}
    results, withheld = _auroc_intervals_withheld(row_results(rows, n, level), rows)
    lines = [f"**Out of domain** ({named}, {answers} sampled answers per problem; no difficulty prior, so no Brier "
             "skill):", "", *metrics_table(results, rows, per_seed=True, parse_rates=rate,
                                           columns=[c for c in METRIC_COLUMNS if c[0] != "brier_skill"])]
    if withheld:
        lines += ["", f"AUROC shown without an interval where fewer than {MIN_AUROC_CLASS} answers are right (or "
                      "wrong), pooled over the seeds: " + "; ".join(withheld) + "."]
    return lines


class AddendumTable(NamedTuple):
    docs: str
    headline: str


def build_addendum_table(addendum, first: Path = DEFAULT_DIR, second: Path = SECOND_DIR,
                         n_resamples: int | None = None) -> AddendumTable:
    """docs/results.md's addendum section and the headline value, from the records under both directories."""
    records, digests = read_both(first, second)
    seeds, new = addendum.seeds, addendum.new_seeds
    n, level = n_resamples or addendum.base.n_resamples, addendum.level
    lines = ["Records (bench/results/grid/ and bench/results/grid-2/), per seed: " + "; ".join(presence(records, seeds))
             + "."]
    if digests:
        lines += ["", "Warm-starts (sha256 of the weights): " + "; ".join(warm_start_lines(
            {k: v for k, v in digests.items() if k[1] in POLICIES})) + "."]
    rows, ood = in_domain_rows(records), {w: ood_rows(records, w) for w in OOD_SETS}
    if rows:
        lines += ["", f"**In domain** (test split, primary protocol: sampling at the training temperature, "
                      f"{addendum.base.decodings[0].answers_per_task} answers per task). {level:.0%} intervals: "
                      f"hierarchical bootstrap, {n:,} replicates; per-seed values in brackets. `{BASELINE}` is the "
                      f"addendum's baseline; the isotonic map per stratum is reported, not used by a rule.", ""]
        lines += metrics_table(row_results(rows, n, level), rows, per_seed=True)
    for w, (key, named) in OOD_SETS.items():
        if ood[w]:
            lines += ["", *ood_section(ood[w], named, addendum.out_of_domain[key]["answers_per_task"], n, level)]
    goals, headline = goal_lines(decide_goals(rows, ood, seeds, new, n, level), seeds, new)
    lines += ["", f"**Goals** (bench/protocol-2.yaml: met only if the rule holds on both intervals over seeds "
                  f"{', '.join(map(str, seeds))}; the last column is descriptive):", ""] + goals
    return AddendumTable("\n".join(lines), headline)
