"""Scoring helpers shared by the cross-scoring implementations (``crossscore``,
``multiprefix``): padding token lists into a batch and reading the log-probability
of target tokens at a temperature."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..algos.vocab import DEFAULT_CHUNK_TOKENS, head_logits


def target_logprobs(
    states: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    head: torch.nn.Module | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """log softmax(logits/τ) at the target ids: [..., ·], [...] -> [...] (fp32).

    ``states`` are logits [..., V] (``head`` None) or hidden states [..., H] that
    ``head`` maps to logits (`tether.algos.vocab.model_states`); either way at most
    ``chunk_tokens`` positions' logits exist at once (0: all).  Under bfloat16 autocast
    (``diagnostics.autocast``) the head runs in float32 (`tether.algos.vocab.head_logits`)."""
    flat_states = states.reshape(-1, states.shape[-1])
    flat_targets = targets.reshape(-1)
    step = max(1, chunk_tokens if chunk_tokens > 0 else flat_targets.shape[0])
    picked = []
    for start in range(0, flat_targets.shape[0], step):
        part = flat_states[start : start + step]
        scaled = head_logits(part, head) / temperature  # [n, V] float32
        tokens = flat_targets[start : start + step, None]
        picked.append(scaled.gather(-1, tokens).squeeze(-1) - torch.logsumexp(scaled, dim=-1))
    if not picked:
        return torch.zeros(targets.shape, dtype=torch.float32, device=targets.device)
    return torch.cat(picked).reshape(targets.shape)


def right_pad(
    seqs: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists with id 0: ids [B, T] and a 0/1 validity mask [B, T]."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[b, : len(s)] = 1
    return ids.to(device), mask.to(device)
