"""The code sandbox: correct judging, and resistance to hostile candidates (each gets
reward 0 quickly, and this test process keeps running)."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import threading

import pytest

from tether.envs.deepcoder import DeepCoderEnv, Problem
from tether.envs.sandbox import (
    CodeTest,
    SandboxLimits,
    _runner,
    run_python,
    run_tests,
    same_function_output,
    same_stdout,
)
from tether.envs.sandbox.isolation import INSIDE_WORK

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=2.0, output_bytes=64 * 1024)
ADD_TESTS = (CodeTest([1, 2], 3), CodeTest([5, 5], 10))
ADD = Problem(
    "add", "Return a + b.", "add", "def add(a, b):", ADD_TESTS, "def add(a, b):\n    return a + b"
)


def attack_env() -> DeepCoderEnv:
    env = DeepCoderEnv(cpu_seconds=1, wall_seconds=1.0)
    env.reset(options={"problem": ADD})
    return env


def test_function_and_program_runs():
    run = run_python(
        "def f(a, b):\n    print('noise')\n    return [a + b, (1, 2), {'k': None}]",
        fn_name="f",
        args=[1, 2],
        limits=FAST,
    )
    assert run.ok and run.stdout.strip().splitlines()[-1] == '{"result":[3,[1,2],{"k":null}]}'
    run = run_python(
        "import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="3 4\n5", limits=FAST
    )
    assert (run.status, run.stdout) == ("ok", "12\n")
    run = run_python("raise ValueError('boom')", limits=FAST)
    assert run.status == "error" and "ValueError: boom" in run.stderr


def test_judging_counts_passed_tests_and_compares_leniently():
    outcomes = run_tests("def add(a, b):\n    return 3", ADD_TESTS, "add", FAST)
    assert [o.passed for o in outcomes] == [True, False]
    leetcode = "class Solution:\n    def add(self, a, b):\n        return a + b"
    assert [o.status for o in run_tests(leetcode, ADD_TESTS, "add", FAST)] == ["ok", "ok"]
    assert (
        run_tests("def other(a, b):\n    return a + b", ADD_TESTS, "add", FAST)[0].status == "error"
    )
    assert same_function_output((1, 2), [1, 2]) and same_function_output(3, [3])
    assert same_function_output(0.1 + 0.2, 0.3) and not same_function_output(True, 1)
    assert not same_function_output("3", 3) and not same_function_output([1], [1, 2])
    assert same_stdout("1 2  \n3\n\n", "1 2\n3") and same_stdout("0.3000000001", "0.3")
    assert not same_stdout("1 2", "1 3")


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_child_has_a_clean_env_and_a_throwaway_directory(isolation):
    limits = dataclasses.replace(FAST, isolation=isolation)
    run = run_python("import os\nprint(os.getcwd())\nprint(sorted(os.environ))", limits=limits)
    cwd, env_keys = run.stdout.splitlines()
    if isolation == "bwrap":  # a tmpfs inside the sandbox: nothing of it on the host
        assert cwd == INSIDE_WORK
    else:
        assert os.path.basename(cwd).startswith("tether-sandbox-") and not os.path.exists(cwd)
    assert set(eval(env_keys)) <= {"PATH", "LANG", "LC_CTYPE", "PWD"}  # bwrap sets PWD
    run = run_python(
        "open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read())", limits=limits
    )
    assert run.stdout == "ok\n"  # its own directory is writable


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="privilege drop needs root")
def test_as_root_the_child_runs_unprivileged_when_possible():
    run = run_python("import os\nprint(os.getuid())", limits=FAST)
    assert run.stdout.strip() == "65534"  # under bubblewrap: always, the real uid 65534
    interpreter, uid = _runner()  # isolation none: only with an interpreter nobody can run
    run = run_python(
        "import os\nprint(os.getuid())", limits=dataclasses.replace(FAST, isolation="none")
    )
    assert run.stdout.strip() == str(uid if uid is not None else 0)


def test_parallel_evaluation_uses_several_processes(monkeypatch):
    """Sandboxed processes alive at once, counted (not timed: a loaded machine would
    stretch a time bound)."""
    from tether.envs.sandbox import judge

    real, lock, alive, most = judge.run_python, threading.Lock(), [0], [0]

    def counted(*args, **kwargs):
        with lock:
            alive[0] += 1
            most[0] = max(most[0], alive[0])
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                alive[0] -= 1

    monkeypatch.setattr(judge, "run_python", counted)
    tests = [CodeTest([0.6], None)] * 4
    outcomes = run_tests(
        "import time\ndef nap(s):\n    time.sleep(s)", tests, "nap", FAST, max_workers=4
    )
    assert all(o.passed for o in outcomes)
    assert most[0] >= 2, f"at most {most[0]} sandboxed process at a time"


def test_infinite_loop_is_killed_at_the_wall_time():
    """What ended the run is checked, not how long it took (a loaded machine stretches
    a stopwatch): the parent's wall-clock deadline (status timeout, not before 1 s) and
    its SIGKILL, before the child's own CPU limit (5 s of CPU, SIGXCPU) could."""
    run = run_python("while True:\n    pass", limits=SandboxLimits(cpu_seconds=5, wall_seconds=1.0))
    assert run.status == "timeout" and run.returncode == -signal.SIGKILL, run
    assert run.seconds >= 1.0
    _, reward, _, _, info = attack_env().step("def add(a, b):\n    while True:\n        pass")
    assert reward == 0.0 and info["action_is_valid"]


def test_fork_bomb_is_refused():
    run = run_python("import os\nwhile True:\n    os.fork()", limits=FAST)
    # Refused at the first fork: the program ends on the refusal's exception (exit 1),
    # not at its CPU limit (SIGXCPU) nor at its 2 s deadline (status timeout).
    assert run.status == "error" and "os.fork" in run.stderr and run.returncode == 1, run
    assert (
        attack_env().step("import os\ndef add(a, b):\n    while True:\n        os.fork()")[1] == 0.0
    )
    run = run_python("import subprocess\nsubprocess.run(['true'])", limits=FAST)
    assert run.status == "error" and "not allowed" in run.stderr


def test_ten_gigabyte_allocation_fails_inside_the_child():
    run = run_python("x = bytearray(10 * 2**30)\nprint(len(x))", limits=FAST)
    assert run.status == "error" and "MemoryError" in run.stderr
    assert (
        attack_env().step("def add(a, b):\n    x = bytearray(10 * 2**30)\n    return a + b")[1]
        == 0.0
    )


def test_writing_outside_the_working_directory_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    run = run_python(f"open({str(target)!r}, 'w').write('x')", limits=FAST)
    assert run.status == "error" and "outside the working directory" in run.stderr
    code = f"def add(a, b):\n    open({str(target)!r}, 'w').write('x')\n    return a + b"
    assert attack_env().step(code)[1] == 0.0
    run = run_python(f"import os\nos.remove({str(tmp_path / 'keep.txt')!r})", limits=FAST)
    assert run.status == "error"
    assert not target.exists()


def test_reading_a_file_outside_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-42")
    run = run_python(f"print(open({str(secret)!r}).read())", limits=FAST)
    assert run.status == "error" and "TOP-SECRET-42" not in run.stdout
    run = run_python("print(open('/etc/hostname').read())", limits=FAST)
    assert run.status == "error"
    code = f"def add(a, b):\n    return int(open({str(secret)!r}).read()[-2:]) * 0 + a + b"
    assert attack_env().step(code)[1] == 0.0


def test_network_sockets_are_refused():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        for code in (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}))",
            "import _socket\n_socket.socket()",
        ):
            run = run_python(code, limits=FAST)
            assert run.status == "error" and "not allowed" in run.stderr
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    finally:
        server.close()
    code = "import socket\ndef add(a, b):\n    socket.socket()\n    return a + b"
    assert attack_env().step(code)[1] == 0.0


def test_printing_a_gigabyte_is_cut_at_the_output_cap():
    gigabyte = "import sys\nchunk = 'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.write(chunk)"
    run = run_python(gigabyte, limits=FAST)
    assert run.status == "output_limit" and len(run.stdout) <= FAST.output_bytes
    # Cut off at the cap: the parent killed it there (SIGKILL), it did not write its
    # gigabyte to the end (exit 0) while the parent read on.
    assert run.returncode == -signal.SIGKILL, run
    env = attack_env()
    env.problem = Problem("echo", "Print the sum.", None, "", (CodeTest("1 2", "3"),), None)
    assert env.step("print('x' * 2**30)")[1] == 0.0


def test_killing_the_parent_is_refused_and_we_keep_running():
    parent = os.getpid()
    for code in (
        "import os\nos.kill(os.getppid(), 9)",
        "import os, signal\nos.killpg(0, 9)",
        "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)",
    ):
        run = run_python(code, limits=FAST)
        assert run.status == "error", code
    assert attack_env().step("import os\ndef add(a, b):\n    os.kill(os.getppid(), 9)")[1] == 0.0
    assert os.getpid() == parent
    assert run_python("print('still here')", limits=FAST).stdout == "still here\n"


def test_ffi_and_new_extension_modules_are_refused():
    for code in (
        "import ctypes",
        "import _imp\n_imp.create_dynamic(None)",
        "import sys, os\nsys.addaudithook(lambda *a: None)\nos.fork()",
    ):
        run = run_python(code, limits=FAST)
        assert run.status == "error", code
    run = run_python(
        "import json, re, heapq, collections, itertools, functools, math, bisect, "
        "random, fractions, decimal, datetime, dataclasses, typing, string\nprint('ok')",
        limits=FAST,
    )
    assert run.stdout == "ok\n", run.stderr  # ordinary solutions still import what they need


def test_a_sandboxed_run_never_raises_on_odd_source():
    for code in ("\udcff", "\x00", "", "import sys\nsys.exit(3)", "import os\nos._exit(0)"):
        run = run_python(code, fn_name="f", args=[1], limits=FAST)
        assert run.status in ("ok", "error") and '"result"' not in run.stdout
    assert sys.getrecursionlimit() > 0  # and we are still here
