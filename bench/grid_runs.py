"""The seed runners of the pre-registered grid (bench/protocol.yaml), shared by its CLI (bench/grid.py) and the
addendum's runner (bench/grid_addendum.py): a seed's settings, the split written and checked, one seed's
warm-start, group sizes, runs and evaluations, and the evaluations of one policy written as records. Steps 2–4 of
bench/grid.py's docstring."""

from __future__ import annotations

import time
from pathlib import Path

from bench.grid_protocol import SplitError, build_split, check_disjoint, write_split
from bench.grid_records import record_name, record_table, weights_digest, write_record

__all__ = ["run_id", "seed_overrides", "prepare_split", "evaluate_records", "run_seed"]


def run_id(seed: int, what: str) -> str:
    """``grid-s1-rlcr``, ``grid-s1-sft``: run ids that name the seed."""
    return f"grid-s{seed}-{what}"


def seed_overrides(protocol, files, store: str, seed: int, chunk: int, method: str = "rlcr") -> list[str]:
    """A seed's settings: the protocol's (``method``'s own included), the split's task files, the store; no
    intermediate evaluation (the protocol's are run at the end), only the newest checkpoint kept."""
    return [*protocol.overrides(method), f"run.seed={seed}", f"tasks.train_file={files['train']}",
            f"tasks.eval_file={files['test']}", f"storage.uri={store}", "eval.every=0",
            f"orchestration.save_every={chunk}", "orchestration.keep_checkpoints=1"]


def prepare_split(protocol, base_cfg, store: Path, seeds, chunk: int):
    """The split written into the store, each seed's config read back from those files, and the disjointness
    of the split and of every seed's warm-start tasks checked — before any training. Returns (files, split)."""
    from rlcr.config import load_config
    from rlcr.runs.task_sets import held_out_set, sft_tasks, training_pool
    from rlcr.tasks.registry import get_task

    task = get_task(base_cfg.tasks.name)
    split = build_split(protocol, base_cfg)
    files = write_split(split, store / "grid-split", task)
    warm = {}
    for seed in seeds:
        cfg = load_config(protocol.config, seed_overrides(protocol, files, str(store), seed, chunk))
        pool = training_pool(cfg)
        ids = lambda ts: {task.identity(t) for t in ts}  # noqa: E731
        if ids(pool) != ids(split.train) or ids(held_out_set(cfg, pool)) != ids(split.test):
            raise SplitError(f"seed {seed}: the run does not read the split's training pool and test split")
        warm[seed] = sft_tasks(cfg, cfg.sft.tasks, pool)
    check_disjoint(split, warm, task)
    return files, split


def evaluate_records(cfg, protocol, seed: int, policy: str, policy_uri: str, iteration: int, tasks: dict,
                     records: Path, warm_start: str) -> None:
    """The protocol's evaluations of one policy (primary then paper protocol × test and calibration: the goals
    rest on the primary records, so they land first), each written as its record; those already on record are
    skipped. ``cfg``: the policy's method (its confidence query);
    ``warm_start``: the digest of the seed's warm-start weights (:func:`bench.grid_records.weights_digest`)."""
    from rlcr.evaluation.evaluate import evaluate_policy
    from rlcr.rollout.engine import EnginePool
    from rlcr.runs.cluster import ensure_ray

    todo = [(split, d) for d in protocol.decodings for split in ("test", "calibration")
            if not (records / record_name(seed, policy, split, d.name)).exists()]
    if not todo:
        return
    ensure_ray()
    with EnginePool(cfg, policy_uri) as engines:
        for split, d in todo:
            t0 = time.perf_counter()
            ecfg = cfg.model_copy(update={"eval.samples": d.answers_per_task})
            _, rows = evaluate_policy(ecfg, tasks[split], policy_uri=policy_uri, iteration=iteration, engines=engines,
                                      run_id=run_id(seed, policy), draw=0, temperature=d.temperature)
            name = record_name(seed, policy, split, d.name)
            write_record(records, name, record_table(rows, seed=seed, policy=policy, split=split, protocol=d.name,
                                                     task_name=cfg.tasks.name, warm_start=warm_start))
            print(f"seed {seed} {policy}: {name} ({len(tasks[split])} tasks, {time.perf_counter() - t0:.0f} s)",
                  flush=True)


def run_seed(protocol, files, split, store: Path, seed: int, methods, chunk: int, records: Path) -> None:
    """One seed of the grid: warm-start, group sizes, the methods' runs in chunks, the evaluations."""
    from bench.methods import group_size_plan
    from flows.train import rlcr_train
    from rlcr.config import load_config
    from rlcr.runs.refs import newest_checkpoint
    from rlcr.storage import fetch_checkpoint
    from rlcr.train.sft import warm_start

    base = seed_overrides(protocol, files, str(store), seed, chunk)
    cfg = load_config(protocol.config, base)
    t0 = time.perf_counter()
    sft_uri, reused = warm_start(cfg, run_id=run_id(seed, "sft"))
    digest = weights_digest(fetch_checkpoint(sft_uri, endpoint_url=cfg.storage.s3_endpoint_url))
    print(f"seed {seed}: warm-start {sft_uri}, weights sha256 {digest} ({'reused' if reused else 'trained'}, "
          f"{time.perf_counter() - t0:.0f} s)", flush=True)
    records.mkdir(parents=True, exist_ok=True)
    plan = group_size_plan(cfg, records / f"s{seed}-plan.json", sft_uri, protocol.methods)
    sizes = {m: plan["num_generations_answer"][m] for m in methods}
    print(f"seed {seed}: group sizes (equal generated tokens per prompt) {sizes}", flush=True)

    def overrides(method: str) -> list[str]:
        extra = [f"rollout.num_generations_answer={sizes[method]}"] if method in protocol.equal_token else []
        return [*seed_overrides(protocol, files, str(store), seed, chunk, method), f"model.name={sft_uri}",
                f"method.name={method}", *extra]

    for target in [*range(chunk, protocol.iterations, chunk), protocol.iterations]:
        for method in methods:
            t = time.perf_counter()
            rlcr_train(config=protocol.config, overrides=overrides(method), run_id=run_id(seed, method),
                       iterations=target)
            print(f"seed {seed} {method}: through iteration {target} ({time.perf_counter() - t:.0f} s)", flush=True)
    tasks = {"test": split.test, "calibration": split.calibration}
    evaluate_records(load_config(protocol.config, [*base, f"model.name={sft_uri}", "method.name=rlcr"]), protocol,
                     seed, "warm_start", sft_uri, 0, tasks, records, digest)
    for method in methods:
        mcfg = load_config(protocol.config, overrides(method))
        iteration, checkpoint = newest_checkpoint(mcfg, run_id(seed, method))  # its seal checked
        if iteration != protocol.iterations:
            raise SystemExit(f"{run_id(seed, method)}: at iteration {iteration}, not {protocol.iterations}; "
                             "re-run to resume")
        evaluate_records(mcfg, protocol, seed, method, checkpoint, protocol.iterations, tasks, records, digest)
    print(f"seed {seed}: {', '.join(methods)} done — commit the records and s{seed}-plan.json under {records}",
          flush=True)
