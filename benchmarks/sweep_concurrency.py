"""Wall time of one 4-trial smoke sweep at concurrency 1 vs 2, side by side.

    python benchmarks/sweep_concurrency.py             # filters_smoke, 2 CPUs, 1,2,2,1
    python benchmarks/sweep_concurrency.py --spec experiments/stochasticity_smoke.yaml
    python benchmarks/sweep_concurrency.py --order 1,2 trainer.iterations=8 rollout.groups=2

Both sweeps run in this process on one local Ray with 2 logical CPUs and the same
cached warm-started micro model (warmed before timing), so the ratio measures what
concurrency buys: each smoke trial takes 1 CPU (0.2 loop + 0.5 rollout worker + 0.3
learner, one torch thread each), so at concurrency 2 two trials share the 2 cores.
Overrides (the CLI's syntax) reshape every trial, e.g. to see how the ratio depends on
how long a trial trains against how long its actors take to start. The machine's load average
is printed beside each time: other jobs on the same cores distort the ratio.

CPU use is sampled from /proc: the CPU seconds of this process tree (the driver, Ray's
services and every trial process, summed) and of the whole machine, so each line says
how many cores the sweep used and how many other jobs took. A trial that keeps more
than one core busy (process start-up: each actor imports torch) caps what concurrency
can buy: on 2 free cores at most 2 x wall / CPU seconds of the concurrency-1 run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


class CpuMeter(threading.Thread):
    """CPU seconds of this process tree (sampled every 0.2 s, so processes that live
    shorter than that are missed) and busy seconds of the whole machine."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[tuple[int, int], float] = {}  # (pid, start tick) -> CPU seconds
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            self.sample()

    def sample(self) -> None:
        parents, cpu = {}, {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(pid)] = int(fields[1])
            cpu[int(pid)] = ((int(fields[11]) + int(fields[12])) / TICK, int(fields[19]))
        mine = {os.getpid()}
        for _ in range(8):  # descendants, a few levels deep (driver -> raylet -> workers)
            mine |= {pid for pid, ppid in parents.items() if ppid in mine}
        for pid in mine:
            seconds, start = cpu[pid]
            self.seen[(pid, start)] = seconds

    def tree_seconds(self) -> float:
        self.sample()
        return sum(self.seen.values())

    @staticmethod
    def machine_busy_seconds() -> float:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return (sum(values) - values[3] - values[4]) / TICK  # minus idle and iowait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="experiments/filters_smoke.yaml")
    parser.add_argument(
        "--order",
        default="1,2,2,1",
        help="Concurrencies, in the order "
        "run (alternating evens out drifting load from other jobs).",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="Config overrides for every trial, "
        "e.g. trainer.iterations=8 (same syntax as `tether sweep`).",
    )
    args = parser.parse_args()

    from tether.platform.session import prepare_process, start_ray

    prepare_process(None)
    from tether.platform.sweep.runner import run_sweep
    from tether.platform.sweep.spec import load_sweep_spec
    from tether.policy.load import resolve_policy

    start_ray(None, 2, 0)
    out = Path(tempfile.mkdtemp(prefix="sweep_bench_"))
    base = load_sweep_spec(args.spec, args.overrides).base
    resolve_policy(base.model, base.env, base.experiment.seed, base.rollout.max_reply_tokens)

    times: dict[int, list[float]] = {}
    cpus: dict[int, list[float]] = {}
    meter = CpuMeter()
    meter.start()
    for run, concurrency in enumerate(int(c) for c in args.order.split(",")):
        name = f"bench{run}_c{concurrency}"
        spec = load_sweep_spec(
            args.spec,
            [
                *args.overrides,
                f"experiment.output_dir={out / name}",
                f"sweep.max_concurrent={concurrency}",
                f"sweep.name={name}",
            ],
        )
        load_before = os.getloadavg()[0]
        cpu_before, busy_before = meter.tree_seconds(), meter.machine_busy_seconds()
        start = time.perf_counter()
        outcome = run_sweep(spec, echo=lambda line: None)
        seconds = time.perf_counter() - start
        cpu = meter.tree_seconds() - cpu_before
        others = meter.machine_busy_seconds() - busy_before - cpu
        assert outcome.status == "FINISHED" and outcome.trials == 4, outcome.status
        times.setdefault(concurrency, []).append(seconds)
        cpus.setdefault(concurrency, []).append(cpu)
        print(
            f"concurrency {concurrency}: {seconds:7.1f} s for {outcome.trials} trials; sweep "
            f"CPU {cpu:.0f} s ({cpu / seconds:.2f} cores), other jobs {others / seconds:.2f} "
            f"cores of {os.cpu_count()} (load average {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after)",
            flush=True,
        )
    if 1 in times and 2 in times:
        c1, c2 = (sum(times[c]) / len(times[c]) for c in (1, 2))
        print(
            f"mean: concurrency 1 {c1:.1f} s, concurrency 2 {c2:.1f} s; speed-up "
            f"{c1 / c2:.2f}x (target >= 1.6x)"
        )
        cpu1 = sum(cpus[1]) / len(cpus[1])
        print(
            f"ceiling on 2 free cores (2 x wall / CPU seconds at concurrency 1): "
            f"{min(2.0, 2 * c1 / cpu1):.2f}x"
        )


if __name__ == "__main__":
    main()
