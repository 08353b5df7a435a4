"""log π at selected tokens (docs/design.md §11): :class:`CompletionLogProbs`, the module DDP/FSDP wrap, and
the prefix-tree attention it gives an SDPA model.

A prefix tree (``share_prefixes``, :func:`rlcr.train.batching.pack_prefix_trees`) is run with a tree mask;
:func:`tree_sdpa_attention` computes only the pairs that mask lets through, segment by segment, and is plain
SDPA wherever no tree is passed. No Ray, no optimizer: :mod:`rlcr.train.update` drives it.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from rlcr.core.loss import token_logprobs

__all__ = ["CompletionLogProbs", "TREE_ATTENTION", "tree_sdpa_attention"]


TREE_ATTENTION = "rlcr_tree_sdpa"
"""The attention implementation :class:`CompletionLogProbs` gives an SDPA model: SDPA, except on a
prefix tree with its :class:`~rlcr.train.batching.TreeSegments`, where :func:`tree_sdpa_attention`
computes only the pairs the tree mask lets through."""


def tree_sdpa_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        rlcr_tree=None, **kwargs) -> tuple[torch.Tensor, None]:
    """A transformers attention function: with ``rlcr_tree`` (one prefix tree, ``query`` ``[1, H, T, D]``)
    each segment's queries attend over its own keys only — the ancestors and, causally, the segment,
    gathered once per layer — with SDPA and the segment's slice of the tree mask; else plain SDPA
    (transformers' own function, so a model without a tree computes exactly as with ``"sdpa"``).

    The dense ``[T, T]`` tree mask makes SDPA compute all T² pairs (the CPU kernels skip no masked
    block); an RLCR tree of ~2k nodes has ~10× fewer visible pairs. Masked keys weigh exactly 0 in
    the dense softmax, so the result is the dense one up to float reassociation.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if rlcr_tree is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"tree attention takes one prefix-tree row, got {query.shape[0]}")
    gqa = query.shape[1] != key.shape[1]
    dtype = query.dtype
    fp32 = query.device.type == "cpu" and torch.is_autocast_enabled("cpu")  # update.autocast=bfloat16 on CPU
    if fp32:
        # torch's CPU flash-attention backward is slower in bf16 than in fp32 (SmolLM2 update: 3.1 s vs 1.8 s a
        # step, docs/update-performance.md): the attention runs in fp32, outside autocast (which would cast back)
        query, key, value = query.float(), key.float(), value.float()
    # split, not slices: the backward of a split is one cat (a slice's is a zero-filled [1, H, T, D] each)
    queries = query.split([b - a for a, b in rlcr_tree.bounds], 2)
    keys = key.index_select(2, rlcr_tree.key_index).split(rlcr_tree.sizes, 2)
    values = value.index_select(2, rlcr_tree.key_index).split(rlcr_tree.sizes, 2)
    with torch.autocast("cpu", enabled=False) if fp32 else contextlib.nullcontext():
        outs = [
            torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                                             scale=scaling, enable_gqa=gqa)
            for q, k, v, mask in zip(queries, keys, values, rlcr_tree.masks)
        ]
    return torch.cat(outs, 2).transpose(1, 2).contiguous().to(dtype), None


def _register_tree_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(TREE_ATTENTION, tree_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(TREE_ATTENTION, sdpa_mask)


class CompletionLogProbs(nn.Module):
    """A causal LM whose forward returns log π of selected tokens only.

    ``forward(input_ids [R,T], sel_seq [N], sel_pos [N], sel_label [N], position_ids,
    attention_mask, tree)`` runs the backbone once (optionally on a packed prefix tree:
    depth position ids and a ``[R,1,T,T]`` tree mask), applies the output head to
    the N hidden states that predict the selected tokens (not to all R·T
    positions) and returns ``(logp [N], entropy [N] | None)``. Wrapping the whole computation in one module lets DDP
    see one forward per micro-batch. Logits are taken as they are (temperature 1),
    like vLLM's default raw sampling log-probs.

    An SDPA model is switched to :data:`TREE_ATTENTION` (SDPA itself wherever no ``tree`` is passed),
    so a prefix tree's attention costs its visible pairs, not T² (``tree``: its
    :class:`~rlcr.train.batching.TreeSegments`; other attention implementations use the dense mask).
    """

    def __init__(self, lm: nn.Module, *, chunk_rows: int = 1024):
        super().__init__()
        self.lm = lm
        self.chunk_rows = chunk_rows
        config = getattr(lm, "config", None)
        if getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(lm, "set_attn_implementation"):
            _register_tree_attention()
            lm.set_attn_implementation(TREE_ATTENTION)

    def forward(self, input_ids, sel_seq, sel_pos, sel_label, *, position_ids=None, attention_mask=None,
                tree=None, entropy: str = "none"):
        backbone = self.lm.base_model
        extra = ({"rlcr_tree": tree} if tree is not None and self.lm.config._attn_implementation == TREE_ATTENTION
                 else {})
        hidden = backbone(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                          use_cache=False, **extra).last_hidden_state
        logits = self.lm.get_output_embeddings()(hidden[sel_seq, sel_pos])
        if entropy == "none":
            return token_logprobs(logits, sel_label, chunk_rows=self.chunk_rows)
        return token_logprobs(logits, sel_label, return_entropy=True, entropy_grad=entropy == "grad",
                              chunk_rows=self.chunk_rows)
