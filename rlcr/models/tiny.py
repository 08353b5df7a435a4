"""A tiny, real model for tests and smoke runs: a byte-level BPE tokenizer trained on
Countdown text and a randomly initialised Llama (SmolLM2's architecture family)
with head_dim 64, so vLLM's CPU attention runs it.

Everything is built locally and deterministically from a seed; nothing is
downloaded. ``build_tiny_model(dir)`` writes a normal Hugging Face checkpoint
(config, safetensors, tokenizer with a ChatML chat template).
"""

from __future__ import annotations

from pathlib import Path

from rlcr.tasks.base import CONFIDENCE_QUERY
from rlcr.tasks.registry import get_task

__all__ = ["CHATML_TEMPLATE", "train_tiny_tokenizer", "build_tiny_model", "TINY"]

TINY = "tiny"
CORPUS_TASK = "countdown"
"""The task whose text the tiny tokenizer is trained on, whatever task the model then runs (a byte-level BPE
encodes any text): one fixed corpus keeps the tiny model, built once per seed and cached on disk, the same for
every test and smoke run, so the caller does not choose it."""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, the format SmolLM2-Instruct uses.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _corpus(seed: int, n_tasks: int = 300) -> list[str]:
    """The tokenizer's training text: :data:`CORPUS_TASK`'s prompts, solutions and confidences."""
    countdown = get_task(CORPUS_TASK)
    texts = [countdown.system_prompt, CONFIDENCE_QUERY]
    for t in countdown.generate(n_tasks, seed):
        texts.append(countdown.turn1_messages(t)[1]["content"])
        texts.append(
            f"<think>Try {t.solution}. That gives {t.target}.</think>\n<answer>{t.solution}</answer>"
        )
        texts.append(f"<analysis>The equation uses {t.nums} once each.</analysis>"
                     f"<confidence>0.{t.target % 10}</confidence>")
    return texts


def train_tiny_tokenizer(vocab_size: int = 512, seed: int = 0):
    """A byte-level BPE (GPT-2 style, like SmolLM2's) trained on Countdown text, as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(dest: str | Path, *, seed: int = 0, layers: int = 2, hidden: int = 128,
                     vocab_size: int = 512) -> Path:
    """Write a tiny random Llama checkpoint + tokenizer to ``dest`` (idempotent, atomic)."""
    dest = Path(dest)
    if (dest / "config.json").exists() and (dest / "model.safetensors").exists():
        return dest
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = train_tiny_tokenizer(vocab_size=vocab_size, seed=seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,  # head_dim 64: supported by vLLM's CPU attention
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    from rlcr.storage import atomic_directory

    with atomic_directory(dest) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return dest
