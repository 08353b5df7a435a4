"""Does RLCR calibrate? RLVR vs one-turn RLCR vs two-turn RLCR from one warm-start (docs/design.md §9).

    python bench/methods.py [--config configs/methods.yaml] [--iterations 20] [--chunk 5] [--store DIR]
                            [--methods rlcr,rlvr,rlcr_single] [--variant NAME] [--table-only]
                            [field=value ...] [method:field=value ...]

1. One warm-start for all three methods (``sft_single_turn: true``: turn-1, turn-2 and one-turn examples),
   reused when already sealed in the store.
2. Equal generated tokens per iteration: the same prompts each iteration (same seed and P) for every method,
   and each method's group size G_a chosen so that its generated tokens per prompt match two-turn ``rlcr``'s
   (G_a answers + G_a·G_c confidences). The lengths come from one calibration rollout of ``rlcr`` and
   ``rlcr_single`` from the warm-start on the first iterations' prompts; the chosen G_a are kept in
   ``<store>/methods-plan.json`` so a resumed benchmark keeps them. Generated and trained tokens per iteration are
   measured and reported.
3. The three runs advance in turns, ``--chunk`` iterations at a time (each chunk one `rlcr/train` flow run
   that resumes the method's run), evaluating on the held-out set (``tasks.num_eval`` × ``eval.samples``,
   disjoint from the training pool and the warm-start) at every chunk end, so a stopped benchmark still has
   comparable curves. Re-running continues where it stopped.

``--variant NAME`` runs the methods again with other settings (the overrides) from the same warm-start and group
sizes: run ids ``<prefix>-<method>-NAME``, outputs ``<prefix>-NAME.md/png``. ``method:field=value`` applies to that
method only (``lambda_conf`` weighs rlcr's confidence loss but rlcr_single's Brier reward). E.g. centred-only
advantages, which keep the Brier score proper:
``--variant proper --chunk 10 scale_by_std=false rlcr:lambda_conf=10``.

Prints each evaluation as it lands, then the table (accuracy, ECE, Brier, AUROC with 95% bootstrap CIs over
tasks; tokens and seconds per iteration; where the runs kept per-answer evaluation rows, rlcr minus each other
method at the last common evaluation with paired bootstrap CIs, as ``rlcr compare``), writes ``methods.md`` and
``methods.png`` to the store, and ends with ``methods ECE rlcr/rlvr: X`` (the ratio of the two methods' ECE at the
last common evaluation).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

METHODS = ("rlcr", "rlvr", "rlcr_single")
KEYS = ("accuracy", "ece", "brier", "auroc")


CALIBRATION_ITERATIONS = 4
"""The calibration rollout uses the prompts of this many first iterations (lengths vary with the task)."""


def calibrate_group_sizes(cfg, sft_uri: str) -> dict:
    """One rollout of ``rlcr`` and ``rlcr_single`` from the warm-start on the first iterations' prompts → G_a per
    method so that generated tokens per prompt match ``rlcr``'s."""
    from rlcr.rollout.engine import EnginePool
    from rlcr.rollout.pipeline import generate_rollouts
    from rlcr.runs.cluster import ensure_ray
    from rlcr.runs.task_sets import prompts_for_iteration, task_sets

    ensure_ray()
    train, _ = task_sets(cfg)
    prompts = [p for k in range(1, CALIBRATION_ITERATIONS + 1) for p in prompts_for_iteration(cfg, train, k)]
    lengths: dict[str, float] = {}
    with EnginePool(cfg, sft_uri) as engines:
        for method in ("rlcr", "rlcr_single"):
            mcfg = cfg.model_copy(update={"method.name": method})
            rows, _ = generate_rollouts(mcfg, prompts, policy_uri=sft_uri, run_id="calibration", iteration=1,
                                        engines=engines)
            for kind in ("answer", "confidence"):
                sel = [len(r["completion_ids"]) for r in rows if r["sample_type"] == kind]
                if sel:
                    lengths[f"{method}/{kind}"] = statistics.fmean(sel)
    g_a, g_c = cfg.rollout.num_generations_answer, cfg.rollout.num_generations_confidence
    per_prompt = g_a * lengths["rlcr/answer"] + g_a * g_c * lengths["rlcr/confidence"]
    plan = {
        "rlcr": g_a,
        "rlvr": max(2, round(per_prompt / lengths["rlcr/answer"])),
        "rlcr_single": max(2, round(per_prompt / lengths["rlcr_single/answer"])),
    }
    return {"num_generations_answer": plan, "mean_lengths": lengths, "rlcr_tokens_per_prompt": per_prompt,
            "calibration_prompts": len(prompts)}


def evaluations(cfg, run_id: str) -> list[tuple[int, dict, dict]]:
    """(iteration, eval metrics, rollout stats) of the baseline and every evaluated committed iteration; an
    iteration's eval carries its wall time as ``seconds`` (the baseline's is not recorded)."""
    from rlcr.runs.store import RunStore

    run = RunStore.open(cfg, run_id)
    out = []
    if run.store.exists(run.baseline_rel):
        out.append((0, run.store.read_json(run.baseline_rel)["eval"], {}))
    for m in run.committed():
        met = run.store.read_json(run.store.rel(m["metrics_uri"]))
        if met.get("eval"):
            ev = {**met["eval"], "seconds": met["timings"].get("evaluate_s", math.nan)}
            out.append((m["iteration"], ev, met.get("rollout", {})))
    return out


def group_size_plan(cfg, path: Path, sft_uri: str, methods) -> dict:
    """The equal-token group sizes kept at ``path`` (read bounded and checked: a group size >= 1 for each of
    ``methods``, numeric mean lengths), or computed once from the warm-start (:func:`calibrate_group_sizes`) and
    kept there, so a resumed benchmark keeps them. A bad file is a one-line error naming it."""
    from rlcr.untrusted import MAX_JSON_BYTES, InvalidInput, parse_json, printable

    if not path.exists():
        plan = calibrate_group_sizes(cfg.model_copy(update={"model.name": sft_uri}), sft_uri)
        path.write_text(json.dumps(plan, indent=1))
        return plan
    with open(path, "rb") as f:
        plan = parse_json(f.read(MAX_JSON_BYTES + 1), str(path))
    sizes, lengths = plan.get("num_generations_answer"), plan.get("mean_lengths", {})
    integer = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1  # noqa: E731
    if not (isinstance(sizes, dict) and all(integer(sizes.get(m)) for m in methods) and isinstance(lengths, dict)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in lengths.values())):
        raise InvalidInput(f"{printable(path)}: not a group-size plan (num_generations_answer: a group size >= 1 "
                           f"for each of {', '.join(methods)}; mean_lengths: numbers); remove it to calibrate again")
    return plan


def per_iteration(cfg, run_id: str) -> dict[str, float]:
    """Mean generated / trained tokens and training seconds (rollouts → weight sync) per committed iteration."""
    from rlcr.runs.store import RunStore

    run = RunStore.open(cfg, run_id)
    gen, trained, secs = [], [], []
    for m in run.committed():
        met = run.store.read_json(run.store.rel(m["metrics_uri"]))
        gen.append(met["rollout"].get("tokens/generated", math.nan))
        trained.append(met["rollout"].get("tokens/trained", math.nan))
        secs.append(sum(met["timings"].get(f"{k}_s", 0.0)
                        for k in ("rollouts", "advantages", "update", "sync_weights")))

    def mean(xs):
        return statistics.fmean(xs) if xs else math.nan

    def spread(xs):
        return statistics.pstdev(xs) if len(xs) > 1 else math.nan

    return {"iterations": len(gen), "generated": mean(gen), "generated_sd": spread(gen), "trained": mean(trained),
            "seconds": mean(secs), "seconds_sd": spread(secs)}


def cell(ev: dict, key: str) -> str:
    from rlcr.ui.presentation import with_ci

    return with_ci(ev, key)


def count_cell(ev: dict, n: str) -> str:
    """``"0.63 / 0.74"``: accuracy and AUROC on the tasks of ``n`` numbers (``–`` where undefined)."""
    b = (ev.get("by_count") or {}).get(n)
    if not b:
        return "–"
    return " / ".join("–" if b.get(k) is None else f"{b[k]:.2f}" for k in ("accuracy", "auroc"))


def by_count_text(ev: dict) -> str:
    from rlcr.ui.presentation import by_count_text as text

    return text(ev)


def paired_lines(methods, method_cfg, run_id, iteration) -> list[str]:
    """Markdown rows of rlcr − other at ``iteration``, paired on the same held-out tasks (where both
    evaluations kept their per-answer rows)."""
    from rlcr.evaluation.evaluate import compare_evaluations
    from rlcr.rollout.records import table_to_rows
    from rlcr.runs.store import RunStore
    from rlcr.ui.presentation import difference_text

    if iteration is None:
        return []
    tables = {m: RunStore.open(method_cfg(m), run_id(m)).eval_table(iteration) for m in methods}
    rows = {m: None if t is None else table_to_rows(t) for m, t in tables.items()}
    out = []
    for other in (m for m in methods if m != "rlcr"):
        if rows["rlcr"] is None or rows[other] is None:
            continue
        cfg = method_cfg(other)
        cmp = compare_evaluations(rows["rlcr"], rows[other], n_resamples=cfg.eval.bootstrap_resamples,
                                  seed=cfg.tasks.eval_seed)
        if not out:
            out = [f"Paired on the same held-out tasks at iteration {iteration} [paired 95% bootstrap CI over tasks]:",
                   "", "| difference | tasks | accuracy | ECE | Brier | AUROC |", "|---|---|---|---|---|---|"]
        out.append(f"| rlcr − {other} | {cmp['n_tasks']} | "
                   + " | ".join(difference_text(cmp, k) for k in KEYS) + " |")
    return out


def split_overrides(ap, overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``field=value`` → every method; ``method:field=value`` → that method only."""
    shared: list[str] = []
    per_method: dict[str, list[str]] = {}
    for o in overrides:
        head, eq, _ = o.partition("=")
        if not eq:
            ap.error(f"override {o!r}: expected field=value or method:field=value")
        if ":" in head:
            method = head.partition(":")[0]
            if method not in METHODS:
                ap.error(f"override {o!r}: unknown method {method!r} (one of {', '.join(METHODS)})")
            per_method.setdefault(method, []).append(o.partition(":")[2])
        else:
            shared.append(o)
    return shared, per_method


def open_tracking(cfg, a, methods, out_name, sft_uri, plan, method_cfg, run_id):
    """The benchmark's MLflow run (``<out_name>/benchmark``: no rlcr run id has a ``/``), and each method's run
    as its child (tag ``mlflow.parentRunId``): created here, then found and continued by the flow's tracker."""
    from rlcr.tracking import tracker_from_config

    params = {"config": a.config, "methods": ",".join(methods), "iterations": a.iterations, "chunk": a.chunk,
              "prefix": a.prefix, "variant": a.variant, "overrides": " ".join(a.overrides), "warm_start": sft_uri,
              "num_generations_answer": plan["num_generations_answer"]}
    parent = tracker_from_config(cfg, f"{out_name}/benchmark", params=params)
    for method in methods:
        tracker_from_config(method_cfg(method), run_id(method), parent=parent).close()
    if parent.run_url or parent.ui_hint:
        print(f"MLflow: {parent.run_url or parent.ui_hint}", flush=True)
    return parent


def finish_tracking(parent, curves, last_common, ratio, files) -> None:
    """Each method's evaluation at the last common iteration (step = that iteration), the ECE ratio, and the
    table, picture and plan as artifacts of the benchmark's run."""
    if last_common is not None:
        at = {m: next(ev for it, ev, _ in curve if it == last_common) for m, curve in curves.items()}
        parent.log_metrics({**at, "ece_ratio_rlcr_rlvr": ratio}, step=last_common)
    for f in files:
        parent.log_artifact(f)
    parent.close()


def parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace, list[str]]:
    """The parser (for its one-line errors), the arguments, and the methods to run (checked)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/methods.yaml")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=5, help="iterations per flow run and between evaluations")
    ap.add_argument("--store", default=None, help="storage.uri (default: the config's)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--prefix", default="methods", help="run ids: <prefix>-sft, <prefix>-<method>")
    ap.add_argument("--variant", default="", help="run ids <prefix>-<method>-VARIANT: the methods with other settings "
                                                  "from the same warm-start and group sizes")
    ap.add_argument("--table-only", action="store_true",
                    help="no training: the table, picture and headline from what the store holds (e.g. after "
                         "running some methods further than others)")
    ap.add_argument("overrides", nargs="*", help="field=value")
    a = ap.parse_args()
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        ap.error(f"--methods: unknown {unknown} (one of {', '.join(METHODS)})")
    if "rlcr" not in methods or "rlvr" not in methods:
        ap.error("--methods must include rlcr and rlvr (the headline compares them)")
    if a.variant and not all(c.isalnum() or c in "_." for c in a.variant):
        ap.error(f"--variant {a.variant!r}: letters, digits, '_' and '.' only (it names runs and files)")
    return ap, a, methods


def results_table(methods, curves, costs, group_sizes, last_common) -> list[str]:
    """Markdown rows: each method at iteration 0, the last common evaluation and its own last one (metrics with
    their CIs, accuracy / AUROC per number count, parse rate, tokens and seconds per iteration, eval seconds)."""
    counts = sorted({n for m in methods for _, ev, _ in curves[m] for n in (ev.get("by_count") or {})}, key=int)
    lines = ["| method | G_a | iteration | accuracy | ECE | Brier | AUROC | "
             + "".join(f"acc. / AUROC, {n} numbers | " for n in counts)
             + "conf. parse rate | tokens generated / trained per it. | s per it. | eval s |",
             "|---|---|---|---|---|---|---|" + "---|" * len(counts) + "---|---|---|---|"]
    for m in methods:
        c = costs[m]
        for it, ev, _ in curves[m]:
            if it in (0, last_common, curves[m][-1][0]):
                lines.append(f"| {m} | {group_sizes[m]} | {it} | " + " | ".join(cell(ev, k) for k in KEYS)
                             + " | " + "".join(f"{count_cell(ev, n)} | " for n in counts)
                             + f"{ev.get('confidence_parse_rate', math.nan):.2f} | {c['generated']:.0f} ± "
                             f"{c['generated_sd']:.0f} / {c['trained']:.0f} | {c['seconds']:.0f} ± "
                             f"{c['seconds_sd']:.0f} | "
                             + (f"{ev['seconds']:.0f} |" if "seconds" in ev else "– |"))
    return lines


def table_note(a, resamples: int, methods, curves) -> str:
    """The line under the table: the held-out set's size, the CIs' kind, and the variant's settings."""
    n_tasks = next((ev.get("n_tasks") for m in methods for _, ev, _ in curves[m]), None)
    n_answers = next((ev.get("n_answers") for m in methods for _, ev, _ in curves[m]), None)
    return (f"Held-out: {n_tasks} tasks × {(n_answers or 0) // max(n_tasks or 1, 1)} answers; [95% bootstrap CI, "
            f"{resamples} resamples of tasks]. Iteration 0 = the shared warm-start, evaluated with each method's own "
            "confidence query."
            + (f" Variant '{a.variant}' of {a.config}: {' '.join(a.overrides)}." if a.variant else ""))


def _ci_bound(ev: dict, key: str, side: int) -> float:
    bounds = (ev.get("ci") or {}).get(key)
    return bounds[side] if bounds else math.nan


def plot_curves(methods, curves, png: Path) -> None:
    """Held-out accuracy, ECE and AUROC per iteration with their 95% CIs, and each method's reliability diagram
    at its last evaluation (accuracy per confidence bin, marker area ∝ answers), written to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    for ax, key in zip(axes, ("accuracy", "ece", "auroc")):
        for m in methods:
            its = [it for it, _, _ in curves[m]]
            ax.plot(its, [ev.get(key, math.nan) for _, ev, _ in curves[m]], marker="o", label=m)
            ax.fill_between(its, [_ci_bound(ev, key, 0) for _, ev, _ in curves[m]],
                            [_ci_bound(ev, key, 1) for _, ev, _ in curves[m]], alpha=0.15)
        ax.set_title(f"held-out {key} (95% CI)")
        ax.set_xlabel("iteration")
        ax.legend()
    ax = axes[3]
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    for m in (m for m in methods if curves[m]):
        it, ev, _ = curves[m][-1]
        bins = [b for b in ev.get("reliability") or [] if b.get("count")]
        ax.plot([b["mean_confidence"] for b in bins], [b["accuracy"] for b in bins], marker="o", label=f"{m} (it {it})")
        ax.scatter([b["mean_confidence"] for b in bins], [b["accuracy"] for b in bins],
                   s=[4 + 300 * b["count"] / max(ev.get("n", 1), 1) for b in bins], alpha=0.3)
    ax.set(xlim=(0, 1), ylim=(0, 1), title="reliability at the last evaluation", xlabel="stated confidence (bin mean)",
           ylabel="accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def ece_ratio(curves) -> tuple[int | None, dict[str, float], float]:
    """The headline: rlcr's ECE over rlvr's at the last iteration both evaluated (NaN where undefined)."""
    common = sorted(set(it for it, _, _ in curves["rlcr"]) & set(it for it, _, _ in curves["rlvr"]))
    last = common[-1] if common else None
    ece = {m: dict((it, ev) for it, ev, _ in curves[m]).get(last, {}).get("ece", math.nan) for m in ("rlcr", "rlvr")}
    return last, ece, (ece["rlcr"] / ece["rlvr"] if ece["rlvr"] else math.nan)


def warm_start_and_plan(ap, a, cfg, plan_path: Path, methods) -> tuple[str, dict]:
    """The shared warm-start (trained, or reused when sealed) and the kept group sizes; with ``--table-only`` both
    must exist already (nothing is trained or rolled out)."""
    from rlcr.train.sft import warm_start

    if a.table_only:
        from rlcr.runs.store import RunStore

        sft_run = RunStore.open(cfg, f"{a.prefix}-sft")
        if not sft_run.store.is_complete(sft_run.checkpoint_rel(0)) or not plan_path.exists():
            ap.error(f"--table-only: no sealed warm-start '{a.prefix}-sft' or no {plan_path} in {cfg.storage.uri}; "
                     "run the benchmark first")
    t0 = time.perf_counter()
    sft_uri, reused = warm_start(cfg, run_id=f"{a.prefix}-sft")
    print(f"warm-start: {sft_uri} ({'reused' if reused else 'trained'}, {time.perf_counter() - t0:.0f} s)", flush=True)
    plan = group_size_plan(cfg, plan_path, sft_uri, methods)
    print(f"group sizes (equal generated tokens per prompt): {plan['num_generations_answer']}; "
          f"mean lengths {', '.join(f'{k} {v:.1f}' for k, v in plan['mean_lengths'].items())}", flush=True)
    return sft_uri, plan


def main() -> None:
    ap, a, methods = parse_args()
    from flows.train import rlcr_train
    from rlcr.config import load_config

    # ----------------------------------------------------------------- 1. warm-start and group sizes
    shared, per_method = split_overrides(ap, a.overrides)
    overrides = shared + ([f"storage.uri={a.store}"] if a.store else [])
    out_name = f"{a.prefix}-{a.variant}" if a.variant else a.prefix

    def run_id(method: str) -> str:
        return f"{a.prefix}-{method}" + (f"-{a.variant}" if a.variant else "")

    cfg = load_config(a.config, [*overrides, "sft.single_turn=true", f"eval.every={a.chunk}"])
    store = Path(cfg.storage.uri) if "://" not in cfg.storage.uri else Path(".")
    store.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    plan_path = store / f"{a.prefix}-plan.json"
    sft_uri, plan = warm_start_and_plan(ap, a, cfg, plan_path, methods)

    def method_overrides(method: str) -> list[str]:
        return [*overrides, f"model.name={sft_uri}", f"method.name={method}", f"eval.every={a.chunk}",
                f"rollout.num_generations_answer={plan['num_generations_answer'][method]}",
                f"orchestration.save_every={a.chunk}",
                *per_method.get(method, [])]

    def method_cfg(method: str):
        return load_config(a.config, method_overrides(method))

    parent = open_tracking(cfg, a, methods, out_name, sft_uri, plan, method_cfg, run_id)

    # ----------------------------------------------------------------- 2. the methods in turns, chunk by chunk
    seen: set[tuple[str, int]] = set()

    def report_new() -> None:
        for method in methods:
            for it, ev, _ in evaluations(method_cfg(method), run_id(method)):
                if (method, it) not in seen:
                    seen.add((method, it))
                    print(f"{method:12s} it {it:3d}  " + "  ".join(f"{k} {cell(ev, k)}" for k in KEYS)
                          + f"  n={ev.get('n_tasks')}×{ev.get('n_answers', 0) // max(ev.get('n_tasks') or 1, 1)}"
                          + (f"  eval {ev['seconds']:.0f} s" if "seconds" in ev else "")
                          + (f"  ({by_count_text(ev)})" if by_count_text(ev) else ""),
                          flush=True)

    report_new()
    for target in ([] if a.table_only else range(a.chunk, a.iterations + a.chunk, a.chunk)):
        target = min(target, a.iterations)
        for method in methods:
            t0 = time.perf_counter()
            rlcr_train(config=a.config, overrides=method_overrides(method), run_id=run_id(method),
                       iterations=target)
            print(f"{method}: through iteration {target} ({time.perf_counter() - t0:.0f} s)", flush=True)
            report_new()
        if target == a.iterations:
            break

    # ----------------------------------------------------------------- 3. table, picture, headline
    curves = {m: evaluations(method_cfg(m), run_id(m)) for m in methods}
    costs = {m: per_iteration(method_cfg(m), run_id(m)) for m in methods}
    # the last iteration every method has evaluated: the table compares there
    common = sorted(set.intersection(*(set(it for it, _, _ in curves[m]) for m in methods)))
    last_common = common[-1] if common else None
    table = "\n".join([*results_table(methods, curves, costs, plan["num_generations_answer"], last_common),
                       *(["", *paired] if (paired := paired_lines(methods, method_cfg, run_id, last_common)) else [])])
    note = table_note(a, cfg.eval.bootstrap_resamples, methods, curves)
    print(table)
    print(note)
    (store / f"{out_name}.md").write_text(table + "\n\n" + note + "\n")
    png = store / f"{out_name}.png"
    plot_curves(methods, curves, png)
    print(f"table: {store / (out_name + '.md')}  picture: {png}  ({(time.perf_counter() - t_start) / 60:.1f} min)")

    last, ece, ratio = ece_ratio(curves)
    print(f"(at iteration {last}: ECE rlcr {ece['rlcr']:.3f}, rlvr {ece['rlvr']:.3f})")
    print(f"methods ECE rlcr/rlvr: {ratio:.3f}")
    finish_tracking(parent, curves, last_common, ratio, [store / f"{out_name}.md", png, plan_path])


if __name__ == "__main__":
    main()
