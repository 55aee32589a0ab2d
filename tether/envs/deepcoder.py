"""DeepCoder: write a Python function (or a stdin/stdout program) that passes hidden tests.

Single turn.  The observation is the task, the signature and one example test;
the answer (what stood inside ``<answer>``, optionally in a Markdown code fence)
is Python source.  It runs in the sandbox (``tether.envs.sandbox``: a separate
limited process per test, tests in parallel across the cores) and the reward is
passed tests / total tests; success means every test passed.  Source that does
not compile is invalid (format penalty, no tests run).

Problems: with ``data_path`` a JSONL (or JSON list) file in the public
DeepCoder / TACO / LiveCodeBench / PrimeIntellect shape -- a statement field
(``problem``, ``question`` or ``question_content``), optional ``starter_code``,
and tests in ``tests`` / ``input_output`` / ``public_test_cases`` (a JSON string
or value) as either ``{"inputs": [...], "outputs": [...], "fn_name": ...}``
(TACO) or a list of ``{"input", "output", "testtype" | "type"}`` (DeepCoder,
LiveCodeBench, PrimeIntellect; functional LiveCodeBench inputs are one JSON
value per line, the function name comes from ``metadata.func_name`` or the
starter code, and ``class Solution`` methods work).  Without a path: the
project's own set of 64 small problems (56 functions, 8 stdin/stdout programs,
4-6 tests each, a reference solution and a one-line hint), shipped in
``tether/envs/data/deepcoder_problems.jsonl``.

Stochasticity (single-turn, docs/methods.md section 11): with probability p the reward is replaced
by a uniform draw from the problem's reward support, the achievable fractions
``k/n`` for ``n`` tests (``info["success"]`` stays truthful).
"""

from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .base import SingleTurnTextEnv
from .sandbox import CodeTest, SandboxLimits, as_text, resolve_isolation, run_tests

MAX_CODE_CHARS = 20_000
MAX_EXAMPLE_CHARS = 60
STATEMENT_FIELDS = ("problem", "question", "question_content", "prompt", "statement", "description")
TEST_FIELDS = ("tests", "input_output", "public_test_cases", "test_cases")
FUNCTION_TYPES = ("functional", "function_call", "function")
FENCE = re.compile(r"^\s*```[a-zA-Z0-9_+-]*\s*\n(.*?)\n?\s*```\s*$", re.DOTALL)
DEF_NAME = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


@dataclass(frozen=True)
class Problem:
    """One task.  ``fn_name`` None means a stdin/stdout program."""

    id: str
    statement: str
    fn_name: str | None
    starter_code: str
    tests: tuple[CodeTest, ...]
    solution: str | None = None
    hint: str = ""


# -- loading ------------------------------------------------------------------------------
def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _function_args(value: Any) -> list:
    """LiveCodeBench writes one JSON value per line; TACO and PrimeIntellect a list."""
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        return [_maybe_json(line) for line in value.split("\n") if line.strip()]
    return [value]


def _starter_function(starter: str) -> str | None:
    names = [n for n in DEF_NAME.findall(starter or "") if n != "__init__"]
    return names[0] if names else None


def parse_problem(row: dict, index: int = 0) -> Problem | None:
    """A ``Problem`` from one row of a public dataset (or this project's file), or
    None when the row has no statement or no usable tests."""
    if not isinstance(row, dict):
        return None
    statement = next((row[f] for f in STATEMENT_FIELDS if isinstance(row.get(f), str)), None)
    raw_tests = next((_maybe_json(row[f]) for f in TEST_FIELDS if row.get(f)), None)
    if not statement or raw_tests is None:
        return None
    metadata = _maybe_json(row.get("metadata")) or {}
    starter = row.get("starter_code") or ""
    fn_name = metadata.get("func_name") if isinstance(metadata, dict) else None
    pairs: list[tuple[Any, Any]] = []
    functional = False
    if isinstance(raw_tests, dict):  # TACO: {"inputs", "outputs", "fn_name"?}
        fn_name = raw_tests.get("fn_name") or fn_name
        functional = bool(fn_name)
        pairs = list(zip(raw_tests.get("inputs") or [], raw_tests.get("outputs") or []))
    elif isinstance(raw_tests, list):
        for test in raw_tests:
            if not isinstance(test, dict) or "input" not in test or "output" not in test:
                continue
            kind = str(test.get("testtype") or test.get("type") or "")
            functional = functional or kind in FUNCTION_TYPES
            fn_name = test.get("fn_name") or fn_name
            output = test["output"]  # LiveCodeBench writes a functional output as JSON text
            pairs.append((test["input"], _maybe_json(output) if kind in FUNCTION_TYPES else output))
    if functional:
        fn_name = fn_name or _starter_function(starter)
        if not fn_name:
            return None
        tests = tuple(CodeTest(_function_args(i), o) for i, o in pairs)
    else:
        fn_name = None
        tests = tuple(CodeTest(as_text(i), as_text(o)) for i, o in pairs)
    if not tests:
        return None
    solution = row.get("solution")
    if not isinstance(solution, str):
        solutions = _maybe_json(row.get("solutions"))
        solution = (
            solutions[0]
            if isinstance(solutions, list) and solutions and isinstance(solutions[0], str)
            else None
        )
    problem_id = next(
        (
            str(row[f])
            for f in ("id", "problem_id", "question_id", "task_id")
            if row.get(f) is not None
        ),
        str(index),
    )
    return Problem(
        problem_id,
        statement.strip(),
        fn_name,
        starter.strip(),
        tests,
        solution,
        str(row.get("hint") or ""),
    )


@functools.lru_cache(maxsize=8)
def load_problems(path: str | None = None) -> tuple[Problem, ...]:
    """Problems of a JSONL or JSON-list file (unusable rows skipped); None: the
    shipped set.  Raises ValueError when no row is usable."""
    if path is None:
        text = (
            resources.files("tether.envs")
            .joinpath("data/deepcoder_problems.jsonl")
            .read_text(encoding="utf-8")
        )
        where = "the shipped DeepCoder problems"
    else:
        text = Path(path).expanduser().read_text(encoding="utf-8")
        where = str(path)
    stripped = text.lstrip()
    if stripped.startswith("["):
        rows = json.loads(stripped)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    problems = tuple(p for i, row in enumerate(rows) if (p := parse_problem(row, i)) is not None)
    if not problems:
        raise ValueError(f"{where}: no usable problems (need a statement and tests)")
    return problems


# -- answers ------------------------------------------------------------------------------
def extract_code(answer: Any) -> str | None:
    """The source of an answer (a Markdown fence is removed), or None if it is not
    text that compiles.  Compiling runs no code."""
    if not isinstance(answer, str) or len(answer) > MAX_CODE_CHARS or "\x00" in answer:
        return None
    match = FENCE.match(answer)
    code = match.group(1) if match else answer
    if not code.strip():
        return None
    try:
        compile(code, "<answer>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    return code


_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.FloorDiv: ast.Mod,
    ast.Mod: ast.FloorDiv,
    ast.Div: ast.Mult,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.And: ast.Or,
    ast.Or: ast.And,
}


def mutate(code: str, rng: np.random.Generator) -> str:
    """A plausible buggy variant of ``code``: one operator swapped or one integer
    constant moved by one; a stub that returns None if nothing can be changed."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    sites: list[tuple[ast.AST, str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in _SWAPS:
            sites.append((node, "op", 0))
        elif isinstance(node, ast.Compare):
            sites += [(node, "cmp", i) for i, op in enumerate(node.ops) if type(op) in _SWAPS]
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites.append((node, "int", 0))
    if not sites:
        stub = re.sub(r"(def [^\n]*:)[\s\S]*", r"\1\n    return None", code, count=1)
        return stub if stub != code else "pass"
    node, kind, i = sites[int(rng.integers(len(sites)))]
    if kind == "op":
        node.op = _SWAPS[type(node.op)]()  # type: ignore[attr-defined]
    elif kind == "cmp":
        node.ops[i] = _SWAPS[type(node.ops[i])]()  # type: ignore[attr-defined]
    else:
        node.value += 1 if rng.random() < 0.5 or node.value == 0 else -1  # type: ignore[attr-defined]
    row, end_row = getattr(node, "lineno", 0), getattr(node, "end_lineno", -1)
    if row != end_row:
        return ast.unparse(tree)
    # Splice the changed expression into the original text (offsets are in bytes),
    # so the rest keeps the reference's style.
    lines = code.splitlines(keepends=True)
    line = lines[row - 1].encode()
    start, end = node.col_offset, node.end_col_offset
    lines[row - 1] = (line[:start] + ast.unparse(node).encode() + line[end:]).decode()
    return "".join(lines)


def _short(value: Any) -> str:
    """Compact Python literal: ``[1,2]`` rather than ``[1, 2]`` (fewer tokens)."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_short(k)}:{_short(v)}" for k, v in value.items()) + "}"
    return repr(value)


class DeepCoderEnv(SingleTurnTextEnv):
    """Code generation judged by hidden tests in the sandbox.

    Args:
        data_path: a DeepCoder/TACO/LiveCodeBench-style JSONL file (None: the
            shipped problems).
        max_problems: use only the first N problems (None: all).
        cpu_seconds, wall_seconds, memory_mb: sandbox limits per test.
        max_workers: tests run in parallel on this many processes (None: cores).
        isolation: ``sandbox.isolation`` of the run config: ``auto`` / ``bwrap`` run
            every program under bubblewrap (``auto`` refuses to construct the env
            where it does not work), ``none`` opts out of OS isolation.
        stochasticity, format_penalty: as in ``SingleTurnTextEnv``.
    """

    runs_untrusted_code = True

    def __init__(
        self,
        data_path: str | None = None,
        max_problems: int | None = None,
        cpu_seconds: int = 1,
        wall_seconds: float = 3.0,
        memory_mb: int = 512,
        max_workers: int | None = None,
        isolation: str = "auto",
        stochasticity: float = 0.0,
        format_penalty: float = -0.1,
    ) -> None:
        super().__init__(stochasticity, format_penalty)
        problems = load_problems(None if data_path is None else str(data_path))
        if max_problems is not None:
            if int(max_problems) < 1:
                raise ValueError(f"max_problems must be at least 1, got {max_problems}")
            problems = problems[: int(max_problems)]
        self.problems = problems
        resolve_isolation(isolation)  # refuse now, not at the first step, if it cannot be had
        self.limits = SandboxLimits(
            cpu_seconds=int(cpu_seconds),
            wall_seconds=float(wall_seconds),
            memory_bytes=int(memory_mb) * 2**20,
            isolation=isolation,
        )
        self.max_workers = max_workers
        self.problem: Problem | None = None
        self.reward_support = (0.0, 1.0)
        self.last_outcomes: list = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Problem named by ``seed``; ``options={"problem": <index or Problem>}`` fixes one."""
        rng = self._seed_level_rng(seed)
        chosen = (options or {}).get("problem")
        if isinstance(chosen, Problem):
            self.problem = chosen
        elif chosen is not None:
            self.problem = self.problems[int(chosen) % len(self.problems)]
        else:
            self.problem = self.problems[int(rng.integers(len(self.problems)))]
        n = len(self.problem.tests)
        self.reward_support = tuple(k / n for k in range(n + 1))
        self.last_outcomes = []
        return self.render(), {"problem_id": self.problem.id, "num_tests": n}

    def score(self, answer: str) -> tuple[float, bool, bool]:
        if self.problem is None:
            return 0.0, False, False
        code = extract_code(answer)
        if code is None:
            return 0.0, False, False
        self.last_outcomes = run_tests(
            code, self.problem.tests, self.problem.fn_name, self.limits, self.max_workers
        )
        passed = sum(o.passed for o in self.last_outcomes)
        total = len(self.problem.tests)
        return passed / total, True, passed == total

    def solve(self) -> str | None:
        """The reference solution (None for a loaded problem without one)."""
        return None if self.problem is None else self.problem.solution

    # -- text ---------------------------------------------------------------------------
    def rules(self) -> str:
        return (
            "DeepCoder: write Python 3 code for the task. Answer with the code only: the "
            "function with the given signature, or a program reading stdin and printing "
            "the output. Reward = share of hidden tests passed."
        )

    def _example(self) -> str | None:
        assert self.problem is not None
        test = self.problem.tests[0]
        if self.problem.fn_name:
            args = ", ".join(_short(a) for a in test.input)
            text = f"{self.problem.fn_name}({args}) == {_short(test.output)}"
        else:
            text = f"input {json.dumps(test.input.strip())} gives {json.dumps(test.output.strip())}"
        return text if len(text) <= MAX_EXAMPLE_CHARS else None

    def render(self) -> str:  # type: ignore[override]
        if self.problem is None:
            return "No problem: call reset()."
        lines = [f"Task: {self.problem.statement}"]
        if self.problem.fn_name:
            signature = self.problem.starter_code or f"def {self.problem.fn_name}(...):"
            lines.append(f"Signature: {signature}")
        else:
            lines.append("Program: read stdin, print to stdout.")
        example = self._example()
        if example:
            lines.append(f"Example: {example}")
        return "\n".join(lines)

    def demonstration(self, rng: np.random.Generator, noise: float = 0.0) -> tuple[str, str]:
        """The example and the problem's hint, then the reference solution; with
        probability ``noise`` a mutated (usually failing) variant of it."""
        assert self.problem is not None
        example = self._example()
        hint = self.problem.hint or "implement it as the task says."
        reasoning = f"{example}: {hint}" if example else hint
        solution = self.problem.solution
        if solution is None:
            name = self.problem.fn_name
            return reasoning, f"def {name}(*args):\n    return None" if name else "print()"
        if rng.random() < noise:
            solution = mutate(solution, rng)
        return reasoning, solution
