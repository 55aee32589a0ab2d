"""Sokoban: generation, solver optimality, the rewards of docs/methods.md, stochasticity,
invalid input, demonstrations."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.envs.sokoban import SokobanEnv, move, parse_grid, solve_sokoban

# Two boxes, the left one already on its target: lets one test push a box off and on.
TWO_BOX_GRID = ["######", "#P*_O#", "#_X__#", "######"]
ONE_PUSH_GRID = ["######", "#PXO_#", "######"]


def state(env: SokobanEnv):
    return env.render(), env.player, env.boxes, env.actions_taken, env.done


def run(env: SokobanEnv, actions: list[str], per_turn: int = 2):
    """Step through ``actions`` in turns of ``per_turn``; return (rewards, last info, terminated)."""
    rewards, info, terminated = [], {}, False
    for i in range(0, len(actions), per_turn):
        _, reward, terminated, _, info = env.step(" || ".join(actions[i : i + per_turn]))
        rewards.append(reward)
    return rewards, info, terminated


@pytest.mark.parametrize(
    "kwargs, seeds", [({}, range(120)), ({"dim": (7, 7), "num_boxes": 2}, range(15))]
)
def test_solver_plan_solves_generated_level(kwargs, seeds):
    env = SokobanEnv(**kwargs)
    lengths = set()
    for seed in seeds:
        _, info = env.reset(seed=seed)
        plan = env.solve()
        assert plan is not None and 1 <= len(plan) <= env.max_actions
        assert info["optimal_plan_length"] == len(plan)
        lengths.add(len(plan))
        rewards, last, terminated = run(env, plan)
        assert terminated and last["success"] and env.done
        assert set(env.boxes) == env.targets
        # The final move placed the last box: -0.1 step + 1 on target + 10 solved.
        assert last["executed_actions"][-1] == plan[-1]
        assert rewards[-1] >= 10.9 - 0.1 - 1e-9
    if len(list(seeds)) > 50:
        assert len(lengths) >= 5, "levels should vary in difficulty"


@pytest.mark.parametrize("seed", range(6))
def test_solver_is_optimal_by_brute_force(seed):
    env = SokobanEnv()
    env.reset(seed=seed)
    plan = env.solve()
    assert plan is not None
    for length in range(len(plan)):  # no shorter sequence solves the level
        for seq in itertools.product(env.action_names, repeat=length):
            player, boxes = env.player, env.boxes
            for action in seq:
                player, boxes, _ = move(env.walls, env.targets, player, boxes, action)
            assert set(boxes) != env.targets, (seq, plan)


def test_solver_reports_unsolvable_and_solved():
    walls, targets, player, boxes = parse_grid(["#####", "#XP_#", "#__O#", "#####"])
    assert solve_sokoban(walls, targets, player, boxes) is None  # box stuck on the left wall
    walls, targets, player, boxes = parse_grid(["####", "#P*#", "####"])
    assert solve_sokoban(walls, targets, player, boxes) == []


def test_generation_is_deterministic_per_seed_and_varied():
    a, b = SokobanEnv(), SokobanEnv()
    renders = set()
    for seed in range(40):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        assert obs_a == obs_b
        renders.add(obs_a)
    assert len(renders) >= 38
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]


def test_rewards_box_off_on_target_and_blocked_push():
    env = SokobanEnv()
    obs, _ = env.reset(options={"grid": TWO_BOX_GRID})
    assert (
        obs == "\n".join(TWO_BOX_GRID) + "\nPlayer (1,1). Boxes (1,2),(2,2). Targets (1,2),(1,4)."
    )
    obs, reward, terminated, truncated, info = env.step("Right")
    assert reward == pytest.approx(-1.1)  # step -0.1, box pushed off its target -1
    assert obs.splitlines()[1] == "#_+XO#"  # player now stands on the target
    assert not terminated and not truncated and info["action_is_valid"]
    _, reward, terminated, _, info = env.step("Right")
    assert reward == pytest.approx(0.9)  # step -0.1, box pushed onto a target +1
    assert not terminated and not info["success"]  # the other box is still off
    assert env.boxes == ((1, 4), (2, 2))
    before = env.boxes, env.player
    _, reward, _, _, _ = env.step("Right")  # box against the wall: nothing moves
    assert reward == pytest.approx(-0.1) and (env.boxes, env.player) == before
    _, reward, _, _, _ = env.step("Up")  # walking into a wall
    assert reward == pytest.approx(-0.1) and env.player == before[1]


def test_solve_bonus_ends_episode():
    env = SokobanEnv()
    env.reset(options={"grid": ONE_PUSH_GRID})
    obs, reward, terminated, truncated, info = env.step("Right || Left")
    assert reward == pytest.approx(-0.1 + 1 + 10)
    assert terminated and not truncated and info["success"]
    assert info["executed_actions"] == ["Right"]  # the second action never ran
    assert obs.splitlines()[1] == "#_P*_#"
    _, reward, _, _, info = env.step("Left")  # the episode is over
    assert reward == pytest.approx(-0.1) and not info["action_is_valid"]


def test_push_box_into_box_is_blocked():
    env = SokobanEnv()
    env.reset(options={"grid": ["#######", "#PXX_O#", "#____O#", "#######"]})
    _, reward, _, _, _ = env.step("Right")
    assert reward == pytest.approx(-0.1)
    assert env.player == (1, 1) and env.boxes == ((1, 2), (1, 3))


def test_action_budget_truncates_then_steps_are_invalid():
    env = SokobanEnv()
    env.reset(options={"grid": ["#######", "#P___X#", "#____O#", "#######"]})  # unsolvable
    truncated = False
    for turn in range(5):
        _, reward, terminated, truncated, info = env.step("Down || Up")
        assert info["action_is_valid"] and not terminated
        assert truncated == (turn == 4)
    assert env.actions_taken == 10
    _, reward, _, _, info = env.step("Up")
    assert reward == pytest.approx(-0.1) and not info["action_is_valid"]


def test_stochasticity_zero_and_seeded_noise_are_reproducible():
    actions = ["Up || Left", "Down || Right", "Left", "Right || Right", "Up"]
    for p in (0.0, 0.3):
        for seed in range(5):
            trajectories = []
            for _ in range(2):
                env = SokobanEnv(stochasticity=p)
                traj = [env.reset(seed=seed)[0]]
                for answer in actions:
                    obs, reward, terminated, truncated, info = env.step(answer)
                    traj.append((obs, reward, terminated, truncated, info["executed_actions"]))
                trajectories.append(traj)
            assert trajectories[0] == trajectories[1]
    env = SokobanEnv(stochasticity=0.0)
    env.reset(seed=1)
    _, _, _, _, info = env.step("Up || Left")
    assert info["executed_actions"] == info["requested_actions"] == ["Up", "Left"]


def test_stochasticity_one_ignores_the_requested_action():
    differs, outcomes = 0, {}
    for seed in range(200):
        results = []
        for requested in ("Up", "Left"):
            env = SokobanEnv(stochasticity=1.0)
            env.reset(seed=seed)
            obs, reward, _, _, info = env.step(requested)
            results.append((obs, reward, tuple(info["executed_actions"])))
            if requested == "Up":
                differs += info["executed_actions"] != ["Up"]
                executed = info["executed_actions"][0]
                outcomes[executed] = outcomes.get(executed, 0) + 1
        assert results[0] == results[1]  # the outcome does not depend on what was asked
    assert 0.65 < differs / 200 < 0.85  # a uniform random action differs 3/4 of the time
    assert set(outcomes) == {"Up", "Down", "Left", "Right"}
    assert min(outcomes.values()) >= 30


INVALID_ANSWERS = [
    "",
    "   ",
    "up down",
    "Up || Down || Left",
    "Upp",
    "North",
    "Up ||",
    "|| Up",
    "Up,Left",
    "x" * 2_000_000,
    "Up" * 500_000,
    "\uff35\uff50",
    "Up\x00",
    "\U0001f642",
    "\u202eUp",
    "<answer>Up</answer>",
    None,
    3,
]


@pytest.mark.parametrize("answer", INVALID_ANSWERS, ids=lambda a: repr(a)[:20])
def test_invalid_answer_costs_penalty_and_changes_nothing(answer):
    env = SokobanEnv(format_penalty=-0.1)
    env.reset(seed=3)
    before = state(env)
    obs, reward, terminated, truncated, info = env.step(answer)
    assert reward == -0.1 and not terminated and not truncated
    assert info["action_is_valid"] is False and info["success"] is False
    assert info["executed_actions"] == []
    assert obs == before[0] and state(env) == before


def test_action_names_are_case_and_space_insensitive():
    env = SokobanEnv()
    env.reset(seed=3)
    _, _, _, _, info = env.step("  up||LEFT ")
    assert info["action_is_valid"] and info["executed_actions"] == ["Up", "Left"]


def test_step_before_reset_is_invalid_not_an_error():
    env = SokobanEnv()
    obs, reward, _, _, info = env.step("Up")
    assert reward == -0.1 and not info["action_is_valid"] and "reset" in obs


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60) | st.sampled_from(["Up", "down || LEFT", "Right||Right||Up"]))
def test_step_never_raises_on_random_text(answer):
    env = SokobanEnv()
    env.reset(seed=11)
    before = state(env)
    obs, reward, terminated, truncated, info = env.step(answer)
    assert isinstance(obs, str) and isinstance(reward, float)
    if not info["action_is_valid"]:
        assert reward == env.format_penalty and state(env) == before
    else:
        assert 1 <= len(info["executed_actions"]) <= 2


def test_demonstrations_solve_levels_and_are_grounded():
    rng = np.random.default_rng(0)
    for seed in range(40):
        env = SokobanEnv()
        env.reset(seed=seed)
        terminated, info = False, {}
        for _ in range(env.max_turns):
            reasoning, answer = env.demonstration(rng)
            assert len(reasoning.split()) <= 25
            assert reasoning.startswith(f"At ({env.player[0]},{env.player[1]}), box")
            target = next(iter(env.targets))
            assert f"({target[0]},{target[1]})" in reasoning
            _, _, terminated, _, info = env.step(answer)
            assert info["action_is_valid"]
            pushes = re.findall(r"pushes box to \((\d+),(\d+)\)", reasoning)
            if pushes:  # where the last push put a box is where a box now is
                assert tuple(int(x) for x in pushes[-1]) in env.boxes
            moves = re.findall(r"(?:Up|Down|Left|Right) to \((\d+),(\d+)\)$", reasoning[:-1])
            if moves:
                assert env.player == tuple(int(x) for x in moves[-1])
            if terminated:
                break
        assert terminated and info["success"], seed


def test_demonstration_example_and_noise():
    env = SokobanEnv()
    env.reset(options={"grid": ONE_PUSH_GRID})
    reasoning, answer = env.demonstration(np.random.default_rng(0))
    assert (reasoning, answer) == (
        "At (1,1), box (1,2), target (1,3). Right pushes box to (1,3) on target.",
        "Right",
    )
    env.reset(seed=5)
    first = [env.demonstration(np.random.default_rng(9), noise=0.5) for _ in range(2)]
    assert first[0] == first[1]  # deterministic given the rng
    optimal = " || ".join(env.solve()[:2])
    rng = np.random.default_rng(1)
    noisy = [env.demonstration(rng, noise=1.0)[1] for _ in range(200)]
    assert all(env.parse_actions(a) is not None for a in noisy)
    assert 0.8 < np.mean([a != optimal for a in noisy]) < 1.0
    clean = {env.demonstration(rng, noise=0.0)[1] for _ in range(20)}
    assert clean == {optimal}
