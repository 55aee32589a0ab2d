"""The judge outside the sandbox (never raises, whatever a program prints or returns)
and the ``sandbox.isolation`` setting (issue 16); the seccomp filter is checked inside
the sandbox in test_sandbox_seccomp.py."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.envs.deepcoder import DeepCoderEnv
from tether.envs.sandbox import (
    BadResult,
    CodeTest,
    RunResult,
    SandboxUnavailable,
    judge_output,
    parse_report,
    resolve_isolation,
    same_function_output,
    same_stdout,
)
from tether.envs.sandbox import isolation as isolation_module
from tether.platform.config import build_config

ROOT = Path(__file__).resolve().parents[1]

# -- the judge ----------------------------------------------------------------------------
JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=50)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=40,
)


@st.composite
def child_stdout(draw) -> str:
    """What a hostile or broken child might print as its result line."""
    kind = draw(st.sampled_from(["value", "nested", "digits", "text", "number_words"]))
    if kind == "value":
        return "\n" + json.dumps({"result": draw(JSON_VALUES)}) + "\n"
    if kind == "nested":
        depth = draw(st.integers(min_value=90, max_value=200_000))
        return '{"result": ' + "[" * depth + "]" * draw(st.integers(0, depth)) + "}"
    if kind == "digits":
        return '{"result": ' + "9" * draw(st.integers(1, 20_000)) + "}"
    if kind == "number_words":
        return (
            '{"result": ' + draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"])) + "}"
        )
    return draw(st.text(max_size=2000))


def fuzz_judge(stdout: str, status: str, expected, fn_name) -> None:
    run = RunResult(status, stdout, "", 0 if status == "ok" else 1, 0.01)
    verdict = judge_output(run, CodeTest([1], expected), fn_name)
    assert isinstance(verdict.passed, bool) and verdict.status in (
        "ok",
        "wrong_answer",
        "error",
        "timeout",
        "output_limit",
    )  # never "judge_error"
    if status not in ("ok", "error"):
        assert not verdict.passed


JUDGE_INPUTS = dict(
    stdout=child_stdout(),
    status=st.sampled_from(["ok", "error", "timeout"]),
    expected=JSON_VALUES,
    fn_name=st.sampled_from(["f", None]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**JUDGE_INPUTS)
def test_the_judge_never_raises(stdout, status, expected, fn_name):
    fuzz_judge(stdout, status, expected, fn_name)


@pytest.mark.slow
def test_the_judge_never_raises_on_ten_thousand_inputs():
    judged = []

    @settings(
        max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    @given(**JUDGE_INPUTS)
    def judge(stdout, status, expected, fn_name):
        fuzz_judge(stdout, status, expected, fn_name)
        judged.append(1)

    judge()
    assert len(judged) == 10_000


@settings(max_examples=300, deadline=None)
@given(got=JSON_VALUES, expected=JSON_VALUES, text=st.text(max_size=200))
def test_comparisons_never_raise(got, expected, text):
    assert isinstance(same_function_output(got, expected), bool)
    assert isinstance(same_stdout(text, str(expected)), bool)


def test_result_lines_are_checked_with_their_reason():
    assert parse_report('noise\n{"result": [1, {"a": null}]}\n') == {"result": [1, {"a": None}]}
    for line, reason in [
        ("", "no result line"),
        ("[" * 100_000, "RecursionError"),
        ('{"result": ' + "[" * 150 + "]" * 150 + "}", "nested deeper than 100"),
        ('{"result": ' + "7" * 5000 + "}", "unreadable result line"),
        ('{"result": [' + "0," * 250_000 + "0]}", "more than 200000 values"),
        ('{"other": 1}', "is not"),
        ("[1, 2]", "is not"),
    ]:
        with pytest.raises(BadResult, match=reason):
            parse_report(line)
    huge = RunResult("ok", '{"result": ' + str(10**400) + "}", "", 0, 0.0)
    assert judge_output(huge, CodeTest([1], 1.5), "f").status == "wrong_answer"
    assert judge_output(huge, CodeTest([1], 10**400), "f").passed  # exact big ints still match
    nan = RunResult("ok", '{"result": NaN}', "", 0, 0.0)
    assert not judge_output(nan, CodeTest([1], float("nan")), "f").passed
    inf = RunResult("ok", '{"result": Infinity}', "", 0, 0.0)
    assert judge_output(inf, CodeTest([1], [float("inf")]), "f").passed  # [x] matches x (TACO)
    assert same_stdout("1e999", "inf") and not same_stdout("1e999", "0")


# -- the setting --------------------------------------------------------------------------
@pytest.fixture
def no_bwrap(monkeypatch):
    """A machine without bubblewrap on PATH (the probe is re-run and forgotten after)."""
    monkeypatch.setenv("PATH", "/nonexistent")
    isolation_module._probe_once.cache_clear()
    yield
    isolation_module._probe_once.cache_clear()


def test_auto_and_bwrap_refuse_without_bubblewrap_and_none_warns(no_bwrap, caplog):
    for setting in ("auto", "bwrap"):
        with pytest.raises(SandboxUnavailable) as err:
            resolve_isolation(setting)
        message = str(err.value)
        assert message.startswith(
            f"sandbox.isolation={setting}: cannot isolate untrusted code, "
            "the bwrap program is not installed"
        )
        assert "sandbox.isolation=none" in message and "\n" not in message
        with pytest.raises(SandboxUnavailable):
            DeepCoderEnv(isolation=setting)
    isolation_module._warned_none.clear()
    with caplog.at_level(logging.WARNING):
        env = DeepCoderEnv(isolation="none")
        env.reset(seed=0)
        assert env.step(env.solve())[1] == 1.0
    assert [r.message.split(":")[0] for r in caplog.records] == ["sandbox.isolation=none"]


def test_auto_uses_bubblewrap_here():
    assert resolve_isolation("auto") == "bwrap"
    with pytest.raises(ValueError, match="auto, bwrap or none"):
        resolve_isolation("docker")


def test_the_setting_reaches_the_env_that_runs_code():
    cfg = build_config({}, ["env.id=deepcoder", "sandbox.isolation=none"])
    assert cfg.env_kwargs() == {"stochasticity": 0.0, "format_penalty": -0.1, "isolation": "none"}
    assert cfg.flat()["sandbox.isolation"] == "none"
    assert "isolation" not in build_config({}, ["env.id=sokoban"]).env_kwargs()


def test_a_run_refuses_to_start_with_one_line_naming_the_setting(tmp_path):
    env = {**os.environ, "PATH": "/nonexistent"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.platform.cli",
            "run",
            str(ROOT / "experiments/deepcoder.yaml"),
            f"experiment.output_dir={tmp_path}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines == [
        "error: sandbox.isolation=auto: cannot isolate untrusted code, the bwrap "
        "program is not installed; install bubblewrap (apt-get install bubblewrap, "
        "or bash scripts/setup.sh) or set sandbox.isolation=none to run it without "
        "OS isolation"
    ]
    assert not (tmp_path / "artifacts").exists()
