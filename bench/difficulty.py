"""Which Countdown difficulty (and SFT warm-start size) puts the warm-started SmolLM2 in a learnable band?

For each built-in candidate setting (RLCRConfig overrides on top of --config, default configs/methods.yaml):
train the SFT warm-start with ``rlcr.train.sft.warm_start`` (a sealed one in the store is reused, so the script
is resumable), then evaluate it on 256 held-out tasks (``eval.samples`` answers each, each with one
confidence) and record accuracy with its bootstrap 95% CI over tasks, accuracy and AUROC per number count,
format rate, calibration, SFT and eval wall time and mean answer length. Results are appended as JSON lines
to ``<store>/difficulty.jsonl``; settings already there are skipped.

    python bench/difficulty.py [--only NAME] [--store /tmp/difficulty-store] [--config configs/methods.yaml] [--list]
    python bench/difficulty.py --sft <warm-start URI> --sft-label methods --sft-of   # probe one warm-start

``--sft URI`` evaluates one existing warm-start on every candidate's held-out tasks instead of training one per
candidate (cheap: minutes per setting); ``--sft-of`` names the overrides of --config it was trained with (none
for the methods benchmark's own warm-start), so held-out tasks it trained on are counted (``held_out_in_sft``).
A candidate with ``sft_from`` reuses another candidate's warm-start and only changes the held-out distribution.

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

# name -> RLCRConfig overrides on top of the config (plus the optional "sft_from": <other candidate>)
CANDIDATES: dict[str, dict] = {
    # the methods benchmark's setting: 2 or 3 numbers up to 20, targets up to 60, held-out in equal shares
    "mix23": {},
    # the same with the demo's smaller warm-start
    "mix23-sft60": {"sft.tasks": 60},
    # the same warm-start, held-out tasks taken as drawn (the training pool holds much of the 2-number space, so
    # fewer 2-number tasks are left: a harder set than the training distribution)
    "mix23-asdrawn": {"sft_from": "mix23", "tasks.eval_stratify_counts": False},
    # one number count at a time, same ranges (the mix's two ends; lower_bound: never the recommendation)
    "two": {"sft_from": "mix23", "lower_bound": True, "tasks.options.min_count": 2, "tasks.options.max_count": 2,
            "tasks.num_train": 50},
    "three": {"sft_from": "mix23", "tasks.options.min_count": 3, "tasks.options.max_count": 3},
    # 3 numbers with smaller ranges: the demo's setting before the mix (numbers up to 12, targets up to 40) and
    # smaller still (numbers up to 10, targets up to 20: many solutions per target)
    "three12": {"sft_from": "mix23", "tasks.options.min_count": 3, "tasks.options.max_count": 3,
                "tasks.options.num_range": [1, 12], "tasks.options.target_range": [1, 40]},
    "three10-t20": {"sft_from": "mix23", "tasks.options.min_count": 3, "tasks.options.max_count": 3,
                    "tasks.options.num_range": [1, 10], "tasks.options.target_range": [1, 20]},
}


META = ("sft_from", "lower_bound")


def _overrides(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in META}


def run_setting(name: str, spec: dict, config: str, store: str, sft_uri: str | None = None,
                sft_of_uri: dict | None = None) -> dict:
    import numpy as np

    from rlcr.config import load_config
    from rlcr.evaluation.evaluate import evaluate_policy
    from rlcr.rollout.engine import EnginePool
    from rlcr.runs.cluster import ensure_ray
    from rlcr.runs.task_sets import held_out_set, sft_tasks, task_sets, training_pool
    from rlcr.train.sft import warm_start

    base = {"storage.uri": store, "tasks.num_eval": N_EVAL}
    cfg = load_config(config, {**base, **_overrides(spec)})
    ensure_ray()

    sft_name = spec.get("sft_from", name)
    sft_cfg = cfg
    if sft_uri:  # an existing warm-start (e.g. the demo's), trained with --config plus ``sft_of_uri``
        sft_name = "external"
        sft_cfg = load_config(config, {**base, **(sft_of_uri or {})})
    elif sft_name != name:
        sft_cfg = load_config(config, {**base, **_overrides(CANDIDATES[sft_name])})
    # held out from this setting's training pool and from the warm-start's (another setting's, when reused)
    train, _ = task_sets(cfg)
    held_out = held_out_set(cfg, list(train) + (training_pool(sft_cfg) if sft_cfg is not cfg else []))
    # held-out tasks the warm-start trained on: 0 by construction
    seen = {t.identity for t in sft_tasks(sft_cfg, sft_cfg.sft.tasks)}
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
    lo, hi = metrics["ci"]["accuracy"]  # bootstrap over tasks (a task's answers stay together)
    return {
        "name": name,
        "overrides": {k: v for k, v in spec.items()},
        "sft_uri": sft_uri, "sft_of_uri": sft_of_uri,
        "held_out_tasks": {"count_range": [cfg.tasks.options["min_count"], cfg.tasks.options["max_count"]],
                           "num_range": list(cfg.tasks.options["num_range"]),
                           "target_range": list(cfg.tasks.options["target_range"])},
        "sft_from": sft_name if sft_name != name else None,
        "sft_tasks": sft_cfg.sft.tasks, "sft_epochs": sft_cfg.sft.epochs,
        "n": len(answers), "held_out_in_sft": sft_overlap,
        "accuracy": metrics["accuracy"], "ci95": [lo, hi], "n_tasks": metrics["n_tasks"],
        "format_rate": metrics.get("format_rate"),
        "confidence_parse_rate": metrics.get("confidence_parse_rate"),
        "mean_confidence": metrics.get("mean_confidence"),
        "ece": metrics.get("ece"), "brier": metrics.get("brier"), "auroc": metrics.get("auroc"),
        "mean_answer_tokens": float(np.mean([len(r["completion_ids"]) for r in answers])),
        "truncated_frac": float(np.mean([bool(r.get("truncated")) for r in answers])),
        "by_count": metrics["by_count"],
        "sft_s": None if reused else (0.0 if sft_name != name else sft_s),
        "sft_reused": reused,
        "eval_s": eval_s, "eval_generate_s": gen_s,
        "checkpoint": uri,
        "loadavg_5min_at_end": os.getloadavg()[1],  # > 2 on this 2-core machine: the timings were contended
    }


def fmt(r: dict) -> str:
    sft = "reused" if r["sft_s"] is None else f"{r['sft_s']:.0f}s"
    by = " ".join(f"{k}n: acc {b['accuracy']:.2f} AUROC {'–' if b['auroc'] is None else format(b['auroc'], '.2f')} "
                  f"(n={b['n_answers']})" for k, b in r["by_count"].items())
    auroc = "–" if r["auroc"] is None or r["auroc"] != r["auroc"] else f"{r['auroc']:.3f}"
    return (f"{r['name']}: acc {r['accuracy']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] n={r['n_tasks']}×"
            f"{r['n'] // max(r['n_tasks'], 1)} AUROC {auroc} ECE {r['ece']:.3f} format {r['format_rate']:.3f} "
            f"sft {sft} eval {r['eval_s']:.0f}s len {r['mean_answer_tokens']:.1f} | {by}")


def choose(results: list[dict]) -> dict | None:
    ok = [r for r in results if BAND[0] <= r["accuracy"] <= BAND[1] and not r.get("sft_from")
          and not r["overrides"].get("lower_bound")]
    if not ok:
        return None
    return min(ok, key=lambda r: (r["sft_tasks"] * r["sft_epochs"], abs(r["accuracy"] - 0.40)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/methods.yaml")
    ap.add_argument("--store", default="/tmp/difficulty-store")
    ap.add_argument("--only", default=None, help="run only this candidate")
    ap.add_argument("--list", action="store_true", help="list the candidates and exit")
    ap.add_argument("--sft", default=None, metavar="URI",
                    help="evaluate this existing warm-start on each candidate's held-out tasks instead of training "
                         "one per candidate (results are named <candidate>@<--sft-label>)")
    ap.add_argument("--sft-label", default="ext")
    ap.add_argument("--sft-of", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="the overrides of --config that --sft was trained with (default: none, the config's own)")
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
