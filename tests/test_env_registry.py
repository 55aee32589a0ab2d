"""The env registry: gymnasium ids, short names, kwargs, unknown ids, idempotent import."""

from __future__ import annotations

import importlib
import subprocess
import sys

import gymnasium as gym
import pytest

import tether.envs as envs
from tether.envs import (
    ENV_IDS,
    CountdownEnv,
    FrozenLakeEnv,
    SokobanEnv,
    TextEnv,
    make,
    register_all,
)

CLASSES = {
    "tether/Sokoban-v0": SokobanEnv,
    "tether/FrozenLake-v0": FrozenLakeEnv,
    "tether/Countdown-v0": CountdownEnv,
}


def test_env_ids():
    assert {"tether/Sokoban-v0", "tether/FrozenLake-v0", "tether/Countdown-v0"} <= set(ENV_IDS)
    assert len(set(ENV_IDS)) == len(ENV_IDS)
    assert all(env_id in gym.registry for env_id in ENV_IDS)


@pytest.mark.parametrize("env_id", sorted(CLASSES))
def test_plain_gymnasium_make_works_with_the_env_checker(env_id):
    env = gym.make(env_id)  # env checker on: our text spaces and returns must pass it
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and env.observation_space.contains(obs)
    assert isinstance(env.unwrapped, CLASSES[env_id])
    _, reward, _, _, info = env.step("Up" if env_id != "tether/Countdown-v0" else "1+1+1")
    assert info["action_is_valid"] and isinstance(reward, float)


@pytest.mark.parametrize(
    "name, cls",
    [
        ("tether/Sokoban-v0", SokobanEnv),
        ("sokoban", SokobanEnv),
        ("Sokoban", SokobanEnv),
        ("FrozenLake", FrozenLakeEnv),
        ("frozen_lake", FrozenLakeEnv),
        ("tether/FrozenLake-v0", FrozenLakeEnv),
        ("countdown", CountdownEnv),
        ("Countdown-v0", CountdownEnv),
    ],
)
def test_make_by_id_or_short_name_returns_the_unwrapped_env(name, cls):
    env = make(name)
    assert type(env) is cls and isinstance(env, TextEnv) and env.unwrapped is env


def test_make_passes_kwargs_to_the_constructor():
    env = make("frozenlake", size=6, stochasticity=0.2, start="corner")
    assert (env.size, env.stochasticity, env.start_mode) == (6, 0.2, "corner")
    obs, _ = env.reset(seed=1)
    assert obs.splitlines()[0].startswith("P") and len(obs.splitlines()[0]) == 6
    assert make("countdown", num_count=4).reset(seed=0)[1]["numbers"].__len__() == 4
    with pytest.raises(ValueError, match="stochasticity"):
        make("sokoban", stochasticity=1.5)


@pytest.mark.parametrize("bad", ["nope", "tether/Chess-v0", "", "sokoban-v1", None])
def test_unknown_id_raises_value_error_listing_valid_ids(bad):
    with pytest.raises(ValueError) as err:
        make(bad)
    assert all(env_id in str(err.value) for env_id in ENV_IDS)


def test_registration_is_idempotent():
    register_all()
    register_all()
    importlib.reload(envs)
    assert sum(1 for k in gym.registry if k.startswith("tether/")) >= len(ENV_IDS)
    assert isinstance(envs.make("sokoban"), envs.SokobanEnv)


def test_envs_import_neither_torch_nor_ray():
    code = (
        "import sys, tether.envs as e; e.make('sokoban').reset(seed=0); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(__import__("pathlib").Path(__file__).parents[1]),
    )
    assert out.stdout.strip() == "[]"
