"""One learner update over a batch: PPO-style epochs of minibatches, micro-batched.

Micro-batches pass the minibatch's token (or sequence) count as the aggregation
denominator, so their summed gradients equal the full minibatch's gradient: the
micro-batch size changes memory, never the math.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .batch import TrajectoryBatch, token_logprobs
from .losses import ppo_objective, value_loss


@dataclass(frozen=True)
class UpdateSettings:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    loss_agg: str = "token-mean"
    ppo_epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int = 16
    max_grad_norm: float = 1.0
    temperature: float = 1.0


def aggregation_denominator(mask: torch.Tensor, mode: str) -> float:
    if mode == "token-mean":
        return float(mask.sum().clamp_min(1.0))
    return float((mask.sum(-1) > 0).sum().clamp_min(1))


def _trim(batch: TrajectoryBatch, rows: torch.Tensor) -> TrajectoryBatch:
    """Rows of a batch, cut to their longest sequence (less padding to compute)."""
    sub = batch.select(rows)
    width = int(sub.attention_mask.sum(-1).max())
    for name in ("input_ids", "attention_mask", "response_mask", "token_rewards",
                 "sampling_logprobs", "old_logprobs", "ref_logprobs", "values", "advantages",
                 "returns", "reasoning_mask"):
        value = getattr(sub, name)
        if value is not None:
            setattr(sub, name, value[:, :width])
    return sub


@torch.no_grad()
def batch_logprobs(model, batch: TrajectoryBatch, temperature: float, micro_batch_size: int):
    """Per-token log-probs of the batch under ``model`` (no grad), [B, T]."""
    out = torch.zeros(batch.input_ids.shape)
    for start in range(0, batch.size, micro_batch_size):
        rows = torch.arange(start, min(start + micro_batch_size, batch.size))
        sub = _trim(batch, rows)
        lp, _ = token_logprobs(model, sub.input_ids, sub.attention_mask, temperature)
        out[rows, :lp.shape[1]] = lp
    return out


@torch.no_grad()
def batch_values(critic, batch: TrajectoryBatch, micro_batch_size: int):
    out = torch.zeros(batch.input_ids.shape)
    for start in range(0, batch.size, micro_batch_size):
        rows = torch.arange(start, min(start + micro_batch_size, batch.size))
        sub = _trim(batch, rows)
        v = critic(sub.input_ids, sub.attention_mask)
        out[rows, :v.shape[1]] = v
    return out


def _accumulate(metrics: dict[str, list[float]], new: dict[str, float]) -> None:
    for key, value in new.items():
        metrics.setdefault(key, []).append(float(value))


def policy_update(model, optimizer, batch: TrajectoryBatch, s: UpdateSettings,
                  seed: int = 0, critic=None, critic_optimizer=None) -> dict[str, float]:
    """PPO epochs over ``batch`` (advantages and old log-probs already set)."""
    assert batch.advantages is not None and batch.old_logprobs is not None
    model.train()
    rng = np.random.default_rng(seed)
    metrics: dict[str, list[float]] = {}
    need_entropy = True  # logged always; differentiated only when entropy_coef > 0
    # Token entropy on the reasoning tokens, token-weighted over the update's forwards.
    reasoning_entropy = torch.zeros(2, dtype=torch.float64)          # [sum, count]
    for _ in range(s.ppo_epochs):
        order = torch.as_tensor(rng.permutation(batch.size))
        for mb_rows in torch.tensor_split(order, min(s.minibatches, batch.size)):
            mb_mask = batch.response_mask[mb_rows]
            denominator = aggregation_denominator(mb_mask, s.loss_agg)
            optimizer.zero_grad(set_to_none=True)
            if critic_optimizer is not None:
                critic_optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(mb_rows), s.micro_batch_size):
                mb = _trim(batch, mb_rows[start:start + s.micro_batch_size])
                logprobs, entropy = token_logprobs(model, mb.input_ids, mb.attention_mask,
                                                   s.temperature, with_entropy=need_entropy)
                if s.entropy_coef == 0.0 and entropy is not None:
                    entropy = entropy.detach()
                task_loss, reg_loss, m = ppo_objective(
                    logprobs, mb.old_logprobs, mb.advantages, mb.response_mask,
                    ref_logprobs=mb.ref_logprobs, entropy=entropy, clip_low=s.clip_low,
                    clip_high=s.clip_high, kl_coef=s.kl_coef, kl_estimator=s.kl_estimator,
                    entropy_coef=s.entropy_coef, agg=s.loss_agg, denominator=denominator)
                (task_loss + reg_loss).backward()
                _accumulate(metrics, m)
                if mb.reasoning_mask is not None:
                    with torch.no_grad():
                        reasoning_entropy += torch.stack([(entropy * mb.reasoning_mask).sum(),
                                                          mb.reasoning_mask.sum()]).double()
                if critic is not None:
                    values = critic(mb.input_ids, mb.attention_mask)
                    vf_loss, vm = value_loss(values, mb.values, mb.returns, mb.response_mask,
                                             agg=s.loss_agg, denominator=denominator)
                    vf_loss.backward()
                    _accumulate(metrics, vm)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
            _accumulate(metrics, {"actor/grad_norm": float(grad_norm)})
            if torch.isfinite(grad_norm):
                optimizer.step()
            if critic is not None:
                torch.nn.utils.clip_grad_norm_(critic.parameters(), s.max_grad_norm)
                critic_optimizer.step()
    model.eval()
    out = {k: float(np.mean(v)) for k, v in metrics.items()}
    if reasoning_entropy[1] > 0:
        out["collapse/reasoning_token_entropy"] = float(reasoning_entropy[0] / reasoning_entropy[1])
    return out
