"""Where an RL iteration's time goes, old path vs new, side by side in one run (demo scale).

Both paths run the same work per round — rollouts from their own engine (P prompts × G_a answers,
then G_c confidences each), advantages, one masked GRPO update of SmolLM2-135M — and differ in
how the trainer lives and how the engines get the new weights:

  old   a fresh Ray Train trainer per iteration (worker start, model load, a new AdamW), the new
        weights written as a sealed checkpoint to the artifact store, and the engine re-created
        from it: what rlcr did before the trainer became long-lived
  new   one PolicyTrainer for the run (its start is paid once, reported apart), weights copied
        into the running engine from Ray's object store (``engine_weight_sync: inplace``), and the
        full training state (weights + AdamW + schedule + RNG) saved every ``--save-every``
        iterations (its time is amortised: measured save time / save_every)

Per round and path it prints: generation (the engines' time inside generate calls), update
forward/backward (the update's own compute: π_old pre-pass + steps), and the overhead — everything
else of the iteration: rollout scheduling and scoring, advantages, rows → trainer, trainer start and
model load, checkpoint I/O, weight sync. Evaluation is not part of an iteration here (it is
optional and the same on both paths). The sides take turns within each round, so the machine's
drift hits both alike. The headline (last line) is the new path's overhead fraction over rounds
after the first: ``iteration overhead fraction: X`` (goal ≤ 0.15).

    python bench/iteration.py [--rounds 3] [--save-every 5] [--config configs/demo.yaml]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def rollout(cfg, tasks, policy, run_id, k, engines, store, tokenizer_uri):
    """Generation + advantages; (rows, generation seconds, wall seconds)."""
    from rlcr.rollout.pipeline import finalize_rollouts, generate_rollouts

    t0 = time.perf_counter()
    rows, timings = generate_rollouts(cfg, tasks, policy_uri=policy, run_id=run_id, iteration=k, engines=engines,
                                      tokenizer_uri=tokenizer_uri)
    result = finalize_rollouts(cfg, rows, run_id=run_id, iteration=k, store=store)
    generation = timings["rollout/answer_generate_s"] + timings["rollout/confidence_generate_s"]
    return result.rows, generation, time.perf_counter() - t0


def old_iteration(cfg, tasks, policy, k, engines, store, tokenizer_uri) -> tuple[dict, str]:
    from rlcr.train.trainer import PolicyTrainer, checkpoint_rel

    f: dict[str, float] = {}
    rows, f["generation"], f["rollout_wall"] = rollout(cfg, tasks, policy, "old", k, engines, store, tokenizer_uri)
    t0 = time.perf_counter()
    with PolicyTrainer(cfg, policy_uri=policy) as trainer:  # a fresh AdamW every iteration, as before
        f["trainer_start"] = trainer.start_s
        t1 = time.perf_counter()
        update = trainer.update(rows, k)
        f["update_wall"] = time.perf_counter() - t1
        update.weights = None
        t1 = time.perf_counter()
        uri = trainer.save(checkpoint_rel("old", k), with_optimizer=False)
        f["checkpoint_io"] = time.perf_counter() - t1
        t1 = time.perf_counter()
    f["trainer_stop"] = time.perf_counter() - t1
    f["trainer_total"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    engines.load(uri, mode="recreate")
    f["weight_sync"] = time.perf_counter() - t1
    f["fwd_bwd"] = update.metrics["train_s"] + update.metrics["prepass_s"]
    f["iteration"] = f["rollout_wall"] + f["trainer_total"] + f["weight_sync"]
    return f, uri


def new_iteration(cfg, tasks, policy, k, engines, store, tokenizer_uri, trainer, save_every) -> tuple[dict, str]:
    from rlcr.train.trainer import checkpoint_rel

    f: dict[str, float] = {}
    rows, f["generation"], f["rollout_wall"] = rollout(cfg, tasks, policy, "new", k, engines, store, tokenizer_uri)
    t1 = time.perf_counter()
    update = trainer.update(rows, k)
    f["update_wall"] = time.perf_counter() - t1
    version = f"{store.url(checkpoint_rel('new', k))}"
    t1 = time.perf_counter()
    engines.update_weights(update.weights, version)
    f["weight_sync"] = time.perf_counter() - t1
    update.weights = None
    t1 = time.perf_counter()
    trainer.save(checkpoint_rel("new", k))
    f["checkpoint_io_measured"] = time.perf_counter() - t1
    f["checkpoint_io"] = f["checkpoint_io_measured"] / save_every
    f["fwd_bwd"] = update.metrics["train_s"] + update.metrics["prepass_s"]
    f["iteration"] = f["rollout_wall"] + f["update_wall"] + f["weight_sync"] + f["checkpoint_io"]
    return f, version


def overhead(f: dict[str, float]) -> float:
    return f["iteration"] - f["generation"] - f["fwd_bwd"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--model", default=None, help="checkpoint to start from (default: the config's model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--save-every", type=int, default=5, help="new path: full-state saves every this many iterations")
    args = ap.parse_args()

    import ray

    from rlcr.cluster import ensure_ray
    from rlcr.config import load_config
    from rlcr.models import resolve_model
    from rlcr.rollout.engine import EnginePool
    from rlcr.runs import prompts_for_iteration, task_sets
    from rlcr.storage import Store
    from rlcr.train.trainer import PolicyTrainer

    root = tempfile.mkdtemp(prefix="rlcr-bench-iteration-")
    overrides = {"storage_uri": root, "iterations": max(args.rounds, 1) * 2, "save_every": args.save_every}
    if args.model:
        overrides["model"] = args.model
    cfg = load_config(args.config, overrides)
    base = resolve_model(cfg.model)
    store = Store(root)
    train_tasks, _ = task_sets(cfg)
    # logical CPUs are bookkeeping: the two engine pools, the run's trainer, the old path's per-iteration
    # trainer and the stage actors must all be placeable at once on this 2-core machine
    if not os.environ.get("RAY_ADDRESS"):
        ray.init(num_cpus=max(6, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}})
    ensure_ray()
    print(f"model {base}; P={cfg.prompts_per_iteration} G_a={cfg.num_generations_answer} "
          f"G_c={cfg.num_generations_confidence}; new path saves every {args.save_every}; store {root}", flush=True)

    t0 = time.perf_counter()
    old_engines = EnginePool(cfg, base, name="bench-old")
    new_engines = EnginePool(cfg, base, name="bench-new")
    print(f"engines started in {time.perf_counter() - t0:.1f} s (both paths, once)", flush=True)
    trainer = PolicyTrainer(cfg, policy_uri=base)
    print(f"new path: trainer started in {trainer.start_s:.1f} s (once per run, not in the iterations)", flush=True)

    cols = ["iteration", "generation", "fwd_bwd", "weight_sync", "checkpoint_io", "trainer_start"]
    print("round path " + " ".join(f"{c:>14}" for c in cols) + "       overhead", flush=True)
    fractions: dict[str, list[float]] = {"old": [], "new": []}
    policies = {"old": base, "new": base}
    try:
        for r in range(args.rounds):
            k = r + 1
            tasks = prompts_for_iteration(cfg, train_tasks, k)
            for path in ("old", "new") if r % 2 == 0 else ("new", "old"):
                if path == "old":
                    f, policies["old"] = old_iteration(cfg, tasks, policies["old"], k, old_engines, store, base)
                else:
                    f, policies["new"] = new_iteration(cfg, tasks, policies["new"], k, new_engines, store, base,
                                                       trainer, args.save_every)
                frac = overhead(f) / f["iteration"]
                if r > 0 or args.rounds == 1:
                    fractions[path].append(frac)
                print(f"{r:>5} {path:>4} " + " ".join(f"{f.get(c, 0.0):>13.2f}s" for c in cols)
                      + f"   {overhead(f):6.1f} s ({frac:.0%})", flush=True)
                if path == "new":
                    print(f"           new: update wall {f['update_wall']:.2f} s, rollout wall {f['rollout_wall']:.2f} s, "
                          f"full-state save {f['checkpoint_io_measured']:.2f} s (÷{args.save_every})", flush=True)
                else:
                    print(f"           old: update wall {f['update_wall']:.2f} s, trainer start+stop "
                          f"{f['trainer_start'] + f['trainer_stop']:.2f} s, rollout wall {f['rollout_wall']:.2f} s",
                          flush=True)
    finally:
        trainer.close()
        old_engines.shutdown()
        new_engines.shutdown()
    for path in ("old", "new"):
        v = fractions[path]
        if v:
            spread = f" (n={len(v)}, range {min(v):.3f}–{max(v):.3f})"
            print(f"{path} path overhead fraction: median {statistics.median(v):.3f}{spread}", flush=True)
    print(f"iteration overhead fraction: {statistics.median(fractions['new']):.3f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
