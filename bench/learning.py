"""Does RLCR make confidence more calibrated? A longer CPU run from the warm-started checkpoint.

Runs the `rlcr` flow for --iterations (default 20) on SmolLM2-135M-Instruct after
the SFT warm-start (reused from `make demo` when present), evaluating on the
held-out set after every iteration, then prints held-out accuracy, Brier, ECE and
AUROC per iteration and writes a PNG of the curves next to the run.

    python bench/learning.py [--iterations 20] [--run-id learning] [--config configs/demo.yaml] [--sft URI]

The goal: ECE and Brier go down without accuracy dropping. Last line:
``learning ECE first→last: <ece0> -> <eceN>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--run-id", default="learning")
    ap.add_argument("--sft-tasks", type=int, default=160,
                    help="solver tasks of the warm-start (overrides the config's sft_tasks)")
    ap.add_argument("--sft", default=None,
                    help="URI of an existing warm-start checkpoint (e.g. the demo's) to start from")
    ap.add_argument("--eval-every", type=int, default=1,
                    help="held-out evaluation every this many iterations (and after the last); operational: "
                         "the training is the same")
    ap.add_argument("overrides", nargs="*", help="field=value")
    a = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flows.train import rlcr_train
    from rlcr.config import load_config
    from rlcr.runs.store import RunStore
    from rlcr.train.sft import warm_start

    cfg = load_config(a.config, [*a.overrides, f"sft.tasks={a.sft_tasks}"])
    t0 = time.perf_counter()
    sft_uri = a.sft or warm_start(cfg, run_id=f"{a.run_id}-sft")[0]
    overrides = [*a.overrides, f"model.name={sft_uri}", f"eval.every={a.eval_every}"]
    rlcr_train(config=a.config, overrides=overrides, run_id=a.run_id, iterations=a.iterations)
    elapsed = time.perf_counter() - t0

    train_cfg = load_config(a.config, overrides)
    run = RunStore.open(train_cfg, a.run_id)
    rows = [(0, run.store.read_json(run.baseline_rel)["eval"])]
    for m in run.committed():
        ev = run.store.read_json(run.store.rel(m["metrics_uri"])).get("eval")
        if ev:  # an iteration evaluated (--eval-every)
            rows.append((m["iteration"], ev))
    keys = ("accuracy", "format_rate", "confidence_parse_rate", "mean_confidence", "brier", "ece", "auroc")
    print(f"{'iter':>4s} " + " ".join(f"{k[:12]:>12s}" for k in keys))
    for it, ev in rows:
        print(f"{it:4d} " + " ".join(f"{ev.get(k, float('nan')):12.3f}" for k in keys))

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.5))
    its = [it for it, _ in rows]
    for ax, key in zip(axes, ("accuracy", "brier", "ece", "auroc")):
        ax.plot(its, [ev.get(key, float("nan")) for _, ev in rows], marker="o")
        ax.set_title(f"held-out {key}")
        ax.set_xlabel("iteration")
    fig.tight_layout()
    png = Path(run.store.url(run.prefix)) / "learning_curves.png" if run.store.is_local else Path("learning_curves.png")
    fig.savefig(png, dpi=100)
    print(f"curves: {png}   ({len(rows) - 1} iterations, {elapsed / 60:.1f} min)")
    first, last = rows[0][1], rows[-1][1]
    print(f"accuracy {first['accuracy']:.3f} -> {last['accuracy']:.3f}; "
          f"Brier {first['brier']:.3f} -> {last['brier']:.3f}")
    print(f"learning ECE first→last: {first['ece']:.3f} -> {last['ece']:.3f}")


if __name__ == "__main__":
    main()
