"""FrozenLake: map generation, solver, rewards, stochasticity, invalid input,
demonstrations."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.envs.frozenlake import FrozenLakeEnv, move, solve_frozenlake

HAND_MAP = ["P_H", "_H_", "__G"]


def state(env: FrozenLakeEnv):
    return env.render(), env.player, env.actions_taken, env.done


@pytest.mark.parametrize(
    "kwargs", [{}, {"start": "corner"}, {"start": "random"}, {"size": 6, "frozen_fraction": 0.7}]
)
def test_solver_plan_reaches_goal(kwargs):
    env = FrozenLakeEnv(**kwargs)
    for seed in range(80):
        _, info = env.reset(seed=seed)
        plan = env.solve()
        assert plan is not None and 1 <= len(plan) <= env.max_actions
        assert info["optimal_plan_length"] == len(plan)
        assert env.player not in env.holes and env.goal not in env.holes
        total, terminated, info = 0.0, False, {}
        for i in range(0, len(plan), 2):
            _, reward, terminated, _, info = env.step(" || ".join(plan[i : i + 2]))
            total += reward
        assert terminated and info["success"] and total == 1.0
        assert env.player == env.goal


@pytest.mark.parametrize("seed", range(5))
def test_solver_is_optimal_by_brute_force(seed):
    env = FrozenLakeEnv()
    env.reset(seed=seed)
    plan = env.solve()
    for length in range(len(plan)):
        for seq in itertools.product(env.action_names, repeat=length):
            pos, safe = env.player, True
            for action in seq:
                pos = move(env.size, pos, action)
                safe = safe and pos not in env.holes
            assert not (safe and pos == env.goal), (seq, plan)


def test_start_modes_place_start_and_goal():
    n = 4
    for seed in range(60):
        env = FrozenLakeEnv(start="region")
        env.reset(seed=seed)
        assert env.player[0] < 2 and env.player[1] < 2
        assert env.goal[0] >= 2 and env.goal[1] >= 2
        env = FrozenLakeEnv(start="corner")
        env.reset(seed=seed)
        assert env.player == (0, 0) and env.goal == (n - 1, n - 1)
    starts = set()
    for seed in range(60):
        env = FrozenLakeEnv(start="random")
        env.reset(seed=seed)
        starts.add(env.player)
        assert env.player != env.goal
    assert len(starts) >= 10


def test_frozen_fraction_controls_holes():
    assert all(
        not FrozenLakeEnv(frozen_fraction=1.0).reset(seed=s)[0].rsplit("\n", 1)[0].count("H")
        for s in range(10)
    )
    rates = []
    for frozen in (0.9, 0.7):
        env = FrozenLakeEnv(size=6, frozen_fraction=frozen)
        hole_counts = []
        for seed in range(100):
            env.reset(seed=seed)
            hole_counts.append(len(env.holes))
        rates.append(np.mean(hole_counts) / (36 - 2))  # start and goal are never holes
    assert 0.04 < rates[0] < 0.14 and 0.18 < rates[1] < 0.32


def test_generation_is_deterministic_per_seed():
    a, b = FrozenLakeEnv(), FrozenLakeEnv()
    maps = {a.reset(seed=s)[0] for s in range(50)}
    assert all(a.reset(seed=s)[0] == b.reset(seed=s)[0] for s in range(50))
    assert len(maps) >= 40


def test_render_format_and_hole_ends_with_zero():
    env = FrozenLakeEnv()
    obs, info = env.reset(options={"grid": HAND_MAP})
    assert obs == "P_H\n_H_\n__G\nPlayer (0,0). Goal (2,2). Holes (0,2) (1,1)."
    assert info["optimal_plan_length"] == 4
    obs, reward, terminated, truncated, info = env.step("Left || Up")  # both hit the edge
    assert reward == 0.0 and not terminated and env.player == (0, 0)
    assert info["executed_actions"] == ["Left", "Up"]
    obs, reward, terminated, truncated, info = env.step("Right || Right")
    assert reward == 0.0 and terminated and not truncated and not info["success"]
    assert env.player == (0, 2) and obs.endswith(
        "Player (0,2). Goal (2,2). Holes (0,2) (1,1). Fell in a hole."
    )
    _, reward, _, _, info = env.step("Down")
    assert reward == -0.1 and not info["action_is_valid"]


def test_without_the_map_the_observation_is_the_facts_line():
    env = FrozenLakeEnv(show_map=False)
    obs, _ = env.reset(options={"grid": HAND_MAP})
    assert obs == "Player (0,0). Goal (2,2). Holes (0,2) (1,1)."
    obs, *_ = env.step("Right || Right")
    assert obs == "Player (0,2). Goal (2,2). Holes (0,2) (1,1). Fell in a hole."
    # the same levels and dynamics as with the map: only the observation differs
    shown = FrozenLakeEnv()
    for seed in range(5):
        env.reset(seed=seed), shown.reset(seed=seed)
        assert shown.render().endswith("\n" + env.render())
    assert env.demonstration(np.random.default_rng(0), weigh=True)[0].startswith(
        f"At {env.render()[7:12]}, goal"
    )
    with pytest.raises(ValueError, match="show_map"):
        env.demonstration(np.random.default_rng(0), restate=True)
    both = FrozenLakeEnv(show_moves=True)
    both.reset(options={"grid": HAND_MAP})
    restated = both.demonstration(np.random.default_rng(0), restate=True)[0]
    assert restated.startswith("P_H\n_H_\n__G\nAt (0,0)")
    with pytest.raises(ValueError, match="show_moves must be true or false, got 'no'"):
        FrozenLakeEnv(show_moves="no")


def test_goal_gives_one_and_ends_episode():
    env = FrozenLakeEnv()
    env.reset(options={"grid": HAND_MAP})
    rewards = [env.step(a)[1] for a in ("Down || Down", "Right")]
    obs, reward, terminated, _, info = env.step("Right || Up")
    assert rewards == [0.0, 0.0] and reward == 1.0 and terminated and info["success"]
    assert info["executed_actions"] == ["Right"]
    assert obs == "__H\n_H_\n__P\nPlayer (2,2). Goal (2,2). Holes (0,2) (1,1). Reached the goal."


def test_budget_truncates():
    env = FrozenLakeEnv(start="corner")
    env.reset(seed=0)
    for turn in range(5):
        _, _, terminated, truncated, _ = env.step("Up || Left")
        assert not terminated and truncated == (turn == 4)
    assert not env.step("Right")[4]["action_is_valid"]


def test_stochasticity_zero_and_seeded_noise_are_reproducible():
    answers = ["Down || Right", "Right", "Down || Down", "Right || Up", "Left"]
    for p in (0.0, 0.2):
        for seed in range(8):
            trajectories = []
            for _ in range(2):
                env = FrozenLakeEnv(stochasticity=p)
                traj = [env.reset(seed=seed)[0]]
                traj += [env.step(a)[:4] for a in answers]
                trajectories.append(traj)
            assert trajectories[0] == trajectories[1]


def test_stochasticity_one_ignores_the_requested_action():
    differs = 0
    for seed in range(200):
        results = []
        for requested in ("Down || Right", "Up || Left"):
            env = FrozenLakeEnv(stochasticity=1.0)
            env.reset(seed=seed)
            obs, reward, terminated, _, info = env.step(requested)
            results.append((obs, reward, terminated, info["executed_actions"]))
            if requested == "Down || Right":
                differs += info["executed_actions"][0] != "Down"
        assert results[0] == results[1]
    assert 0.65 < differs / 200 < 0.85


INVALID_ANSWERS = [
    "",
    "\n",
    "down down",
    "Down || Right || Up",
    "Dwn",
    "South",
    "Down ||",
    "Down|Right",
    "y" * 3_000_000,
    "\u0414own",
    "\U0001f9ca",
    "Right\u200b",
    "<answer>Down</answer>",
    None,
    ["Down"],
]


@pytest.mark.parametrize("answer", INVALID_ANSWERS, ids=lambda a: repr(a)[:20])
def test_invalid_answer_costs_penalty_and_changes_nothing(answer):
    env = FrozenLakeEnv(format_penalty=-0.25)
    env.reset(seed=2)
    before = state(env)
    obs, reward, terminated, truncated, info = env.step(answer)
    assert reward == -0.25 and not terminated and not truncated
    assert info["action_is_valid"] is False and info["executed_actions"] == []
    assert obs == before[0] and state(env) == before


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60) | st.sampled_from(["left", "Down||Right", "UP || up"]))
def test_step_never_raises_on_random_text(answer):
    env = FrozenLakeEnv(stochasticity=0.5)
    env.reset(seed=4)
    before = state(env)
    obs, reward, terminated, truncated, info = env.step(answer)
    assert isinstance(obs, str) and reward in (-0.1, 0.0, 1.0)
    if not info["action_is_valid"]:
        assert state(env) == before


def test_demonstrations_reach_the_goal_and_are_grounded():
    rng = np.random.default_rng(0)
    for seed in range(60):
        env = FrozenLakeEnv()
        env.reset(seed=seed)
        terminated, info = False, {}
        while not terminated:
            at = env.player
            reasoning, answer = env.demonstration(rng)
            assert len(reasoning.split()) <= 25
            assert reasoning.startswith(
                f"At ({at[0]},{at[1]}), goal ({env.goal[0]},{env.goal[1]})."
            )
            assert "hole" not in reasoning
            _, _, terminated, _, info = env.step(answer)
            last = re.findall(r"to \((\d+),(\d+)\)", reasoning)[-1]
            assert env.player == tuple(int(x) for x in last)
        assert info["success"] and env.actions_taken <= env.max_actions


def test_weighed_demonstration_reads_before_it_chooses():
    env = FrozenLakeEnv()
    env.reset(options={"grid": HAND_MAP})
    plain = env.demonstration(np.random.default_rng(0))
    weighed = env.demonstration(np.random.default_rng(0), weigh=True)
    assert weighed == (
        "At (0,0), goal (2,2). Down to (1,0) is safe; Right to (0,1) is safe. "
        "So Down to (1,0) is safe, then Down to (2,0) is safe.",
        "Down || Down",
    )
    assert weighed[0].endswith(plain[0].split(". ", 1)[1]) and weighed[1] == plain[1]
    env.step("Right")  # (0,1): both moves toward the goal lead into a hole
    assert env.toward_goal() == ["Down", "Right"]
    reasoning, answer = env.demonstration(np.random.default_rng(0), weigh=True)
    assert reasoning.startswith(
        "At (0,1), goal (2,2). Down to (1,1) is a hole; Right to (0,2) is a hole. So Left"
    )
    assert answer.startswith("Left")


def test_demonstration_example_and_noise():
    env = FrozenLakeEnv()
    env.reset(options={"grid": HAND_MAP})
    assert env.demonstration(np.random.default_rng(0)) == (
        "At (0,0), goal (2,2). Down to (1,0) is safe, then Down to (2,0) is safe.",
        "Down || Down",
    )
    assert env.demonstration(np.random.default_rng(3), noise=0.5) == env.demonstration(
        np.random.default_rng(3), noise=0.5
    )
    rng = np.random.default_rng(1)
    noisy = [env.demonstration(rng, noise=1.0) for _ in range(300)]
    assert 0.8 < np.mean([a != "Down || Down" for _, a in noisy]) < 1.0
    # a random move into a hole is described truthfully, and reasoning stops there
    into_hole = [r for r, a in noisy if a.startswith("Right || Right")]
    assert into_hole and all(r.endswith("Right to (0,2) is a hole.") for r in into_hole)
    assert solve_frozenlake(3, frozenset({(0, 1), (1, 0)}), (0, 0), (2, 2)) is None
