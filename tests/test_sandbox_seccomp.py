"""The seccomp filter (issue 74), inside the real bubblewrap sandbox: every refused
system call fails with its errno, the kernel alone answers the same calls otherwise
(the run repeated with the filter left out), allowed calls still work, a system call
of another ABI kills the process, and without libseccomp (or on a machine the filter
is not built for) runs go on under the other layers, saying so once."""

from __future__ import annotations

import ctypes.util
import errno
import json
import logging
import os
import platform
import signal
import sys

import pyseccomp
import pytest

from tether.envs.sandbox import SandboxLimits, run_python
from tether.envs.sandbox import isolation as isolation_module
from tether.envs.sandbox import seccomp as seccomp_module
from tether.envs.sandbox.bootstrap import UNGUARDED
from tether.envs.sandbox.seccomp import CLONE_NAMESPACE_FLAGS, DENIED

ON = SandboxLimits(cpu_seconds=2, wall_seconds=10.0, output_bytes=64 * 1024, isolation="bwrap")
CLONE_THREAD = 0x00010000  # without CLONE_SIGHAND the kernel refuses it with EINVAL
NUMBERS = {
    name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    for name in (*DENIED, "clone", "clone3")
}
FAMILIES = {"inet": 2, "inet6": 10, "netlink": 16, "packet": 17}

#: Prints one JSON object: each probe's result, or minus its errno.  ``sweep`` calls
#: every refused system call with zero arguments (harmless even if one got through).
PROBE = r"""
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
NUMBERS, FAMILIES, NAMESPACE_FLAGS, CLONE_THREAD, SWEEP = {args}

def checked(result):
    return -ctypes.get_errno() if result == -1 else result

def raw(name, *args):
    ctypes.set_errno(0)
    return checked(libc.syscall(ctypes.c_long(NUMBERS[name]), *map(ctypes.c_long, args)))

def attempt(make):
    try:
        return make()
    except OSError as exc:
        return -exc.errno

def pair(family):
    a, b = socket.socketpair(family)
    a.send(b"ok")
    return b.recv(2).decode()

def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return os.waitpid(pid, 0)[1]

def file():
    with open("probe.txt", "w") as f:
        f.write("written")
    with open("probe.txt") as f:
        return f.read()

out = {{name: raw(name) for name in NUMBERS if SWEEP and name not in ("clone", "clone3")}}
ctypes.set_errno(0)
out["ptrace attach"] = checked(libc.ptrace(ctypes.c_long(16), ctypes.c_long(2**22), None, None))
out["unshare 0"] = checked(libc.unshare(0))
out["clone3"] = raw("clone3", 0, 0)
for flag in NAMESPACE_FLAGS:
    out[f"clone {{flag:#x}}"] = raw("clone", flag | CLONE_THREAD, 0, 0, 0, 0)
out["clone thread"] = raw("clone", CLONE_THREAD, 0, 0, 0, 0)
for name, family in FAMILIES.items():
    out[f"socket {{name}}"] = attempt(lambda: socket.socket(family, socket.SOCK_DGRAM).close())
out["socket unix"] = attempt(lambda: socket.socket(socket.AF_UNIX).close())
out["socketpair inet"] = attempt(lambda: pair(socket.AF_INET))
out["socketpair unix"] = attempt(lambda: pair(socket.AF_UNIX))
out["fork"] = attempt(fork)
out["file"] = attempt(file)
print(json.dumps(out))
"""


def probe(sweep: bool) -> dict[str, object]:
    args = (NUMBERS, FAMILIES, CLONE_NAMESPACE_FLAGS, CLONE_THREAD, sweep)
    run = run_python(PROBE.format(args=repr(args)), limits=ON, bootstrap=UNGUARDED)
    assert run.status == "ok", run
    return json.loads(run.stdout)


@pytest.fixture
def without_filter(monkeypatch):
    """Sandboxed runs as usual, minus the seccomp filter."""
    monkeypatch.setattr(isolation_module, "policy", lambda: None)


@pytest.fixture
def fresh_policy():
    """The filter is built (and libseccomp looked for) again, and forgotten after."""
    seccomp_module._policy.cache_clear()
    seccomp_module._libseccomp.cache_clear()
    yield
    seccomp_module._policy.cache_clear()
    seccomp_module._libseccomp.cache_clear()


# Common to both runs: what the filter allows, and what the kernel then says.
ALLOWED = {
    "clone thread": -errno.EINVAL,
    "socket unix": None,
    "socketpair unix": "ok",
    "fork": -errno.EAGAIN,  # the bootstrap's RLIMIT_NPROC, after the filter let it through
    "file": "written",
}


def test_refused_calls_fail_with_their_errno_and_allowed_ones_still_work():
    out = probe(sweep=True)
    assert {name: out[name] for name in DENIED} == {name: -errno.EPERM for name in DENIED}
    assert out["ptrace attach"] == out["unshare 0"] == -errno.EPERM
    assert out["clone3"] == -errno.ENOSYS
    for flag in CLONE_NAMESPACE_FLAGS:
        assert out[f"clone {flag:#x}"] == -errno.EPERM, hex(flag)
    for name in FAMILIES:
        assert out[f"socket {name}"] == -errno.EAFNOSUPPORT, name
    assert out["socketpair inet"] == -errno.EAFNOSUPPORT
    assert {name: out[name] for name in ALLOWED} == ALLOWED


def test_without_the_filter_the_kernel_answers_those_calls_otherwise(without_filter):
    out = probe(sweep=False)
    assert out["ptrace attach"] == -errno.ESRCH  # no such process: the call reached the kernel
    assert out["unshare 0"] == 0  # unsharing nothing succeeds
    assert out["clone3"] == -errno.EINVAL  # a zero-sized argument
    for flag in CLONE_NAMESPACE_FLAGS:
        assert out[f"clone {flag:#x}"] == -errno.EINVAL, hex(flag)
    assert out["socket inet"] is None  # the namespace's loopback
    assert out["socketpair inet"] == -errno.EOPNOTSUPP
    assert {name: out[name] for name in ALLOWED} == ALLOWED


OTHER_ABI = {
    "x32": "libc.syscall(ctypes.c_long(0x40000000 | 39))",  # x32 getpid
    "i386": (  # mov eax, 20 (i386 getpid); int 0x80; ret
        "buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | "
        "mmap.PROT_EXEC)\nbuf.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')\n"
        "ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()"
    ),
}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64's other ABIs")
@pytest.mark.parametrize("abi", sorted(OTHER_ABI))
def test_a_system_call_of_another_abi_kills_the_process(abi, monkeypatch):
    code = (
        "import ctypes, mmap\nlibc = ctypes.CDLL(None)\nprint('before', flush=True)\n"
        f"{OTHER_ABI[abi]}\nprint('after', flush=True)\n"
    )
    killed = run_python(code, limits=ON, bootstrap=UNGUARDED)
    with monkeypatch.context() as patch:
        patch.setattr(isolation_module, "policy", lambda: None)
        unfiltered = run_python(code, limits=ON, bootstrap=UNGUARDED)
    if unfiltered.returncode == 128 + signal.SIGSEGV:
        pytest.skip(f"this kernel does not run {abi} system calls")
    assert (unfiltered.stdout, unfiltered.returncode) == ("before\nafter\n", 0), unfiltered
    assert (killed.stdout, killed.returncode) == ("before\n", 128 + signal.SIGSYS), killed


def test_without_libseccomp_runs_go_on_unfiltered_after_one_line(fresh_policy, monkeypatch, caplog):
    find = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library", lambda n: None if n == "seccomp" else find(n))
    monkeypatch.delitem(sys.modules, "pyseccomp")  # imported again, and fails to load
    with caplog.at_level(logging.WARNING, logger=seccomp_module.__name__):
        commands = [isolation_module.bwrap_command(["-c", "pass"]) for _ in range(2)]
        run = run_python("import os\nprint(os.listdir('/'))", limits=ON, bootstrap=UNGUARDED)
    for command, fds in commands:
        isolation_module.close_fds(fds)
        assert "--seccomp" not in command
    assert [r.getMessage() for r in caplog.records] == [
        "sandbox: libseccomp is not available (Unable to find libseccomp), so untrusted code "
        "runs without the seccomp filter (namespaces and the rest stay); install libseccomp2 "
        "and pyseccomp (bash scripts/setup.sh)"
    ]
    assert run.status == "ok" and "etc" not in eval(run.stdout)  # still in the sandbox


def test_the_filter_is_built_only_for_the_machines_it_was_checked_on(fresh_policy, monkeypatch):
    assert seccomp_module.policy() is not None
    command, fds = isolation_module.bwrap_command(["-c", "pass"])
    isolation_module.close_fds(fds)
    assert "--seccomp" in command
    seccomp_module._policy.cache_clear()
    monkeypatch.setattr(platform, "machine", lambda: "s390x")
    assert seccomp_module.policy() is None
    command, fds = isolation_module.bwrap_command(["-c", "pass"])
    isolation_module.close_fds(fds)
    assert "--seccomp" not in command


def test_each_run_gets_its_own_copy_of_the_program():
    (first, first_fds), (second, second_fds) = (
        isolation_module.bwrap_command(["-c", "pass"]) for _ in range(2)
    )
    try:
        fds = [int(c[c.index("--seccomp") + 1]) for c in (first, second)]
        programs = [os.pread(fd, 2**16, 0) for fd in fds]
        assert fds[0] != fds[1] and programs[0] == programs[1]
        assert len(programs[0]) % 8 == 0 and len(programs[0]) // 8 > len(DENIED)
    finally:
        isolation_module.close_fds(first_fds + second_fds)
