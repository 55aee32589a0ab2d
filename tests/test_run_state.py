"""The driver's cadence rule (``due``) and its checkpoint schema (``RunState``), without
Ray: the iterations each cadence picks, and a RunState that comes back from a
checkpoint file as it went in (an older file without the newer fields loads too)."""

import numpy as np
import torch

from tether.platform.run.cadence import due
from tether.platform.run.run_state import RunState


def _picked(every, **ends):
    return [it for it in range(1, 13) if due(it, every, **ends)]


def test_due_picks_multiples_and_the_ends_asked_for():
    assert _picked(5) == [5, 10]
    assert _picked(5, first=True) == [1, 5, 10]
    assert _picked(5, last=12) == [5, 10, 12]
    assert _picked(5, first=True, last=12) == [1, 5, 10, 12]
    assert _picked(1) == list(range(1, 13))
    assert _picked(20, first=True, last=12) == [1, 12]
    # 0 is "never": not the multiples, not the ends either (checkpoint_every = 0)
    assert _picked(0, first=True, last=12) == []


def _state(**overrides):
    values = dict(
        iteration=4,
        run_id="abc",
        config={"trainer": {"iterations": 9}},
        sampler_position=32,
        mi_ema_state={"first_turn": 0.25},
        alarms={"template_collapse": {"window": [1.0]}},
        worker_failures=1,
        val_history={0: 0.25, 4: 0.5},
        val_intervals={0: (0.05, 0.7), 4: (0.2, 0.8)},
    )
    return RunState(**{**values, **overrides})


def test_run_state_comes_back_from_a_checkpoint_file_as_it_went_in(tmp_path):
    state = _state(control={"knobs": {"kl_coef": 0.1}})
    torch.save({"driver": state.to_checkpoint()}, tmp_path / "c.pt")
    back = RunState.from_checkpoint(torch.load(tmp_path / "c.pt", weights_only=False)["driver"])
    for name in ("iteration", "run_id", "config", "sampler_position", "mi_ema_state"):
        assert getattr(back, name) == getattr(state, name), name
    assert (back.alarms, back.worker_failures) == (state.alarms, state.worker_failures)
    assert back.val_history == state.val_history and back.val_intervals == state.val_intervals
    assert back.control == {"knobs": {"kl_coef": 0.1}}
    assert torch.equal(back.torch_rng, state.torch_rng)
    assert all(np.array_equal(a, b) for a, b in zip(back.numpy_rng, state.numpy_rng))


def test_run_state_restores_the_random_generators():
    state = _state()
    expected = (np.random.rand(), torch.rand(1).item())
    np.random.rand(5), torch.rand(5)
    state.restore_rng()
    assert (np.random.rand(), torch.rand(1).item()) == expected


def test_a_checkpoint_from_before_val_intervals_and_control_still_loads():
    old = _state().to_checkpoint()
    del old["val_intervals"]
    assert "control" not in old, "no control key when no alarm acts (as before RunState)"
    back = RunState.from_checkpoint(old)
    assert back.val_intervals == {} and back.control is None
    assert back.val_history == {0: 0.25, 4: 0.5}
