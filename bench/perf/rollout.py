"""Generated tokens/s of the two-stage Ray Data pipeline vs calling vllm.LLM.generate directly.

All sides use the same model, engine settings and requests (P prompts × G_a
answers, then G_a·P turn-2 prompts × G_c confidences), measured in one run:

  direct    one in-process engine (the local Ray is up, idle); time of the two
            generate() calls only
  actor     the pipeline's engine actor (EnginePool) called with ray.get, no Ray
            Data: what Ray itself (daemons, actor process, transfer) costs
  pipeline  rlcr.rollout.run_rollouts on a local Ray: actor start + model load,
            both generation stages, scoring/expansion, advantages, Parquet

The headline is the generation phase: pipeline tokens / time spent inside the
stages' generate calls, over direct tokens / direct generate time. Each side
runs ``--rounds`` rollout rounds (iterations 0, 1, … with their own seeds) on
one engine, as the flow does, and the sides take turns within each round so
that drift in the machine's speed hits all of them alike. The first pipeline
round also pays for starting Ray's worker processes (imports) while the engine
generates, so the headline is over rounds 1.. (steady state); every round is
printed with the breakdown of the pipeline's wall time. ``pipeline+bars`` is the
same round with Ray Data's progress bars on (``rollout_progress=true``).

    python bench/perf/rollout.py [--model smollm2|tiny] [--prompts 16] [--ga 4] [--gc 2] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--ga", type=int, default=4)
    ap.add_argument("--gc", type=int, default=2)
    ap.add_argument("--answer-tokens", type=int, default=96)
    ap.add_argument("--confidence-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4, help="rollout rounds per side (iterations 0..rounds-1)")
    ap.add_argument("--engines", default="pool", choices=["pool", "owned"],
                    help="pipeline engines: the flow's shared EnginePool, or one owned engine per stage actor")
    return ap.parse_args()


def _tokens(groups) -> int:
    return sum(len(s.completion_ids) for g in groups for s in g)


class Sides:
    """The same requests generated each way; each method returns (generate seconds, generated tokens, ...)."""

    def __init__(self, args, model: str, cfg, tasks, store):
        from transformers import AutoTokenizer

        from rlcr.rollout.engine import create_engine
        from rlcr.tasks.registry import get_task

        countdown = get_task("countdown")
        self.turn1, self.turn2 = countdown.turn1_messages, countdown.turn2_messages
        self.args, self.model, self.cfg, self.tasks, self.store = args, model, cfg, tasks, store
        t0 = time.perf_counter()
        self.tok = AutoTokenizer.from_pretrained(model)
        self.llm = create_engine(model, cfg, seed=cfg.run.seed)
        self.direct_init = time.perf_counter() - t0

    def _render(self, msgs) -> list[int]:
        text = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def direct(self, seed: int) -> tuple[float, int]:
        """One in-process engine, no Ray: the time of the two generate calls only."""
        from rlcr.rollout.sampling import seeded_sample
        from rlcr.rollout.stages import ANSWER_STOP, CONFIDENCE_STOP

        a, kw = self.args, dict(temperature=self.cfg.rollout.temperature, top_p=self.cfg.rollout.top_p)
        t0 = time.perf_counter()
        p1 = [self._render(self.turn1(t)) for _, t in self.tasks]
        answers = seeded_sample(self.llm, p1, seed=seed, n=a.ga, max_tokens=a.answer_tokens, stop=ANSWER_STOP, **kw)
        p2 = [self._render(self.turn2(t, s.completion_text))
              for (_, t), group in zip(self.tasks, answers) for s in group]
        confs = seeded_sample(self.llm, p2, seed=seed + 1, n=a.gc, max_tokens=a.confidence_tokens,
                              stop=CONFIDENCE_STOP, **kw)
        return time.perf_counter() - t0, _tokens(answers + confs)

    def on_actor(self, engine, seed: int) -> tuple[float, int]:
        """Both turns on the pipeline's engine actor, called directly: same requests, seeds and work (render,
        sample, loss masks) as the stages, without Ray Data."""
        import ray

        from rlcr.rollout.stages import ANSWER_STOP, CONFIDENCE_STOP

        a, tasks = self.args, self.tasks
        common = dict(policy_uri=self.model, temperature=self.cfg.rollout.temperature, top_p=self.cfg.rollout.top_p)
        t0 = time.perf_counter()
        _, answers = ray.get(engine.generate_chats.remote(
            [self.turn1(t) for _, t in tasks], labels=[str(i) for i, _ in tasks], mask_kind="answer",
            seed=seed, n=a.ga, max_tokens=a.answer_tokens, stop=ANSWER_STOP, **common))
        turn2 = [self.turn2(t, s.completion_text) for (_, t), group in zip(tasks, answers) for s in group]
        _, confs = ray.get(engine.generate_chats.remote(
            turn2, labels=[str(i) for i in range(len(turn2))], mask_kind="confidence",
            seed=seed + 1, n=a.gc, max_tokens=a.confidence_tokens, stop=CONFIDENCE_STOP, **common))
        return time.perf_counter() - t0, _tokens(answers + confs)

    def pipeline(self, run_cfg, r: int, run_id: str, engines):
        """rlcr.rollout.run_rollouts: (time inside the stages' generate calls, tokens, wall time, result)."""
        from rlcr.rollout.pipeline import run_rollouts

        t0 = time.perf_counter()
        res = run_rollouts(run_cfg, self.tasks, policy_uri=self.model, run_id=run_id, iteration=r, store=self.store,
                           engines=engines)
        p_gen = res.timings["rollout/answer_generate_s"] + res.timings["rollout/confidence_generate_s"]
        return p_gen, sum(len(x["completion_ids"]) for x in res.rows), time.perf_counter() - t0, res


def print_round(r: int, sides: dict, names: list[str]) -> None:
    """One round's generation time, tokens, rate and ratio to direct per side, and the pipeline's wall time
    broken down."""
    d_gen, d_tok = sides["direct"][r][:2]
    print(f"round {r}:{'':19s}" + "".join(f"{n:>15s}" for n in names))
    print(f"  {'generate (s)':26s}" + "".join(f"{sides[n][r][0]:15.1f}" for n in names))
    print(f"  {'generated tokens':26s}" + "".join(f"{sides[n][r][1]:15d}" for n in names))
    print(f"  {'generation tokens/s':26s}" + "".join(f"{sides[n][r][1] / sides[n][r][0]:15.1f}" for n in names))
    print(f"  {'ratio to direct':26s}" + "".join(
        f"{(sides[n][r][1] / sides[n][r][0]) / (d_tok / d_gen):15.2f}" for n in names))
    p_gen, _, wall, res = sides["pipeline"][r]
    tm = res.timings
    stage_init = max(tm["rollout/answer_init_s"], tm["rollout/confidence_init_s"])
    sched = tm["rollout/pipeline_s"] - p_gen - stage_init  # Ray Data: tasks, scoring, expansion, transfer
    other = wall - tm["rollout/pipeline_s"]  # prompt check, records, advantages, parquet
    print(f"  pipeline wall {wall:.1f}s = stage actor init {stage_init:.1f}s + generation {p_gen:.1f}s (answers "
          f"{tm['rollout/answer_generate_s']:.1f} + confidences {tm['rollout/confidence_generate_s']:.1f}) + Ray "
          f"scheduling/scoring/expansion/transfer {sched:.1f}s + records/advantages/parquet {other:.1f}s", flush=True)


def main() -> None:
    args = parse_args()
    import gc

    import ray

    from rlcr.config import RLCRConfig
    from rlcr.models.smollm2 import prepare_smollm2
    from rlcr.models.tiny import build_tiny_model
    from rlcr.rollout.pipeline import rollout_seed
    from rlcr.storage import Store
    from rlcr.tasks.registry import get_task

    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    model = str(prepare_smollm2() if args.model == "smollm2" else build_tiny_model(work / "tiny"))
    cfg = RLCRConfig(model={"name": model}, storage={"uri": str(work / "store")},
                     rollout={"num_generations_answer": args.ga, "num_generations_confidence": args.gc,
                              "max_answer_tokens": args.answer_tokens, "max_confidence_tokens": args.confidence_tokens,
                              "batch_size": args.prompts}, engine={"max_model_len": 1024, "kv_cache_gib": 1.0})
    tasks = list(enumerate(get_task("countdown").generate(args.prompts, seed=5)))

    # The sides take turns within each round, so drift of the machine's speed over the run hits all alike.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    bench = Sides(args, model, cfg, tasks, Store(cfg.storage.uri))
    sides = {"direct": [], "actor": [], "pipeline": [], "pipeline+bars": []}
    pool, pool_init = None, 0.0
    if args.engines == "pool":  # what the flow does: one long-lived engine serves both stages and all iterations
        from rlcr.rollout.engine import EnginePool

        t0 = time.perf_counter()
        pool = EnginePool(cfg, model)
        pool_init = time.perf_counter() - t0
    names = ["direct", "actor", "pipeline", "pipeline+bars"] if pool is not None else ["direct", "pipeline"]
    print(f"model.name={args.model} engines={args.engines} P={args.prompts} G_a={args.ga} G_c={args.gc} "
          f"rounds={args.rounds} cpus={os.cpu_count()}; direct engine init {bench.direct_init:.1f}s, engine pool "
          f"start+load {pool_init:.1f}s", flush=True)
    with_bars = cfg.model_copy(update={"rollout.progress": True})
    try:
        for r in range(args.rounds):
            seed = rollout_seed(cfg, r)
            sides["direct"].append(bench.direct(seed))
            if pool is not None:
                sides["actor"].append(bench.on_actor(pool.actors[0], seed))
            sides["pipeline"].append(bench.pipeline(cfg, r, "bench", pool))
            if pool is not None:  # the same round with Ray Data's progress bars on
                sides["pipeline+bars"].append(bench.pipeline(with_bars, r, "bench-bars", pool))
            print_round(r, sides, names)
    finally:
        if pool is not None:
            pool.shutdown()
    ray.shutdown()
    del bench
    gc.collect()

    steady = range(1 if args.rounds > 1 else 0, args.rounds)  # round 0 also pays for Ray's worker start-up

    def rate(name):
        return sum(sides[name][r][1] for r in steady) / sum(sides[name][r][0] for r in steady)

    print(f"rows/round={len(sides['pipeline'][0][3].rows)}; steady state (rounds {steady.start}..{args.rounds - 1}), "
          "generation tokens/s relative to direct: "
          + ", ".join(f"{n} {rate(n) / rate('direct'):.2f}" for n in names[1:]))
    print(f"pipeline/direct generation tokens/s: {rate('pipeline') / rate('direct'):.2f}")


if __name__ == "__main__":
    main()
