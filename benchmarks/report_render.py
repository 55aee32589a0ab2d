"""Report figure rendering: the shipped path (one matplotlib draw, one plotly figure per
figure, reused in report.html) vs the naive one (savefig with bbox_inches="tight", which
draws twice, and the plotly figure built again for report.html). Same runs, same
figures, alternating A B A B in one process; prints the per-round times and the ratio.

    python benchmarks/report_render.py sqlite:////tmp/report_sweeps/mlflow.db <run id> [rounds]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt

from tether.analysis.render import save, to_matplotlib, to_plotly
from tether.analysis.report import ReportSettings, analyse
from tether.analysis.source import load_target


def shipped(figures, out: Path) -> None:
    interactive = [save(f, out) for f in figures]
    html = [
        fig.to_html(full_html=False, include_plotlyjs=k == 0) for k, fig in enumerate(interactive)
    ]
    (out / "report.html").write_text("".join(html))


def naive(figures, out: Path) -> None:
    for f in figures:
        fig = to_matplotlib(f)
        fig.savefig(out / f"{f.name}.png", dpi=100, bbox_inches="tight")
        plt.close(fig)
        to_plotly(f).write_html(out / f"{f.name}.html", include_plotlyjs="cdn")
    html = [
        to_plotly(f).to_html(full_html=False, include_plotlyjs=k == 0)
        for k, f in enumerate(figures)
    ]
    (out / "report.html").write_text("".join(html))


def main() -> None:
    uri, target = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    _, runs = load_target(uri, target)
    _, figures, _ = analyse(runs, ReportSettings())
    times = {"naive": [], "shipped": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for name, fn in (("naive", naive), ("shipped", shipped)):
                start = time.perf_counter()
                fn(figures, Path(tmp))
                times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        print(f"{name:8s} {' '.join(f'{v:.2f}' for v in values)} s")
    ratios = [n / s for n, s in zip(times["naive"], times["shipped"])]
    print(
        f"{len(figures)} figures; naive/shipped per round: "
        f"{' '.join(f'{r:.2f}' for r in ratios)}; median {sorted(ratios)[len(ratios) // 2]:.2f}"
    )


if __name__ == "__main__":
    main()
