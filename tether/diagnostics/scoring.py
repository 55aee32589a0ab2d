"""Scoring helpers shared by the cross-scoring implementations (``crossscore``,
``multiprefix``): padding token lists into a batch and reading the log-probability
of target tokens at a temperature."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def target_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """log softmax(logits/τ) at the target ids: [..., V], [...] -> [...] (fp32)."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


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
