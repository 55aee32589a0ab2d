"""Policy, value and regulariser losses (docs/methods.md, sections 8 and 10).

All functions are pure tensor maths; every loss returns ``(loss, metrics)`` where
``metrics`` is a dict of python floats under ``actor/`` or ``critic/`` keys.

Loss aggregation lives in one place, ``aggregate(values, mask, mode)``:
  - ``token-mean``:          Σ_bt v·m / Σ_bt m                   (PPO, DAPO)
  - ``seq-mean-token-mean``: mean_b [Σ_t v·m / Σ_t m]            (GRPO)
  - ``seq-mean-token-sum``:  mean_b [Σ_t v·m]                    (Dr.GRPO)
  - ``turn-mean-token-mean``: mean over turns [Σ_t∈turn v / |turn|], a turn being one
    unbroken run of agent tokens, so every reply of a multi-turn row weighs the same
    whatever the length of the episode it belongs to
Rows with no agent token are left out of the sequence means.  ``denominator``
overrides the token count (token-mean), sequence count (seq-*) or turn count
(turn-*) so that micro-batches summed together equal the full-batch loss.

The task loss (clipped policy gradient) and the regulariser loss (KL to the
reference, entropy bonus) are returned separately by ``ppo_objective`` so the
learner can backpropagate each alone for the gradient-SNR analysis (docs/methods.md, 10):
total loss = task_loss + reg_loss.

Sign conventions: losses are minimised; ``reg_loss = kl_coef·KL − entropy_coef·H``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

# --------------------------------------------------------------------------- aggregation


def _token_mean(values: Tensor, mask: Tensor, denominator: float | None) -> Tensor:
    total = (values * mask).sum()
    count = mask.sum().clamp_min(1.0) if denominator is None else denominator
    return total / count


def _seq_mean(
    values: Tensor, mask: Tensor, denominator: float | None, per_token_mean: bool
) -> Tensor:
    token_sum = (values * mask).sum(dim=-1)  # [B]
    tokens = mask.sum(dim=-1)  # [B]
    per_seq = token_sum / tokens.clamp_min(1.0) if per_token_mean else token_sum  # [B]
    has_tokens = (tokens > 0).to(values.dtype)  # [B]
    count = has_tokens.sum().clamp_min(1.0) if denominator is None else denominator
    return (per_seq * has_tokens).sum() / count


def turn_index(mask: Tensor) -> Tensor:
    """[B,T] long: 1, 2, ... on the agent tokens of a row's first, second, ... turn (a
    turn is one unbroken run of mask 1s), 0 elsewhere."""
    maskf = mask.to(torch.float32)
    starts = maskf * (1.0 - F.pad(maskf[:, :-1], (1, 0)))
    return (starts.cumsum(-1) * maskf).long()


def turn_count(mask: Tensor) -> int:
    """How many turns (unbroken runs of agent tokens) the rows of ``mask`` hold."""
    return int(turn_index(mask).amax(dim=-1).sum()) if mask.numel() else 0


def _turn_mean(values: Tensor, mask: Tensor, denominator: float | None) -> Tensor:
    turns = turn_index(mask)  # [B,T]
    width = int(turns.max()) + 1 if turns.numel() else 1
    bucket = (
        torch.arange(values.shape[0], device=values.device)[:, None] * width + turns
    ).flatten()
    size = values.shape[0] * width
    sums = values.new_zeros(size).scatter_add(0, bucket, (values * mask).flatten())
    tokens = values.new_zeros(size).scatter_add(0, bucket, mask.flatten())
    has_tokens = (tokens > 0).to(values.dtype)
    count = has_tokens.sum().clamp_min(1.0) if denominator is None else denominator
    return (sums / tokens.clamp_min(1.0) * has_tokens).sum() / count


AGGREGATION_MODES: dict[str, Callable[[Tensor, Tensor, float | None], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": lambda v, m, d: _seq_mean(v, m, d, per_token_mean=True),
    "seq-mean-token-sum": lambda v, m, d: _seq_mean(v, m, d, per_token_mean=False),
    "turn-mean-token-mean": _turn_mean,
}


def aggregate(
    values: Tensor, mask: Tensor, mode: str = "token-mean", denominator: float | None = None
) -> Tensor:
    """Reduce per-token ``values[B,T]`` over ``mask[B,T]`` to a scalar with ``mode``."""
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid: {sorted(AGGREGATION_MODES)}")
    return AGGREGATION_MODES[mode](values, mask.to(values.dtype), denominator)


def _masked_mean_float(x: Tensor, mask: Tensor) -> float:
    """Token mean of a (detached) tensor, as a python float for logging."""
    with torch.no_grad():
        maskf = mask.to(x.dtype)
        return float((x * maskf).sum() / maskf.sum().clamp_min(1.0))


# --------------------------------------------------------------------------- policy loss


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    dual_clip: float | None = None,
    denominator: float | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with separate low/high clip (DAPO's clip-higher).

    per token: max(−A·ρ, −A·clip(ρ, 1−clip_low, 1+clip_high)), ρ = exp(logπ − logπ_old).
    ``dual_clip`` = c > 1 additionally caps the loss of negative-advantage tokens at
    −A·c (Ye et al. 2020), so a huge ratio on a bad token cannot blow up the update.
    ``token_weights`` [B,T] (no gradient) multiply each token's term before aggregation:
    the off-policy correction's behaviour weights (``behaviour_weights``).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (got {dual_clip})")
    maskf = mask.to(logprobs.dtype)  # [B,T]
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # [B,T] clamp: exp stays finite
    ratio = torch.exp(log_ratio)  # [B,T]
    advantages = advantages.detach()
    pg_unclipped = -advantages * ratio  # [B,T]
    pg_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B,T]
    pg = torch.maximum(pg_unclipped, pg_clipped)  # [B,T]
    dual_clipped = torch.zeros_like(pg, dtype=torch.bool)
    if dual_clip is not None:
        cap = -advantages * dual_clip  # [B,T]
        dual_clipped = (advantages < 0) & (pg > cap)
        pg = torch.where(advantages < 0, torch.minimum(pg, cap), pg)
    if token_weights is not None:
        pg = pg * token_weights.detach()  # [B,T]
    loss = aggregate(pg, maskf, agg, denominator)

    with torch.no_grad():
        clipped = (pg_clipped > pg_unclipped).to(pg.dtype)  # the clip is the active branch
        clipped_high = ((ratio > 1.0 + clip_high) & (advantages > 0)).to(pg.dtype)
        clipped_low = ((ratio < 1.0 - clip_low) & (advantages < 0)).to(pg.dtype)
        metrics = {
            "actor/pg_loss": float(loss.detach()),
            "actor/pg_clipfrac": _masked_mean_float(clipped, maskf),
            "actor/pg_clipfrac_high": _masked_mean_float(clipped_high, maskf),
            "actor/pg_clipfrac_low": _masked_mean_float(clipped_low, maskf),
            "actor/pg_clipfrac_dual": _masked_mean_float(dual_clipped.to(pg.dtype), maskf),
            # approx KL(π_old‖π) with the k1 estimator, as PPO implementations log it
            "actor/approx_kl": _masked_mean_float(-log_ratio.detach(), maskf),
            "actor/ratio_mean": _masked_mean_float(ratio.detach(), maskf),
        }
    return loss, metrics


# --------------------------------------------------------------------------- off-policy correction


def _tis_weights(ratio: Tensor, cap: float) -> Tensor:
    # truncated importance sampling (Yao et al. 2025, as in veRL and SkyRL): min(w, C)
    return ratio.clamp(max=cap)


def _decoupled_weights(ratio: Tensor, cap: float) -> Tensor:
    # the decoupled PPO objective's behaviour weight (Fu et al. 2025, AReaL): w, and tokens
    # whose w exceeds the cap are left out (weight 0) rather than truncated
    return torch.where(ratio <= cap, ratio, torch.zeros_like(ratio))


#: Names as in ``settings.OFF_POLICY_NAMES`` (``algo.off_policy``); "none" has no weights.
OFF_POLICY_CORRECTIONS: dict[str, Callable[[Tensor, float], Tensor]] = {
    "tis": _tis_weights,
    "decoupled": _decoupled_weights,
}


def behaviour_weights(
    old_logprobs: Tensor, behaviour_logprobs: Tensor, mode: str, cap: float
) -> Tensor:
    """Per-token weight [B,T] of the off-policy correction ``mode`` (no gradient).

    w = π_old / π_behaviour = exp(logπ_old − logπ_behaviour): π_old is the learner's policy
    when the batch arrived (its recomputed log-probs: the proximal policy of the decoupled
    objective), π_behaviour the (possibly older) policy that sampled the tokens.
    ``tis``: min(w, cap); ``decoupled``: w where w <= cap, else 0."""
    if mode not in OFF_POLICY_CORRECTIONS:
        raise ValueError(
            f"unknown off-policy correction {mode!r}; valid: {sorted(OFF_POLICY_CORRECTIONS)}"
        )
    with torch.no_grad():
        log_ratio = (old_logprobs - behaviour_logprobs).clamp(-20.0, 20.0)  # [B,T]
        return OFF_POLICY_CORRECTIONS[mode](torch.exp(log_ratio), cap)


def off_policy_metrics(
    old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, mode: str, cap: float
) -> dict[str, float]:
    """How far the sampler's policy is from the learner's, over the agent tokens of a batch:
    ``async/is_weight_mean`` and ``async/is_weight_max`` of w = π_old / π_behaviour before
    the cap, ``async/is_clipped_frac`` (share of tokens whose w exceeds the cap: truncated
    by ``tis``, dropped by ``decoupled``) and ``async/behaviour_kl``, the k3 estimate of
    KL(π_behaviour ‖ π_old) from the sampled tokens: mean of w − 1 − log w."""
    with torch.no_grad():
        log_ratio = (old_logprobs - behaviour_logprobs).clamp(-20.0, 20.0)[mask > 0].double()
        if log_ratio.numel() == 0:
            return {}
        ratio = torch.exp(log_ratio)
        return {
            "async/is_weight_mean": float(ratio.mean()),
            "async/is_weight_max": float(ratio.max()),
            "async/is_clipped_frac": float((ratio > cap).double().mean()),
            "async/behaviour_kl": float((ratio - 1.0 - log_ratio).mean()),
        }


# --------------------------------------------------------------------------- KL and entropy


def _kl_k1(log_ratio: Tensor) -> Tensor:
    return log_ratio


def _kl_abs(log_ratio: Tensor) -> Tensor:
    return log_ratio.abs()


def _kl_k2(log_ratio: Tensor) -> Tensor:
    return 0.5 * log_ratio.square()


def _kl_k3(log_ratio: Tensor) -> Tensor:
    # k3 = ρ − 1 − log ρ with ρ = π_ref/π = exp(−log_ratio): unbiased, always ≥ 0
    return torch.exp(-log_ratio) - 1.0 + log_ratio


def _kl_low_var(log_ratio: Tensor) -> Tensor:
    # k3 with the clamps veRL/RAGEN use so rare tokens cannot produce inf/huge values
    return _kl_k3(log_ratio.clamp(-20.0, 20.0)).clamp(-10.0, 10.0)


#: Names as in ``settings.KL_ESTIMATOR_NAMES`` (``algo.kl_estimator``).
KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": _kl_k1,
    "k2": _kl_k2,
    "k3": _kl_k3,
    "abs": _kl_abs,
    "low_var_kl": _kl_low_var,
}


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π‖π_ref) from sampled-token log-probs.  [B,T] -> [B,T].

    k1 = logπ − logπ_ref; k2 = ½(logπ − logπ_ref)²; k3 = π_ref/π − 1 − log(π_ref/π)
    (Schulman's estimators); ``low_var_kl`` = clamped k3.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](logprobs - ref_logprobs)


def _entropy_chunk(logits: Tensor) -> Tensor:
    # H = logsumexp(z) − Σ softmax(z)·z : one softmax, no log(0).  Shifting z by its max
    # first keeps both terms small, so their difference does not lose float32 precision.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16/fp16 -> fp32
    logits = logits - logits.amax(dim=-1, keepdim=True).detach()
    return torch.logsumexp(logits, dim=-1) - (F.softmax(logits, dim=-1) * logits).sum(dim=-1)


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy whose forward and backward each walk the rows ``chunk_size`` at a time.

    Only the logits are saved; backward recomputes p per chunk and uses
    dH/dz = −p ⊙ (z − Σ p z), so no [N,V] float32 softmax is ever kept for autograd.
    """

    @staticmethod
    def forward(ctx, flat_logits: Tensor, chunk_size: int) -> Tensor:  # [N,V] -> [N]
        ctx.save_for_backward(flat_logits)
        ctx.chunk_size = chunk_size
        with torch.no_grad():
            return torch.cat(
                [
                    _entropy_chunk(flat_logits[i : i + chunk_size])
                    for i in range(0, flat_logits.shape[0], chunk_size)
                ]
            )

    @staticmethod
    def backward(ctx, grad_entropy: Tensor) -> tuple[Tensor, None]:  # [N] -> [N,V]
        (flat_logits,) = ctx.saved_tensors
        grad = torch.empty_like(flat_logits)
        for i in range(0, flat_logits.shape[0], ctx.chunk_size):
            z = flat_logits[i : i + ctx.chunk_size]
            z = z.to(torch.promote_types(z.dtype, torch.float32))  # [n,V]
            p = F.softmax(z, dim=-1)
            expected_z = (p * z).sum(dim=-1, keepdim=True)  # [n,1]
            grad[i : i + ctx.chunk_size] = (
                -p * (z - expected_z) * grad_entropy[i : i + ctx.chunk_size, None]
            ).to(grad.dtype)
        return grad, None


def entropy_from_logits(logits: Tensor, chunk_size: int | None = 1024) -> Tensor:
    """Per-position entropy of softmax(logits).  [..., V] -> [...], in at least float32.

    Rows are processed ``chunk_size`` at a time so the float32 softmax of the whole
    [B·T, V] tensor never exists at once, in forward or (via ``_ChunkedEntropy``)
    in backward.  ``chunk_size=None`` uses plain autograd on one chunk.
    """
    lead_shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])  # [N,V]
    if chunk_size is None or flat.shape[0] <= chunk_size:
        return _entropy_chunk(flat).reshape(lead_shape)
    return _ChunkedEntropy.apply(flat, chunk_size).reshape(lead_shape)


# --------------------------------------------------------------------------- value loss


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss: ½·max((V − R)², (V_old + clip(V − V_old, ±clip) − R)²)."""
    maskf = mask.to(values.dtype)  # [B,T]
    returns = returns.detach()
    err_unclipped = (values - returns).square()  # [B,T]
    if clip is None:
        per_token = 0.5 * err_unclipped
        clipped = torch.zeros_like(per_token)
    else:
        values_clipped = old_values + (values - old_values).clamp(-clip, clip)  # [B,T]
        err_clipped = (values_clipped - returns).square()  # [B,T]
        per_token = 0.5 * torch.maximum(err_unclipped, err_clipped)
        clipped = (err_clipped > err_unclipped).to(values.dtype).detach()
    loss = aggregate(per_token, maskf, agg, denominator)
    metrics = {
        "critic/vf_loss": float(loss.detach()),
        "critic/vf_clipfrac": _masked_mean_float(clipped, maskf),
        "critic/vpred_mean": _masked_mean_float(values.detach(), maskf),
        "critic/returns_mean": _masked_mean_float(returns, maskf),
    }
    return loss, metrics


# --------------------------------------------------------------------------- regulariser and objective


def regularizer_loss(
    mask: Tensor,
    logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    kl_estimator: str = "k3",
    agg: str = "token-mean",
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """kl_coef·agg(KL(π‖π_ref)) − entropy_coef·agg(H), input-agnostic regularisers.

    A term with coefficient 0 is skipped (its inputs may be None).  When both are
    off the loss is a constant 0 tensor with ``requires_grad=False``: callers that
    backpropagate it alone must check ``reg_loss.requires_grad`` first.
    """
    maskf = mask.to(torch.float32) if logprobs is None else mask.to(logprobs.dtype)
    reg = torch.zeros((), dtype=maskf.dtype, device=maskf.device)
    metrics: dict[str, float] = {}
    if kl_coef != 0.0:
        if logprobs is None or ref_logprobs is None:
            raise ValueError(
                "kl_coef != 0 needs logprobs and ref_logprobs (is the reference model on?)"
            )
        kl_tokens = kl_penalty(logprobs, ref_logprobs, kl_estimator)  # [B,T]
        kl = aggregate(kl_tokens, maskf, agg, denominator)
        reg = reg + kl_coef * kl
        metrics["actor/kl_loss"] = float(kl.detach())
        metrics["actor/kl_coef"] = float(kl_coef)
    if entropy_coef != 0.0:
        if entropy is None:
            raise ValueError("entropy_coef != 0 needs per-token entropy (entropy_from_logits)")
        ent = aggregate(entropy, maskf, agg, denominator)
        reg = reg - entropy_coef * ent
        metrics["actor/entropy_loss"] = float(ent.detach())
    metrics["actor/reg_loss"] = float(reg.detach())
    return reg, metrics


def ppo_objective(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy_coef: float = 0.0,
    format_advantages: Tensor | None = None,
    format_coef: float = 0.0,
    agg: str = "token-mean",
    denominator: float | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """-> (task_loss, reg_loss, metrics); minimise task_loss + reg_loss.

    ``token_weights`` (the off-policy correction's) weigh the policy-gradient term only.
    ``format_coef`` > 0 adds the format term to ``reg_loss``: the same clipped surrogate
    on ``format_advantages`` (``advantages.format_advantages``), which depend on whether a
    reply is well-formed and not on its input's rewards, so the gradient-SNR analysis
    counts it with the input-agnostic terms.

    The two are separate graphs' worth of terms on the same forward pass, so
    ``task_loss.backward(retain_graph=True)`` and ``reg_loss.backward()`` give the
    task and regulariser gradients separately (the gradient-SNR analysis).
    """

    def surrogate(per_token_advantages: Tensor) -> tuple[Tensor, dict[str, float]]:
        return policy_loss(
            logprobs,
            old_logprobs,
            per_token_advantages,
            mask,
            clip_low=clip_low,
            clip_high=clip_high,
            agg=agg,
            dual_clip=dual_clip,
            denominator=denominator,
            token_weights=token_weights,
        )

    task_loss, metrics = surrogate(advantages)
    reg_loss, reg_metrics = regularizer_loss(
        mask,
        logprobs=logprobs,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        kl_estimator=kl_estimator,
        agg=agg,
        denominator=denominator,
    )
    metrics.update(reg_metrics)
    if format_coef != 0.0:
        if format_advantages is None:
            raise ValueError(
                "format_coef != 0 needs format_advantages (advantages.format_advantages)"
            )
        format_loss, _ = surrogate(format_advantages)
        reg_loss = reg_loss + format_coef * format_loss
        metrics["actor/format_loss"] = float(format_loss.detach())
        metrics["actor/reg_loss"] = float(reg_loss.detach())
    if entropy is not None:
        metrics["actor/entropy"] = _masked_mean_float(entropy.detach(), mask)
    return task_loss, reg_loss, metrics
