"""Run untrusted Python in a separate, limited process, and judge it on tests.

Each run starts a fresh interpreter (``python -I -S``: no site-packages, no
``PYTHON*`` variables, no user site) in a new session, with a clean environment
and a throw-away working directory that is removed afterwards.  Before any
candidate code runs, a small bootstrap inside the child

1. sets kernel resource limits: CPU seconds, address space, file size, open
   files, no core dumps, and ``RLIMIT_NPROC = 0`` (no new processes or threads
   for a non-root user);
2. preloads the C modules ordinary solutions need and then removes the
   interpreter's ability to load new builtin or extension modules (so
   ``_ctypes``, ``_socket``, ``_posixsubprocess`` and friends stay out even
   through importlib's internals), and deletes ``os.pidfd_open`` and
   ``signal.pidfd_send_signal`` (the two process-signalling calls that raise no
   audit event);
3. installs an audit hook (``sys.addaudithook``, which cannot be removed) that
   refuses: process creation and signalling (``os.fork``, ``os.exec*``,
   ``os.system``, ``os.posix_spawn``, ``subprocess.Popen``, ``os.kill``,
   ``os.killpg``), sockets (every ``socket.*`` event), ``ctypes``, raising
   resource limits, adding audit hooks, ``chdir``, links, imports of
   process/network/FFI modules, and any ``open``/listing/file-system change
   outside the working directory (reading the standard library stays allowed,
   or imports would break).

The parent enforces a wall-clock timeout by killing the child's whole process
group, reads at most ``output_bytes`` of stdout (more kills the child), and,
when it runs as root, starts the child as user ``nobody`` if an interpreter of
the same Python version is executable by that user -- then the kernel also
enforces ``RLIMIT_NPROC``, file permissions and signal permissions.

Limits (honest): the audit hook is an in-process guard, not a security
boundary -- a CPython memory-safety bug could bypass it.  Reading world-readable
files is only refused by the hook.  There is no network namespace or seccomp
filter; the socket refusal is the hook's.  As root without a ``nobody``-capable
interpreter, only the hook and the rlimits other than NPROC apply.  Use a
container or VM for hostile code at scale.

Judging (``run_tests``): a function test calls ``fn(*args)`` (or
``Solution().fn(*args)``, LeetCode style) and compares the JSON-normalised
result with the expected value (a one-element list also matches its element,
the TACO convention; floats match within 1e-6); a stdin/stdout test compares
lines with trailing whitespace stripped, then tokens (floats within 1e-6).
Tests run one per process, in parallel across the cores.
"""

from __future__ import annotations

import functools
import json
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

NOBODY = 65534
MAX_STDERR_BYTES = 4096

BOOTSTRAP = r'''
import sys, os, marshal, resource
cfg = {"fn": sys.argv[1] or None, "cpu": int(sys.argv[2]), "mem": int(sys.argv[3]),
       "fsize": int(sys.argv[4])}
work = os.path.realpath(os.getcwd())
with open("solution.py", encoding="utf-8", errors="surrogateescape") as f:
    source = f.read()
args = None
if cfg["fn"]:
    with open("case.bin", "rb") as f:
        args = marshal.load(f)
for name, soft, hard in (("RLIMIT_CPU", cfg["cpu"], cfg["cpu"] + 1),
                         ("RLIMIT_AS", cfg["mem"], cfg["mem"]),
                         ("RLIMIT_FSIZE", cfg["fsize"], cfg["fsize"]), ("RLIMIT_NOFILE", 64, 64),
                         ("RLIMIT_CORE", 0, 0), ("RLIMIT_NPROC", 0, 0)):
    try:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    except (ValueError, OSError):
        pass
for name in ("math", "cmath", "_heapq", "_bisect", "_random", "_json", "_struct", "unicodedata",
             "_statistics", "_contextvars", "_md5", "_sha1", "_sha256", "_sha512", "_sha3", "_blake2",
             "_typing", "_string", "_locale", "_tokenize", "_symtable", "atexit", "errno",
             "itertools", "_collections", "_functools", "_operator", "_sre", "_stat", "_weakref",
             "_ast", "_thread", "faulthandler", "_tracemalloc"):
    try:
        __import__(name)
    except Exception:
        pass
import _imp, _signal

def refuse_module(*args, **kwargs):
    raise ImportError("sandbox: loading a new builtin or extension module is not allowed")

_imp.create_builtin = _imp.create_dynamic = refuse_module
for mod in (os, sys.modules["posix"], _signal):
    for name in ("pidfd_open", "pidfd_send_signal"):
        mod.__dict__.pop(name, None)
sys.dont_write_bytecode = True
stdout_fd = os.dup(1)
if cfg["fn"]:
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)

stdlib_dir = os.path.realpath(getattr(sys, "_stdlib_dir", None) or os.path.dirname(os.__file__))

write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

def install(work=work, stdlib=stdlib_dir, realpath=os.path.realpath, join=os.path.join,
            fspath=os.fspath, sep=os.sep, write_flags=write_flags):
    # Everything the hook needs is bound here, not looked up in module globals that
    # the candidate could reach (sys._getframe) and rewrite.
    deny_prefix = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                   "os.kill", "os.killpg", "os.chdir", "os.fchdir", "os.chroot", "os.symlink",
                   "os.link", "os.setuid", "os.setgid", "os.setre", "os.setres", "subprocess.",
                   "socket.", "ctypes.", "signal.pthread_kill", "resource.setrlimit",
                   "resource.prlimit", "sys.addaudithook", "pty.", "fcntl.", "mmap.", "syslog.",
                   "webbrowser.", "_posixsubprocess.", "os.startfile", "winreg.")
    deny_modules = frozenset(("ctypes", "_ctypes", "socket", "_socket", "ssl", "_ssl", "select",
                              "selectors", "subprocess", "_posixsubprocess", "multiprocessing",
                              "_multiprocessing", "_posixshmem", "pty", "fcntl", "mmap",
                              "resource", "gc", "asyncio", "_asyncio", "http", "urllib",
                              "ftplib", "smtplib", "telnetlib", "xmlrpc", "socketserver", "sqlite3",
                              "_sqlite3", "_xxsubinterpreters", "_testcapi",
                              "_testinternalcapi", "tkinter", "_tkinter", "readline", "termios"))
    path_events = frozenset(("os.listdir", "os.scandir", "os.remove", "os.rename", "os.rmdir",
                             "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
                             "os.chflags", "os.lchflags", "os.lchmod", "os.lchown", "os.mkfifo",
                             "os.mknod", "os.removexattr", "os.setxattr", "os.getxattr",
                             "os.listxattr", "glob.glob", "glob.glob/2", "shutil.copyfile",
                             "shutil.copymode", "shutil.copystat", "shutil.copytree",
                             "shutil.move", "shutil.rmtree", "shutil.chown", "shutil.make_archive",
                             "shutil.unpack_archive"))

    def where(path):
        p = fspath(path)
        if isinstance(p, bytes):
            p = p.decode("utf-8", "surrogateescape")
        full = realpath(join(work, p))
        if full == work or full.startswith(work + sep):
            return "work"
        if full == stdlib or full.startswith(stdlib + sep):
            return "stdlib"
        return "outside"

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if path is None or isinstance(path, int):
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                      (isinstance(flags, int) and (flags & write_flags) != 0)
            place = where(path)
            if place == "work" or (place == "stdlib" and not writing):
                return
            raise PermissionError(f"sandbox: open outside the working directory: {path!r}")
        if event == "import":
            if str(args[0]).split(".")[0] in deny_modules:
                raise ImportError(f"sandbox: import of {args[0]!r} is not allowed")
            return
        if event.startswith(deny_prefix):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event in path_events:
            for value in args:
                if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
                    place = where(value)
                    if place == "outside" or (place == "stdlib" and event not in (
                            "os.listdir", "os.scandir")):
                        raise PermissionError(f"sandbox: {event} outside the working directory")

    sys.addaudithook(hook)

install()
del install
import builtins
builtins.exit = builtins.quit = sys.exit
namespace = {"__name__": "__sandbox__" if cfg["fn"] else "__main__", "__builtins__": builtins}
sys.argv = ["solution.py"]

from _json import encode_basestring_ascii as quote

def to_json(value, depth=0):
    """JSON text of a result without importing json (which costs ~15 ms of startup)."""
    if depth > 100:
        raise ValueError("result nested too deeply")
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value).replace("inf", "Infinity")
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(v, depth + 1) for v in value) + "]"
    if isinstance(value, dict):
        items = (quote(str(k)) + ":" + to_json(v, depth + 1) for k, v in value.items())
        return "{" + ",".join(items) + "}"
    return quote(repr(value))

def report(payload):
    try:
        data = to_json(payload)
    except Exception:
        data = '{"error": "unserialisable result"}'
    os.write(stdout_fd, ("\n" + data + "\n").encode("utf-8", "replace"))

code = 1
try:
    exec(compile(source, "solution.py", "exec"), namespace)
    if cfg["fn"]:
        fn = namespace.get(cfg["fn"])
        if fn is None and isinstance(namespace.get("Solution"), type):
            fn = getattr(namespace["Solution"](), cfg["fn"], None)
        if not callable(fn):
            report({"error": f"no function {cfg['fn']}"})
        else:
            report({"result": fn(*args)})
    code = 0
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 0
except BaseException as exc:
    try:
        sys.stderr.write(f"{type(exc).__name__}: {str(exc)[:300]}\n")
    except Exception:
        pass
    if cfg["fn"]:
        report({"error": type(exc).__name__})
try:
    sys.stdout.flush()
    sys.stderr.flush()
except Exception:
    pass
os._exit(code)
'''


@dataclass(frozen=True)
class SandboxLimits:
    """Per-process limits of one sandboxed run."""

    cpu_seconds: int = 2
    wall_seconds: float = 4.0
    memory_bytes: int = 512 * 2**20
    file_bytes: int = 2**20
    output_bytes: int = 2**20
    #: When running as root, run the child as ``nobody`` if possible.
    drop_privileges: bool = True


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


@functools.lru_cache(maxsize=None)
def _runner() -> tuple[str, int | None]:
    """The interpreter to run and the uid to run it as (None: unchanged).  As root,
    prefer an interpreter of our Python version that ``nobody`` can execute."""
    if os.name != "posix" or os.geteuid() != 0:
        return sys.executable, None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if not os.path.exists(candidate):
            continue
        try:
            probe = subprocess.run(
                [candidate, "-I", "-S", "-c", "import sys; print(sys.version_info[:2])"],
                user=NOBODY, group=NOBODY, extra_groups=[], env={"PATH": "/usr/bin:/bin"},
                cwd="/", capture_output=True, text=True, timeout=10)
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


def run_python(code: str, *, stdin: str = "", fn_name: str | None = None,
               args: Sequence[Any] = (), limits: SandboxLimits = SandboxLimits()) -> RunResult:
    """Run ``code`` in a fresh limited process.  With ``fn_name``, call
    ``fn_name(*args)`` after the code ran and report ``{"result": ...}`` or
    ``{"error": ...}`` as the last stdout line (the candidate's own prints are
    discarded); otherwise run it as a program on ``stdin``.  Never raises for
    anything the code does."""
    started = time.perf_counter()
    interpreter, uid = _runner() if limits.drop_privileges else (sys.executable, None)
    work = tempfile.mkdtemp(prefix="tether-sandbox-")
    try:
        with open(os.path.join(work, "solution.py"), "w", encoding="utf-8",
                  errors="surrogatepass") as f:
            f.write(code)
        if fn_name is not None:
            with open(os.path.join(work, "case.bin"), "wb") as f:
                marshal.dump(_to_marshal(list(args)), f)
        with open(os.path.join(work, "stdin.txt"), "w", encoding="utf-8",
                  errors="surrogatepass") as f:
            f.write(stdin)
        if uid is not None:
            os.chown(work, uid, uid)
        config = [fn_name or "", str(max(1, int(math.ceil(limits.cpu_seconds)))),
                  str(int(limits.memory_bytes)), str(int(limits.file_bytes))]
        user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
        with open(os.path.join(work, "stdin.txt"), "rb") as stdin_file:
            proc = subprocess.Popen(
                [interpreter, "-I", "-S", "-c", BOOTSTRAP, *config], stdin=stdin_file,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True,
                close_fds=True, **user)
        status, out, err = _collect(proc, started + limits.wall_seconds, limits.output_bytes)
        returncode = proc.returncode
        if status == "ok" and returncode != 0:
            status = "error"
        return RunResult(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                         returncode, time.perf_counter() - started)
    except OSError as exc:  # e.g. no space for the temp dir: the run failed, we did not
        return RunResult("error", "", f"sandbox: {exc}", None, time.perf_counter() - started)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[str, bytes, bytes]:
    """Read stdout (at most ``cap`` bytes) and stderr until both close or the
    deadline passes; kill the process group on a timeout or an overflow."""
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


# -- judging ------------------------------------------------------------------------------
def _normalise(value: Any) -> Any:
    """JSON round trip: tuples become lists, dict keys strings."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def same_value(got: Any, expected: Any) -> bool:
    """Equality with float tolerance, after JSON normalisation."""
    if isinstance(expected, float) or isinstance(got, float):
        if isinstance(got, (int, float)) and isinstance(expected, (int, float)) \
                and not isinstance(got, bool) and not isinstance(expected, bool):
            return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)
        return False
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(same_value(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(same_value(got[k], expected[k]) for k in got)
    return type(got) is type(expected) and got == expected


def same_function_output(got: Any, expected: Any) -> bool:
    got, expected = _normalise(got), _normalise(expected)
    if same_value(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and same_value(got, expected[0])


def _tokens_match(a: str, b: str) -> bool:
    ta, tb = a.split(), b.split()
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if x == y:
            continue
        try:
            if not math.isclose(float(x), float(y), rel_tol=1e-6, abs_tol=1e-6):
                return False
        except ValueError:
            return False
    return True


def same_stdout(got: str, expected: str) -> bool:
    lines = lambda s: [line.rstrip() for line in s.strip().splitlines()]  # noqa: E731
    return lines(got) == lines(expected) or _tokens_match(got, expected)


def _judge_one(code: str, test: CodeTest, fn_name: str | None, limits: SandboxLimits) -> Verdict:
    if fn_name is None:
        stdin = test.input if isinstance(test.input, str) else "\n".join(map(str, test.input))
        run = run_python(code, stdin=stdin, limits=limits)
        if not run.ok:
            return Verdict(False, run.status, run.stderr[-200:])
        expected = test.output if isinstance(test.output, str) else "\n".join(map(str, test.output))
        passed = same_stdout(run.stdout, expected)
        return Verdict(passed, "ok" if passed else "wrong_answer")
    args = test.input if isinstance(test.input, (list, tuple)) else [test.input]
    run = run_python(code, fn_name=fn_name, args=args, limits=limits)
    if run.status not in ("ok", "error"):
        return Verdict(False, run.status)
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    try:
        payload = json.loads(lines[-1]) if lines else {}
    except ValueError:
        payload = {}
    if not isinstance(payload, dict) or "result" not in payload:
        detail = payload.get("error", "") if isinstance(payload, dict) else ""
        return Verdict(False, "error", str(detail) or run.stderr[-200:])
    passed = same_function_output(payload["result"], test.output)
    return Verdict(passed, "ok" if passed else "wrong_answer")


def run_tests(code: str, tests: Sequence[CodeTest], fn_name: str | None = None,
              limits: SandboxLimits = SandboxLimits(),
              max_workers: int | None = None) -> list[Verdict]:
    """Judge ``code`` on every test, one sandboxed process per test, in parallel
    over ``max_workers`` threads (default: the number of cores)."""
    if not tests:
        return []
    workers = max(1, min(len(tests), max_workers or os.cpu_count() or 1))
    if workers == 1:
        return [_judge_one(code, t, fn_name, limits) for t in tests]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda t: _judge_one(code, t, fn_name, limits), tests))
