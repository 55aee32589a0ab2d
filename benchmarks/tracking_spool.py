"""Cost of the tracking spool on the quickstart's writes, with a real ``mlflow server`` up.

Replays the writes of a finished quickstart run (its metrics step by step, read from its
MLflow store, and its artifact files: sample transcripts, per-prompt rewards, heatmaps,
checkpoint tags, the final model) through ``Tracker`` into a real ``mlflow server`` on
127.0.0.1, with the spool on (``tracking.spool``, the default) and off, alternating
(on/off, off/on, ...) so load drifts hit both. Each repeat is a new MLflow run. Reports
the tracking seconds per iteration on and off and their difference as a share of the
quickstart's median iteration time (from the same store). The timed part holds
``--lock`` (the machine's shared CPU lock) if given; starting the server does not.

Then, with the server killed, the same writes go to the spool: the first write pays
MLflow's (bounded) retry budget once, the rest are appends to the JSONL.

    PYTHONPATH=. python benchmarks/tracking_spool.py --store /tmp/qs/mlflow.db \\
        --artifacts /tmp/qs/artifacts/<run id>/artifacts --lock /tmp/tether-cpu.lock
"""

from __future__ import annotations

import argparse
import fcntl
import sqlite3
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path


def quickstart_writes(store: Path, artifacts: Path):
    """[(step, metrics, files, tags)] of the store's (one) finished run, in order, and
    the run's median ``timing/iteration``."""
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    (run_id,) = db.execute(
        "select run_uuid from runs where status='FINISHED' order by start_time desc limit 1"
    ).fetchone()
    by_step: dict[int, dict[str, float]] = {}
    for key, value, step in db.execute(
        "select key, value, step from metrics where run_uuid=?", (run_id,)
    ):
        by_step.setdefault(step, {})[key] = value
    iteration_s = statistics.median(
        v for s, m in by_step.items() if s > 0 for k, v in m.items() if k == "timing/iteration"
    )
    files = {
        p.relative_to(artifacts): p
        for p in artifacts.rglob("*")
        if p.is_file() and p.parts[len(artifacts.parts)] != "model"
    }
    writes = []
    for step in sorted(by_step):
        step_files = [
            (str(rel.parent) if str(rel.parent) != "." else None, path)
            for rel, path in files.items()
            if f"{step:04d}" in rel.name
        ]
        tags = {"tether.last_checkpoint": f"/ckpt/iter_{step:06d}.pt"} if step % 10 == 0 else {}
        writes.append((step, by_step[step], step_files, tags))
    return writes, iteration_s, artifacts / "model"


def replay(tracker, writes, model_dir) -> list[float]:
    """The run's writes, as the driver makes them; seconds per step."""
    seconds = []
    for step, metrics, files, tags in writes:
        started = time.perf_counter()
        tracker.log_metrics({k: v for k, v in metrics.items() if k != "timing/log"}, step)
        for artifact_path, path in files:
            tracker.log_artifact(path, artifact_path)
        tracker.log_metrics({"timing/log": metrics.get("timing/log", 0.0)}, step)
        tracker.set_tags(tags)
        seconds.append(time.perf_counter() - started)
    started = time.perf_counter()
    if model_dir.is_dir():
        tracker.log_artifacts(model_dir, "model")
    tracker.set_tags({"tether.status": "FINISHED"})
    tracker.finish("FINISHED")
    seconds[-1] += time.perf_counter() - started
    return seconds


@contextmanager
def cpu_lock(path: str | None):
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[:3].__str__()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="the quickstart run's mlflow.db")
    parser.add_argument("--artifacts", type=Path, required=True, help="its artifacts directory")
    parser.add_argument("--repeats", type=int, default=4, help="runs per side")
    parser.add_argument("--lock", default=None, help="flock this file around the timed part")
    args = parser.parse_args()

    from tests.mlflow_server import MlflowServer
    from tether.platform.config import TrackingConfig
    from tether.platform.tracking.tracker import Tracker

    writes, iteration_s, model_dir = quickstart_writes(args.store, args.artifacts)
    print(
        f"quickstart run: {len(writes)} steps, {sum(len(w[1]) for w in writes)} metric values, "
        f"{sum(len(w[2]) for w in writes)} files + model; median iteration {iteration_s:.1f} s"
    )
    work = Path(tempfile.mkdtemp(prefix="tracking_spool_bench_"))
    settings = TrackingConfig(probe_every_s=10.0, drain_timeout_s=0.0)
    per_step = {"on": [], "off": []}
    with MlflowServer(work / "server") as server:

        def tracker(spool: bool, name: str) -> Tracker:
            return Tracker(
                server.uri,
                "spool-bench",
                run_name=name,
                settings=settings,
                spool_root=work / "spool" if spool else None,
            )

        replay(tracker(True, "warm-up"), writes, model_dir)  # server caches, imports
        print(f"load before the timed part: {load()}")
        with cpu_lock(args.lock):
            for repeat in range(args.repeats):
                for side in ("on", "off") if repeat % 2 == 0 else ("off", "on"):
                    seconds = replay(tracker(side == "on", f"{side}-{repeat}"), writes, model_dir)
                    per_step[side].append(sum(seconds) / len(seconds))
        print(f"load after the timed part: {load()}")
        for side, values in per_step.items():
            print(
                f"spool {side:3s}: tracking s/iteration mean {statistics.mean(values):.4f} "
                f"(runs: {', '.join(f'{v:.4f}' for v in values)})"
            )
        diff = statistics.mean(per_step["on"]) - statistics.mean(per_step["off"])
        pairs = [a - b for a, b in zip(per_step["on"], per_step["off"])]
        print(
            f"on - off: {diff * 1000:+.2f} ms/iteration (pairs: "
            f"{', '.join(f'{p * 1000:+.1f}' for p in pairs)} ms) = {100 * diff / iteration_s:+.4f} % "
            f"of the quickstart's {iteration_s:.1f} s iteration"
        )

        # The server gone: the spool takes the writes.
        outage = tracker(True, "outage")
        server.kill()
        with cpu_lock(args.lock):
            started = time.perf_counter()
            outage.log_metrics({"probe": 1.0}, 0)
            first = time.perf_counter() - started
            seconds = replay(outage, writes, model_dir)
        print(
            f"server down: first write {first:.2f} s (MLflow's bounded retries), then "
            f"{1000 * statistics.mean(seconds[:-1]):.2f} ms/iteration to the spool "
            f"({outage.spool.pending} records in {outage.spool.directory})"
        )


if __name__ == "__main__":
    main()
