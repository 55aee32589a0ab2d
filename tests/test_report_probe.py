"""The report and the live monitor draw the probe set's curves and reading accuracy beside
the batch proxies (pure: RunData in, figures and the monitor's payload out)."""

from __future__ import annotations

from tether.analysis import source
from tether.analysis.report import ReportSettings, analyse
from tether.analysis.runs import RunData
from tether.dashboards import monitor_data

BATCH = "collapse/first_turn/mi_estimate"
PROBE = "collapse/probe/mi_estimate"
READ = "grounding/reading_acc"


def probe_run(name: str, defined: bool = True) -> RunData:
    steps = [1, 5, 10]
    m = {
        BATCH: {s: 2.0 for s in steps},
        f"{BATCH}_ci_low": {s: 1.9 for s in steps},
        f"{BATCH}_ci_high": {s: 2.08 for s in steps},
        PROBE: {1: 3.5, 5: 3.2, 10: 3.0},
        f"{PROBE}_ci_low": {1: 3.3, 5: 3.0, 10: 2.8},
        f"{PROBE}_ci_high": {1: 3.7, 5: 3.4, 10: 3.2},
        f"{PROBE}_null_q95": {s: 0.2 for s in steps},
        "collapse/probe/p_grounded": {s: 0.001 for s in steps},
        "collapse/probe/retrieval_acc": {1: 0.9, 5: 0.8, 10: 0.7},
        "grounding/defined": {s: float(defined) for s in steps},
        "rollout/success": {s: 0.3 for s in range(1, 11)},
    }
    if defined:
        m[READ] = {1: 0.9, 5: 0.7, 10: 0.5}
        m[f"{READ}_ci_low"] = {1: 0.8, 5: 0.58, 10: 0.38}
        m[f"{READ}_ci_high"] = {1: 0.95, 5: 0.8, 10: 0.62}
    return RunData(run_id=name * 4, name=name, metrics=m)


def test_the_report_draws_the_probe_beside_the_batch():
    runs = [probe_run("frozenlake"), probe_run("webshop", defined=False)]
    _, figures, notes = analyse(runs, ReportSettings())
    (figure,) = [f for f in figures if f.name == "probe"]
    titles = [p.title for p in figure.panels]
    assert titles == [
        "I(X;Z), batch first turns",
        "I(X;Z), probe set",
        "retrieval accuracy, probe set",
        "reading accuracy, probe set (every fact right)",
    ]
    probe_panel, reading_panel = figure.panels[1], figure.panels[3]
    curve = next(s for s in probe_panel.series if s.name == "frozenlake")
    assert curve.x == [1, 5, 10] and curve.error == ([3.3, 3.0, 2.8], [3.7, 3.4, 3.2])
    assert any(s.name == "frozenlake: null 95%" for s in probe_panel.series)
    (reading,) = [s for s in reading_panel.series if s.error]  # only one env has a checker
    assert reading.name == "frozenlake" and reading.y == [0.9, 0.7, 0.5]
    assert any("reading accuracy: not defined for the env of webshop" in n for n in notes)


def test_no_probe_figure_without_a_probe_and_the_reason_is_noted():
    run = probe_run("old")
    run.metrics = {k: v for k, v in run.metrics.items() if "probe" not in k}
    _, figures, notes = analyse([run], ReportSettings())
    assert "probe" not in [f.name for f in figures]
    assert any(n == f"probe curves: no run logged {PROBE}" for n in notes)


def test_the_readers_keep_the_probe_and_reading_metrics():
    for key in (
        f"{PROBE}_ci_low",
        "collapse/probe/p_grounded",
        "collapse/probe/retrieval_acc",
        f"{READ}_ci_high",
        "grounding/player_right",
        "grounding/defined",
    ):
        assert source.WANTED.match(key), key
    for key in (PROBE, f"{PROBE}_ci_high", "collapse/probe/p_grounded", READ, f"{READ}_ci_low"):
        assert monitor_data.WANTED.match(key), key


def test_the_monitor_serves_probe_and_reading_curves_with_intervals():
    payload = monitor_data.monitor_payload([probe_run("a"), probe_run("b", defined=False)])
    curves = {r["name"]: r["curves"] for r in payload["runs"]}
    probe = curves["a"]["probe_mi"]
    assert probe["x"] == [1, 5, 10] and probe["ci_low"] == [3.3, 3.0, 2.8]
    assert probe["p_grounded"] == [0.001] * 3 and probe["null_q95"] == [0.2] * 3
    assert curves["a"]["reading"]["ci_high"] == [0.95, 0.8, 0.62]
    assert curves["b"]["reading"]["x"] == [] and curves["b"]["reading_defined"]["y"][-1] == 0.0


def test_the_report_draws_the_mechanism_for_runs_that_measured_it():
    plain = probe_run("plain")
    measured = probe_run("measured")
    gap = "mechanism/probe_mi_change/gap"
    measured.metrics.update(
        {
            "filter/zero_variance_all_failed": {s: 5.0 for s in range(1, 11)},
            "grad_snr/q1/snr": {1: 1.6, 5: 0.8, 10: 0.4},
            "mechanism/probe_success": {1: 0.3, 5: 0.35, 10: 0.4},
            gap: {5: -0.02, 10: -0.06},
            f"{gap}_ci_low": {5: -0.05, 10: -0.1},
            f"{gap}_ci_high": {5: 0.01, 10: -0.02},
        }
    )
    _, figures, _ = analyse([plain], ReportSettings())
    assert "mechanism" not in [f.name for f in figures]  # a run that did not ask for it
    _, figures, _ = analyse([plain, measured], ReportSettings())
    (figure,) = [f for f in figures if f.name == "mechanism"]
    by_title = {p.title.split(" (")[0]: p for p in figure.panels}
    assert len(figure.panels) == 4  # only the curves a run logged
    gap_panel = next(p for p in figure.panels if p.title.startswith("MI change gap"))
    (curve,) = gap_panel.series
    assert curve.name == "measured" and curve.y == [-0.02, -0.06]
    assert curve.error == ([-0.05, -0.1], [0.01, -0.02])
    assert by_title["gradient SNR, lowest reward-variance bucket"].series[0].y == [1.6, 0.8, 0.4]


def test_records_and_the_store_keep_the_mechanism_metrics():
    for key in ("mechanism/probe_success", "mechanism/probe_mi_change/gap_ci_low"):
        assert source.WANTED.match(key)
