"""Advantage estimators against hand-computed values (arithmetic in the comments)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    compute_advantages,
    masked_whiten,
    outcome_token_rewards,
)

SQRT3 = math.sqrt(3.0)


def _outcome_batch():
    # group 0: rewards 1,0,1,0; group 1: a single trajectory; group 2: two equal rewards
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0, 3.0, 3.0])  # [B=7]
    group_index = torch.tensor([0, 0, 0, 0, 1, 2, 2])
    response_mask = torch.tensor([[1, 1, 0]] * 7, dtype=torch.float32)  # [7,3]
    response_mask[2] = torch.tensor([0.0, 1.0, 1.0])
    return AdvantageInputs(scores, group_index, response_mask)


def test_grpo_hand_computed():
    adv, ret = compute_advantages("grpo", _outcome_batch())
    # group 0: mean 0.5; std (ddof 1) = sqrt(4·0.25/3) = 1/sqrt(3); (±0.5)·sqrt(3) = ±0.866025
    expected = torch.tensor([SQRT3 / 2, -SQRT3 / 2, SQRT3 / 2, -SQRT3 / 2, 0.0, 0.0, 0.0])
    inputs = _outcome_batch()
    torch.testing.assert_close(adv, expected[:, None] * inputs.response_mask, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret, adv)
    # row 2's mask is [0,1,1]: its first token gets nothing
    assert adv[2, 0] == 0.0 and adv[2, 1] > 0


def test_grpo_ddof0_and_singleton_group_is_zero():
    adv, _ = compute_advantages("grpo", _outcome_batch(), std_ddof=0)
    # population std of {1,0,1,0} = 0.5 -> ±0.5/0.5 = ±1; singleton group 1 -> 0 (not its raw score 2)
    assert adv[0, 0].item() == pytest.approx(1.0, abs=1e-5)
    assert adv[1, 0].item() == pytest.approx(-1.0, abs=1e-5)
    assert adv[4].abs().sum().item() == 0.0


def test_drgrpo_hand_computed():
    adv, _ = compute_advantages("drgrpo", _outcome_batch())
    # r − mean: group 0 -> ±0.5; group 1 singleton -> 0; group 2 equal rewards -> 0
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, 0.0, -0.5, 0.0, 0.0, 0.0]))
    assert adv[2, 1].item() == 0.5


def test_rloo_hand_computed():
    scores = torch.tensor([1.0, 2.0, 6.0, 4.0])
    inputs = AdvantageInputs(scores, torch.tensor([7, 7, 7, 42]), torch.ones(4, 2))
    adv, _ = compute_advantages("rloo", inputs)
    # group 7: 1 − (2+6)/2 = −3; 2 − (1+6)/2 = −1.5; 6 − (1+2)/2 = 4.5; group 42 singleton -> 0
    torch.testing.assert_close(adv, torch.tensor([[-3.0] * 2, [-1.5] * 2, [4.5] * 2, [0.0] * 2]))


def _gae_row():
    # one row: turn 1 = agent tokens 0,1; env text 2,3 (masked); turn 2 = agent tokens 4,5; pad 6
    response_mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0]], dtype=torch.float32)  # [1,7]
    token_rewards = torch.tensor(
        [[0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]]
    )  # turn rewards on last agent tokens
    values = torch.tensor(
        [[0.5, 0.4, 9.0, 9.0, 0.3, 0.2, 9.0]]
    )  # 9.0 on env/pad must never be used
    return AdvantageInputs(
        torch.tensor([3.0]), torch.tensor([0]), response_mask, token_rewards, values
    )


def test_gae_skips_env_tokens_gamma_lambda():
    adv, ret = compute_advantages("gae", _gae_row(), gamma=0.9, lam=0.8, whiten=False)
    # γλ = 0.72.  Backwards over agent tokens 5, 4, 1, 0:
    # t5: δ = 2 + 0.9·0 − 0.2 = 1.8;                A5 = 1.8
    # t4: δ = 0 + 0.9·0.2 − 0.3 = −0.12;            A4 = −0.12 + 0.72·1.8 = 1.176
    # t1: δ = 1 + 0.9·V4(0.3) − 0.4 = 0.87;        A1 = 0.87 + 0.72·1.176 = 1.71672
    # t0: δ = 0 + 0.9·0.4 − 0.5 = −0.14;            A0 = −0.14 + 0.72·1.71672 = 1.0960384
    expected_adv = torch.tensor([[1.0960384, 1.71672, 0.0, 0.0, 1.176, 1.8, 0.0]])
    # returns = A + V on agent tokens: 1.5960384, 2.11672, 1.476, 2.0
    expected_ret = torch.tensor([[1.5960384, 2.11672, 0.0, 0.0, 1.476, 2.0, 0.0]])
    torch.testing.assert_close(adv, expected_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, expected_ret, atol=1e-6, rtol=0)


def test_gae_defaults_are_monte_carlo_minus_value():
    adv, _ = compute_advantages("gae", _gae_row(), whiten=False)
    # γ = λ = 1: A_t = (sum of future rewards) − V_t: 3−0.5, 3−0.4, 2−0.3, 2−0.2
    torch.testing.assert_close(
        adv, torch.tensor([[2.5, 2.6, 0.0, 0.0, 1.7, 1.8, 0.0]]), atol=1e-6, rtol=0
    )


def test_gae_whitened_by_default_and_needs_values():
    inputs = _gae_row()
    adv, _ = compute_advantages("gae", inputs, gamma=0.9, lam=0.8)
    agent = adv[inputs.response_mask.bool()]
    assert agent.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert agent.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-4)
    assert adv[~inputs.response_mask.bool()].abs().sum().item() == 0.0
    inputs.values = None
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages("gae", inputs)


def test_reinforce_pp_hand_computed():
    response_mask = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0]], dtype=torch.float32)  # [2,4]
    token_rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0], [0.0, -1.0, 0.0, 0.0]])
    inputs = AdvantageInputs(
        torch.tensor([3.0, -1.0]), torch.tensor([0, 0]), response_mask, token_rewards
    )
    adv, ret = compute_advantages("reinforce_pp", inputs, gamma=0.5)
    # row 0: G3 = 2; G1 = 1 + 0.5·2 = 2 (env token 2 skipped); G0 = 0 + 0.5·2 = 1
    # row 1: G1 = −1; G0 = 0.5·(−1) = −0.5
    torch.testing.assert_close(ret, torch.tensor([[1.0, 2.0, 0.0, 2.0], [-0.5, -1.0, 0.0, 0.0]]))
    # whiten over the 5 agent tokens {1,2,2,−0.5,−1}: mean 0.7; squared deviations
    # .09+1.69+1.69+1.44+2.89 = 7.8; unbiased var 7.8/4 = 1.95; std 1.3964240
    std = math.sqrt(1.95)
    expected = torch.tensor([[0.3, 1.3, 0.0, 1.3], [-1.2, -1.7, 0.0, 0.0]]) / std
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_reinforce_pp_without_token_rewards_uses_score_on_last_agent_token():
    response_mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]], dtype=torch.float32)
    placed = outcome_token_rewards(torch.tensor([2.0, 5.0]), response_mask)
    torch.testing.assert_close(placed, torch.tensor([[0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]]))
    _, ret = compute_advantages(
        "reinforce_pp",
        AdvantageInputs(torch.tensor([2.0, 5.0]), torch.tensor([0, 1]), response_mask),
    )
    torch.testing.assert_close(ret, torch.tensor([[2.0, 2.0, 0.0, 0.0], [0.0, 5.0, 5.0, 5.0]]))


def test_masked_whiten_ignores_masked_positions():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # mean 2, unbiased var ((−1)²+1²)/1 = 2 -> ±1/sqrt(2); masked position -> 0
    out = masked_whiten(x, mask)
    torch.testing.assert_close(
        out, torch.tensor([[-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0]]), atol=1e-6, rtol=0
    )


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match="grpo") as info:
        compute_advantages("ppo2", _outcome_batch())
    assert "reinforce_pp" in str(info.value) and "ppo2" in str(info.value)


def test_shape_mismatch_is_reported():
    inputs = _outcome_batch()
    inputs.values = torch.zeros(7, 5)
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", inputs)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_every_estimator_is_zero_outside_mask(name):
    inputs = _gae_row()
    inputs = AdvantageInputs(
        torch.tensor([3.0, 1.0]),
        torch.tensor([0, 0]),
        torch.cat([inputs.response_mask, torch.tensor([[0, 1, 1, 0, 0, 0, 0.0]])]),
        torch.cat([inputs.token_rewards, torch.tensor([[0, 0, 1.0, 0, 0, 0, 0]])]),
        torch.cat([inputs.values, torch.full((1, 7), 0.1)]),
    )
    adv, ret = compute_advantages(name, inputs)
    off = ~inputs.response_mask.bool()
    assert adv[off].abs().sum().item() == 0.0 and ret[off].abs().sum().item() == 0.0
    assert adv[inputs.response_mask.bool()].abs().sum().item() > 0.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.floats(-5, 5, allow_nan=False)), min_size=1, max_size=12
    )
)
def test_group_baselines_sum_to_zero_within_each_group(rows):
    group_index = torch.tensor([g for g, _ in rows])
    scores = torch.tensor([r for _, r in rows], dtype=torch.float64)
    inputs = AdvantageInputs(scores, group_index, torch.ones(len(rows), 1, dtype=torch.float64))
    for name in ("grpo", "drgrpo", "rloo"):
        adv, _ = compute_advantages(name, inputs)
        assert torch.isfinite(adv).all()
        for g in group_index.unique():
            assert adv[group_index == g].sum().item() == pytest.approx(0.0, abs=1e-6)


def test_each_estimator_binds_the_config_fields_its_signature_names():
    from tether.algos.advantages import bound_params
    from tether.algos.settings import AlgoConfig

    algo = AlgoConfig(preset=None, gamma=0.9, lam=0.8)
    assert bound_params("gae", algo) == {"gamma": 0.9, "lam": 0.8}
    assert bound_params("reinforce_pp", algo) == {"gamma": 0.9}
    assert bound_params("grpo", algo) == bound_params("drgrpo", algo) == {}  # eps, ddof: own
