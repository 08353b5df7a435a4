"""The pre-registered table built from the grid's records alone (bench/protocol.yaml; the records are
bench/grid_records.py's: the paper protocol's "unparsed = 0" is applied here, when the table is built).

The table (:func:`build_table`) uses :mod:`rlcr.evaluation.protocol_stats` for every figure: per policy and baseline
(the warm-start, each policy's difficulty prior, RLVR recalibrated by temperature scaling and by isotonic
regression, fitted on the calibration split per seed) accuracy, ECE with 10 equal-width and 10 equal-mass
bins, Brier, Brier skill over the policy's own difficulty prior, mean within-stratum AUROC and pooled AUROC,
each with its hierarchical bootstrap interval (seeds, then tasks) and its per-seed values; the paper
protocol's figures in a second table; and the four goals decided by their rules — only once every
pre-registered seed has its records (the intervals resample the protocol's seeds).

Added after the records were seen, marked † and exploratory, never changing a verdict: each per-seed
bracket ends with the seeds' mean; each goal's figure is also read at the seed level (mean of the per-seed
values, t-interval df = n − 1, the same rule applied); RLVR and RLCR recalibrated per stratum (Platt, isotonic)
as rows, with their paired differences; and the goals' figures under greedy decoding with the number of
distinct confidences per seed (those two at the end of this module).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from bench.grid_protocol import ADDENDUM_POLICIES
from bench.grid_records import DEFAULT_DIR, POLICIES, PROTOCOLS, SPLITS, read_records
from rlcr.evaluation.protocol_stats import NON_INFERIORITY_MARGIN
from rlcr.untrusted import printable

BEGIN = "<!-- grid-table: begin (written by `python bench/grid.py --protocol bench/protocol.yaml --table-only " \
        "--docs docs/results.md`; do not edit by hand) -->"
END = "<!-- grid-table: end -->"


# ----------------------------------------------------------------------------------------------- the table
EXPLORATORY = "†"
"""Marks a row or figure computed after the records were seen (issue 51): exploratory, no decision."""
METRIC_COLUMNS = (("accuracy", "accuracy"), ("ece", "ECE (10 equal-width)"), ("ece_equal_mass", "ECE (10 equal-mass)"),
                  ("brier", "Brier"), ("brier_skill", "Brier skill vs prior"),
                  ("auroc_within", "AUROC within stratum (mean)"), ("auroc", "AUROC pooled (secondary)"))


def scored_rows(records: Mapping, policy: str, seed: int, protocol: str, as_zero: bool):
    """(test answers with the policy's difficulty prior, calibration answers) or None where a record is missing."""
    from rlcr.evaluation.protocol_stats import difficulty_prior

    test, cal = records.get((seed, policy, "test", protocol)), records.get((seed, policy, "calibration", protocol))
    if test is None or cal is None:
        return None
    if as_zero:
        test, cal = test.unparsed_as_zero(), cal.unparsed_as_zero()
    return difficulty_prior(cal, test), cal


def table_rows(records: Mapping, protocol: str, as_zero: bool) -> dict[str, dict[int, Any]]:
    """``{row label: {seed: Answers}}``: each policy, RLVR recalibrated (temperature, isotonic: fitted on its
    calibration answers of the same seed) and each policy's difficulty prior (confidence = its accuracy on the
    task's stratum on the calibration split). Every row's ``prior`` is its policy's prior."""
    from rlcr.evaluation.recalibration import (
        apply_isotonic,
        apply_platt,
        apply_temperature,
        fit_isotonic,
        fit_platt,
        fit_temperature,
    )

    seeds = sorted({k[0] for k in records})
    scored = {p: {s: x for s in seeds if (x := scored_rows(records, p, s, protocol, as_zero)) is not None}
              for p in POLICIES}
    rows: dict[str, dict[int, Any]] = {p: {s: t for s, (t, _) in v.items()} for p, v in scored.items() if v}
    rlvr = scored["rlvr"]
    if rlvr:
        rows["rlvr + temperature"] = {s: recalibrated_rows(t, c, fit_temperature, apply_temperature)
                                      for s, (t, c) in rlvr.items()}
        rows["rlvr + isotonic"] = {s: recalibrated_rows(t, c, fit_isotonic, apply_isotonic)
                                   for s, (t, c) in rlvr.items()}
    for p in ("rlvr", "rlcr"):  # knowing the stratum (exploratory, issue 51): one map per number count
        for name, fit, apply in (("Platt", fit_platt, apply_platt), ("isotonic", fit_isotonic, apply_isotonic)):
            if scored[p]:
                rows[f"{p} + {name} per stratum {EXPLORATORY}"] = {
                    s: recalibrated_rows(t, c, fit, apply, per_stratum=True) for s, (t, c) in scored[p].items()}
    for p in POLICIES:
        if scored[p]:
            rows[f"difficulty prior of {p}"] = {s: t.with_confidence(t.prior) for s, (t, _) in scored[p].items()}
    return rows


def recalibrated_rows(test, cal, fit, apply, per_stratum: bool = False):
    """``test`` with its confidences mapped by ``fit`` on the calibration answers (``per_stratum``: one map per
    stratum, :func:`rlcr.evaluation.recalibration.fit_per_stratum`); all NaN (no calibration metric) where the
    calibration split has no parsed confidence to fit on."""
    from rlcr.evaluation.recalibration import apply_per_stratum, fit_per_stratum

    try:
        if per_stratum:
            fitted = fit_per_stratum(fit, cal.confidence, cal.correct, cal.stratum)
            return test.with_confidence(apply_per_stratum(apply, test.confidence, test.stratum, fitted))
        return test.with_confidence(apply(test.confidence, fit(cal.confidence, cal.correct)))
    except ValueError:
        return test.with_confidence(np.full(test.confidence.shape, math.nan))


def _row_bootstrap(runs: Mapping[int, Any], n_resamples: int, level: float) -> dict[str, Any]:
    from rlcr.evaluation.protocol_stats import hierarchical_bootstrap, protocol_metrics

    return hierarchical_bootstrap({"row": runs}, lambda d: protocol_metrics(d["row"]), n_resamples=n_resamples,
                                  level=level, seed=0)


def _num(v: Any) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def interval_text(result: Mapping[str, Any], key: str, per_seed: bool = True) -> str:
    """``"0.373 [0.320, 0.426] (s1 0.371, s2 0.380; mean 0.376)"``: the figure on the answers pooled over the
    seeds, its interval and, with ``per_seed``, each seed's value and their mean."""
    ci = result["ci"].get(key)
    text = _num(result["point"].get(key)) + (f" [{_num(ci[0])}, {_num(ci[1])}]" if ci else "")
    if per_seed:
        values = [v.get(key) for v in result["per_seed"].values()]
        finite = [v for v in values if v is not None and not math.isnan(v)]
        text += " (" + ", ".join(f"s{s} {_num(v)}" for s, v in zip(result["per_seed"], values)) + \
            (f"; mean {_num(float(np.mean(finite)))}" if len(values) > 1 and finite else "") + ")"
    return text


def seed_text(read: Mapping[str, Any], key: str) -> str:
    """``"0.080 [-0.033, 0.193]"``: the mean of a figure's per-seed values and its t-interval over the seeds
    (:func:`rlcr.evaluation.protocol_stats.seed_level`)."""
    ci = read["ci"].get(key)
    return _num(read["point"].get(key)) + (f" [{_num(ci[0])}, {_num(ci[1])}]" if ci else " [–]")


def row_results(rows: Mapping[str, Mapping[int, Any]], n_resamples: int, level: float) -> dict[str, dict[str, Any]]:
    """Each row's hierarchical bootstrap (seeds, then tasks) of every metric."""
    return {label: _row_bootstrap(runs, n_resamples, level) for label, runs in rows.items()}


def metrics_table(results: Mapping[str, Mapping[str, Any]], rows: Mapping[str, Mapping[int, Any]], per_seed: bool,
                  parse_rates: Mapping[str, float] | None = None, columns=METRIC_COLUMNS) -> list[str]:
    """Markdown table: one line per row label, each of ``columns`` with its hierarchical interval."""
    head = "| policy / baseline | seeds | " + " | ".join(t for _, t in columns) + \
           (" | conf. parse rate |" if parse_rates is not None else " |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for label, runs in rows.items():
        cells = [interval_text(results[label], k, per_seed) for k, _ in columns]
        if parse_rates is not None:
            cells.append(_num(parse_rates.get(label)))
        lines.append(f"| {label} | {', '.join(map(str, sorted(runs)))} | " + " | ".join(cells) + " |")
    return lines


GOAL_TEXT = {"brier_skill": ("RLCR's Brier skill over its difficulty prior", "lower bound > 0"),
             "auroc_within_vs_rlvr": ("RLCR − RLVR, mean within-stratum AUROC", "lower bound > 0"),
             "auroc_within_vs_recalibrated": ("RLCR − RLVR + temperature, mean within-stratum AUROC (vacuous: "
                                              "temperature scaling is monotone, so seed by seed this is the line "
                                              "above)", "lower bound > 0"),
             "ece_vs_rlvr": ("RLCR − RLVR, ECE (10 equal-width)", "upper bound < 0"),
             "accuracy_vs_rlvr": ("RLCR − RLVR, accuracy", f"lower bound > −{NON_INFERIORITY_MARGIN:g}")}
"""Per figure of a goal: (what it is, its rule), the rule as :func:`rlcr.evaluation.protocol_stats.decide` applies
it."""


def decide_goals(rows: Mapping[str, Mapping[int, Any]], protocol_seeds: Sequence[int], n_resamples: int,
                 level: float) -> dict[str, Any] | None:
    """The goals' paired bootstrap over the seeds that have rlcr's and rlvr's records, decided by their rules:
    ``{"result", "goals", "parts", "seeds", "decided"}``; ``decided`` once every pre-registered seed is in.
    None while no seed has them."""
    from rlcr.evaluation.protocol_stats import decide, goals_statistic, hierarchical_bootstrap, seed_level

    need = ("rlcr", "rlvr", "rlvr + temperature")
    seeds = sorted(set.intersection(*(set(rows.get(k, {})) for k in need)))
    if not seeds:
        return None
    runs = {"rlcr": {s: rows["rlcr"][s] for s in seeds}, "rlvr": {s: rows["rlvr"][s] for s in seeds},
            "rlvr_recalibrated": {s: rows["rlvr + temperature"][s] for s in seeds}}
    result = hierarchical_bootstrap(runs, goals_statistic, n_resamples=n_resamples, level=level, seed=0)
    goals = decide(result)
    parts = {"brier_skill": [("brier_skill", goals["brier_skill"])],
             "within_stratum_auroc": list(zip(("auroc_within_vs_rlvr", "auroc_within_vs_recalibrated"),
                                              goals["within_stratum_auroc"]["parts"])),
             "ece": [("ece_vs_rlvr", goals["ece"])],
             "accuracy_non_inferior": [("accuracy_vs_rlvr", goals["accuracy_non_inferior"])]}
    read = seed_level(result, level)
    seed_goals = decide(read)
    seed_parts = {"brier_skill": [seed_goals["brier_skill"]], "within_stratum_auroc": seed_goals["within_stratum_auroc"]
                  ["parts"], "ece": [seed_goals["ece"]], "accuracy_non_inferior": [seed_goals["accuracy_non_inferior"]]}
    return {"result": result, "goals": goals, "parts": parts, "seeds": seeds, "seed_level": read,
            "seed_goals": seed_goals, "seed_parts": seed_parts, "decided": set(protocol_seeds) <= set(seeds)}


def _verdict(d: Mapping[str, Any], goal: str) -> str:
    return ("**met**" if d["goals"][goal]["met"] else "**not met**") if d["decided"] else "not decided"


def goals_section(d: Mapping[str, Any] | None, protocol_seeds: Sequence[int]) -> tuple[list[str], str]:
    """The four goals (primary protocol) of :func:`decide_goals`, each met or not by its rule, with figure,
    paired interval and per-seed values; undecided while a pre-registered seed lacks records.
    Returns (lines, headline value)."""
    if d is None:
        return ["Goals: not decided — no seed has the test and calibration records of rlcr and rlvr yet."], \
            f"undecided (0/{len(protocol_seeds)} seeds)"
    df = len(d["seeds"]) - 1
    lines = ["| goal | figure (paired where a difference): pooled point [bootstrap interval] (per seed; their mean) | "
             f"rule | rule holds | goal (registered) | {EXPLORATORY} seed level: mean [95% t-interval, df {df}] | "
             f"{EXPLORATORY} rule at seed level |", "|---|---|---|---|---|---|---|"]
    for goal, items in d["parts"].items():
        for i, (key, g) in enumerate(items):
            at_seed = d["seed_parts"][goal][i]["met"]
            lines.append(f"| {goal if i == 0 else ''} | {GOAL_TEXT[key][0]}: {interval_text(d['result'], key)} | "
                         f"{GOAL_TEXT[key][1]} | {'yes' if g['met'] else 'no'} | "
                         f"{_verdict(d, goal) if i == 0 else ''} | {seed_text(d['seed_level'], key)} | "
                         f"{'holds' if at_seed else '**does not hold**'} |")
    if d["decided"]:
        met = sum(bool(d["goals"][g]["met"]) for g in d["parts"])
        missed = [g for g in d["parts"] if d["goals"][g]["met"] and not d["seed_goals"][g]["met"]]
        lines += ["", f"{EXPLORATORY} The seed-level reading (added in round 2, not the registered rule; the verdicts "
                      f"above stand as decided): each figure's per-seed values as {len(d['seeds'])} observations, "
                      f"mean ± t(0.975, {df})·sd/√{len(d['seeds'])}, the same rule applied to that interval. "
                      + (f"Met by the registered rule but not at the seed level: {', '.join(missed)}."
                         if missed else "Every goal met by the registered rule also holds at the seed level.")]
        return lines, f"{met}/{len(d['parts'])}"
    lines += ["", f"Not decided: the rules read intervals over the protocol's seeds "
                  f"({', '.join(map(str, protocol_seeds))}); records hold seeds "
                  f"{', '.join(map(str, d['seeds']))} only. "
                  "The figures above are provisional."]
    return lines, f"undecided ({len(d['seeds'])}/{len(protocol_seeds)} seeds)"


def presence_lines(records: Mapping, protocol_seeds: Sequence[int], methods: Sequence[str]) -> list[str]:
    """Which seeds and policies have all four evaluations (test/calibration × primary/paper) on record."""
    out = []
    for s in sorted(set(protocol_seeds) | {k[0] for k in records}):
        done = [p for p in ("warm_start", *methods)
                if all((s, p, sp, pr) in records for sp in SPLITS for pr in PROTOCOLS)]
        partial = [p for p in POLICIES if p not in done and any(k[0] == s and k[1] == p for k in records)]
        out.append(f"seed {s}: " + (", ".join(done) if done else "no complete policy")
                   + (f"; partial: {', '.join(partial)}" if partial else ""))
    return out


ORDER = (*POLICIES, *(p for p in ADDENDUM_POLICIES if p not in POLICIES))
"""The order in which :func:`warm_start_lines` names policies (the addendum's own after the first grid's)."""


def warm_start_lines(warm_starts: Mapping[tuple[int, str, str, str], str]) -> list[str]:
    """Per seed, the warm-start its records' policies started from: one (the protocol's design), or several —
    the seed's runs were spread over sessions whose recomputed warm-starts differ in their bits (another CPU);
    then a policy whose records span several names its records (split and protocol) under each."""
    out = []
    for s in sorted({k[0] for k in warm_starts}):
        mine = sorted(((k, d) for k, d in warm_starts.items() if k[0] == s),
                      key=lambda kv: (ORDER.index(kv[0][1]) if kv[0][1] in ORDER else len(ORDER), kv[0]))
        spans = {p: {d for (_, q, _, _), d in mine if q == p} for (_, p, _, _), _ in mine}  # a policy's digests
        by: dict[str, dict[str, list[str]]] = {}
        for (_, policy, split, protocol), digest in mine:
            by.setdefault(digest, {}).setdefault(policy, []).append(f"{split} {protocol}")
        if len(by) == 1:
            out.append(f"seed {s}: one warm-start ({next(iter(by))[:12]}) for {', '.join(next(iter(by.values())))}")
        else:
            named = ("; ".join(f"{d[:12]} for " + ", ".join(p if len(spans[p]) == 1 else f"{p} ({', '.join(r)})"
                                                            for p, r in ps.items()) for d, ps in by.items()))
            out.append(f"seed {s}: **{len(by)} different warm-starts** (recomputed in sessions on other CPUs): {named}")
    return out


class GridTable(NamedTuple):
    """What :func:`build_table` makes of the records."""

    docs: str
    """docs/results.md's section: both protocols' full tables, per-seed values, the goals."""
    summary: str
    """README.md's section: the set-up in one line and the goals' verdicts with their figures."""
    headline: str
    """``grid goals met: …``'s value: "k/4" once decided, else "undecided (n/3 seeds)"."""


def build_table(directory: Path, protocol, n_resamples: int | None = None) -> GridTable:
    """The pre-registered tables (markdown) and headline value, from the records under ``directory`` only."""
    warm_starts: dict = {}
    records = read_records(directory, warm_starts)
    n = n_resamples or protocol.n_resamples
    methods = [m for m in ("rlcr", "rlvr", "rlcr_single") if m in protocol.methods]
    try:
        shown = Path(directory).resolve().relative_to(DEFAULT_DIR.parents[2]).as_posix()
    except ValueError:
        shown = printable(directory)
    lines = [f"Records under `{shown}/` ({len(records)} evaluations), complete per seed: "
             + "; ".join(presence_lines(records, protocol.seeds, methods)) + "."]
    if warm_starts:
        lines += ["", "Warm-starts (sha256 of the weights): " + "; ".join(warm_start_lines(warm_starts)) + "."]
    if not records:
        headline = f"undecided (0/{len(protocol.seeds)} seeds)"
        return GridTable("\n".join(lines + ["", "No records yet: nothing to compute."]),
                         "No records yet: the pre-registered grid has not been run.", headline)
    rate = lambda a: float(np.mean(np.isfinite(a.confidence)))  # noqa: E731
    primary = table_rows(records, "primary", as_zero=False)
    primary_results = row_results(primary, n, protocol.level)
    rates = {label: float(np.mean([rate(records[(s, label, 'test', 'primary')]) for s in runs]))
             for label, runs in primary.items() if label in POLICIES}
    pct = f"{protocol.level:.0%}"
    lines += ["", f"**Primary protocol** (test split, sampling at T = the training temperature, "
                  f"{protocol.decodings[0].answers_per_task} answers per task, draw 0; unparsed confidences left "
                  f"out of the calibration metrics, counted in the parse rate). {pct} intervals: hierarchical "
                  f"bootstrap, {n:,} replicates (seeds, then tasks); per-seed values in brackets after each. With "
                  f"{len(protocol.seeds)} seeds the seed level of the bootstrap is coarse.", ""]
    lines += metrics_table(primary_results, primary, per_seed=True, parse_rates=rates)
    lines += ["", "**Paper protocol** (greedy, 1 answer per task, unparsed confidence = 0), the same checkpoints; "
                  "not used by the decision rules.", ""]
    paper = table_rows(records, "paper", as_zero=True)
    lines += metrics_table(row_results(paper, n, protocol.level), paper, per_seed=True)
    decided = decide_goals(primary, protocol.seeds, n, protocol.level)
    goal_lines, headline = goals_section(decided, protocol.seeds)
    lines += ["", "**Goals** (primary protocol; the rules of bench/protocol.yaml):", ""] + goal_lines
    recal = recalibration_comparison(primary, n, protocol.level)
    if recal is not None:
        lines += ["", f"**{EXPLORATORY} Stratum-aware recalibration** (exploratory, added in round 2 after the records "
                      "were seen; no decision): the rows marked † in the primary table map each policy's confidence "
                      "by a Platt map or an isotonic map fitted per number count on that policy's calibration "
                      "answers of the same seed. Paired differences, primary protocol:", ""]
        lines += recalibration_lines(recal)
    flags, flag_line = paper_flags(paper, protocol.seeds, n, protocol.level)
    if flags:
        lines += ["", f"**{EXPLORATORY} The goals' figures under the paper protocol** (greedy, one answer per task, "
                      "unparsed = 0; exploratory, no decision):", ""] + flags
    summary = summary_lines(protocol, n, primary_results, decided, recal, flag_line)
    return GridTable("\n".join(lines), "\n".join(summary), headline)


SUMMARY_GOALS = {"brier_skill": "RLCR's Brier skill over its difficulty prior is above 0",
                 "within_stratum_auroc": "RLCR's mean within-stratum AUROC is above RLVR's and recalibrated RLVR's",
                 "ece": "RLCR's ECE is below RLVR's",
                 "accuracy_non_inferior": "RLCR's accuracy is non-inferior to RLVR's"}
"""Per goal: its claim; the README line quotes the rule of the goal's figures from :data:`GOAL_TEXT`."""
SUMMARY_FIGURES = {"brier_skill": "", "auroc_within_vs_rlvr": "vs RLVR ", "auroc_within_vs_recalibrated":
                   "vs RLVR + temperature ", "ece_vs_rlvr": "", "accuracy_vs_rlvr": ""}


def summary_lines(protocol, n: int, results: Mapping, decided: Mapping[str, Any] | None,
                  recal: Mapping[str, Any] | None = None, flag_line: str = "") -> list[str]:
    """README's short form: the set-up in one line, one line per goal with its figures and seed-level reading,
    and the exploratory lines (stratum-aware recalibration, greedy decoding); the tables stay in docs/results.md."""
    out = [f"Pre-registered in [bench/protocol.yaml](bench/protocol.yaml) before the runs: training seeds "
           f"{', '.join(map(str, protocol.seeds))} (each with its own warm-start), {protocol.iterations} "
           "iterations per "
           f"method at equal generated tokens, {protocol.sizes['test']} held-out test tasks × "
           f"{protocol.decodings[0].answers_per_task} sampled answers per seed; {protocol.level:.0%} intervals by a "
           f"hierarchical bootstrap over seeds, then tasks ({n:,} replicates). Every policy's and baseline's figures, "
           "per seed and under the paper's protocol: [docs/results.md](docs/results.md).", ""]
    if decided is None:
        return out + ["Undecided: the goals are read once every seed's records are in."]
    out += ["Goals (RLCR = two-turn RLCR; differences paired over the same seeds and tasks):", ""]
    df = len(decided["seeds"]) - 1
    for goal, items in decided["parts"].items():
        figures = ", ".join(SUMMARY_FIGURES[key] + interval_text(decided["result"], key, per_seed=False)
                            for key, _ in items)
        seed = ", ".join(seed_text(decided["seed_level"], key) for key, _ in items[:1])
        rule = GOAL_TEXT[items[0][0]][1] + (", each" if len(items) > 1 else "")
        holds = "holds" if decided["seed_goals"][goal]["met"] else "does not hold"
        note = " (the temperature figure is vacuous: a monotone map leaves within-stratum AUROC unchanged)" \
            if len(items) > 1 else ""
        out.append(f"- {SUMMARY_GOALS[goal]} (rule: {rule}): {_verdict(decided, goal)}, {figures}{note}; "
                   f"{EXPLORATORY} seed level (mean of seeds [95% t-interval, df {df}]) {seed}: the rule {holds}")
    if recal is not None:
        r, key = recal["result"], "RLCR − (RLVR + Platt per stratum)"
        both = "(RLCR + Platt per stratum) − (RLVR + Platt per stratum)"
        out += ["", f"{EXPLORATORY} Exploratory (round 2, after the records were seen): knowing the number count, a "
                    f"Platt map per stratum fitted on the calibration split brings RLVR's ECE to "
                    f"{interval_text(results[f'rlvr + Platt per stratum {EXPLORATORY}'], 'ece', False)} and its Brier "
                    f"to RLCR's (RLCR − it: {interval_text(r, key + ':brier', False)}); the same map on RLCR still "
                    f"beats it ({interval_text(r, both + ':brier', False)} in Brier)."]
    if flag_line:
        out += ["", flag_line]
    return out


README_BEGIN = "<!-- grid-summary: begin (written by `python bench/grid.py --protocol bench/protocol.yaml " \
               "--table-only --docs docs/results.md --readme README.md`; do not edit by hand) -->"
README_END = "<!-- grid-summary: end -->"


def replace_section(text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the part between ``begin`` and ``end`` (docs/results.md's markers by default) replaced by
    ``table``."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"the file needs one {begin.split(':')[0][5:]} begin marker followed by one end marker")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def docs_section(text: str, begin: str = BEGIN, end: str = END) -> str:
    """The generated part of ``text`` (docs/results.md's by default): what lies between the markers."""
    head, rest = text.split(begin, 1)
    return rest.split(end, 1)[0].strip("\n")


# ----------------------------------------------------------------------------- the round-2 readings (exploratory)
# Added after the first grid's records were seen, never changing a verdict: RLCR and RLVR recalibrated per stratum
# compared pairwise, and the goals' figures under the paper protocol (greedy) with the distinct confidences stated.

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
    from rlcr.evaluation.protocol_stats import difference_statistic, hierarchical_bootstrap, seed_level

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
