"""The update inside the training flow against the same update alone, on the same rows (issue 49, item 0).

1. **In the flow.** ``rlcr_train`` on ``--config`` (the demo's) from the warm start, ``--iterations`` iterations, no
   evaluation, one save at the end. From each committed iteration's metrics: the update stage's wall time
   (``timings.update_s``) and the worker's own split of it — ``prepare_s`` (rows → samples), ``prepass_s``
   (π_old), ``train_s`` (the steps), ``weights_s`` (the new weights packed for the engines) — the rest being the
   call's transfer; the update's nominal GFLOP/s (6 × parameters × prefix-tree tokens / (prepass + steps), as
   ``bench/perf/update.py`` counts them) and the fp32 matmul peak the worker measured in the same run. During every
   update stage, the CPU seconds each process of the tree used (psutil), grouped: the trainer worker, the engine
   actors, other Ray workers, Ray's own daemons, the Prefect server, this driver.
2. **Alone.** Right after, with Ray shut down, the same update (``rlcr.train.update.train_update`` with the
   run's config, thread count and the iteration's mini-batch seed) on each iteration's committed rows, from the
   warm start with a fresh AdamW, next to a matmul peak measured just before it.
3. ``--rounds`` rounds of 1 and 2, alternating, each flow a fresh run from the same warm start and seed (its rows
   are checked equal to the first round's, so every round times the same work): the machine's drift between
   rounds falls on both sides alike.

Prints each round's iterations, the CPU attribution and the update alone as they finish, then the comparison;
the last line is ``flow/alone update speed: X``, the median over rounds and iterations of (seconds of π_old +
steps alone) / (the same in the flow): 1.0 means the flow's update is as fast as alone.

    python bench/perf/update_in_flow.py --sft URI [--config configs/demo.yaml] [--iterations 4] [--rounds 2]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
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


def kernel_memory() -> dict[str, float]:
    """The machine's memory reclaim so far (Linux): pages the kernel reclaimed (by kswapd and directly by the
    faulting process), the CPU seconds of the kswapd threads (not in this process tree), and free memory (MiB)."""
    out: dict[str, float] = defaultdict(float)
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                key, value = line.split()
                if key in ("pgsteal_kswapd", "pgsteal_direct", "pgfault"):
                    out[key] = float(value)
        with open("/proc/meminfo") as f:
            out["free_mib"] = next(float(x.split()[1]) / 1024 for x in f if x.startswith("MemFree:"))
        tick = os.sysconf("SC_CLK_TCK")
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)
            except OSError:
                continue
            if "(kswapd" in fields[0]:
                rest = fields[1].split()
                out["kswapd_s"] += (int(rest[11]) + int(rest[12])) / tick
    except (OSError, ValueError, StopIteration):
        pass
    return out


def memory_delta(before: dict[str, float], after: dict[str, float]) -> str:
    """One line: pages reclaimed (kswapd / direct), kswapd's CPU seconds, page faults, free memory before."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return (f"reclaimed {d.get('pgsteal_kswapd', 0):.0f} pages by kswapd ({d.get('kswapd_s', 0):.1f} CPU-s) and "
            f"{d.get('pgsteal_direct', 0):.0f} directly; {d.get('pgfault', 0) / 1e6:.2f} M page faults (machine); "
            f"{before.get('free_mib', 0):.0f} MiB free before")


class UpdateCPU:
    """A stage-event subscriber: CPU seconds by group during each update stage, its wall time, and the
    machine's memory reclaim meanwhile (:func:`kernel_memory`)."""

    def __init__(self):
        self.start: dict[int, tuple[float, dict[str, float], dict[str, float]]] = {}
        self.used: dict[int, tuple[float, dict[str, float]]] = {}
        self.memory: dict[int, str] = {}

    def __call__(self, event) -> None:
        if event.stage != "update":
            return
        if event.phase == "start":
            self.start[event.iteration] = (time.perf_counter(), cpu_seconds(), kernel_memory())
        elif event.iteration in self.start:
            t0, before, mem = self.start.pop(event.iteration)
            after = cpu_seconds()
            self.used[event.iteration] = (time.perf_counter() - t0,
                                          {g: after[g] - before.get(g, 0.0) for g in after})
            self.memory[event.iteration] = memory_delta(mem, kernel_memory())


def in_flow(args, store: str, run_id: str) -> tuple[list[dict], list[list[dict]], UpdateCPU]:
    """Run the flow; its committed metrics, each iteration's rows, and the CPU attribution."""
    import pyarrow.parquet as pq

    from flows.train import rlcr_train
    from rlcr import events
    from rlcr.config import load_config
    from rlcr.runs.store import RunStore

    overrides = [*args.overrides, f"storage.uri={store}", f"model.name={args.sft}", "eval.every=0",
                 f"orchestration.save_every={args.iterations}", f"run.iterations={args.iterations}"]
    watch = UpdateCPU()
    with events.subscribed(watch):
        rlcr_train(config=args.config, overrides=overrides, run_id=run_id, iterations=args.iterations)
    run = RunStore.open(load_config(args.config, overrides), run_id)
    manifests = run.committed()
    metrics = [run.store.read_json(run.store.rel(m["metrics_uri"])) for m in manifests]
    rows = [pq.read_table(m["rollouts_uri"]).to_pylist() for m in manifests]
    return metrics, rows, watch


def alone(args, rows: list[dict], iteration: int) -> tuple[float, float, float]:
    """One update of ``rows`` from the warm start with a fresh AdamW and iteration ``iteration``'s mini-batch
    seed: (seconds of prepass + steps, nominal GFLOP/s, the matmul peak measured just before)."""
    import torch

    from rlcr.config import load_config
    from rlcr.seeds import update_seed
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
    mem = kernel_memory()
    metrics = train_update(policy, samples, cfg, pad_id=pad, seed=update_seed(cfg.run.seed, iteration))
    seconds = metrics["prepass_s"] + metrics["train_s"]
    params = sum(p.numel() for p in {id(p): p for p in lm.parameters()}.values())
    say(f"  memory during it: {memory_delta(mem, kernel_memory())}")
    return seconds, update_gflops(params, metrics["padded_tokens"], seconds), peak


def report_flow(metrics: list[dict], watch: UpdateCPU, r: int) -> list[float]:
    """Print the round's flow iterations; returns each one's seconds of π_old + steps."""
    seconds = []
    for k, m in enumerate(metrics, 1):
        u, t = m["update"], m["timings"]
        rest = t["update_s"] - u["prepare_s"] - u["prepass_s"] - u["train_s"] - u["weights_s"]
        seconds.append(u["prepass_s"] + u["train_s"])
        say(f"round {r} flow iteration {k}: update stage {t['update_s']:.1f} s = prepare {u['prepare_s']:.1f} + π_old "
            f"{u['prepass_s']:.1f} + steps {u['train_s']:.1f} + weights {u['weights_s']:.1f} + call {rest:.1f}; "
            f"{u['padded_tokens']:.0f} tree tokens, {u['gflops']:.1f} GFLOP/s of a {u['matmul_gflops']:.1f} matmul "
            f"= {u['peak_fraction']:.3f}")
        if k in watch.used:
            wall, used = watch.used[k]
            say(f"  CPU seconds during it ({wall:.1f} s wall, {os.cpu_count()} cores): "
                + ", ".join(f"{g} {s:.1f}" for g, s in sorted(used.items(), key=lambda x: -x[1]) if s >= 0.05))
            say(f"  memory during it: {watch.memory.get(k, '–')}")
    return seconds


def rows_digest(rows: list[dict]) -> str:
    """sha256 of the rows' token ids and advantages in order: equal across rounds = the same work."""
    import hashlib

    h = hashlib.sha256()
    for row in rows:
        h.update(repr((row["context_ids"], row["completion_ids"], row["advantage"])).encode())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--sft", required=True, help="URI of the warm-start checkpoint (bench/perf/lora.py makes one)")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="flow, then alone, this many times")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    import ray
    import torch

    store = tempfile.mkdtemp(prefix="bench-update-in-flow-", dir=".")
    ratios, flow_s, alone_s, first = [], [], [], None
    for r in range(1, args.rounds + 1):
        metrics, rows, watch = in_flow(args, store, f"update-in-flow-r{r}")
        seconds = report_flow(metrics, watch, r)
        digests = [rows_digest(its) for its in rows]
        first = first or digests
        if digests != first:
            raise SystemExit(f"round {r}: the flow's rows differ from round 1's ({digests} vs {first}): "
                             "not the same work")
        ray.shutdown()
        torch.set_num_threads(max(1, os.cpu_count() or 1))  # the trainer worker's count with one worker
        for k, its in enumerate(rows, 1):
            s_alone, rate, peak = alone(args, its, k)
            ratios.append(s_alone / seconds[k - 1])
            flow_s.append(seconds[k - 1])
            alone_s.append(s_alone)
            say(f"round {r} alone, iteration {k}'s rows: {s_alone:.1f} s ({rate:.1f} GFLOP/s of a {peak:.1f} matmul = "
                f"{rate / peak:.3f}) against {seconds[k - 1]:.1f} s in the flow: flow/alone speed {ratios[-1]:.3f}")
    say(f"π_old + steps: flow median {statistics.median(flow_s):.1f} s ({min(flow_s):.1f}–{max(flow_s):.1f}), alone "
        f"median {statistics.median(alone_s):.1f} s ({min(alone_s):.1f}–{max(alone_s):.1f}); n = {len(ratios)} "
        f"(round, iteration) pairs, speed ratio range {min(ratios):.3f}–{max(ratios):.3f}; torch threads "
        f"{torch.get_num_threads()}")
    say(f"flow/alone update speed: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
