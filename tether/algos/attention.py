"""Custom attention functions on Hugging Face models: when they apply, and switching to one.

The rollout engine (grouped-prompt decode) and the cross-scoring (shared and multi
prefixes) register their own attention functions with transformers'
``AttentionInterface`` and switch a model to one for the length of a call.
"""

from __future__ import annotations

from contextlib import contextmanager


def supports_custom_attention(model) -> bool:
    """A model whose attention goes through HF's dispatch, with full attention in every
    layer (no sliding window), so a registered attention function can replace it."""
    config = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (
        hasattr(model, "set_attn_implementation")
        and type(model)._can_set_attn_implementation()
        and all(kind == "full_attention" for kind in layer_types)
        and not getattr(config, "use_sliding_window", False)
    )


@contextmanager
def attention_implementation(model, name: str):
    """Run the block with the model's attention set to the registered function ``name``."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
