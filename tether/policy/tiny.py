"""The Qwen2-architecture causal LMs that Tether builds (no download) for CPU runs.

Sizes (tied embeddings; vocab 512 = the project tokenizer's, unless fixed):
- ``large``  hidden 768, 12 layers, MLP 3072 -> 113,686,272 parameters (GPT-2 small's
  body; for cost scaling, ``benchmarks/scaling.py``);
- ``medium`` hidden 512, 7 layers, MLP 2048  -> 29,640,704 parameters (cost scaling);
- ``tiny``   hidden 256, 4 layers, MLP 1024  -> 4,330,752 parameters (the default);
- ``small``  hidden 128, 2 layers, MLP 512   -> 591,232 parameters;
- ``micro``  hidden 64,  2 layers, MLP 256   -> about 0.15 M parameters (tests);
- ``qwen05b-shape``: Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query and 2
  key/value heads, MLP 4864, vocabulary 151,936, RoPE theta 1e6) -> 494 M parameters,
  randomly initialised: it measures what a real-size model and vocabulary cost
  (memory, time), not what such a model learns.  Its tokenizer is the project's, padded
  to the vocabulary (`tokenizer.pad_vocabulary`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


@dataclass(frozen=True)
class TinySize:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    #: key/value heads (grouped-query attention); None = one per query head
    num_key_value_heads: int | None = None
    #: a fixed vocabulary (the tokenizer is padded to it); None = the tokenizer's own
    vocab_size: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    # Measured on 2 CPU cores: eager attention trains ~1.6x faster than SDPA at the tiny
    # sizes; at 0.5 B eager would keep [rows, heads, T, T] scores per layer for the
    # backward, so SDPA.
    attn_implementation: str = "eager"


#: Qwen2.5-0.5B's vocabulary (its config's ``vocab_size``; 151,665 tokens padded).
QWEN25_VOCAB = 151_936

TINY_SIZES: dict[str, TinySize] = {
    "large": TinySize(768, 12, 3072, 12),
    "medium": TinySize(512, 7, 2048, 8),
    "tiny": TinySize(256, 4, 1024, 4),
    "small": TinySize(128, 2, 512, 4),
    "micro": TinySize(64, 2, 256, 2),
    "qwen05b-shape": TinySize(
        896, 24, 4864, 14, 2, QWEN25_VOCAB, rope_theta=1e6, attn_implementation="sdpa"
    ),
}


def tiny_config(
    size: str = "tiny",
    vocab_size: int = 512,
    max_context: int = 1024,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Qwen2Config:
    """A Qwen2 config for one of the named sizes (a size with a fixed vocabulary
    refuses a ``vocab_size`` above it: the tokenizer must fit the embedding)."""
    if size not in TINY_SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {sorted(TINY_SIZES)}")
    s = TINY_SIZES[size]
    if s.vocab_size is not None:
        if vocab_size > s.vocab_size:
            raise ValueError(f"size {size!r} has {s.vocab_size} token ids, {vocab_size} needed")
        vocab_size = s.vocab_size
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads or s.num_attention_heads,
        max_position_embeddings=max_context,
        tie_word_embeddings=True,
        rope_theta=s.rope_theta,
        rms_norm_eps=s.rms_norm_eps,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        use_cache=True,
        attn_implementation=s.attn_implementation,
    )


def build_tiny_model(config: Qwen2Config, seed: int = 0) -> Qwen2ForCausalLM:
    """A freshly initialised model (deterministic for a seed), in fp32 eval mode."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float().eval()
