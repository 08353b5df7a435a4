"""Rollout rows → samples → mini-batches → token-budget micro-batches (docs/design.md §1, §6, §8).

Pure Python + PyTorch, no Ray: the update loop, the tests and the benchmark call
these directly.

Row order is made global and deterministic first (sorted by the rollout tree
key), so that the partition of one iteration's rows into mini-batches does not
depend on the number of workers: a worker only decides which rows *of each
mini-batch* it processes. No row is ever dropped or duplicated, so the sum of
the workers' losses is the loss of the whole mini-batch.

A micro-batch is either right-padded ``[context | completion | pad]`` rows
(:func:`pack_micro_batches` + :func:`collate`), or, with ``share_prefixes``, one
*prefix tree* (:func:`pack_prefix_trees` + :func:`collate_prefix_tree`): every
token prefix its samples share — the prompt of G_a answers, the turn-2 context of
G_c confidences, the turn-1 prompt + answer inside that context — is one node
sequence computed once; a tree attention mask lets each token see exactly its
own ancestors and position ids are depths, so each sample's log-probs are those
of its own unpacked sequence. On RLCR rollouts this halves to thirds the tokens
the model processes. Either way the completion tensors (mask, advantages, π_old)
are completion-aligned ``[B, L]`` per sample.
Log-probs are only computed at the *selected* positions: the tokens the loss
mask covers (docs/design.md §6), plus, when a micro-batch has none, one dummy position so
every parameter is still in the autograd graph (DDP needs that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from rlcr.core.masks import completion_mask
from rlcr.seeds import mini_batch_seed

__all__ = [
    "Sample",
    "MicroBatch",
    "prepare_samples",
    "plan_mini_batches",
    "shard_rows",
    "pack_micro_batches",
    "collate",
    "pack_prefix_trees",
    "collate_prefix_tree",
    "prefix_tree",
    "TreeSegments",
    "tree_segments",
    "dummy_sample",
    "type_stats",
]


@dataclass
class Sample:
    """One answer or confidence sample, ready for the update."""

    index: int  # position in the global (sorted) order
    context_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    advantage: float
    reward: float = 0.0
    is_confidence: bool = False
    rollout_logprobs: list[float] | None = None  # vLLM's sampling log-probs (π_old for "rollout")

    @property
    def length(self) -> int:
        return len(self.context_ids) + len(self.completion_ids)

    @property
    def tokens(self) -> list[int]:
        return self.context_ids + self.completion_ids

    @property
    def masked_tokens(self) -> int:
        return int(sum(self.loss_mask))


def _as_list(x) -> list | None:
    if x is None:
        return None
    if hasattr(x, "tolist"):
        return x.tolist()
    return list(x)


def _row_key(r: dict[str, Any]) -> tuple:
    cid = r.get("confidence_id")
    return (
        int(r.get("iteration") or 0),
        int(r.get("prompt_id") or 0),
        int(r.get("answer_id") or 0),
        0 if r.get("sample_type") == "answer" else 1,
        -1 if cid is None else int(cid),
    )


def prepare_samples(rows: Iterable[dict[str, Any]], tokenizer=None, *, check_finite: bool = True) -> list[Sample]:
    """Rollout rows (``rollout_schema(task)``) → samples in a global, worker-independent order.

    A null ``loss_mask`` is computed with :func:`rlcr.core.masks.completion_mask` (needs
    ``tokenizer``). Raises ValueError on a missing/non-finite advantage or
    inconsistent lengths (``check_finite=False`` skips the advantage check; only
    tests that inject NaN on purpose use it).
    """
    rows = sorted(rows, key=_row_key)
    out: list[Sample] = []
    for i, r in enumerate(rows):
        where = f"rollout row (prompt_id={r.get('prompt_id')}, answer_id={r.get('answer_id')}, " \
                f"confidence_id={r.get('confidence_id')}, {r.get('sample_type')})"
        st = r.get("sample_type")
        if st not in ("answer", "confidence"):
            raise ValueError(f"{where}: sample_type must be 'answer' or 'confidence'")
        ctx = [int(t) for t in _as_list(r["context_ids"])]
        comp = [int(t) for t in _as_list(r["completion_ids"])]
        mask = _as_list(r.get("loss_mask"))
        if mask is None:
            if tokenizer is None:
                raise ValueError(f"{where}: loss_mask is null and no tokenizer was given to compute it")
            mask = completion_mask(tokenizer, comp, r["completion_text"], st)
        mask = [int(m) for m in mask]
        if len(mask) != len(comp):
            raise ValueError(f"{where}: loss_mask has {len(mask)} entries for {len(comp)} completion tokens")
        if any(m not in (0, 1) for m in mask):
            raise ValueError(f"{where}: loss_mask must hold only 0/1")
        if not ctx and comp:
            raise ValueError(f"{where}: empty context (the first completion token has no predicting position)")
        lps = _as_list(r.get("completion_logprobs"))
        if lps is not None:
            lps = [float(x) for x in lps]
            if len(lps) != len(comp):
                raise ValueError(f"{where}: completion_logprobs has {len(lps)} entries for {len(comp)} tokens")
        adv = r.get("advantage")
        if adv is None:
            raise ValueError(f"{where}: advantage is missing (run rlcr.rollout.records.assign_advantages first)")
        adv = float(adv)
        if check_finite and not math.isfinite(adv):
            raise ValueError(f"{where}: non-finite advantage {adv}")
        out.append(Sample(
            index=i, context_ids=ctx, completion_ids=comp, loss_mask=mask, advantage=adv,
            reward=float(r.get("reward") or 0.0), is_confidence=(st == "confidence"), rollout_logprobs=lps,
        ))
    return out


def plan_mini_batches(n: int, *, epochs: int, mini_batches: int, seed: int) -> list[list[list[int]]]:
    """``plan[epoch][k]`` = global row indices of mini-batch k: a seeded permutation per
    epoch (seeded by :func:`rlcr.seeds.mini_batch_seed`) split into ``mini_batches`` near-equal
    parts (some empty when n is small). Identical on every worker."""
    plan = []
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(mini_batch_seed(seed, epoch))
        perm = torch.randperm(n, generator=g).tolist()
        bounds = [round(k * n / mini_batches) for k in range(mini_batches + 1)]
        plan.append([sorted(perm[bounds[k]:bounds[k + 1]]) for k in range(mini_batches)])
    return plan


def shard_rows(indices: Sequence[int], samples: Sequence[Sample], rank: int, world_size: int) -> list[int]:
    """The rows of one mini-batch this rank processes: sorted by length (longest
    first), dealt round-robin so the workers' token loads are balanced. A rank may
    get none (it then still takes part in every collective, with zero loss)."""
    order = sorted(indices, key=lambda i: (-samples[i].length, i))
    return order[rank::world_size]


def pack_micro_batches(samples: Sequence[Sample], token_budget: int) -> list[list[Sample]]:
    """Greedy packing by padded size: a micro-batch's ``rows × max_length`` stays within
    ``token_budget`` (a single longer row gets a micro-batch of its own)."""
    ordered = sorted(samples, key=lambda s: (-s.length, s.index))
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    for s in ordered:
        width = max([s.length] + [c.length for c in cur])
        if cur and width * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


def dummy_sample(pad_id: int) -> Sample:
    """A one-token sample with an all-zero mask: the micro-batch of a rank with no rows."""
    return Sample(index=-1, context_ids=[pad_id], completion_ids=[pad_id], loss_mask=[0], advantage=0.0)


@dataclass
class MicroBatch:
    """Padded tensors of one micro-batch (``B`` rows, ``T`` padded length, ``L`` longest completion)."""

    input_ids: torch.Tensor  # [R, T] long: R right-padded rows (R = B), or one prefix tree (R = 1)
    loss_mask: torch.Tensor  # [B, L] float, completion-aligned
    advantages: torch.Tensor  # [B] float (sequence advantage; token advantage = λ·A·M)
    is_confidence: torch.Tensor  # [B] bool
    sel_row: torch.Tensor  # [N] sample (row of the [B, L] tensors) of each selected completion token
    sel_col: torch.Tensor  # [N] its column in the completion ([B, L] layout)
    sel_pos: torch.Tensor  # [N] the input position whose logits predict it (padded: ctx_len + col − 1)
    sel_label: torch.Tensor  # [N] the token id
    indices: list[int] = field(default_factory=list)  # sample indices (−1 for a dummy)
    rollout_logprobs: torch.Tensor | None = None  # [B, L] or None when any row lacks them
    sel_seq: torch.Tensor | None = None  # [N] input row holding sel_pos (None: = sel_row)
    position_ids: torch.Tensor | None = None  # [R, T] (prefix tree: token depths); None: 0..T−1
    attention_mask: torch.Tensor | None = None  # [R, 1, T, T] bool, True = may attend; None: causal
    tree: "TreeSegments | None" = None  # prefix tree: the same mask as chains of nodes (sparse attention)

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`rlcr.train.logprobs.CompletionLogProbs`."""
        return {
            "input_ids": self.input_ids, "sel_seq": self.sel_row if self.sel_seq is None else self.sel_seq,
            "sel_pos": self.sel_pos, "sel_label": self.sel_label, "position_ids": self.position_ids,
            "attention_mask": self.attention_mask, "tree": self.tree,
        }

    @property
    def masked_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device) -> "MicroBatch":
        moved = {k: (v.to(device) if isinstance(v, (torch.Tensor, TreeSegments)) else v)
                 for k, v in self.__dict__.items()}
        return MicroBatch(**moved)


def _micro_batch(samples: Sequence[Sample], positions: Sequence[Sequence[int]], pad_id: int,
                 **inputs) -> MicroBatch:
    """The completion-aligned ``[B, L]`` side of a micro-batch and its selected tokens.

    ``positions[i][t]``: the input position of token ``t`` of sample ``i``'s
    ``context + completion``; completion token ``j`` is predicted by the logits at
    ``positions[i][ctx_len + j − 1]``. ``inputs``: the input-side fields.
    """
    b = len(samples)
    l_max = max(1, max(len(s.completion_ids) for s in samples))
    mask = torch.zeros(b, l_max)
    have_lp = all(s.rollout_logprobs is not None for s in samples)
    old = torch.zeros(b, l_max) if have_lp else None
    rows, cols, poss, labels = [], [], [], []
    for i, (s, pos) in enumerate(zip(samples, positions)):
        c, n = len(s.context_ids), len(s.completion_ids)
        if n:
            mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
            if old is not None:
                old[i, :n] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        for j, m in enumerate(s.loss_mask):
            if m:
                rows.append(i), cols.append(j), poss.append(pos[c + j - 1]), labels.append(s.completion_ids[j])
    if not rows:  # keep every parameter in the graph: one selected token with mask 0
        s = samples[0]
        rows, cols = [0], [0]
        poss, labels = [positions[0][len(s.context_ids) - 1]], [s.completion_ids[0] if s.completion_ids else pad_id]
    return MicroBatch(
        loss_mask=mask,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        is_confidence=torch.tensor([s.is_confidence for s in samples], dtype=torch.bool),
        sel_row=torch.tensor(rows, dtype=torch.long),
        sel_col=torch.tensor(cols, dtype=torch.long),
        sel_pos=torch.tensor(poss, dtype=torch.long),
        sel_label=torch.tensor(labels, dtype=torch.long),
        indices=[s.index for s in samples],
        rollout_logprobs=old,
        **inputs,
    )


def collate(samples: Sequence[Sample], pad_id: int) -> MicroBatch:
    """Right-pad samples into a :class:`MicroBatch`; select the masked completion tokens."""
    input_ids = torch.full((len(samples), max(s.length for s in samples)), int(pad_id), dtype=torch.long)
    for i, s in enumerate(samples):
        input_ids[i, : s.length] = torch.tensor(s.tokens, dtype=torch.long)
    return _micro_batch(samples, [range(s.length) for s in samples], pad_id, input_ids=input_ids)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _tree_order(samples: Sequence[Sample]) -> list[Sample]:
    """Lexicographic by token sequence: samples sharing a prefix become neighbours."""
    return sorted(samples, key=lambda s: (s.tokens, s.index))


def prefix_tree(seqs: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """Token sequences → their prefix tree, flattened in depth-first pre-order.

    Returns ``(tokens, depth, end, paths)``: node ``k`` holds ``tokens[k]`` at
    sequence position ``depth[k]``; its subtree is nodes ``k .. end[k]−1``, so node
    ``j`` is an ancestor-or-self of ``k`` iff ``j ≤ k < end[j]``; ``paths[i][t]`` is
    the node of token ``t`` of ``seqs[i]``. Shared prefixes are stored once
    (identical sequences share one path).
    """
    order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
    tokens: list[int] = []
    depth: list[int] = []
    parent: list[int] = []
    paths: list[list[int]] = [[] for _ in seqs]
    prev: Sequence[int] = ()
    prev_path: list[int] = []
    for i in order:
        seq = seqs[i]
        keep = _common_prefix(prev, seq)
        path = prev_path[:keep]
        for t in range(keep, len(seq)):
            parent.append(path[-1] if path else -1)
            path.append(len(tokens))
            tokens.append(int(seq[t]))
            depth.append(t)
        paths[i], prev, prev_path = path, seq, path
    end = [k + 1 for k in range(len(tokens))]
    for k in range(len(tokens) - 1, -1, -1):  # children come after their parent in pre-order
        if parent[k] >= 0:
            end[parent[k]] = max(end[parent[k]], end[k])
    return tokens, depth, end, paths


def pack_prefix_trees(samples: Sequence[Sample], token_budget: int) -> list[list[Sample]]:
    """Greedy packing into prefix trees of at most ``token_budget`` nodes each (a single
    longer sample gets a tree of its own). Samples are taken in token order, so the
    ones sharing a prefix land in the same tree."""
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    nodes = 0
    prev: list[int] = []
    for s in _tree_order(samples):
        seq = s.tokens
        new = len(seq) - _common_prefix(prev, seq)
        if cur and nodes + new > token_budget:
            out.append(cur)
            cur, nodes, new = [], 0, len(seq)
        cur.append(s)
        nodes += new
        prev = seq
    if cur:
        out.append(cur)
    return out


@dataclass
class TreeSegments:
    """A prefix tree's attention mask as *segments*: maximal chains of nodes (each the parent of the
    next), contiguous in pre-order and covering all nodes in order.

    Segment ``s`` = nodes ``bounds[s] = (a, b)``; its queries see the ancestors of node ``a`` (every
    node of them, a fixed key set) and, causally, the segment itself. Its keys are
    ``key_index[offset_s : offset_s + sizes[s]]`` (the ancestors, then ``a .. b−1``) and
    ``masks[s]`` (``[b−a, sizes[s]]`` bool, True = may attend) is the tree mask restricted to those
    queries and keys: every key outside them is masked for these queries. Attention computed per
    segment over its keys alone is therefore the dense tree-masked attention (masked keys weigh
    exactly 0), up to float reassociation, at the cost of the visible pairs instead of ``T²``
    (:func:`rlcr.train.logprobs.tree_sdpa_attention`).
    """

    bounds: list[tuple[int, int]]
    sizes: list[int]
    key_index: torch.Tensor  # [Σ sizes] long
    masks: list[torch.Tensor]

    def to(self, device) -> "TreeSegments":
        return TreeSegments(self.bounds, self.sizes, self.key_index.to(device), [m.to(device) for m in self.masks])


def tree_segments(depth: Sequence[int], visible: torch.Tensor) -> TreeSegments:
    """The :class:`TreeSegments` of a pre-order prefix tree: node depths and its ``[T, T]`` mask."""
    t = len(depth)
    starts = [k for k in range(t) if k == 0 or depth[k] != depth[k - 1] + 1] + [t]  # k−1 is k's parent iff depth+1
    bounds, sizes, index, masks = [], [], [], []
    for a, b in zip(starts[:-1], starts[1:]):
        anc = visible[a, :a].nonzero().squeeze(-1)
        m = b - a
        bounds.append((a, b))
        sizes.append(len(anc) + m)
        index.append(torch.cat([anc, torch.arange(a, b)]))
        masks.append(torch.cat([torch.ones(m, len(anc), dtype=torch.bool),
                                torch.ones(m, m, dtype=torch.bool).tril()], 1))
    return TreeSegments(bounds, sizes, torch.cat(index), masks)


def collate_prefix_tree(samples: Sequence[Sample], pad_id: int) -> MicroBatch:
    """One prefix tree of ``samples`` as a single input row with a tree attention mask.

    The completion-aligned tensors keep one row per sample, in the given order;
    a selected token's logits come from the tree node of the token before it.
    """
    tokens, depth, end, paths = prefix_tree([s.tokens for s in samples])
    k = torch.arange(len(tokens))
    visible = (k[None, :] <= k[:, None]) & (k[:, None] < torch.tensor(end)[None, :])  # [query, key]: an ancestor
    mb = _micro_batch(samples, paths, pad_id, input_ids=torch.tensor([tokens], dtype=torch.long),
                      position_ids=torch.tensor([depth], dtype=torch.long), attention_mask=visible[None, None],
                      tree=tree_segments(depth, visible))
    mb.sel_seq = torch.zeros_like(mb.sel_pos)
    return mb


def type_stats(samples: Sequence[Sample]) -> dict[str, float]:
    """Per sample type: count, reward mean/std, advantage mean, completion length mean, masked tokens
    (docs/design.md §8)."""
    out: dict[str, float] = {}
    for name, want in (("answer", False), ("confidence", True)):
        sel = [s for s in samples if s.is_confidence == want]
        n = len(sel)
        out[f"{name}/samples"] = float(n)
        if not n:
            continue
        r = torch.tensor([s.reward for s in sel], dtype=torch.float64)
        out[f"{name}/reward_mean"] = float(r.mean())
        out[f"{name}/reward_std"] = float(r.std(unbiased=False))
        out[f"{name}/advantage_mean"] = float(sum(s.advantage for s in sel) / n)
        out[f"{name}/completion_len_mean"] = float(sum(len(s.completion_ids) for s in sel) / n)
        out[f"{name}/masked_tokens"] = float(sum(s.masked_tokens for s in sel))
    return out
