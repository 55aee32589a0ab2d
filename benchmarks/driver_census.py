"""What grows in the driver over a run of the micro policy: a tracemalloc census.

Runs the soak's run (``benchmarks/soak.py``: the micro policy with every cadence at its
shipped default) for ``--iterations`` iterations in this process, the driver.  Python's
allocation tracing starts after iteration ``--start`` (past the one-off growth of the
first iterations; only what is allocated after it is traced), and at each iteration of
``--at`` the census takes a snapshot after a full garbage collection, with the driver's
USS and the count of the garbage collector's objects by type.  At the end it prints,
between the first and the last snapshot: the growth of USS, of the traced Python
allocations, the allocation sites (file:line, and the 3-frame traceback of the largest)
that grew most, and the object types whose counts grew.

    MALLOC_MMAP_THRESHOLD_=65536 PYTHONPATH=. python benchmarks/driver_census.py \\
        --iterations 200 --start 40 --at 60 130 200 --out /tmp/census

Tracing costs memory of its own (the tracebacks it interns), so USS read while it runs
is not the driver's.  ``--native N`` instead runs without tracing and every N
iterations reads what the C library's allocator holds (``mallinfo2``: bytes in use and
free in its heaps, bytes in its own mappings), the process's memory by kind of mapping
(``/proc/self/smaps``: private pages of the heap, of anonymous mappings, of files), its
threads and the garbage collector's object count; then fits each over the iterations
after ``--start`` (slope per 100 iterations, 95 % interval).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import sys
import time
import tracemalloc
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import soak_config  # noqa: E402

MB = float(1 << 20)


def type_counts() -> collections.Counter:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


class Census:
    """The run's event hook: tracing from ``start``, a snapshot at each of ``at``."""

    def __init__(self, start: int, at: list[int], frames: int) -> None:
        self.start, self.at, self.frames = start, sorted(at), frames
        self.snapshots: dict[int, tuple[tracemalloc.Snapshot, float, collections.Counter]] = {}
        self.uss: dict[int, float] = {}

    def __call__(self, kind: str, data: dict) -> None:
        if kind != "iteration":
            return
        it = data["iteration"]
        self.uss[it] = psutil.Process().memory_full_info().uss / MB
        if it == self.start:
            tracemalloc.start(self.frames)
        if it in self.at:
            gc.collect()
            uss = psutil.Process().memory_full_info().uss / MB
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            traced = sum(s.size for s in snap.statistics("filename")) / MB
            self.snapshots[it] = (snap, uss, type_counts())
            print(f"census at {it}: USS {uss:.1f} MB, traced {traced:.2f} MB", flush=True)


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def native_reading() -> dict[str, float]:
    """The allocator's and the kernel's view of this process's memory, MB."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    out = {
        "uss": psutil.Process().memory_full_info().uss / MB,
        "malloc_in_use": info.uordblks / MB,  # allocated from malloc's heaps (all arenas)
        "malloc_free": info.fordblks / MB,  # free in them (kept by the allocator)
        "malloc_mmapped": info.hblkhd / MB,  # blocks malloc mapped on their own
    }
    kinds = collections.Counter()
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else "[anon]"
        elif line.startswith(("Private_Clean:", "Private_Dirty:")):
            kind = name if name.startswith("[") else "file"
            kinds[kind] += int(head[1]) / 1024
    out.update({f"private {k}": v for k, v in kinds.items()})
    out["threads"] = float(psutil.Process().num_threads())
    out["gc_objects"] = float(len(gc.get_objects()))
    return out


class Native:
    """The run's event hook: ``native_reading`` every ``every`` iterations."""

    def __init__(self, every: int) -> None:
        self.every, self.rows = every, {}

    def __call__(self, kind: str, data: dict) -> None:
        if kind == "iteration" and data["iteration"] % self.every == 0:
            from tether.actors.memory import release_free_memory

            reading = native_reading()
            started = time.perf_counter()
            release_free_memory()  # what it costs (the Trainer's own follows, at once)
            reading["malloc_trim_ms"] = 1000 * (time.perf_counter() - started)
            self.rows[data["iteration"]] = reading


def native_report(native: Native, start: int) -> None:
    from soak import fit

    its = [i for i in sorted(native.rows) if i > start]
    print(f"\nslopes per 100 iterations over iterations {its[0]}-{its[-1]} (95 % interval)")
    names = sorted({k for i in its for k in native.rows[i]})
    for name in names:
        values = [native.rows[i].get(name, 0.0) for i in its]
        f = fit(its, values)
        print(
            f"  {name:24s} first {values[0]:10.2f}  last {values[-1]:10.2f}  slope "
            f"{f['slope']:+8.3f} [{f['low']:+8.3f}, {f['high']:+8.3f}]"
        )


def report(census: Census, top: int) -> None:
    its = sorted(census.snapshots)
    first, last = its[0], its[-1]
    (s0, u0, c0), (s1, u1, c1) = census.snapshots[first], census.snapshots[last]
    per100 = 100.0 / (last - first)
    traced = [sum(s.size for s in census.snapshots[i][0].statistics("filename")) for i in its]
    print(f"\niterations {first} -> {last} ({last - first} iterations)")
    for i in its:
        print(f"  it {i}: USS {census.snapshots[i][1]:.1f} MB")
    print(f"USS: {u1 - u0:+.2f} MB ({(u1 - u0) * per100:+.2f} MB per 100 iterations)")
    print(
        f"traced Python allocations: {(traced[-1] - traced[0]) / MB:+.3f} MB "
        f"({(traced[-1] - traced[0]) / MB * per100:+.3f} MB per 100 iterations)"
    )
    print(f"\ntop {top} allocation sites by growth (file:line), bytes and blocks:")
    diff = s1.compare_to(s0, "lineno")
    for stat in diff[:top]:
        frame = stat.traceback[0]
        print(
            f"  {stat.size_diff / 1024:+9.1f} kB {stat.count_diff:+7d} blocks  "
            f"{frame.filename}:{frame.lineno}"
        )
    print("\nthe largest growths by traceback:")
    for stat in s1.compare_to(s0, "traceback")[:8]:
        print(f"  {stat.size_diff / 1024:+9.1f} kB {stat.count_diff:+7d} blocks")
        for frame in stat.traceback[:6]:
            print(f"      {frame.filename}:{frame.lineno}")
    print("\nobject types whose count grew most (garbage collector's objects):")
    grown = sorted(((c1[k] - c0[k], k) for k in c1), reverse=True)[:top]
    for delta, name in grown:
        print(f"  {delta:+8d}  {name}  (now {c1[name]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--start", type=int, default=40)
    parser.add_argument("--at", type=int, nargs="+", default=[60, 130, 200])
    parser.add_argument("--frames", type=int, default=6)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--native", type=int, help="no tracing: native readings every N")
    parser.add_argument("--out", type=Path, default=Path("/tmp/census"))
    parser.add_argument("--models", type=Path, default=Path("/tmp/soak-models"))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from tether.platform.run.trainer import Trainer

    args.out.mkdir(parents=True, exist_ok=True)
    cfg = soak_config(args.out, args.models, args.iterations, args.overrides)
    hook = Native(args.native) if args.native else Census(args.start, args.at, args.frames)
    started = time.time()
    summary = Trainer(cfg, on_event=hook).run()
    print(f"run {summary.status}, {summary.iterations} iterations in {time.time() - started:.0f} s")
    if args.native:
        native_report(hook, args.start)
    else:
        report(hook, args.top)


if __name__ == "__main__":
    main()
