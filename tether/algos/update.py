"""One learner update over a batch: PPO-style epochs of minibatches, micro-batched.

Micro-batches pass the minibatch's token (or sequence) count as the aggregation
denominator, so their summed gradients equal the full minibatch's gradient: the
micro-batch size changes memory, never the math.

Data parallel (the FSDP learner group): rank r of W runs micro-batches r, r+W,
r+2W, ... of each minibatch, still with the whole minibatch's denominator, and the
group sums (not averages) the gradients, so the step equals the world-size-1 step.
Every rank runs the same number of forward/backward passes (FSDP's collectives run
in lockstep): a rank short of micro-batches runs a copy of one with weight 0.

Which rows share a micro-batch (``micro_batches.plan_micro_batches``): whole GRPO
groups, each group's common prompt run once per forward (``shared_prefix.py``;
``UpdateSettings.shared_prefix``, on by default), or rows of similar length, whichever
computes fewer token positions.  The minibatch and its summed gradient do not change;
``shared_prefix=False`` with one row per micro-batch is the plain path the equivalence
tests compare against.  Data parallel (world size > 1) keeps the plain forward: whether
a micro-batch takes one forward or two depends on its rows, and FSDP's per-forward
all-gathers must run the same number of times on every rank.  The logged metrics do
not depend on the cut either (``_reduce``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import torch

from .batch import TrajectoryBatch, token_logprobs
from .losses import (
    behaviour_weights,
    off_policy_metrics,
    ppo_objective,
    turn_count,
    value_loss,
)
from .micro_batches import plan_micro_batches, shared_prefix_plan
from .shared_prefix import shared_prefix_token_logprobs
from .vocab import DEFAULT_CHUNK_TOKENS

if TYPE_CHECKING:
    from .settings import AlgoConfig


@dataclass(frozen=True)
class UpdateSettings:
    """What one update (and the gradient-SNR analysis, which measures its losses) needs.

    No defaults of its own: built from the ``algo`` section by ``from_config``, the only
    place the two meet, so a field's default is the config's (a direct caller, a test
    or a benchmark, builds an ``AlgoConfig`` too: ``tether.testing.settings``)."""

    clip_low: float
    clip_high: float
    kl_coef: float
    kl_estimator: str
    entropy_coef: float
    #: Weight of the format term (``losses.ppo_objective``; 0 = off).
    format_coef: float
    loss_agg: str
    ppo_epochs: int
    minibatches: int
    micro_batch_size: int
    max_grad_norm: float
    #: The sampling temperature the log-probs are taken at.
    temperature: float
    #: Run each group's common prompt once per micro-batch (same math, fewer tokens).
    shared_prefix: bool
    #: Dual-clip constant c > 1 (None = off), see ``losses.policy_loss``.
    dual_clip: float | None
    #: Token positions per chunk of the head + log-softmax (`vocab.chunked_logprobs`; 0 = all).
    logprob_chunk_tokens: int
    #: AdamW epsilon of the policy optimiser (read when the learner builds it).
    adam_eps: float
    #: Off-policy correction of the policy-gradient term: none, tis or decoupled
    #: (``losses.behaviour_weights``), and its cap (tis_cap or decoupled_cap).
    off_policy: str
    off_policy_cap: float
    #: Mixed precision of the learner's forwards: none or bfloat16 (``autocast``).
    autocast: str
    #: The learning rate's schedule (``lr_factor``) and the updates it spans (0: constant).
    lr_schedule: str
    lr_horizon: int

    @classmethod
    def from_config(
        cls, algo: AlgoConfig, rollout_temperature: float, *, iterations: int
    ) -> UpdateSettings:
        """The settings of a run: the ``algo`` section, the sampling temperature the
        log-probs are taken at (greedy sampling, temperature 0, scores at 1), and the
        run's iterations, one update each, which a decaying learning rate spans (required:
        a horizon of 0 would make a decaying rate constant without a word)."""
        if algo.lr_schedule != "constant" and iterations < 1:
            raise ValueError(
                f"algo.lr_schedule {algo.lr_schedule} decays over the run's iterations; "
                f"got iterations={iterations}"
            )
        own = {
            "temperature": rollout_temperature if rollout_temperature > 0 else 1.0,
            "off_policy_cap": algo.decoupled_cap
            if algo.off_policy == "decoupled"
            else algo.tis_cap,
            "lr_horizon": iterations,
        }
        copied = {f.name: getattr(algo, f.name) for f in fields(cls) if f.name not in own}
        return cls(**copied, **own)


def lr_factor(schedule: str, update: int, horizon: int) -> float:
    """The multiple of the base learning rate that update ``update`` (0-based) of a run
    of ``horizon`` updates takes: 1 throughout (constant), else from 1 at
    the first update toward 0 after the last, linearly or on a half cosine, as a
    scheduler stepped once per update does.  Past the horizon (a resumed run given more
    iterations) the rate stays at the last update's."""
    if schedule == "constant":
        return 1.0
    if horizon <= 0:
        raise ValueError(f"lr_schedule {schedule!r} needs a horizon of at least 1 update")
    progress = min(update, horizon - 1) / horizon
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {schedule!r}: constant, linear or cosine")


def objective(
    s: UpdateSettings,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mb: TrajectoryBatch,
    entropy: torch.Tensor | None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(task loss, regulariser loss, metrics) of a micro-batch under the settings ``s``:
    the one objective the update minimises and the gradient-SNR analysis takes apart.
    An off-policy correction weighs each token by its behaviour weight, the learner's
    old log-probs against the sampler's (``losses.behaviour_weights``)."""
    token_weights = None
    if s.off_policy != "none":
        token_weights = behaviour_weights(
            old_logprobs, mb.sampling_logprobs, s.off_policy, s.off_policy_cap
        )
    return ppo_objective(
        logprobs,
        old_logprobs,
        mb.advantages,
        mb.response_mask,
        ref_logprobs=mb.ref_logprobs,
        entropy=entropy,
        clip_low=s.clip_low,
        clip_high=s.clip_high,
        dual_clip=s.dual_clip,
        kl_coef=s.kl_coef,
        kl_estimator=s.kl_estimator,
        entropy_coef=s.entropy_coef,
        format_advantages=mb.format_advantages,
        format_coef=s.format_coef,
        agg=s.loss_agg,
        denominator=denominator,
        token_weights=token_weights,
    )


def aggregation_denominator(mask: torch.Tensor, mode: str) -> float:
    if mode == "token-mean":
        return float(mask.sum().clamp_min(1.0))
    if mode.startswith("turn-"):
        return float(max(turn_count(mask), 1))
    return float((mask.sum(-1) > 0).sum().clamp_min(1))


def trimmed_rows(
    batch: TrajectoryBatch, rows: torch.Tensor, device: torch.device | None = None
) -> TrajectoryBatch:
    """Rows of a batch, cut to their longest sequence (less padding to compute), on ``device``."""
    sub = batch.select(rows)
    width = int(sub.attention_mask.sum(-1).max())
    for name in (
        "input_ids",
        "attention_mask",
        "response_mask",
        "token_rewards",
        "sampling_logprobs",
        "old_logprobs",
        "ref_logprobs",
        "values",
        "advantages",
        "returns",
        "reasoning_mask",
        "malformed_mask",
        "format_advantages",
    ):
        value = getattr(sub, name)
        if value is not None:
            setattr(
                sub, name, value[:, :width].to(device) if device is not None else value[:, :width]
            )
    return sub


def rank_micro_batches(
    chunks: list[torch.Tensor], rank: int = 0, world_size: int = 1
) -> list[tuple[torch.Tensor, float]]:
    """This rank's micro-batches of ``chunks`` as (rows, weight): micro-batch k goes to
    rank k % world_size; a rank left short pads with a one-row copy of weight 0, so
    every rank makes ceil(n_micro / world_size) passes."""
    passes = math.ceil(len(chunks) / world_size)
    return [
        (chunks[k], 1.0) if k < len(chunks) else (chunks[0][:1], 0.0)
        for k in (step * world_size + rank for step in range(passes))
    ]


def _device(model) -> torch.device:
    return next(model.parameters()).device


def autocast(model, precision: str) -> AbstractContextManager:
    """The learner's forwards in ``precision`` (``UpdateSettings.autocast``): bfloat16
    autocast on the model's device, or nothing.  The vocabulary head and the
    log-softmax leave autocast (`vocab.head_logits`), so log-probs stay float32."""
    if precision == "none":
        return nullcontext()
    return torch.autocast(_device(model).type, dtype=torch.bfloat16)


def micro_batch_logprobs(
    model,
    mb: TrajectoryBatch,
    temperature: float,
    with_entropy: bool = False,
    shared_prefix: bool = True,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    only_read: bool = False,
):
    """(log-probs, entropy or None) [b, T] of a micro-batch: the shared-prefix forward
    when its rows share enough leading tokens, else the plain one.  Both agree on
    every non-padding position.  ``only_read``: the vocabulary head runs only where the
    update reads a log-prob or an entropy (``read_positions``), 0 elsewhere."""
    where = read_positions(mb) if only_read else None
    plan = (
        shared_prefix_plan(mb.input_ids, mb.attention_mask, mb.group_index)
        if shared_prefix
        else None
    )
    if plan is not None:
        return shared_prefix_token_logprobs(
            model,
            mb.input_ids,
            mb.attention_mask,
            mb.group_index,
            temperature,
            with_entropy,
            prefixes=plan[0],
            chunk_tokens=chunk_tokens,
            where=where,
        )
    return token_logprobs(
        model, mb.input_ids, mb.attention_mask, temperature, with_entropy, chunk_tokens, where
    )


def read_positions(mb: TrajectoryBatch) -> torch.Tensor:
    """[b, T] bool: the tokens whose log-prob or entropy the update reads, the agent's
    own (``response_mask``; the losses, the KL and entropy terms, their metrics) and the
    reasoning tokens (the reasoning entropy)."""
    read = mb.response_mask > 0
    return read if mb.reasoning_mask is None else read | (mb.reasoning_mask > 0)


@torch.no_grad()
def batch_logprobs(
    model,
    batch: TrajectoryBatch,
    temperature: float,
    micro_batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    shared_prefix: bool = True,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    precision: str = "none",
):
    """Per-token log-probs of the batch under ``model`` (no grad), [B, T].

    With ``world_size`` > 1 only this rank's rows are filled (the others stay 0), so
    the ranks' outputs sum to the whole batch's."""
    out = torch.zeros(batch.input_ids.shape)
    shared_prefix = shared_prefix and world_size == 1  # FSDP ranks: same forward count
    chunks = plan_micro_batches(batch, torch.arange(batch.size), micro_batch_size, shared_prefix)
    for rows, weight in rank_micro_batches(chunks, rank, world_size):
        sub = trimmed_rows(batch, rows, _device(model))
        with autocast(model, precision):
            lp, _ = micro_batch_logprobs(
                model,
                sub,
                temperature,
                shared_prefix=shared_prefix,
                chunk_tokens=chunk_tokens,
                only_read=True,
            )
        if weight:
            out[rows, : lp.shape[1]] = lp.float().cpu()
    return out


@torch.no_grad()
def batch_values(
    critic, batch: TrajectoryBatch, micro_batch_size: int, rank: int = 0, world_size: int = 1
):
    """Critic values [B, T]; rows split over ranks as in ``batch_logprobs``."""
    out = torch.zeros(batch.input_ids.shape)
    chunks = list(torch.split(torch.arange(batch.size), micro_batch_size))
    for rows, weight in rank_micro_batches(chunks, rank, world_size):
        sub = trimmed_rows(batch, rows, _device(critic))
        v = critic(sub.input_ids, sub.attention_mask)
        if weight:
            out[rows, : v.shape[1]] = v.float().cpu()
    return out


def prepare_batch(
    batch: TrajectoryBatch,
    model,
    s: UpdateSettings,
    recompute_old_logprobs: bool,
    reference=None,
    critic=None,
    rank: int = 0,
    world_size: int = 1,
    join: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
    reference_scope: Callable[[], AbstractContextManager] = nullcontext,
) -> TrajectoryBatch:
    """Old-policy log-probs, reference log-probs and critic values before the update.

    The sampler ran on exactly these weights, so its log-probs are the old policy's
    (unless ``recompute_old_logprobs``: an engine whose numerics differ, e.g. vLLM);
    recomputing them is a full forward pass spent on the same numbers.  ``join``
    sums the ranks' partial results (data parallel).  The reference forward runs
    inside ``reference_scope()``: with LoRA the reference is the policy module itself
    with its adapters disabled (``model.disable_adapter``)."""
    split = {"rank": rank, "world_size": world_size}

    def logprobs_of(module):  # this rank's share of the batch, as the update computes them
        return batch_logprobs(
            module,
            batch,
            s.temperature,
            s.micro_batch_size,
            shared_prefix=s.shared_prefix,
            chunk_tokens=s.logprob_chunk_tokens,
            precision=s.autocast,
            **split,
        )

    if recompute_old_logprobs:
        batch.old_logprobs = join(logprobs_of(model))
    else:
        batch.old_logprobs = batch.sampling_logprobs.clone()
    if reference is not None:
        with reference_scope():
            ref_logprobs = logprobs_of(reference)
        batch.ref_logprobs = join(ref_logprobs)
    if critic is not None:
        batch.values = join(batch_values(critic, batch, s.micro_batch_size, **split))
    return batch


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` that also takes FSDP2's sharded (DTensor) gradients: the
    total norm is reduced over the shards before the clip coefficient is applied."""
    params = [p for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(total, "full_tensor"):  # a DTensor holding a partial (per-shard) norm
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def _accumulate(metrics: dict[str, list], new: dict[str, float], weight: float) -> None:
    """One micro-batch's metrics, each with the micro-batch's weight (its loss tokens)."""
    for key, value in new.items():
        metrics.setdefault(key, []).append((float(value), float(weight)))


def _reduce(metrics: dict[str, list], steps: int) -> dict[str, float]:
    """The update's metrics from its micro-batches' (value, weight) pairs.  A ``*_loss``
    is a micro-batch's share of its optimiser step's loss (the step's denominator), so
    the shares are summed and averaged over the ``steps``; every other metric (clip
    fractions, ratios, entropy, grad norm) is a weighted mean.  Neither depends on how
    the steps' rows were cut into micro-batches."""
    out = {}
    for key, pairs in metrics.items():
        values = np.array([v for v, _ in pairs])
        weights = np.array([w for _, w in pairs])
        if key.endswith("_loss"):
            out[key] = float(values.sum() / steps)
        elif weights.sum() > 0:
            out[key] = float((values * weights).sum() / weights.sum())
        else:
            out[key] = float(values.mean())
    return out


def policy_update(
    model,
    optimizer,
    batch: TrajectoryBatch,
    s: UpdateSettings,
    seed: int = 0,
    critic=None,
    critic_optimizer=None,
    rank: int = 0,
    world_size: int = 1,
    gather_metrics: Callable[[dict[str, list]], dict[str, list]] | None = None,
) -> dict[str, float]:
    """PPO epochs over ``batch`` (advantages and old log-probs already set).

    Data parallel: every rank passes the whole batch and its ``rank``; the caller's
    gradient reduction must sum over ranks, and ``gather_metrics`` joins the ranks'
    per-micro-batch metric lists (so the means are over all micro-batches)."""
    assert batch.advantages is not None and batch.old_logprobs is not None
    model.train()
    device = _device(model)
    rng = np.random.default_rng(seed)
    metrics: dict[str, list] = {}
    need_entropy = True  # logged always; differentiated only when entropy_coef > 0
    shared_prefix = s.shared_prefix and world_size == 1  # FSDP ranks: same forward count
    # Token entropy on the reasoning tokens, token-weighted over the update's forwards.
    reasoning_entropy = torch.zeros(2, dtype=torch.float64)  # [sum, count]
    start = _trainable_snapshot(model)  # this rank's trainable weights before the update
    for _ in range(s.ppo_epochs):
        order = torch.as_tensor(rng.permutation(batch.size))
        for mb_rows in torch.tensor_split(order, min(s.minibatches, batch.size)):
            mb_mask = batch.response_mask[mb_rows]
            denominator = aggregation_denominator(mb_mask, s.loss_agg)
            optimizer.zero_grad(set_to_none=True)
            if critic_optimizer is not None:
                critic_optimizer.zero_grad(set_to_none=True)
            chunks = plan_micro_batches(batch, mb_rows, s.micro_batch_size, shared_prefix)
            for rows, weight in rank_micro_batches(chunks, rank, world_size):
                mb = trimmed_rows(batch, rows, device)
                with autocast(model, s.autocast):
                    logprobs, entropy = micro_batch_logprobs(
                        model,
                        mb,
                        s.temperature,
                        need_entropy,
                        shared_prefix,
                        s.logprob_chunk_tokens,
                        only_read=True,
                    )
                if s.entropy_coef == 0.0 and entropy is not None:
                    entropy = entropy.detach()
                task_loss, reg_loss, m = objective(
                    s, logprobs, mb.old_logprobs, mb, entropy, denominator
                )
                (weight * (task_loss + reg_loss)).backward()
                tokens = float(mb.response_mask.sum())
                if weight:
                    _accumulate(metrics, m, tokens)
                    if mb.reasoning_mask is not None:
                        with torch.no_grad():
                            reasoning_entropy += torch.stack(
                                [(entropy * mb.reasoning_mask).sum(), mb.reasoning_mask.sum()]
                            ).double()
                if critic is not None:
                    values = critic(mb.input_ids, mb.attention_mask)
                    vf_loss, vm = value_loss(
                        values,
                        mb.values,
                        mb.returns,
                        mb.response_mask,
                        agg=s.loss_agg,
                        denominator=denominator,
                    )
                    (weight * vf_loss).backward()
                    if weight:
                        _accumulate(metrics, vm, tokens)
            grad_norm = clip_grad_norm(model.parameters(), s.max_grad_norm)
            if rank == 0:  # the same (whole-model) norm on every rank: count it once
                _accumulate(metrics, {"actor/grad_norm": float(grad_norm)}, 1.0)
            if torch.isfinite(grad_norm):
                optimizer.step()
            if critic is not None:
                clip_grad_norm(critic.parameters(), s.max_grad_norm)
                critic_optimizer.step()
    model.eval()
    if reasoning_entropy[1] > 0:  # [sum, count] per rank, joined over ranks below
        metrics["_reasoning_entropy"] = reasoning_entropy.tolist()
    metrics["_update_sq"] = _update_squares(model, start)  # [Σ Δθ², Σ θ²] per rank
    if gather_metrics is not None:
        metrics = gather_metrics(metrics)
    pairs = metrics.pop("_reasoning_entropy", [])
    squares = metrics.pop("_update_sq", [])
    out = _reduce(metrics, steps=s.ppo_epochs * min(s.minibatches, batch.size))
    if pairs and sum(pairs[1::2]) > 0:
        out["collapse/reasoning_token_entropy"] = float(sum(pairs[0::2]) / sum(pairs[1::2]))
    if squares and sum(squares[1::2]) > 0:
        out["actor/update_ratio"] = math.sqrt(sum(squares[0::2]) / sum(squares[1::2]))
    out.update(advantage_metrics(batch))
    if s.off_policy != "none":  # over the whole batch: a max is the batch's, not a mean
        out.update(
            off_policy_metrics(
                batch.old_logprobs,
                batch.sampling_logprobs,
                batch.response_mask,
                s.off_policy,
                s.off_policy_cap,
            )
        )
    return out


def advantage_metrics(batch: TrajectoryBatch) -> dict[str, float]:
    """What the update is asked to learn from, over the trained (agent) tokens:
    ``actor/advantage_abs_mean``, ``actor/advantage_pos_frac`` (share of tokens pushed
    up), ``actor/advantage_zero_frac`` (share carrying no task signal, e.g. groups
    without reward spread) and ``actor/trained_tokens`` (docs/methods.md, "What the
    update sees")."""
    with torch.no_grad():
        advantages = batch.advantages[batch.response_mask > 0].double()
        if advantages.numel() == 0:
            return {"actor/trained_tokens": 0.0}
        return {
            "actor/advantage_abs_mean": float(advantages.abs().mean()),
            "actor/advantage_pos_frac": float((advantages > 0).double().mean()),
            "actor/advantage_zero_frac": float((advantages == 0).double().mean()),
            "actor/trained_tokens": float(advantages.numel()),
        }


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) parameter; the tensor itself otherwise."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _sharded_trainable(model) -> list[torch.Tensor]:
    """This rank's trainable weights, each as its shard.  An FSDP2 module left unsharded
    by a forward (the root keeps its weights gathered) is resharded first, so the same
    parameter has the same shape before and after the update."""
    if callable(getattr(model, "reshard", None)):
        model.reshard()
    return [_local(p.detach()) for p in model.parameters() if p.requires_grad]


def _trainable_snapshot(model) -> list[torch.Tensor]:
    """A CPU float32 copy of this rank's trainable weights (LoRA: the adapters)."""
    with torch.no_grad():
        return [p.to("cpu", torch.float32, copy=True) for p in _sharded_trainable(model)]


def _update_squares(model, start: list[torch.Tensor]) -> list[float]:
    """[Σ (θ − θ_start)², Σ θ_start²] over this rank's trainable weights: summed over
    ranks, their ratio's root is ``actor/update_ratio``, the update's relative size."""
    delta = total = 0.0
    with torch.no_grad():
        for p, p0 in zip(_sharded_trainable(model), start):
            now = p.to("cpu", torch.float32)
            delta += float((now - p0).double().square().sum())
            total += float(p0.double().square().sum())
    return [delta, total]
