"""``tether report``: every cross-run analysis (docs/methods.md, section 13) over a set of
runs, as figures and one HTML page.

``build_report(runs, out_dir)`` is pure of MLflow: it writes ``<figure>.png`` and
``<figure>.html`` per figure, ``report.json`` (every number) and ``report.html`` (the
tables and interactive figures, plotly embedded: opens offline, and from the MLflow
UI once logged as artifacts), and returns the numbers.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from . import stats, views
from .render import Figure, save
from .runs import COMPARED_DIAGNOSTICS, SUCCESS, RunData, collapse_key


@dataclass
class ReportSettings:
    sampling: str = "first_turn"  # which cross-scoring sampling the analyses use
    mi_name: str = "mi_estimate"  # the I(X;Z) proxy of quartiles, regimes, sensitivity
    success_key: str = SUCCESS
    confidence: float = 0.95
    max_heatmap_runs: int = 8
    alpha: float = 0.05  # significance of the input-dependence test (regimes)
    entropy_threshold: float = stats.ENTROPY_THRESHOLD  # H(Z|X) nats/token: high vs low


@dataclass
class Report:
    title: str
    out_dir: Path
    sections: dict[str, stats.Result] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    #: figure name -> its plotly figure (drawn once, embedded in report.html)
    interactive: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def numbers(self) -> dict:
        return {name: {"rows": r.rows, "notes": r.notes} for name, r in self.sections.items()}


def swept_field_names(runs: list[RunData]) -> list[str]:
    return sorted(
        {k[len("sweep.param.") :] for r in runs for k in r.tags if k.startswith("sweep.param.")}
    )


def analyse(
    runs: list[RunData], settings: ReportSettings, sweep_base: dict | None = None
) -> tuple[dict, list[Figure], list[str]]:
    s, mi_key = settings.sampling, collapse_key(settings.sampling, settings.mi_name)
    notes: list[str] = []
    sections = {
        "spearman": stats.spearman_table(
            runs, s, COMPARED_DIAGNOSTICS, settings.success_key, settings.confidence
        ),
        "spearman_by_run": stats.spearman_by_run_bootstrap(
            runs,
            s,
            COMPARED_DIAGNOSTICS,
            success_key=settings.success_key,
            confidence=settings.confidence,
        ),
        # prompt groups, the paper's unit; the MI is each prompt's pointwise share of
        # mi_estimate whatever settings.mi_name is (no other proxy splits by prompt)
        "rv_quartiles": stats.rv_quartiles(runs),
        "regimes": stats.regimes(
            runs,
            s,
            mi_name=settings.mi_name,
            alpha=settings.alpha,
            entropy_threshold=settings.entropy_threshold,
        ),
        "stochasticity": stats.stochasticity_curves(runs),
    }
    fields = [f for f in swept_field_names(runs) if f != "env.stochasticity"]
    # Trials compare best on one fixed prompt set: the probe's I(X;Z) when every run has it.
    probe_key = collapse_key("probe", settings.mi_name)
    sensitivity_key = probe_key if runs and all(r.has(probe_key) for r in runs) else mi_key
    if fields:
        sections["sensitivity"] = stats.sensitivity_trajectories(
            runs, fields, sensitivity_key, sweep_base
        )
        sections["sensitivity"].notes.append(f"I(X;Z): {sensitivity_key}, its last value")
    else:
        notes.append(
            "hyperparameter sensitivity: the runs are not sweep trials (no sweep.param.* tags)"
        )
    figures = [
        views.spearman_figure(sections["spearman"], s),
        views.quartile_figure(sections["rv_quartiles"]),
        views.stochasticity_figure(sections["stochasticity"]),
        views.sensitivity_figure(sections["sensitivity"], sensitivity_key) if fields else None,
        views.regime_figure(sections["regimes"], s),
        views.collapse_figure(runs, s, notes),
        views.probe_figure(runs, notes),
        views.dynamics_figure(runs, notes),
        views.async_figure(runs),
        views.mechanism_figure(runs),
    ]
    with_prompts = [r for r in runs if r.prompts]
    figures += [views.heatmap_figure(r) for r in with_prompts[: settings.max_heatmap_runs]]
    if not with_prompts:
        notes.append("prompt-level heatmaps: no run logged prompts/iter_N.json")
    for name, result in sections.items():
        notes += [f"{name}: {n}" for n in result.notes]
    return sections, [f for f in figures if f is not None], notes


def build_report(
    runs: list[RunData],
    out_dir: Path,
    title: str,
    settings: ReportSettings | None = None,
    sweep_base: dict | None = None,
) -> Report:
    settings = settings or ReportSettings()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sections, figures, notes = analyse(runs, settings, sweep_base)
    report = Report(title, out_dir, sections, figures, notes=notes)
    for figure in figures:
        report.interactive[figure.name] = save(figure, out_dir)
        report.files += [f"{figure.name}.png", f"{figure.name}.html"]
    numbers = {
        "title": title,
        "runs": [
            {
                "run_id": r.run_id,
                "name": r.name,
                "status": r.status,
                "iterations": r.latest_iteration,
                "final_success": r.final_success(),
                "alarms": r.alarm_steps(),
            }
            for r in runs
        ],
        "settings": settings.__dict__,
        "notes": notes,
        **report.numbers(),
    }
    (out_dir / "report.json").write_text(json.dumps(numbers, indent=1, default=_json_default))
    (out_dir / "report.html").write_text(render_html(report, runs))
    report.files += ["report.json", "report.html"]
    return report


def _json_default(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def _cell(value) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
    return html.escape(str(value))


def table_html(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "<p class='note'>no rows</p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


SECTION_TITLES = {
    "spearman": "Spearman correlation of each diagnostic with task success",
    "spearman_by_run": "Spearman correlation with success, intervals by resampling whole runs; "
    "difference from H(Z|X)'s",
    "rv_quartiles": "Success and MI by reward-variance quartile of prompts",
    "regimes": "Regime of each run (last diagnosed iteration)",
    "stochasticity": "Success vs stochasticity, filter vs none",
    "sensitivity": "Hyperparameter sensitivity",
}


def render_html(report: Report, runs: list[RunData]) -> str:
    parts = [
        f"<h1>{html.escape(report.title)}</h1>",
        "<h2>Runs</h2>",
        table_html(
            [
                {
                    "run": r.name,
                    "run_id": r.run_id,
                    "status": r.status,
                    "iterations": r.latest_iteration,
                    "final success": r.final_success()
                    if r.final_success() is not None
                    else math.nan,
                    "alarms": ", ".join(f"{n}@{s}" for s, n in r.alarm_steps()) or "none",
                }
                for r in runs
            ]
        ),
    ]
    if report.notes:
        parts.append(
            "<h2>Not shown, and why</h2><ul>"
            + "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
            + "</ul>"
        )
    for name, result in report.sections.items():
        rows = [{k: v for k, v in r.items() if k != "run_id"} for r in result.rows]
        parts.append(f"<h2>{SECTION_TITLES[name]}</h2>" + table_html(rows))
    first = True
    for figure in report.figures:
        parts.append(f"<h2 id='{figure.name}'>{html.escape(figure.title)}</h2>")
        parts.append(
            report.interactive[figure.name].to_html(full_html=False, include_plotlyjs=first)
        )
        parts.append(
            f"<p class='files'>files: <code>{figure.name}.png</code>, "
            f"<code>{figure.name}.html</code></p>"
        )
        first = False
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
        "padding:2px 6px;text-align:right}th{background:#eee}.note{color:#777}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>"
        f"{html.escape(report.title)}</title><style>{style}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>"
    )


def log_report(tracker, out_dir: Path, artifact_path: str = "report") -> None:
    """Attach the report to the tracker's run (a sweep's parent, or the run itself)."""
    tracker.log_artifacts(out_dir, artifact_path)
