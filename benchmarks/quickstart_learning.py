"""Does held-out success rise?  The test of the quickstart's learning target (issue 17).

For each finished run it reads ``val/success`` before training (step 0) and at the last
validation from the run's MLflow store, turns them back into success counts with the
run's ``trainer.val_episodes``, and tests "the last validation is above the first" with a
one-sided two-proportion z-test (unpooled standard error), per run and pooled over the
runs given (the same held-out levels at both points).  The candidate **rises** when the
pooled p is below ``--alpha`` and no run ends below its own start (benchmarks/history/2026-11-24.md,
"The quickstart's learning target, 2026-11-24 (commit d2a17ec) — protocol").

    python benchmarks/quickstart_learning.py --alpha 0.025 \\
        /tmp/qs/runs/A-s0/mlflow.db /tmp/qs/runs/A-s1/mlflow.db /tmp/qs/runs/A-s2/mlflow.db
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


def pooled(rises: list[Rise]) -> Rise:
    if len({r.n for r in rises}) != 1:
        raise ValueError("pooled test needs the same number of held-out episodes per run")
    return Rise(sum(r.first for r in rises), sum(r.last for r in rises), rises[0].n * len(rises))


def read_run(db: str) -> tuple[str, Rise]:
    """(run id, Rise) of the last run in an MLflow SQLite store."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    run_id = con.execute("select run_uuid from runs order by start_time desc limit 1").fetchone()
    if run_id is None:
        raise SystemExit(f"{db}: no run in this MLflow store")
    run_id = run_id[0]
    rows = con.execute(
        "select step, value from metrics where run_uuid=? and key='val/success' order by step",
        (run_id,),
    ).fetchall()
    episodes = con.execute(
        "select value from params where run_uuid=? and key='trainer.val_episodes'", (run_id,)
    ).fetchone()
    if len(rows) < 2 or episodes is None:
        raise SystemExit(f"{db}: run {run_id} has no validation after training (unfinished?)")
    n = int(episodes[0])
    return run_id, Rise(round(rows[0][1] * n), round(rows[-1][1] * n), n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", help="MLflow SQLite files, one finished run each")
    parser.add_argument("--alpha", type=float, default=0.05, help="one-sided level")
    args = parser.parse_args()
    rises = []
    print(f"{'run':34} {'first':>7} {'last':>7} {'gain':>7} {'p':>7}")
    for db in args.stores:
        run_id, rise = read_run(db)
        rises.append(rise)
        print(
            f"{run_id:34} {rise.first / rise.n:7.3f} {rise.last / rise.n:7.3f} "
            f"{rise.gain:+7.3f} {rise.p_value:7.4f}"
        )
    total = pooled(rises)
    verdict = total.p_value < args.alpha and all(r.last >= r.first for r in rises)
    print(
        f"pooled ({len(rises)} runs, {total.n} episodes a point): {total.first / total.n:.3f} -> "
        f"{total.last / total.n:.3f}, gain {total.gain:+.3f}, one-sided p {total.p_value:.4f}; "
        f"{'RISES' if verdict else 'does not rise'} (alpha {args.alpha}, no run below its start)"
    )


if __name__ == "__main__":
    main()
