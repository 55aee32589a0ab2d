"""A small seccomp filter, built by hand as a classic BPF program, that bubblewrap
loads (``bwrap --seccomp FD``) before it starts the sandboxed interpreter.

It refuses, with an errno rather than a kill (so Python raises an ordinary
``OSError`` and the run ends as a failed test):

* process inspection and injection: ``ptrace``, ``process_vm_readv/writev``,
  ``pidfd_getfd``, ``kcmp``;
* kernel attack surface no solution needs: ``bpf``, ``keyctl``/``add_key``/
  ``request_key``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, module and
  kexec loading, ``open_by_handle_at``;
* leaving or rebuilding the sandbox: ``unshare``, ``setns``, ``mount`` and the new
  mount API, ``pivot_root``, ``chroot``, namespace flags on ``clone``; ``clone3``
  gets ``ENOSYS`` (its flags sit behind a pointer the filter cannot read, and the C
  library then falls back to ``clone``);
* sockets of any family but ``AF_UNIX`` (``socket``, ``socketpair``).

System calls of another architecture (e.g. 32-bit ``int 0x80`` on x86-64) kill the
process.  Only x86-64 and aarch64 are known; elsewhere ``program()`` returns None
and the sandbox runs without the filter (namespaces and the rest stay).
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16
LD_ABS, JEQ, JGE, JSET, RET = (
    0x20,
    0x15,
    0x35,
    0x45,
    0x06,
)  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..., RET|K
X32_BIT = 0x40000000  # x32 system calls share x86-64's audit arch: refuse them all
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
AF_UNIX = 1
CLONE_NAMESPACES = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET

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

# Syscalls added since Linux 5.1 (number 424 on) have one number on every architecture.
UNIFIED_NUMBERS = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}

# (audit arch, syscall numbers) per machine; numbers from the kernel's syscall tables.
ARCHES = {
    "x86_64": (
        0xC000003E,
        {
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "kcmp": 312,
            "bpf": 321,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "kexec_load": 246,
            "open_by_handle_at": 304,
            "name_to_handle_at": 303,
            "unshare": 272,
            "setns": 308,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "syslog": 103,
            "acct": 163,
            "quotactl": 179,
            "swapon": 167,
            "swapoff": 168,
            "reboot": 169,
            "socket": 41,
            "socketpair": 53,
            "clone": 56,
            **UNIFIED_NUMBERS,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "kcmp": 272,
            "bpf": 280,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "kexec_load": 104,
            "open_by_handle_at": 265,
            "name_to_handle_at": 264,
            "unshare": 97,
            "setns": 268,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "syslog": 116,
            "acct": 89,
            "quotactl": 60,
            "swapon": 224,
            "swapoff": 225,
            "reboot": 142,
            "socket": 198,
            "socketpair": 199,
            "clone": 220,
            **UNIFIED_NUMBERS,
        },
    ),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return code, jt, jf, k


def program(machine: str | None = None) -> bytes | None:
    """The filter as ``struct sock_filter`` records (what ``bwrap --seccomp`` reads),
    or None on an architecture this module does not know."""
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers = arch
    deny = RET_ERRNO | errno.EPERM
    ops = [
        _op(LD_ABS, OFFSET_ARCH),
        _op(JEQ, audit_arch, jt=1),
        _op(RET, RET_KILL_PROCESS),
        _op(LD_ABS, OFFSET_NR),
    ]
    if audit_arch == ARCHES["x86_64"][0]:
        ops += [_op(JGE, X32_BIT, jf=1), _op(RET, deny)]
    for name in DENIED:  # each: if nr == name: return EPERM
        ops += [_op(JEQ, numbers[name], jf=1), _op(RET, deny)]
    ops += [_op(JEQ, numbers["clone3"], jf=1), _op(RET, RET_ERRNO | errno.ENOSYS)]
    # clone: refuse namespace flags in args[0] (low 32 bits, little endian on both arches)
    ops += [
        _op(JEQ, numbers["clone"], jf=4),
        _op(LD_ABS, OFFSET_ARG0),
        _op(JSET, CLONE_NAMESPACES, jf=1),
        _op(RET, deny),
        _op(RET, RET_ALLOW),
    ]
    # socket / socketpair: only AF_UNIX (args[0] is the address family)
    ops += [
        _op(JEQ, numbers["socket"], jt=1),
        _op(JEQ, numbers["socketpair"], jf=4),
        _op(LD_ABS, OFFSET_ARG0),
        _op(JEQ, AF_UNIX, jt=1),
        _op(RET, RET_ERRNO | errno.EAFNOSUPPORT),
        _op(RET, RET_ALLOW),
    ]
    ops.append(_op(RET, RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *op) for op in ops)


def evaluate(filter_bytes: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Run the filter on one system call (a tiny interpreter of the opcodes used
    above), returning the action; lets tests check the program without a kernel."""
    ops = [struct.unpack("=HBBI", filter_bytes[i : i + 8]) for i in range(0, len(filter_bytes), 8)]
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(tuple(args) + (0,) * 6)[:6])
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == LD_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (JEQ, JGE, JSET):
            hit = acc == k if code == JEQ else acc >= k if code == JGE else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif code == RET:
            return k
        else:
            raise ValueError(f"opcode {code:#x} not interpreted")
