"""Full fine-tuning vs LoRA (issue 50), side by side through the real training flow, on this machine.

Each round trains two fresh runs from the same starting model with the same prompts and seeds — ``full`` (the
config as it is) and ``lora`` (``lora.enabled=true``, ``lora.rank``, ``update.learning_rate=--lora-lr``) — in
alternating order so that the machine's drift hits both alike, each with ``orchestration.save_every=1`` (every
iteration saves, so every iteration gives a save time) and an evaluation after its last iteration. Read from each
run's committed metrics (``RunStore.committed()``) and its store:

  update    the flow's ``update`` stage (s, median over the run's iterations)
  sync      the flow's ``sync_weights`` stage: full weights in place vs the adapter merged into the engines' base
  save      the save's write (``save_write_s`` of a background save, ``save_s`` of one the flow waited for) and
            the size of the last checkpoint directory (MB: weights or adapter, tokenizer, AdamW state)
  peak      the largest resident memory of the Ray Train workers (summed) and of the whole process tree
            (driver, engines, workers), sampled every 0.2 s (GB)
  held-out  accuracy, ECE and Brier score of the last iteration's evaluation (one run per side per round:
            exploratory, not a significance test)

Starting model: ``--sft URI`` (e.g. the demo's warm start), else the warm start trained (or reused) as
``bench/learning.py`` does, else with ``--no-warm-start`` the config's ``model.name``. Prints each run as it ends,
then per side the median and range over rounds of each figure, then the ratios; the last line is
``lora/full update time: X`` (median over rounds of the per-round ratio).

    python bench/perf/lora.py [--rounds 3] [--config configs/demo.yaml] [--lora-rank 16] [--lora-lr 5e-5] \
        [field=value …]
    python bench/perf/lora.py --config configs/tiny.yaml --no-warm-start --rounds 1 --iterations 1   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

FIGURES = ("update_s", "sync_s", "save_s", "save_mb", "workers_gb", "tree_gb", "accuracy", "ece", "brier")


def say(line: str) -> None:
    """A line to stdout as is (inside the flow's run, ``print`` would go to Prefect's log)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class PeakMemory:
    """Peak resident memory of this process's tree and of its Ray Train workers, sampled in a thread."""

    def __init__(self, every_s: float = 0.2):
        self.every_s, self.tree, self.workers = every_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(self.every_s):
            tree = workers = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    rss = p.memory_info().rss
                    title = " ".join(p.cmdline())
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                tree += rss
                workers += rss if "RayTrainWorker" in title else 0
            self.tree, self.workers = max(self.tree, tree), max(self.workers, workers)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def one_run(args, side: str, round_: int, model: str, store: str) -> dict[str, float]:
    """Train one run of ``side`` and return its figures."""
    from flows.train import rlcr_train
    from rlcr.config import load_config
    from rlcr.runs.store import RunStore
    from rlcr.storage import fetch_checkpoint

    overrides = [*args.overrides, f"storage.uri={store}", f"model.name={model}", "orchestration.save_every=1",
                 f"eval.every={args.iterations}", f"run.iterations={args.iterations}"]
    if side == "lora":
        overrides += ["lora.enabled=true", f"lora.rank={args.lora_rank}", f"lora.alpha={2 * args.lora_rank}",
                      f"update.learning_rate={args.lora_lr}"]
    run_id = f"bench-lora-r{round_}-{side}"
    with PeakMemory() as peak:
        rlcr_train(config=args.config, overrides=overrides, run_id=run_id, iterations=args.iterations)
    run = RunStore.open(load_config(args.config, overrides), run_id)
    manifests = run.committed()
    metrics = [run.store.read_json(run.store.rel(m["metrics_uri"])) for m in manifests]
    med = lambda key: statistics.median(m["timings"].get(key, float("nan")) for m in metrics)  # noqa: E731
    last = fetch_checkpoint(manifests[-1]["checkpoint_uri"])  # as stored: a LoRA run's is its adapter
    ev = metrics[-1].get("eval") or {}
    # a background save's write is save_write_s (save_s is then the flow's wait for it); the last one is waited for
    writes = [m["timings"].get("save_write_s", m["timings"].get("save_s", float("nan"))) for m in metrics]
    return {"update_s": med("update_s"), "sync_s": med("sync_weights_s"), "save_s": statistics.median(writes),
            "save_mb": _dir_mb(Path(last)), "workers_gb": peak.workers / 1e9, "tree_gb": peak.tree / 1e9,
            "accuracy": ev.get("accuracy", float("nan")), "ece": ev.get("ece", float("nan")),
            "brier": ev.get("brier", float("nan"))}


def starting_model(args) -> str:
    from rlcr.config import load_config

    if args.sft:
        return args.sft
    cfg = load_config(args.config, [*args.overrides, f"sft.tasks={args.sft_tasks}"])
    if args.no_warm_start:
        return cfg.model.name
    from rlcr.train.sft import warm_start

    return warm_start(cfg, run_id="bench-lora-sft")[0]


def show(figs: dict[str, float]) -> str:
    return " ".join(f"{k} {figs[k]:.3f}" for k in FIGURES)


def summary(results: dict[str, list[dict[str, float]]]) -> None:
    for side, runs in results.items():
        for key in FIGURES:
            xs = [r[key] for r in runs]
            say(f"{side:5s} {key:10s} median {statistics.median(xs):.3f} (range {min(xs):.3f}–{max(xs):.3f}, "
                f"n = {len(xs)})")

    def per_round(key):
        return [lo[key] / f[key] if f[key] else float("nan") for f, lo in zip(results["full"], results["lora"])]

    for key, label in (("sync_s", "sync time"), ("save_s", "save time"), ("save_mb", "save size"),
                       ("workers_gb", "trainer peak memory")):
        say(f"lora/full {label}: {statistics.median(per_round(key)):.3f}")
    say(f"lora/full update time: {statistics.median(per_round('update_s')):.3f}")


def add_start_args(ap: argparse.ArgumentParser) -> None:
    """The starting model, the store and the overrides: the options bench/perf/lora.py and bench/perf/overlap.py
    share."""
    ap.add_argument("--sft", default=None, help="URI of a warm-start checkpoint to start every side from")
    ap.add_argument("--sft-tasks", type=int, default=60)
    ap.add_argument("--no-warm-start", action="store_true", help="start from the config's model.name")
    ap.add_argument("--store", default=None, help="a local directory (default: a temporary one, removed)")
    ap.add_argument("overrides", nargs="*")


def alternating(args, sides: tuple[str, ...], one, header, show, prefix: str) -> dict[str, list[dict[str, float]]]:
    """Each of ``args.rounds`` rounds runs ``one(args, side, round, model, store)`` for every side, the order
    reversed every other round so that the machine's drift hits all sides alike, from one starting model
    (:func:`starting_model`) in one store (``--store``, or a temporary one removed at the end); prints
    ``header(model)`` first and each run as it ends. Returns {side: [figures per round]}."""
    store = args.store or tempfile.mkdtemp(prefix=prefix, dir=".")
    try:
        args.overrides = [*args.overrides, f"storage.uri={store}"]
        model = starting_model(args)
        say(header(model))
        results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for r in range(args.rounds):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                figs = one(args, side, r, model, store)
                results[side].append(figs)
                say(f"round {r + 1}/{args.rounds} {side:4s}: {show(figs)}")
        return results
    finally:
        if not args.store:
            shutil.rmtree(store, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=None, help="default: the config's run.iterations")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--lora-lr", type=float, default=5e-5, help="LoRA's update.learning_rate")
    add_start_args(ap)
    args = ap.parse_args()
    import torch

    from rlcr.config import load_config

    args.iterations = args.iterations or load_config(args.config, args.overrides).run.iterations
    header = (lambda model: f"config {args.config}, from {model}; {args.iterations} iteration(s) per run, "  # noqa: E731
              f"{args.rounds} round(s); lora rank {args.lora_rank}, lr {args.lora_lr}; CPU {os.cpu_count()} cores, "
              f"torch threads {torch.get_num_threads()}")
    summary(alternating(args, ("full", "lora"), one_run, header, show, "bench-lora-"))


if __name__ == "__main__":
    main()
