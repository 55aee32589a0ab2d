"""DeepCoder: the shipped problems and their references, rewards as passed/total,
the public-format loader, stochastic rewards, demonstrations, and no crash on any
answer."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.envs import make
from tether.envs.deepcoder import DeepCoderEnv, extract_code, load_problems, mutate
from tether.envs.sandbox import same_function_output, same_stdout

PROBLEMS = load_problems()
INDEX = {p.id: i for i, p in enumerate(PROBLEMS)}


def fixed(problem_id: str, **kwargs) -> DeepCoderEnv:
    env = DeepCoderEnv(**kwargs)
    env.reset(options={"problem": INDEX[problem_id]})
    return env


def run_in_process(problem, code: str) -> list[bool]:
    """Our own reference code is trusted: check it here, without the sandbox's cost."""
    results = []
    for test in problem.tests:
        namespace: dict = {"__name__": "__main__"}
        if problem.fn_name:
            exec(code, namespace)
            results.append(
                same_function_output(namespace[problem.fn_name](*test.input), test.output)
            )
        else:
            out, stdin = io.StringIO(), sys.stdin
            sys.stdin = io.StringIO(test.input)
            try:
                with contextlib.redirect_stdout(out):
                    exec(code, namespace)
            finally:
                sys.stdin = stdin
            results.append(same_stdout(out.getvalue(), test.output))
    return results


def _raise_timeout(*_):
    raise TimeoutError


def test_shipped_set_is_complete_and_every_reference_passes():
    assert len(PROBLEMS) >= 50 and len({p.id for p in PROBLEMS}) == len(PROBLEMS)
    assert sum(p.fn_name is None for p in PROBLEMS) >= 6  # stdin/stdout programs too
    for problem in PROBLEMS:
        assert 3 <= len(problem.tests) <= 6 and problem.solution and problem.hint, problem.id
        if problem.fn_name:
            assert problem.starter_code.startswith(f"def {problem.fn_name}(")
        assert all(run_in_process(problem, problem.solution)), problem.id


def test_references_pass_in_the_sandbox_too():
    env = DeepCoderEnv()
    for problem_id in (
        "tether/fizzbuzz",
        "tether/to_binary",
        "tether/mean",
        "tether/sum_two",
        "tether/squares",
    ):
        env.reset(options={"problem": INDEX[problem_id]})
        obs, reward, terminated, _, info = env.step(env.solve())
        assert (reward, terminated, info["success"]) == (1.0, True, True), problem_id
        assert [o.status for o in env.last_outcomes] == ["ok"] * len(env.problem.tests)


@pytest.mark.parametrize(
    "answer, reward",
    [
        ("def add(a, b):\n    return a + b", 1.0),
        ("```python\ndef add(a, b):\n    return b + a\n```", 1.0),
        ("def add(a, b):\n    return a * b", 0.25),  # only add(0, 0) == 0 holds
        ("def add(a, b):\n    return 5", 0.25),  # only add(2, 3) == 5 holds
        ("def add(a, b):\n    return str(a + b)", 0.0),
        ("def plus(a, b):\n    return a + b", 0.0),  # the required function is missing
        ("def add(a, b):\n    return 1 / 0", 0.0),
    ],
)
def test_function_rewards_are_the_share_of_passed_tests(answer, reward):
    env = fixed("tether/add")
    obs, got, terminated, truncated, info = env.step(answer)
    assert got == reward and terminated and not truncated and info["action_is_valid"]
    assert info["success"] == (reward == 1.0) and obs == env.render()


@pytest.mark.parametrize(
    "answer, reward",
    [
        ("a, b = map(int, input().split())\nprint(a + b)", 1.0),
        ("print(7)", 0.5),  # right on 3 4 and -5 12
        ("print(input())", 0.0),
    ],
)
def test_program_rewards(answer, reward):
    assert fixed("tether/sum_two").step(answer)[1] == reward


@pytest.mark.parametrize(
    "answer",
    [
        "def add(a, b) return a",
        "",
        "   ",
        "```python\n```",
        "\x00",
        "x" * 30_000,
        None,
        42,
        "def f(:\n",
    ],
)
def test_malformed_code_gets_the_format_penalty_without_running(answer):
    env = fixed("tether/add", format_penalty=-0.2)
    obs, reward, terminated, _, info = env.step(answer)
    assert reward == -0.2 and info["action_is_valid"] is False
    assert terminated == isinstance(answer, str)  # the base class keeps a non-text step open
    assert env.last_outcomes == [] and obs == env.render()


def test_render_and_demonstration_example():
    env = fixed("tether/add")
    assert env.render() == (
        "Task: Return the sum of a and b.\nSignature: def add(a, b):\nExample: add(2, 3) == 5"
    )
    assert env.demonstration(np.random.default_rng(0)) == (
        "add(2, 3) == 5: return a + b.",
        "def add(a, b):\n    return a + b",
    )
    env = fixed("tether/sum_two")
    assert env.render().splitlines()[1:] == [
        "Program: read stdin, print to stdout.",
        'Example: input "3 4" gives "7"',
    ]


def test_demonstrations_are_short_grounded_and_noise_mutates():
    rng = np.random.default_rng(0)
    env = DeepCoderEnv()
    for i, problem in enumerate(PROBLEMS):
        env.reset(options={"problem": i})
        reasoning, answer = env.demonstration(rng)
        assert len(reasoning.split()) <= 25 and reasoning.endswith(problem.hint)
        assert answer == problem.solution
        noisy = env.demonstration(rng, noise=1.0)[1]
        assert noisy != problem.solution and extract_code(noisy) is not None
    failing = 0
    for k, problem in enumerate(PROBLEMS):  # mutants may loop forever: a 0.2 s alarm each
        signal.signal(signal.SIGALRM, _raise_timeout)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        try:
            mutant = mutate(problem.solution, np.random.default_rng(k))
            failing += not all(run_in_process(problem, mutant))
        except Exception:
            failing += 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    assert failing >= 0.8 * len(PROBLEMS)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    assert [mutate(p.solution, a) for p in PROBLEMS] == [mutate(p.solution, b) for p in PROBLEMS]


def test_reset_is_deterministic_per_seed_and_covers_the_set():
    a, b = DeepCoderEnv(), DeepCoderEnv()
    assert all(a.reset(seed=s)[0] == b.reset(seed=s)[0] for s in range(40))
    assert len({a.reset(seed=s)[1]["problem_id"] for s in range(200)}) >= 45
    assert make("deepcoder", max_problems=3).problems == PROBLEMS[:3]


def test_stochasticity_zero_is_exact_and_one_ignores_the_answer():
    env = fixed("tether/add", stochasticity=0.0)
    assert env.step(env.solve())[1] == 1.0
    draws = []
    for seed in range(6):
        rewards = []
        for answer in ("def add(a, b):\n    return a + b", "def add(a, b):\n    return 0"):
            env = DeepCoderEnv(stochasticity=1.0)
            env.reset(seed=seed, options={"problem": INDEX["tether/add"]})
            _, reward, _, _, info = env.step(answer)
            rewards.append(reward)
            assert info["success"] == answer.endswith("a + b")  # success stays truthful
        assert rewards[0] == rewards[1] and rewards[0] in env.reward_support
        draws.append(rewards[0])
    assert env.reward_support == (0.0, 0.25, 0.5, 0.75, 1.0) and len(set(draws)) >= 2


def test_loader_reads_the_public_formats(tmp_path):
    rows = [
        {
            "problem": "Two sum: return indices of the two numbers adding to target.",
            "starter_code": "class Solution:\n"
            "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n",
            "tests": json.dumps(
                [
                    {"input": "[2,7,11,15]\n9", "output": "[0,1]", "testtype": "functional"},
                    {"input": "[3,2,4]\n6", "output": "[1,2]", "testtype": "functional"},
                ]
            ),
            "metadata": json.dumps({"func_name": "twoSum"}),
        },
        {
            "problem": "Print the sum of two integers.",
            "starter_code": "",
            "tests": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
            "metadata": "{}",
        },
        {
            "question": "Return the product.",
            "id": 17,
            "input_output": json.dumps(
                {"fn_name": "mul", "inputs": [[2, 3], [4, 5]], "outputs": [[6], [20]]}
            ),
            "solutions": json.dumps(["def mul(a, b):\n    return a * b"]),
        },
        {
            "problem": "Double it.",
            "tests": [{"input": [4], "output": [8], "type": "function_call", "fn_name": "double"}],
        },
        {
            "problem": "Echo the line.",
            "tests": [{"input": "hi\n", "output": "hi\n", "type": "stdin_stdout"}],
        },
        {"problem": "No tests here."},
    ]
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problems = load_problems(str(path))
    assert [(p.fn_name, len(p.tests)) for p in problems] == [
        ("twoSum", 2),
        (None, 1),
        ("mul", 2),
        ("double", 1),
        (None, 1),
    ]
    assert problems[0].tests[0].input == [[2, 7, 11, 15], 9] and problems[0].tests[0].output == [
        0,
        1,
    ]
    assert problems[2].id == "17" and problems[2].solution.startswith("def mul")
    env = make("deepcoder", data_path=str(path))
    answers = [
        "class Solution:\n    def twoSum(self, nums, target):\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return [seen[target - x], i]\n"
        "            seen[x] = i",
        "print(sum(map(int, input().split())))",
        "def mul(a, b):\n    return a * b",
        "def double(x):\n    return 2 * x",
        "print(input())",
    ]
    for i, answer in enumerate(answers):
        env.reset(options={"problem": i})
        assert env.step(answer)[1] == 1.0, i
    env.reset(options={"problem": 2})
    assert env.demonstration(np.random.default_rng(0)) == (
        "mul(2, 3) == [6]: implement it as the task says.",
        "def mul(a, b):\n    return a * b",
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"problem": "x"}) + "\n")
    with pytest.raises(ValueError, match="no usable problems"):
        load_problems(str(empty))


CODEISH = st.sampled_from(
    [
        "def add(a, b):\n    return ",
        "import os\n",
        "print(",
        "```python\n",
        "class Solution:\n    def add(self, a, b):\n        return a",
        "lambda",
        "\n",
    ]
)


@settings(max_examples=25, deadline=None)
@given(st.text(max_size=60) | st.builds(lambda a, b: a + b, CODEISH, st.text(max_size=20)))
def test_step_never_raises(answer):
    env = fixed("tether/add", max_workers=2)
    _, reward, terminated, _, info = env.step(answer)
    assert terminated
    assert reward in (env.reward_support if info["action_is_valid"] else (env.format_penalty,))
