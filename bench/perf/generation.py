"""The flow's generation against the raw engine on the same requests, and turn 2 pipelined or not (issue 34).

One iteration's requests at the config's sizes (default configs/demo.yaml: P = 4 prompts × G_a = 4 answers,
then G_c = 2 confidences per answer; 160/96 tokens; T = 0.8; the flow's per-request seeds), from the policy
``--policy`` (default: the demo's warm-start, trained into ``--store`` once and reused; its answers end at
``</answer>`` after varying lengths, as in training). Sides, taking turns within each round so the machine's
drift hits all alike; each round is the prompts of iteration ``round + 1``:

  ceiling        the engine's peak here: ``--ceiling-requests`` requests of ``--ceiling-tokens`` tokens each,
                 all the same length (ignore_eos), in one raw ``vllm.LLM.generate`` call
  direct         raw ``vllm.LLM.generate`` (rlcr.rollout.sampling.sample) in this process: all answers in one
                 call, then all confidences in a second call (the two-call way)
  direct-tree    the same requests in this process, each answer's confidences sent as soon as it is done
                 (rlcr.rollout.sampling.sample_tree)
  flow           rlcr.rollout.pipeline.run_rollouts on the flow's long-lived engine actor (Ray Data, both
                 stages), ``rollout.pipeline_turns=false``: the former way
  flow-pipelined the same with ``rollout.pipeline_turns=true`` (off by default since it did not pay here)

Every side starts from an empty prefix cache (``LLM.reset_prefix_cache`` on the in-process engine and on the
flow's engine actor): the sides draw the same samples, so a side run after another on the same engine would
find its turn-1 and turn-2 prompts cached and prefill nothing (a first version of this benchmark read that
as a 10–20% advantage for whichever side ran second).

Generation tokens/s = generated tokens / time inside the generate calls (for the flow: the stages' own
``rollout/*_generate_s``); the flow's wall time of ``run_rollouts`` is printed too. The samples of
``direct-tree`` and ``flow-pipelined`` are compared with ``direct``'s (same seeds: the same tokens expected,
the kernels' float rounding aside). Last line: ``flow generation tokens/s pipelined/former: X`` (median over
rounds of the per-round ratio).

``--batch-curve`` measures instead what a long tail costs (issue 34 item 2: "avoid a long tail of one or two
sequences decoding alone"): per round, the raw engine's decode rate at batch sizes 1, 2, 4, … 32 (fixed-length
requests, as the ceiling), then the iteration's requests the two-call way; from the answers' and confidences'
lengths and the curve, each turn's decode steps are costed (a step with k sequences decoding takes k / rate(k)),
and the steps with at most two sequences decoding are the tail. What the tail could save at most is its time
minus the same tokens at the full batch's cost per token; what keeping the batch full could save at most (the
whole thinning batch, not only its last two) is the turn's decode estimate minus all its tokens at that cost.
Last line: ``generation tail cost fraction: X`` (the tail's saving over the measured generation time, median
over rounds).

    python bench/perf/generation.py [--config configs/demo.yaml] [--rounds 3] [--policy URI] [--store DIR]
    python bench/perf/generation.py --batch-curve [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

SIDES = ("ceiling", "direct", "direct-tree", "flow", "flow-pipelined")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policy", default=None, help="checkpoint URI (default: the config's warm-start, trained once)")
    ap.add_argument("--store", default="./bench-store", help="storage.uri for the warm-start and the rollouts")
    ap.add_argument("--ceiling-requests", type=int, default=32)
    ap.add_argument("--ceiling-tokens", type=int, default=128)
    ap.add_argument("--batch-curve", action="store_true", help="the decode rate by batch size, and the tail's cost")
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    return ap.parse_args()


def policy_of(cfg, args) -> str:
    """``--policy``, or the config's warm-start (``bench-generation-sft`` in the store: trained once, reused)."""
    if args.policy:
        return args.policy
    from rlcr.train.sft import warm_start

    t0 = time.perf_counter()
    uri, reused = warm_start(cfg, run_id="bench-generation-sft")
    print(f"warm-start {uri} ({'reused' if reused else 'trained'}, {time.perf_counter() - t0:.0f} s)", flush=True)
    return uri


class Direct:
    """The raw engine in this process and the iteration's requests, rendered as the stages render them."""

    def __init__(self, cfg, policy: str):
        from transformers import AutoTokenizer

        from rlcr.rollout.engine import create_engine
        from rlcr.storage import fetch_checkpoint

        local = fetch_checkpoint(policy, endpoint_url=cfg.storage.s3_endpoint_url)
        self.cfg, self.tok = cfg, AutoTokenizer.from_pretrained(local)
        self.llm = create_engine(local, cfg, seed=cfg.run.seed)

    def ceiling(self, n: int, length: int) -> tuple[float, int]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=self.tok("Count from one to one thousand.")["input_ids"])
        params = SamplingParams(max_tokens=length, min_tokens=length, ignore_eos=True, temperature=0.8, seed=1)
        t0 = time.perf_counter()
        out = self.llm.generate([prompt] * n, params, use_tqdm=False)
        return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in out)

    def requests(self, tasks, seed: int):
        from rlcr.seeds import answer_seed, confidence_seed
        from rlcr.tasks.registry import get_task

        r, task = self.cfg.rollout, get_task(self.cfg.tasks.name)
        conv = [task.turn1_messages(t) for _, t in tasks]
        labels = [f"prompt_id={pid}" for pid, _ in tasks]
        seeds = [[answer_seed(seed, pid, k) for k in range(r.num_generations_answer)] for pid, _ in tasks]
        conf = {(pid, k): [confidence_seed(seed, pid, k, h) for h in range(r.num_generations_confidence)]
                for pid, _ in tasks for k in range(r.num_generations_answer)}
        return task, conv, labels, seeds, conf

    def two_calls(self, tasks, seed: int) -> tuple[float, int, dict]:
        from rlcr.rollout.sampling import sample_chats
        from rlcr.rollout.stages import ANSWER_STOP, CONFIDENCE_STOP

        r = self.cfg.rollout
        task, conv, labels, seeds, conf = self.requests(tasks, seed)
        kw = dict(temperature=r.temperature, top_p=r.top_p, max_prompt_tokens=r.max_prompt_tokens)
        t0 = time.perf_counter()
        _, answers = sample_chats(self.llm, self.tok, conv, labels=labels, mask_kind="answer", seeds=seeds,
                                  n=r.num_generations_answer, max_tokens=r.max_answer_tokens, stop=ANSWER_STOP, **kw)
        flat = [(pid, k, t, s) for (pid, t), g in zip(tasks, answers) for k, s in enumerate(g)]
        _, confs = sample_chats(self.llm, self.tok, [task.turn2_messages(t, s.completion_text) for _, _, t, s in flat],
                                labels=[f"{pid}/{k}" for pid, k, _, _ in flat], mask_kind="confidence",
                                seeds=[conf[pid, k] for pid, k, _, _ in flat], n=r.num_generations_confidence,
                                max_tokens=r.max_confidence_tokens, stop=CONFIDENCE_STOP, **kw)
        wall = time.perf_counter() - t0
        tree = {("answer", pid, k, None): s.completion_ids for pid, k, _, s in flat}
        tree.update({("confidence", pid, k, h): s.completion_ids
                     for (pid, k, _, _), g in zip(flat, confs) for h, s in enumerate(g)})
        return wall, sum(map(len, tree.values())), tree

    def pipelined(self, tasks, seed: int) -> tuple[float, int, dict]:
        from rlcr.rollout.sampling import sample_tree
        from rlcr.rollout.stages import ANSWER_STOP, CONFIDENCE_STOP

        r = self.cfg.rollout
        task, conv, labels, seeds, conf = self.requests(tasks, seed)
        pids = [pid for pid, _ in tasks]

        def turn2(i, k, s):
            return task.turn2_messages(tasks[i][1], s.completion_text), f"{pids[i]}/{k}", conf[pids[i], k]

        t0 = time.perf_counter()
        _, answers, second = sample_tree(self.llm, self.tok, conv, labels=labels, seeds=seeds, turn2=turn2,
                                         max_prompt_tokens=r.max_prompt_tokens, temperature=r.temperature,
                                         top_p=r.top_p,
                                         max_tokens=(r.max_answer_tokens, r.max_confidence_tokens),
                                         stop=(ANSWER_STOP, CONFIDENCE_STOP))
        wall = time.perf_counter() - t0
        tree = {("answer", pids[i], k, None): s.completion_ids for i, g in enumerate(answers) for k, s in enumerate(g)}
        tree.update({("confidence", pids[i], k, h): s.completion_ids for i, row in enumerate(second)
                     for k, (_, _, g) in enumerate(row) for h, s in enumerate(g)})
        return wall, sum(map(len, tree.values())), tree


def flow_side(cfg, tasks, policy: str, iteration: int, pool, pipelined: bool) -> tuple[float, int, dict, float]:
    """``run_rollouts`` as the flow calls it → (generate s, generated tokens, tree, wall s)."""
    from rlcr.rollout.pipeline import run_rollouts

    run_cfg = cfg.model_copy(update={"rollout.pipeline_turns": pipelined})
    t0 = time.perf_counter()
    res = run_rollouts(run_cfg, tasks, policy_uri=policy, run_id="bench-generation", iteration=iteration, engines=pool)
    wall = time.perf_counter() - t0
    gen = res.timings["rollout/answer_generate_s"] + res.timings["rollout/confidence_generate_s"]
    tree = {(r["sample_type"], r["prompt_id"], r["answer_id"], r["confidence_id"]): r["completion_ids"]
            for r in res.rows}
    return gen, sum(map(len, tree.values())), tree, wall


CURVE_SIZES = (1, 2, 4, 8, 16, 32)


def step_seconds(curve: dict[int, float], k: int) -> float:
    """Seconds of one decode step with ``k`` sequences decoding: k / rate(k), the rate (tokens/s) interpolated
    linearly in k between the measured batch sizes (beyond the largest: the largest's rate)."""
    sizes = sorted(curve)
    if k >= sizes[-1]:
        return k / curve[sizes[-1]]
    lo, hi = max(b for b in sizes if b <= k), min(b for b in sizes if b >= k)
    rate = curve[lo] if lo == hi else curve[lo] + (curve[hi] - curve[lo]) * (k - lo) / (hi - lo)
    return k / rate


def tail_cost(lengths: list[int], curve: dict[int, float]) -> tuple[float, float, int]:
    """One turn's requests, started together, with these generated lengths → (estimated decode s, the tail's s
    (steps with at most two sequences decoding), the tail's tokens)."""
    total = tail = 0.0
    tail_tokens = 0
    for t in range(1, max(lengths) + 1):
        k = sum(1 for n in lengths if n >= t)
        s = step_seconds(curve, k)
        total += s
        if k <= 2:
            tail, tail_tokens = tail + s, tail_tokens + k
    return total, tail, tail_tokens


def batch_curve(direct: Direct, cfg, train, args) -> None:
    """``--batch-curve``: the decode rate by batch size, and what the tail of each turn could save at most."""
    from rlcr.rollout.pipeline import rollout_seed
    from rlcr.runs.task_sets import prompts_for_iteration

    direct.ceiling(8, 16)  # warm-up
    fractions, thinning = [], []
    for rnd in range(args.rounds):
        it = rnd + 2
        curve = {}
        for b in CURVE_SIZES:
            direct.llm.reset_prefix_cache()
            sec, tok = direct.ceiling(b, args.ceiling_tokens)
            curve[b] = tok / sec
        direct.llm.reset_prefix_cache()
        wall, _, tree = direct.two_calls(prompts_for_iteration(cfg, train, it), rollout_seed(cfg, it))
        saving, ragged, parts = 0.0, 0.0, []
        for kind in ("answer", "confidence"):
            lengths = [len(v) for key, v in tree.items() if key[0] == kind]
            full = min(len(lengths), max(CURVE_SIZES))
            per_token = step_seconds(curve, full) / full  # a token's cost in the turn's full batch
            total, tail, n_tail = tail_cost(lengths, curve)
            at_full, dense = n_tail * per_token, sum(lengths) * per_token  # the tail's / every token at that cost
            saving, ragged = saving + tail - at_full, ragged + total - dense
            parts.append(f"{len(lengths)} {kind}s of {min(lengths)}–{max(lengths)} tokens ({sum(lengths)}): "
                         f"decode ≈ {total:.1f} s ({dense:.1f} s if the batch never thinned), tail {tail:.1f} s "
                         f"for {n_tail} tokens ({at_full:.1f} s at the full batch's cost)")
        fractions.append(saving / wall)
        thinning.append(ragged / wall)
        rates = ", ".join(f"{b}: {r:.0f}" for b, r in curve.items())
        print(f"round {rnd + 1} (iteration {it}): tok/s by batch {rates}"
              + f"; generation {wall:.1f} s; " + "; ".join(parts) + f"; the tail could save at most {saving:.1f} s = "
              f"{fractions[-1]:.3f} of it, a batch that never thinned {ragged:.1f} s = {thinning[-1]:.3f}", flush=True)
    print(f"a batch that never thinned would save at most: median {statistics.median(thinning):.3f} of generation "
          f"(range {min(thinning):.3f}–{max(thinning):.3f}, n = {len(thinning)})")
    print(f"generation tail cost fraction: {statistics.median(fractions):.3f}")


def same(a: dict, b: dict) -> str:
    """How many samples of ``b`` have exactly ``a``'s tokens."""
    return f"{sum(a.get(k) == v for k, v in b.items())}/{len(b)}"


def main() -> None:
    args = parse_args()
    import ray

    from bench.perf.trl import cpu_model
    from rlcr.config import load_config
    from rlcr.rollout.engine import EnginePool
    from rlcr.rollout.pipeline import rollout_seed
    from rlcr.runs.cluster import ensure_ray
    from rlcr.runs.store import task_sets
    from rlcr.runs.task_sets import prompts_for_iteration

    cfg = load_config(args.config, [*args.overrides, f"storage.uri={args.store}"])
    policy = policy_of(cfg, args)
    cfg = cfg.model_copy(update={"model.name": policy})
    train, _ = task_sets(cfg)
    if args.batch_curve:
        print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; policy {policy}", flush=True)
        return batch_curve(Direct(cfg, policy), cfg, train, args)
    ensure_ray()
    direct = Direct(cfg, policy)
    r = cfg.rollout
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; policy {policy}; P={r.prompts_per_iteration} "
          f"G_a={r.num_generations_answer} G_c={r.num_generations_confidence} tokens {r.max_answer_tokens}/"
          f"{r.max_confidence_tokens} T={r.temperature}", flush=True)
    rates = {s: [] for s in SIDES}
    ratios = []
    with EnginePool(cfg, policy) as pool:
        flow_side(cfg, prompts_for_iteration(cfg, train, 1), policy, 1, pool, True)  # warm-up: Ray's workers
        for rnd in range(args.rounds):
            it = rnd + 2
            tasks, seed = prompts_for_iteration(cfg, train, it), rollout_seed(cfg, it)
            got = {"ceiling": direct.ceiling(args.ceiling_requests, args.ceiling_tokens)}
            # this round's tasks, seed and iteration bound as defaults (each side is run within this round)
            order = [("direct", lambda tasks=tasks, seed=seed: direct.two_calls(tasks, seed)),
                     ("direct-tree", lambda tasks=tasks, seed=seed: direct.pipelined(tasks, seed)),
                     ("flow", lambda tasks=tasks, it=it: flow_side(cfg, tasks, policy, it, pool, False)),
                     ("flow-pipelined", lambda tasks=tasks, it=it: flow_side(cfg, tasks, policy, it, pool, True))]
            for name, run in (order if rnd % 2 == 0 else order[::-1]):
                direct.llm.reset_prefix_cache()
                ray.get([a.__ray_call__.remote(lambda engine: engine.llm.reset_prefix_cache()) for a in pool.actors])
                got[name] = run()
            for name in SIDES:
                rates[name].append(got[name][1] / got[name][0])
            ratios.append(rates["flow-pipelined"][-1] / rates["flow"][-1])
            print(f"round {rnd + 1} (iteration {it}): " + ", ".join(
                f"{n} {got[n][1]} tok / {got[n][0]:.1f} s = {rates[n][-1]:.0f} tok/s" for n in SIDES)
                + f"; flow wall {got['flow'][3]:.1f} s, pipelined {got['flow-pipelined'][3]:.1f} s; same tokens as "
                f"direct: direct-tree {same(got['direct'][2], got['direct-tree'][2])}, flow "
                f"{same(got['direct'][2], got['flow'][2])}, flow-pipelined "
                f"{same(got['direct'][2], got['flow-pipelined'][2])}; "
                f"pipelined/former {ratios[-1]:.2f}", flush=True)
    for name in SIDES:
        v = rates[name]
        print(f"{name:15s} tok/s median {statistics.median(v):.0f} (range {min(v):.0f}–{max(v):.0f}, n = {len(v)}); "
              f"of the ceiling {statistics.median(v) / statistics.median(rates['ceiling']):.2f}")
    print(f"flow generation tokens/s pipelined/former: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
