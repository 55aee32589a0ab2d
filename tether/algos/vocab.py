"""Log-probabilities and entropies over a large vocabulary, chunked over token positions.

A causal LM's logits are ``lm_head(h)`` for the last hidden states h [N, H]; over a real
vocabulary (Qwen2.5: V = 151,936) the logits of N token positions are N x V floats:
one micro-batch of 16 trajectories x 600 tokens is 5.8 GB in float32, and the
log-softmax, its exponential and their product each as much again.  Here the model is
run up to its hidden states only (``model_states``), and the head, the float32
log-softmax, the picked target log-prob and the entropy are computed for
``chunk_tokens`` positions at a time (``chunked_logprobs``): at most chunk_tokens x V
floats exist at once.

Gradients: with gradients enabled each chunk runs under activation checkpointing
(``torch.utils.checkpoint``, non-reentrant), so the forward keeps only the chunk's
hidden states and the backward recomputes that chunk's logits; the result and its
gradients are those of the unchunked computation (tests/test_vocab_chunks.py, 1e-5).

Positions: ``where`` restricts the head and the vocabulary's work to the positions read.
The update and the reference pass read a log-prob only at the agent's own tokens (and
the entropy there and at the reasoning tokens), a third or less of a multi-turn
episode's positions: the observations, the chat markup and the padding are skipped
(``update.read_positions``), with the values and gradients at the read positions those
of the full computation (tests/test_vocab_chunks.py).

dtype: a bfloat16 model's head gives bfloat16 logits; the log-softmax and entropy are
taken in float32 (as the unchunked path always did).

A model whose logits are not exactly ``lm_head(last_hidden_state)`` (a soft-capped or
scaled head, e.g. Gemma 2's ``final_logit_softcapping``), or whose root module is
sharded with FSDP (its head's parameters are gathered only inside the root's own
forward), is run whole: its logits [N, V] are materialised and only the log-softmax
is chunked.
"""

from __future__ import annotations

import inspect
from functools import cache

import torch
from torch.utils.checkpoint import checkpoint

Tensor = torch.Tensor

#: Default token positions per chunk: 1024 x 151,936 float32 logits are 0.62 GB.
DEFAULT_CHUNK_TOKENS = 1024


def split_head(model):
    """(backbone, head) with ``model(**inputs).logits == head(backbone(**inputs)
    .last_hidden_state)``, or None when the model's logits are not that plain map."""
    backbone = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if backbone is None or not isinstance(head, torch.nn.Linear):
        return None
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or hasattr(model, "logit_scale"):
        return None
    if getattr(config, "logit_scale", None) not in (None, 1, 1.0):
        return None
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        FSDPModule = ()  # noqa: N806
    if isinstance(model, FSDPModule):
        return None
    return backbone, head


@cache
def _takes_cache(forward_owner: type) -> bool:
    return "cache" in inspect.signature(forward_owner.forward).parameters


def with_cache(model, kv_cache) -> dict:
    """The keyword argument that hands ``kv_cache`` to ``model``'s forward: ``cache`` in
    the transformers releases that renamed it (``past_key_values`` is deprecated there,
    to be removed in 5.40), ``past_key_values`` in the older ones."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    return {"cache" if _takes_cache(type(base)) else "past_key_values": kv_cache}


def returned_cache(out):
    """The KV cache a forward returned, under either release's name."""
    kv_cache = out.get("cache")
    return kv_cache if kv_cache is not None else out.past_key_values


def model_states(model, **inputs) -> tuple[Tensor, torch.nn.Module | None]:
    """(states [B, T, ·], head): the last hidden states and the head that maps them to
    logits, or (logits [B, T, V], None) for a model ``split_head`` refuses."""
    split = split_head(model)
    if split is None:
        return model(**inputs).logits, None
    backbone, head = split
    return backbone(**inputs).last_hidden_state, head


def head_logits(states: Tensor, head: torch.nn.Module | None) -> Tensor:
    """float32 logits of hidden ``states`` (or of logits, ``head`` None).  Under autocast
    (``algo.autocast``) the head leaves it: a bfloat16 logit of 10 is off by up to 0.03,
    which would move a log-prob, and a PPO ratio, by as much."""
    if head is None:
        return states.float()
    if torch.is_autocast_enabled(states.device.type):
        # float32 states into a float32 head; a head stored in another dtype (a model
        # loaded in bfloat16) takes its own, as it would without autocast.
        dtype = next(head.parameters()).dtype
        with torch.autocast(states.device.type, enabled=False):
            return head(states.to(dtype)).float()
    return head(states).float()


def _chunk_logprobs(states, targets, head, temperature: float, with_entropy: bool):
    logits = head_logits(states, head)  # [n, V] float32
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)  # [n, V] float32
    picked = log_probs.gather(-1, targets[:, None]).squeeze(-1)  # [n]
    if not with_entropy:
        return picked, None
    return picked, -(log_probs.exp() * log_probs).sum(-1)  # [n]


def chunked_logprobs(
    states: Tensor,
    targets: Tensor,
    head: torch.nn.Module | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    where: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(head(states) / T) at ``targets`` (and the entropy), float32.

    ``states`` [..., H] are hidden states (``head`` given) or logits [..., V] (``head``
    None); ``targets`` [...] are token ids.  Computed ``chunk_tokens`` positions at a
    time (0: all at once); returns tensors of ``targets``' shape.  ``where`` (bool, of
    ``targets``' shape): the positions that are read; the head and the vocabulary's
    work run on those alone, and every other position is 0."""
    shape = targets.shape
    flat_states = states.reshape(-1, states.shape[-1])  # [N, ·]
    flat_targets = targets.reshape(-1)  # [N]
    if where is not None:
        index = where.reshape(-1).nonzero().squeeze(-1)  # [n] positions read
        flat_states, flat_targets = flat_states[index], flat_targets[index]
    n = flat_targets.shape[0]
    step = n if chunk_tokens <= 0 else chunk_tokens
    grad = torch.is_grad_enabled() and (
        flat_states.requires_grad
        or (head is not None and any(p.requires_grad for p in head.parameters()))
    )
    picked, entropy = [], []
    for start in range(0, max(n, 1), max(step, 1)):
        args = (flat_states[start : start + step], flat_targets[start : start + step])
        if grad and step < n:
            # Keep only the chunk's inputs; the backward recomputes its logits.
            lp, ent = checkpoint(
                _chunk_logprobs, *args, head, temperature, with_entropy, use_reentrant=False
            )
        else:
            lp, ent = _chunk_logprobs(*args, head, temperature, with_entropy)
        picked.append(lp)
        entropy.append(ent)
    picked = torch.cat(picked)
    entropy = torch.cat(entropy) if with_entropy else None
    if where is not None:  # back in place; gradients flow to the read positions only
        picked, entropy = (
            None if t is None else t.new_zeros(shape.numel()).index_copy(0, index, t)
            for t in (picked, entropy)
        )
    return picked.reshape(shape), entropy.reshape(shape) if with_entropy else None
