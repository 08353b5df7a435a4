"""Benchmark of the masked GRPO update against a plain causal-LM training step.

Same model (SmolLM2-135M-Instruct, float32, CPU), same token batch, measured side
by side with interleaved repeats:

* ``update``: the full in-process update, :func:`rlcr.train.update.train_update`
  — micro-batch packing, log-probs at the masked completion tokens only,
  ``policy_loss`` (token-mean, global count), backward, grad clipping, AdamW step
  (one on-policy step, ``old_logp_source="recompute"``: π_old is the detached
  current log-prob, exact, no extra forward);
  run twice: ``update-tree`` packs samples sharing a prefix into prefix trees
  (``share_prefixes``, the default), ``update-pad`` uses right-padded rows;
* ``plain``: ``lm(input_ids).logits`` over the padded ``[B, T]`` batch,
  cross-entropy over every position, backward, AdamW step — what a generic
  trainer does with the same rows.

The batch has the shape of an RLCR rollout (defaults: the demo's measured
lengths): per prompt a context, G_a answers, and per answer a turn-2 context
(prompt + that answer + the confidence query) with G_c confidences. All create
a fresh AdamW per step (as the update does per iteration). Throughput is the
batch's masked (completion) tokens per second of wall time.

Run from the repo root:  python bench/update.py [--prompts 4] [--ga 4] [--gc 2] [--repeats 3]
The last line is ``update/plain tokens/s: <ratio>`` (the default update, prefix trees).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from rlcr.config import RLCRConfig  # noqa: E402
from rlcr.train.batching import Sample, collate  # noqa: E402
from rlcr.train.update import CompletionLogProbs, train_update  # noqa: E402


def make_samples(prompts: int, g_a: int, g_c: int, *, prompt_len: int, answer_len: int, query_len: int,
                 confidence_len: int, vocab: int, seed: int) -> list[Sample]:
    """An RLCR-shaped rollout tree with random tokens: lengths vary ±20%; answers keep their
    last (EOS) token out of the loss mask, confidences are fully masked."""
    g = torch.Generator().manual_seed(seed)

    def rand(n):
        n = max(2, int(n * (0.8 + 0.4 * torch.rand(1, generator=g).item())))
        return torch.randint(100, vocab, (n,), generator=g).tolist()

    out: list[Sample] = []
    for _ in range(prompts):
        ctx = rand(prompt_len)
        for _ in range(g_a):
            ans = rand(answer_len)
            out.append(Sample(index=len(out), context_ids=ctx, completion_ids=ans, loss_mask=[1] * (len(ans) - 1) + [0],
                              advantage=float(torch.randn(1, generator=g)), reward=0.0))
            turn2 = ctx + ans + rand(query_len)
            for _ in range(g_c):
                conf = rand(confidence_len)
                out.append(Sample(index=len(out), context_ids=turn2, completion_ids=conf, loss_mask=[1] * len(conf),
                                  advantage=float(torch.randn(1, generator=g)), reward=0.5, is_confidence=True))
    return out


def run_update(lm, samples, cfg, pad_id) -> float:
    """One iteration's update (a single on-policy optimizer step)."""
    t = time.perf_counter()
    m = train_update(CompletionLogProbs(lm), samples, cfg, pad_id=pad_id)
    dt = time.perf_counter() - t
    assert m["optimizer_steps"] == 1, m
    return dt


def run_plain(lm, samples, cfg, pad_id) -> float:
    t = time.perf_counter()
    mb = collate(samples, pad_id)
    opt = torch.optim.AdamW(lm.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                            betas=tuple(cfg.adam_betas))
    logits = lm(mb.input_ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), mb.input_ids[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(lm.parameters(), cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--ga", type=int, default=4)
    ap.add_argument("--gc", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=113)
    ap.add_argument("--answer-len", type=int, default=68)
    ap.add_argument("--query-len", type=int, default=50)
    ap.add_argument("--confidence-len", type=int, default=31)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--micro-batch-tokens", type=int, default=None, help="default: the config's")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcr.models import prepare_smollm2
    from rlcr.train.batching import collate_prefix_tree, pack_prefix_trees

    path = prepare_smollm2()
    tok = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lm.train()
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    samples = make_samples(args.prompts, args.ga, args.gc, prompt_len=args.prompt_len, answer_len=args.answer_len,
                           query_len=args.query_len, confidence_len=args.confidence_len, vocab=len(tok), seed=args.seed)
    extra = {} if args.micro_batch_tokens is None else {"micro_batch_tokens": args.micro_batch_tokens}
    cfgs = {"update-tree": RLCRConfig(learning_rate=1e-7, share_prefixes=True, **extra),
            "update-pad": RLCRConfig(learning_rate=1e-7, share_prefixes=False, **extra)}
    budget = cfgs["update-tree"].micro_batch_tokens
    masked = sum(s.masked_tokens for s in samples)
    real = sum(s.length for s in samples)
    padded = collate(samples, pad_id).padded_tokens
    trees = pack_prefix_trees(samples, budget)
    tree_nodes = sum(collate_prefix_tree(t, pad_id).padded_tokens for t in trees)
    print(f"model SmolLM2-135M-Instruct fp32, torch threads {torch.get_num_threads()}, {len(samples)} samples "
          f"({args.prompts} prompts x G_a={args.ga} x G_c={args.gc}), micro_batch_tokens {budget}")
    print(f"tokens: {real} in the samples, {padded} as one padded batch, {tree_nodes} in {len(trees)} prefix trees; "
          f"{masked} masked")

    fns = {name: (lambda c: (lambda: run_update(lm, samples, c, pad_id)))(c) for name, c in cfgs.items()}
    fns["plain"] = lambda: run_plain(lm, samples, cfgs["update-pad"], pad_id)
    for fn in fns.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order between repeats
            times[name].append(fns[name]())

    print(f"{'step':<12} {'median s':>9} {'min s':>7} {'masked tok/s':>13}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<12} {med:9.3f} {min(ts):7.3f} {masked / med:13.1f}")
    # runs of one repeat share the machine's load: the median of per-repeat ratios is the robust estimate
    pad_ratio = statistics.median(p / u for u, p in zip(times["update-pad"], times["plain"]))
    tree_ratio = statistics.median(p / u for u, p in zip(times["update-tree"], times["plain"]))
    print(f"update-pad/plain tokens/s: {pad_ratio:.2f}")
    print(f"update/plain tokens/s: {tree_ratio:.2f}")


if __name__ == "__main__":
    main()
