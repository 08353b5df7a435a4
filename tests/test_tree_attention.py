"""The update's CPU fast paths compute what the plain paths compute (docs/update-performance.md).

* prefix-tree attention per segment (:func:`rlcr.train.logprobs.tree_sdpa_attention`) = SDPA with the
  dense ``[T, T]`` tree mask, forward and backward;
* :func:`rlcr.core.loss.token_logprobs` (blocked, one gradient buffer) = log-softmax + gather under plain
  autograd, forward and backward, float32 and bfloat16.
"""

import torch

from rlcr.core.loss import token_logprobs
from rlcr.train.batching import collate_prefix_tree, prefix_tree, prepare_samples, tree_segments
from rlcr.train.logprobs import TREE_ATTENTION, CompletionLogProbs
from test_train import load_lm, make_rows


def _dense_visible(seqs):
    tokens, depth, end, _ = prefix_tree(seqs)
    k = torch.arange(len(tokens))
    return depth, (k[None, :] <= k[:, None]) & (k[:, None] < torch.tensor(end)[None, :])


def test_tree_segments_are_the_tree_mask():
    g = torch.Generator().manual_seed(0)
    root = torch.randint(0, 9, (7,), generator=g).tolist()
    seqs = [root + [1, 2, 3], root + [1, 2, 4, 5], root + [1, 6], root, [3, 3, 3], root + [1, 2, 3]]  # dup, nested
    depth, visible = _dense_visible(seqs)
    tree = tree_segments(depth, visible)
    t = len(depth)
    assert [a for a, _ in tree.bounds] == sorted(a for a, _ in tree.bounds) and tree.bounds[-1][1] == t
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(tree.bounds, tree.bounds[1:])) and tree.bounds[0][0] == 0
    # each segment's (keys, mask) is exactly its rows of the dense mask, and every visible key is among them
    for (a, b), keys, mask in zip(tree.bounds, tree.key_index.split(tree.sizes), tree.masks):
        assert torch.equal(visible[a:b][:, keys], mask)
        outside = torch.ones(t, dtype=torch.bool)
        outside[keys] = False
        assert not visible[a:b][:, outside].any()


def test_tree_attention_matches_the_dense_mask(tiny_model_dir, tiny_tokenizer):
    lm = load_lm(tiny_model_dir)
    policy = CompletionLogProbs(lm)
    assert lm.config._attn_implementation == TREE_ATTENTION
    assert "rlcr" not in lm.config.to_json_string()  # never saved with a checkpoint
    mb = collate_prefix_tree(prepare_samples(make_rows(n_prompts=3, g_a=3, g_c=2), tiny_tokenizer), pad_id=0)
    assert mb.tree is not None and len(mb.tree.bounds) > 3

    def run(tree):
        lm.zero_grad()
        inputs = mb.model_inputs()
        inputs["tree"] = tree
        lp, ent = policy(**inputs, entropy="metric")
        (lp * torch.linspace(-1, 1, lp.numel())).sum().backward()
        return lp.detach(), ent, [p.grad.clone() for p in lm.parameters()]

    lp_seg, ent_seg, g_seg = run(mb.tree)
    lp_dense, ent_dense, g_dense = run(None)  # SDPA over the dense [1, 1, T, T] mask
    torch.testing.assert_close(lp_seg, lp_dense, rtol=0, atol=2e-5)
    torch.testing.assert_close(ent_seg, ent_dense, rtol=0, atol=2e-5)
    for a, b in zip(g_seg, g_dense):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _reference(logits, labels):
    z = logits.float()
    lp = torch.log_softmax(z, -1).gather(-1, labels[..., None]).squeeze(-1)
    return lp, -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)


def test_blocked_token_logprobs_match_autograd():
    torch.manual_seed(0)
    for dtype, atol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        base = (torch.randn(37, 1000) * 3).to(dtype)
        labels = torch.randint(0, 1000, (37,))
        weights = torch.randn(37)
        grads = []
        for fn in (lambda z, labels=labels: token_logprobs(z, labels, return_entropy=True, entropy_grad=False,
                                                           chunk_rows=8),
                   lambda z, labels=labels: _reference(z, labels)):
            z = base.clone().requires_grad_(True)
            lp, ent = fn(z)
            (lp * weights).sum().backward()
            grads.append((lp.detach(), ent.detach(), z.grad))
        (lp, ent, g), (lp_ref, ent_ref, g_ref) = grads
        assert lp.dtype == torch.float32 and g.dtype == dtype
        torch.testing.assert_close(lp, lp_ref, rtol=0, atol=atol)
        torch.testing.assert_close(ent, ent_ref, rtol=0, atol=atol)
        torch.testing.assert_close(g.float(), g_ref.float(), rtol=0, atol=atol)
    # the entropy bonus (entropy in autograd) keeps the plain path; empty inputs give empty outputs
    z = torch.randn(4, 50, requires_grad=True)
    lp, ent = token_logprobs(z, torch.zeros(4, dtype=torch.long), return_entropy=True, entropy_grad=True)
    ent.sum().backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    lp, ent = token_logprobs(torch.zeros(0, 50), torch.zeros(0, dtype=torch.long), return_entropy=True)
    assert lp.shape == ent.shape == (0,)
