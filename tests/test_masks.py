"""Span masks (docs/design.md §6) with two real tokenizers: SmolLM2's and a trained byte-level BPE."""

from hypothesis import HealthCheck, given, settings, strategies as st

from rlcr.core.masks import (
    answer_span,
    completion_mask,
    completion_offsets,
    confidence_span,
)
from rlcr.train.batching import Sample, collate


def masked_text(tok, ids, mask):
    return tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True)


def encode(tok, text, eos=True):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids + ([tok.eos_token_id] if eos else [])


def row_loss_mask(context_len, completion_mask, pad):
    """Loss mask of the full ``[context | completion | padding]`` row the update trains on: the input
    positions whose tokens are predicted and carry loss (:func:`rlcr.train.batching.collate`)."""
    n = len(completion_mask)
    sample = Sample(index=0, context_ids=[5] * context_len, completion_ids=[6] * n, loss_mask=list(completion_mask),
                    advantage=1.0)
    longer = Sample(index=1, context_ids=[5] * (context_len + n + pad - 1), completion_ids=[6], loss_mask=[0],
                    advantage=1.0)  # pads the first row by ``pad`` positions
    mb = collate([sample, longer], pad_id=0)
    full = [0] * mb.input_ids.shape[1]
    for row, col, pos in zip(mb.sel_row.tolist(), mb.sel_col.tolist(), mb.sel_pos.tolist()):
        if row == 0 and mb.loss_mask[row, col]:
            full[pos + 1] = 1  # the logits at ``pos`` predict the token at ``pos + 1``
    return full


def test_spans_by_hand():
    t = "Sure. <think>3*5=15</think>\n<answer>3*5</answer> bye"
    assert t[slice(*answer_span(t))] == "<think>3*5=15</think>\n<answer>3*5</answer>"
    assert answer_span("1+2 is it</answer>") == (0, len("1+2 is it</answer>"))
    assert answer_span("<think>no closing") == (0, len("<think>no closing"))
    t = "ok <analysis>sure</analysis> <confidence>0.9</confidence>\n"
    assert t[slice(*confidence_span(t))] == "<analysis>sure</analysis> <confidence>0.9</confidence>"
    t = "x <confidence>0.9</confidence>"
    assert t[slice(*confidence_span(t))] == "<confidence>0.9</confidence>"
    assert confidence_span("I am quite sure") == (0, len("I am quite sure"))
    assert confidence_span("<confidence>0.9") == (0, len("<confidence>0.9"))


def test_answer_mask_covers_reasoning_and_tags(any_tokenizer):
    tok = any_tokenizer
    text = "Let me see. <think>3 * 5 = 15, 15 + 2 = 17</think>\n<answer>3 * 5 + 2</answer>"
    ids = encode(tok, text)
    mask = completion_mask(tok, ids, text, "answer")
    assert len(mask) == len(ids)
    got = masked_text(tok, ids, mask)
    assert got.strip().startswith("<think>") and got.endswith("</answer>")
    assert "15 + 2" in got and "Let me" not in got
    assert mask[-1] == 0  # EOS after </answer> carries no loss


def test_mask_without_closing_tag_runs_to_the_end(any_tokenizer):
    tok = any_tokenizer
    text = "<think>3 * 5 = 15 so the answer is <answer>3*5"
    ids = encode(tok, text)  # EOS included
    mask = completion_mask(tok, ids, text, "answer")
    assert all(mask)
    text = "I think it is fairly likely."
    ids = encode(tok, text)
    assert all(completion_mask(tok, ids, text, "confidence"))


def test_confidence_mask(any_tokenizer):
    tok = any_tokenizer
    text = "Hmm. <analysis>The numbers check out.</analysis>\n<confidence>0.85</confidence>"
    ids = encode(tok, text)
    got = masked_text(tok, ids, completion_mask(tok, ids, text, "confidence"))
    assert got.strip().startswith("<analysis>") and got.endswith("</confidence>") and "Hmm" not in got


def test_non_canonical_tokenisation_falls_back(any_tokenizer):
    tok = any_tokenizer
    pieces = ["ok ", "<th", "ink>", "1+2", "</thi", "nk>", "<answer>", "1+2", "</answer>", " done"]
    ids = [i for p in pieces for i in tok(p, add_special_tokens=False)["input_ids"]] + [tok.eos_token_id]
    text = "".join(pieces)
    assert tok.decode(ids, skip_special_tokens=True) == text
    offsets = completion_offsets(tok, ids, text)
    assert len(offsets) == len(ids)
    got = masked_text(tok, ids, completion_mask(tok, ids, text, "answer"))
    assert "<think>" in got and got.endswith("</answer>") and "done" not in got


def test_row_loss_mask_layout():
    assert row_loss_mask(context_len=4, completion_mask=[0, 1, 1, 0], pad=2) == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0]


FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "<analysis>", "</analysis>", "<confidence>", "</confidence>",
     " ", "\n", "3 * 5", "+", "(", ")", "0.7", "Let me try", " so", ".", "é", "数", "12", "<", ">", "/"]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(FRAGMENTS, max_size=30), st.sampled_from(["answer", "confidence"]), st.integers(1, 12),
       st.integers(0, 5))
def test_mask_properties(any_tokenizer, frags, kind, ctx_len, pad):
    tok = any_tokenizer
    text = "".join(frags)
    ids = encode(tok, text)
    mask = completion_mask(tok, ids, text, kind)
    assert len(mask) == len(ids) and set(mask) <= {0, 1}
    span = (answer_span if kind == "answer" else confidence_span)(text)
    got = masked_text(tok, ids, mask)
    # the opening/closing tags of the span are inside the masked tokens when present
    opening, closing = ("<think>", "</answer>") if kind == "answer" else ("<confidence>", "</confidence>")
    if opening in text[span[0]:span[1]] and text[span[0]:].startswith(opening):
        assert opening in got
    if text[span[0]:span[1]].endswith(closing):
        assert closing in got
    # every token entirely outside the span carries no loss
    for (a, b), m in zip(completion_offsets(tok, ids, text), mask):
        if b <= span[0] and a < b:
            assert m == 0
    # in the full [context | completion | padding] row, context and padding are never masked
    full = row_loss_mask(ctx_len, mask, pad)
    assert len(full) == ctx_len + len(mask) + pad
    assert sum(full[:ctx_len]) == 0 and sum(full[ctx_len + len(mask):]) == 0 and sum(full) == sum(mask)
