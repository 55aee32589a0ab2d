"""Trajectories -> padded tensors, and the policy's per-token log-probs and entropy.

Row b of a batch is one trajectory (a whole multi-turn conversation); position t
holds token t.  ``response_mask[b, t]`` is 1 where the agent sampled token t.
Log-probs at position t are of token t given tokens < t (position 0 gets 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from .vocab import DEFAULT_CHUNK_TOKENS, chunked_logprobs, model_states


@dataclass
class TrajectoryBatch:
    input_ids: torch.Tensor  # [B, T] long, right-padded
    attention_mask: torch.Tensor  # [B, T] long
    response_mask: torch.Tensor  # [B, T] float, agent tokens
    token_rewards: torch.Tensor  # [B, T] float, turn rewards on each reply's last token
    scores: torch.Tensor  # [B] float, trajectory rewards
    group_index: torch.Tensor  # [B] long
    sampling_logprobs: torch.Tensor  # [B, T] float
    old_logprobs: torch.Tensor | None = None  # [B, T]
    ref_logprobs: torch.Tensor | None = None  # [B, T]
    values: torch.Tensor | None = None  # [B, T]
    advantages: torch.Tensor | None = None  # [B, T]
    returns: torch.Tensor | None = None  # [B, T]
    reasoning_mask: torch.Tensor | None = None  # [B, T] float, reasoning tokens (inside <think>)
    malformed_mask: torch.Tensor | None = None  # [B, T] float, tokens of malformed replies
    format_advantages: torch.Tensor | None = None  # [B, T] the format term's (advantages.py)
    meta: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device) -> TrajectoryBatch:
        """The same batch with its tensors on ``device``."""
        return TrajectoryBatch(
            **{
                f.name: getattr(self, f.name).to(device)
                if isinstance(getattr(self, f.name), torch.Tensor)
                else getattr(self, f.name)
                for f in fields(self)
            }
        )

    def select(self, rows) -> TrajectoryBatch:
        rows = torch.as_tensor(rows, dtype=torch.long)
        kw = {}
        for f in fields(self):
            value = getattr(self, f.name)
            kw[f.name] = value.index_select(0, rows) if isinstance(value, torch.Tensor) else value
        return TrajectoryBatch(**kw)


def collate(trajectories, pad_id: int, reasoning_masks=None) -> TrajectoryBatch:
    """Pad trajectories into one batch (rows in the given order); ``reasoning_masks``
    (one 0/1 list per trajectory, e.g. `SpanExtractor.reasoning_mask`) fills
    ``reasoning_mask``."""
    width = max(len(t.token_ids) for t in trajectories)
    n = len(trajectories)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response = torch.zeros((n, width))
    rewards = torch.zeros((n, width))
    sampling = torch.zeros((n, width))
    malformed = torch.zeros((n, width))
    for row, traj in enumerate(trajectories):
        length = len(traj.token_ids)
        input_ids[row, :length] = torch.tensor(traj.token_ids)
        attention[row, :length] = 1
        response[row, :length] = torch.tensor(traj.loss_mask, dtype=torch.float32)
        rewards[row, :length] = torch.tensor(traj.token_rewards())
        sampling[row, :length] = torch.tensor(traj.sampling_logprobs)
        malformed[row, :length] = torch.tensor(traj.malformed_mask())
    reasoning = None
    if reasoning_masks is not None:
        reasoning = torch.zeros((n, width))
        for row, mask in enumerate(reasoning_masks):
            reasoning[row, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    groups = {g: k for k, g in enumerate(dict.fromkeys(t.group_id for t in trajectories))}
    return TrajectoryBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=response,
        token_rewards=rewards,
        scores=torch.tensor([t.reward for t in trajectories]),
        group_index=torch.tensor([groups[t.group_id] for t in trajectories]),
        sampling_logprobs=sampling,
        reasoning_mask=reasoning,
        malformed_mask=malformed,
    )


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    where: torch.Tensor | None = None,
):
    """log p(token_t | tokens_<t) at ``temperature`` (and the entropy of that distribution),
    the vocabulary computations ``chunk_tokens`` positions at a time (`vocab.chunked_logprobs`);
    with ``where`` [B, T] (bool) only at those positions, 0 elsewhere."""
    states, head = model_states(model, input_ids=input_ids, attention_mask=attention_mask)
    picked, entropy = chunked_logprobs(
        states[:, :-1],
        input_ids[:, 1:],
        head,
        temperature,
        with_entropy,
        chunk_tokens,
        where=None if where is None else where[:, 1:],
    )  # [B,T-1]
    picked = torch.nn.functional.pad(picked, (1, 0))  # [B,T]
    if not with_entropy:
        return picked, None
    return picked, torch.nn.functional.pad(entropy, (1, 0))  # [B,T]
