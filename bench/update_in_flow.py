"""The update inside the training flow against the same update alone, on the same rows (issue 49, item 0).

1. **In the flow.** ``rlcr_train`` on ``--config`` (the demo's) from the warm start, ``--iterations`` iterations, no
   evaluation, one save at the end. From each committed iteration's metrics: the update stage's wall time
   (``timings.update_s``) and the worker's own split of it — ``prepare_s`` (rows → samples), ``prepass_s``
   (π_old), ``train_s`` (the steps), ``weights_s`` (the new weights packed for the engines) — the rest being the
   call's transfer; the update's nominal GFLOP/s (6 × parameters × prefix-tree tokens / (prepass + steps), as
   ``bench/update.py`` counts them) and the fp32 matmul peak the worker measured in the same run. During every
   update stage, the CPU seconds each process of the tree used (psutil), grouped: the trainer worker, the engine
   actors, other Ray workers, Ray's own daemons, the Prefect server, this driver.
2. **Alone.** Then, with Ray shut down, the same update (``rlcr.train.update.train_update`` with the run's config
   and thread count) on each iteration's committed rows, from the warm start with a fresh AdamW, ``--repeats``
   times, each next to a matmul peak measured just before it.

Prints the flow's iterations, the CPU attribution, each alone round, then the comparison; the last line is
``flow/alone update GFLOP/s: X`` (the median flow iteration's compute rate over the median alone rate, both as
fractions of their own matmul peak).

    python bench/update_in_flow.py --sft URI [--config configs/demo.yaml] [--iterations 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from lora import say  # noqa: E402

GROUPS = (("trainer", "RayTrainWorker"), ("engines", "RolloutEngine"), ("ray workers", "ray::"),
          ("ray daemons", "raylet"), ("ray daemons", "gcs_server"), ("ray daemons", "dashboard"),
          ("ray daemons", "log_monitor"), ("prefect", "prefect"), ("prefect", "uvicorn"))


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process's tree, by group."""
    import psutil

    out: dict[str, float] = defaultdict(float)
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            title = " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        group = "driver" if p.pid == me.pid else next((g for g, key in GROUPS if key in title), "other")
        out[group] += t.user + t.system
    return out


class UpdateCPU:
    """A stage-event subscriber: CPU seconds by group during each update stage, and its wall time."""

    def __init__(self):
        self.start: dict[int, tuple[float, dict[str, float]]] = {}
        self.used: dict[int, tuple[float, dict[str, float]]] = {}

    def __call__(self, event) -> None:
        if event.stage != "update":
            return
        if event.phase == "start":
            self.start[event.iteration] = (time.perf_counter(), cpu_seconds())
        elif event.iteration in self.start:
            t0, before = self.start.pop(event.iteration)
            after = cpu_seconds()
            self.used[event.iteration] = (time.perf_counter() - t0,
                                          {g: after[g] - before.get(g, 0.0) for g in after})


def in_flow(args, store: str) -> tuple[list[dict], list[list[dict]], UpdateCPU]:
    """Run the flow; its committed metrics, each iteration's rows, and the CPU attribution."""
    import pyarrow.parquet as pq

    from flows.train import rlcr_train
    from rlcr import events
    from rlcr.config import load_config
    from rlcr.runs import RunStore

    overrides = [*args.overrides, f"storage.uri={store}", f"model.name={args.sft}", "eval.every=0",
                 f"orchestration.save_every={args.iterations}", f"run.iterations={args.iterations}"]
    watch = UpdateCPU()
    with events.subscribed(watch):
        rlcr_train(config=args.config, overrides=overrides, run_id="update-in-flow", iterations=args.iterations)
    run = RunStore.open(load_config(args.config, overrides), "update-in-flow")
    manifests = run.committed()
    metrics = [run.store.read_json(run.store.rel(m["metrics_uri"])) for m in manifests]
    rows = [pq.read_table(m["rollouts_uri"]).to_pylist() for m in manifests]
    return metrics, rows, watch


def alone(args, rows: list[dict]) -> tuple[float, float, float]:
    """One update of ``rows`` from the warm start with a fresh AdamW: (seconds of prepass + steps, nominal
    GFLOP/s, the matmul peak measured just before)."""
    import torch

    from rlcr.config import load_config
    from rlcr.train.batching import prepare_samples
    from rlcr.train.logprobs import CompletionLogProbs
    from rlcr.train.throughput import matmul_gflops, update_gflops
    from rlcr.train.update import train_update
    from rlcr.train.worker import load_policy

    cfg = load_config(args.config, args.overrides)
    tokenizer, lm = load_policy(args.sft, cfg, device=torch.device("cpu"))
    policy = CompletionLogProbs(lm)
    samples = prepare_samples(rows, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    peak = matmul_gflops(2048, 2)
    metrics = train_update(policy, samples, cfg, pad_id=pad, seed=0)
    seconds = metrics["prepass_s"] + metrics["train_s"]
    params = sum(p.numel() for p in {id(p): p for p in lm.parameters()}.values())
    return seconds, update_gflops(params, metrics["padded_tokens"], seconds), peak


def report_flow(metrics: list[dict], watch: UpdateCPU) -> list[float]:
    fractions = []
    for k, m in enumerate(metrics, 1):
        u, t = m["update"], m["timings"]
        rest = t["update_s"] - u["prepare_s"] - u["prepass_s"] - u["train_s"] - u["weights_s"]
        fractions.append(u["peak_fraction"])
        say(f"flow iteration {k}: update stage {t['update_s']:.1f} s = prepare {u['prepare_s']:.1f} + π_old "
            f"{u['prepass_s']:.1f} + steps {u['train_s']:.1f} + weights {u['weights_s']:.1f} + call {rest:.1f}; "
            f"{u['padded_tokens']:.0f} tree tokens, {u['gflops']:.1f} GFLOP/s of a {u['matmul_gflops']:.1f} matmul "
            f"= {u['peak_fraction']:.3f}")
        if k in watch.used:
            wall, used = watch.used[k]
            say(f"  CPU seconds during it ({wall:.1f} s wall, {os.cpu_count()} cores): "
                + ", ".join(f"{g} {s:.1f}" for g, s in sorted(used.items(), key=lambda x: -x[1]) if s >= 0.05))
    return fractions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--sft", required=True, help="URI of the warm-start checkpoint (bench/lora.py makes one)")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    import torch

    store = tempfile.mkdtemp(prefix="bench-update-in-flow-", dir=".")
    metrics, rows, watch = in_flow(args, store)
    flow = report_flow(metrics, watch)
    import ray

    ray.shutdown()
    torch.set_num_threads(max(1, os.cpu_count() or 1))  # the trainer worker's count with one worker
    lone = []
    for r in range(args.repeats):
        for k, its in enumerate(rows, 1):
            seconds, rate, peak = alone(args, its)
            lone.append(rate / peak)
            say(f"alone round {r + 1}/{args.repeats}, iteration {k}'s rows: {seconds:.1f} s, {rate:.1f} GFLOP/s of a "
                f"{peak:.1f} matmul = {rate / peak:.3f}")
    say(f"flow {statistics.median(flow):.3f} of its matmul peak (n = {len(flow)}, range {min(flow):.3f}–"
        f"{max(flow):.3f}); alone {statistics.median(lone):.3f} (n = {len(lone)}, range {min(lone):.3f}–"
        f"{max(lone):.3f}); torch threads {torch.get_num_threads()}")
    say(f"flow/alone update GFLOP/s: {statistics.median(flow) / statistics.median(lone):.3f}")


if __name__ == "__main__":
    main()
