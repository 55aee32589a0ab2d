"""The program the sandboxed interpreter runs first (``python -I -S -c BOOTSTRAP``),
before the candidate's code: privileges, rlimits, the audit hook, then the candidate.

Arguments: function name (empty for a stdin/stdout program), CPU seconds, address
space bytes, file size bytes, and ``drop`` (become uid 65534 first when started as
root of the sandbox's user namespace) or ``keep``.  With a function name the result
is written as one JSON line to the original stdout, ``{"result": ...}`` or
``{"error": ...}``; the judge outside checks it (the child's word is never trusted
beyond being a candidate value).  See ``tether/envs/sandbox/__init__.py`` for what
the hook refuses and why it is only the second layer.
"""

#: Root of the sandbox's user namespace (real root outside, see isolation.py) becomes
#: uid 65534 for real before anything else runs; this also clears every capability.
DROP_PRIVILEGES = r"""
import os as _os
if _os.getuid() == 0:
    _os.setgroups([])
    _os.setresgid(65534, 65534, 65534)
    _os.setresuid(65534, 65534, 65534)
del _os
"""

#: Privileges, settings, the program and its input, kernel rlimits, stdout.
PRELUDE = r"""
import sys, os
if sys.argv[5] == "drop":
    exec(DROP_PRIVILEGES)
import marshal, resource
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
sys.dont_write_bytecode = True
stdout_fd = os.dup(1)
if cfg["fn"]:
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
"""

#: The in-process guard: no new builtin/extension modules, no pidfd calls, the audit
#: hook.  Second layer only (see __init__.py).
GUARD = r"""
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
"""

#: Run the candidate and report its result.
RUN = r'''import builtins
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

PRELUDE = PRELUDE.replace("DROP_PRIVILEGES", repr(DROP_PRIVILEGES))
BOOTSTRAP = PRELUDE + GUARD + RUN
#: The same without the in-process guard: the state a candidate reaches after switching
#: the hook off.  Tests run attacks under it to check what the OS sandbox alone holds.
UNGUARDED = PRELUDE + RUN
