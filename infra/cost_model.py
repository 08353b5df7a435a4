"""Per-iteration cost of an RLCR iteration at 1.5B and 7B on H100s, on paper.

    python infra/cost_model.py            # Markdown tables (the ones in infra/README.md, "Scale on paper")

Pure arithmetic (standard library only): every figure is computed from the constants below, each of which
is either read from this repository (configs/gpu.yaml, the code), measured here, taken from a model card or
datasheet, or an explicit assumption. Change one and re-run; nothing here was measured on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9

# ----------------------------------------------------------------------------- the workload (configs/gpu.yaml)
P = 32        # prompts_per_iteration
G_A = 8       # num_generations_answer
G_C = 4       # num_generations_confidence
A_MAX = 512   # max_answer_tokens      (upper bound on an answer's length; real answers stop earlier)
C_MAX = 128   # max_confidence_tokens
EVAL_TASKS = 512  # num_eval_tasks: one answer + one confidence each, every `eval_every` iterations (default 1)
MICRO_BATCH_TOKENS = 16384  # micro_batch_tokens: nodes of one prefix tree

# Rendered prompt lengths, measured in this repo with SmolLM2's tokenizer (ChatML, the same chat layout as
# Qwen2.5; Qwen's BPE differs, so read them as ±20%): the turn-1 prompt is 114-119 tokens for 3-4 numbers,
# and turn 2 adds 49 tokens after the answer (end of the assistant turn + the confidence query + the
# assistant header).
P1 = 120      # turn-1 prompt (system + task + assistant header)
Q = 50        # turn-2 tokens between the answer and the confidence


@dataclass(frozen=True)
class Model:
    name: str
    params: int        # from the config: q/k/v (+bias), o, 3 MLP mats, 2 norms per layer, embeddings, lm_head
    layers: int
    hidden: int        # = attention width (heads × head_dim) for Qwen2.5
    kv_heads: int
    head_dim: int

    @property
    def kv_bytes_per_token(self) -> int:  # K and V, every layer, bf16
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


# Qwen2.5 configs (config.json of the -Instruct checkpoints): 1.5B: hidden 1536, 28 layers, 12 heads, 2 KV heads,
# MLP 8960, vocab 151936, tied embeddings; 7B: hidden 3584, 28 layers, 28 heads, 4 KV heads, MLP 18944,
# vocab 152064, untied. Parameter counts computed from them (model cards: 1.54B and 7.61B).
QWEN_1_5B = Model("Qwen2.5-1.5B-Instruct", 1_543_714_304, 28, 1536, 2, 128)
QWEN_7B = Model("Qwen2.5-7B-Instruct", 7_615_616_512, 28, 3584, 4, 128)

# ----------------------------------------------------------------------------- hardware (H100 SXM 80GB)
PEAK_BF16 = 989e12      # FLOP/s, dense BF16 tensor cores (NVIDIA datasheet: 1,979 TFLOPS with sparsity)
HBM = 3.35e12           # B/s, HBM3 (NVIDIA datasheet)
NVLINK = 450e9          # B/s per direction (900 GB/s total NVLink 4, NVIDIA datasheet)

# ----------------------------------------------------------------------------- assumptions (not measured here)
DECODE_BW_EFF = 0.5     # share of HBM bandwidth a decode step achieves (weights + KV read once per step)
STEP_OVERHEAD = 0.002   # s per decode step outside the GPU kernels (scheduling, sampling, log-probs)
PREFILL_MFU = 0.5       # prefill is large dense matmuls
TRAIN_MFU = 0.25        # the update: fp32 master weights + bf16 autocast, dense masked attention over prefix
#                         trees (no flash kernel for arbitrary masks), small batches; well below the 38-43% of
#                         a tuned pretraining stack (Llama 3 paper, 405B on 16k H100s)
S3_BW = 0.85e9          # B/s per file: s3fs moves a file in 50 MiB parts, 10 at a time (max_concurrency=10),
#                         and AWS's guideline is ~85-90 MB/s per connection; files go one after another
LOCAL_DISK_BW = 2e9     # B/s: the checkpoint is written to a local temp dir first, then uploaded
SYNC_BW = 5e9           # B/s end to end for the in-memory sync through Ray's object store: GPU→CPU copy,
#                         ray.put into /dev/shm, the engine's ray.get, CPU→GPU (four full copies)
NCCL_BW = 200e9         # B/s achieved by an intra-node NCCL broadcast over NVLink (~45% of one direction)

# ----------------------------------------------------------------------------- measured here (CPU)
FSDP_STATE_OVERHEAD = 1.00  # a worker's sharded state (params + grads + AdamW) / (DDP's ÷ workers): FSDP2 on
#                             SmolLM2, 2 gloo workers, bench/perf/update.py --fsdp (1,026.3 of 2,052.5 MiB per
#                             worker, ratio 0.500 on both, n = 3 rounds, 2026-12-03); layers gathered while they run
#                             and activations are counted separately (below)


def decode_time(m: Model, batch: int, steps: int, ctx_avg: float) -> float:
    """Seconds for `steps` decode steps of `batch` sequences whose context averages `ctx_avg` tokens.

    A step reads the bf16 weights once and every sequence's KV cache once (memory-bound), or does
    2·N FLOPs per sequence plus attention (compute-bound), whichever is slower.
    """
    mem = (2 * m.params + batch * ctx_avg * m.kv_bytes_per_token) / (DECODE_BW_EFF * HBM)
    flops = batch * (2 * m.params + 4 * m.layers * m.hidden * ctx_avg)
    return steps * (max(mem, flops / (PREFILL_MFU * PEAK_BF16)) + STEP_OVERHEAD)


def prefill_time(m: Model, tokens: float) -> float:
    return 2 * m.params * tokens / (PREFILL_MFU * PEAK_BF16)


def generation(m: Model, prompts: int, g_a: int, g_c: int) -> dict:
    """One answer stage then one confidence stage, every sequence run to its max length (upper bound).

    The answer stage decodes prompts·g_a sequences for A_MAX steps; the confidence stage decodes
    prompts·g_a·g_c sequences for C_MAX steps over contexts of P1 + A_MAX + Q (+ growing confidence).
    Assumes vLLM schedules the whole batch at once (max_num_seqs ≥ 1024: vLLM's default for offline
    `LLM` on ≥ 70 GiB GPUs) and that the KV cache holds it (checked in `kv_need`).
    """
    n_ans, n_conf = prompts * g_a, prompts * g_a * g_c
    t_ans = decode_time(m, n_ans, A_MAX, P1 + A_MAX / 2)
    t_conf = decode_time(m, n_conf, C_MAX, P1 + A_MAX + Q + C_MAX / 2)
    # prefill without prefix-cache hits on the answers (worst case); a prompt's samples share it (APC)
    t_pre = prefill_time(m, prompts * P1 + n_ans * (A_MAX + Q))
    return {"answer_tokens": n_ans * A_MAX, "confidence_tokens": n_conf * C_MAX,
            "t_answer": t_ans, "t_confidence": t_conf, "t_prefill": t_pre, "t": t_ans + t_conf + t_pre,
            "kv_need": (n_ans * (P1 + A_MAX + Q) + n_conf * C_MAX) * m.kv_bytes_per_token}


def tree_tokens_per_prompt() -> int:
    """Prefix-tree nodes of one prompt: its turn-1 prompt once, then per answer the answer, the turn-2
    query and the G_C confidences (each answer's turn-2 context starts with the prompt and that answer)."""
    return P1 + G_A * (A_MAX + Q + G_C * C_MAX)


def padded_tokens_per_prompt() -> int:
    """The same samples as separate rows: every answer and every confidence repeats its whole context."""
    return G_A * (P1 + A_MAX) + G_A * G_C * (P1 + A_MAX + Q + C_MAX)


def update(m: Model, gpus: int) -> dict:
    """FLOPs of one iteration's update: π_old recompute (1 forward) + 1 epoch of forward+backward.

    Linear layers: 2·N FLOPs per token forward, 4·N backward → 8·N per tree node in all. Attention over a
    tree of T nodes with a dense T×T mask: 4·L·T²·d forward (QKᵀ and AV), 8·L·T²·d backward → 16·L·T²·d.
    One prompt's tree per micro-batch (two would exceed micro_batch_tokens).
    """
    t = tree_tokens_per_prompt()
    assert 2 * t > MICRO_BATCH_TOKENS >= t
    linear = 8 * m.params * t * P
    attention = 16 * m.layers * t * t * m.hidden * P
    flops = linear + attention
    return {"tree_tokens": t * P, "padded_tokens": padded_tokens_per_prompt() * P, "flops": flops,
            "attention_share": attention / flops, "t": flops / (TRAIN_MFU * PEAK_BF16 * gpus)}


def trainer_memory(m: Model, gpus: int) -> float:
    """Bytes per trainer GPU: fp32 weights + fp32 grads + AdamW moments (16 B/param, sharded over `gpus` by
    FSDP), bf16 activations of one prefix tree (≈ 34·hidden bytes per token and layer without recomputation,
    Korthikanti et al. 2022, attention scores not materialised), fp32 log-probs over the vocabulary at the
    tree's completion positions (the upper bound if the chunked log-softmax is not used)."""
    t = tree_tokens_per_prompt()
    states = 16 * m.params / gpus * FSDP_STATE_OVERHEAD
    activations = 34 * m.hidden * m.layers * t
    vocab = 151936 if m is QWEN_1_5B else 152064
    logits = 4 * vocab * G_A * (A_MAX + G_C * C_MAX)
    return states + activations + logits


def checkpoint(m: Model) -> dict:
    """Full training state: fp32 weights (4 B/param) + AdamW first and second moments (8 B/param)."""
    b = 12 * m.params
    return {"bytes": b, "t_local": b / LOCAL_DISK_BW, "t_s3": b / S3_BW, "t": b / LOCAL_DISK_BW + b / S3_BW}


def weight_sync(m: Model) -> dict:
    bf16, fp32 = 2 * m.params, 4 * m.params
    return {"bf16": bf16, "fp32": fp32, "t_store_bf16": bf16 / SYNC_BW, "t_store_fp32": fp32 / SYNC_BW,
            "t_nccl_bf16": bf16 / NCCL_BW}


def one_step_off(gen: float, upd: float, sync: float) -> dict:
    """A steady one-step-off iteration (``orchestration.mode: one-step-off``, docs/design.md §12.1): the next
    rollouts are generated during the update and the weights synced once both are done, so an iteration takes
    max(generation, update) + sync, and the device whose part is shorter waits for the other. Evaluation and
    checkpoints are added as in sync mode (evaluation runs on the engines after the sync, the trainer waiting)."""
    t = max(gen, upd) + sync
    return {"t": t, "engine_idle": (t - gen) / t, "trainer_idle": (t - upd) / t}


def fmt_s(x: float) -> str:
    return f"{x:.1f} s" if x < 100 else f"{x:.0f} s"


def report() -> str:
    setups = [(QWEN_1_5B, 1, "1 engine GPU + 1 trainer GPU (DDP, num_workers: 1)"),
              (QWEN_7B, 4, "1 engine GPU + 4 trainer GPUs (FSDP, num_workers: 4)")]
    lines = [f"Workload (configs/gpu.yaml): P={P}, G_a={G_A}, G_c={G_C}, answers ≤ {A_MAX} tokens, confidences "
             f"≤ {C_MAX}, turn-1 prompt ≈ {P1}, turn-2 query ≈ {Q}; held-out set {EVAL_TASKS} tasks.", ""]
    head = "| per iteration | " + " | ".join(f"{m.name} ({desc})" for m, _, desc in setups) + " |"
    lines += [head, "|---|" + "---|" * len(setups)]
    rows: dict[str, list[str]] = {}

    def add(k, v):
        rows.setdefault(k, []).append(v)

    for m, gpus, _ in setups:
        g = generation(m, P, G_A, G_C)
        e = generation(m, EVAL_TASKS, 1, 1)
        u = update(m, gpus)
        c = checkpoint(m)
        s = weight_sync(m)
        add("generated tokens (answers + confidences)",
            f"{g['answer_tokens']:,} + {g['confidence_tokens']:,} = {g['answer_tokens'] + g['confidence_tokens']:,}")
        add("KV cache the rollout needs at once (bf16)", f"{g['kv_need'] / GB:.1f} GB "
            f"({m.kv_bytes_per_token:,} B/token)")
        add("generation time (answer / confidence / prefill)",
            f"**{fmt_s(g['t'])}** ({fmt_s(g['t_answer'])} / {fmt_s(g['t_confidence'])} / {fmt_s(g['t_prefill'])})")
        add(f"held-out evaluation ({EVAL_TASKS} × (answer + confidence))",
            f"{EVAL_TASKS * (A_MAX + C_MAX):,} tokens, {fmt_s(e['t'])}")
        add("update tokens: prefix trees vs padded rows",
            f"{u['tree_tokens']:,} vs {u['padded_tokens']:,} ({u['padded_tokens'] / u['tree_tokens']:.2f}×)")
        add("update FLOPs (attention share)", f"{u['flops']:.2e} ({u['attention_share']:.0%})")
        add("update time", f"**{fmt_s(u['t'])}** on {gpus} GPU{'s' if gpus > 1 else ''}")
        mem = f"{trainer_memory(m, gpus) / GB:.0f} GB of 80"
        if gpus > 1:
            mem += f" (FSDP over {gpus // 2}: {trainer_memory(m, gpus // 2) / GB:.0f} GB, does not fit)"
        add("trainer memory per GPU (states + activations + logits)", mem)
        add("weight sync bytes: bf16 / fp32 (what the trainer holds)",
            f"{s['bf16'] / GB:.1f} GB / {s['fp32'] / GB:.1f} GB")
        add("weight sync time: object store bf16 / fp32; NCCL bf16",
            f"{fmt_s(s['t_store_bf16'])} / {fmt_s(s['t_store_fp32'])}; {s['t_nccl_bf16']:.2f} s")
        add("checkpoint bytes (12 B/param)", f"{c['bytes'] / GB:.1f} GB")
        add("checkpoint time (local write + S3 upload)",
            f"**{fmt_s(c['t'])}** ({fmt_s(c['t_local'])} + {fmt_s(c['t_s3'])})")
        core = g["t"] + u["t"] + s["t_store_fp32"]
        add("**iteration: generation + update + fp32 sync**", f"**{fmt_s(core)}**")
        add("… idle: engine GPU / trainer GPUs (sync mode)",
            f"{(core - g['t']) / core:.0%} / {(core - u['t']) / core:.0%}")
        off = one_step_off(g["t"], u["t"], s["t_store_fp32"])
        add("**one-step-off iteration: max(generation, update) + fp32 sync**",
            f"**{fmt_s(off['t'])}** ({off['t'] / core:.2f}× sync; idle: engine {off['engine_idle']:.0%}, "
            f"trainer {off['trainer_idle']:.0%})")
        for save_every, eval_every in ((1, 1), (5, 5), (10, 10)):
            t = core + e["t"] / eval_every + c["t"] / save_every
            add(f"… + eval every {eval_every}, checkpoint every {save_every} (amortised)",
                f"{fmt_s(t)}: checkpoint {c['t'] / save_every / t:.0%}, eval {e['t'] / eval_every / t:.0%}, "
                f"update {u['t'] / t:.0%}, generation {g['t'] / t:.0%}")
    for k, v in rows.items():
        lines.append(f"| {k} | " + " | ".join(v) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
