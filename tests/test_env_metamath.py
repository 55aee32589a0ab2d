"""MetaMathQA: answer normalisation, retries with halving reward, the generator, the
MetaMathQA/GSM8K loader, stochastic verdicts, safety on any input, demonstrations."""

from __future__ import annotations

import json
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.envs import make
from tether.envs.metamath import (
    MetaMathQAEnv,
    answers_match,
    extract_final_answer,
    generate_problem,
    parse_number,
)

QUESTION = "Tom has 3 bags of 4 apples. He eats 2. How many apples are left?"


def fixed(answer: str = "10", **kwargs) -> MetaMathQAEnv:
    env = MetaMathQAEnv(**kwargs)
    env.reset(options={"question": QUESTION, "answer": answer})
    return env


@pytest.mark.parametrize(
    "answer, gold, expected",
    [
        ("10", "10", True),
        (" 10 ", "10", True),
        ("10.", "10", True),
        ("10.0", "10", True),
        ("$1,200", "1200", True),
        ("1200 dollars", "1,200", True),
        ("1,200.50", "1200.5", True),
        ("3/4", "0.75", True),
        ("0.75", "3/4", True),
        ("\\frac{3}{4}", "0.75", True),
        ("\\boxed{12}", "12", True),
        ("The answer is: 42.", "42", True),
        ("x = -5", "-5", True),
        ("\u22125", "-5", True),
        ("50%", "50", True),
        ("12 apples", "12", True),
        ("0.333333", "1/3", True),
        ("0.33", "1/3", False),
        ("5", "-5", False),
        ("11", "10", False),
        ("Monday", "\\text{Monday}", True),
        ("(2, 3)", "(2,3)", True),
        ("B", "b", True),
        ("Tuesday", "Monday", False),
        # unparseable when the gold answer is a number
        ("ten", "10", None),
        ("", "10", None),
        ("3 + 7", "10", None),
        ("1,2", "12", None),
        ("4/0", "10", None),
        ("1" * 201, "1", None),
    ],
)
def test_answer_normalisation(answer, gold, expected):
    assert answers_match(answer, gold) is expected


def test_final_answer_extraction_in_the_public_formats():
    assert extract_final_answer("2+2=4.\nThe answer is: 4") == "4"
    assert extract_final_answer("She pays 3*5=<<3*5=15>>15.\n#### 15") == "15"
    assert extract_final_answer("So $x=\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert extract_final_answer("no final answer here") is None
    assert parse_number("\\frac{1}{2}") == Fraction(1, 2)


def test_retries_halve_the_reward():
    env = fixed()
    obs, reward, terminated, truncated, info = env.step("10")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert obs == QUESTION and env.actions_left() == 0

    env = fixed()
    assert env.actions_left() == 3
    obs, reward, terminated, _, info = env.step("12")
    assert (reward, terminated, info["success"], info["attempt"]) == (0.0, False, False, 0)
    assert obs == QUESTION + "\nWrong answers: 12." and env.actions_left() == 2
    _, reward, terminated, _, info = env.step("$10")  # right on the first retry
    assert (reward, terminated, info["success"], info["attempt"]) == (0.5, True, True, 1)

    env = fixed()
    rewards = [env.step(a)[1] for a in ("12", "8", "10 apples")]
    assert rewards == [0.0, 0.0, 0.25] and env.done

    env = fixed()
    outcomes = [env.step(a)[1:3] for a in ("1", "2", "3")]
    assert outcomes == [(0.0, False), (0.0, False), (0.0, True)]
    _, reward, _, _, info = env.step("10")  # the episode is over
    assert reward == env.format_penalty and not info["action_is_valid"]


@pytest.mark.parametrize(
    "answer", ["", "   ", "ten", "3 + 7", "I think 3 or 7", "1" * 500, None, 10, "\ufffd"]
)
def test_malformed_answers_cost_the_penalty_and_no_attempt(answer):
    env = fixed(format_penalty=-0.2)
    obs, reward, terminated, truncated, info = env.step(answer)
    assert (reward, terminated, truncated) == (-0.2, False, False)
    assert not info["action_is_valid"] and obs == QUESTION and env.actions_left() == 3
    assert env.step("10")[1] == 1.0  # the first attempt is still worth 1


def test_max_attempts_one_is_single_turn():
    env = fixed(max_attempts=1)
    assert env.max_turns == 1
    _, reward, terminated, _, _ = env.step("7")
    assert reward == 0.0 and terminated


@pytest.mark.parametrize("difficulty", [1, 2, 4, 6])
def test_generator_is_exact_and_has_difficulty_steps(difficulty):
    for seed in range(40):
        problem = generate_problem(np.random.default_rng(seed), difficulty)
        assert len(problem.steps) == difficulty
        value = problem.steps[0][0]
        for a, op, b, result in problem.steps:
            assert a == value and result >= 0
            assert Fraction(result) == {"+": a + b, "-": a - b, "*": a * b, "/": Fraction(a, b)}[op]
            value = result
        assert problem.answer == str(value)
        assert problem.question.endswith("have now?")
        for number in re.findall(r"\d+", problem.question):  # every given number is small
            assert 1 <= int(number) <= 40


def test_generator_is_deterministic_per_seed():
    a, b = MetaMathQAEnv(difficulty=3), make("tether/MetaMathQA-v0", difficulty=3)
    assert all(a.reset(seed=s)[0] == b.reset(seed=s)[0] for s in range(30))
    assert len({a.reset(seed=s)[0] for s in range(30)}) == 30
    assert a.reset(seed=5)[0] == (
        "Noa has 18 marbles. Noa buys 9 more. Noa loses 20. A friend "
        "gives Noa 17 more. How many marbles does Noa have now?"
    )
    assert a.solve() == "24"  # 18+9=27, 27-20=7, 7+17=24


def write_jsonl(path, records):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return str(path)


def test_loader_reads_metamathqa_and_gsm8k_files(tmp_path):
    path = write_jsonl(
        tmp_path / "metamath.jsonl",
        [
            {
                "query": "Janet has 16 eggs and eats 3. How many are left?",
                "response": "Janet has 16 - 3 = 13 eggs left.\nThe answer is: 13",
                "type": "GSM_Rephrased",
                "original_question": "...",
            },
            {
                "question": "A pen costs $2. How much do 6 pens cost?",
                "answer": "6 pens cost 6*2=<<6*2=12>>12 dollars.\n#### 12",
            },
            {
                "query": "What is $\\frac{1}{2}+\\frac{1}{4}$?",
                "response": "We add: $\\frac{2}{4}+\\frac{1}{4}=\\frac{3}{4}$. "
                "The answer is: \\frac{3}{4}",
                "type": "MATH_AnsAug",
            },
            "{not json",
            {"query": "no answer", "response": "nothing final"},
            [1, 2],
        ],
    )
    env = MetaMathQAEnv(data_path=path)
    assert [p.answer for p in env.problems] == ["13", "12", "\\frac{3}{4}"]
    seen = set()
    rng = np.random.default_rng(0)
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        assert info["source"] == "file" and obs == env.problems[info["index"]].question
        seen.add(info["index"])
        reasoning, answer = env.demonstration(rng)
        assert len(reasoning.split()) <= 25 and "<<" not in reasoning
        assert env.step(answer)[1] == 1.0
    assert seen == {0, 1, 2}
    env.reset(options={"question": "q", "answer": "\\frac{3}{4}"})
    assert env.step("0.75")[1] == 1.0
    gsm = next(i for i in range(30) if env.reset(seed=i)[1]["index"] == 1)
    env.reset(seed=gsm)
    assert env.demonstration(rng) == ("6 pens cost 6*2=12 dollars.", "12")
    assert env.step("$12")[1] == 1.0


def test_loader_reads_a_json_list_like_metamathqa_395k(tmp_path):
    path = tmp_path / "MetaMathQA-395K.json"
    path.write_text(
        json.dumps(
            [
                {
                    "query": "What is 7 times 6?",
                    "response": "7 * 6 = 42.\nThe answer is: 42",
                    "type": "GSM_AnsAug",
                    "original_question": "What is 7 times 6?",
                }
            ],
            indent=2,
        )
    )
    env = MetaMathQAEnv(data_path=str(path))
    assert env.reset(seed=0)[0] == "What is 7 times 6?"
    assert env.demonstration(np.random.default_rng(0)) == ("7 * 6 = 42.", "42")


def test_loader_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        MetaMathQAEnv(data_path=str(tmp_path / "missing.jsonl"))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "hello"}])
    with pytest.raises(ValueError, match="no usable problems"):
        MetaMathQAEnv(data_path=bad)


def test_stochasticity_zero_is_deterministic_and_one_ignores_the_answer():
    def episode(seed, answers, p):
        env = MetaMathQAEnv(stochasticity=p)
        env.reset(seed=seed)
        out = []
        for answer in answers(env):
            _, reward, terminated, _, info = env.step(answer)
            out.append((reward, terminated, info["success"]))
            if terminated:
                break
        return out

    right = lambda env: [env.solve()] * 3  # noqa: E731
    wrong = lambda env: ["100000"] * 3  # noqa: E731
    for seed in range(10):
        assert episode(seed, right, 0.0) == [(1.0, True, True)]
        assert episode(seed, wrong, 0.0) == [
            (0.0, False, False),
            (0.0, False, False),
            (0.0, True, False),
        ]
    first_rewards = []
    for seed in range(200):
        a, b = episode(seed, right, 1.0), episode(seed, wrong, 1.0)
        assert [r[:2] for r in a] == [r[:2] for r in b]  # rewards and endings ignore the answer
        assert all(r[2] for r in a) and not any(r[2] for r in b)  # success stays truthful
        first_rewards.append(a[0][0])
        assert all(r[0] in (0.0, 0.5**k) for k, r in enumerate(a))
    assert 70 < first_rewards.count(1.0) < 130 and first_rewards.count(0.0) > 70


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60) | st.from_regex(r"[-$ ]?[0-9,./%]{0,12}( [a-z]{0,6})?", fullmatch=True))
def test_step_never_raises(answer):
    env = fixed("10")
    for _ in range(4):
        _, reward, terminated, _, info = env.step(answer)
        assert reward in (
            (1.0, 0.5, 0.25, 0.0) if info["action_is_valid"] else (env.format_penalty,)
        )
    assert answers_match(answer, answer) in (True, None)
    assert answers_match(answer, "Monday") in (True, False, None)


def test_demonstrations_solve_and_noise_gives_wrong_answers():
    rng = np.random.default_rng(0)
    for difficulty in (1, 3, 6):
        env = MetaMathQAEnv(difficulty=difficulty)
        for seed in range(40):
            env.reset(seed=seed)
            reasoning, answer = env.demonstration(rng)
            assert len(reasoning.split()) <= 25 and reasoning.endswith(f"={env.solve()}.")
            assert len(re.findall("=", reasoning)) == difficulty
            wrong_reasoning, wrong = env.demonstration(rng, noise=1.0)
            assert wrong_reasoning.endswith(f"={wrong}.") and wrong != answer
            assert env.step(wrong)[1] == 0.0 and env.step(answer)[1] == 0.5
    env = MetaMathQAEnv(difficulty=3)
    env.reset(seed=5)
    assert env.demonstration(np.random.default_rng(0)) == ("18+9=27, 27-20=7, 7+17=24.", "24")
    mixed = [env.score(env.demonstration(rng, noise=0.3)[1])[0] for _ in range(400)]
    assert 0.6 < np.mean(mixed) < 0.8


def test_noisy_retries_never_repeat_a_wrong_answer():
    rng = np.random.default_rng(3)
    for seed in range(40):
        env = MetaMathQAEnv(difficulty=1)
        env.reset(seed=seed)
        answers = []
        for _ in range(3):
            answers.append(env.demonstration(rng, noise=1.0)[1])
            assert env.step(answers[-1])[1] == 0.0
        assert len(set(answers)) == 3 and env.done


def test_gymnasium_make_with_the_env_checker_and_a_step_before_reset():
    import gymnasium as gym

    env = gym.make("tether/MetaMathQA-v0")  # the passive checker validates our returns
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert env.step(env.unwrapped.solve())[1] == 1.0
    fresh = MetaMathQAEnv()
    assert fresh.step("3")[1] == fresh.format_penalty and fresh.actions_left() == 0
