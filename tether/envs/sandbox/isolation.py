"""OS-level isolation of a sandboxed run: the ``sandbox.isolation`` setting and the
bubblewrap command line.

Under bubblewrap (``isolation: bwrap``, or ``auto`` where it works) each program runs
in new user, PID, network, IPC, UTS and mount namespaces (and cgroup where the kernel
allows): the system (``/usr`` and the ``/lib*``, ``/bin`` links) and the Python prefix
are bound read-only, ``/tmp`` is a fresh size-capped tmpfs that holds the program and
is the only writable place, ``/proc`` is the new PID namespace's own, ``/dev`` a
minimal one; the project tree, the problem data, ``$HOME``, ``/root``, ``/etc``, the
host's ``/tmp`` and other processes are not there.  The environment is cleared, the
network is loopback only in an empty namespace, the seccomp filter of
``seccomp.py`` (built by libseccomp, exported per run into the fd bubblewrap reads)
is loaded, nested user namespaces are refused, and
``--die-with-parent`` plus the PID namespace end every process of the run when it
ends.

As root, the sandbox's user namespace maps the child to the real uid 65534
(``nobody``), not to root: Tether creates that namespace once per process (uid and
gid maps ``0 0 1`` and ``65534 65534 1``), bubblewrap builds the mounts in it as root
of the namespace, and the child's first act is to drop to 65534 with all
capabilities gone.  As any other user, bubblewrap's own user namespace maps the child
(uid 65534 inside) to that user.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Literal

from pydantic import Field

from ...sections import StrictSection
from .seccomp import export_bpf, policy

log = logging.getLogger(__name__)

NOBODY = 65534
#: Where the program, its input and its files live inside the sandbox.
INSIDE_WORK = "/tmp/sandbox"
WORK_TMPFS_BYTES = 64 * 2**20
Isolation = Literal["auto", "bwrap", "none"]


class SandboxConfig(StrictSection):
    """How untrusted code (DeepCoder's candidate programs) is run."""

    isolation: Isolation = Field(
        "auto",
        description=(
            "OS isolation of untrusted code: 'bwrap' runs every program under bubblewrap "
            "(user, PID, network, IPC, UTS and mount namespaces, read-only system, seccomp); "
            "'auto' does so where bubblewrap works and otherwise refuses to start a run that "
            "executes untrusted code; 'none' runs it with only the in-process audit hook and "
            "rlimits (no OS isolation: hostile code can escape)."
        ),
    )


class SandboxUnavailable(RuntimeError):
    """Isolation was asked for but this machine cannot provide it."""


_probe_lock = threading.Lock()


def _probe() -> str | None:
    with _probe_lock:
        return _probe_once()


@functools.cache
def _probe_once() -> str | None:
    """None when a bubblewrap sandbox runs here, else why not (one phrase)."""
    if sys.platform != "linux":
        return f"bubblewrap needs Linux, this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "the bwrap program is not installed"
    try:
        command, fds = bwrap_command(["-c", "pass"])
        probe = subprocess.run(
            command, pass_fds=fds, capture_output=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError, SandboxUnavailable) as exc:
        return f"bwrap could not start ({exc})"
    if probe.returncode != 0:
        reason = probe.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap failed: {reason[-1] if reason else f'exit {probe.returncode}'}"
    return None


_warned_none = threading.Event()


def resolve(isolation: str) -> str:
    """``"bwrap"`` or ``"none"`` for a ``sandbox.isolation`` value; raises
    ``SandboxUnavailable`` (one line naming the setting) when bubblewrap is asked
    for, or ``auto``, and does not work here."""
    if isolation == "none":
        if not _warned_none.is_set():
            _warned_none.set()
            log.warning(
                "sandbox.isolation=none: untrusted code runs without OS isolation "
                "(no namespaces, no seccomp, host files and network reachable); only "
                "the in-process audit hook and rlimits stand in its way"
            )
        return "none"
    if isolation not in ("auto", "bwrap"):
        raise ValueError(f"sandbox.isolation must be auto, bwrap or none, got {isolation!r}")
    reason = _probe()
    if reason is not None:
        raise SandboxUnavailable(
            f"sandbox.isolation={isolation}: cannot isolate untrusted code, {reason}; install "
            "bubblewrap (apt-get install bubblewrap, or bash scripts/setup.sh) or set "
            "sandbox.isolation=none to run it without OS isolation"
        )
    return "bwrap"


# -- the user namespace used as root --------------------------------------------------------
_userns_lock = threading.Lock()


def _root_userns() -> int:
    """The cached fd of ``_new_root_userns`` (one namespace per process, made once even
    when the first runs start in several threads at once)."""
    with _userns_lock:
        return _new_root_userns()


@functools.cache
def _new_root_userns() -> int:
    """An open fd of a user namespace mapping uid/gid 0 and 65534 to themselves (root
    only): bubblewrap mounts as its root, the child then drops to 65534.  A helper
    process enters a new namespace, we write its maps, keep the namespace's fd and
    end the helper."""
    own = os.readlink("/proc/self/ns/user")
    helper = subprocess.Popen(
        ["unshare", "--user", "--", "sleep", "30"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{helper.pid}/ns/user") == own:
            if helper.poll() is not None or time.monotonic() > deadline:
                raise SandboxUnavailable("could not create a user namespace (unshare --user)")
            time.sleep(0.002)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{helper.pid}/{name}", "w") as f:
                f.write(f"0 0 1\n{NOBODY} {NOBODY} 1\n")
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxUnavailable(f"could not set up the sandbox's user namespace: {exc}") from exc
    finally:
        helper.kill()
        helper.wait()


def interpreter() -> str:
    """The real interpreter binary behind ``sys.executable`` (not a venv link)."""
    return os.path.realpath(sys.executable)


@functools.cache
def _system_binds() -> tuple[str, ...]:
    """Read-only binds of the system and the Python prefix (what the interpreter needs)."""
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefixes = {
        os.path.realpath(p)
        for p in (
            sys.base_prefix,
            sys.base_exec_prefix,
            os.path.dirname(os.path.dirname(interpreter())),
        )
    }
    for prefix in sorted(prefixes):
        if prefix != "/usr" and not prefix.startswith("/usr/"):
            # bwrap would copy the modes of the host's parents (/root is 0700): make
            # the path down to the prefix traversable for the unprivileged child
            parts = prefix.strip("/").split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:depth])]
            args += ["--ro-bind", prefix, prefix]
    return tuple(args)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data) if len(data) < 65536 else _write_all(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def bwrap_command(
    python_args: list[str], files: dict[str, bytes] | None = None, drop_to_nobody: bool = True
) -> tuple[list[str], list[int]]:
    """The bwrap command line that runs ``interpreter() -I -S *python_args`` inside the
    sandbox with ``files`` (name -> content) in its work directory, and the fds the
    caller must pass (and close after the child started).  As root, the child starts
    as root of the sandbox's namespace with only CAP_SETUID/CAP_SETGID and must drop
    to 65534 itself (the bootstrap does, first thing) -- ``drop_to_nobody`` False
    keeps the child at uid 0 of the namespace."""
    fds: list[int] = []
    if os.geteuid() == 0:
        userns = _root_userns()
        fds.append(userns)
        user = ["--userns", str(userns), "--uid", "0", "--gid", "0"]
        if drop_to_nobody:
            user += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        user = ["--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    command = [
        "bwrap",
        *user,
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(WORK_TMPFS_BYTES),
        "--tmpfs",
        "/tmp",
        "--perms",
        "1777",
        "--dir",
        INSIDE_WORK,
        "--remount-ro",
        "/",
    ]
    try:
        for name, data in (files or {}).items():
            fd = _memfd(name, data)
            fds.append(fd)
            command += ["--perms", "0644", "--file", str(fd), f"{INSIDE_WORK}/{name}"]
        rules = policy()
        if rules is not None:
            fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
            fds.append(fd)
            export_bpf(rules, fd)
            command += ["--seccomp", str(fd)]
    except OSError:
        close_fds(fds)
        raise
    command += [
        "--chdir",
        INSIDE_WORK,
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--",
        interpreter(),
        "-I",
        "-S",
        *python_args,
    ]
    return command, fds


def close_fds(fds: list[int]) -> None:
    """Close the per-run fds of ``bwrap_command`` (the cached namespace fd stays open)."""
    keep = _root_userns() if os.geteuid() == 0 and _new_root_userns.cache_info().currsize else None
    for fd in fds:
        if fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass
