"""Sampling from a vLLM engine: the rollout requests, one call per turn or both turns pipelined.

Every rollout sample is its own engine request with its own ``SamplingParams.seed`` (:func:`sample` with
``seeds``; docs/reproducibility.md), so its tokens depend on its prompt, its seed and the weights, not on what
else is in the batch (the kernels' float rounding aside). :func:`sample_chats` is one turn of a stage's batch;
:func:`sample_tree` runs both turns of a batch in one engine run, sending each answer's turn-2 requests as soon
as that answer is done (:func:`run_requests`), so that the engine's batch stays full across the turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rlcr.models.chat import render_prompt
from rlcr.untrusted import printable

__all__ = ["Sample", "sample", "seeded_sample", "sample_chats", "sample_tree", "run_requests", "check_raw_logprobs",
           "RAW_LOGPROBS", "sampling_params"]

RAW_LOGPROBS = "raw_logprobs"
"""The engine's log-prob mode rlcr samples with: vLLM's log-softmax of the model's logits before temperature and
top-p (the default of vLLM ≥ 0.10)."""


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
    seeds: Sequence[Sequence[int]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[list[Sample]]:
    """``n`` completions per token-id prompt, with the sampled tokens' log-probs.

    Log-probs are vLLM's default ``raw_logprobs``: log-softmax of the model's
    logits before temperature/top-p, i.e. log π(token) of the policy itself, the
    quantity the trainer computes — with ``top_p`` < 1 too, never the truncated,
    renormalised distribution's (:func:`check_raw_logprobs`). A generation ending on a ``stop`` string keeps
    it in the text (``finish_reason`` "stop").

    ``seeds``: per prompt, the ``n`` request seeds of its samples. Each sample is then a request of its
    own with ``SamplingParams(seed=…)`` and depends only on (prompt, seed, engine weights), whatever else
    is in the call. None: one request per prompt with ``n`` samples drawn from the engine's global RNG
    (what :func:`seeded_sample` seeds per call).

    ``progress(done, total)``: called as vLLM counts finished requests (through its ``use_tqdm`` hook; nothing
    is shown).
    """
    from vllm.inputs import TokensPrompt

    check_raw_logprobs(llm)

    def params(count: int, seed: int | None):
        return sampling_params(temperature=temperature, top_p=top_p, max_tokens=max_tokens, stop=stop, seed=seed,
                               n=count)

    if seeds is None:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params(n, None),
                               use_tqdm=_counting(progress, len(prompts)) if progress else False)
        return [[_sample(c) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]
    seeds = [[int(x) for x in row] for row in seeds]
    if len(seeds) != len(prompts) or any(len(row) != n for row in seeds):
        raise ValueError(f"seeds: expected {n} per prompt for {len(prompts)} prompts, "
                         f"got {[len(row) for row in seeds]}")
    requests = [TokensPrompt(prompt_token_ids=list(p)) for p, row in zip(prompts, seeds) for _ in row]
    outputs = llm.generate(requests, [params(1, x) for row in seeds for x in row],
                           use_tqdm=_counting(progress, len(requests)) if progress else False)
    flat = [_sample(out.outputs[0]) for out in outputs]
    return [flat[i * n:(i + 1) * n] for i in range(len(prompts))]


def check_raw_logprobs(llm) -> None:
    """Refuse, in one line, an engine whose log-probs are not :data:`RAW_LOGPROBS`. With vLLM's processed modes
    they would be those of the tempered, top-p-truncated and renormalised distribution (huggingface/trl#6789): every
    kept token's log-prob raised by −log(kept mass), so the mismatch figures (:mod:`rlcr.train.mismatch`) and the
    importance weights of ``loss.tis_cap`` / ``loss.seq_mask_band`` would measure the sampling settings, not the
    engine against the trainer, which computes the untruncated model."""
    mode = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "logprobs_mode", None)
    if mode != RAW_LOGPROBS:
        raise ValueError(f"the vLLM engine reports {printable(repr(mode), 60)} log-probs; rlcr records "
                         f"{RAW_LOGPROBS!r} (the untruncated model's, what the trainer computes): create it without "
                         f"logprobs_mode")


def _counting(progress: Callable[[int, int], None], total: int):
    """A tqdm class for vLLM's ``use_tqdm`` that writes nothing and calls ``progress(finished, total)`` each time
    vLLM counts a finished request (one ``update`` per request, whatever its ``n``)."""
    import io

    from tqdm import tqdm

    class Counting(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.update(file=io.StringIO(), dynamic_ncols=False)
            self.finished = 0
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            out = super().update(n)
            self.finished += 1
            progress(min(self.finished, total), total)
            return out

    return Counting


def sampling_params(*, temperature: float, top_p: float, max_tokens: int, stop: Sequence[str] | None, seed: int | None,
            n: int = 1):
    """The sampling parameters of every rollout request: log-probs of the sampled tokens, the stop string kept."""
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0,
                          stop=list(stop) if stop else None, include_stop_str_in_output=True, seed=seed)


def run_requests(llm, requests: Sequence[tuple[Any, Sequence[int], Any]], on_done=None) -> dict[Any, Sample]:
    """Run ``(tag, prompt ids, SamplingParams)`` requests on ``llm``'s engine until all are done → {tag: sample}.

    ``on_done(tag, sample)`` is called as each request finishes and may return more requests, which join the
    running batch at the engine's next step (a turn-2 request starts as soon as its answer is done, instead of
    after the whole turn-1 batch). Each request is its own (``n = 1``) engine request, so a seeded one samples
    the same tokens as in :func:`sample` (the kernels' float rounding aside). If anything raises, the requests
    still in the engine are aborted first, so the engine is left empty for the next call.
    """
    import uuid

    from vllm.inputs import TokensPrompt

    check_raw_logprobs(llm)
    engine, prefix = llm.llm_engine, f"rlcr-{uuid.uuid4().hex[:12]}-"
    tags: dict[str, Any] = {}
    internal: dict[str, str] = {}
    done: dict[Any, Sample] = {}

    def add(batch) -> None:
        for tag, prompt, params in batch:
            rid = f"{prefix}{len(tags)}"
            tags[rid] = tag
            internal[rid] = engine.add_request(rid, TokensPrompt(prompt_token_ids=list(prompt)), params)

    try:
        add(requests)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if not out.finished or out.request_id not in tags:
                    continue
                internal.pop(out.request_id, None)
                tag = tags[out.request_id]
                done[tag] = _sample(out.outputs[0])
                if on_done is not None:
                    add(on_done(tag, done[tag]) or ())
    except BaseException:
        if internal:
            engine.abort_request(list(internal.values()), internal=True)
        raise
    return done


def sample_tree(llm, tokenizer, conversations, *, labels: Sequence[str], seeds: Sequence[Sequence[int]], turn2,
                max_prompt_tokens: int, temperature: float, top_p: float, max_tokens: tuple[int, int],
                stop: tuple[Sequence[str], Sequence[str]], mask_kinds: tuple[str, str] = ("answer", "confidence")):
    """Both turns of a batch in one engine run, each turn-2 request sent as soon as its answer is done.

    Turn 1: conversation ``i``'s samples with request seeds ``seeds[i]`` (as :func:`sample_chats`). When answer
    ``(i, k)`` is done, ``turn2(i, k, sample)`` → ``(conversation, label, request seeds)`` gives its turn-2
    conversation, rendered and sampled at once (``len(seeds)`` samples) while the other answers still decode:
    the engine's batch stays full across the turns. ``max_tokens``, ``stop``, ``mask_kinds``: per turn.

    Returns ``(contexts, samples, turn2_out)`` where ``contexts``/``samples`` are turn 1's as from
    :func:`sample_chats` and ``turn2_out[i][k] = (conversation, context, samples)``; loss masks attached.
    A sample depends only on its prompt, its seed and the weights, so the tree holds the samples of the
    two-call way (turn 1, then all of turn 2), the kernels' float rounding aside (docs/reproducibility.md).
    """
    from rlcr.core.masks import completion_mask

    contexts = [render_prompt(tokenizer, m, where=w, max_prompt_tokens=max_prompt_tokens)
                for m, w in zip(conversations, labels)]
    kw = dict(temperature=temperature, top_p=top_p)
    first = [(("a", i, k), ids, sampling_params(max_tokens=max_tokens[0], stop=stop[0], seed=int(x), **kw))
             for i, (_, ids) in enumerate(contexts) for k, x in enumerate(seeds[i])]
    second: dict[tuple[int, int], tuple[Any, tuple[str, list[int]], list[int]]] = {}

    def on_done(tag, s: Sample):
        if tag[0] != "a":
            return ()
        _, i, k = tag
        s.loss_mask = completion_mask(tokenizer, s.completion_ids, s.completion_text, mask_kinds[0])
        conversation, label, row_seeds = turn2(i, k, s)
        context = render_prompt(tokenizer, conversation, where=label, max_prompt_tokens=max_prompt_tokens)
        second[i, k] = (conversation, context, [int(x) for x in row_seeds])
        return [(("c", i, k, h), context[1], sampling_params(max_tokens=max_tokens[1], stop=stop[1], seed=x, **kw))
                for h, x in enumerate(second[i, k][2])]

    done = run_requests(llm, first, on_done)
    samples = [[done["a", i, k] for k in range(len(seeds[i]))] for i in range(len(contexts))]
    out = []
    for i in range(len(contexts)):
        row = []
        for k in range(len(seeds[i])):
            conversation, context, row_seeds = second[i, k]
            group = [done["c", i, k, h] for h in range(len(row_seeds))]
            for s in group:
                s.loss_mask = completion_mask(tokenizer, s.completion_ids, s.completion_text, mask_kinds[1])
            row.append((conversation, context, group))
        out.append(row)
    return contexts, samples, out


def _sample(c) -> Sample:
    """A vLLM ``CompletionOutput`` as a :class:`Sample`."""
    ids = list(c.token_ids)
    lps = [float(d[t].logprob) for d, t in zip(c.logprobs or [], ids)]
    return Sample(ids, c.text, lps, c.finish_reason or "stop")


def seeded_sample(llm, prompts, *, seed: int, **kwargs) -> list[list[Sample]]:
    """:func:`sample` without per-request seeds, after re-seeding the global RNGs the in-process engine
    samples from (the probe's calls).

    Sampling noise then comes from torch's global generator of the (in-process) engine;
    re-seeding it before every call (with a per-call seed, :func:`rlcr.seeds.mix`)
    makes each call's samples depend only on (seed, requests, how the engine batches them), not on
    which actor ran it or what ran before. The rollout stages use per-request seeds instead
    (:func:`sample_chats`), which do not depend on the batching.
    """
    import random

    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    return sample(llm, prompts, **kwargs)


def sample_chats(llm, tokenizer, conversations, *, labels: Sequence[str], mask_kind: str, max_prompt_tokens: int,
                 seeds: Sequence[Sequence[int]] | None = None, seed: int | None = None,
                 **kwargs) -> tuple[list[tuple[str, list[int]]], list[list[Sample]]]:
    """Render each conversation, sample from it and attach each sample's loss mask
    (:func:`rlcr.core.masks.completion_mask` of ``mask_kind``: answer, confidence or single).

    ``seeds`` (what the rollout stages give): per conversation, one request seed per sample (:func:`sample`);
    the samples do not depend on the batch. ``seed`` instead: one seed for the call (:func:`seeded_sample`).

    This is the whole per-batch work of a generation stage that needs a tokenizer;
    it runs where the engine is (in the stage actor, or in a shared
    :class:`RolloutEngine`), so stage actors of a shared engine never load one.
    """
    if (seeds is None) == (seed is None):
        raise ValueError("sample_chats: give either seeds (one per sample) or seed (one per call)")
    from rlcr.core.masks import completion_mask

    contexts = [render_prompt(tokenizer, m, where=w, max_prompt_tokens=max_prompt_tokens)
                for m, w in zip(conversations, labels)]
    prompts = [ids for _, ids in contexts]
    samples = (sample(llm, prompts, seeds=seeds, **kwargs) if seeds is not None
               else seeded_sample(llm, prompts, seed=seed, **kwargs))
    for group in samples:
        for s in group:
            s.loss_mask = completion_mask(tokenizer, s.completion_ids, s.completion_text, mask_kind)
    return contexts, samples
