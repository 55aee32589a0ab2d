"""Iterations per minute with asynchronous rollouts (``rollout.max_staleness`` = 0, 1, 2),
the cores split between rollout and learner or both stages on all of them, side by side.

    # the quickstart, 10 iterations per arm, arms interleaved, 2 rounds; the table at the end
    python benchmarks/async_rollouts.py --iterations 10 --repeats 2 --out /tmp/async_bench
    # smoke check (seconds-scale): the micro model, tiny batches
    python benchmarks/async_rollouts.py --iterations 4 --repeats 1 --warmup 1 \\
        --config experiments/micro.yaml --out /tmp/async_smoke \\
        --set rollout.groups=2 rollout.group_size=2 trainer.val_episodes=2

Arms (``--arms``; ``shared-k0`` is the baseline every ratio is against):

- ``shared-k<k>``: one rollout worker and the learner each get all ``--cores`` cores'
  torch threads (``rollout.num_cpus_per_worker`` = ``algo.num_cpus`` = ``algo.threads`` =
  cores): today's loop, each stage on every core in turn;
- ``split-k<k>``: the cores are split, ``--rollout-cores`` to one worker and the rest
  to the learner, so with k >= 1 both stages run at once, each on its own cores.

What is measured: the wall time between consecutive iterations' ends (the driver's
``iteration`` events), the first ``--warmup`` iterations left out (fresh actors, first
collections) and the last (it holds the end-of-run validation); iterations per
minute = 60 / its mean.  The ratio to the baseline has a
95 % bootstrap interval over those per-iteration times (both arms resampled), and every
round's arms run one after the other (A B C ... A B C ...) so they share the machine's
load.  Also per arm: the peak resident memory of the run's processes
(``system/peak_rss_gb``, the max over iterations, and the largest single worker and
learner) and the mean staleness of the trained batches.  Validation runs once, at the
end (not timed), checkpoints never.

Writes ``<out>/async_rollouts.json`` (every interval time, per arm and round) and
``<out>/async_rollouts.md`` (the table).

Learning and I(X;Z) by staleness (``--learning``): the runs of a sweep over
``rollout.max_staleness`` and ``experiment.seed`` (``experiments/async_staleness.yaml``),
read back from MLflow; per k, final held-out success and the probe set's I(X;Z) at the
last diagnosed iteration (mean over seeds, 95 % t interval), and each against k = 0
paired by seed (mean difference, 95 % t interval):

    tether sweep experiments/async_staleness.yaml
    python benchmarks/async_rollouts.py --learning <parent run id> \
        --tracking-uri sqlite:///$HOME/tether_runs/async_staleness/mlflow.db
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parents[1]


def arm_overrides(arm: str, cores: int, rollout_cores: int) -> list[str]:
    """The config overrides of an arm named ``shared-k<k>`` or ``split-k<k>``."""
    layout, _, k = arm.partition("-k")
    if layout not in ("shared", "split") or not k.isdigit():
        raise SystemExit(f"unknown arm {arm!r}: shared-k<k> or split-k<k>")
    worker, learner = (
        (cores, cores) if layout == "shared" else (rollout_cores, cores - rollout_cores)
    )
    if learner < 1:
        raise SystemExit(f"--rollout-cores {rollout_cores} leaves the learner no core")
    return [
        f"rollout.max_staleness={k}",
        "rollout.num_workers=1",
        f"rollout.num_cpus_per_worker={worker}",
        f"algo.num_cpus={learner}",
        f"algo.threads={learner}",
        f"ray.num_cpus={worker + learner}",
    ]


class IterationClock:
    """Driver-event hook: the time each iteration ended and its metrics."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.metrics: list[dict] = []

    def __call__(self, kind: str, data: dict) -> None:
        if kind == "started":
            self.ends = [time.perf_counter()]
        elif kind == "iteration":
            self.ends.append(time.perf_counter())
            self.metrics.append(data)


def run_arm(arm: str, repeat: int, args) -> dict:
    from tether.platform.config import load_config
    from tether.platform.run.trainer import Trainer

    overrides = [
        *arm_overrides(arm, args.cores, args.rollout_cores),
        f"trainer.iterations={args.iterations}",
        f"trainer.val_every={args.iterations}",
        "trainer.checkpoint_every=0",
        "trainer.samples_per_log=0",
        "tracking.log_model=false",
        f"experiment.output_dir={args.out}",
        f"experiment.run_name=async-{arm}-r{repeat}",
    ]
    if args.model_cache:
        overrides.append(f"model.cache_dir={args.model_cache}")
    cfg = load_config(args.config, overrides + args.overrides)
    clock = IterationClock()
    summary = Trainer(cfg, on_event=clock).run()
    # The first interval holds the start-up validation, the last the end-of-run one.
    intervals = np.diff(clock.ends)[1 + args.warmup : -1].tolist()

    def peak(prefix: str) -> float:
        values = [v for m in clock.metrics for k, v in m.items() if k.startswith(prefix)]
        return max(values, default=float("nan"))

    staleness = [m["async/staleness_mean"] for m in clock.metrics if "async/staleness_mean" in m]
    return {
        "arm": arm,
        "repeat": repeat,
        "run_id": summary.run_id,
        "status": summary.status,
        "intervals_s": intervals,
        "peak_rss_gb_total": peak("system/peak_rss_gb"),
        "peak_rss_gb_worker": peak("system/peak_rss_gb/rollout_worker"),
        "peak_rss_gb_learner": peak("system/peak_rss_gb/learner"),
        "staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
    }


def ratio_interval(base: list[float], other: list[float], seed: int = 0, n: int = 2000):
    """Speed-up of ``other`` over ``base`` (mean base time / mean other time) and its 95 %
    bootstrap interval, both arms' per-iteration times resampled."""
    rng = np.random.default_rng(seed)
    base_a, other_a = np.asarray(base), np.asarray(other)
    draws = [
        rng.choice(base_a, base_a.size).mean() / rng.choice(other_a, other_a.size).mean()
        for _ in range(n)
    ]
    return base_a.mean() / other_a.mean(), *np.percentile(draws, [2.5, 97.5])


def table(results: list[dict], baseline: str) -> str:
    by_arm: dict[str, list[dict]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], []).append(r)
    times = {arm: [t for r in rs for t in r["intervals_s"]] for arm, rs in by_arm.items()}
    lines = [
        f"| arm | iterations timed | s / iteration | iterations / min | ratio to {baseline} "
        "(95 % CI) | peak RSS GB (all / worker / learner) | mean staleness |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, rs in by_arm.items():
        t = times[arm]
        if not t:
            lines.append(f"| {arm} | 0 | – | – | – | – | – |")
            continue
        if baseline in times and times[baseline]:
            ratio, low, high = ratio_interval(times[baseline], t)
            ratio_text = f"{ratio:.2f} ({low:.2f}–{high:.2f})"
        else:
            ratio_text = "–"
        lines.append(
            f"| {arm} | {len(t)} | {np.mean(t):.2f} | {60 / np.mean(t):.2f} | {ratio_text} | "
            f"{max(r['peak_rss_gb_total'] for r in rs):.2f} / "
            f"{max(r['peak_rss_gb_worker'] for r in rs):.2f} / "
            f"{max(r['peak_rss_gb_learner'] for r in rs):.2f} | "
            f"{np.mean([r['staleness_mean'] for r in rs]):.2f} |"
        )
    return "\n".join(lines)


def staleness_of(run) -> str:
    return str(int(float(run.param("rollout.max_staleness") or 0)))


def load_sweep(tracking_uri: str, parent: str) -> list:
    """The sweep's runs with their metric histories (``async/*`` included), no artifacts."""
    from mlflow import MlflowClient

    from tether.analysis.source import ReportError, load_run, resolve

    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        target = resolve(client, parent)
    except ReportError as exc:
        raise SystemExit(f"error: {exc}") from None
    runs = [load_run(client, r, with_prompts=False, with_prompt_mi=False) for r in target.runs]
    return [r for r in runs if r.param("rollout.max_staleness") is not None]


def learning_table(runs: list) -> str:
    """Final success and probe I(X;Z) by staleness k, and each k against k = 0 by seed."""
    from tether.analysis.runs import VAL_SUCCESS
    from tether.analysis.stats import final_success, paired_gain, t_interval
    from tether.analysis.verdicts import PROBE_MI

    def probe_mi(run) -> float | None:
        return run.last(PROBE_MI)

    def run_mean(r, key: str, reduce=np.mean) -> float:
        _, values = r.series(key)
        return float(reduce(values)) if values.size else float("nan")

    def cell(t: dict, sign: str = "+") -> str:
        if t["n"] < 2:
            return f"{t['mean']:.3f} (n = {t['n']})"
        return f"{t['mean']:{sign}.3f} [{t['ci_low']:{sign}.3f}, {t['ci_high']:{sign}.3f}]"

    arms: dict[str, list] = {}
    for r in sorted(runs, key=lambda r: (int(staleness_of(r)), str(r.param("experiment.seed")))):
        arms.setdefault(staleness_of(r), []).append(r)
    lines = [
        "| k | seeds | final success | probe I(X;Z) | success − k=0 (paired) "
        "| probe I(X;Z) − k=0 (paired) | mean staleness |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, arm in arms.items():
        row = [
            k,
            str(len(arm)),
            cell(t_interval([final_success(r) for r in arm]), "-"),
            cell(t_interval([probe_mi(r) for r in arm]), "-"),
        ]
        for value in (final_success, probe_mi):
            gain = k != "0" and paired_gain(runs, k, "0", value, arm=staleness_of)["all"]
            row.append(cell(gain) if gain else "–")
        # mean over each run's trained batches (k = 0 logs none: 0)
        staleness = [run_mean(r, "async/staleness_mean") if k != "0" else 0.0 for r in arm]
        row.append(f"{np.mean(staleness):.2f}")
        lines.append("| " + " | ".join(row) + " |")

    lines += [
        "",
        "| k | IS weight: mean / max | clipped fraction | behaviour-learner KL (mean / max) |",
        "|---|---|---|---|",
    ]
    for k, arm in arms.items():
        lines.append(
            f"| {k} | {np.mean([run_mean(r, 'async/is_weight_mean') for r in arm]):.3f} / "
            f"{max(run_mean(r, 'async/is_weight_max', np.max) for r in arm):.2f} | "
            f"{np.mean([run_mean(r, 'async/is_clipped_frac') for r in arm]):.4f} | "
            f"{np.mean([run_mean(r, 'async/behaviour_kl') for r in arm]):.4f} / "
            f"{max(run_mean(r, 'async/behaviour_kl', np.max) for r in arm):.4f} |"
        )

    def fmt(x, lo, hi):
        if x is None:
            return "–"
        return f"{x:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None else "")

    lines += [
        "",
        "| run | k | seed | final success [Wilson] | probe I(X;Z) [interval] |",
        "|---|---|---|---|---|",
    ]
    for k, arm in arms.items():
        for r in arm:
            final = max((s for s in r.metrics.get(VAL_SUCCESS, {}) if s > 0), default=None)
            low = r.metrics.get(f"{VAL_SUCCESS}_ci_low", {}).get(final)
            high = r.metrics.get(f"{VAL_SUCCESS}_ci_high", {}).get(final)
            mi_low, mi_high = r.last(f"{PROBE_MI}_ci_low"), r.last(f"{PROBE_MI}_ci_high")
            lines.append(
                f"| {r.run_id[:8]} | {k} | {r.param('experiment.seed')} | "
                f"{fmt(r.final_success(), low, high)} | {fmt(probe_mi(r), mi_low, mi_high)} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "experiments" / "quickstart.yaml"))
    parser.add_argument(
        "--arms",
        nargs="+",
        default=["shared-k0", "split-k0", "split-k1", "split-k2", "shared-k1"],
    )
    parser.add_argument("--baseline", default="shared-k0")
    parser.add_argument("--cores", type=int, default=2, help="cores the run may use")
    parser.add_argument("--rollout-cores", type=int, default=1, help="split arms: the worker's")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out at the start")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of all arms")
    parser.add_argument("--model-cache", default=None, help="model.cache_dir (a warmed cache)")
    parser.add_argument("--out", default="/tmp/tether_async_rollouts")
    parser.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="more dotted config overrides",
    )
    parser.add_argument("--learning", metavar="PARENT", help="the staleness sweep's parent run")
    parser.add_argument("--tracking-uri", help="--learning: where the sweep logged")
    args = parser.parse_args()
    if args.learning:
        print(learning_table(load_sweep(args.tracking_uri, args.learning)))
        return
    if args.iterations < args.warmup + 2:
        raise SystemExit("--iterations must be at least --warmup + 2 (the last is not timed)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for repeat in range(args.repeats):
        for arm in args.arms:
            result = run_arm(arm, repeat, args)
            results.append(result)
            print(
                f"{arm} round {repeat}: {result['status']}, "
                f"{np.mean(result['intervals_s']):.2f} s / iteration",
                flush=True,
            )
            (out / "async_rollouts.json").write_text(json.dumps(results, indent=1))
    text = table(results, args.baseline)
    (out / "async_rollouts.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
