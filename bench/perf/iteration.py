"""Where an iteration of ``rlcr train`` goes, timed by the flow itself: its per-stage timings per iteration.

Runs the training flow (``flows.train.rlcr_train``, Prefect's ephemeral mode, no server) on a small config
(default configs/tiny.yaml; ``eval_every: 0``, ``save_every: 1``, a fresh run in a temporary store, removed at
the end) and reads each committed iteration's metrics through the run's manifests (``RunStore.committed()`` →
``metrics_uri``).
Per iteration, from the flow's ``timings``:

  iteration    the sum of the flow's stage timings (rollouts, advantages, update, sync_weights, stage, and
               evaluate/save/commit where the metrics hold them)
  generation   the engines' time inside their generate calls (``rollout/answer_generate_s`` +
               ``rollout/confidence_generate_s``, from the Ray Data pipeline)
  fwd_bwd      the update's own compute (``update.train_s`` + ``update.prepass_s``)
  stages       the two generation stages outside the engines' generate calls: Ray Data's part of the
               rollout (``rollout/pipeline_s`` − generation; issue 34 item 1, goal ≤ 1 s)
  overhead     iteration − generation − fwd_bwd
  save         the checkpoint's write (``save_s``), in the iterations that save (every ``save_every``-th and
               the last); part of the overhead

Old vs new side by side in one flow run: the rollout stages of each iteration run either as task-based
``map_batches`` functions (``tasks``, the default) or as a pool of stage actors started for each dataset
(``actors``, the former way), chosen per iteration through ``$RLCR_ROLLOUT_STAGES`` when its rollouts start.
Iterations 1 and 2 warm up (engine and workers; one per mode) and are shown but not counted; then each round
is one iteration per mode, in alternating order so the machine's drift hits both alike, printed as it is
committed. The last line is the first mode's overhead fraction over the rounds, amortised at the run's
``orchestration.save_every`` = S (1 unless overridden): (median overhead of an iteration without its save +
median save / S) / (median iteration without its save + median save / S), printed as
``iteration overhead fraction: X``. With S = 1 that is the median iteration's fraction, as before.

The save, waited for or in the background (``orchestration.background_save``), is compared with ``--saves
background,inline``: one flow run per save mode, one after the other in one invocation, each with the plan
above and one more iteration at the end (not counted: a run's last save is always waited for). Besides the
overhead fraction, the amortised seconds per iteration of both are printed as a ratio (a background write
that slowed the rollouts it ran beside would show there, not in the overhead).

    python bench/perf/iteration.py [--rounds 3] [--config configs/tiny.yaml] [--modes tasks,actors] [field=value …]
    python bench/perf/iteration.py --config configs/demo.yaml --modes tasks --rounds 6 --saves background,inline \
        orchestration.save_every=3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

STAGES = ("rollouts", "advantages", "update", "sync_weights", "evaluate", "stage", "save", "commit")
COLUMNS = ("iteration", "generation", "fwd_bwd", "stages", "rollouts", "advantages", "update", "sync_weights",
           "save", "overhead")


def say(line: str) -> None:
    """A line to stdout as is: inside the flow's run, ``print`` would go to Prefect's log (``log_prints``)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def schedule(modes: list[str], rounds: int) -> dict[int, tuple[int, str]]:
    """Iteration → (round, mode): round 0 (warm-up) runs each mode once, round r ≥ 1 each mode once more, the
    order turning round by round."""
    out, k = {}, 1
    for r in range(rounds + 1):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            out[k] = (r, mode)
            k += 1
    return out


def figures(metrics: dict) -> dict[str, float]:
    """One iteration's figures (module docstring) from its metrics as the flow wrote them."""
    t, update = metrics["timings"], metrics["update"]
    f = {s: float(t[f"{s}_s"]) for s in STAGES if f"{s}_s" in t}
    f["iteration"] = sum(f[s] for s in STAGES if s in f)
    f["generation"] = float(t.get("rollout/answer_generate_s", 0.0) + t.get("rollout/confidence_generate_s", 0.0))
    f["fwd_bwd"] = float(update.get("train_s", 0.0) + update.get("prepass_s", 0.0))
    f["stages"] = float(t.get("rollout/pipeline_s", 0.0)) - f["generation"]
    f["overhead"] = f["iteration"] - f["generation"] - f["fwd_bwd"]
    f["fraction"] = f["overhead"] / f["iteration"] if f["iteration"] > 0 else float("nan")
    return f


class Follower:
    """Stage-event subscriber: picks each iteration's stage mode as its rollouts start, and prints each iteration's
    figures as soon as the run's manifests say it is committed."""

    def __init__(self, run, plan: dict[int, tuple[int, str]]):
        from rlcr.rollout.pipeline import STAGES_ENV

        self.run, self.plan, self.env = run, plan, STAGES_ENV
        self.seen: dict[int, dict[str, float]] = {}

    def __call__(self, event) -> None:
        if event.phase == "start" and event.stage == "rollouts" and event.iteration in self.plan:
            os.environ[self.env] = self.plan[event.iteration][1]
        if event.phase == "end" and event.stage == "commit":
            for manifest in self.run.committed():
                k = int(manifest["iteration"])
                if k not in self.seen and k in self.plan:
                    self.seen[k] = figures(self.run.store.read_json(self.run.store.rel(manifest["metrics_uri"])))
                    self.show(k)

    def show(self, k: int) -> None:
        r, mode = self.plan[k]
        f = self.seen[k]
        say(f"{r:>5} {k:>4} {mode:>6} " + " ".join(f"{f.get(c, 0.0):>11.2f}" for c in COLUMNS)
            + f" {f['fraction']:>8.1%}" + ("   (warm-up, not counted)" if r == 0 else ""))


def amortised(rows: list[dict[str, float]], save_every: int) -> tuple[float, float]:
    """(overhead fraction, seconds) of an iteration with the save's time spread over ``save_every``
    iterations: medians of the iterations without their save, plus the median save (over the iterations that
    saved) / save_every."""
    if not rows:
        return float("nan"), float("nan")
    saves = [f["save"] for f in rows if "save" in f]
    save = statistics.median(saves) / save_every if saves else 0.0
    overhead = statistics.median(f["overhead"] - f.get("save", 0.0) for f in rows) + save
    iteration = statistics.median(f["iteration"] - f.get("save", 0.0) for f in rows) + save
    return (overhead / iteration if iteration > 0 else float("nan")), iteration


def summary(seen: dict[int, dict[str, float]], plan: dict[int, tuple[int, str]], modes: list[str],
            save_every: int, headline: bool = True) -> None:
    """Median and range per mode over the rounds (iterations after the warm-up round), and (``headline``) the
    first mode's overhead fraction amortised at ``save_every`` as the last line."""
    for mode in modes:
        rows = [f for k, f in sorted(seen.items()) if plan[k][1] == mode and plan[k][0] > 0]
        if not rows:
            continue
        for key, unit in (("stages", "s"), ("overhead", "s"), ("iteration", "s"), ("fraction", "")):
            v = [f[key] for f in rows]
            fmt = (lambda x: f"{x:.3f}") if not unit else (lambda x: f"{x:.2f} s")
            say(f"{mode:>6} {key:<10} median {fmt(statistics.median(v))} (n={len(v)}, range "
                f"{fmt(min(v))}–{fmt(max(v))})")
        saves = [f["save"] for f in rows if "save" in f]
        if saves:
            say(f"{mode:>6} save       median {statistics.median(saves):.2f} s (n={len(saves)}, range "
                f"{min(saves):.2f}–{max(saves):.2f} s); overhead without it median "
                f"{statistics.median(f['overhead'] - f.get('save', 0.0) for f in rows):.2f} s (n={len(rows)})")
        say(f"{mode:>6} fraction amortised at save_every {save_every}: {amortised(rows, save_every)[0]:.3f}")
    if headline:
        new = [f for k, f in sorted(seen.items()) if plan[k][0] > 0 and plan[k][1] == modes[0]]
        say(f"iteration overhead fraction: {amortised(new, save_every)[0]:.3f}")


def run_flow(args, modes: list[str], plan: dict[int, tuple[int, str]], store: str, save: str | None):
    """One flow run of ``plan`` (plus one uncounted iteration at the end, so that no counted iteration is the
    run's last, whose save the flow always waits for); returns (figures by iteration, save_every)."""
    from flows.train import rlcr_train
    from rlcr import events
    from rlcr.config import load_config
    from rlcr.runs.store import RunStore

    overrides = [f"storage.uri={store}", "eval.every=0", "orchestration.save_every=1", *args.overrides]
    if save is not None:
        overrides.append(f"orchestration.background_save={save == 'background'}")
    cfg = load_config(args.config, overrides)
    run_id = f"bench-iteration-{save}" if save else "bench-iteration"
    follower = Follower(RunStore.open(cfg, run_id), plan)
    say(f"config {args.config} (+ {' '.join(overrides)}); P={cfg.rollout.prompts_per_iteration} "
        f"G_a={cfg.rollout.num_generations_answer} G_c={cfg.rollout.num_generations_confidence}; modes {modes}; "
        f"save {'in the background' if cfg.orchestration.background_save else 'waited for'}; {len(plan)} iterations")
    say("round iter   mode " + " ".join(f"{c:>11}" for c in COLUMNS) + " fraction   (seconds)")
    with events.subscribed(follower):
        rlcr_train(config=args.config, overrides=overrides, run_id=run_id, iterations=len(plan) + 1)
    return follower.seen, cfg.orchestration.save_every


def measure(args, modes, saves, plan, store) -> dict:
    """One flow run per save mode into ``store``: {save mode: (overhead fraction, iteration seconds)}."""
    results = {}
    for save in saves:
        seen, save_every = run_flow(args, modes, plan, store, save)
        summary(seen, plan, modes, save_every, headline=len(saves) == 1)
        counted = [f for k, f in sorted(seen.items()) if plan[k][0] > 0 and plan[k][1] == modes[0]]
        results[save] = amortised(counted, save_every)
        if len(saves) > 1:
            say(f"save {save}: overhead fraction {results[save][0]:.3f}, iteration {results[save][1]:.2f} s "
                f"(amortised at save_every {save_every}, n={len(counted)})")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--rounds", type=int, default=3, help="counted rounds (after one warm-up round)")
    ap.add_argument("--modes", default="tasks,actors", help="stage modes to compare, the headline's first")
    ap.add_argument("--saves", default=None, help="background,inline: one flow run per save mode "
                    "(orchestration.background_save), in this order, the headline's first (default: one run, "
                    "the config's)")
    ap.add_argument("--store", default=None, help="storage.uri of the runs (default: a new temporary directory)")
    ap.add_argument("overrides", nargs="*", help="config field=value")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    saves = [m.strip() for m in args.saves.split(",") if m.strip()] if args.saves else [None]
    if any(m not in (None, "background", "inline") for m in saves):
        raise SystemExit(f"--saves {args.saves!r}: expected background and/or inline")

    plan = schedule(modes, args.rounds)
    store = args.store or tempfile.mkdtemp(prefix="rlcr-bench-iteration-")
    try:
        results = measure(args, modes, saves, plan, store)
    finally:
        if not args.store:  # a temporary store: its checkpoints are 1.6 GB a save at demo scale
            shutil.rmtree(store, ignore_errors=True)
    if len(saves) > 1:
        (fa, ia), (fb, ib) = results[saves[0]], results[saves[1]]
        say(f"save {saves[0]}/{saves[1]}: iteration time {ia / ib:.3f} (overhead fraction {fa:.3f} vs {fb:.3f})")
        say(f"iteration overhead fraction: {fa:.3f}")


if __name__ == "__main__":
    main()
