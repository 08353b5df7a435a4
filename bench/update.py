"""Benchmark of the masked GRPO update's compute rate against a plain fp32 matmul, old vs new settings.

Same model (SmolLM2-135M-Instruct, float32, CPU), same RLCR-shaped batch, measured side by side
with interleaved repeats (the order rotates between rounds, each round printed as it finishes):

* ``matmul``: a plain fp32 ``torch.mm`` of two 2048×2048 matrices (2·n³ FLOP), the CPU's peak as
  PyTorch reaches it, measured in every round;
* ``new``: the update as the code runs it, :func:`rlcr.train.update.train_update` — prefix-tree
  micro-batches, prefix-tree attention per segment (:func:`rlcr.train.logprobs.tree_sdpa_attention`),
  blocked log-probs at the masked completion tokens only (:func:`rlcr.loss.token_logprobs`),
  ``policy_loss``, backward, grad clipping, fused AdamW (:func:`rlcr.train.update.make_optimizer`);
  one on-policy step (``old_logp_source="recompute"``, one mini-batch);
* ``old``: the same update with the settings before docs/update-performance.md — SDPA over the
  dense ``[T, T]`` tree mask, log-probs through plain autograd (logsumexp + gather), the
  per-parameter-loop AdamW;
* ``plain`` (``--plain``): ``lm(input_ids).logits`` over the padded batch, cross-entropy over every
  position, backward, AdamW — what a generic trainer does with the same rows.

Each setting keeps one AdamW across rounds, as a training run does (:mod:`rlcr.train.trainer`).
GFLOP/s = 6 × parameters (all of them, the tied embedding once) × prefix-tree tokens (the nodes the
model processes, every micro-batch's) / wall seconds of the step. Other processes share this CPU:
the median over rounds and the per-round ratio to the matmul of the same round are the robust figures.

Run from the repo root:  python bench/update.py [--repeats 4] [--micro-batch-tokens 2048] [--profile]
The last line is ``update/matmul GFLOP/s: <ratio>`` (the new settings' median per-round ratio).
"""

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import rlcr.train.logprobs as update_mod  # noqa: E402 - CompletionLogProbs calls its token_logprobs
from rlcr.config import RLCRConfig  # noqa: E402
from rlcr.train.batching import Sample, collate  # noqa: E402
from rlcr.train.logprobs import CompletionLogProbs  # noqa: E402
from rlcr.train.update import make_optimizer, train_update  # noqa: E402


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


# ----------------------------------------------------------------------------- the old settings


def old_token_logprobs(logits, labels, *, return_entropy=False, entropy_grad=True, chunk_rows=1024):
    """rlcr.loss.token_logprobs before the blocked version (dc21110): plain autograd ops."""
    shape = labels.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1)
    logps, ents = [], []
    for start in range(0, flat_logits.shape[0], chunk_rows):
        z = flat_logits[start:start + chunk_rows].float()
        y = flat_labels[start:start + chunk_rows]
        lse = torch.logsumexp(z, dim=-1)
        logps.append(z.gather(-1, y[:, None]).squeeze(-1) - lse)
        if return_entropy:
            with contextlib.nullcontext() if entropy_grad else torch.no_grad():
                ents.append(lse - (torch.exp(z - lse[:, None]) * z).sum(-1))
    logp = torch.cat(logps).reshape(shape)
    return logp, (torch.cat(ents).reshape(shape) if return_entropy else None)


class DenseTreeMask(CompletionLogProbs):
    """The policy with a prefix tree's attention as SDPA over its dense [T, T] mask (``tree`` dropped)."""

    def forward(self, *args, tree=None, **kwargs):
        return super().forward(*args, **kwargs)


@contextlib.contextmanager
def old_logprobs():
    saved = update_mod.token_logprobs
    update_mod.token_logprobs = old_token_logprobs
    try:
        yield
    finally:
        update_mod.token_logprobs = saved


# ----------------------------------------------------------------------------- steps


def matmul_gflops(n: int = 2048, reps: int = 3) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(reps))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_plain(lm, samples, cfg, pad_id, opt) -> None:
    mb = collate(samples, pad_id)
    logits = lm(mb.input_ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), mb.input_ids[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(lm.parameters(), cfg.update.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--ga", type=int, default=4)
    ap.add_argument("--gc", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=113)
    ap.add_argument("--answer-len", type=int, default=68)
    ap.add_argument("--query-len", type=int, default=50)
    ap.add_argument("--confidence-len", type=int, default=31)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--micro-batch-tokens", type=int, default=None, help="default: the config's")
    ap.add_argument("--settings", default="old,new", help="comma-separated: old, new, plain")
    ap.add_argument("--plain", action="store_true", help="add the plain causal-LM step")
    ap.add_argument("--profile", action="store_true", help="after the rounds, one profiled step per setting")
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
    extra = {} if args.micro_batch_tokens is None else {"update.micro_batch_tokens": args.micro_batch_tokens}
    cfg = RLCRConfig.from_dict({**extra, "update": {"learning_rate": 1e-7}})
    budget = cfg.update.micro_batch_tokens
    params = sum(p.numel() for p in lm.parameters())
    trees = pack_prefix_trees(samples, budget)
    tree_tokens = sum(collate_prefix_tree(t, pad_id).padded_tokens for t in trees)
    flop = 6 * params * tree_tokens
    masked = sum(s.masked_tokens for s in samples)
    print(f"model SmolLM2-135M-Instruct fp32, {params / 1e6:.1f}M parameters, torch threads {torch.get_num_threads()} "
          f"(os.cpu_count {os.cpu_count()}), {len(samples)} samples ({args.prompts} prompts x G_a={args.ga} x "
          f"G_c={args.gc}), micro_batch_tokens {budget}")
    print(f"tokens: {sum(s.length for s in samples)} in the samples, {tree_tokens} in {len(trees)} prefix trees "
          f"(GFLOP/s = 6 x params x {tree_tokens} / s), {masked} masked")

    new_policy, old_policy = CompletionLogProbs(lm), DenseTreeMask(lm)
    opts = {"new": make_optimizer(lm, cfg),
            "old": torch.optim.AdamW(lm.parameters(), lr=cfg.update.learning_rate, weight_decay=cfg.update.weight_decay,
                                     betas=tuple(cfg.update.adam_betas)),
            "plain": torch.optim.AdamW(lm.parameters(), lr=cfg.update.learning_rate, weight_decay=cfg.update.weight_decay,
                                       betas=tuple(cfg.update.adam_betas))}

    def step_new():
        m = train_update(new_policy, samples, cfg, pad_id=pad_id, optimizer=opts["new"])
        assert m["optimizer_steps"] == 1, m

    def step_old():
        with old_logprobs():
            m = train_update(old_policy, samples, cfg, pad_id=pad_id, optimizer=opts["old"])
        assert m["optimizer_steps"] == 1, m

    fns = {"old": step_old, "new": step_new, "plain": lambda: run_plain(lm, samples, cfg, pad_id, opts["plain"])}
    names = [n for n in args.settings.split(",") if n] + (["plain"] if args.plain and "plain" not in args.settings else [])
    for name in names:  # warm-up (and the optimizers' state)
        fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    peaks: list[float] = []
    for r in range(args.repeats):
        peaks.append(matmul_gflops())
        line = [f"round {r + 1}/{args.repeats}: matmul {peaks[-1]:6.1f} GFLOP/s"]
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order between rounds
            times[name].append(_timed(fns[name]))
        for name in names:
            line.append(f"{name} {times[name][-1]:6.2f} s {flop / times[name][-1] / 1e9:6.1f} GFLOP/s")
        print(" | ".join(line), flush=True)

    def spread(xs):
        return f"median {statistics.median(xs):6.1f} (min {min(xs):6.1f}, max {max(xs):6.1f})"

    print(f"{'':<7} GFLOP/s over {args.repeats} rounds")
    print(f"{'matmul':<7} {spread(peaks)}")
    ratios = {}
    for name in names:
        g = [flop / t / 1e9 for t in times[name]]
        ratios[name] = statistics.median(x / p for x, p in zip(g, peaks))
        extra = "" if name == "plain" else f", {masked / statistics.median(times[name]):.0f} masked tok/s"
        print(f"{name:<7} {spread(g)}, {statistics.median(times[name]):.2f} s/step, "
              f"{ratios[name]:.2f} of the round's matmul{extra}")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name in names:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fns[name]()
            print(f"--- profile: {name} (one step, profiler on)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=50))
    if "new" in ratios:
        print(f"update/matmul GFLOP/s: {ratios['new']:.2f}")


if __name__ == "__main__":
    main()
