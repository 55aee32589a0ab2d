"""The off-policy corrections (``algo.off_policy``) against a hand computation.

One row of four agent tokens (and a padding token). The sampler's (behaviour) and the
learner's (old) log-probs give behaviour weights w = π_old / π_behaviour of
0.5, 1, 3 and 8; the current policy equals the old one except on token 2 (ratio 1.5,
clipped by ε_high = 0.28 at 1.28 for its positive advantage). Per token, the clipped
surrogate is −A·clip(ρ) = [−1, 1, −2.56, −2]:

    none:       mean [−1,      1, −2.56,     −2]   = −4.56 / 4 = −1.14
    tis C=2:    w' = [0.5, 1, 2, 2]  -> [−0.5, 1, −5.12, −4] = −8.62 / 4 = −2.155
    decoupled C=5: w' = [0.5, 1, 3, 0] -> [−0.5, 1, −7.68, 0] = −7.18 / 4 = −1.795

and the batch metrics: mean w = 12.5 / 4 = 3.125, max 8, share above the cap 2/4 (tis)
and 1/4 (decoupled), behaviour KL (k3) = mean(w − 1 − ln w) = 1.503773.
"""

from __future__ import annotations

import math

import pytest
import torch

from tether.algos.batch import TrajectoryBatch
from tether.algos.losses import behaviour_weights, off_policy_metrics
from tether.algos.update import objective
from tether.testing.settings import update_settings

WEIGHTS = [0.5, 1.0, 3.0, 8.0]
ADVANTAGES = [1.0, -1.0, 2.0, 2.0]
EXPECTED_LOSS = {"none": -1.14, "tis": -2.155, "decoupled": -1.795}
EXPECTED_WEIGHTS = {"tis": [0.5, 1.0, 2.0, 2.0], "decoupled": [0.5, 1.0, 3.0, 0.0]}


def _fixed_batch():
    """(the batch, the current policy's log-probs as a leaf tensor)."""
    behaviour = torch.tensor([[-1.0, -2.0, -3.0, -4.0, 0.0]])
    old = behaviour + torch.log(torch.tensor([[*WEIGHTS, 1.0]]))
    old[0, 4] = 0.0
    current = old.clone()
    current[0, 2] += math.log(1.5)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    batch = TrajectoryBatch(
        input_ids=torch.zeros(1, 5, dtype=torch.long),
        attention_mask=torch.ones(1, 5, dtype=torch.long),
        response_mask=mask,
        token_rewards=torch.zeros(1, 5),
        scores=torch.zeros(1),
        group_index=torch.zeros(1, dtype=torch.long),
        sampling_logprobs=behaviour,
        old_logprobs=old,
        advantages=torch.tensor([[*ADVANTAGES, 5.0]]),  # the padding's never counts
    )
    return batch, current.requires_grad_(True)


@pytest.mark.parametrize("mode", ["none", "tis", "decoupled"])
def test_correction_equals_the_hand_computation(mode):
    batch, current = _fixed_batch()
    s = update_settings(off_policy=mode, recompute_old_logprobs=True, clip_high=0.28)
    task_loss, reg_loss, metrics = objective(s, current, batch.old_logprobs, batch, None)
    assert task_loss.item() == pytest.approx(EXPECTED_LOSS[mode], abs=1e-6)
    assert reg_loss.item() == 0.0
    task_loss.backward()
    # d loss / d logπ of token 0 (ratio 1, A = 1, inside the clip): −A·ρ·w / 4
    w0 = 1.0 if mode == "none" else 0.5
    assert current.grad[0, 0].item() == pytest.approx(-1.0 * w0 / 4, abs=1e-6)
    if mode == "decoupled":  # token 3 (w = 8 > 5) is left out: no gradient at all
        assert current.grad[0, 3].item() == 0.0


@pytest.mark.parametrize("mode, cap", [("tis", 2.0), ("decoupled", 5.0)])
def test_weights_and_batch_metrics_by_hand(mode, cap):
    batch, _ = _fixed_batch()
    weights = behaviour_weights(batch.old_logprobs, batch.sampling_logprobs, mode, cap)
    assert weights[0, :4].tolist() == pytest.approx(EXPECTED_WEIGHTS[mode], abs=1e-6)
    assert not weights.requires_grad
    metrics = off_policy_metrics(
        batch.old_logprobs, batch.sampling_logprobs, batch.response_mask, mode, cap
    )
    assert metrics == pytest.approx(
        {
            "async/is_weight_mean": 3.125,
            "async/is_weight_max": 8.0,
            "async/is_clipped_frac": 0.5 if mode == "tis" else 0.25,
            "async/behaviour_kl": sum(w - 1 - math.log(w) for w in WEIGHTS) / 4,
        },
        abs=1e-6,
    )
    assert metrics["async/behaviour_kl"] == pytest.approx(1.503773, abs=1e-6)


def test_on_policy_batch_has_unit_weights_and_zero_kl():
    batch, _ = _fixed_batch()
    weights = behaviour_weights(batch.sampling_logprobs, batch.sampling_logprobs, "tis", 2.0)
    assert torch.equal(weights, torch.ones_like(weights))
    metrics = off_policy_metrics(
        batch.sampling_logprobs, batch.sampling_logprobs, batch.response_mask, "tis", 2.0
    )
    assert metrics["async/behaviour_kl"] == 0.0 and metrics["async/is_clipped_frac"] == 0.0


def test_off_policy_needs_recomputed_old_logprobs():
    from tether.algos.settings import AlgoConfig

    with pytest.raises(ValueError, match="recompute_old_logprobs: true"):
        AlgoConfig(off_policy="tis")
    with pytest.raises(ValueError, match="unknown off-policy correction"):
        behaviour_weights(torch.zeros(1, 1), torch.zeros(1, 1), "is", 2.0)
