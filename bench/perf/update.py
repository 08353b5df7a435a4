"""Benchmark of the masked GRPO update's compute rate against a plain fp32 matmul, old vs new settings.

Same model (SmolLM2-135M-Instruct, float32, CPU), same RLCR-shaped batch, measured side by side
with interleaved repeats (the order rotates between rounds, each round printed as it finishes):

* ``matmul``: a plain fp32 ``torch.mm`` of two 2048×2048 matrices (2·n³ FLOP), the CPU's peak as
  PyTorch reaches it, measured in every round;
* ``new``: the update as the code runs it, :func:`rlcr.train.update.train_update` — prefix-tree
  micro-batches, prefix-tree attention per segment (:func:`rlcr.train.logprobs.tree_sdpa_attention`),
  blocked log-probs at the masked completion tokens only (:func:`rlcr.core.loss.token_logprobs`),
  ``policy_loss``, backward, grad clipping, fused AdamW (:func:`rlcr.train.update.make_optimizer`);
  one on-policy step (``old_logp_source="recompute"``, one mini-batch);
* ``old``: the same update with the settings before docs/update-performance.md — SDPA over the
  dense ``[T, T]`` tree mask, log-probs through plain autograd (logsumexp + gather), the
  per-parameter-loop AdamW;
* ``plain`` (``--plain``): ``lm(input_ids).logits`` over the padded batch, cross-entropy over every
  position, backward, AdamW — what a generic trainer does with the same rows;
* ``lora`` (``--lora``): ``new`` on a second copy of the model wrapped with LoRA adapters (``lora.enabled``,
  rank ``--lora-rank``, alpha 2·rank, every projection: :func:`rlcr.train.lora.wrap_lora`), AdamW over the adapters
  only. Its GFLOP/s use the same nominal 6 × parameters × tokens (the frozen weights get no gradient, so the
  work is nearer 4 ×): compare its seconds per step with ``new``'s.

Each setting keeps one AdamW across rounds, as a training run does (:mod:`rlcr.train.trainer`).
GFLOP/s = 6 × parameters (all of them, the tied embedding once) × prefix-tree tokens (the nodes the
model processes, every micro-batch's) / wall seconds of the step. Other processes share this CPU:
the median over rounds and the per-round ratio to the matmul of the same round are the robust figures.

``--dtypes fp32,bf16`` runs each setting under ``update.autocast: off`` (fp32) and ``update.autocast: bfloat16``
(bf16 autocast over the fp32 master weights: :func:`rlcr.train.update._autocast`) side by side, on either device.
On a GPU (``--device cuda``) the update runs as the trainer runs it there (:mod:`rlcr.train.worker`: fp32 master
weights moved to the device; ``auto`` is bf16 there). On a CPU bf16 pays only with bf16 instructions (the first line
says whether this CPU has them: :func:`rlcr.train.throughput.cpu_has_bf16`). ``model.dtype`` in the config is the
rollout engines' dtype (:func:`rlcr.models.weights.resolve_dtype`), not the update's. The matmul peak is measured
on the same device in each dtype (8192³ on CUDA, 2048³ on CPU), with CUDA synchronised around every timing, and
``--check`` compares one step of each dtype from the same weights on the same batch.
``--model`` builds a random-init model of a known shape instead of SmolLM2 (nothing is downloaded; the
speed depends on the shape only).

``--fsdp``: instead of the above, the update as two Ray-Train-like ranks run it (two processes, gloo on CPU,
``--workers``), under DDP and under FSDP2 (:mod:`rlcr.train.fsdp`: ``fully_shard`` on each decoder layer and the
root) side by side — each with its own copy of the model and its own AdamW, the same rows, one optimizer step
(:func:`rlcr.train.update.train_update` with ``rank``/``world_size``), rounds interleaved as above. Printed: each
worker's bytes of parameters + gradients + AdamW state at their peak (just after the optimizer step, before the
gradients are freed; DTensors counted by their local shard, :func:`rlcr.train.fsdp.local_state_bytes`; what
FSDP all-gathers for one layer at a time, and activations, come on top), and the update's seconds (the slower
rank's). The last lines are ``fsdp_time_ratio: <median per-round FSDP/DDP seconds>`` and
``fsdp_state_ratio: <FSDP/DDP state bytes of the worker holding most>``.

Run from the repo root:  python bench/perf/update.py [--repeats 4] [--micro-batch-tokens 2048] [--profile]
                         [--dtypes fp32,bf16 --settings new --check]   (a CPU with avx512_bf16)
                         [--device cuda --dtypes fp32,bf16 --model qwen2.5-1.5b --settings new --check]
                         [--device cuda --dtypes bf16 --model qwen2.5-1.5b --settings new --lora]
                         [--fsdp --workers 2 --repeats 3]
The last line is ``update/matmul GFLOP/s: <ratio>`` (the new settings' median per-round ratio); with two dtypes
``update bf16/fp32 speed: <the new setting's median per-round fp32/bf16 time ratio>``.
"""

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import rlcr.train.logprobs as update_mod  # noqa: E402 - CompletionLogProbs calls its token_logprobs
import rlcr.train.update as train_update_mod  # noqa: E402 - the plain step uses its _autocast
from rlcr.config import RLCRConfig  # noqa: E402
from rlcr.train.batching import Sample, collate  # noqa: E402
from rlcr.train.logprobs import CompletionLogProbs  # noqa: E402
from rlcr.train.throughput import cpu_has_bf16  # noqa: E402
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
    """rlcr.core.loss.token_logprobs before the blocked version (dc21110): plain autograd ops."""
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


AUTOCAST = {"fp32": "off", "bf16": "bfloat16"}
"""Each ``--dtypes`` entry as the setting the update runs under (``update.autocast``): fp32 = autocast off, bf16 =
bf16 autocast over the fp32 master weights (what ``auto`` picks on a GPU; on a CPU, the documented option)."""


def dtype_config(extra: dict, dtype: str, **update) -> RLCRConfig:
    """The benchmark's config for one dtype: ``extra`` (dotted overrides), a tiny learning rate, ``update.autocast``."""
    return RLCRConfig.from_dict({**extra, "update": {"learning_rate": 1e-7, "autocast": AUTOCAST[dtype], **update}})


# ----------------------------------------------------------------------------- models

RANDOM_SHAPES = {
    # config.json shapes of the Qwen2.5 instruct checkpoints (tied embeddings), and a tiny one for tests
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, pad_token_id=151643),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, pad_token_id=151643),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024, pad_token_id=0),
}


def build_model(name: str, device: str, seed: int):
    """``(lm, pad_id, vocab, label)``: SmolLM2-135M-Instruct's weights (:func:`rlcr.models.smollm2.prepare_smollm2`),
    or a
    random-init Qwen2 model of a :data:`RANDOM_SHAPES` shape; fp32 on ``device``, SDPA attention, train mode."""
    from transformers import AutoModelForCausalLM

    if name == "smollm2":
        from transformers import AutoTokenizer

        from rlcr.models.smollm2 import prepare_smollm2

        path = prepare_smollm2()
        tok = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        vocab, label = len(tok), "SmolLM2-135M-Instruct"
    else:
        from transformers import Qwen2Config

        shape = dict(RANDOM_SHAPES[name])
        pad_id = shape["pad_token_id"]
        config = Qwen2Config(**shape, tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6)
        torch.manual_seed(seed)
        with torch.device(device):
            lm = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        lm = lm.float()
        vocab, label = shape["vocab_size"], f"{name} (random init, Qwen2 shape)"
    lm.train()
    return lm, pad_id, vocab, label


# ----------------------------------------------------------------------------- steps


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_gflops(n: int = 2048, reps: int = 3, *, device: str = "cpu", dtype: str = "fp32") -> float:
    """:func:`rlcr.train.throughput.matmul_gflops` in ``dtype`` (``fp32``/``bf16``): the flow's own peak figure."""
    from rlcr.train.throughput import matmul_gflops as peak

    return peak(n, reps, device=device, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])


def _timed(fn, device: str = "cpu") -> float:
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t


def check_dtypes(lm, policy, samples, trees, cfgs, pad_id, dtypes, device) -> None:
    """One update step per dtype from the same weights on the same batch: the loss, the gradient norm, the
    masked tokens' log-probs (no grad, before the step), and whether every weight is finite after it."""
    from rlcr.train.batching import collate_prefix_tree

    init = {k: v.detach().to("cpu", copy=True) for k, v in lm.state_dict().items()}  # off the GPU
    res = {}
    for dt in dtypes:
        lm.load_state_dict(init)
        logps = []
        cfg = cfgs[dt]
        with torch.no_grad():
            for t in trees:
                mb = collate_prefix_tree(t, pad_id).to(device)
                with train_update_mod._autocast(torch.device(device), cfg.update.autocast):
                    logps.append(policy(**mb.model_inputs())[0].float())
        m = train_update(policy, samples, cfg, pad_id=pad_id, optimizer=make_optimizer(lm, cfg))
        finite = all(bool(torch.isfinite(p).all()) for p in lm.parameters())
        res[dt] = {"logp": torch.cat(logps), "loss": m["loss"], "grad_norm": m["grad_norm"], "finite": finite,
                   "steps": m["optimizer_steps"]}
        print(f"check {dt}: loss {m['loss']:.6g}, grad_norm {m['grad_norm']:.6g}, mean masked log-prob "
              f"{res[dt]['logp'].mean().item():.6g}, optimizer steps {m['optimizer_steps']}, weights finite after "
              f"the step: {finite}", flush=True)
    lm.load_state_dict(init)
    del init
    if len(dtypes) > 1:
        ref, other = res[dtypes[0]], res[dtypes[-1]]

        def rel(a, b):
            return abs(a - b) / max(abs(a), 1e-30)

        d = (other["logp"] - ref["logp"]).abs()
        print(f"check {dtypes[-1]} vs {dtypes[0]}: loss rel diff {rel(ref['loss'], other['loss']):.2e}, grad_norm rel "
              f"diff {rel(ref['grad_norm'], other['grad_norm']):.2e}, masked NLL rel diff "
              f"{rel(ref['logp'].sum().item(), other['logp'].sum().item()):.2e}, per-token |d log-prob| mean "
              f"{d.mean().item():.3g} max {d.max().item():.3g}", flush=True)


def run_plain(lm, samples, cfg, pad_id, opt) -> None:
    mb = collate(samples, pad_id)
    logits = lm(mb.input_ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             mb.input_ids[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(lm.parameters(), cfg.update.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def warm_up(fns, device: str) -> dict[str, float]:
    """One step of each (the optimizers' state is made here); on CUDA, each one's peak GPU memory (GiB)."""
    peak_mem: dict[str, float] = {}
    for name, fn in fns.items():
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        fn()
        if device == "cuda":
            peak_mem[name] = torch.cuda.max_memory_allocated() / 2 ** 30
    return peak_mem


def time_rounds(fns, dtypes, repeats: int, matmul_n: int, device: str, flop: float):
    """``repeats`` rounds: the matmul peak of each dtype, then one timed step of each setting, in an order rotated
    between rounds so the machine's drift hits all alike; each round printed as it finishes. Returns
    (seconds per setting, matmul GFLOP/s per dtype)."""
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    peaks: dict[str, list[float]] = {dt: [] for dt in dtypes}
    for r in range(repeats):
        for dt in dtypes:
            peaks[dt].append(matmul_gflops(matmul_n, device=device, dtype=dt))
        line = [f"round {r + 1}/{repeats}: " + ", ".join(f"matmul {dt} {peaks[dt][-1]:8.1f} GFLOP/s" for dt in dtypes)]
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(_timed(fns[name], device))
        for name in names:
            line.append(f"{name} {times[name][-1]:6.2f} s {flop / times[name][-1] / 1e9:8.1f} GFLOP/s")
        print(" | ".join(line), flush=True)
    return times, peaks


def summarize(times, peaks, dtype_of, settings, dtypes, flop: float, masked: int, peak_mem) -> dict[str, float]:
    """Medians and ranges over the rounds; each setting's median per-round ratio to the matmul of its dtype
    (returned); with two dtypes, each setting's per-round speed ratio."""
    def spread(xs):
        return f"median {statistics.median(xs):6.1f} (min {min(xs):6.1f}, max {max(xs):6.1f})"

    multi = len(dtypes) > 1
    w = max(7, *(len(n) for n in times), *(len(f"matmul {dt}") for dt in dtypes))
    print(f"{'':<{w}} GFLOP/s over {len(peaks[dtypes[0]])} rounds")
    for dt in dtypes:
        print(f"{(f'matmul {dt}' if multi else 'matmul'):<{w}} {spread(peaks[dt])}")
    ratios = {}
    for name, ts in times.items():
        g = [flop / t / 1e9 for t in ts]
        ratios[name] = statistics.median(x / p for x, p in zip(g, peaks[dtype_of[name]]))
        extra = "" if name.startswith("plain") else f", {masked / statistics.median(ts):.0f} masked tok/s"
        mem = f", peak GPU memory {peak_mem[name]:.1f} GiB" if name in peak_mem else ""
        print(f"{name:<{w}} {spread(g)}, {statistics.median(ts):.2f} s/step, "
              f"{ratios[name]:.2f} of the round's {dtype_of[name]} matmul{extra}{mem}")
    if multi:
        for s in settings:
            per_round = [a / b for a, b in zip(times[f"{s}/{dtypes[0]}"], times[f"{s}/{dtypes[-1]}"])]
            print(f"{s}: {dtypes[-1]}/{dtypes[0]} speed (per-round time ratio) median "
                  f"{statistics.median(per_round):.2f} "
                  f"(min {min(per_round):.2f}, max {max(per_round):.2f})")
    return ratios


def lora_steps(args, samples, pad_id, extra, dtypes):
    """The ``lora`` setting's step per dtype: ``train_update`` on a second copy of the model (same seed) with
    adapters, one AdamW shared by the dtypes."""
    from rlcr.train.lora import wrap_lora

    lora = {"lora": {"enabled": True, "rank": args.lora_rank, "alpha": 2.0 * args.lora_rank}}
    cfgs = {dt: dtype_config({**extra, **lora}, dt) for dt in dtypes}
    cfg = cfgs[dtypes[0]]
    lm, _, _, _ = build_model(args.model, args.device, args.seed)
    torch.manual_seed(args.seed)
    peft_model = wrap_lora(lm, cfg)
    policy = CompletionLogProbs(peft_model.base_model.model)
    opt = make_optimizer(policy, cfg)
    trainable = sum(p.numel() for group in opt.param_groups for p in group["params"])
    print(f"lora: rank {args.lora_rank}, {trainable / 1e6:.2f}M trainable parameters (adapters) in AdamW")

    def step(dt):
        m = train_update(policy, samples, cfgs[dt], pad_id=pad_id, optimizer=opt)
        assert m["optimizer_steps"] == 1, m
    return step


def parse_args():
    """The command line, checked: (args, dtypes, matmul size)."""
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
    ap.add_argument("--lora", action="store_true",
                    help="add the LoRA update (a second copy of the model, adapters only)")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--profile", action="store_true", help="after the rounds, one profiled step per setting")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtypes", default=None,
                    help="comma-separated fp32, bf16 (update.autocast off / bfloat16; bf16 on a CPU needs bf16 "
                         "instructions to pay); default: fp32")
    ap.add_argument("--model", default="smollm2", choices=["smollm2", *RANDOM_SHAPES],
                    help="smollm2 (its weights) or a random-init model of that shape")
    ap.add_argument("--matmul-n", type=int, default=None, help="the matmul's size (default 2048 on CPU, 8192 on cuda)")
    ap.add_argument("--fsdp", action="store_true",
                    help="DDP vs FSDP2 with --workers gloo processes on CPU: state bytes per worker and seconds")
    ap.add_argument("--workers", type=int, default=2, help="--fsdp: ranks (processes)")
    ap.add_argument("--check", action="store_true",
                    help="before the rounds: one step per dtype from the same weights, compared "
                         "(loss, grad norm, log-probs)")
    args = ap.parse_args()
    dtypes = [d for d in (args.dtypes or "fp32").split(",") if d]
    if not dtypes or any(d not in ("fp32", "bf16") for d in dtypes):
        ap.error(f"--dtypes takes fp32 and/or bf16, got {args.dtypes!r}")
    if args.fsdp and (args.device != "cpu" or dtypes != ["fp32"] or args.workers < 2):
        ap.error("--fsdp runs fp32 on CPU (gloo) with --workers >= 2")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    matmul_n = args.matmul_n or (8192 if args.device == "cuda" else 2048)
    return args, dtypes, matmul_n


# ----------------------------------------------------------------------------- --fsdp: DDP vs FSDP2, two ranks


def _mib(n: float) -> str:
    return f"{n / 2 ** 20:.1f} MiB"


def fsdp_rank(rank: int, world: int, args, port: int) -> None:
    """One rank of ``--fsdp`` (a spawned process): both wrappings of the model, the rounds; rank 0 prints."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from rlcr.train.fsdp import local_state_bytes, shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # each rank its share of the cores, as Ray Train's
    try:
        models = {}
        for name in ("ddp", "fsdp"):
            lm, pad_id, vocab, label = build_model(args.model, "cpu", args.seed)
            policy = CompletionLogProbs(lm)
            models[name] = DistributedDataParallel(policy) if name == "ddp" else shard(policy, lm)
        samples = make_samples(args.prompts, args.ga, args.gc, prompt_len=args.prompt_len,
                               answer_len=args.answer_len, query_len=args.query_len,
                               confidence_len=args.confidence_len, vocab=vocab, seed=args.seed)
        extra = {} if args.micro_batch_tokens is None else {"update.micro_batch_tokens": args.micro_batch_tokens}
        cfg = RLCRConfig.from_dict({**extra, "update": {"learning_rate": 1e-7}})
        opts = {name: make_optimizer(m, cfg) for name, m in models.items()}
        peak = {name: {"total": 0} for name in models}

        def after_step(name):
            def hook(opt, *_):  # the gradients still held, AdamW's state made: the state's peak
                now = local_state_bytes(models[name], opt)
                if now["total"] > peak[name]["total"]:
                    peak[name] = now
            return hook
        for name, opt in opts.items():
            opt.register_step_post_hook(after_step(name))
        if rank == 0:
            params = sum(p.numel() for p in {id(p): p for p in models["ddp"].parameters()}.values())
            print(f"--fsdp: model {label}, {params / 1e6:.1f}M parameters, fp32 on cpu, {world} ranks (gloo), torch "
                  f"threads {torch.get_num_threads()} each (os.cpu_count {os.cpu_count()}), {len(samples)} samples, "
                  f"micro_batch_tokens {cfg.update.micro_batch_tokens}, one optimizer step per update", flush=True)

        def step(name):
            dist.barrier()
            t = time.perf_counter()
            m = train_update(models[name], samples, cfg, pad_id=pad_id, rank=rank, world_size=world,
                             optimizer=opts[name])
            dist.barrier()  # the update ends when its slowest rank does
            assert m["optimizer_steps"] == 1, m
            return time.perf_counter() - t, m

        names = list(models)
        for name in names:  # warm-up: AdamW's state is made here
            step(name)
        times: dict[str, list[float]] = {name: [] for name in names}
        losses: dict[str, float] = {}
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:
                dt, m = step(name)
                times[name].append(dt)
                losses[name] = m["loss"]
            if rank == 0:
                print(f"round {r + 1}/{args.repeats}: " + " | ".join(
                    f"{name} {times[name][-1]:6.2f} s" for name in names)
                      + f" | fsdp/ddp {times['fsdp'][-1] / times['ddp'][-1]:.2f}", flush=True)
        gathered: list = [None] * world
        dist.all_gather_object(gathered, peak)
        if rank == 0:
            for name in names:
                for k, p in enumerate(gathered):
                    b = p[name]
                    print(f"{name} worker {k}: parameters {_mib(b['params'])} + gradients {_mib(b['grads'])} + "
                          f"AdamW {_mib(b['optimizer'])} = {_mib(b['total'])} at the peak")
            per_round = [f / d for f, d in zip(times["fsdp"], times["ddp"])]
            for name in names:
                print(f"{name}: {statistics.median(times[name]):.2f} s per update over {args.repeats} rounds (min "
                      f"{min(times[name]):.2f}, max {max(times[name]):.2f}); last loss {losses[name]:.6g}")
            state = max(p["fsdp"]["total"] for p in gathered) / max(p["ddp"]["total"] for p in gathered)
            print(f"fsdp/ddp seconds per round: median {statistics.median(per_round):.2f} (min {min(per_round):.2f}, "
                  f"max {max(per_round):.2f}, n={len(per_round)})")
            print(f"fsdp_time_ratio: {statistics.median(per_round):.3f}")
            print(f"fsdp_state_ratio: {state:.3f}", flush=True)
    finally:
        dist.destroy_process_group()


def run_fsdp(args) -> None:
    """``--fsdp``: spawn the ranks (each loads the model itself, as a Ray Train worker does)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:  # a free port for the ranks' rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(fsdp_rank, args=(args.workers, args, port), nprocs=args.workers, start_method="spawn")


def main() -> None:
    args, dtypes, matmul_n = parse_args()
    if args.fsdp:
        run_fsdp(args)
        return

    from rlcr.train.batching import collate_prefix_tree, pack_prefix_trees

    lm, pad_id, vocab, model_label = build_model(args.model, args.device, args.seed)
    samples = make_samples(args.prompts, args.ga, args.gc, prompt_len=args.prompt_len, answer_len=args.answer_len,
                           query_len=args.query_len, confidence_len=args.confidence_len, vocab=vocab, seed=args.seed)
    extra = {} if args.micro_batch_tokens is None else {"update.micro_batch_tokens": args.micro_batch_tokens}
    cfgs = {dt: dtype_config(extra, dt) for dt in dtypes}
    cfg = cfgs[dtypes[0]]
    budget = cfg.update.micro_batch_tokens
    params = sum(p.numel() for p in lm.parameters())
    trees = pack_prefix_trees(samples, budget)
    tree_tokens = sum(collate_prefix_tree(t, pad_id).padded_tokens for t in trees)
    flop = 6 * params * tree_tokens
    masked = sum(s.masked_tokens for s in samples)
    where = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if args.device == "cuda" else
             f"torch threads {torch.get_num_threads()} (os.cpu_count {os.cpu_count()})")
    bf16_cpu = "" if args.device == "cuda" or "bf16" not in dtypes else f", CPU bf16 instructions {cpu_has_bf16()}"
    print(f"model {model_label}, fp32 weights on {args.device}, update dtypes {','.join(dtypes)}{bf16_cpu}, "
          f"{params / 1e6:.1f}M parameters, {where}, {len(samples)} samples ({args.prompts} prompts x G_a={args.ga} x "
          f"G_c={args.gc}), micro_batch_tokens {budget}")
    print(f"tokens: {sum(s.length for s in samples)} in the samples, {tree_tokens} in {len(trees)} prefix trees "
          f"(GFLOP/s = 6 x params x {tree_tokens} / s), {masked} masked")

    new_policy, old_policy = CompletionLogProbs(lm), DenseTreeMask(lm)
    opts = {"new": make_optimizer(lm, cfg),
            "old": torch.optim.AdamW(lm.parameters(), lr=cfg.update.learning_rate, weight_decay=cfg.update.weight_decay,
                                     betas=tuple(cfg.update.adam_betas)),
            "plain": torch.optim.AdamW(lm.parameters(), lr=cfg.update.learning_rate,
                                       weight_decay=cfg.update.weight_decay, betas=tuple(cfg.update.adam_betas))}

    if args.check:
        check_dtypes(lm, new_policy, samples, trees, cfgs, pad_id, dtypes, args.device)

    def step_new(dt):
        m = train_update(new_policy, samples, cfgs[dt], pad_id=pad_id, optimizer=opts["new"])
        assert m["optimizer_steps"] == 1, m

    def step_old(dt):
        with old_logprobs():
            m = train_update(old_policy, samples, cfgs[dt], pad_id=pad_id, optimizer=opts["old"])
        assert m["optimizer_steps"] == 1, m

    def step_plain(dt):
        with train_update_mod._autocast(torch.device(args.device), cfgs[dt].update.autocast):
            run_plain(lm, samples, cfg, pad_id, opts["plain"])

    base = {"old": step_old, "new": step_new, "plain": step_plain}
    settings = ([n for n in args.settings.split(",") if n]
                + (["plain"] if args.plain and "plain" not in args.settings else []))
    if args.lora or "lora" in settings:
        base["lora"] = lora_steps(args, samples, pad_id, extra, dtypes)
        settings += [] if "lora" in settings else ["lora"]
    # one AdamW per setting, shared by its dtypes (same state shapes; a GPU holds one set of moments less)
    multi = len(dtypes) > 1

    def in_dtype(fn, dt):
        def run():
            fn(dt)
        return run

    fns = {(f"{s}/{dt}" if multi else s): in_dtype(base[s], dt) for dt in dtypes for s in settings}
    dtype_of = {(f"{s}/{dt}" if multi else s): dt for dt in dtypes for s in settings}
    peak_mem = warm_up(fns, args.device)
    times, peaks = time_rounds(fns, dtypes, args.repeats, matmul_n, args.device, flop)
    ratios = summarize(times, peaks, dtype_of, settings, dtypes, flop, masked, peak_mem)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        key = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
        for name in fns:
            with profile(activities=acts) as prof:
                fns[name]()
                _sync(args.device)
            print(f"--- profile: {name} (one step, profiler on)")
            print(prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=50))
    headline = f"new/{dtypes[-1]}" if multi else "new"
    if headline in ratios:
        print(f"update/matmul GFLOP/s: {ratios[headline]:.2f}")
    if multi and "new" in settings:  # the headline: how much faster the last dtype runs the update
        per_round = [a / b for a, b in zip(times[f"new/{dtypes[0]}"], times[f"new/{dtypes[-1]}"])]
        print(f"update {dtypes[-1]}/{dtypes[0]} speed: {statistics.median(per_round):.2f}")


if __name__ == "__main__":
    main()
