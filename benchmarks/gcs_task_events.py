"""Does Ray's GCS server grow with every actor method call, and does a cap bound it?

Starts a local Ray the way Tether does (``start_ray``, as a run does), makes
``--calls`` calls of a trivial actor method (in batches of ``--batch``, the caller waiting
for each batch), and after every ``--every`` calls records the GCS server's memory (USS
and RSS, MB) with the number of task events the GCS says it holds (its periodic debug
dump in ``gcs_server.out``: "Current num of task events stored").  Every actor method
call is a task whose status events the caller reports to the GCS
(``task_events_report_interval_ms``), which keeps them up to
``task_events_max_num_task_in_gcs`` task attempts (Ray's default 100000), then evicts.

    PYTHONPATH=. python benchmarks/gcs_task_events.py --calls 150000 --csv /tmp/gcs.csv
    PYTHONPATH=. python benchmarks/gcs_task_events.py --calls 150000 --cap 10000 ...

``--cap`` sets ``ray.task_events_in_gcs`` (Tether's setting; none: Ray's defaults): the
task attempts kept and the evicted attempts remembered per job (the second a set of
attempt ids, the GCS's other growth once the first cap evicts); ``--dropped-cap`` sets
the second apart.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import time
from pathlib import Path

import psutil

MB = float(1 << 20)


def gcs_process() -> psutil.Process:
    for child in psutil.Process().children(recursive=True):
        try:
            if os.path.basename(child.cmdline()[0]) == "gcs_server":
                return child
        except (psutil.Error, IndexError):
            continue
    raise RuntimeError("no gcs_server among this process's children")


def stored_events(log: Path) -> int | None:
    """The last "Current num of task events stored" of the GCS's debug dump."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(r"Current num of task events stored: (\d+)", text)
    return int(found[-1]) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=150_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--every", type=int, default=5_000)
    parser.add_argument("--cap", type=int, help="ray.task_events_in_gcs (default: Ray's)")
    parser.add_argument("--dropped-cap", type=int, help="evicted attempts remembered per job")
    parser.add_argument("--csv", type=Path, required=True)
    args = parser.parse_args()

    from tether.platform.session import (
        TASK_EVENTS_ENV,
        cap_gcs_task_events,
        prepare_process,
        start_ray,
    )

    prepare_process(None)
    cap_gcs_task_events(args.cap)  # what start_ray(..., task_events_in_gcs=cap) does
    if args.dropped_cap is not None:
        os.environ[TASK_EVENTS_ENV[1]] = str(args.dropped_cap)
    start_ray(None, 2, 1)
    print({name: os.environ.get(name) for name in TASK_EVENTS_ENV})
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def step(self, x: int) -> int:
            return x + 1

    actor = Echo.remote()
    ray.get(actor.step.remote(0))
    gcs = gcs_process()
    (log,) = [Path(a.split("=", 1)[1]) for a in gcs.cmdline() if a.startswith("--stdout_filepath=")]
    rows, started, calls = [], time.perf_counter(), 0
    with args.csv.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["calls", "seconds", "uss_gcs", "rss_gcs", "events_stored", "load1"])
        while calls <= args.calls:
            if calls % args.every == 0:
                info = gcs.memory_full_info()
                row = [
                    calls,
                    round(time.perf_counter() - started, 1),
                    round(info.uss / MB, 2),
                    round(info.rss / MB, 2),
                    stored_events(log),
                    os.getloadavg()[0],
                ]
                out.writerow(row)
                f.flush()
                rows.append(row)
                print(*row, flush=True)
            ray.get([actor.step.remote(i) for i in range(args.batch)])
            calls += args.batch
    time.sleep(65)  # one more debug dump (every 60 s) and the last events reported
    info = gcs.memory_full_info()
    print("after 65 s idle:", round(info.uss / MB, 2), round(info.rss / MB, 2), stored_events(log))
    ray.shutdown()


if __name__ == "__main__":
    main()
