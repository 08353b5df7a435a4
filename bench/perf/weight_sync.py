"""Seconds for a long-lived engine to take new policy weights, three ways, side by side in one run.

  checkpoint  today's path: the new weights as a checkpoint directory (written beforehand, not timed),
              the engine re-created from it (``EnginePool.load(dir, mode="recreate")``)
  recreate    from memory: ``ray.put`` of the state dict, the engine writes it to a temporary
              checkpoint and re-creates itself (``update_weights(..., mode="recreate")``)
  inplace     from memory: ``ray.put`` of the state dict, transfer, copied into the running engine
              (``update_weights(..., mode="inplace")``); ``inplace-torch`` puts torch tensors instead
              of :func:`~rlcr.models.weights.pack_weights`'s numpy arrays (copied through a pickle)

Every side starts when the trainer holds the new state dict (fp32 CPU tensors, HF names) and ends
when the engine can sample from it. The weights change every round (the model's, scaled by
1 + 1e-3·round), and after each side the engine samples the same seeded requests: all sides must
give the same tokens and log-probs (the in-place update is exact), else the run fails. Each round is
printed as it finishes; the last line is the median in-place time.

    python bench/perf/weight_sync.py [--model smollm2-135m-instruct|tiny] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SIDES = ("checkpoint", "recreate", "inplace-torch", "inplace")


def sync_round(pool, weights, ckpt: Path, r: int, samples) -> tuple[dict, dict]:
    """Round ``r``: each side takes ``weights`` (``ckpt`` holds them as a checkpoint), then the engine samples.
    Returns (seconds per side, the in-place sides' (put, load, vLLM reload, tied-head repack) seconds); stops the
    run if any side's samples differ from the checkpoint engine's."""
    import ray

    from rlcr.models.weights import pack_weights

    took, detail, got = {}, {}, {}
    t0 = time.perf_counter()
    pool.load(str(ckpt), mode="recreate")
    took["checkpoint"] = time.perf_counter() - t0
    got["checkpoint"] = samples(str(ckpt))

    t0 = time.perf_counter()
    pool.update_weights(ray.put(pack_weights(weights)), f"r{r}-recreate", mode="recreate")
    took["recreate"] = time.perf_counter() - t0
    got["recreate"] = samples(f"r{r}-recreate")

    for side, pack in (("inplace-torch", dict), ("inplace", pack_weights)):
        t0 = time.perf_counter()
        ref = ray.put(pack(weights))
        put_s = time.perf_counter() - t0
        info = pool.update_weights(ref, f"r{r}-{side}", mode="inplace")[0]
        took[side] = time.perf_counter() - t0
        detail[side] = (put_s, info["load_s"], info["reload_s"], info["repack_s"])
        del ref
        got[side] = samples(f"r{r}-{side}")

    if any(got[s] != got["checkpoint"] for s in SIDES):
        raise SystemExit(f"round {r}: samples differ from the checkpoint engine's: "
                         + ", ".join(s for s in SIDES if got[s] != got["checkpoint"]))
    return took, detail


def round_line(r: int, took: dict, detail: dict) -> str:
    """One round's line: every side's seconds, then where the in-place sides' time went."""
    ip, it = detail["inplace"], detail["inplace-torch"]
    return (f"round {r}: " + "  ".join(f"{s} {took[s]:.2f}s" for s in SIDES)
            + f"  | inplace = put {ip[0]:.2f} + transfer {took['inplace'] - sum(ip[:2]):.2f} + load {ip[1]:.2f}"
            + f" (vLLM reload {ip[2]:.2f}, tied head {ip[3]:.2f})"
            + f"  | inplace-torch = put {it[0]:.2f} + transfer {took['inplace-torch'] - sum(it[:2]):.2f}"
            + f" + load {it[1]:.2f}  | samples identical")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import ray
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcr.config import RLCRConfig
    from rlcr.models.smollm2 import resolve_model
    from rlcr.rollout.engine import EnginePool
    from rlcr.tasks.registry import get_task

    countdown = get_task("countdown")

    model = resolve_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="bench-weight-sync-"))
    cfg = RLCRConfig(model={"name": model}, storage={"uri": str(work / "store")},
                     engine={"max_model_len": 1024, "kv_cache_gib": 1.0})
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model)
    base = {k: v.clone() for k, v in lm.state_dict().items()}  # what the trainer holds (lm_head.weight tied)
    n_bytes = sum(v.numel() * v.element_size() for k, v in base.items() if k != "lm_head.weight")
    conversations = [countdown.turn1_messages(t) for t in countdown.generate(4, 5)]

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    pool = EnginePool(cfg, model)
    print(f"model.name={args.model} params={n_bytes / 4e6:.0f}M ({n_bytes / 2**20:.0f} MiB fp32) cpus={os.cpu_count()} "
          f"engine pool start {time.perf_counter() - t0:.1f}s", flush=True)

    def samples(version):
        _, out = ray.get(pool.actors[0].generate_chats.remote(
            conversations, policy_uri=version, labels=["x"] * len(conversations), mask_kind="answer", seed=11,
            n=2, temperature=1.0, top_p=1.0, max_tokens=24))
        return [(s.completion_ids, s.completion_logprobs) for group in out for s in group]

    times = {s: [] for s in SIDES}
    try:
        for r in range(args.rounds):
            with torch.no_grad():
                for name, p in lm.state_dict().items():
                    p.copy_(base[name] * (1 + 1e-3 * (r + 1)))
            ckpt = work / f"round-{r}"
            lm.save_pretrained(ckpt, safe_serialization=True)
            tokenizer.save_pretrained(ckpt)
            took, detail = sync_round(pool, lm.state_dict(), ckpt, r, samples)
            for side in SIDES:
                times[side].append(took[side])
            print(round_line(r, took, detail), flush=True)
            shutil.rmtree(ckpt)
    finally:
        pool.shutdown()
        ray.shutdown()
    for s in SIDES:
        v = times[s]
        print(f"{s:14s} median {statistics.median(v):6.2f}s  min {min(v):6.2f}s  max {max(v):6.2f}s  "
              f"(n={len(v)})")
    print(f"weight sync inplace s: {statistics.median(times['inplace']):.2f}")


if __name__ == "__main__":
    main()
