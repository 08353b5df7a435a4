"""The runs of the pre-registered addendum, bench/protocol-2.yaml (issue 51): what it names, and nothing else.

    python bench/grid.py --protocol bench/protocol-2.yaml [--seeds 4] [--methods rlvr_g4] [--store DIR]

Per seed, in order (each step resumable: a re-run continues where the last one stopped):

1. **The warm-start** (``grid-s<seed>-sft``), from bench/protocol.yaml's shared settings, exactly as the first
   grid makes it. For the first grid's seeds (1–3) its weights digest is compared with the one their committed
   records name: equal means the same starting weights (a different CPU can change the bits; it is printed, and
   every record names the digest it started from).
2. **The group sizes.** rlcr and rlvr_g4 have theirs fixed (4); rlvr's equal-token size comes from the seed's
   plan: the first grid's committed ``bench/results/grid/s<seed>-plan.json`` for seeds 1–3, a new one (same
   calibration rollout, :func:`bench.methods.group_size_plan`) kept under ``bench/results/grid-2/`` for new seeds.
3. **The training runs** (``grid-s<seed>-<method>``, ``--chunk`` iterations per flow run), of every policy the
   addendum evaluates on this seed: rlcr and rlvr on the new seeds, rlvr_g4 on all, and — because the
   out-of-domain rule reads every policy on every seed and the first grid kept no checkpoints — rlcr and rlvr on
   seeds 1–3 again, from the same seed and settings (their in-domain figures stay the committed ones).
4. **The evaluations**, each a record under ``bench/results/grid-2/`` (bench/grid_records.py's format; an existing
   record is never redone or replaced), the trained policies' first and the warm-start's last: a session that ends
   early loses a trained checkpoint with its store, while the warm-start is trained again by any later session:
   * in domain, the base protocol's four (test and calibration split × primary and paper protocol) for every
     (policy, seed) the addendum's ``runs`` name — the first grid's records are not redone;
   * out of domain, the math task's shipped set (``out_of_domain.math``: its files, its answers per task, sampling
     at the training temperature, draw 0) for every policy it lists on every seed: ``s<seed>-<policy>-math-primary``;
     and the same on the ``qa`` task's shipped set (``out_of_domain.question_answering``, since the addendum's
     amendment 1): ``s<seed>-<policy>-qa-primary``. The policy is the one trained on Countdown; only the task's
     prompt and verifier change (``tasks.name=math`` or ``qa``, the task's default options).

A policy is trained only while a record it names is missing, so a seed whose records are all in trains nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.grid_protocol import ADDENDUM_DATA, OUT_OF_DOMAIN
from bench.grid_records import DEFAULT_DIR, read_records, record_name, record_table, weights_digest, write_record

ADDENDUM_DIR = DEFAULT_DIR.parent / "grid-2"
"""Where the addendum's records go (the first grid's stay under ``bench/results/grid/``, unchanged)."""
TRAINED = ("rlcr", "rlvr", "rlvr_g4")
"""The policies trained from a seed's warm-start (the warm-start itself is the fourth)."""


def ood_tasks(addendum, key: str) -> list:
    """An out-of-domain set (``out_of_domain.<key>``: ``math``, ``question_answering``): every row of its shipped
    files, as its task's problems."""
    from rlcr.tasks.registry import get_task

    ood = addendum.out_of_domain[key]
    task = get_task(ood["task"])
    return [p for f in ood["files"] for p in task.load(str(ADDENDUM_DATA.parents[2] / f))]


def trained_here(addendum, seed: int) -> list[str]:
    """The policies to train on ``seed``: those the addendum evaluates there, in domain or out of domain."""
    ood = {p for k in OUT_OF_DOMAIN for p in addendum.out_of_domain[k]["policies"]}
    return [m for m in TRAINED if seed in addendum.runs[m] or m in ood]


def missing(addendum, seed: int, policy: str, records: Path) -> list[str]:
    """The records of ``policy`` on ``seed`` that the addendum names and ``records`` does not hold yet (the first
    grid's in-domain ones count as held)."""
    base = addendum.base
    names = [record_name(seed, policy, split, d.name) for split in ("test", "calibration") for d in base.decodings
             if seed in addendum.runs[policy]]
    names += [record_name(seed, policy, OUT_OF_DOMAIN[k], "primary") for k in OUT_OF_DOMAIN
              if policy in addendum.out_of_domain[k]["policies"]]
    return [n for n in names if not (records / n).exists() and not (DEFAULT_DIR / n).exists()]


def committed_warm_starts(seed: int, records: Path) -> set[str]:
    """The warm-start digests the records under ``records`` of ``seed`` name (empty: no record of that seed)."""
    digests: dict = {}
    read_records(records, digests)
    return {d for (s, *_), d in digests.items() if s == seed}


def method_overrides(addendum, files, store: Path, seed: int, chunk: int, method: str, sft_uri: str,
                     sizes: dict[str, int]) -> list[str]:
    """A method's settings on ``seed``: the base protocol's (rlvr_g4: rlvr's with its own group size and λ),
    the split's task files, the store, the warm-start; rlvr's equal-token group size from the seed's plan."""
    from bench.grid_runs import seed_overrides

    base = addendum.base
    if method == "rlvr_g4":
        own = [o for o in seed_overrides(base, files, str(store), seed, chunk, "rlvr")
               if o not in base.methods["rlvr"]]
        return [*own, *addendum.methods["rlvr_g4"], f"model.name={sft_uri}", "method.name=rlvr"]
    extra = [f"rollout.num_generations_answer={sizes[method]}"] if method in base.equal_token else []
    return [*seed_overrides(base, files, str(store), seed, chunk, method), f"model.name={sft_uri}",
            f"method.name={method}", *extra]


def ood_config(cfg, ood: dict):
    """``cfg`` (a policy's) for the out-of-domain set ``ood`` (``addendum.out_of_domain[key]``): its task with the
    task's default options, no Countdown files, its answers per task, and its ``max_prompt_tokens`` where it names
    one (amendment 2)."""
    bound = {"rollout.max_prompt_tokens": ood["max_prompt_tokens"]} if "max_prompt_tokens" in ood else {}
    return cfg.model_copy(update={"tasks.name": ood["task"], "tasks.options": {}, "tasks.train_file": None,
                                  "tasks.eval_file": None, "eval.samples": ood["answers_per_task"], **bound})


def evaluate_ood(cfg, addendum, key: str, seed: int, policy: str, policy_uri: str, iteration: int, tasks: list,
                 records: Path, warm_start: str) -> None:
    """The record of one policy on the out-of-domain set ``key`` (skipped if it exists): ``answers_per_task``
    sampled answers per shipped problem at the training temperature, draw 0."""
    from rlcr.evaluation.evaluate import evaluate_policy
    from rlcr.rollout.engine import EnginePool
    from rlcr.runs.cluster import ensure_ray

    task = addendum.out_of_domain[key]["task"]
    name = record_name(seed, policy, OUT_OF_DOMAIN[key], "primary")
    if (records / name).exists():
        return
    ensure_ray()
    ocfg = ood_config(cfg, addendum.out_of_domain[key])
    t0 = time.perf_counter()
    with EnginePool(ocfg, policy_uri) as engines:
        _, rows = evaluate_policy(ocfg, tasks, policy_uri=policy_uri, iteration=iteration, engines=engines,
                                  run_id=f"grid-s{seed}-{policy}", draw=0, temperature=None)
    write_record(records, name, record_table(rows, seed=seed, policy=policy, split=OUT_OF_DOMAIN[key],
                                             protocol="primary", task_name=task, warm_start=warm_start))
    print(f"seed {seed} {policy}: {name} ({len(tasks)} {task} problems, {time.perf_counter() - t0:.0f} s)", flush=True)


def evaluate_all(cfg, addendum, seed: int, policy: str, uri: str, iteration: int, sets: dict, records: Path,
                 digest: str) -> None:
    """Every record the addendum names for ``policy`` on ``seed``, in domain then out of domain, the set
    with fewer answers first (question answering before math: a session that ends mid-way loses less); those already
    on record are skipped."""
    from bench.grid_runs import evaluate_records

    if seed in addendum.runs[policy]:
        evaluate_records(cfg, addendum.base, seed, policy, uri, iteration,
                         {k: sets[k] for k in ("test", "calibration")}, records, digest)
    size = {k: len(sets[k]) * addendum.out_of_domain[k]["answers_per_task"] for k in OUT_OF_DOMAIN}
    for key in sorted(OUT_OF_DOMAIN, key=size.__getitem__):
        if policy in addendum.out_of_domain[key]["policies"]:
            evaluate_ood(cfg, addendum, key, seed, policy, uri, iteration, sets[key], records, digest)


def run_addendum_seed(addendum, files, split, store: Path, seed: int, methods, chunk: int,
                      records: Path = ADDENDUM_DIR) -> None:
    """One seed of the addendum (module docstring): warm-start, group sizes, training, evaluations."""
    from bench.grid_runs import run_id, seed_overrides
    from bench.methods import group_size_plan
    from flows.train import rlcr_train
    from rlcr.config import load_config
    from rlcr.runs.refs import newest_checkpoint
    from rlcr.storage import fetch_checkpoint
    from rlcr.train.sft import warm_start

    base = addendum.base
    cfg = load_config(base.config, seed_overrides(base, files, str(store), seed, chunk))
    t0 = time.perf_counter()
    sft_uri, reused = warm_start(cfg, run_id=run_id(seed, "sft"))
    digest = weights_digest(fetch_checkpoint(sft_uri, endpoint_url=cfg.storage.s3_endpoint_url))
    before = committed_warm_starts(seed, DEFAULT_DIR if seed in base.seeds else records)
    same = "" if not before else (", the same as its committed records'" if digest in before else
                                  f", NOT its committed records' ({', '.join(sorted(d[:12] for d in before))}): "
                                  "another CPU's bits, named in the table")
    print(f"seed {seed}: warm-start {sft_uri}, weights sha256 {digest}{same} "
          f"({'reused' if reused else 'trained'}, {time.perf_counter() - t0:.0f} s)", flush=True)
    records.mkdir(parents=True, exist_ok=True)
    plan_path = (DEFAULT_DIR if seed in base.seeds else records) / f"s{seed}-plan.json"
    plan = group_size_plan(cfg, plan_path, sft_uri, base.methods)
    sizes = {m: plan["num_generations_answer"][m] for m in base.methods}
    todo = [m for m in trained_here(addendum, seed) if m in methods and missing(addendum, seed, m, records)]
    print(f"seed {seed}: trains {', '.join(todo) or 'nothing (every record of it is in)'}; rlvr's equal-token group "
          f"size {sizes['rlvr']} ({plan_path.name})", flush=True)
    over = {m: method_overrides(addendum, files, store, seed, chunk, m, sft_uri, sizes) for m in todo}
    for target in [*range(chunk, base.iterations, chunk), base.iterations]:
        for m in todo:
            t = time.perf_counter()
            rlcr_train(config=base.config, overrides=over[m], run_id=run_id(seed, m), iterations=target)
            print(f"seed {seed} {m}: through iteration {target} ({time.perf_counter() - t:.0f} s)", flush=True)
    sets = {"test": split.test, "calibration": split.calibration,
            **{k: ood_tasks(addendum, k) for k in OUT_OF_DOMAIN}}
    for m in todo:  # the trained policies first: their checkpoints go with the store, a warm-start is remade
        mcfg = load_config(base.config, over[m])
        iteration, checkpoint = newest_checkpoint(mcfg, run_id(seed, m))  # its seal checked
        if iteration != base.iterations:
            raise SystemExit(f"{run_id(seed, m)}: at iteration {iteration}, not {base.iterations}; re-run to resume")
        evaluate_all(mcfg, addendum, seed, m, checkpoint, base.iterations, sets, records, digest)
    wcfg = load_config(base.config, [*seed_overrides(base, files, str(store), seed, chunk), f"model.name={sft_uri}",
                                     "method.name=rlcr"])
    evaluate_all(wcfg, addendum, seed, "warm_start", sft_uri, 0, sets, records, digest)
    print(f"seed {seed}: {', '.join(todo)} done — commit the records under {records}", flush=True)
