"""Overhead of the collapse diagnostics at their default cadence on the quickstart.

Two trainers of the same config run side by side in one process and one local Ray
(diagnostics at the default cadence vs ``diagnostics.enabled=false``), alternating
iteration by iteration (A B, B A, ...) so machine load drifts hit both alike. Same seed,
same weights, same levels: the diagnostics do not touch the policy, so both collect the
same batches and the only difference is the diagnostics' work (cross-scoring, heatmaps,
gradient SNR). Reports the ratio of mean iteration wall time (iteration stages plus
logging/alarms/checkpoint), and the mean per-stage times.

    PYTHONPATH=. python benchmarks/diagnostics_overhead.py --iterations 10 \\
        model.cache_dir=/tmp/diag_work/models
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/quickstart.yaml")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", default="/tmp/tether_diag_overhead")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for both runs")
    args = parser.parse_args()

    import ray

    import tether
    from tether.platform.config import load_config
    from tether.platform.driver import Trainer

    out = Path(args.out)
    # Both trainers' actors live in one local Ray; only one trainer works at a time.
    common = [*args.overrides, f"trainer.iterations={10 ** 6}", f"trainer.val_every={10 ** 6}",
              "tracking.log_model=false", "ray.num_cpus=8"]
    trainers = {}
    for name, extra in (("on", []), ("off", ["diagnostics.enabled=false"])):
        cfg = load_config(args.config, [*common, *extra, f"experiment.output_dir={out / name}",
                                        f"experiment.run_name=overhead-{name}"])
        trainers[name] = Trainer(cfg)
        trainers[name].setup()
    worker_tether = ray.get(ray.remote(lambda: __import__("tether").__file__).remote())
    print(f"tether: driver {tether.__file__}, Ray workers {worker_tether}", flush=True)
    d = trainers["on"].cfg.diagnostics
    print(f"diagnostics: every {d.every}, chain_every {d.chain_every}, heatmap_every {d.heatmap_every}, "
          f"grad_snr_every {d.grad_snr_every}, max_pairs {d.max_pairs}, max_cells {d.max_cells}", flush=True)

    wall: dict[str, list[float]] = {name: [] for name in trainers}
    stages: dict[str, list[dict]] = {name: [] for name in trainers}
    for it in range(1, args.iterations + 1):
        order = ["on", "off"] if it % 2 else ["off", "on"]
        success = {}
        for name in order:
            trainer = trainers[name]
            start = time.perf_counter()
            metrics = trainer.iteration(it)
            trainer.after_iteration(it, metrics)
            wall[name].append(time.perf_counter() - start)
            stages[name].append({k: v for k, v in metrics.items() if k.startswith("timing/")})
            success[name] = metrics.get("rollout/success", float("nan"))
        print(f"iteration {it}: on {wall['on'][-1]:.1f} s (diagnose "
              f"{stages['on'][-1].get('timing/diagnose', 0):.1f}, grad_snr "
              f"{stages['on'][-1].get('timing/grad_snr', 0):.1f}), off {wall['off'][-1]:.1f} s; "
              f"success on {success['on']:.3f} off {success['off']:.3f}", flush=True)

    for trainer in trainers.values():
        trainer.tracker.finish("FINISHED")
    mean = {name: float(np.mean(v)) for name, v in wall.items()}
    print("\n| run | mean iteration s | iterations (s) |")
    print("|---|---|---|")
    for name in trainers:
        print(f"| diagnostics {name} | {mean[name]:.1f} | {', '.join(f'{w:.0f}' for w in wall[name])} |")
    print(f"\noverhead (mean on / mean off - 1): {100 * (mean['on'] / mean['off'] - 1):+.1f} %")
    keys = sorted({k for rows in stages.values() for row in rows for k in row})
    print("\n| stage | on, mean s per iteration | off, mean s per iteration |")
    print("|---|---|---|")
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{np.mean([row.get(key, 0.0) for row in stages[n]]):.1f}"
                                         for n in ("on", "off")) + " |")
    ray.shutdown()


if __name__ == "__main__":
    main()
