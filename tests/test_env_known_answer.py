"""The known-answer envs: the reward is the stated function of the prompt and the answer."""

import numpy as np
import pytest

from tether.envs import make


def test_choice_rewards_the_named_colour_only():
    env = make("tether/Choice-v0", n_options=4)
    state, _ = env.reset(seed=3)
    target = env.target
    assert state == f"Say {target}."
    others = [c for c in env.options if c != target]
    assert env.step(target)[1:4] == (1.0, True, False)
    env.reset(seed=3)
    assert env.step(f"  {target.upper()} ")[1] == 1.0  # case and spaces do not matter
    for other in others:
        env.reset(seed=3)
        _, reward, done, _, info = env.step(other)
        assert (reward, done, info["success"], info["action_is_valid"]) == (0.0, True, False, True)
    env.reset(seed=3)
    _, reward, _, _, info = env.step("purple")
    assert reward == env.format_penalty and not info["action_is_valid"]


def test_choice_targets_are_uniform_over_levels():
    env = make("choice", n_options=4)
    targets = [env.reset(seed=s)[0] for s in range(2000)]
    counts = np.unique(targets, return_counts=True)[1]
    assert len(counts) == 4 and counts.min() > 400


def test_doors_needs_every_key_and_ends_on_a_wrong_one():
    env = make("tether/Doors-v0", n_doors=3, n_keys=2)
    state, _ = env.reset(seed=5)
    keys = list(env.keys)
    assert state == f"Door 1 of 3 needs {keys[0]}." and env.solve() == keys
    assert env.step(keys[0])[1:3] == (0.0, False)
    assert env.step(keys[1])[0] == f"Door 3 of 3 needs {keys[2]}."
    _, reward, done, _, info = env.step(keys[2])
    assert (reward, done, info["success"]) == (1.0, True, True)
    env.reset(seed=5)
    wrong = next(k for k in env.action_names if k != keys[0])
    _, reward, done, _, info = env.step(wrong)
    assert (reward, done, info["success"]) == (0.0, True, False) and env.solve() is None


@pytest.mark.parametrize("env_id", ["choice", "doors"])
def test_demonstrations_follow_the_noise(env_id):
    """noise 0: the demonstrated answer is right; noise 1: uniform over the actions."""
    env, rng = make(env_id), np.random.default_rng(0)
    right, n = 0, 400
    for seed in range(n):
        env.reset(seed=seed)
        reasoning, answer = env.demonstration(rng, noise=0.0)
        assert env.step(answer)[1] >= 0.0 and answer in reasoning
        env.reset(seed=seed)
        _, answer = env.demonstration(rng, noise=1.0)
        right += env.step(answer)[4]["executed_actions"] != [] and (
            answer.lower() == (env.target if env_id == "choice" else env.keys[0].lower())
        )
    chance = 1 / 4 if env_id == "choice" else 1 / 2
    assert abs(right / n - chance) < 0.08


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="n_options"):
        make("choice", n_options=1)
    with pytest.raises(ValueError, match="n_keys"):
        make("doors", n_keys=9)
