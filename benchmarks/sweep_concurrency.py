"""Wall time of one 4-trial smoke sweep at concurrency 1 vs 2, side by side.

    python benchmarks/sweep_concurrency.py                       # filters_smoke, 2 CPUs
    python benchmarks/sweep_concurrency.py --spec experiments/stochasticity_smoke.yaml

Both sweeps run in this process on one local Ray with 2 logical CPUs and the same
cached warm-started micro model (warmed before timing), so the ratio measures what
concurrency buys: each smoke trial takes 1 CPU (0.2 loop + 2 x 0.3 workers + 0.2
learner), so at concurrency 2 two trials share the 2 cores. The machine's load average
is printed beside each time: other jobs on the same cores distort the ratio.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="experiments/filters_smoke.yaml")
    parser.add_argument("--order", default="1,2", help="Concurrencies, in the order run.")
    args = parser.parse_args()

    from tether.platform.session import prepare_process, start_ray

    prepare_process(None)
    from tether.platform.sweep import run_sweep
    from tether.platform.sweep_spec import load_sweep_spec
    from tether.policy.load import resolve_policy

    start_ray(None, 2, 0)
    out = Path(tempfile.mkdtemp(prefix="sweep_bench_"))
    base = load_sweep_spec(args.spec).base
    resolve_policy(base.model, base.env, base.experiment.seed, base.rollout.max_reply_tokens)

    times: dict[int, float] = {}
    for concurrency in (int(c) for c in args.order.split(",")):
        spec = load_sweep_spec(args.spec, [f"experiment.output_dir={out / f'c{concurrency}'}",
                                           f"sweep.max_concurrent={concurrency}",
                                           f"sweep.name=bench_c{concurrency}"])
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        outcome = run_sweep(spec, echo=lambda line: None)
        times[concurrency] = time.perf_counter() - start
        assert outcome.status == "FINISHED" and outcome.trials == 4, outcome.status
        print(f"concurrency {concurrency}: {times[concurrency]:7.1f} s for {outcome.trials} "
              f"trials  (load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} "
              f"after, on {os.cpu_count()} cores)", flush=True)
    if 1 in times and 2 in times:
        print(f"speed-up of concurrency 2 over 1: {times[1] / times[2]:.2f}x (target >= 1.6x)")


if __name__ == "__main__":
    main()
