"""A process's peak resident memory, per iteration: the driver and every actor that
holds a model report it, and the driver logs it as ``system/peak_rss_gb/…``."""

from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

GIB = float(1 << 30)


def peak_rss_gb(reset: bool = False) -> float:
    """This process's peak resident set size in GiB: since the last ``reset=True`` call
    (Linux: ``VmHWM`` of /proc/self/status, reset by writing 5 to /proc/self/clear_refs),
    or since the process started where that is unavailable (``ru_maxrss``).  Pages shared
    with other processes (the Ray object store's mappings, shared libraries) count in
    each process that touched them."""
    kib = None
    try:
        match = re.search(r"^VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
        kib = int(match.group(1)) if match else None
    except OSError:
        pass
    if kib is None:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kib = maxrss / 1024 if sys.platform == "darwin" else maxrss  # macOS: bytes
    if reset:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
    return kib * 1024 / GIB


def release_free_memory() -> bool:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim(0)``); True
    if it released any.  A learner's batches change shape every iteration, and glibc
    keeps the freed chunks of each shape in its arenas: without this the process's
    resident memory wanders upward over hundreds of iterations (benchmarks/RESULTS.md,
    "Soak").  The learner calls it after every update, the driver after every
    iteration.  Elsewhere than glibc, nothing to do: False."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.malloc_trim(0))
