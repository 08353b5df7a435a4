"""Synchronous vs one-step-off iterations (issue 49), side by side through the real training flow.

The engine gets one core and the trainer the other (``placement.engine_cpus=[0]``, ``placement.trainer_cpus=[1]``,
a stand-in for separate devices), in both modes alike. Each round trains two fresh runs from the same starting
model with the same prompts and seeds — ``sync`` and ``one-step-off`` (``orchestration.mode``) — in alternating
order, each saving once (after its last iteration) and evaluating after its last iteration. Read from each run's
committed metrics:

  iter      the flow's wall time of an iteration (``timings.iteration_s``: from its rollouts, or from its update
            when they were sampled ahead, to its evaluation; saves aside), median over the steady iterations
            2 … N−1 (iteration 1 is on-policy in both modes; one-step-off's last has nothing to generate)
  run       the sum of ``iteration_s`` over all N iterations (what a whole run of N iterations costs)
  gen, upd  the generation (``rollout/pipeline_s``) and the update (``update_s``) of those steady iterations
  idle      engine idle = 1 − (generation + weight sync + evaluation) / iteration; trainer idle = 1 − update /
            iteration (steady iterations)
  mismatch  mean |log π_engine − log π_trainer| over the loss tokens of the steady iterations' updates
  held-out  accuracy, ECE and Brier score after the last iteration (one run per mode per round: exploratory)

Prints each run as it ends, then per mode the median and range over rounds, then the ratios; the last line is
``one-step-off/sync iteration time: X`` (median over rounds of the per-round ratio of steady iterations).

    python bench/perf/overlap.py [--rounds 3] [--iterations 3] [--config configs/demo.yaml] [--sft URI] [field=value …]
    python bench/perf/overlap.py --config configs/tiny.yaml --no-warm-start --rounds 1   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from lora import add_start_args, alternating, say  # noqa: E402  (bench/perf/lora.py: the same start and rounds)

MODES = ("sync", "one-step-off")
FIGURES = ("iter_s", "run_s", "gen_s", "update_s", "engine_idle", "trainer_idle", "mismatch", "accuracy", "ece",
           "brier")


def figures(metrics: list[dict], ahead: bool) -> dict[str, float]:
    """One run's figures from its committed metrics (iterations 1 … N, in order). ``ahead``: one-step-off, where
    the generation that runs during iteration k is iteration k+1's (its metrics hold that generation's time)."""
    first, last = 1, max(len(metrics) - 1, 2)
    steady = metrics[first:last] or metrics
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    t = [m["timings"] for m in steady]
    it = [x["iteration_s"] for x in t]
    during = metrics[first + 1:last + 1] if ahead else steady  # the generation inside each steady iteration
    gen = [m["timings"].get("rollout/pipeline_s", 0.0) for m in during]
    engine = [g + x.get("sync_weights_s", 0.0) + x.get("evaluate_s", 0.0) for g, x in zip(gen, t)]
    ev = metrics[-1].get("eval") or {}
    return {"iter_s": med(it), "run_s": sum(m["timings"]["iteration_s"] for m in metrics), "gen_s": med(gen),
            "update_s": med([x["update_s"] for x in t]),
            "engine_idle": med([1 - e / i for e, i in zip(engine, it)]),
            "trainer_idle": med([1 - x["update_s"] / i for x, i in zip(t, it)]),
            "mismatch": med([m["update"].get("mismatch/mean_abs", float("nan")) for m in steady]),
            "accuracy": ev.get("accuracy", float("nan")), "ece": ev.get("ece", float("nan")),
            "brier": ev.get("brier", float("nan"))}


def one_run(args, mode: str, round_: int, model: str, store: str) -> dict[str, float]:
    """Train one run in ``mode`` and return its figures."""
    from flows.train import rlcr_train
    from rlcr.config import load_config
    from rlcr.runs.store import RunStore

    overrides = [*args.overrides, f"storage.uri={store}", f"model.name={model}", f"orchestration.mode={mode}",
                 f"orchestration.save_every={args.iterations}", f"eval.every={args.iterations}",
                 f"run.iterations={args.iterations}", f"placement.engine_cpus=[{args.engine_cpu}]",
                 f"placement.trainer_cpus=[{args.trainer_cpu}]"]
    run_id = f"bench-overlap-r{round_}-{mode}"
    rlcr_train(config=args.config, overrides=overrides, run_id=run_id, iterations=args.iterations)
    run = RunStore.open(load_config(args.config, overrides), run_id)
    return figures([run.store.read_json(run.store.rel(m["metrics_uri"])) for m in run.committed()],
                   ahead=mode == "one-step-off")


def summary(results: dict[str, list[dict[str, float]]]) -> None:
    for mode, runs in results.items():
        for key in FIGURES:
            xs = [r[key] for r in runs]
            say(f"{mode:12s} {key:12s} median {statistics.median(xs):.4g} (range {min(xs):.4g}–{max(xs):.4g}, "
                f"n = {len(xs)})")
    ratio = lambda key: [o[key] / s[key] for s, o in zip(results["sync"], results["one-step-off"])]  # noqa: E731
    ideal = [max(s["gen_s"], s["update_s"]) / (s["gen_s"] + s["update_s"]) for s in results["sync"]]
    say(f"ideal max(generation, update) / (generation + update), from the sync runs: "
        f"{statistics.median(ideal):.3f} (range {min(ideal):.3f}–{max(ideal):.3f})")
    say(f"one-step-off/sync whole-run time: {statistics.median(ratio('run_s')):.3f} "
        f"(range {min(ratio('run_s')):.3f}–{max(ratio('run_s')):.3f})")
    r = ratio("iter_s")
    say(f"one-step-off/sync iteration time per round: {', '.join(f'{x:.3f}' for x in r)}")
    say(f"one-step-off/sync iteration time: {statistics.median(r):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=3, help="per run (≥ 3: iterations 2 … N−1 are steady)")
    ap.add_argument("--engine-cpu", type=int, default=0)
    ap.add_argument("--trainer-cpu", type=int, default=1)
    add_start_args(ap)
    args = ap.parse_args()
    header = (lambda model: f"config {args.config}, from {model}; {args.iterations} iterations per run, "  # noqa: E731
              f"{args.rounds} round(s); engine on CPU {args.engine_cpu}, trainer on CPU {args.trainer_cpu} (of "
              f"{os.cpu_count()})")
    show = lambda figs: " ".join(f"{k} {figs[k]:.4g}" for k in FIGURES)  # noqa: E731
    summary(alternating(args, MODES, one_run, header, show, "bench-overlap-"))


if __name__ == "__main__":
    main()
