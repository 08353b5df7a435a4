"""Generated tokens/s of the two-stage Ray Data pipeline vs calling vllm.LLM.generate directly.

Both sides use the same model, engine settings and requests (P prompts × G_a
answers, then G_a·P turn-2 prompts × G_c confidences), measured in one run:

  direct    one in-process engine; time of the two generate() calls only
  pipeline  rlcr.rollout.run_rollouts on a local Ray: actor start + model load,
            both generation stages, scoring/expansion, advantages, Parquet

The headline is the generation phase: pipeline tokens / time spent inside the
stages' generate calls, over direct tokens / direct generate time. Both sides
run ``--rounds`` rollout rounds (iterations 0, 1, … with their own seeds) on one
engine, as the flow does; the first pipeline round also pays for starting Ray's
worker processes (imports) while the engine generates, so the headline is the
last round (steady state) and every round is printed. The breakdown shows where
the rest of the pipeline's wall time goes.

    python bench/rollout.py [--model smollm2|tiny] [--prompts 16] [--ga 4] [--gc 2] [--rounds 2]
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
    ap.add_argument("--rounds", type=int, default=2, help="rollout rounds per side (iterations 0..rounds-1)")
    ap.add_argument("--engines", default="pool", choices=["pool", "owned"],
                    help="pipeline engines: the flow's shared EnginePool, or one owned engine per stage actor")
    args = ap.parse_args()

    import gc

    import ray
    from transformers import AutoTokenizer

    from rlcr.config import RLCRConfig
    from rlcr.models import prepare_smollm2
    from rlcr.rollout.engine import create_engine, seeded_sample
    from rlcr.rollout.pipeline import rollout_seed, run_rollouts
    from rlcr.rollout.stages import ANSWER_STOP, CONFIDENCE_STOP
    from rlcr.storage import Store
    from rlcr.tasks.countdown import generate_tasks, turn1_messages, turn2_messages
    from rlcr.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    model = str(prepare_smollm2() if args.model == "smollm2" else build_tiny_model(work / "tiny"))
    cfg = RLCRConfig(
        model=model, storage_uri=str(work / "store"), num_generations_answer=args.ga, num_generations_confidence=args.gc,
        max_answer_tokens=args.answer_tokens, max_confidence_tokens=args.confidence_tokens,
        rollout_batch_size=args.prompts, engine_max_model_len=1024, engine_kv_cache_gib=1.0,
    )
    tasks = list(enumerate(generate_tasks(args.prompts, seed=5)))
    kw = dict(temperature=cfg.temperature, top_p=cfg.top_p)

    # ---------------------------------------------------------------- direct
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model)
    llm = create_engine(model, cfg, seed=cfg.seed)
    direct_init = time.perf_counter() - t0

    def render(msgs):
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    direct = []  # (generate seconds, tokens) per round
    for r in range(args.rounds):
        seed = rollout_seed(cfg, r)
        t0 = time.perf_counter()
        p1 = [render(turn1_messages(t)) for _, t in tasks]
        answers = seeded_sample(llm, p1, seed=seed, n=args.ga, max_tokens=args.answer_tokens, stop=ANSWER_STOP, **kw)
        p2 = [render(turn2_messages(t, s.completion_text)) for (_, t), group in zip(tasks, answers) for s in group]
        confs = seeded_sample(llm, p2, seed=seed + 1, n=args.gc, max_tokens=args.confidence_tokens,
                              stop=CONFIDENCE_STOP, **kw)
        direct.append((time.perf_counter() - t0, sum(len(s.completion_ids) for g in answers + confs for s in g)))
    del llm
    gc.collect()

    # ---------------------------------------------------------------- pipeline
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    store = Store(cfg.storage_uri)
    pipeline = []  # (wall, tokens, timings, pool_init) per round
    if args.engines == "pool":  # what the flow does: one long-lived engine serves both stages and all iterations
        from rlcr.rollout.engine import EnginePool

        t0 = time.perf_counter()
        with EnginePool(cfg, model) as pool:
            pool_init = time.perf_counter() - t0
            for r in range(args.rounds):
                t0 = time.perf_counter()
                res = run_rollouts(cfg, tasks, policy_uri=model, run_id="bench", iteration=r, store=store, engines=pool)
                pipeline.append((time.perf_counter() - t0, res, pool_init if r == 0 else 0.0))
    else:  # each stage actor owns an engine (two engines share the machine), started every round
        for r in range(args.rounds):
            t0 = time.perf_counter()
            res = run_rollouts(cfg, tasks, policy_uri=model, run_id="bench", iteration=r, store=store)
            pipeline.append((time.perf_counter() - t0, res, 0.0))
    ray.shutdown()

    print(f"model={args.model} engines={args.engines} P={args.prompts} G_a={args.ga} G_c={args.gc} "
          f"rows/round={len(pipeline[0][1].rows)} rounds={args.rounds} cpus={os.cpu_count()}")
    print(f"direct engine init {direct_init:.1f}s")
    ratio = 0.0
    for r, ((d_gen, d_tok), (wall, res, pool_init)) in enumerate(zip(direct, pipeline)):
        tm = res.timings
        p_tok = sum(len(x["completion_ids"]) for x in res.rows)
        p_gen = tm["rollout/answer_generate_s"] + tm["rollout/confidence_generate_s"]
        stage_init = max(tm["rollout/answer_init_s"], tm["rollout/confidence_init_s"])
        sched = tm["rollout/pipeline_s"] - p_gen - stage_init  # Ray Data: tasks, scoring, expansion, transfer
        other = wall - tm["rollout/pipeline_s"]  # prompt check, records, advantages, parquet
        ratio = (p_tok / p_gen) / (d_tok / d_gen)
        print(f"round {r}:{'':19s}{'direct':>10s}{'pipeline':>10s}")
        print(f"  {'generate (s)':26s}{d_gen:10.1f}{p_gen:10.1f}   (pipeline answers {tm['rollout/answer_generate_s']:.1f}"
              f" + confidences {tm['rollout/confidence_generate_s']:.1f})")
        print(f"  {'generated tokens':26s}{d_tok:10d}{p_tok:10d}")
        print(f"  {'generation tokens/s':26s}{d_tok / d_gen:10.1f}{p_tok / p_gen:10.1f}   ratio {ratio:.2f}")
        print(f"  pipeline wall {wall + pool_init:.1f}s = engine pool start+load {pool_init:.1f}s + stage actor init "
              f"{stage_init:.1f}s + generation {p_gen:.1f}s + Ray scheduling/scoring/expansion/transfer {sched:.1f}s "
              f"+ records/advantages/parquet {other:.1f}s (advantages+parquet {tm['rollout/finalize_s']:.2f}s)")
    print(f"pipeline/direct generation tokens/s: {ratio:.2f}")


if __name__ == "__main__":
    main()
