"""How the engines should take a LoRA run's adapter (issue 50): merged into their weights in place, or served by
vLLM as a LoRA adapter, side by side on the same requests.

Two engines, each in its own Ray actor (as the flow's are), from the same base model:

  merged     the product's path: :meth:`RolloutEngine.update_weights` with the trainer's
             :class:`~rlcr.models.adapters.AdapterUpdate` (``ray.put`` of the A/B factors, merged into the base in
             float64, the touched layers loaded in place; ``engine.weight_sync=inplace``)
  vllm-lora  an engine created with ``enable_lora``: the adapter written as a ``peft`` directory (what the trainer
             would hand over), then requests with a new ``LoRARequest`` id per version (vLLM loads it on first use)

Each round makes a new adapter version (``peft`` on every projection, rank ``--rank``, A and B random, scaled per
round), syncs it into both engines, and samples the same seeded requests (P Countdown prompts × G samples, up to
``--max-tokens`` tokens) from each. Per side: the sync seconds (until the engine can sample the new version; for
``vllm-lora`` the adapter write plus vLLM's load, which happens inside the first generate call and is timed there
as the difference to a repeat call) and the generation's milliseconds per generated token. Prints each round as
it finishes; the last line is ``vllm-lora/merged ms per token: X`` (median over rounds of the per-round ratio).
The two sides' samples are compared and the count of differing samples printed: vLLM's LoRA kernels compute
x·W + s·(x·A)·B at every token, so they are not expected to match the merged weights bit for bit.

    python bench/perf/lora_serving.py [--model smollm2-135m-instruct] [--rounds 3] [--rank 16]
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


def _generate(llm, prompts, seeds, max_tokens: int, request=None):
    """Token-id prompts, one seeded request each → (generated token ids per request, seconds)."""
    from vllm.inputs import TokensPrompt

    from rlcr.rollout.sampling import sampling_params

    params = [sampling_params(temperature=1.0, top_p=1.0, max_tokens=max_tokens, stop=None, seed=s) for s in seeds]
    t0 = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, lora_request=request,
                       use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in out], time.perf_counter() - t0


class LoraServingEngine:
    """A vLLM engine with ``enable_lora``, sampling under a named adapter version (a Ray actor)."""

    def __init__(self, cfg: dict, model_dir: str, rank: int):
        from rlcr.config import RLCRConfig
        from rlcr.rollout.engine import create_engine

        cfg = RLCRConfig.model_validate(cfg)
        self.llm = create_engine(model_dir, cfg, seed=cfg.run.seed, enable_lora=True, max_lora_rank=rank,
                                 max_loras=1)

    def generate(self, prompts, seeds, *, max_tokens: int, adapter: tuple[str, int, str]):
        from vllm.lora.request import LoRARequest

        return _generate(self.llm, prompts, seeds, max_tokens, LoRARequest(*adapter))


def merged_engine_class():
    """The product's engine (:class:`~rlcr.rollout.engine.RolloutEngine`) with the same timed ``generate``."""
    from rlcr.rollout.engine import RolloutEngine

    class MergedEngine(RolloutEngine):
        def generate(self, prompts, seeds, *, max_tokens: int, policy_uri: str):
            self._check(policy_uri)
            return _generate(self.llm, prompts, seeds, max_tokens)

    return MergedEngine


def make_requests(model_dir: str, prompts: int, samples: int):
    from transformers import AutoTokenizer

    from rlcr.models.chat import render_prompt
    from rlcr.tasks.registry import get_task

    countdown = get_task("countdown")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = [render_prompt(tokenizer, countdown.turn1_messages(t), where="bench", max_prompt_tokens=512)[1]
           for t in countdown.generate(prompts, 5)]
    return [p for p in ids for _ in range(samples)], [1000 + i for i in range(len(ids) * samples)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()

    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from rlcr.config import RLCRConfig
    from rlcr.models.smollm2 import resolve_model
    from rlcr.rollout.engine import engine_runtime_env
    from rlcr.train.lora import adapter_update, wrap_lora

    model = resolve_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="bench-lora-serving-"))
    cfg = RLCRConfig(model={"name": model}, storage={"uri": str(work / "store")},
                     engine={"max_model_len": 1024, "kv_cache_gib": 1.0, "block_size": 32},
                     lora={"enabled": True, "rank": args.rank, "alpha": 2 * args.rank})
    peft_model = wrap_lora(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), cfg)
    factors = {n: p for n, p in peft_model.named_parameters() if "lora_" in n}
    start = {n: p.detach().clone() for n, p in factors.items()}
    prompts, seeds = make_requests(model, args.prompts, args.samples)

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    opts = dict(num_cpus=0.5, runtime_env=engine_runtime_env())
    merged = ray.remote(merged_engine_class()).options(**opts).remote(cfg.model_dump(), model)
    lora = ray.remote(LoraServingEngine).options(**opts).remote(cfg.model_dump(), model, args.rank)
    print(f"model {args.model}, rank {args.rank} on {len(factors) // 2} projections, {len(prompts)} requests × "
          f"≤ {args.max_tokens} tokens, {args.rounds} rounds, CPU {os.cpu_count()} cores", flush=True)
    ms: dict[str, list[float]] = {"merged": [], "vllm-lora": []}
    sync: dict[str, list[float]] = {"merged": [], "vllm-lora": []}
    ray.get([merged.current.remote(), lora.__ray_ready__.remote()])  # both engines started
    try:
        for r in range(-1, args.rounds):  # round 0 (shown as "warm-up") is not counted
            if r == 0:
                for figs in (*ms.values(), *sync.values()):
                    figs.clear()
            gen = torch.Generator().manual_seed(r + 1)
            with torch.no_grad():
                for n, p in factors.items():  # a new version: A and B moved away from the start (B nonzero)
                    p.copy_(start[n] + 0.02 * (r + 2) * torch.randn(p.shape, generator=gen))
            version = f"v{r + 2}"
            t0 = time.perf_counter()
            ray.get(merged.update_weights.remote(ray.put(adapter_update(peft_model)), version, mode="inplace"))
            sync["merged"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            adapter_dir = work / version
            peft_model.save_pretrained(adapter_dir)
            write_s = time.perf_counter() - t0
            adapter = (version, r + 2, str(adapter_dir))
            _, first_s = ray.get(lora.generate.remote(prompts, seeds, max_tokens=args.max_tokens, adapter=adapter))
            out = {}
            for side in (("merged", "vllm-lora") if r % 2 == 0 else ("vllm-lora", "merged")):
                call = (merged.generate.remote(prompts, seeds, max_tokens=args.max_tokens, policy_uri=version)
                        if side == "merged" else
                        lora.generate.remote(prompts, seeds, max_tokens=args.max_tokens, adapter=adapter))
                out[side] = ray.get(call)
                ms[side].append(1e3 * out[side][1] / sum(len(x) for x in out[side][0]))
            sync["vllm-lora"].append(write_s + max(0.0, first_s - out["vllm-lora"][1]))
            differ = sum(a != b for a, b in zip(out["merged"][0], out["vllm-lora"][0]))
            print(f"round {r + 1 if r >= 0 else 'warm-up'}/{args.rounds}: sync merged {sync['merged'][-1]:.2f} s, "
                  "vllm-lora "
                  f"{sync['vllm-lora'][-1]:.2f} s (write {write_s:.2f}); ms/token merged {ms['merged'][-1]:.2f}, "
                  f"vllm-lora {ms['vllm-lora'][-1]:.2f}; {differ}/{len(prompts)} samples differ", flush=True)
            shutil.rmtree(adapter_dir)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    for name, figs in (("sync s", sync), ("ms per token", ms)):
        for side, xs in figs.items():
            print(f"{side:9s} {name:12s} median {statistics.median(xs):.3f} (range {min(xs):.3f}–{max(xs):.3f}, "
                  f"n = {len(xs)})")
    ratio = [b / a for a, b in zip(ms["merged"], ms["vllm-lora"])]
    print(f"vllm-lora/merged sync s: {statistics.median(sync['vllm-lora']) / statistics.median(sync['merged']):.3f}")
    print(f"vllm-lora/merged ms per token: {statistics.median(ratio):.3f}")


if __name__ == "__main__":
    main()
