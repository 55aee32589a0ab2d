"""Custom attention functions on Hugging Face models: when they apply, and switching to one.

The rollout engine (grouped-prompt decode) and the cross-scoring (shared and multi
prefixes) register their own attention functions with transformers'
``AttentionInterface`` (through ``register_attention``) and switch a model to one for
the length of a call.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
from transformers import AttentionInterface


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


def register_attention(name: str, state: str):
    """Decorator: register ``fn(module, query, key, value, scale, state_value)`` with
    transformers' ``AttentionInterface`` under ``name``.

    The registered function takes HF's attention arguments; ``scale`` is HF's ``scaling``,
    by default head_dim**-0.5, and ``state_value`` is the keyword argument ``state`` that
    the caller passes through the model's forward. ``fn`` returns the output
    [B, T, Hq, D]; HF gets it in the query's dtype, with no attention weights. The
    decorator returns the registered function.
    """

    def decorator(fn: Callable) -> Callable:
        def attention(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout: float = 0.0,
            scaling: float | None = None,
            **kwargs,
        ):
            scale = query.shape[-1] ** -0.5 if scaling is None else scaling
            return fn(module, query, key, value, scale, kwargs[state]).to(query.dtype), None

        attention.__name__ = attention.__qualname__ = fn.__name__
        attention.__doc__ = fn.__doc__
        AttentionInterface.register(name, attention)
        return attention

    return decorator


def prefix_and_causal_weights(
    s_pre: torch.Tensor, s_own: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One softmax over a cached prefix and the rows' own tokens, the own part causal.

    ``s_pre`` [..., T, P] and ``s_own`` [..., T, T] are the scores of the two parts;
    returns their unnormalised weights (shifted by the joint row maximum) and the joint
    denominator [..., T, 1]: attention = (e_pre @ V_pre + e_own @ V_own) / denom.
    """
    t = s_own.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=s_own.device).tril()
    s_own = s_own.masked_fill(~causal, float("-inf"))
    peak = torch.maximum(s_pre.amax(-1, keepdim=True), s_own.amax(-1, keepdim=True))
    e_pre, e_own = torch.exp(s_pre - peak), torch.exp(s_own - peak)
    return e_pre, e_own, e_pre.sum(-1, keepdim=True) + e_own.sum(-1, keepdim=True)
