"""Per-iteration time split, learner world size 1 vs 2, from the runs' MLflow metrics.

    # train the (shortened) quickstart at world size 1, 2, 1, 2 in this process, then the table
    python benchmarks/learner_world_size.py run --iterations 4 --out /tmp/lws
    # the table from runs that already exist (any number; grouped by algo.learner_world_size)
    python benchmarks/learner_world_size.py table --tracking-uri sqlite:////tmp/lws/mlflow.db RUN_ID ...

Stages (the driver's ``timing/*`` metrics): rollout = ``collect``; score = ``prepare``
(reference/old-policy log-probs and critic values in the learner group); update;
sync = learner -> rollout-worker weights (gather the full state dict on rank 0, put
it in the Ray object store, every worker loads it); log = MLflow metrics and sample
artifacts; other = filter + diagnose + advantages + grad_snr.  The iteration is the
sum of all of them.  Iteration 1 (collapse diagnostics at start-up, first calls into
fresh actors) is left out of the means unless ``--include-first``.

``run`` alternates the world sizes (A B A B) so both see the same machine load, and
reports each pair's ratio as well as the means.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

STAGES = {
    "rollout": ["collect"],
    "score": ["prepare"],
    "update": ["update"],
    "sync": ["sync"],
    "log": ["log"],
    "other": ["filter", "diagnose", "advantages", "grad_snr"],
}


def iteration_split(
    client, run_id: str, include_first: bool = False
) -> dict[int, dict[str, float]]:
    """step -> {stage: seconds, "iteration": total} (the last value logged per step)."""
    steps: dict[int, dict[str, float]] = {}
    for stage, timers in STAGES.items():
        for timer in timers:
            history = sorted(
                client.get_metric_history(run_id, f"timing/{timer}"), key=lambda m: m.timestamp
            )
            last = {m.step: m.value for m in history}  # later values win (resumed runs)
            for step, value in last.items():
                row = steps.setdefault(step, dict.fromkeys(STAGES, 0.0))
                row[stage] += value
    for row in steps.values():
        row["iteration"] = sum(row[s] for s in STAGES)
    return {s: r for s, r in sorted(steps.items()) if include_first or s > 1}


def mean_split(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}


def table(client, run_ids: list[str], include_first: bool = False) -> str:
    by_size: dict[int, list[dict[str, float]]] = {}
    per_run: list[tuple[int, dict[str, float]]] = []
    for run_id in run_ids:
        size = int(client.get_run(run_id).data.params.get("algo.learner_world_size", "1"))
        rows = list(iteration_split(client, run_id, include_first).values())
        if not rows:
            raise SystemExit(f"run {run_id} has no timing/* metrics after iteration 1")
        by_size.setdefault(size, []).extend(rows)
        per_run.append((size, mean_split(rows)))
    columns = list(STAGES) + ["iteration"]
    lines = [
        "| learner world size | iterations | "
        + " | ".join(f"{c} s" for c in columns)
        + " | sync share |",
        "|" + "---|" * (len(columns) + 3),
    ]
    means = {}
    for size in sorted(by_size):
        m = means[size] = mean_split(by_size[size])
        lines.append(
            f"| {size} | {len(by_size[size])} | "
            + " | ".join(f"{m[c]:.2f}" for c in columns)
            + f" | {100 * m['sync'] / m['iteration']:.1f} % |"
        )
    sizes = sorted(means)
    if len(sizes) == 2:
        a, b = (means[s] for s in sizes)
        lines.append(
            f"| ratio {sizes[1]}/{sizes[0]} | | "
            + " | ".join(f"{b[c] / a[c]:.2f}" if a[c] else "-" for c in columns)
            + " | |"
        )
    # Side-by-side pairs (consecutive runs of the two sizes, as `run` makes them).
    pairs = [(x, y) for (sx, x), (sy, y) in zip(per_run[::2], per_run[1::2]) if sx != sy]
    if pairs:
        ratios = [y["iteration"] / x["iteration"] for x, y in pairs]
        lines.append("")
        lines.append(
            "iteration-time ratio of each side-by-side pair: "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + f" (median {statistics.median(ratios):.2f})"
        )
    return "\n".join(lines)


def train(args) -> list[str]:
    """The quickstart (fewer iterations, small validation) at each world size, alternating."""
    from tether.platform.config import load_config
    from tether.platform.run.trainer import Trainer

    run_ids = []
    for repeat in range(args.repeats):
        for size in args.world_sizes:
            overrides = [
                f"algo.learner_world_size={size}",
                f"trainer.iterations={args.iterations}",
                f"trainer.val_every={args.iterations}",
                f"trainer.val_episodes={args.val_episodes}",
                f"trainer.checkpoint_every={args.iterations}",
                f"experiment.output_dir={args.out}",
                f"experiment.run_name=lws{size}-r{repeat}",
            ]
            if args.model_cache:
                overrides.append(f"model.cache_dir={args.model_cache}")
            cfg = load_config(args.config, overrides + args.overrides)
            summary = Trainer(cfg).run()
            print(
                f"world size {size} repeat {repeat}: run {summary.run_id} "
                f"{summary.status} in {summary.seconds:.0f} s",
                flush=True,
            )
            run_ids.append(summary.run_id)
            uri = summary.tracking_uri
    args.tracking_uri = uri
    return run_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train at each world size (alternating), then the table")
    run.add_argument(
        "--config", default=str(Path(__file__).parents[1] / "experiments" / "quickstart.yaml")
    )
    run.add_argument("--iterations", type=int, default=4)
    run.add_argument("--repeats", type=int, default=2)
    run.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    run.add_argument("--val-episodes", type=int, default=8)
    run.add_argument("--model-cache", default=None, help="model.cache_dir (a warmed cache)")
    run.add_argument("--out", default="/tmp/tether_learner_world_size")
    run.add_argument("overrides", nargs="*", help="more dotted config overrides")
    show = sub.add_parser("table", help="the table from existing MLflow runs")
    show.add_argument("--tracking-uri", required=True)
    show.add_argument("run_ids", nargs="+")
    for p in (run, show):
        p.add_argument("--include-first", action="store_true", help="also average iteration 1")
    args = parser.parse_args()
    run_ids = train(args) if args.command == "run" else args.run_ids
    from mlflow.tracking import MlflowClient

    print(table(MlflowClient(args.tracking_uri), run_ids, args.include_first))


if __name__ == "__main__":
    main()
