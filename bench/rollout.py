"""Generated tokens/s of the two-stage Ray Data pipeline vs calling vllm.LLM.generate directly.

Both sides use the same model, engine settings and requests (P prompts × G_a
answers, then G_a·P turn-2 prompts × G_c confidences), measured in one run:

  direct    one in-process engine; time of the two generate() calls only
  pipeline  rlcr.rollout.run_rollouts on a local Ray: actor start + model load,
            both generation stages, scoring/expansion, advantages, Parquet

The headline is the generation phase: pipeline tokens / time spent inside the
stages' generate calls, over direct tokens / direct generate time. The
breakdown shows where the rest of the pipeline's wall time goes.

    python bench/rollout.py [--model smollm2|tiny] [--prompts 16] [--ga 4] [--gc 2]
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
    ap.add_argument("--engines", default="pool", choices=["pool", "owned"],
                    help="pipeline engines: the flow's shared EnginePool, or one owned engine per stage actor")
    args = ap.parse_args()

    import ray
    from transformers import AutoTokenizer

    from rlcr.config import RLCRConfig
    from rlcr.models import prepare_smollm2
    from rlcr.rollout.engine import create_engine, sample
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

    # ---------------------------------------------------------------- direct
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model)
    llm = create_engine(model, cfg, seed=rollout_seed(cfg, 0) * 2)
    direct_init = time.perf_counter() - t0

    def render(msgs):
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]

    p1 = [render(turn1_messages(t)) for _, t in tasks]
    t0 = time.perf_counter()
    answers = sample(llm, p1, n=args.ga, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=args.answer_tokens, stop=ANSWER_STOP)
    p2 = [render(turn2_messages(t, s.completion_text)) for (_, t), group in zip(tasks, answers) for s in group]
    confs = sample(llm, p2, n=args.gc, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=args.confidence_tokens, stop=CONFIDENCE_STOP)
    direct_gen = time.perf_counter() - t0
    direct_tokens = sum(len(s.completion_ids) for g in answers + confs for s in g)
    del llm
    import gc

    gc.collect()

    # ---------------------------------------------------------------- pipeline
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    if args.engines == "pool":  # what the flow does: one long-lived engine serves both stages
        from rlcr.rollout.engine import EnginePool

        with EnginePool(cfg, model) as pool:
            pool_init = time.perf_counter() - t0
            res = run_rollouts(cfg, tasks, policy_uri=model, run_id="bench", iteration=0,
                               store=Store(cfg.storage_uri), engines=pool)
        res.timings["rollout/answer_init_s"] += pool_init
    else:  # each stage actor owns an engine (two engines share the machine)
        res = run_rollouts(cfg, tasks, policy_uri=model, run_id="bench", iteration=0, store=Store(cfg.storage_uri))
    wall = time.perf_counter() - t0
    ray.shutdown()
    tm = res.timings
    pipe_tokens = sum(len(r["completion_ids"]) for r in res.rows)
    pipe_gen = tm["rollout/answer_generate_s"] + tm["rollout/confidence_generate_s"]
    init = tm["rollout/answer_init_s"] + tm["rollout/confidence_init_s"]
    other = wall - tm["rollout/pipeline_s"]  # prompt check, records, advantages, parquet

    direct_tps = direct_tokens / direct_gen
    pipe_tps = pipe_tokens / pipe_gen
    print(f"model={args.model} engines={args.engines} P={args.prompts} G_a={args.ga} G_c={args.gc} "
          f"rows={len(res.rows)} cpus={os.cpu_count()}")
    print(f"{'':28s}{'direct':>12s}{'pipeline':>12s}")
    print(f"{'engine init (s)':28s}{direct_init:12.1f}{init:12.1f}   (pipeline: 2 engines, started concurrently)")
    print(f"{'generate (s)':28s}{direct_gen:12.1f}{pipe_gen:12.1f}")
    print(f"{'generated tokens':28s}{direct_tokens:12d}{pipe_tokens:12d}")
    print(f"{'generation tokens/s':28s}{direct_tps:12.1f}{pipe_tps:12.1f}")
    print(f"{'pipeline wall (s)':28s}{'':12s}{wall:12.1f}")
    sched = tm["rollout/pipeline_s"] - pipe_gen - max(tm["rollout/answer_init_s"], tm["rollout/confidence_init_s"])
    print(f"  breakdown: engine start+load {max(tm['rollout/answer_init_s'], tm['rollout/confidence_init_s']):.1f}s (overlapped), "
          f"generation {pipe_gen:.1f}s, Ray scheduling+scoring+transfer {sched:.1f}s, "
          f"records+advantages+parquet {other:.1f}s (advantages+parquet {tm['rollout/finalize_s']:.2f}s)")
    print(f"  end-to-end tokens/s incl. engine start: pipeline {pipe_tokens / wall:.1f}, "
          f"direct {direct_tokens / (direct_gen + direct_init):.1f}")
    print(f"pipeline/direct generation tokens/s: {pipe_tps / direct_tps:.2f}")


if __name__ == "__main__":
    main()
