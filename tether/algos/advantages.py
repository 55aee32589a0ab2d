"""Advantage estimators for token-level policy gradient on agent tokens (docs/methods.md,
section 7).

Every estimator is a pure function ``fn(inputs: AdvantageInputs, **params) ->
(advantages[B,T], returns[B,T])`` registered in ``ADVANTAGE_ESTIMATORS`` and called
through ``compute_advantages(name, inputs, **params)``.  Advantages and returns are
exactly zero outside ``response_mask`` (prompt, environment text and padding).

Batch convention (shared with the learner):
  - B trajectories padded to T tokens;
  - ``response_mask[B,T]`` is 1 on the agent's own generated tokens; a multi-turn
    row has several disjoint agent spans separated by masked environment text;
  - ``scores[B]`` is the trajectory reward (sum of turn rewards + format penalties);
  - ``group_index[B]`` labels the trajectories sampled from the same prompt
    (any integer labels; they need not be contiguous);
  - ``token_rewards[B,T]`` holds each turn's reward on the last agent token of
    that turn; ``values[B,T]`` are critic values.

Estimators:
  - ``gae``: GAE over agent tokens only.  Environment tokens are *skipped*, not
    treated as steps: the TD target of an agent token bootstraps from the value of
    the next agent token in the same row (0 after the last one), and γ/λ discount
    per agent token.  Whitened over the batch's agent tokens by default (as veRL
    does for PPO); ``whiten=False`` gives the raw GAE.
  - ``grpo``: (r − mean_g) / (std_g + eps), std with ``std_ddof`` (default 1, the
    unbiased std used by DeepSeekMath/veRL).  A group of size 1, or any group whose
    std is undefined/zero, gets advantage 0 (no baseline is possible, so no signal).
  - ``drgrpo``: r − mean_g (Dr.GRPO, no std normalisation).  Size-1 group -> 0.
  - ``rloo``: r_i − mean_{j≠i} r_j = n/(n−1)·(r_i − mean_g).  Size-1 group -> 0.
  - ``reinforce_pp``: REINFORCE++ (Hu 2025): discounted returns-to-go over agent
    tokens, G_t = r_t + γ·G_next_agent_token, from ``token_rewards`` (or, if absent,
    the score on each row's last agent token); advantages = G whitened (mean-shifted
    and divided by std) over all agent tokens of the batch; returns = raw G.

Outcome estimators (grpo, drgrpo, rloo) broadcast the trajectory advantage to every
agent token of the row and return ``returns = advantages`` (veRL convention).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass
class AdvantageInputs:
    """What an advantage estimator may read.  Shapes: B trajectories × T tokens."""

    scores: Tensor  # [B] trajectory reward
    group_index: Tensor  # [B] long, same label = same prompt
    response_mask: Tensor  # [B,T] 1 on agent tokens
    token_rewards: Tensor | None = None  # [B,T] turn reward on each turn's last agent token
    values: Tensor | None = None  # [B,T] critic values


# --------------------------------------------------------------------------- helpers


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 if the mask is empty)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1.0)


def masked_whiten(
    x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8, unbiased: bool = True
) -> Tensor:
    """(x − mean) / sqrt(var + eps) over masked positions; zero outside the mask.

    ``unbiased`` uses the n−1 variance (veRL's ``masked_whiten``); with fewer than two
    masked positions the variance is taken as 0.  ``shift_mean=False`` rescales only.
    """
    maskf = mask.to(x.dtype)
    n = maskf.sum()
    mean = (x * maskf).sum() / n.clamp_min(1.0)
    sq_dev = ((x - mean) ** 2 * maskf).sum()
    denom = (n - 1.0) if unbiased else n
    var = sq_dev / denom if float(denom) > 0 else torch.zeros((), dtype=x.dtype, device=x.device)
    out = (x - mean) if shift_mean else x
    return out * torch.rsqrt(var + eps) * maskf


def outcome_token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Place each row's score on its last agent token.  [B] , [B,T] -> [B,T]."""
    maskf = response_mask.to(torch.float32)
    T = maskf.shape[1]
    positions = torch.arange(T, device=maskf.device).expand_as(maskf)  # [B,T]
    last = torch.where(maskf > 0, positions, torch.full_like(positions, -1)).amax(dim=1)  # [B]
    rewards = torch.zeros_like(maskf)  # [B,T]
    has_tokens = last >= 0  # [B]
    rows = torch.nonzero(has_tokens).squeeze(1)
    rewards[rows, last[rows]] = scores.to(maskf.dtype)[rows]
    return rewards


def _group_stats(scores: Tensor, group_index: Tensor, ddof: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-trajectory group mean, group std (with ddof) and group size, each [B]."""
    scores = scores.to(torch.float64)  # float64: exact hand-computed tests, stable sums
    _, inverse = torch.unique(group_index, return_inverse=True)  # inverse: [B] in 0..G-1
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=scores.device)  # [G]
    count = zeros.clone().index_add_(0, inverse, torch.ones_like(scores))
    total = zeros.clone().index_add_(0, inverse, scores)
    mean = total / count  # [G]
    sq_dev = zeros.clone().index_add_(0, inverse, (scores - mean[inverse]) ** 2)
    dof = (count - ddof).clamp_min(0.0)
    std = torch.where(
        dof > 0, torch.sqrt(sq_dev / dof.clamp_min(1.0)), torch.zeros_like(sq_dev)
    )  # [G]
    return mean[inverse], std[inverse], count[inverse]


def _broadcast(per_row: Tensor, response_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[B] -> [B,T], zero outside the mask."""
    return per_row.to(dtype).unsqueeze(1) * response_mask.to(dtype)


def _float_dtype(inputs: AdvantageInputs) -> torch.dtype:
    dt = inputs.scores.dtype
    return dt if dt.is_floating_point else torch.float32


def _discounted_agent_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + γ·G_{next agent token}, skipping env tokens; zero off-mask.  [B,T]."""
    maskf = response_mask.to(token_rewards.dtype)
    B, T = maskf.shape
    returns = torch.zeros_like(token_rewards)  # [B,T]
    running = torch.zeros(
        B, dtype=token_rewards.dtype, device=token_rewards.device
    )  # [B] G of the next agent token
    for t in reversed(range(T)):
        m = maskf[:, t]  # [B]
        g = token_rewards[:, t] + gamma * running
        running = m * g + (1.0 - m) * running  # env tokens pass the running return through
        returns[:, t] = m * g
    return returns


# --------------------------------------------------------------------------- estimators


def gae_advantages(
    inputs: AdvantageInputs, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
) -> tuple[Tensor, Tensor]:
    """GAE over agent tokens only (env tokens skipped); returns = A + V (pre-whitening)."""
    if inputs.values is None:
        raise ValueError(
            "advantage estimator 'gae' needs critic values (AdvantageInputs.values); "
            "enable the critic or choose grpo/drgrpo/rloo/reinforce_pp"
        )
    values = inputs.values.detach().to(_float_dtype(inputs))  # [B,T]
    rewards = (
        inputs.token_rewards
        if inputs.token_rewards is not None
        else outcome_token_rewards(inputs.scores, inputs.response_mask)
    ).to(values.dtype)  # [B,T]
    maskf = inputs.response_mask.to(values.dtype)  # [B,T]
    B, T = values.shape
    advantages = torch.zeros_like(values)  # [B,T]
    next_value = torch.zeros(
        B, dtype=values.dtype, device=values.device
    )  # [B] V of the next agent token (0 at the end)
    next_adv = torch.zeros_like(next_value)  # [B] A of the next agent token
    for t in reversed(range(T)):
        m = maskf[:, t]  # [B]
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # TD error at agent token t
        adv_t = delta + gamma * lam * next_adv
        next_adv = m * adv_t + (1.0 - m) * next_adv  # env tokens carry the next agent token's state
        next_value = m * values[:, t] + (1.0 - m) * next_value
        advantages[:, t] = m * adv_t
    returns = (advantages + values) * maskf  # [B,T]
    if whiten:
        advantages = masked_whiten(advantages, maskf)
    return advantages, returns


def grpo_advantages(
    inputs: AdvantageInputs, eps: float = 1e-6, std_ddof: int = 1, norm_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """(r − group mean) / (group std + eps); singleton / zero-std groups -> 0."""
    mean, std, count = _group_stats(inputs.scores, inputs.group_index, std_ddof)  # [B] each
    centred = inputs.scores.to(torch.float64) - mean  # [B]
    if norm_by_std:
        per_row = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    else:
        per_row = centred
    per_row = torch.where(count > 1, per_row, torch.zeros_like(per_row))
    advantages = _broadcast(per_row, inputs.response_mask, _float_dtype(inputs))  # [B,T]
    return advantages, advantages.clone()


def drgrpo_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """r − group mean (Dr.GRPO: no std normalisation); singleton groups -> 0."""
    return grpo_advantages(inputs, norm_by_std=False)


def rloo_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """r_i − mean of the other members of the group = n/(n−1)·(r_i − mean)."""
    mean, _, count = _group_stats(inputs.scores, inputs.group_index, ddof=0)  # [B] each
    centred = inputs.scores.to(torch.float64) - mean
    per_row = torch.where(
        count > 1, centred * count / (count - 1.0).clamp_min(1.0), torch.zeros_like(centred)
    )
    advantages = _broadcast(per_row, inputs.response_mask, _float_dtype(inputs))  # [B,T]
    return advantages, advantages.clone()


def reinforce_pp_advantages(inputs: AdvantageInputs, gamma: float = 1.0) -> tuple[Tensor, Tensor]:
    """REINFORCE++: agent-token returns-to-go, whitened over the batch's agent tokens."""
    dtype = _float_dtype(inputs)
    rewards = (
        inputs.token_rewards
        if inputs.token_rewards is not None
        else outcome_token_rewards(inputs.scores, inputs.response_mask)
    ).to(dtype)  # [B,T]
    returns = _discounted_agent_returns(rewards, inputs.response_mask, gamma)  # [B,T]
    advantages = masked_whiten(returns, inputs.response_mask)  # [B,T]
    return advantages, returns


def format_advantages(malformed_mask: Tensor, response_mask: Tensor) -> Tensor:
    """The format term's per-token advantages [B,T], outside any group: each reply's
    tokens get (the batch's share of malformed replies) − (1 if the reply is malformed,
    else 0), so a malformed reply is pushed down and a well-formed one up, by an amount
    that does not depend on its group's rewards (a group whose episodes all fail keeps its
    zero task advantage).  A reply is one unbroken run of agent tokens; all zeros when no
    reply is malformed or there is none."""
    maskf = response_mask.to(torch.float64)  # [B,T]
    starts = maskf * (1.0 - torch.nn.functional.pad(maskf[:, :-1], (1, 0)))  # [B,T]
    replies = starts.sum()
    malformed = malformed_mask.to(torch.float64) * maskf  # [B,T]
    if replies == 0:
        return torch.zeros_like(maskf, dtype=torch.float32)
    share = (starts * malformed).sum() / replies
    return ((share - malformed) * maskf).to(torch.float32)  # [B,T]


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "gae": gae_advantages,
    "grpo": grpo_advantages,
    "drgrpo": drgrpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}


def bound_params(name: str, config) -> dict:
    """The keyword parameters of the estimator registered as ``name`` that the config
    section ``config`` (an ``AlgoConfig``) has a field of, read from it: gae binds
    ``gamma`` and ``lam``, reinforce_pp ``gamma``, the group estimators nothing.  Read from
    the estimator's signature, so registering an estimator is all it takes."""
    fields = type(config).model_fields
    signature = inspect.signature(ADVANTAGE_ESTIMATORS[name]).parameters
    return {key: getattr(config, key) for key in signature if key != "inputs" and key in fields}


def compute_advantages(name: str, inputs: AdvantageInputs, **params) -> tuple[Tensor, Tensor]:
    """Run the estimator registered as ``name``: -> (advantages[B,T], returns[B,T])."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGE_ESTIMATORS)}"
        )
    B, T = inputs.response_mask.shape
    for field_name in ("token_rewards", "values"):
        tensor = getattr(inputs, field_name)
        if tensor is not None and tuple(tensor.shape) != (B, T):
            raise ValueError(
                f"AdvantageInputs.{field_name} has shape {tuple(tensor.shape)}, "
                f"expected response_mask's {(B, T)}"
            )
    for field_name in ("scores", "group_index"):
        tensor = getattr(inputs, field_name)
        if tuple(tensor.shape) != (B,):
            raise ValueError(
                f"AdvantageInputs.{field_name} has shape {tuple(tensor.shape)}, expected {(B,)}"
            )
    with torch.no_grad():
        return ADVANTAGE_ESTIMATORS[name](inputs, **params)
