"""Overhead of the collapse diagnostics at their default cadence on the quickstart.

Two trainers of the same config run side by side in one process and one local Ray
(diagnostics at the default cadence vs ``diagnostics.enabled=false``), alternating
iteration by iteration (A B, B A, ...) so machine load drifts hit both alike. Same seed,
same weights, same levels: the diagnostics do not touch the policy, so both collect the
same batches and the only difference is the diagnostics' work (cross-scoring, heatmaps,
gradient SNR). Reports the ratio of mean iteration wall time (iteration stages plus
logging/alarms/checkpoint), the same ratio in CPU seconds (driver + every Ray process
it started, from /proc: less sensitive to other jobs on the machine than wall time),
and the mean per-stage times.

``--at 1,2,5,10`` runs only those iteration numbers (the cadences look at the number):
one representative of every diagnostics schedule in iterations 1..``--window``, and the
overhead over the window is then also reported with each unmeasured iteration counted as
the measured one with the same schedule (what fires: I(X;Z), chain, heatmap, grad SNR,
the probe set). ``--probe-cadences 5,10,15`` also estimates that overhead were the probe
set scored at each of those cadences, from its measured cost per point.

    PYTHONPATH=. python benchmarks/diagnostics_overhead.py --iterations 10 \\
        model.cache_dir=/tmp/diag_work/models
    PYTHONPATH=. python benchmarks/diagnostics_overhead.py --at 1,2,5,10 --window 10 \\
        model.cache_dir=/tmp/diag_work/models
    PYTHONPATH=. python benchmarks/diagnostics_overhead.py --at 1,2,5,10 --window 30 \\
        --probe-cadences 5,10,15,30 model.cache_dir=/tmp/diag_work/models
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np


def _process_cpu_seconds() -> dict[int, float]:
    """user + system CPU seconds of this process and all its descendants (Ray's local
    gcs/raylet/workers are started by the driver), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (
                int(fields[1]),
                (int(fields[11]) + int(fields[12])) / ticks,
            )  # ppid, cpu
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in stats:
            out[pid] = stats[pid][1]
        todo.extend(children.get(pid, []))
    return out


def _cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def schedule(d, it: int, probe_every: int | None = None) -> tuple[bool, ...]:
    """What the diagnostics run at iteration ``it`` (the cadences of
    ``tether/platform/run/diagnosis.py``); ``probe_every`` replaces the probe set's cadence."""
    from tether.platform.run.cadence import due

    xz = due(it, d.every, first=True)
    every = d.probe.every if probe_every is None else probe_every
    return (
        xz,
        xz and d.information_chain and due(it, d.chain_every, first=True),
        xz and due(it, d.heatmap_every, first=True),
        due(it, d.grad_snr_every),
        xz and d.probe.enabled and every > 0 and due(it, every, first=True),
    )


def window_estimate(d, steps, wall, cpu, stages, window: int) -> None:
    """The overhead over iterations 1..window, each iteration counted as the mean of the
    measured iterations with its schedule (measure a frequent schedule more than once and
    its noise weighs less): wall and CPU time on / off, and the diagnostics' own timers
    (``timing/diagnose`` + ``timing/grad_snr``) over the off arm's wall time."""
    runs: dict[tuple, list[int]] = {}
    for k, it in enumerate(steps):
        runs.setdefault(schedule(d, it), []).append(k)
    missing = sorted({it for it in range(1, window + 1) if schedule(d, it) not in runs})
    if missing:
        print(f"no measured iteration has the schedule of iterations {missing}: no window estimate")
        return

    def total(values: list[float]) -> float:
        return sum(
            float(np.mean([values[k] for k in runs[schedule(d, it)]]))
            for it in range(1, window + 1)
        )

    own = [
        row.get("timing/diagnose", 0.0) + row.get("timing/grad_snr", 0.0) for row in stages["on"]
    ]
    for label, series in (("wall", wall), ("CPU", cpu)):
        print(
            f"cadence-weighted overhead over iterations 1..{window} ({label}, each iteration "
            f"counted as the mean of the measured ones with its schedule): "
            f"{100 * (total(series['on']) / total(series['off']) - 1):+.1f} %"
        )
    print(
        f"by the diagnostics' own timers over the off arm's wall time: "
        f"{100 * total(own) / total(wall['off']):+.1f} %; measured per schedule: "
        + ", ".join(f"{[steps[k] for k in ks]}" for ks in runs.values())
    )


def probe_cadences(d, steps, wall, stages, window: int, cadences: list[int]) -> None:
    """The overhead over iterations 1..window were the probe set scored every c
    iterations, each iteration counted as the measured one with the same schedule apart
    from the probe, whose cost is the median of its measured points
    (``timing/diagnose/probe/total``), added where c makes it due:

    - wall: the "on" iterations' wall time without their own probe, plus the probe where
      due, over the "off" iterations' wall time;
    - stages: the diagnostics' own timers (``timing/diagnose`` without the probe, plus
      ``timing/grad_snr``, plus the probe where due) over the "off" iterations' wall
      time: what the diagnostics add, measured inside the iteration, so load that hits
      the two trainers unevenly does not count."""
    measured = {schedule(d, it)[:4]: k for k, it in enumerate(steps)}
    probe_s = [stages["on"][k].get("timing/diagnose/probe/total", 0.0) for k in range(len(steps))]
    ran = [t for t in probe_s if t > 0]
    if not ran:
        print("no probe point measured: no estimate by probe cadence")
        return
    cost = float(np.median(ran))
    print(f"\nprobe set: {cost:.1f} s per probe point (median of {len(ran)}: {ran})")
    for c in cadences:
        on = own = off = 0.0
        for it in range(1, window + 1):
            k = measured.get(schedule(d, it)[:4])
            if k is None:
                print(f"probe every {c}: iteration {it}'s schedule not measured")
                break
            probe = cost if schedule(d, it, c)[4] else 0.0
            st = stages["on"][k]
            on += wall["on"][k] - probe_s[k] + probe
            own += st.get("timing/diagnose", 0.0) - probe_s[k] + st.get("timing/grad_snr", 0.0)
            own += probe
            off += wall["off"][k]
        else:
            print(
                f"probe every {c} (iterations 1..{window}): diagnostics overhead "
                f"{100 * (on / off - 1):+.1f} % wall, {100 * own / off:+.1f} % by the "
                f"diagnostics' own timers (the probe alone "
                f"{100 * cost * sum(schedule(d, i, c)[4] for i in range(1, window + 1)) / off:+.1f} %)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/quickstart.yaml")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--at", default=None, help="comma-separated iteration numbers to run instead"
    )
    parser.add_argument(
        "--window",
        type=int,
        default=10,
        help="iterations 1..window for the cadence-weighted overhead (with --at)",
    )
    parser.add_argument(
        "--probe-cadences",
        default="",
        help="comma-separated probe cadences to estimate the overhead at (with --at)",
    )
    parser.add_argument("--out", default="/tmp/tether_diag_overhead")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for both runs")
    args = parser.parse_args()

    import ray

    import tether
    from tether.platform.config import load_config
    from tether.platform.run.trainer import Trainer

    out = Path(args.out)
    # Both trainers' actors live in one local Ray; only one trainer works at a time.
    common = [
        *args.overrides,
        f"trainer.iterations={10**6}",
        f"trainer.val_every={10**6}",
        "tracking.log_model=false",
        "ray.num_cpus=8",
    ]
    trainers = {}
    for name, extra in (("on", []), ("off", ["diagnostics.enabled=false"])):
        cfg = load_config(
            args.config,
            [
                *common,
                *extra,
                f"experiment.output_dir={out / name}",
                f"experiment.run_name=overhead-{name}",
            ],
        )
        trainers[name] = Trainer(cfg)
        trainers[name].setup()
    worker_tether = ray.get(ray.remote(lambda: __import__("tether").__file__).remote())
    print(f"tether: driver {tether.__file__}, Ray workers {worker_tether}", flush=True)
    d = trainers["on"].cfg.diagnostics
    print(
        f"diagnostics: every {d.every}, chain_every {d.chain_every}, heatmap_every {d.heatmap_every}, "
        f"grad_snr_every {d.grad_snr_every}, max_pairs {d.max_pairs}, max_cells {d.max_cells}, "
        f"probe {'every ' + str(d.probe.every) if d.probe.enabled else 'off'} "
        f"({d.probe.levels} levels); load {os.getloadavg()}",
        flush=True,
    )

    steps = [int(x) for x in args.at.split(",")] if args.at else list(range(1, args.iterations + 1))
    wall: dict[str, list[float]] = {name: [] for name in trainers}
    cpu: dict[str, list[float]] = {name: [] for name in trainers}
    stages: dict[str, list[dict]] = {name: [] for name in trainers}
    for k, it in enumerate(steps):
        order = ["on", "off"] if k % 2 == 0 else ["off", "on"]
        success = {}
        for name in order:
            trainer = trainers[name]
            start, cpu_start = time.perf_counter(), _process_cpu_seconds()
            metrics = trainer.iteration(it)
            trainer.after_iteration(it, metrics)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(_cpu_delta(cpu_start, _process_cpu_seconds()))
            stages[name].append({k: v for k, v in metrics.items() if k.startswith("timing/")})
            success[name] = metrics.get("rollout/success", float("nan"))
        print(
            f"iteration {it} (load {os.getloadavg()[0]:.1f}): on {wall['on'][-1]:.1f} s, "
            f"{cpu['on'][-1]:.1f} CPU s (diagnose "
            f"{stages['on'][-1].get('timing/diagnose', 0):.1f}, grad_snr "
            f"{stages['on'][-1].get('timing/grad_snr', 0):.1f}), off {wall['off'][-1]:.1f} s, "
            f"{cpu['off'][-1]:.1f} CPU s; "
            f"success on {success['on']:.3f} off {success['off']:.3f}",
            flush=True,
        )
        parts = {
            k.removeprefix("timing/diagnose/"): v
            for k, v in stages["on"][-1].items()
            if k.startswith("timing/diagnose/")
        }
        if parts:
            print(
                "  diagnose parts (s): " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()),
                flush=True,
            )

    for trainer in trainers.values():
        trainer.tracker.finish("FINISHED")
    mean = {name: float(np.mean(v)) for name, v in wall.items()}
    mean_cpu = {name: float(np.mean(v)) for name, v in cpu.items()}
    print(f"\niterations {steps}")
    print("| run | mean iteration s | mean CPU s | iterations (wall s) | iterations (CPU s) |")
    print("|---|---|---|---|---|")
    for name in trainers:
        print(
            f"| diagnostics {name} | {mean[name]:.1f} | {mean_cpu[name]:.1f} | "
            f"{', '.join(f'{w:.0f}' for w in wall[name])} | {', '.join(f'{w:.0f}' for w in cpu[name])} |"
        )
    print(
        f"\noverhead over the iterations run (mean on / mean off - 1): wall "
        f"{100 * (mean['on'] / mean['off'] - 1):+.1f} %, CPU {100 * (mean_cpu['on'] / mean_cpu['off'] - 1):+.1f} %"
    )
    if args.at:
        window_estimate(d, steps, wall, cpu, stages, args.window)
    if args.at and args.probe_cadences:
        cadences = [int(c) for c in args.probe_cadences.split(",")]
        probe_cadences(d, steps, wall, stages, args.window, cadences)
    print(f"load at the end {os.getloadavg()}")
    keys = sorted({k for rows in stages.values() for row in rows for k in row})
    print("\n| stage | on, mean s per iteration | off, mean s per iteration |")
    print("|---|---|---|")
    for key in keys:
        print(
            f"| {key} | "
            + " | ".join(
                f"{np.mean([row.get(key, 0.0) for row in stages[n]]):.1f}" for n in ("on", "off")
            )
            + " |"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
