"""Benchmark of the masked GRPO update against a plain causal-LM training step.

Same model (SmolLM2-135M-Instruct, float32, CPU), same token batch, measured side
by side with interleaved repeats:

* ``update``: the full in-process update, :func:`rlcr.train.update.train_update`
  — micro-batch packing, log-probs at the masked completion tokens only,
  ``policy_loss`` (token-mean, global count), backward, grad clipping, AdamW step
  (one on-policy step, ``old_logp_source="recompute"``: π_old is the detached
  current log-prob, exact, no extra forward);
* ``plain``: ``lm(input_ids).logits`` over the same padded ``[B, T]`` batch,
  cross-entropy over every position, backward, AdamW step.

Both create a fresh AdamW per step (as the update does per iteration). Throughput
is the batch's masked (completion) tokens per second of wall time.

Run from the repo root:  python bench/update.py [--rows 16] [--len 256] [--repeats 3]
The last line is ``update/plain tokens/s: <ratio>``.
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


def make_samples(n: int, length: int, masked_frac: float, vocab: int, seed: int) -> list[Sample]:
    """n rows of ~length tokens (±10%): context, then a completion whose span mask
    covers ``masked_frac`` of the row (a few unmasked tokens at each end, like EOS)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        total = int(length * (0.9 + 0.2 * torch.rand(1, generator=g).item()))
        masked = int(total * masked_frac)
        comp_len = masked + 3
        ctx = torch.randint(100, vocab, (total - comp_len,), generator=g).tolist()
        comp = torch.randint(100, vocab, (comp_len,), generator=g).tolist()
        mask = [0] + [1] * masked + [0, 0]
        adv = float(torch.randn(1, generator=g))
        out.append(Sample(index=i, context_ids=ctx, completion_ids=comp, loss_mask=mask, advantage=adv,
                          reward=float(adv > 0), is_confidence=i % 4 == 3))
    return out


def run_update(lm, samples, cfg, pad_id) -> float:
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
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--masked", type=float, default=0.6)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcr.models import prepare_smollm2

    path = prepare_smollm2()
    tok = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lm.train()
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    samples = make_samples(args.rows, args.len, args.masked, len(tok), args.seed)
    cfg = RLCRConfig(learning_rate=1e-7, micro_batch_tokens=args.micro_batch_tokens)
    masked = sum(s.masked_tokens for s in samples)
    padded = collate(samples, pad_id).padded_tokens
    print(f"model SmolLM2-135M-Instruct fp32, torch threads {torch.get_num_threads()}, "
          f"{args.rows} rows, padded batch {padded} tokens, masked {masked} ({masked / padded:.0%})")

    run_update(lm, samples, cfg, pad_id), run_plain(lm, samples, cfg, pad_id)  # warm-up
    times = {"update": [], "plain": []}
    for r in range(args.repeats):
        order = ("update", "plain") if r % 2 == 0 else ("plain", "update")
        for name in order:
            fn = run_update if name == "update" else run_plain
            times[name].append(fn(lm, samples, cfg, pad_id))

    print(f"{'step':<8} {'median s':>9} {'min s':>7} {'masked tok/s':>13} {'padded tok/s':>13}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<8} {med:9.3f} {min(ts):7.3f} {masked / med:13.1f} {padded / med:13.1f}")
    # adjacent runs share the machine's load: the median of the per-pair ratios is the robust estimate
    pairs = [p / u for u, p in zip(times["update"], times["plain"])]
    print("per-pair update/plain:", " ".join(f"{x:.2f}" for x in pairs))
    print(f"update/plain tokens/s: {statistics.median(pairs):.2f}")


if __name__ == "__main__":
    main()
