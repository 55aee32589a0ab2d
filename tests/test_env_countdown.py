"""Countdown: generation, solver, the 1 / 0.1 / 0 rewards, safe parsing, stochastic
rewards, demonstrations."""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.envs.countdown import CountdownEnv, evaluate, parse_expression, solve_countdown, to_text


def fixed(target: int, numbers: list[int], **kwargs) -> CountdownEnv:
    env = CountdownEnv(**kwargs)
    env.reset(options={"target": target, "numbers": numbers})
    return env


@pytest.mark.parametrize("num_count", [3, 4])
def test_generated_puzzles_are_solvable_and_in_range(num_count):
    env = CountdownEnv(num_count=num_count)
    targets = set()
    for seed in range(150):
        obs, info = env.reset(seed=seed)
        assert obs == f"Target {env.target}. Numbers {', '.join(map(str, env.numbers))}."
        assert len(env.numbers) == num_count and all(1 <= n <= 20 for n in env.numbers)
        assert 1 <= env.target <= 100 and info["target"] == env.target
        solution = env.solve()
        assert env.score(solution) == (1.0, True, True), (obs, solution)
        targets.add(env.target)
    assert len(targets) >= 40


def test_generation_is_deterministic_per_seed():
    a, b = CountdownEnv(), CountdownEnv()
    assert all(a.reset(seed=s)[0] == b.reset(seed=s)[0] for s in range(30))
    assert len({a.reset(seed=s)[0] for s in range(30)}) >= 28


def test_solver_handles_fraction_only_puzzles_and_reports_none():
    expr = solve_countdown([1, 3, 4, 6], 24)  # only 6/(1-3/4) works
    assert expr is not None and evaluate(expr) == 24
    assert to_text(expr) == "6/(1-3/4)"
    assert solve_countdown([1, 1, 1], 50) is None


@pytest.mark.parametrize(
    "answer, reward",
    [
        ("2*3*4", 1.0),
        ("(4*3)*2", 1.0),
        (" 4 * (3 * 2) ", 1.0),
        ("24/(4/(2*2))", 0.0),
        ("2+3+4", 0.1),
        ("4/2*3", 0.1),
        ("4-(3-2)", 0.1),
        ("(4-2)*3", 0.1),
        ("(4-2)*2", 0.0),
        ("2*3*4*1", 0.0),
        ("24", 0.0),
        ("2*2*3*4", 0.0),
        ("6*4", 0.0),
    ],
)
def test_rewards(answer, reward):
    env = fixed(24, [2, 3, 4])
    obs, got, terminated, truncated, info = env.step(answer)
    assert got == reward and terminated and not truncated
    assert info["action_is_valid"] and info["success"] == (reward == 1.0)
    assert obs == "Target 24. Numbers 2, 3, 4."


def test_division_by_zero_is_a_wrong_value_and_duplicates_count():
    assert fixed(8, [2, 2, 4]).score("4/(2-2)") == (0.1, True, False)
    assert fixed(8, [2, 2, 4]).score("2*4") == (0.0, True, False)  # one 2 unused
    assert fixed(8, [2, 2, 4]).score("2+2+4") == (1.0, True, True)
    assert fixed(24, [1, 3, 4, 6]).score("6/(1-3/4)") == (1.0, True, True)


INVALID_ANSWERS = [
    "",
    "  ",
    "abc",
    "2**3**4",
    "2^3",
    "__import__('os').system('ls')",
    "-2+3+4",
    "2*(3+4",
    "1e5",
    "3.5*2",
    "1_0",
    "08+1",
    "2 3 4",
    "()",
    "\uff12*\uff13*\uff14",
    "\u0662*3*4",
    "2*3*4=24",
    "2*3*4\n2",
    "9" * 5_000_000,
    "(" * 300 + "1" + ")" * 300,
    "lambda: 1",
    None,
    24,
]


@pytest.mark.parametrize("answer", INVALID_ANSWERS, ids=lambda a: repr(a)[:20])
def test_invalid_answers_get_the_format_penalty(answer):
    env = fixed(24, [2, 3, 4], format_penalty=-0.1)
    obs, reward, _, _, info = env.step(answer)
    assert reward == -0.1 and info["action_is_valid"] is False and not info["success"]
    assert obs == "Target 24. Numbers 2, 3, 4." and env.target == 24


def test_parser_builds_the_tree_without_eval():
    assert parse_expression("(3+5)*2") == ("*", ("+", 3, 5), 2)
    assert parse_expression("((((7))))") == 7
    assert parse_expression("1" * 201) is None  # over the length bound
    assert evaluate(parse_expression("1/3+1/6")) == Fraction(1, 2)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80) | st.text(alphabet="0123456789+-*/() ", max_size=80))
def test_step_never_raises_and_rewards_stay_in_support(answer):
    env = fixed(24, [2, 3, 4])
    _, reward, terminated, _, info = env.step(answer)
    assert terminated
    assert reward in (env.reward_support if info["action_is_valid"] else (env.format_penalty,))


def test_stochasticity_zero_is_the_true_score_and_one_ignores_the_answer():
    for seed in range(20):
        env = CountdownEnv(stochasticity=0.0)
        env.reset(seed=seed)
        assert env.step(env.solve())[1] == 1.0
    draws = []
    for seed in range(300):
        rewards = []
        for answer_kind in ("right", "wrong"):
            env = CountdownEnv(stochasticity=1.0)
            env.reset(seed=seed)
            answer = env.solve() if answer_kind == "right" else "+".join(["1"] * 3)
            _, reward, _, _, info = env.step(answer)
            rewards.append(reward)
            assert info["success"] == (answer_kind == "right")  # success stays truthful
        assert rewards[0] == rewards[1]  # the reward no longer depends on the answer
        draws.append(rewards[0])
    counts = {v: draws.count(v) for v in (0.0, 0.1, 1.0)}
    assert sum(counts.values()) == 300 and min(counts.values()) > 70


def test_demonstrations_solve_and_show_their_steps():
    rng = np.random.default_rng(0)
    for num_count in (3, 4):
        env = CountdownEnv(num_count=num_count)
        for seed in range(60):
            env.reset(seed=seed)
            reasoning, answer = env.demonstration(rng)
            assert len(reasoning.split()) <= 25
            assert reasoning.startswith(
                f"Target {env.target} from {', '.join(map(str, env.numbers))}: "
            )
            assert reasoning.endswith(f"={env.target}.")
            assert len(re.findall(r"=", reasoning)) == num_count - 1
            assert env.score(answer) == (1.0, True, True)


def test_demonstration_example_and_noise():
    env = fixed(24, [2, 3, 4])
    assert env.demonstration(np.random.default_rng(0)) == (
        "Target 24 from 2, 3, 4: 3*2=6, 6*4=24.",
        "3*2*4",
    )
    assert env.demonstration(np.random.default_rng(5), noise=0.5) == env.demonstration(
        np.random.default_rng(5), noise=0.5
    )
    rng = np.random.default_rng(1)
    noisy = [env.demonstration(rng, noise=1.0) for _ in range(100)]
    assert all(env.score(answer) == (0.1, True, False) for _, answer in noisy)
    for reasoning, answer in noisy:  # the shown steps are the answer's real computation
        assert reasoning.endswith(f"={evaluate(parse_expression(answer))}.")
    mixed = [env.score(env.demonstration(rng, noise=0.3)[1])[0] for _ in range(400)]
    assert 0.6 < np.mean([r == 1.0 for r in mixed]) < 0.8
