"""Run untrusted Python (DeepCoder's candidate programs) and judge it on tests.

Two layers, both on by default:

1. **The OS sandbox** (``isolation.py``, ``sandbox.isolation: auto | bwrap |
   none``).  Each program runs under bubblewrap: new user, PID, network, IPC, UTS
   and mount namespaces; the system and the Python prefix read-only; a fresh
   size-capped ``/tmp`` holding only the program as the one writable place; no
   project tree, problem data, ``$HOME``, ``/root``, ``/etc``, host ``/tmp`` or
   other processes in view; a seccomp filter built with libseccomp (``seccomp.py``:
   no ptrace, no process_vm_*, no bpf/keyctl/io_uring/mount/unshare, no sockets but
   AF_UNIX, no other ABI); as
   root, the child is the real uid 65534, not root.  ``--die-with-parent`` and the
   PID namespace end every process of a run with it.  ``auto`` uses bubblewrap
   where a probe run works and otherwise refuses (``SandboxUnavailable``, one line
   naming the setting); ``none`` is an explicit opt-out, logged once.

2. **The bootstrap inside** (``bootstrap.py``), before any candidate code: rlimits
   (CPU seconds, address space, file size, open files, no core dumps,
   ``RLIMIT_NPROC = 0``), no loading of new builtin or extension modules, and an
   audit hook (``sys.addaudithook``) that refuses process creation and
   signalling, sockets, ``ctypes``, imports of process/network/FFI modules and
   file access outside the work directory.  The hook is pure Python in the same
   process as the candidate and can be switched off by it (the red-team pass did,
   with constructed code objects); it is a second layer that makes accidents fail
   early and readably, not a boundary.

The parent enforces the wall-clock timeout (killing the whole run), reads at most
``output_bytes`` of stdout, and judges outside (``judge.py``): expected outputs
and reference solutions never enter the sandbox, and nothing the program prints or
returns can raise out of ``run_tests``.  Tests run one per process, in parallel
across the cores.

Limits (honest): bubblewrap relies on the kernel's namespaces and seccomp; a kernel
bug can still be an escape; without libseccomp (a warning says so) or off x86-64
and aarch64 the seccomp filter is left out and the other layers stand alone; and
the CPU and memory the sandbox uses are bounded only by rlimits (no cgroup), so
many parallel runs share the host's cores.  With
``isolation: none`` the only guard is the in-process hook: hostile code can read
world-readable files, reach the network and, as root without a ``nobody``-capable
interpreter, act as root.  Use a VM for hostile code at scale.
"""

from .isolation import SandboxConfig, SandboxUnavailable
from .isolation import resolve as resolve_isolation
from .judge import (
    BadResult,
    CodeTest,
    Verdict,
    as_text,
    check_shape,
    judge_output,
    parse_report,
    run_tests,
    same_function_output,
    same_stdout,
    same_value,
)
from .process import RunResult, SandboxLimits, _runner, run_python

__all__ = [
    "BadResult",
    "CodeTest",
    "RunResult",
    "SandboxConfig",
    "SandboxLimits",
    "SandboxUnavailable",
    "Verdict",
    "as_text",
    "check_shape",
    "judge_output",
    "parse_report",
    "resolve_isolation",
    "run_python",
    "run_tests",
    "same_function_output",
    "same_stdout",
    "same_value",
    "_runner",
]
