"""The report's figures as ``render.Figure`` descriptions (pure: numbers in, panels out)."""

from __future__ import annotations

import math

import numpy as np

from ..diagnostics.proxies import PROXIES
from .render import PALETTE, Figure, Panel, Series
from .runs import (
    KEPT_RATIO,
    READING_ACC,
    READING_DEFINED,
    REASONING_LENGTH,
    REWARD_STD,
    SUCCESS,
    VAL_SUCCESS,
    ZERO_VARIANCE,
    RunData,
    collapse_key,
)
from .stats import Result


def _at(run: RunData, key: str, steps) -> list[float] | None:
    """``key`` at each of ``steps``, or None unless logged at all of them."""
    points = run.metrics.get(key, {})
    return [points[int(s)] for s in steps] if all(int(s) in points for s in steps) else None


def curve_panel(runs: list[RunData], key: str, title: str, ylabel: str = "") -> Panel | None:
    """One line per run that logged ``key``, with the alarms that concern it; its interval
    (``key_ci_low``/``_ci_high``) as a band and its null level (``key_null_q95``, the
    permutation null's 95th percentile) as a dashed line, where the run logged them."""
    panel = Panel(title, "iteration", ylabel or key.split("/")[-1])
    for k, run in enumerate(r for r in runs if r.has(key)):
        steps, values = run.series(key)
        low, high = _at(run, f"{key}_ci_low", steps), _at(run, f"{key}_ci_high", steps)
        color = PALETTE[k % len(PALETTE)]
        panel.series.append(
            Series(
                run.name,
                steps.tolist(),
                values.tolist(),
                mode="lines+markers" if len(steps) < 30 else "lines",
                error=(low, high) if low and high else None,
                color=color,
            )
        )
        null = _at(run, f"{key}_null_q95", steps)
        if null:
            panel.series.append(
                Series(
                    f"{run.name}: null 95%",
                    steps.tolist(),
                    null,
                    mode="lines",
                    color=color,
                    dash=True,
                )
            )
        panel.vlines += [
            (step, f"{name} ({run.name})" if len(runs) > 1 else name)
            for step, name in run.alarms_for(key)
        ]
    return panel if panel.series else None


def panels_or_note(specs, runs, notes: list[str], what: str) -> list[Panel]:
    panels = []
    for key, title in specs:
        panel = curve_panel(runs, key, title)
        if panel is None:
            notes.append(f"{what}: no run logged {key}")
        else:
            panels.append(panel)
    return panels


def spearman_figure(result: Result, sampling: str) -> Figure | None:
    rows = [r for r in result.rows if not math.isnan(r["rho"])]
    if not rows:
        return None
    low = [r["ci_low"] if not math.isnan(r["ci_low"]) else r["rho"] for r in rows]
    high = [r["ci_high"] if not math.isnan(r["ci_high"]) else r["rho"] for r in rows]
    panel = Panel(
        f"Spearman ρ with success ({sampling}; n = {rows[0]['n']} checkpoints)",
        "diagnostic",
        "Spearman ρ",
        zero_line=True,
        series=[
            Series(
                "ρ (95% CI)",
                [r["diagnostic"] for r in rows],
                [r["rho"] for r in rows],
                mode="bar",
                error=(low, high),
            )
        ],
    )
    return Figure(
        "spearman",
        "Diagnostics vs task success (RAGEN-2: MI-ZScore +0.39, entropies −0.11 to −0.14)",
        [panel],
        columns=1,
    )


def quartile_figure(result: Result) -> Figure | None:
    """Finding d: success and pointwise MI of prompt groups by reward-variance quartile."""
    if not result.rows:
        return None
    labels = [f"Q{r['quartile']}" for r in result.rows]
    panels = [
        Panel(
            "success by reward-variance quartile of prompts",
            "RV quartile",
            "success",
            series=[Series("success", labels, [r["success"] for r in result.rows], mode="bar")],
        )
    ]
    if any(not math.isnan(r["mi"]) for r in result.rows):
        panels.append(
            Panel(
                "MI by reward-variance quartile of prompts",
                "RV quartile",
                "pointwise MI (nats/token)",
                series=[
                    Series(
                        "MI", labels, [r["mi"] for r in result.rows], mode="bar", color="#2ca02c"
                    )
                ],
            )
        )
    return Figure(
        "rv_quartiles", "Task success and MI by reward-variance quartile of prompts", panels
    )


def stochasticity_figure(result: Result) -> Figure | None:
    if not result.rows:
        return None
    x = [100 * r["stochasticity"] for r in result.rows]
    panel = Panel("final success vs stochasticity", "stochasticity (%)", "success")
    for label in ("filter", "none"):
        points = [(xi, r[label]) for xi, r in zip(x, result.rows) if not math.isnan(r[label])]
        if points:
            panel.series.append(Series(label, [p[0] for p in points], [p[1] for p in points]))
    gains = [(xi, r["gain"]) for xi, r in zip(x, result.rows) if not math.isnan(r["gain"])]
    panels = [panel]
    if gains:
        panels.append(
            Panel(
                "filter gain (filter − none)",
                "stochasticity (%)",
                "Δ success",
                zero_line=True,
                series=[Series("gain", [g[0] for g in gains], [g[1] for g in gains])],
            )
        )
    return Figure("stochasticity", "Success vs stochasticity, SNR filter vs none", panels)


def _success_bounds(rows: list[dict]) -> tuple[list, list] | None:
    """The rows' success intervals as error bounds (None when none has one)."""
    low = [r["success_ci_low"] for r in rows]
    high = [r["success_ci_high"] for r in rows]
    if all(math.isnan(v) for v in low + high):
        return None
    return low, high


def sensitivity_figure(result: Result, mi_key: str) -> Figure | None:
    fields = list(dict.fromkeys(r["field"] for r in result.rows))
    if not fields:
        return None
    panels = []
    for f in fields:
        rows = [r for r in result.rows if r["field"] == f]
        bounds = _success_bounds(rows)
        if all(math.isnan(r["mi"]) for r in rows):
            values = [str(r["value"]) for r in rows]
            series = [Series(f, values, [r["success"] for r in rows], "bar", error=bounds)]
            panels.append(Panel(f"{f}: success by value (95% CI)", f, "success", series=series))
            continue
        mi, success = [r["mi"] for r in rows], [r["success"] for r in rows]
        series = [Series(f, mi, success, text=[f"{r['value']}" for r in rows])]
        if bounds is not None:  # the bars on their own markers: a line's band would follow x
            series.append(Series("success, 95% CI", mi, success, "markers", error=bounds))
        panels.append(
            Panel(
                f"{f}: (MI, success) as it varies",
                mi_key.removeprefix("collapse/"),
                "success",
                series=series,
            )
        )
    return Figure(
        "sensitivity",
        "Hyperparameter sensitivity: each swept value's (I(X;Z), success), mean over its trials",
        panels,
    )


def regime_figure(result: Result, sampling: str) -> Figure | None:
    paths = result.extra.get("paths")
    if not paths:
        return None
    rows = {r["run_id"]: r for r in result.rows}
    panel = Panel(
        f"runs in the (H(Z|X), I(X;Z)) plane ({sampling})",
        "H(Z|X) estimate",
        "I(X;Z) estimate",
        vlines=[(result.extra["entropy_threshold"], "entropy threshold")],
        zero_line=True,
    )
    for k, (run_id, (steps, h, mi)) in enumerate(paths.items()):
        row, color = rows[run_id], PALETTE[k % len(PALETTE)]
        panel.series.append(
            Series(
                row["run"], h.tolist(), mi.tolist(), color=color, text=[f"it {s}" for s in steps]
            )
        )
        if row["mi_ci_low"] is not None and row["mi_ci_high"] is not None:
            panel.series.append(
                Series(
                    f"{row['run']}: {row['regime']}",
                    [row["entropy"]],
                    [row["mi"]],
                    mode="markers",
                    color=color,
                    error=([row["mi_ci_low"]], [row["mi_ci_high"]]),
                )
            )
    return Figure(
        "regimes", "Regimes: runs as paths, last point with its interval", [panel], columns=1
    )


def dynamics_figure(runs: list[RunData], notes: list[str]) -> Figure | None:
    specs = [
        (KEPT_RATIO, "kept ratio"),
        (ZERO_VARIANCE, "zero-variance groups"),
        (REWARD_STD, "in-group reward std (RV)"),
        (SUCCESS, "rollout success"),
        (VAL_SUCCESS, "validation success"),
        (REASONING_LENGTH, "reasoning length"),
    ]
    panels = panels_or_note(specs, runs, notes, "training dynamics")
    return Figure("dynamics", "Training dynamics", panels) if panels else None


def collapse_figure(runs: list[RunData], sampling: str, notes: list[str]) -> Figure | None:
    """The curves of the proxies declared ``report`` (`tether.diagnostics.proxies`), each
    titled with its label."""
    specs = [(collapse_key(sampling, p.name), p.label) for p in PROXIES if p.report]
    panels = panels_or_note(specs, runs, notes, f"collapse curves ({sampling})")
    return (
        Figure(f"collapse_{sampling}", f"MI vs entropy over training ({sampling})", panels)
        if panels
        else None
    )


def probe_figure(runs: list[RunData], notes: list[str]) -> Figure | None:
    """The probe set's curves beside the batch's: I(X;Z) on the batch's first turns and on
    the fixed probe levels (bounded by log 64 instead of log of the batch's prompts), the
    probe's retrieval accuracy, and reading accuracy on the same probe turns."""
    undefined = [r.name for r in runs if r.has(READING_DEFINED) and not r.last(READING_DEFINED)]
    if undefined:
        notes.append(
            "reading accuracy: not defined for the env of "
            + ", ".join(undefined)
            + " (no checker of what its reasoning states: docs/methods.md, section 2)"
        )
    specs = [
        (collapse_key("first_turn", "mi_estimate"), "I(X;Z), batch first turns"),
        (collapse_key("probe", "mi_estimate"), "I(X;Z), probe set"),
        (collapse_key("probe", "retrieval_acc"), "retrieval accuracy, probe set"),
        (READING_ACC, "reading accuracy, probe set (every fact right)"),
    ]
    panels = panels_or_note(specs, runs, notes, "probe curves")
    has_probe = any(r.has(collapse_key("probe", "mi_estimate")) for r in runs)
    if not panels or not has_probe:
        return None
    return Figure("probe", "Probe set and reading accuracy beside the batch proxies", panels)


#: The mechanism's curves (docs/methods.md, "The mechanism, measured"): why groups carry no
#: reward variance, whether the task gradient still dominates in the lowest-variance bucket,
#: and where the probe's MI goes by each probe level's reward variance.
MECHANISM_CURVES = (
    ("filter/zero_variance_all_failed", "zero-variance groups: all failed"),
    ("filter/zero_variance_all_succeeded", "zero-variance groups: all succeeded"),
    ("filter/zero_variance_uninformative", "zero-variance groups: equal partial rewards"),
    ("grad_snr/q1/snr", "gradient SNR, lowest reward-variance bucket (task / regulariser)"),
    ("mechanism/probe_success", "success on the probe levels (played to the end)"),
    ("mechanism/probe_zero_rv_share", "share of probe levels at zero reward variance"),
    ("mechanism/probe_mi_change/zero_rv", "probe MI change since the first point: zero-RV levels"),
    ("mechanism/probe_mi_change/nonzero_rv", "probe MI change: levels with reward variance"),
    ("mechanism/probe_mi_change/gap", "MI change gap (zero-RV minus the others; < 0: mechanism)"),
)


def mechanism_figure(runs: list[RunData]) -> Figure | None:
    """The paper's mechanism, for runs whose probe played its levels to the end
    (``diagnostics.probe.outcome_samples``); none for the others."""
    if not any(r.has("mechanism/probe_success") for r in runs):
        return None
    panels = [p for key, title in MECHANISM_CURVES if (p := curve_panel(runs, key, title))]
    return Figure(
        "mechanism", "The mechanism: reward variance, gradient SNR, where MI goes", panels
    )


#: The asynchronous-rollout curves (``rollout.max_staleness`` >= 1; docs/methods.md).
ASYNC_CURVES = (
    ("async/staleness_mean", "staleness of the trained batch (versions)"),
    ("async/behaviour_kl", "behaviour-learner KL"),
    ("async/is_weight_mean", "importance weight, mean"),
    ("async/is_clipped_frac", "share of tokens past the weight cap"),
)


def async_figure(runs: list[RunData]) -> Figure | None:
    """How stale the trained batches were and how far the sampler's policy was from the
    learner's, for runs with asynchronous rollouts (none for synchronous runs)."""
    if not any(r.has(ASYNC_CURVES[0][0]) for r in runs):
        return None
    panels = [p for key, title in ASYNC_CURVES if (p := curve_panel(runs, key, title))]
    return Figure("async", "Asynchronous rollouts: staleness and off-policy correction", panels)


def stage_iterations(iterations: list[int]) -> dict[str, int]:
    """Early / mid / late: the first, middle and last logged iteration."""
    its = sorted(iterations)
    return {"early": its[0], "mid": its[len(its) // 2], "late": its[-1]}


def heatmap_figure(run: RunData) -> Figure | None:
    """Prompt-level rewards (prompts × samples) at early / mid / late iterations, and each
    stage's prompts' reward std sorted high to low (RV)."""
    if not run.prompts:
        return None
    stages = stage_iterations(list(run.prompts))
    panels, rv_columns = [], []
    for stage, it in stages.items():
        groups = run.prompts[it]
        size = max(len(g["rewards"]) for g in groups)
        matrix = np.full((len(groups), size), np.nan)
        for row, g in enumerate(groups):
            matrix[row, : len(g["rewards"])] = g["rewards"]
        panels.append(
            Panel(
                f"{stage} (iteration {it}): rewards",
                "sample",
                "prompt (env seed)",
                heatmap=(matrix, list(range(size)), [g["env_seed"] for g in groups]),
            )
        )
        rv_columns.append(
            sorted(
                (
                    float(np.std(g["rewards"], ddof=1)) if len(g["rewards"]) > 1 else 0.0
                    for g in groups
                ),
                reverse=True,
            )
        )
    depth = max(len(c) for c in rv_columns)
    rv = np.full((depth, len(rv_columns)), np.nan)
    for j, column in enumerate(rv_columns):
        rv[: len(column), j] = column
    panels.append(
        Panel(
            "prompt RV (reward std), sorted",
            "stage",
            "prompt rank",
            heatmap=(rv, [f"{s} ({i})" for s, i in stages.items()], list(range(1, depth + 1))),
        )
    )
    return Figure(f"heatmaps_{run.run_id[:8]}", f"Prompt-level reward and RV: {run.name}", panels)
