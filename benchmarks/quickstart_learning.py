"""Does held-out success rise?  The test of the quickstart's learning target (issue 17).

For each finished run it reads ``val/success`` before training (step 0) and at the last
validation from the run's MLflow store, turns them back into success counts with the
run's ``trainer.val_episodes``, and tests "the last validation is above the first" with a
one-sided two-proportion z-test (unpooled standard error), per run and pooled over the
runs given (the same held-out levels at both points); each gain with its 95 % interval
(the same standard error).  The candidate **rises** when the pooled p is below
``--alpha`` and every run gains at least ``--min-gain`` (default 0: no run ends below its
own start; benchmarks/history/2026-11-24.md, "The quickstart's learning target,
2026-11-24 (commit d2a17ec) — protocol").  ``--figure`` draws each run's training
success per iteration and its two validations with Wilson 95 % intervals.

    python benchmarks/quickstart_learning.py --alpha 0.01 --min-gain 0.10 \\
        --figure quickstart.png runs/s38/mlflow.db runs/s39/mlflow.db runs/s40/mlflow.db
"""

from __future__ import annotations

import argparse
import math
import sqlite3
from dataclasses import dataclass

from scipy import stats


@dataclass
class Rise:
    first: int  # successes before training
    last: int  # successes at the last validation
    n: int  # held-out episodes at each point

    @property
    def gain(self) -> float:
        return (self.last - self.first) / self.n

    @property
    def p_value(self) -> float:
        """One-sided p of "last > first" (unpooled two-proportion z-test)."""
        p1, p0 = self.last / self.n, self.first / self.n
        se = math.sqrt((p1 * (1 - p1) + p0 * (1 - p0)) / self.n)
        if se == 0.0:
            return 0.0 if p1 > p0 else 1.0
        return float(stats.norm.sf((p1 - p0) / se))

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Normal-approximation interval of the gain (the test's standard error)."""
        p1, p0 = self.last / self.n, self.first / self.n
        half = stats.norm.ppf(0.5 + level / 2) * math.sqrt((p1 * (1 - p1) + p0 * (1 - p0)) / self.n)
        return self.gain - half, self.gain + half


def pooled(rises: list[Rise]) -> Rise:
    if len({r.n for r in rises}) != 1:
        raise ValueError("pooled test needs the same number of held-out episodes per run")
    return Rise(sum(r.first for r in rises), sum(r.last for r in rises), rises[0].n * len(rises))


def _last_run(db: str) -> tuple[sqlite3.Connection, str]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    run_id = con.execute("select run_uuid from runs order by start_time desc limit 1").fetchone()
    if run_id is None:
        raise SystemExit(f"{db}: no run in this MLflow store")
    return con, run_id[0]


def _curve(con: sqlite3.Connection, run_id: str, key: str) -> list[tuple[int, float]]:
    return con.execute(
        "select step, value from metrics where run_uuid=? and key=? order by step", (run_id, key)
    ).fetchall()


@dataclass
class Run:
    """One finished run as the test and the figure read it from its store."""

    run_id: str
    label: str  # "seed <experiment.seed>"
    rise: Rise
    #: (step, value) of val/success and of the Wilson interval the run logged beside it
    val: list[tuple[int, float]]
    val_low: list[tuple[int, float]]
    val_high: list[tuple[int, float]]
    train: list[tuple[int, float]]  # rollout/success per iteration


def read_run(db: str) -> Run:
    """The last run in an MLflow SQLite store."""
    con, run_id = _last_run(db)
    rows = _curve(con, run_id, "val/success")

    def param(key):
        row = con.execute(
            "select value from params where run_uuid=? and key=?", (run_id, key)
        ).fetchone()
        return row and row[0]

    episodes = param("trainer.val_episodes")
    if len(rows) < 2 or episodes is None:
        raise SystemExit(f"{db}: run {run_id} has no validation after training (unfinished?)")
    n = int(episodes)
    seed = param("experiment.seed")
    return Run(
        run_id,
        f"seed {seed}" if seed is not None else run_id[:8],
        Rise(round(rows[0][1] * n), round(rows[-1][1] * n), n),
        rows,
        _curve(con, run_id, "val/success_ci_low"),
        _curve(con, run_id, "val/success_ci_high"),
        _curve(con, run_id, "rollout/success"),
    )


def draw(runs: list[Run], path: str) -> None:
    """Training success per iteration of each run (thin) and its validations before and
    after training (points with the Wilson 95 % intervals the run logged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, run in enumerate(runs):
        color = f"C{k}"
        ax.plot([s for s, _ in run.train], [v for _, v in run.train], color=color, lw=1, alpha=0.6)
        ends = [0, -1]  # before training, the last validation
        values = [run.val[i][1] for i in ends]
        ax.errorbar(
            [run.val[i][0] + 0.3 * k for i in ends],
            values,
            yerr=[
                [v - run.val_low[i][1] for v, i in zip(values, ends)],
                [run.val_high[i][1] - v for v, i in zip(values, ends)],
            ],
            fmt="o",
            color=color,
            capsize=3,
            label=f"{run.label}: held-out {values[0]:.3f} → {values[1]:.3f}",
        )
    ax.set_xlabel("iteration")
    ax.set_ylabel("success")
    ax.set_ylim(0, 1)
    ax.set_title("Training success per iteration (lines), held-out success (points, 95 %)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", help="MLflow SQLite files, one finished run each")
    parser.add_argument("--alpha", type=float, default=0.05, help="one-sided level")
    parser.add_argument(
        "--min-gain", type=float, default=0.0, help="every run must gain at least this much"
    )
    parser.add_argument("--figure", help="write the curves to this image file")
    args = parser.parse_args()
    print(f"{'run':34} {'first':>7} {'last':>7} {'gain':>7} {'95 % interval':>18} {'p':>7}")

    def row(name: str, rise: Rise, p: str) -> str:
        low, high = rise.interval()
        return (
            f"{name:34} {rise.first / rise.n:7.3f} {rise.last / rise.n:7.3f} "
            f"{rise.gain:+7.3f} [{low:+.3f}, {high:+.3f}]".ljust(78)
            + p
        )

    runs = [read_run(db) for db in args.stores]
    rises = [run.rise for run in runs]
    for run in runs:
        print(row(run.run_id, run.rise, f"{run.rise.p_value:7.4f}"))
    total = pooled(rises)
    print(row(f"pooled ({len(rises)} runs, {total.n} a point)", total, f"{total.p_value:7.1e}"))
    each = all(r.last - r.first >= args.min_gain * r.n - 1e-9 for r in rises)
    verdict = total.p_value < args.alpha and each
    print(
        f"{'RISES' if verdict else 'does not rise'}: pooled one-sided p "
        f"{'<' if total.p_value < args.alpha else '>='} {args.alpha}; every run gains "
        f">= {args.min_gain:+.3f}: {'yes' if each else 'no'}"
    )
    if args.figure:
        draw(runs, args.figure)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
