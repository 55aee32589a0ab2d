"""Red-team attacks on DeepCoder's sandbox (issue 16): each must fail with OS isolation
(bubblewrap) on; where practical the same attack is first shown to work with
``isolation: none``, so every test here can fail.

Two ways in: through ``DeepCoderEnv.step`` with the in-process audit hook switched off
by a pure-Python trick the red-team pass found (``HOOK_OFF``, ``SLY_PATH``, ...), and
``run_python(..., bootstrap=UNGUARDED)``, which runs the program after the rlimits
but without the hook at all -- the state a candidate reaches by switching the hook
off with constructed code objects -- to check what the OS layer alone holds.  Runs
as root (CI) and as an ordinary user.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path

import pytest

from tether.envs.deepcoder import DeepCoderEnv, Problem, load_problems
from tether.envs.sandbox import CodeTest, SandboxLimits, run_python
from tether.envs.sandbox.bootstrap import UNGUARDED

ON = SandboxLimits(cpu_seconds=1, wall_seconds=3.0, output_bytes=64 * 1024, isolation="bwrap")
OFF = dataclasses.replace(ON, isolation="none")
AS_ROOT = os.geteuid() == 0
#: The red-team's root case: no interpreter that user nobody can run, so the child
#: stays root (as any user: the child keeps our uid).
OFF_SAME_USER = dataclasses.replace(OFF, drop_privileges=False)
PROJECT = str(Path(__file__).resolve().parents[1])
SHIPPED = str(resources.files("tether.envs").joinpath("data/deepcoder_problems.jsonl"))
PROBLEMS = {p.id: p for p in load_problems()}
ADD = PROBLEMS["tether/add"]

# Pure-Python ways past the audit hook (each worked against isolation: none).
HOOK_OFF = (
    "import os\nos.path.realpath.__code__ = "
    "eval(f'lambda path, *, strict=False: {os.getcwd()!r}').__code__\n"
)
SLY_PATH = (
    "class Sly(str):  # relative to the hook's os.path.join, absolute to the kernel\n"
    "    def startswith(self, *args):\n        return False\n"
    "    def endswith(self, *args):\n        return False\n"
)
SWAP_ISINSTANCE = (
    "import builtins\n_isinstance = builtins.isinstance\n"
    "def _lying(obj, kind):  # the hook skips int paths (fds): call ours an int\n"
    "    if kind is int and type(obj) is str and obj.startswith('/tmp/tether-attack-'):\n"
    "        return True\n"
    "    return _isinstance(obj, kind)\n"
    "builtins.isinstance = _lying\n"
)


def env_on(problem: Problem, isolation: str) -> DeepCoderEnv:
    env = DeepCoderEnv(cpu_seconds=1, wall_seconds=3.0, isolation=isolation, max_workers=2)
    env.reset(options={"problem": problem})
    return env


@pytest.fixture
def shared_dir():
    """A host directory anyone may write (so the none-mode contrast works as nobody too)."""
    path = tempfile.mkdtemp(prefix="tether-attack-", dir="/tmp")
    os.chmod(path, 0o777)
    with open(os.path.join(path, "secret.txt"), "w") as f:
        f.write("TOP-SECRET-42")
    os.chmod(os.path.join(path, "secret.txt"), 0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def steal(shared: str, prefix: str, how: str) -> str:
    """An ``add`` that is right only if it read the secret and wrote a file outside."""
    return (
        prefix + "def add(a, b):\n"
        f"    secret = open({how}({shared + '/secret.txt'!r})).read()\n"
        f"    open({how}({shared + '/stolen.txt'!r}), 'w').write(secret)\n"
        "    return a + b if secret == 'TOP-SECRET-42' else None\n"
    )


@pytest.mark.parametrize(
    "name, prefix, how",
    [
        ("rewritten os.path.realpath", HOOK_OFF, "str"),
        ("str subclass path", SLY_PATH, "Sly"),
        ("replaced builtins.isinstance", SWAP_ISINSTANCE, "str"),
    ],
)
def test_hook_bypasses_reach_host_files_only_without_isolation(shared_dir, name, prefix, how):
    code = steal(shared_dir, prefix, how)
    assert env_on(ADD, "none").step(code)[1] == 1.0, name  # the hook alone is beaten
    os.remove(os.path.join(shared_dir, "stolen.txt"))
    env = env_on(ADD, "bwrap")
    _, reward, _, _, info = env.step(code)
    assert reward == 0.0 and info["action_is_valid"], name
    assert not os.path.exists(os.path.join(shared_dir, "stolen.txt"))
    assert {o.detail for o in env.last_outcomes} == {"FileNotFoundError"}, name


def test_work_in_del_after_shutdown_cleared_the_hooks(shared_dir):
    late = (
        "import os\nclass Late:  # module globals are gone by then: bind what it needs\n"
        "    def __del__(self, osopen=os.open, read=os.read, write=os.write,\n"
        "                reading=os.O_RDONLY, writing=os.O_WRONLY | os.O_CREAT):\n"
        f"        data = read(osopen({shared_dir + '/secret.txt'!r}, reading), 100)\n"
        f"        write(osopen({shared_dir + '/late.txt'!r}, writing), data)\n"
        "keep = Late()\nos._exit = lambda code: None  # so the interpreter shuts down\n"
        "def add(a, b):\n    return a + b\n"
    )
    target = os.path.join(shared_dir, "late.txt")
    env_on(ADD, "none").step(late)
    assert open(target).read() == "TOP-SECRET-42"
    os.remove(target)
    assert env_on(ADD, "bwrap").step(late)[1] == 1.0  # the answer is right; nothing leaked
    assert not os.path.exists(target)


LOOKUP = """import json
def _expected(args):
    for line in open({path!r}):
        tests = json.loads(line)["tests"]
        for given, wanted in zip(tests["inputs"], tests["outputs"]):
            if given == args:
                return wanted
"""


@pytest.mark.parametrize(
    "problem_id, answer",
    [
        ("tether/add", "def add(a, b):\n    return _expected([a, b])"),
        (
            "tether/add",
            "class Solution:\n    def add(self, a, b):\n        return _expected([a, b])",
        ),
        ("tether/sum_two", "import sys\nprint(_expected(sys.stdin.read()), end='')"),
    ],
)
def test_looking_up_expected_outputs_in_the_problem_file_earns_nothing(problem_id, answer):
    code = HOOK_OFF + LOOKUP.format(path=SHIPPED) + answer
    assert env_on(PROBLEMS[problem_id], "none").step(code)[1] == 1.0  # forged without isolation
    env = env_on(PROBLEMS[problem_id], "bwrap")
    assert env.step(code)[1] == 0.0
    assert all(not o.passed for o in env.last_outcomes)


def test_problem_data_given_by_path_is_not_in_the_sandbox(tmp_path):
    rows = [
        {
            "problem": "Return a + b.",
            "tests": {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]},
        }
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = DeepCoderEnv(data_path=str(path), isolation="bwrap")
    env.reset(options={"problem": 0})
    code = HOOK_OFF + LOOKUP.format(path=str(path)) + "def add(a, b):\n    return _expected([a, b])"
    assert env.step(code)[1] == 0.0
    assert "FileNotFoundError" in env.last_outcomes[0].detail


def test_an_unguarded_program_cannot_reach_the_network_or_other_processes():
    """The hook off (here: absent) gives ctypes; the kernel still refuses."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    abstract = socket.socket(socket.AF_UNIX)  # abstract unix sockets belong to the net namespace
    abstract.bind(f"\0tether-attack-{os.getpid()}")
    abstract.listen(1)
    victim_user = {"user": 65534, "group": 65534, "extra_groups": []} if AS_ROOT else {}
    victim = subprocess.Popen(["sleep", "60"], **victim_user)
    attack = (
        "import ctypes, os, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('ctypes loaded')\n"
        "for name, call in (('tcp', lambda: socket.create_connection(('127.0.0.1', {port}), 1)),\n"
        "                   ('unix', lambda: socket.socket(socket.AF_UNIX).connect({unix!r})),\n"
        "                   ('kill', lambda: os.kill({victim}, 9)),\n"
        "                   ('ptrace', lambda: libc.ptrace(16, {victim}, 0, 0) == 0 or 1 / 0)):\n"
        "    try:\n        call()\n        print(name, 'done')\n"
        "    except BaseException as exc:\n        print(name, 'refused', type(exc).__name__)\n"
    )
    code = attack.format(
        port=server.getsockname()[1], victim=victim.pid, unix=f"\0tether-attack-{os.getpid()}"
    )
    try:
        inside = run_python(code, limits=ON, bootstrap=UNGUARDED)
        assert "ctypes loaded" in inside.stdout, inside.stderr
        assert [line.split()[:2] for line in inside.stdout.splitlines()[1:]] == [
            ["tcp", "refused"],
            ["unix", "refused"],
            ["kill", "refused"],
            ["ptrace", "refused"],
        ]
        with pytest.raises(socket.timeout):
            server.accept()
        assert victim.poll() is None
        same_user = OFF_SAME_USER if not AS_ROOT else dataclasses.replace(OFF, drop_privileges=True)
        outside = run_python(code, limits=same_user, bootstrap=UNGUARDED)
        assert {"tcp done", "unix done", "kill done"} <= set(outside.stdout.splitlines()), outside
        assert victim.wait(timeout=5) == -signal.SIGKILL
    finally:
        victim.kill()
        victim.wait()
        server.close()
        abstract.close()


def test_the_child_is_unprivileged_and_sees_no_host_secrets():
    # a process of ours holding a secret in its environment, as Ray's do their token
    holder = subprocess.Popen(["sleep", "60"], env={"TETHER_TEST_SECRET": "ray-token-like-secret"})
    home = os.path.expanduser("~")
    probe = (
        "import os, glob\nfound = []\n"
        "for path in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n        found.append(open(path, 'rb').read())\n"
        "    except OSError:\n        pass\n"
        "print('secret' if any(b'ray-token-like-secret' in f for f in found) else 'no secret')\n"
        f"try:\n    open({home + '/tether-attack-home.txt'!r}, 'w').write('x')\n"
        "    print('home written')\nexcept OSError:\n    print('home refused')\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "print(status['Uid'].split()[0], status['CapEff'].strip(), status['NoNewPrivs'].strip())\n"
    )
    try:
        for limits in (ON, dataclasses.replace(ON, drop_privileges=False)):
            lines = run_python(probe, limits=limits, bootstrap=UNGUARDED).stdout.splitlines()
            assert lines[:2] == ["no secret", "home refused"], lines
            assert not os.path.exists(os.path.join(home, "tether-attack-home.txt"))
            if limits.drop_privileges:  # the real uid 65534 as root, our uid mapped to it otherwise
                assert lines[2].split() == ["65534", "0000000000000000", "1"]
        lines = run_python(probe, limits=OFF_SAME_USER, bootstrap=UNGUARDED).stdout.splitlines()
        assert lines[:2] == ["secret", "home written"]  # what isolation none leaves open
    finally:
        holder.kill()
        holder.wait()
        if os.path.exists(os.path.join(home, "tether-attack-home.txt")):
            os.remove(os.path.join(home, "tether-attack-home.txt"))


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _within(seconds: float, condition):
    """Poll ``condition`` until it returns something true or ``seconds`` pass; its last
    value (a process's end or start is seen as soon as /proc shows it)."""
    deadline = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def test_background_processes_end_with_the_run():
    marker = f"{time.time_ns() % 10**9}.5"
    daemon = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n"
        "    os.closerange(0, 100)\n"
        f"    os.execv('/usr/bin/sleep', ['sleep', {marker!r}])\nprint('forked')\n"
    )
    # kept at uid 0 of the sandbox's namespace, RLIMIT_NPROC does not stop the fork
    run = run_python(
        daemon, limits=dataclasses.replace(ON, drop_privileges=False), bootstrap=UNGUARDED
    )
    assert _within(30, lambda: not _processes_with(marker)), _processes_with(marker)
    if AS_ROOT:  # the contrast: as root without isolation the daemon outlives the run
        assert run.stdout == "forked\n"
        run_python(daemon, limits=OFF_SAME_USER, bootstrap=UNGUARDED)
        survivors = _within(30, lambda: _processes_with(marker))  # once it has exec'd
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        assert survivors


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
@pytest.mark.parametrize(
    "answer, expected",
    [
        (
            "import os\ndef add(a, b):\n    os.write(3, b'\\n{\"result\": ' + b'[' * 100000 + b']' * 100000 + b'}\\n')"
            "\n    os._exit(0)",
            3,
        ),
        ("def add(a, b):\n    return 10 ** 400", 3.0),
        ("def add(a, b):\n    return float('nan')", 3.0),
        ("def add(a, b):\n    return [float('inf')] * 3", [3.0]),
        (
            "import os\ndef add(a, b):\n    os.write(3, b'\\n' + b'9' * 5000 + b'\\n')\n    os._exit(0)",
            3,
        ),
        ("def add(a, b):\n    x = []\n    for _ in range(5000):\n        x = [x]\n    return x", 3),
    ],
)
def test_no_result_crashes_the_judge(isolation, answer, expected):
    problem = Problem(
        "p", "Return a + b.", "add", "def add(a, b):", (CodeTest([1, 2], expected),) * 2, None
    )
    _, reward, terminated, _, info = env_on(problem, isolation).step(answer)
    assert (reward, terminated, info["action_is_valid"]) == (0.0, True, True)


@pytest.mark.parametrize(
    "name, code, status, needle",
    [
        ("infinite loop", "while True:\n    pass", ("error", "timeout"), ""),  # CPU or wall limit
        ("fork bomb", "import os\nwhile True:\n    os.fork()", "error", "BlockingIOError"),
        ("ten gigabytes", "x = bytearray(10 * 2**30)", "error", "MemoryError"),
        (
            "gigabyte of output",
            "import sys\nwhile True:\n    sys.stdout.write('x' * 2**20)",
            "output_limit",
            "",
        ),
        ("write the system", "import os\nopen(os.__file__ + '.evil', 'w')", "error", "Read-only"),
        ("write /usr", "open('/usr/evil', 'w')", "error", "Read-only"),
        ("read /etc", "print(open('/etc/passwd').read())", "error", "FileNotFoundError"),
        (
            "list the project",
            f"import os\nprint(os.listdir({PROJECT!r}))",
            "error",
            "FileNotFoundError",
        ),
        ("host /tmp", "import os\nprint(os.listdir('/tmp'))", "ok", ""),
        (
            "kill everything",
            "import os\ntry:\n    os.kill(-1, 9)\nexcept ProcessLookupError:\n"
            "    print('nobody to kill')",
            "ok",
            "nobody to kill",
        ),
        (
            "netlink",
            "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW)",
            "error",
            "Address family not supported",
        ),
        (
            "new namespace",
            "import ctypes\nassert ctypes.CDLL(None).unshare(0x10000000) == 0",
            "error",
            "AssertionError",
        ),
    ],
)
def test_the_os_layer_alone_holds_the_classic_attacks(name, code, status, needle):
    run = run_python(code, limits=ON, bootstrap=UNGUARDED)
    assert run.status in (status if isinstance(status, tuple) else (status,)), (name, run)
    assert needle in run.stderr + run.stdout, (name, run)
    if name == "infinite loop":  # RLIMIT_CPU's SIGXCPU, or the wall clock on a busy machine
        assert run.returncode in (128 + signal.SIGXCPU, -signal.SIGKILL), run
    # Every attack ends, and what ended it is checked rather than timed (a loaded machine
    # stretches a stopwatch): ok or error, it ended on its own before the 3 s deadline
    # (past it, the status is timeout); timeout or output_limit, the parent killed it.
    if run.status in ("timeout", "output_limit"):
        assert run.returncode == -signal.SIGKILL, (name, run)
    if name == "host /tmp":  # only the run's own directory
        assert eval(run.stdout) == ["sandbox"]
