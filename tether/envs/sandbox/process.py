"""One sandboxed run: a fresh interpreter under bubblewrap (or, with isolation
``none``, a plain limited child process), its output collected under caps and a
wall-clock deadline, and the whole process tree ended afterwards."""

from __future__ import annotations

import functools
import marshal
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .bootstrap import BOOTSTRAP
from .isolation import NOBODY, bwrap_command, close_fds, resolve

MAX_STDERR_BYTES = 4096
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-process limits of one sandboxed run, and how it is isolated."""

    cpu_seconds: int = 2
    wall_seconds: float = 4.0
    memory_bytes: int = 512 * 2**20
    file_bytes: int = 2**20
    output_bytes: int = 2**20
    #: When running as root, run the child as ``nobody`` (uid 65534).
    drop_privileges: bool = True
    #: ``sandbox.isolation``: ``auto`` / ``bwrap`` (bubblewrap) or ``none``.
    isolation: str = "auto"


@dataclass
class RunResult:
    """What one sandboxed run did.  ``status`` is ``"ok"`` (exit 0), ``"error"``
    (nonzero exit or a signal), ``"timeout"`` or ``"output_limit"``."""

    status: str
    stdout: str
    stderr: str
    returncode: int | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@functools.cache
def _runner() -> tuple[str, int | None]:
    """Isolation ``none``: the interpreter to run and the uid to run it as (None:
    unchanged).  As root, prefer an interpreter of our Python version that ``nobody``
    can execute."""
    if os.name != "posix" or os.geteuid() != 0:
        return sys.executable, None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        sys.executable,
        f"/usr/bin/python{version}",
        f"/usr/local/bin/python{version}",
    ):
        if not os.path.exists(candidate):
            continue
        try:
            probe = subprocess.run(
                [candidate, "-I", "-S", "-c", "import sys; print(sys.version_info[:2])"],
                user=NOBODY,
                group=NOBODY,
                extra_groups=[],
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0 and probe.stdout.strip() == str(sys.version_info[:2]):
            return candidate, NOBODY
    return sys.executable, None


def _to_marshal(value: Any) -> Any:
    """Test arguments as plain containers that ``marshal`` can write (the child
    reads them without importing json)."""
    if isinstance(value, (list, tuple)):
        return [_to_marshal(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_marshal(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        proc.kill()
    except OSError:
        pass


def _bootstrap_args(fn_name: str | None, limits: SandboxLimits) -> list[str]:
    return [
        fn_name or "",
        str(max(1, int(math.ceil(limits.cpu_seconds)))),
        str(int(limits.memory_bytes)),
        str(int(limits.file_bytes)),
        "drop" if limits.drop_privileges else "keep",
    ]


def run_python(
    code: str,
    *,
    stdin: str = "",
    fn_name: str | None = None,
    args: Sequence[Any] = (),
    limits: SandboxLimits = SandboxLimits(),
    bootstrap: str = BOOTSTRAP,
) -> RunResult:
    """Run ``code`` in a fresh limited process.  With ``fn_name``, call
    ``fn_name(*args)`` after the code ran and report ``{"result": ...}`` or
    ``{"error": ...}`` as the last stdout line (the candidate's own prints are
    discarded); otherwise run it as a program on ``stdin``.  Never raises for
    anything the code does; raises ``SandboxUnavailable`` when the isolation asked
    for cannot be had here.  ``bootstrap``: what runs first (tests pass
    ``bootstrap.UNGUARDED`` to try attacks against the OS sandbox alone)."""
    started = time.perf_counter()
    files = {"solution.py": code.encode("utf-8", "surrogatepass")}
    if fn_name is not None:
        files["case.bin"] = marshal.dumps(_to_marshal(list(args)))
    python_args = ["-c", bootstrap, *_bootstrap_args(fn_name, limits)]
    try:
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode("utf-8", "surrogatepass"))
            stdin_file.seek(0)
            if resolve(limits.isolation) == "bwrap":
                proc = _start_bwrap(python_args, files, stdin_file)
                return _finish(proc, started, limits)
            work = tempfile.mkdtemp(prefix="tether-sandbox-")
            try:
                proc = _start_plain(python_args, files, stdin_file, work, limits)
                return _finish(proc, started, limits)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as exc:  # e.g. no space for a temp file: the run failed, we did not
        return RunResult("error", "", f"sandbox: {exc}", None, time.perf_counter() - started)


def _start_bwrap(python_args: list[str], files: dict[str, bytes], stdin_file) -> subprocess.Popen:
    command, fds = bwrap_command(python_args, files)
    try:
        return subprocess.Popen(
            command,
            stdin=stdin_file,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            env=CHILD_ENV,
            start_new_session=True,
            close_fds=True,
            pass_fds=fds,
        )
    finally:
        close_fds(fds)


def _start_plain(
    python_args: list[str], files: dict[str, bytes], stdin_file, work: str, limits: SandboxLimits
) -> subprocess.Popen:
    interpreter, uid = _runner() if limits.drop_privileges else (sys.executable, None)
    for name, data in files.items():
        with open(os.path.join(work, name), "wb") as f:
            f.write(data)
    if uid is not None:
        os.chown(work, uid, uid)
    user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    return subprocess.Popen(
        [interpreter, "-I", "-S", *python_args],
        stdin=stdin_file,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=work,
        env=CHILD_ENV,
        start_new_session=True,
        close_fds=True,
        **user,
    )


def _finish(proc: subprocess.Popen, started: float, limits: SandboxLimits) -> RunResult:
    status, out, err = _collect(proc, started + limits.wall_seconds, limits.output_bytes)
    returncode = proc.returncode
    if status == "ok" and returncode != 0:
        status = "error"
    return RunResult(
        status,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        returncode,
        time.perf_counter() - started,
    )


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[str, bytes, bytes]:
    """Read stdout (at most ``cap`` bytes) and stderr until both close or the
    deadline passes; kill the process group on a timeout or an overflow (under
    bubblewrap, killing it also ends its PID namespace: every process of the run)."""
    out, err = bytearray(), bytearray()
    status = "ok"
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
        sel.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
        while sel.get_map():
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                status = "timeout"
                break
            for key, _ in sel.select(timeout=min(remaining, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buffer = key.data
                limit = cap if buffer is out else MAX_STDERR_BYTES
                room = max(0, limit - len(buffer))
                buffer += chunk[:room]
                if len(chunk) > room and buffer is out:
                    status = "output_limit"
            if status != "ok":
                break
    # The group is killed before the leader is reaped, while its id still names it.
    if status != "ok":
        _kill_group(proc)
    try:
        proc.wait(timeout=max(0.05, deadline - time.perf_counter()) if status == "ok" else 5)
    except subprocess.TimeoutExpired:
        status = "timeout"
        _kill_group(proc)
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return status, bytes(out), bytes(err)
