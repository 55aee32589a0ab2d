"""The judge, outside the sandbox: it alone holds the expected outputs.

The child gets the program and one test's input and hands back what the program
printed (stdin/stdout tests) or the function's result as one JSON line.  The judge
reads that line under caps (``MAX_RESULT_DEPTH`` levels of nesting,
``MAX_RESULT_NODES`` values, Python's own 4 300-digit limit on integers, the run's
``output_bytes`` on the whole), compares it with the expected value, and turns any
exception on the way into a failed test with its reason -- nothing a program
prints or returns raises out of ``run_tests``.

Comparison: a function result is compared after a JSON round trip (tuples become
lists, dict keys strings); a one-element expected list also matches its element
(the TACO convention); floats match within 1e-6 (relative or absolute), an integer
too large for a float never matches a float, NaN matches nothing.  A stdin/stdout
test compares lines with trailing whitespace stripped, then tokens (numbers within
1e-6).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .process import SandboxLimits, run_python

MAX_RESULT_DEPTH = 100
MAX_RESULT_NODES = 200_000
NUMERIC_ERRORS = (OverflowError, ValueError, TypeError)


@dataclass(frozen=True)
class CodeTest:
    """Function test: ``input`` is the argument list, ``output`` the return value.
    Stdin/stdout test: both are text."""

    input: Any
    output: Any


@dataclass
class Verdict:
    passed: bool
    status: str
    detail: str = field(default="")


class BadResult(ValueError):
    """A child's result line that the judge will not compare."""


def check_shape(value: Any) -> None:
    """Raise ``BadResult`` unless ``value`` is plain JSON data within the caps
    (walked without recursion, so no depth can overflow the judge's stack)."""
    stack, nodes = [(value, 0)], 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if depth > MAX_RESULT_DEPTH:
            raise BadResult(f"result nested deeper than {MAX_RESULT_DEPTH} levels")
        if nodes > MAX_RESULT_NODES:
            raise BadResult(f"result has more than {MAX_RESULT_NODES} values")
        if isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                raise BadResult("result has a non-text key")
            stack.extend((v, depth + 1) for v in item.values())
        elif not (item is None or isinstance(item, (bool, int, float, str))):
            raise BadResult(f"result holds a {type(item).__name__}")


def parse_report(stdout: str) -> Any:
    """The child's last stdout line as a ``{"result": ...}`` or ``{"error": ...}``
    dict, checked; raises ``BadResult`` with the reason otherwise."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise BadResult("no result line")
    try:
        payload = json.loads(lines[-1])
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting past the C stack
        raise BadResult(f"unreadable result line ({type(exc).__name__})") from None
    check_shape(payload)
    if not isinstance(payload, dict) or not ({"result"} <= payload.keys() or "error" in payload):
        raise BadResult('result line is not {"result": ...} or {"error": ...}')
    return payload


def _normalise(value: Any) -> Any:
    """JSON round trip: tuples become lists, dict keys strings."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        try:
            return repr(value)
        except (RecursionError, ValueError):  # repr of nesting past the stack, of a huge int
            return "<unrepresentable>"


def _numbers_close(got: Any, expected: Any) -> bool:
    try:
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)
    except NUMERIC_ERRORS:  # an int past the float range against a float
        return False


def same_value(got: Any, expected: Any) -> bool:
    """Equality with float tolerance, after JSON normalisation."""
    if isinstance(expected, float) or isinstance(got, float):
        if (
            isinstance(got, (int, float))
            and isinstance(expected, (int, float))
            and not isinstance(got, bool)
            and not isinstance(expected, bool)
        ):
            return _numbers_close(got, expected)
        return False
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(same_value(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(same_value(got[k], expected[k]) for k in got)
    return type(got) is type(expected) and got == expected


def same_function_output(got: Any, expected: Any) -> bool:
    got, expected = _normalise(got), _normalise(expected)
    try:
        if same_value(got, expected):
            return True
        return isinstance(expected, list) and len(expected) == 1 and same_value(got, expected[0])
    except RecursionError:  # values nested nearly as deep as the stack allows
        return False


def _tokens_match(a: str, b: str) -> bool:
    ta, tb = a.split(), b.split()
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if x == y:
            continue
        try:
            if not _numbers_close(float(x), float(y)):
                return False
        except ValueError:
            return False
    return True


def same_stdout(got: str, expected: str) -> bool:
    lines = lambda s: [line.rstrip() for line in s.strip().splitlines()]  # noqa: E731
    return lines(got) == lines(expected) or _tokens_match(got, expected)


def as_text(value: Any) -> str:
    """A stdin/stdout test's input or output as text (datasets also write line lists)."""
    if isinstance(value, str):
        return value
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def judge_output(run, test: CodeTest, fn_name: str | None) -> Verdict:
    """Verdict on one finished run (``RunResult``) against ``test``; never raises."""
    try:
        if fn_name is None:
            if not run.ok:
                return Verdict(False, run.status, run.stderr[-200:])
            passed = same_stdout(run.stdout, as_text(test.output))
            return Verdict(passed, "ok" if passed else "wrong_answer")
        if run.status not in ("ok", "error"):
            return Verdict(False, run.status)
        try:
            payload = parse_report(run.stdout)
        except BadResult as exc:
            return Verdict(False, "error", f"{exc}; {run.stderr[-200:]}".strip("; "))
        if "result" not in payload:
            return Verdict(False, "error", str(payload.get("error"))[:200] or run.stderr[-200:])
        passed = same_function_output(payload["result"], test.output)
        return Verdict(passed, "ok" if passed else "wrong_answer")
    except Exception as exc:  # a judge bug or an input we did not foresee: a failed test
        return Verdict(False, "judge_error", f"{type(exc).__name__}: {str(exc)[:200]}")


def _judge_one(code: str, test: CodeTest, fn_name: str | None, limits: SandboxLimits) -> Verdict:
    if fn_name is None:
        run = run_python(code, stdin=as_text(test.input), limits=limits)
    else:
        args = test.input if isinstance(test.input, (list, tuple)) else [test.input]
        run = run_python(code, fn_name=fn_name, args=args, limits=limits)
    return judge_output(run, test, fn_name)


def run_tests(
    code: str,
    tests: Sequence[CodeTest],
    fn_name: str | None = None,
    limits: SandboxLimits = SandboxLimits(),
    max_workers: int | None = None,
) -> list[Verdict]:
    """Judge ``code`` on every test, one sandboxed process per test, in parallel
    over ``max_workers`` threads (default: the number of cores)."""
    if not tests:
        return []
    workers = max(1, min(len(tests), max_workers or os.cpu_count() or 1))
    if workers == 1:
        return [_judge_one(code, t, fn_name, limits) for t in tests]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda t: _judge_one(code, t, fn_name, limits), tests))
