"""Losses and aggregation against hand-computed values (arithmetic in the comments)."""

import math

import pytest
import torch

from tether.algos.losses import (
    aggregate,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    ppo_objective,
    regularizer_loss,
    value_loss,
)

LN2 = math.log(2.0)

# row 0 has 3 agent tokens, row 1 one, row 2 none (its values must never count)
VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])  # [3,4]
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)  # [3,4]


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 4.0),  # (1+2+3+10) / 4 tokens
        ("seq-mean-token-mean", 6.0),  # mean(2, 10); the empty row is left out
        ("seq-mean-token-sum", 8.0),  # mean(6, 10)
        ("turn-mean-token-mean", 6.0),  # one turn per row: the same as seq-mean-token-mean
    ],
)
def test_aggregate_modes(mode, expected):
    assert aggregate(VALUES, MASK, mode).item() == pytest.approx(expected)


def test_aggregate_global_denominator_for_micro_batches():
    # token-mean over a global count of 8 tokens: 16 / 8 = 2; seq-mean-token-sum over 4 sequences: 16/4
    assert aggregate(VALUES, MASK, "token-mean", denominator=8).item() == pytest.approx(2.0)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum", denominator=4).item() == pytest.approx(4.0)
    # two micro-batches with the global denominator sum to the full-batch loss
    full = aggregate(VALUES, MASK, "token-mean")
    parts = sum(
        aggregate(VALUES[i : i + 1], MASK[i : i + 1], "token-mean", denominator=4) for i in range(3)
    )
    assert parts.item() == pytest.approx(full.item())


# two multi-turn rows: row 0 a 1-token turn and a 3-token turn, row 1 one 2-token turn
TURN_VALUES = torch.tensor([[4.0, 9.0, 1.0, 2.0, 3.0, 9.0], [6.0, 8.0, 9.0, 9.0, 9.0, 9.0]])
TURN_MASK = torch.tensor([[1, 0, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.float32)


def test_turn_mean_weighs_every_turn_the_same():
    # turn means 4, (1+2+3)/3 = 2 and (6+8)/2 = 7 -> (4 + 2 + 7) / 3 turns
    assert aggregate(TURN_VALUES, TURN_MASK, "turn-mean-token-mean").item() == pytest.approx(13 / 3)
    # seq-mean-token-mean mixes row 0's turns by token count: mean((4+6)/4, 7) = 4.75
    assert aggregate(TURN_VALUES, TURN_MASK, "seq-mean-token-mean").item() == pytest.approx(4.75)
    # micro-batches of one row each over the whole batch's 3 turns add up to the full loss
    parts = sum(
        aggregate(TURN_VALUES[i : i + 1], TURN_MASK[i : i + 1], "turn-mean-token-mean", 3.0)
        for i in range(2)
    )
    assert parts.item() == pytest.approx(13 / 3)


def test_turn_mean_gradient_cancels_on_shared_first_turn():
    # The case the mode exists for (docs/methods.md, section 8): two episodes share their
    # first reply token; the one that fails (advantage -1) ends after one turn, the one
    # that succeeds (+1) takes a second 3-token turn.  Per episode token means push the
    # shared token down (weights +1/4 - 1/1); per turn means leave it alone (+1 - 1).
    mask = torch.tensor([[1, 0, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float32)
    advantages = torch.tensor([[1.0] * 5, [-1.0] * 5])
    for mode, shared in (("seq-mean-token-mean", (0.25 - 1.0) / 2), ("turn-mean-token-mean", 0.0)):
        logprobs = torch.zeros(2, 5, requires_grad=True)
        (-aggregate(logprobs * advantages, mask, mode)).backward()
        pushed_up = -(logprobs.grad[0, 0] + logprobs.grad[1, 0]).item()
        assert pushed_up == pytest.approx(shared), mode


def test_aggregate_unknown_mode_lists_valid():
    with pytest.raises(ValueError, match="seq-mean-token-sum"):
        aggregate(VALUES, MASK, "sum")


def _policy_case():
    # ratios 1.5, 0.5, 1.5, 0.5 with advantages +1, +1, −1, −1
    old = torch.zeros(1, 4)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])).requires_grad_(True)
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    return logprobs, old, advantages, torch.ones(1, 4)


def test_policy_loss_clips_both_sides():
    logprobs, old, adv, mask = _policy_case()
    loss, metrics = policy_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # t0: A=+1, ρ=1.5: max(−1.5, −1.28) = −1.28  (clipped high)
    # t1: A=+1, ρ=0.5: max(−0.5, −0.8)  = −0.5   (unclipped)
    # t2: A=−1, ρ=1.5: max(1.5, 1.28)   = 1.5    (unclipped)
    # t3: A=−1, ρ=0.5: max(0.5, 0.8)    = 0.8    (clipped low)
    # token-mean: (−1.28 − 0.5 + 1.5 + 0.8) / 4 = 0.13
    assert loss.item() == pytest.approx(0.13, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_high"] == pytest.approx(0.25)
    assert metrics["actor/pg_clipfrac_low"] == pytest.approx(0.25)
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0)
    # approx_kl = mean(−log ρ) = −(2 ln 1.5 + 2 ln 0.5)/4 = −ln(0.75)/2 = 0.1438410
    assert metrics["actor/approx_kl"] == pytest.approx(-math.log(0.75) / 2, abs=1e-6)
    loss.backward()
    # clipped tokens get no gradient; d(−Aρ)/dlogπ = −Aρ: t1 −0.5/4, t2 +1.5/4
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.125, 0.375, 0.0]]))


def test_clip_higher_is_asymmetric():
    old = torch.zeros(1, 1)
    logprobs = torch.log(torch.tensor([[1.25]]))
    adv = torch.ones(1, 1)
    loss_dapo, _ = policy_loss(logprobs, old, adv, torch.ones(1, 1), clip_low=0.2, clip_high=0.28)
    loss_sym, m = policy_loss(logprobs, old, adv, torch.ones(1, 1), clip_low=0.2, clip_high=0.2)
    assert loss_dapo.item() == pytest.approx(-1.25)  # 1.25 < 1.28: not clipped
    assert loss_sym.item() == pytest.approx(-1.2)  # clipped at 1.2
    assert m["actor/pg_clipfrac"] == 1.0


def test_dual_clip_caps_negative_advantage_loss():
    old = torch.zeros(1, 2)
    logprobs = torch.log(torch.tensor([[5.0, 5.0]]))
    adv = torch.tensor([[-1.0, 1.0]])
    loss, m = policy_loss(logprobs, old, adv, torch.ones(1, 2), dual_clip=3.0)
    # t0: A=−1, ρ=5: max(5, 1.28) = 5, capped at −A·3 = 3; t1: A=+1: max(−5, −1.28) = −1.28
    assert loss.item() == pytest.approx((3.0 - 1.28) / 2)
    assert m["actor/pg_clipfrac_dual"] == pytest.approx(0.5)
    no_dual, _ = policy_loss(logprobs, old, adv, torch.ones(1, 2))
    assert no_dual.item() == pytest.approx((5.0 - 1.28) / 2)
    with pytest.raises(ValueError):
        policy_loss(logprobs, old, adv, torch.ones(1, 2), dual_clip=0.5)


def test_policy_loss_aggregation_is_passed_through():
    logprobs, old, adv, _ = _policy_case()
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, _ = policy_loss(logprobs, old, adv, mask, agg="seq-mean-token-sum")
    # one sequence, token sum of t0..t2: −1.28 − 0.5 + 1.5 = −0.28
    assert loss.item() == pytest.approx(-0.28, abs=1e-6)


def test_kl_estimators_hand_computed():
    logprobs = torch.log(torch.tensor([0.5, 0.25]))
    ref = torch.log(torch.tensor([0.25, 0.5]))
    # log ratio = +ln2, −ln2
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k1"), torch.tensor([LN2, -LN2]))
    # k2 = ½·(ln2)² = 0.2402265 for both
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k2"), torch.tensor([0.5 * LN2**2] * 2))
    # k3 = e^{−x} − 1 + x: x=ln2 -> 0.5 − 1 + 0.693147 = 0.193147; x=−ln2 -> 2 − 1 − 0.693147 = 0.306853
    torch.testing.assert_close(
        kl_penalty(logprobs, ref, "k3"), torch.tensor([LN2 - 0.5, 1.0 - LN2])
    )
    torch.testing.assert_close(
        kl_penalty(logprobs, ref, "low_var_kl"), torch.tensor([LN2 - 0.5, 1.0 - LN2])
    )
    # low_var_kl clamps: x = −30 would give e^30 ≈ 1e13; clamped to 10
    assert kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl").item() == 10.0
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logprobs, ref, "k4")


def test_entropy_matches_manual():
    logits = torch.tensor([[0.0, math.log(3.0)], [1000.0, 1000.0]])  # second row: stability check
    # p = (1/4, 3/4): H = 0.25·ln4 + 0.75·ln(4/3) = 0.3465736 + 0.2157616 = 0.5623351
    expected = torch.tensor([0.25 * math.log(4) + 0.75 * math.log(4 / 3), LN2])
    torch.testing.assert_close(entropy_from_logits(logits), expected)
    uniform = torch.zeros(2, 3, 4)  # [B,T,V] -> [B,T], each ln 4
    torch.testing.assert_close(entropy_from_logits(uniform), torch.full((2, 3), math.log(4)))


def test_entropy_chunked_equals_unchunked_with_gradients():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    full = entropy_from_logits(logits, chunk_size=None)
    (grad_full,) = torch.autograd.grad(full.sum(), logits)
    chunked = entropy_from_logits(logits, chunk_size=4)  # 15 rows in 4 chunks, custom backward
    (grad_chunked,) = torch.autograd.grad(chunked.sum(), logits)
    torch.testing.assert_close(chunked, full)
    torch.testing.assert_close(grad_chunked, grad_full)
    # manual reference: −Σ p log p
    p = torch.softmax(logits.detach(), -1)
    torch.testing.assert_close(full.detach(), -(p * p.log()).sum(-1))


def test_chunked_entropy_gradcheck_and_low_precision_input():
    # analytic backward dH/dz = −p ⊙ (z − Σ p z) against finite differences (float64)
    logits = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, chunk_size=2), (logits,))
    half = torch.randn(6, 7).to(torch.bfloat16).requires_grad_(True)
    ent = entropy_from_logits(half, chunk_size=4)
    assert ent.dtype == torch.float32  # computed in float32 whatever the model dtype
    ent.sum().backward()
    assert half.grad.dtype == torch.bfloat16 and torch.isfinite(half.grad.float()).all()


def test_value_loss_clipped_and_unclipped():
    values = torch.tensor([[1.5, 1.0]])
    old = torch.tensor([[1.0, 0.0]])
    returns = torch.tensor([[2.0, 0.0]])
    mask = torch.ones(1, 2)
    loss, m = value_loss(values, old, returns, mask, clip=0.2)
    # t0: (1.5−2)² = 0.25; clipped V = 1.0 + 0.2 = 1.2 -> (1.2−2)² = 0.64; ½·max = 0.32 (clip active)
    # t1: (1−0)² = 1;      clipped V = 0 + 0.2 = 0.2 -> 0.04;             ½·max = 0.5
    assert loss.item() == pytest.approx((0.32 + 0.5) / 2)
    assert m["critic/vf_clipfrac"] == pytest.approx(0.5)
    loss_free, _ = value_loss(values, old, returns, mask, clip=None)
    assert loss_free.item() == pytest.approx(0.5 * (0.25 + 1.0) / 2)


def test_regularizer_hand_computed_and_required_inputs():
    logprobs = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    entropy = torch.tensor([[1.0, 2.0]])
    reg, m = regularizer_loss(
        torch.ones(1, 2),
        logprobs=logprobs,
        ref_logprobs=ref,
        entropy=entropy,
        kl_coef=0.1,
        entropy_coef=0.01,
        kl_estimator="k1",
    )
    # 0.1·ln2 − 0.01·1.5 = 0.0693147 − 0.015 = 0.0543147
    assert reg.item() == pytest.approx(0.1 * LN2 - 0.015, abs=1e-6)
    assert m["actor/kl_loss"] == pytest.approx(LN2, abs=1e-6)
    off, _ = regularizer_loss(torch.ones(1, 2))
    assert off.item() == 0.0 and not off.requires_grad
    with pytest.raises(ValueError, match="ref_logprobs"):
        regularizer_loss(torch.ones(1, 2), logprobs=logprobs, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy"):
        regularizer_loss(torch.ones(1, 2), entropy_coef=0.1)


def test_task_and_regulariser_gradients_are_separable():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, requires_grad=True)  # [B,T,V] stand-in for the policy's output
    tokens = torch.tensor([[0, 1, 2], [3, 4, 0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    ref_logits = torch.randn(2, 3, 5)

    def forward():
        logp_all = torch.log_softmax(logits, -1)
        logprobs = logp_all.gather(-1, tokens[..., None]).squeeze(-1)  # [B,T]
        ref = torch.log_softmax(ref_logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
        return logprobs, ref, entropy_from_logits(logits)

    kwargs = dict(kl_coef=0.05, entropy_coef=0.01, agg="seq-mean-token-mean")
    logprobs, ref, ent = forward()
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]])
    task, reg, metrics = ppo_objective(
        logprobs, logprobs.detach(), advantages, mask, ref_logprobs=ref, entropy=ent, **kwargs
    )
    g_task = torch.autograd.grad(task, logits, retain_graph=True)[0]
    g_reg = torch.autograd.grad(reg, logits)[0]
    logprobs, ref, ent = forward()
    task2, reg2, _ = ppo_objective(
        logprobs, logprobs.detach(), advantages, mask, ref_logprobs=ref, entropy=ent, **kwargs
    )
    g_total = torch.autograd.grad(task2 + reg2, logits)[0]
    torch.testing.assert_close(g_task + g_reg, g_total)
    assert g_task.norm() > 0 and g_reg.norm() > 0
    assert {"actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/reg_loss"} <= set(metrics)

    # a zero-variance group (all advantages 0) has zero task gradient but the same regulariser gradient
    logprobs, ref, ent = forward()
    task0, reg0, _ = ppo_objective(
        logprobs,
        logprobs.detach(),
        torch.zeros(2, 3),
        mask,
        ref_logprobs=ref,
        entropy=ent,
        **kwargs,
    )
    assert torch.autograd.grad(task0, logits, retain_graph=True)[0].abs().max() == 0.0
    torch.testing.assert_close(torch.autograd.grad(reg0, logits)[0], g_reg)
