"""A long run of the micro policy, watched: does anything grow?

Runs ``--iterations`` (default 500) iterations of the micro policy (the tests' micro
config: FrozenLake, 2 rollout workers, 2 groups of 4; 8 validation episodes) with the
shipped cadences of everything that writes or holds state: collapse diagnostics every 5
(heatmaps and the information chain every 10, gradient SNR every 10), sample transcripts
every 5, validation every 10, a checkpoint every 10, and the retention settings at
their defaults. The run is a real ``Trainer`` (local Ray, SQLite MLflow) in this
process, so this process is the driver.

After every ``--every``-th iteration one CSV row records: the iteration's time
(``timing/iteration`` and the wall time since the previous row), the memory (RSS, and
USS: the pages no other process shares, MB) of the driver, of each Ray actor this run started (rollout workers, their
environment pools, the learner; found as this process's ``ray::`` descendants) and of
Ray's own processes (raylet, GCS: everything else this process started), the disk use
(MB) of the output directory, the MLflow store (``mlflow.db`` with its WAL), the
artifact store and the checkpoints, and the load average.

Then it fits a line to each series over the post-warm-up part (iterations after
``--warmup``, default 50: the allocator, torch's and Ray's lazy set-up, the first
validation, the first checkpoint and the first heatmaps all happen in the first 10-50
iterations) with ``scipy.stats.linregress``, and prints the slopes per 100 iterations
with 95 % intervals (t distribution, n - 2 degrees of freedom, from linregress's
standard error). Consecutive readings are correlated (a process's RSS moves in steps),
which makes the ordinary interval too narrow: the table also gives the interval widened
by the residuals' lag-1 autocorrelation r, by sqrt((1 + r) / (1 - r)) (the AR(1)
effective-sample-size correction). Targets (issue 35): RSS slope interval includes 0 or
lies below 1 MB per 100 iterations; iteration time flat; disk bounded by the retention.

    PYTHONPATH=. nice -n 19 python benchmarks/soak.py --iterations 500 \\
        --out /tmp/soak --csv /tmp/soak/soak.csv
    PYTHONPATH=. python benchmarks/soak.py --analyze /tmp/soak/soak.csv   # fit only
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import time
from pathlib import Path

import psutil

MB = float(1 << 20)

#: the series fitted and the unit of their slope (per 100 iterations)
TARGET_RSS_MB_PER_100 = 1.0


def soak_config(out: Path, models: Path, iterations: int, overrides: list[str]):
    """The micro config with the shipped cadences (``trainer``, ``diagnostics`` and
    ``retention`` at their defaults, apart from the run's length and a small validation)."""
    from tests.conftest import micro_config_dict
    from tether.platform.config import build_config

    data = micro_config_dict(out)
    data["trainer"] = {"iterations": iterations, "val_episodes": 8}
    data["tracking"] = {"log_model": False}
    cfg = build_config(data, overrides)
    cfg.model.cache_dir = models
    return cfg


def du_mb(path: Path) -> float:
    """Disk use of a file or a directory tree (allocated blocks), MB; 0 when absent."""
    if not path.exists():
        return 0.0
    if path.is_file():
        return path.stat().st_blocks * 512 / MB
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:  # removed while walking (a pruned checkpoint)
                pass
    return total / MB


def role(proc: psutil.Process) -> str:
    """``rollout_worker`` / ``env_pool`` / ``learner`` for a Ray actor, ``gcs_server`` and
    ``raylet``, else ``ray_system`` (idle Ray workers, the log monitor, Ray's agents)."""
    try:
        title = " ".join(proc.cmdline()[:1])
    except (psutil.Error, OSError):
        return "gone"
    for name, label in (
        ("ray::RolloutWorker", "rollout_worker"),
        ("ray::EnvPoolActor", "env_pool"),
        ("ray::Learner", "learner"),
    ):
        if title.startswith(name):
            return label
    # Ray's own processes: the two that hold cluster state apart, the rest together
    name = os.path.basename(title.split()[0]) if title else ""
    return {"gcs_server": "gcs_server", "raylet": "raylet"}.get(name, "ray_system")


def memory_mb(proc: psutil.Process) -> tuple[float, float]:
    """(RSS, USS) in MB. USS counts only the pages no other process maps: RSS also grows
    as a process touches more of the shared Ray object store (weights pass through it
    every iteration) or of shared libraries, which is not a leak of that process."""
    info = proc.memory_full_info()
    return info.rss / MB, info.uss / MB


def rss_by_process() -> dict[str, float]:
    """RSS and USS (MB) of the driver and of every process it started, by role; several
    actors of one role are numbered in pid order (``rollout_worker0``, ...)."""
    me = psutil.Process()
    out = dict(zip(("rss_driver", "uss_driver"), memory_mb(me), strict=True))
    by_role: dict[str, list[tuple[int, float, float]]] = {}
    for child in me.children(recursive=True):
        try:
            rss, uss = memory_mb(child)
        except psutil.Error:
            continue
        by_role.setdefault(role(child), []).append((child.pid, rss, uss))
    for name, procs in by_role.items():
        if name in ("ray_system", "gcs_server", "raylet"):
            out[f"rss_{name}"] = sum(rss for _, rss, _ in procs)
            out[f"uss_{name}"] = sum(uss for _, _, uss in procs)
            continue
        for k, (pid, rss, uss) in enumerate(sorted(procs)):
            out[f"rss_{name}{k}"], out[f"uss_{name}{k}"] = rss, uss
            out[f"pid_{name}{k}"] = pid
    return out


def disk_by_part(output_dir: Path) -> dict[str, float]:
    db = output_dir / "mlflow.db"
    store = sum(du_mb(Path(f"{db}{suffix}")) for suffix in ("", "-wal", "-shm", "-journal"))
    return {
        "disk_output_dir": du_mb(output_dir),
        "disk_mlflow_db": store,
        "disk_artifacts": du_mb(output_dir / "artifacts"),
        "disk_checkpoints": du_mb(output_dir / "checkpoints"),
        "files_artifacts": float(
            sum(len(files) for _, _, files in os.walk(output_dir / "artifacts"))
        ),
    }


class Recorder:
    """The run's event hook: a CSV row after every ``every``-th iteration (written, not
    kept: this process is the driver being measured; 500 rows held were ~0.8 MB)."""

    def __init__(self, path: Path, cfg, every: int) -> None:
        self.path, self.cfg, self.every = path, cfg, every
        self.output_dir = Path(cfg.experiment.output_dir).resolve()
        self.last = time.perf_counter()
        self.fields: list[str] | None = None

    def __call__(self, kind: str, data: dict) -> None:
        if kind == "tracking" or kind == "checkpoint_failed":
            print(f"[{kind}] {data.get('message')}", flush=True)
        if kind != "iteration" or data["iteration"] % self.every:
            return
        from tether.platform.run.cadence import due

        now, it, c = time.perf_counter(), data["iteration"], self.cfg
        row = {
            "iteration": it,
            "wall_s": now - self.last,
            "iteration_s": data.get("timing/iteration", math.nan),
            # the iterations that do more than the loop's stages (cadence.due's rule)
            "diagnosed": float(c.diagnostics.enabled and due(it, c.diagnostics.every, first=True)),
            "validated": float(due(it, c.trainer.val_every, last=c.trainer.iterations)),
            "checkpointed": float(due(it, c.trainer.checkpoint_every, last=c.trainer.iterations)),
            **rss_by_process(),
            **disk_by_part(self.output_dir),
            "load1": os.getloadavg()[0],
            "time": time.time(),
        }
        self.last = now
        if self.fields is None:
            self.fields = list(row)
            with self.path.open("w", newline="") as f:
                csv.DictWriter(f, self.fields, extrasaction="ignore").writeheader()
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.fields, extrasaction="ignore").writerow(row)
        if data["iteration"] % 25 == 0:
            print(
                f"it {data['iteration']:4d}  {row['iteration_s']:.2f} s  driver "
                f"{row['rss_driver']:.0f} MB  out {row['disk_output_dir']:.1f} MB  "
                f"load {row['load1']:.1f}",
                flush=True,
            )


def fit(iterations, values) -> dict[str, float]:
    """Slope per 100 iterations with its 95 % t interval, plain and widened by the
    residuals' lag-1 autocorrelation."""
    import numpy as np
    from scipy import stats

    x, y = np.asarray(iterations, float), np.asarray(values, float)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    result = stats.linregress(x, y)
    t = stats.t.ppf(0.975, len(x) - 2)
    residuals = y - (result.intercept + result.slope * x)
    return _slope_row(y, residuals, 100 * result.slope, 100 * t * result.stderr)


def fit_with_load(iterations, values, loads) -> dict[str, float]:
    """The iteration slope of ``values ~ a + b * iteration + c * load1`` (per 100
    iterations, 95 % t interval): the machine's load, shared with other jobs, moves
    iteration time, and a load that falls during the run would pass for a trend."""
    import numpy as np
    from scipy import stats

    x = np.column_stack([np.ones(len(values)), iterations, loads]).astype(float)
    y = np.asarray(values, float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    residuals = y - x @ coef
    dof = len(y) - 3
    cov = (residuals @ residuals / dof) * np.linalg.inv(x.T @ x)
    slope, half = 100 * coef[1], 100 * stats.t.ppf(0.975, dof) * math.sqrt(cov[1, 1])
    return _slope_row(y, residuals, slope, half)


def _slope_row(y, residuals, slope: float, half: float) -> dict[str, float]:
    """A fitted slope's table row: its 95 % interval plain and widened by the residuals'
    lag-1 autocorrelation r1 (factor sqrt((1 + r1) / (1 - r1)), r1 >= 0)."""
    import numpy as np

    r1 = 0.0
    if residuals.std() > 0:
        r1 = float(np.corrcoef(residuals[:-1], residuals[1:])[0, 1])
    widen = math.sqrt((1 + max(r1, 0.0)) / (1 - min(max(r1, 0.0), 0.99)))
    return {
        "n": len(y),
        "mean": float(y.mean()),
        "first": float(y[0]),
        "last": float(y[-1]),
        "slope": slope,
        "low": slope - half,
        "high": slope + half,
        "r1": r1,
        "low_ar": slope - half * widen,
        "high_ar": slope + half * widen,
    }


def analyze(rows: list[dict], warmup: int) -> dict[str, dict]:
    """Fits of every RSS, time and disk series over the iterations after ``warmup``."""
    post = [r for r in rows if int(float(r["iteration"])) > warmup]
    columns = [
        c
        for c in post[0]
        if c.startswith(("rss_", "uss_", "disk_", "files_")) or c in ("iteration_s", "wall_s")
    ]
    its = [int(float(r["iteration"])) for r in post]
    fits = {c: fit(its, [float(r.get(c) or "nan") for r in post]) for c in columns}
    plain = [
        r
        for r in post
        if not any(float(r.get(k) or 0) for k in ("diagnosed", "validated", "checkpointed"))
    ]
    if len(plain) > 3:
        plain_its = [int(float(r["iteration"])) for r in plain]
        plain_s = [float(r["iteration_s"]) for r in plain]
        fits["iteration_s (plain iterations)"] = fit(plain_its, plain_s)
        fits["iteration_s (plain, load-adjusted)"] = fit_with_load(
            plain_its, plain_s, [float(r["load1"]) for r in plain]
        )
    return fits


def print_table(fits: dict[str, dict], warmup: int, last: int) -> None:
    print(f"\nslopes per 100 iterations over iterations {warmup + 1}-{last} (95 % intervals)")
    header = (
        f"{'series':34s} {'unit':>4s} {'mean':>9s} {'slope':>9s} {'interval':>21s} "
        f"{'r1':>5s} {'interval (AR1-widened)':>23s}"
    )
    print(header)
    print("-" * len(header))
    for name, f in fits.items():
        unit = "s" if "_s " in f"{name} " or "_s (" in name else "MB"
        unit = "n" if name.startswith("files_") else unit
        print(
            f"{name:34s} {unit:>4s} {f['mean']:9.3f} {f['slope']:+9.3f} "
            f"[{f['low']:+9.3f}, {f['high']:+9.3f}] {f['r1']:5.2f} "
            f"[{f['low_ar']:+9.3f}, {f['high_ar']:+9.3f}]"
        )


def plot(rows: list[dict], warmup: int, path: Path) -> None:
    """Memory (USS solid, RSS dotted) by process, disk by part and iteration time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [int(float(r["iteration"])) for r in rows]

    def series(name):
        return [float(r.get(name) or "nan") for r in rows]

    fig, (mem, disk, times) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for name in [c for c in rows[0] if c.startswith("uss_")]:
        (line,) = mem.plot(its, series(name), lw=1, label=name.removeprefix("uss_"))
        mem.plot(its, series("rss_" + name[4:]), lw=0.6, ls=":", color=line.get_color())
    mem.set_ylabel("MB (USS solid, RSS dotted)")
    mem.legend(fontsize=7, ncol=3)
    for name in ("disk_output_dir", "disk_mlflow_db", "disk_artifacts", "disk_checkpoints"):
        disk.plot(its, series(name), lw=1, label=name.removeprefix("disk_"))
    disk.set_ylabel("MB on disk")
    disk.legend(fontsize=7)
    times.plot(its, series("iteration_s"), lw=0.5, color="gray")
    times.set_ylabel("s per iteration")
    times.set_xlabel("iteration")
    for ax in (mem, disk, times):
        ax.axvline(warmup, color="k", lw=0.5, ls="--")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("/tmp/soak"))
    parser.add_argument("--models", type=Path, default=Path("/tmp/soak-models"))
    parser.add_argument("--csv", type=Path, help="default: <out>/soak.csv")
    parser.add_argument("--every", type=int, default=1, help="a row every N iterations")
    parser.add_argument("--warmup", type=int, default=50, help="iterations left out of fits")
    parser.add_argument("--analyze", type=Path, help="fit an existing CSV; no run")
    parser.add_argument("--figure", type=Path, help="also draw the series to this PNG")
    parser.add_argument("overrides", nargs="*", help="config overrides, section.key=value")
    args = parser.parse_args()

    if args.analyze:
        with args.analyze.open() as f:
            rows = list(csv.DictReader(f))
    else:
        from tether.platform.run.trainer import Trainer

        args.out.mkdir(parents=True, exist_ok=True)
        cfg = soak_config(args.out, args.models, args.iterations, args.overrides)
        path = args.csv or args.out / "soak.csv"
        recorder = Recorder(path, cfg, args.every)
        started = time.time()
        summary = Trainer(cfg, on_event=recorder).run()
        print(
            f"run {summary.run_id}: {summary.status}, {summary.iterations} iterations in "
            f"{summary.seconds:.0f} s (warm start and set-up included; "
            f"{(time.time() - started) / 60:.1f} min); rows in {path}"
        )
        with path.open() as f:
            rows = list(csv.DictReader(f))
        (args.out / "soak_summary.json").write_text(
            json.dumps({"run_id": summary.run_id, "status": summary.status}, indent=1)
        )
    last = int(float(rows[-1]["iteration"]))
    fits = analyze(rows, args.warmup)
    print_table(fits, args.warmup, last)
    loads = [float(r["load1"]) for r in rows]
    print(f"\nload average (1 min) during the run: {min(loads):.1f}-{max(loads):.1f}")
    if args.figure:
        plot(rows, args.warmup, args.figure)


if __name__ == "__main__":
    main()
