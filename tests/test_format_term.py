"""The format term (``algo.format_coef``): advantages outside any group, counted with the
regularisers, and a group whose episodes all fail keeps its zero task advantage."""

import pytest
import torch

from tether.agent.types import Trajectory, Turn
from tether.algos.advantages import format_advantages
from tether.algos.batch import collate
from tether.algos.losses import ppo_objective
from tether.algos.settings import AlgoConfig
from tether.platform.run.stages import advantages


def _turn(start: int, end: int, ok: bool, reward: float = 0.0) -> Turn:
    return Turn(start - 1, start, end, "s", "r", None, "a" if ok else None, ok, ok, reward)


def _trajectory(group: int, turns: list[Turn], length: int) -> Trajectory:
    mask = [0] * length
    for turn in turns:
        mask[turn.reply_start : turn.reply_end] = [1] * (turn.reply_end - turn.reply_start)
    return Trajectory(group, 0, 0, list(range(length)), mask, [0.0] * length, turns)


def test_malformed_mask_marks_only_the_malformed_replies_tokens():
    traj = _trajectory(0, [_turn(1, 3, True), _turn(4, 7, False)], 8)
    assert traj.malformed_mask() == [0, 0, 0, 0, 1, 1, 1, 0]
    batch = collate([traj], pad_id=0)
    assert batch.malformed_mask.tolist() == [[0, 0, 0, 0, 1, 1, 1, 0]]


def test_format_advantages_centre_on_the_batch_share_of_malformed_replies():
    # three replies, one malformed: share 1/3; its tokens -2/3, the others' +1/3, the rest 0
    response = torch.tensor([[0, 1, 1, 0, 1, 1], [0, 1, 1, 1, 0, 0]], dtype=torch.float32)
    malformed = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    adv = format_advantages(malformed, response)
    third = 1.0 / 3.0
    expected = [[0, third, third, 0, -2 * third, -2 * third], [0, third, third, third, 0, 0]]
    assert torch.allclose(adv, torch.tensor(expected))
    assert format_advantages(torch.zeros_like(response), response).abs().sum() == 0
    assert format_advantages(malformed, torch.zeros_like(response)).abs().sum() == 0


def test_all_fail_group_keeps_zero_task_advantage_and_gets_the_format_push():
    # group 0: all four episodes fail, one malformed reply; group 1: one success
    g0 = [_trajectory(0, [_turn(1, 4, ok=k != 0)], 5) for k in range(4)]
    g1 = [_trajectory(1, [_turn(1, 4, True, reward=float(k == 0))], 5) for k in range(4)]
    algo = AlgoConfig(preset=None, advantage="drgrpo", format_coef=0.5)
    batch = advantages(collate(g0 + g1, pad_id=0), algo)
    assert batch.advantages[:4].abs().sum() == 0  # no reward spread: no task gradient
    assert batch.advantages[4, 1].item() == pytest.approx(0.75)
    share = 1.0 / 8.0
    assert batch.format_advantages[0, 1:4].tolist() == pytest.approx([share - 1.0] * 3)
    assert batch.format_advantages[1, 1:4].tolist() == pytest.approx([share] * 3)
    off = advantages(collate(g0 + g1, pad_id=0), AlgoConfig(preset=None, advantage="drgrpo"))
    assert off.format_advantages is None


def test_format_term_is_a_regulariser_that_lowers_a_malformed_reply():
    logprobs = torch.full((2, 3), -1.0, requires_grad=True)
    mask = torch.ones(2, 3)
    fmt = torch.tensor([[-0.5, -0.5, -0.5], [0.5, 0.5, 0.5]])  # row 0 malformed
    zero = torch.zeros(2, 3)
    task, reg, metrics = ppo_objective(
        logprobs, logprobs.detach(), zero, mask, format_advantages=fmt, format_coef=2.0
    )
    assert not task.requires_grad or float(task) == 0.0
    (grad,) = torch.autograd.grad(reg, logprobs)
    # d reg / d logprob = -coef * A / 6 tokens at ratio 1: +1/6 on the malformed row
    assert grad[0].tolist() == pytest.approx([1 / 6] * 3)
    assert grad[1].tolist() == pytest.approx([-1 / 6] * 3)
    assert metrics["actor/format_loss"] == pytest.approx(0.0)  # centred: sums to 0 at ratio 1
    with pytest.raises(ValueError, match="format_advantages"):
        ppo_objective(logprobs, logprobs.detach(), zero, mask, format_coef=1.0)
