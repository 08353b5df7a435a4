"""Which Countdown difficulty (and SFT warm-start size) puts the warm-started SmolLM2 in a learnable band?

For each built-in candidate setting (RLCRConfig overrides on top of --config, default configs/demo.yaml):
train the SFT warm-start with ``rlcr.sft.warm_start`` (a sealed one in the store is reused, so the script
is resumable), then evaluate it on 256 held-out tasks (one answer + one confidence each) and record
accuracy with a bootstrap 95% CI over tasks, format rate, SFT and eval wall time, mean answer length
and the accuracy per number count. Results are appended as JSON lines to ``<store>/difficulty.jsonl``;
settings already there are skipped.

    python bench/difficulty.py [--only NAME] [--store /tmp/difficulty-store] [--config configs/demo.yaml] [--list]

A candidate with ``sft_from`` reuses another candidate's warm-start and only changes the held-out
distribution (a cheap probe; its SFT time is 0 and it is never the recommendation).

Target band: accuracy in [0.25, 0.60]. Last line: ``difficulty accuracy <best-name>: <acc>`` for the
in-band setting with the cheapest SFT (sft_tasks × sft_epochs; ties: accuracy nearest 0.40).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BAND = (0.25, 0.60)
N_EVAL = 256
N_BOOT = 1000

# name -> RLCRConfig overrides on top of the config (plus the optional "sft_from": <other candidate>)
CANDIDATES: dict[str, dict] = {
    # today's demo setting (3 numbers in [1,12], targets [1,40]) with a larger warm-start
    "demo-sft160": {"sft_tasks": 160},
    # a mix of 2- and 3-number tasks, same ranges
    "mix23-sft160": {"task_min_count": 2, "task_max_count": 3, "sft_tasks": 160},
    # easier 3-number tasks
    "easy10-sft160": {"task_num_range": [1, 10], "task_target_range": [1, 30], "sft_tasks": 160},
    # the demo setting with a much larger warm-start
    "demo-sft400": {"sft_tasks": 400},
    # a real 2-/3-number mix: the 2-number task space of [1,12] is so small that the training pool takes
    # nearly all of it (the held-out set of "mix23-sft160" is 252 of 256 3-number tasks), so wider ranges
    # and a smaller pool; held-out: 171 3-number + 85 2-number tasks
    "mix23w-sft160": {"task_min_count": 2, "task_max_count": 3, "task_num_range": [1, 20],
                      "task_target_range": [1, 60], "num_train_tasks": 600, "sft_tasks": 160},
    # easier 3-number tasks still: numbers up to 10, targets up to 20 (many solutions per target)
    "t20-sft160": {"task_num_range": [1, 10], "task_target_range": [1, 20], "sft_tasks": 160},
    # 2-/3-number mix on the demo ranges with a pool small enough to leave 2-number tasks for held-out
    # (held-out: 200 3-number + 56 2-number tasks)
    "mix23s-sft160": {"task_min_count": 2, "task_max_count": 3, "num_train_tasks": 400, "sft_tasks": 160},
    # lower bound: 2-number tasks only (small task space: fewer training draws so 256 held-out tasks exist)
    "two-sft160": {"lower_bound": True, "task_min_count": 2, "task_max_count": 2, "task_num_range": [1, 20],
                   "task_target_range": [1, 100], "num_train_tasks": 400, "sft_tasks": 160},
}


META = ("sft_from", "lower_bound")


def _overrides(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in META}


def bootstrap_ci(correct, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float]:
    import numpy as np

    y = np.asarray(correct, dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(y), size=(n_boot, len(y)))
    means = y[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def run_setting(name: str, spec: dict, config: str, store: str, sft_uri: str | None = None,
                sft_of_uri: dict | None = None) -> dict:
    import numpy as np

    from rlcr.cluster import ensure_ray
    from rlcr.config import load_config
    from rlcr.evaluate import evaluate_policy
    from rlcr.rollout.engine import EnginePool
    from rlcr.sft import warm_start
    from rlcr.tasks.sets import sft_tasks, task_sets

    base = {"storage_uri": store, "num_eval_tasks": N_EVAL}
    cfg = load_config(config, {**base, **_overrides(spec)})
    _, held_out = task_sets(cfg)
    ensure_ray()

    sft_name = spec.get("sft_from", name)
    sft_cfg = cfg
    if sft_uri:  # an existing warm-start (e.g. the demo's), trained with --config plus ``sft_of_uri``
        sft_name = "external"
        sft_cfg = load_config(config, {**base, **(sft_of_uri or {})})
    elif sft_name != name:
        sft_cfg = load_config(config, {**base, **_overrides(CANDIDATES[sft_name])})
    # held-out tasks the warm-start trained on (0 by construction unless the warm-start is another setting's)
    seen = {t.identity for t in sft_tasks(sft_cfg, sft_cfg.sft_tasks)}
    sft_overlap = sum(t.identity in seen for t in held_out)
    t0 = time.perf_counter()
    if sft_uri:
        uri, reused = sft_uri, True
    else:
        uri, reused = warm_start(sft_cfg, run_id=f"difficulty-{sft_name}")
    sft_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    with EnginePool(cfg, uri) as engines:
        t_gen = time.perf_counter()
        metrics, rows = evaluate_policy(cfg, held_out, policy_uri=uri, iteration=0, engines=engines)
        gen_s = time.perf_counter() - t_gen
    eval_s = time.perf_counter() - t0

    answers = sorted((r for r in rows if r["sample_type"] == "answer"), key=lambda r: r["prompt_id"])
    correct = [float(r["correct"] or 0) for r in answers]
    lo, hi = bootstrap_ci(correct)
    by_count: dict[int, list[float]] = {}
    for r in answers:
        by_count.setdefault(len(held_out[r["prompt_id"]].nums), []).append(float(r["correct"] or 0))
    return {
        "name": name,
        "overrides": {k: v for k, v in spec.items()},
        "sft_uri": sft_uri, "sft_of_uri": sft_of_uri,
        "held_out_tasks": {"count_range": [cfg.task_min_count, cfg.task_max_count],
                           "num_range": list(cfg.task_num_range), "target_range": list(cfg.task_target_range)},
        "sft_from": sft_name if sft_name != name else None,
        "sft_tasks": sft_cfg.sft_tasks, "sft_epochs": sft_cfg.sft_epochs,
        "n": len(answers), "held_out_in_sft": sft_overlap,
        "accuracy": float(np.mean(correct)), "ci95": [lo, hi],
        "format_rate": metrics.get("format_rate"),
        "confidence_parse_rate": metrics.get("confidence_parse_rate"),
        "mean_confidence": metrics.get("mean_confidence"),
        "ece": metrics.get("ece"), "brier": metrics.get("brier"), "auroc": metrics.get("auroc"),
        "mean_answer_tokens": float(np.mean([len(r["completion_ids"]) for r in answers])),
        "truncated_frac": float(np.mean([bool(r.get("truncated")) for r in answers])),
        "accuracy_by_count": {str(k): [float(np.mean(v)), len(v)] for k, v in sorted(by_count.items())},
        "sft_s": None if reused else (0.0 if sft_name != name else sft_s),
        "sft_reused": reused,
        "eval_s": eval_s, "eval_generate_s": gen_s,
        "checkpoint": uri,
        "loadavg_5min_at_end": os.getloadavg()[1],  # > 2 on this 2-core machine: the timings were contended
    }


def fmt(r: dict) -> str:
    sft = "reused" if r["sft_s"] is None else f"{r['sft_s']:.0f}s"
    by = " ".join(f"{k}n:{v[0]:.2f}/{v[1]}" for k, v in r["accuracy_by_count"].items())
    return (f"{r['name']}: acc {r['accuracy']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] n={r['n']} "
            f"format {r['format_rate']:.3f} sft {sft} eval {r['eval_s']:.0f}s (gen {r['eval_generate_s']:.0f}s) "
            f"len {r['mean_answer_tokens']:.1f} by-count {by}")


def choose(results: list[dict]) -> dict | None:
    ok = [r for r in results if BAND[0] <= r["accuracy"] <= BAND[1] and not r.get("sft_from")
          and not r["overrides"].get("lower_bound")]
    if not ok:
        return None
    return min(ok, key=lambda r: (r["sft_tasks"] * r["sft_epochs"], abs(r["accuracy"] - 0.40)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--store", default="/tmp/difficulty-store")
    ap.add_argument("--only", default=None, help="run only this candidate")
    ap.add_argument("--list", action="store_true", help="list the candidates and exit")
    ap.add_argument("--sft", default=None, metavar="URI",
                    help="evaluate this existing warm-start on each candidate's held-out tasks instead of training "
                         "one per candidate (results are named <candidate>@<--sft-label>)")
    ap.add_argument("--sft-label", default="ext")
    ap.add_argument("--sft-of", nargs="*", default=["sft_tasks=40"], metavar="FIELD=VALUE",
                    help="the overrides of --config that --sft was trained with (default: sft_tasks=40, the demo's)")
    a = ap.parse_args()
    sft_of = {k: json.loads(v) for k, v in (x.split("=", 1) for x in a.sft_of)} if a.sft else None

    if a.list:
        for k, v in CANDIDATES.items():
            print(f"{k}: {v}")
        return
    if a.only and a.only not in CANDIDATES:
        ap.error(f"unknown candidate {a.only!r}; known: {', '.join(CANDIDATES)}")

    store = Path(a.store)
    store.mkdir(parents=True, exist_ok=True)
    log = store / "difficulty.jsonl"
    results = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    done = {r["name"] for r in results}
    for r in results:
        print(fmt(r) + "  (recorded)")

    import ray

    try:
        for cand in ([a.only] if a.only else list(CANDIDATES)):
            name = f"{cand}@{a.sft_label}" if a.sft else cand
            if name in done or (a.sft and CANDIDATES[cand].get("sft_from")):
                continue
            r = run_setting(cand, CANDIDATES[cand], a.config, str(store), sft_uri=a.sft, sft_of_uri=sft_of)
            r["name"] = name
            with log.open("a") as f:
                f.write(json.dumps(r) + "\n")
            results.append(r)
            print(fmt(r), flush=True)
    finally:
        if ray.is_initialized():
            ray.shutdown()

    best = choose(results)
    if best is None:
        print(f"difficulty accuracy none in band {BAND}: "
              + ", ".join(f"{r['name']}={r['accuracy']:.3f}" for r in results))
    else:
        print(f"difficulty accuracy {best['name']}: {best['accuracy']:.3f}")


if __name__ == "__main__":
    main()
