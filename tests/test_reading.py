"""Reading accuracy: what a first turn's reasoning states about its input, checked against
the true state (``envs/reading.py``), and its ``grounding/…`` metrics with Wilson
intervals (``agent/reading.py``).  Any text, however broken, gives checks, never an error."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from tether.agent.reading import grounding_metrics
from tether.envs import make
from tether.envs.reading import FROZENLAKE_FIRST_CLAUSE, reading_checks

ENVS = ("tether/FrozenLake-v0", "tether/Sokoban-v0", "tether/Countdown-v0")

BROKEN = [
    None,
    "",
    "At (",
    "At (1,2), goal (3,",  # unterminated
    "At (1,2), goal (3,3)",  # no moves
    "<think>At (0,0), goal (3,3). Right to (0,1) is safe</think><answer>Right",
    "At (" + "9" * 5000 + ",1), goal (1," + "9" * 5000 + ")",  # past int()'s digit limit
    "Target " + "7" * 5000 + " from 1, 2: 1+2.",
    "At (0,0), boxes " + "(1,1)," * 3000 + " targets (2,2).",
    "At (0,0), box (1,1), target (2,2)" * 200,
    "Target 10 from : x.",
    "Target 10 from 1,, 2: x.",
    "\x00\uffff\u202e At (0,0), goal (3,3). Up hits the edge.",
    "At (-1,0), goal (0,-3). Left to (-1,-1) is a hole.",
]


def demonstrated(env_id: str, seed: int, **options):
    env = make(env_id)
    env.reset(seed=seed)
    reasoning, answer = env.demonstration(np.random.default_rng(seed), 0.0, **options)
    return env, reasoning, answer


@pytest.mark.parametrize("env_id", ENVS)
def test_the_warm_starts_own_reasoning_reads_right(env_id):
    for seed in range(1_000_000, 1_000_020):
        env, reasoning, answer = demonstrated(env_id, seed)
        checks = reading_checks(env, reasoning, answer)
        assert checks["reading"], (seed, reasoning, checks)


def test_frozenlake_checks_each_fact():
    env, reasoning, answer = demonstrated("tether/FrozenLake-v0", 1_000_003)
    checks = reading_checks(env, reasoning, answer)
    assert checks["player_right"] and checks["goal_right"] and checks["first_clause_true"]
    assert checks["answer_follows_reasoning"] and checks["first_move_optimal"]
    assert not checks["map_exact"] and not checks["first_move_into_hole"]
    env, restated, answer = demonstrated("tether/FrozenLake-v0", 1_000_003, restate=True)
    assert reading_checks(env, restated, answer)["map_exact"]
    r, c = env.player
    wrong = reasoning.replace(f"At ({r},{c})", f"At ({r + 1},{c})", 1)
    checks = reading_checks(env, wrong, answer)
    assert not checks["player_right"] and checks["goal_right"] and not checks["reading"]


def test_frozenlake_checks_read_a_weighed_reasoning():
    """With the moves toward the goal weighed first, the answer follows the moves after
    "So", and the first clause checked is the first weighed one."""
    for seed in range(1_000_000, 1_000_020):
        env, reasoning, answer = demonstrated("tether/FrozenLake-v0", seed, weigh=True)
        checks = reading_checks(env, reasoning, answer)
        assert checks["reading"] and checks["answer_follows_reasoning"], (seed, reasoning)
        assert checks["first_clause_true"] and checks["first_move_optimal"]
    first = FROZENLAKE_FIRST_CLAUSE.search(reasoning)
    assert first and first[4] in ("is safe", "is a hole")
    lie = reasoning.replace(first[4], "is a hole" if first[4] == "is safe" else "is safe", 1)
    assert not reading_checks(env, lie, answer)["first_clause_true"]
    other = reasoning.rsplit(". So ", 1)[0] + ". So Up hits the edge."
    assert not reading_checks(env, other, answer)["answer_follows_reasoning"]


def test_sokoban_and_countdown_checks_each_fact():
    env, reasoning, answer = demonstrated("tether/Sokoban-v0", 1_000_001)
    (r, c) = env.player
    wrong = reasoning.replace(f"At ({r},{c})", f"At ({r},{c + 1})", 1)
    checks = reading_checks(env, wrong, answer)
    assert not checks["player_right"] and checks["boxes_right"] and checks["targets_right"]
    env, reasoning, answer = demonstrated("tether/Countdown-v0", 1_000_001)
    numbers = ", ".join(map(str, env.numbers))
    shuffled = reasoning.replace(numbers, ", ".join(map(str, env.numbers[::-1])), 1)
    assert reading_checks(env, shuffled, answer)["reading"]  # the order is free
    wrong = reasoning.replace(f"Target {env.target} ", f"Target {env.target + 1} ", 1)
    checks = reading_checks(env, wrong, answer)
    assert not checks["target_right"] and checks["numbers_right"] and not checks["reading"]


@pytest.mark.parametrize("env_id", ENVS)
@pytest.mark.parametrize("text", BROKEN)
def test_broken_replies_give_checks_not_errors(env_id, text):
    env = make(env_id)
    env.reset(seed=1_000_005)
    checks = reading_checks(env, text, text)
    assert checks and all(isinstance(v, bool) for v in checks.values())
    assert not checks["reading"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.text(max_size=40))
def test_any_text_gives_checks(reasoning, answer):
    for env_id in ENVS:
        env = make(env_id)
        env.reset(seed=1_000_007)
        checks = reading_checks(env, reasoning, answer)
        assert all(isinstance(v, bool) for v in checks.values())


def _trajectory(seed, reasoning, answer="Right"):
    turn = SimpleNamespace(reasoning=reasoning, answer=answer)
    return SimpleNamespace(env_seed=seed, turns=[turn])


def test_grounding_metrics_count_levels_with_wilson_intervals():
    seeds = list(range(1_000_000, 1_000_010))
    trajectories = []
    for k, seed in enumerate(seeds):
        _, reasoning, answer = demonstrated("tether/FrozenLake-v0", seed)
        trajectories.append(_trajectory(seed, reasoning if k < 7 else "nonsense", answer))
    trajectories.append(SimpleNamespace(env_seed=1_000_099, turns=[]))  # no first turn
    trajectories.append(_trajectory(1_000_098, None, None))
    m = grounding_metrics(trajectories, "tether/FrozenLake-v0", {"size": 4})
    assert m["grounding/defined"] == 1.0 and m["grounding/levels"] == 12
    assert m["grounding/reading_acc"] == pytest.approx(7 / 12)
    wilson = binomtest(7, 12).proportion_ci(0.95, method="wilson")
    assert m["grounding/reading_acc_ci_low"] == pytest.approx(wilson.low)
    assert m["grounding/reading_acc_ci_high"] == pytest.approx(wilson.high)
    assert m["grounding/player_right"] == pytest.approx(7 / 12)
    assert m["grounding/first_move_into_hole"] == 0.0


def test_grounding_is_not_defined_where_the_state_is_not_known():
    assert reading_checks(make("tether/Choice-v0"), "anything", "A") is None
    trajectories = [_trajectory(1_000_000, "anything")]
    assert grounding_metrics(trajectories, "tether/MetaMathQA-v0") == {"grounding/defined": 0.0}
    # a probe that collected nothing: no rates, no error
    assert grounding_metrics([], "tether/Countdown-v0") == {
        "grounding/defined": 1.0,
        "grounding/levels": 0.0,
    }
