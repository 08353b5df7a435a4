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

    python bench/rollout.py [--model smollm2|tiny] [--prompts 16] [--ga 4] [--gc 2] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
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
    args = ap.parse_args()

    import gc

    import ray
    from transformers import AutoTokenizer

    from rlcr.config import RLCRConfig
    from rlcr.models import prepare_smollm2
    from rlcr.rollout.engine import create_engine
    from rlcr.rollout.sampling import seeded_sample
    from rlcr.rollout.pipeline import rollout_seed, run_rollouts
    from rlcr.rollout.stages import ANSWER_STOP, CONFIDENCE_STOP
    from rlcr.storage import Store
    from rlcr.tasks.registry import get_task
    from rlcr.tiny import build_tiny_model

    countdown = get_task("countdown")
    generate_tasks = lambda n, seed: countdown.generate(n, seed)  # noqa: E731
    turn1_messages, turn2_messages = countdown.turn1_messages, countdown.turn2_messages

    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    model = str(prepare_smollm2() if args.model == "smollm2" else build_tiny_model(work / "tiny"))
    cfg = RLCRConfig(model={"name": model}, storage={"uri": str(work / "store")}, rollout={"num_generations_answer": args.ga, "num_generations_confidence": args.gc, "max_answer_tokens": args.answer_tokens, "max_confidence_tokens": args.confidence_tokens, "batch_size": args.prompts}, engine={"max_model_len": 1024, "kv_cache_gib": 1.0})
    tasks = list(enumerate(generate_tasks(args.prompts, seed=5)))
    kw = dict(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)

    # ------------------------------------------------ direct: one in-process engine, no Ray involved
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model)
    llm = create_engine(model, cfg, seed=cfg.run.seed)
    direct_init = time.perf_counter() - t0

    def render(msgs):
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    def tokens(groups):
        return sum(len(s.completion_ids) for g in groups for s in g)

    def generate_direct(seed):
        t0 = time.perf_counter()
        p1 = [render(turn1_messages(t)) for _, t in tasks]
        answers = seeded_sample(llm, p1, seed=seed, n=args.ga, max_tokens=args.answer_tokens, stop=ANSWER_STOP, **kw)
        p2 = [render(turn2_messages(t, s.completion_text)) for (_, t), group in zip(tasks, answers) for s in group]
        confs = seeded_sample(llm, p2, seed=seed + 1, n=args.gc, max_tokens=args.confidence_tokens,
                              stop=CONFIDENCE_STOP, **kw)
        return time.perf_counter() - t0, tokens(answers + confs)

    def generate_on_actor(engine, seed):
        """Both turns on the pipeline's engine actor, called directly: same requests, seeds and work
        (render, sample, loss masks) as the stages, without Ray Data."""
        common = dict(policy_uri=model, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
        t0 = time.perf_counter()
        _, answers = ray.get(engine.generate_chats.remote(
            [turn1_messages(t) for _, t in tasks], labels=[str(i) for i, _ in tasks], mask_kind="answer",
            seed=seed, n=args.ga, max_tokens=args.answer_tokens, stop=ANSWER_STOP, **common))
        turn2 = [turn2_messages(t, s.completion_text) for (_, t), group in zip(tasks, answers) for s in group]
        _, confs = ray.get(engine.generate_chats.remote(
            turn2, labels=[str(i) for i in range(len(turn2))], mask_kind="confidence",
            seed=seed + 1, n=args.gc, max_tokens=args.confidence_tokens, stop=CONFIDENCE_STOP, **common))
        return time.perf_counter() - t0, tokens(answers + confs)

    def generate_pipeline(run_cfg, r, run_id, engines):
        t0 = time.perf_counter()
        res = run_rollouts(run_cfg, tasks, policy_uri=model, run_id=run_id, iteration=r, store=store, engines=engines)
        tm = res.timings
        p_gen = tm["rollout/answer_generate_s"] + tm["rollout/confidence_generate_s"]
        return p_gen, sum(len(x["completion_ids"]) for x in res.rows), time.perf_counter() - t0, res

    # The sides take turns within each round, so drift of the machine's speed over the run hits all alike.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    store = Store(cfg.storage.uri)
    sides = {"direct": [], "actor": [], "pipeline": [], "pipeline+bars": []}
    pool_init = 0.0
    pool = None
    if args.engines == "pool":  # what the flow does: one long-lived engine serves both stages and all iterations
        from rlcr.rollout.engine import EnginePool

        t0 = time.perf_counter()
        pool = EnginePool(cfg, model)
        pool_init = time.perf_counter() - t0
    with_bars = cfg.model_copy(update={"rollout.progress": True})
    try:
        for r in range(args.rounds):
            seed = rollout_seed(cfg, r)
            sides["direct"].append(generate_direct(seed))
            if pool is not None:
                sides["actor"].append(generate_on_actor(pool.actors[0], seed))
            sides["pipeline"].append(generate_pipeline(cfg, r, "bench", pool))
            if pool is not None:  # the same round with Ray Data's progress bars on
                sides["pipeline+bars"].append(generate_pipeline(with_bars, r, "bench-bars", pool))
    finally:
        if pool is not None:
            pool.shutdown()
    ray.shutdown()
    del llm
    gc.collect()

    print(f"model.name={args.model} engines={args.engines} P={args.prompts} G_a={args.ga} G_c={args.gc} "
          f"rows/round={len(sides['pipeline'][0][3].rows)} rounds={args.rounds} cpus={os.cpu_count()}")
    print(f"direct engine init {direct_init:.1f}s, engine pool start+load {pool_init:.1f}s")
    names = [n for n in sides if sides[n]]
    for r in range(args.rounds):
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
              f"scheduling/scoring/expansion/transfer {sched:.1f}s + records/advantages/parquet {other:.1f}s")

    steady = range(1 if args.rounds > 1 else 0, args.rounds)  # round 0 also pays for Ray's worker start-up

    def rate(name):
        return sum(sides[name][r][1] for r in steady) / sum(sides[name][r][0] for r in steady)

    print(f"steady state (rounds {steady.start}..{args.rounds - 1}), generation tokens/s relative to direct: "
          + ", ".join(f"{n} {rate(n) / rate('direct'):.2f}" for n in names[1:]))
    print(f"pipeline/direct generation tokens/s: {rate('pipeline') / rate('direct'):.2f}")


if __name__ == "__main__":
    main()
