"""The seccomp filter that bubblewrap loads (``bwrap --seccomp FD``) before it starts
the sandboxed interpreter, built with libseccomp (through ``pyseccomp``) and exported
by it as the classic BPF program bubblewrap reads.

It refuses, with an errno rather than a kill (so Python raises an ordinary
``OSError`` and the run ends as a failed test):

* process inspection and injection: ``ptrace``, ``process_vm_readv/writev``,
  ``pidfd_getfd``, ``kcmp``;
* kernel attack surface no solution needs: ``bpf``, ``keyctl``/``add_key``/
  ``request_key``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, module and
  kexec loading, ``open_by_handle_at``;
* leaving or rebuilding the sandbox: ``unshare``, ``setns``, ``mount`` and the new
  mount API, ``pivot_root``, ``chroot``, namespace flags on ``clone``; ``clone3``
  gets ``ENOSYS`` (its flags sit behind a pointer a filter cannot read, and the C
  library then falls back to ``clone``);
* sockets of any family but ``AF_UNIX`` (``socket``, ``socketpair``:
  ``EAFNOSUPPORT``).

The filter holds only the machine's own ABI: a system call of any other (32-bit
``int 0x80`` or x32 on x86-64) kills the process.  It is built on x86-64 and aarch64,
where the rules' argument positions were checked; elsewhere, or where libseccomp
cannot be loaded (one warning says so), ``policy()`` is None and the sandbox runs
without the filter (namespaces and the rest stay).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import platform
import socket
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyseccomp

log = logging.getLogger(__name__)

#: Machines whose ABI puts clone's flags and socket's family in the first argument
#: (s390x, for one, swaps clone's first two).
MACHINES = ("x86_64", "aarch64")
#: clone flags that create a namespace: NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
#: NEWPID, NEWNET.
CLONE_NAMESPACE_FLAGS = (
    0x00020000,
    0x02000000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
#: Refused with EPERM.
DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "open_by_handle_at",
    "name_to_handle_at",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "syslog",
    "acct",
    "quotactl",
    "swapon",
    "swapoff",
    "reboot",
)
#: Any family but AF_UNIX is refused with EAFNOSUPPORT.
SOCKET_CALLS = ("socket", "socketpair")

#: libseccomp's calls on the one filter, and its first build (so the warning is one
#: line even when the first runs start in several threads at once), one at a time.
_lock = threading.Lock()


@functools.cache
def _libseccomp() -> Any:
    """The ``pyseccomp`` module, or None (warned once) when it or libseccomp is missing."""
    try:
        import pyseccomp
    except (ImportError, OSError, RuntimeError) as exc:  # RuntimeError: no libseccomp.so
        log.warning(
            "sandbox: libseccomp is not available (%s), so untrusted code runs without the "
            "seccomp filter (namespaces and the rest stay); install libseccomp2 and pyseccomp "
            "(bash scripts/setup.sh)",
            exc,
        )
        return None
    return pyseccomp


def policy() -> pyseccomp.SyscallFilter | None:
    """The filter as a ``pyseccomp.SyscallFilter`` for this machine's ABI, or None
    where it is not built (see the module docstring).  Raises ``OSError`` (one line)
    when this libseccomp does not know one of the refused calls."""
    with _lock:
        return _policy()


@functools.cache
def _policy() -> pyseccomp.SyscallFilter | None:
    seccomp = None if platform.machine() not in MACHINES else _libseccomp()
    if seccomp is None:
        return None
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    rules.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)

    def refuse(action: int, name: str, *args: Any) -> None:
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) < 0:
            raise OSError(
                errno.ENOSYS,
                f"libseccomp does not know the system call {name} (too old; Tether is "
                "tested with 2.5.4), so the sandbox's seccomp filter cannot be built",
            )
        rules.add_rule(action, name, *args)

    for name in DENIED:
        refuse(seccomp.ERRNO(errno.EPERM), name)
    refuse(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for flag in CLONE_NAMESPACE_FLAGS:
        refuse(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    for name in SOCKET_CALLS:
        refuse(seccomp.ERRNO(errno.EAFNOSUPPORT), name, seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
    return rules


def export_bpf(rules: pyseccomp.SyscallFilter, fd: int) -> None:
    """Write ``rules`` to ``fd`` as ``struct sock_filter`` records (what ``bwrap
    --seccomp`` reads) and rewind it."""
    with _lock, open(fd, "wb", buffering=0, closefd=False) as out:
        rules.export_bpf(out)
    os.lseek(fd, 0, os.SEEK_SET)
