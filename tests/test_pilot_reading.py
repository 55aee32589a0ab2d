"""The collapse pilot's rules (tether.analysis.pilot) on records built to each answer."""

from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from tether.analysis import pilot
from tether.platform.cli.main import app

PROBE_STEPS = (1, 5, 10, 15, 20, 25, 30, 35, 40)


def _metrics(mi_last=0.20, mi_half=0.02, h_last=1.0, fmt=0.95, zero_rv=8.0, snr=0.5):
    """A 40-iteration run: probe MI 0.40 ± 0.02 at iteration 1, ``mi_last`` ± ``mi_half``
    at 40; probe H(Z|X) 1.0 [0.9, 1.1] at 1 and ``h_last`` at 40."""
    its = range(1, 41)
    m = {
        pilot.ZERO_RV: {i: zero_rv for i in its},
        pilot.FORMAT_OK: {i: fmt for i in its},
        pilot.LOW_SNR: {i: snr for i in (1, 5, 10, 15, 20, 25, 30, 35, 40)},
        "val/success": {0: 0.30, 40: 0.45},
    }
    for i in PROBE_STEPS:
        mi, half = (0.40, 0.02) if i < 40 else (mi_last, mi_half)
        h = 1.0 if i < 40 else h_last
        m[pilot.PROBE + "mi_estimate"] = {**m.get(pilot.PROBE + "mi_estimate", {}), i: mi}
        for suffix, value in (("_ci_low", mi - half), ("_ci_high", mi + half)):
            key = pilot.PROBE + "mi_estimate" + suffix
            m[key] = {**m.get(key, {}), i: value}
        for suffix, value in (("", h), ("_ci_low", h - 0.1), ("_ci_high", h + 0.1)):
            key = pilot.PROBE + "conditional_entropy_est" + suffix
            m[key] = {**m.get(key, {}), i: value}
    m[pilot.GAP] = {40: -0.1}
    m[pilot.GAP + "_ci_low"] = {40: -0.2}
    m[pilot.GAP + "_ci_high"] = {40: -0.01}
    return m


@pytest.mark.parametrize(
    ("kwargs", "regime"),
    [
        ({}, "template"),
        ({"mi_last": 0.35}, "none"),  # a drop below 0.08
        ({"mi_last": 0.31, "mi_half": 0.08}, "none"),  # 0.09 lower, intervals overlap
        ({"h_last": 0.85}, "low_entropy"),  # below the first point's lower bound 0.9
        ({"h_last": 0.95}, "template"),  # lower, but inside the first interval
        ({"fmt": 0.89}, "format"),
        ({"mi_last": 0.45}, "none"),  # MI rose
    ],
)
def test_collapse_regime_follows_the_protocol(kwargs, regime):
    assert pilot.collapse(_metrics(**kwargs))["regime"] == regime


def test_format_is_read_over_the_last_five_iterations_only():
    m = _metrics()
    m[pilot.FORMAT_OK][35] = 0.5  # before the window
    assert pilot.collapse(m)["regime"] == "template"
    m[pilot.FORMAT_OK][36] = 0.5
    assert pilot.collapse(m)["regime"] == "format"


@pytest.mark.parametrize(
    ("kwargs", "holds"),
    [({}, True), ({"zero_rv": 5.9}, False), ({"snr": 1.0}, False), ({"zero_rv": 6.0}, True)],
)
def test_precondition(kwargs, holds):
    assert pilot.precondition(_metrics(**kwargs))["holds"] is holds


def test_precondition_window_and_points():
    m = _metrics()
    m[pilot.LOW_SNR][25] = 1.5  # one of the two points at or above 1
    assert pilot.precondition(m)["holds"] is False
    m = _metrics(zero_rv=0.0)
    for i in range(16, 26):
        m[pilot.ZERO_RV][i] = 7.0  # only the window counts
    assert pilot.precondition(m)["holds"] is True


def test_missing_metrics_are_missing_not_verdicts():
    m = _metrics()
    del m[pilot.LOW_SNR][20]
    assert pilot.precondition(m)["holds"] is None
    assert pilot.collapse({pilot.FORMAT_OK: {1: 1.0}})["regime"] is None
    m = _metrics()
    del m[pilot.PROBE + "conditional_entropy_est_ci_low"]
    assert pilot.collapse(m)["regime"] is None


def _record(name, seed, **kwargs):
    return {
        "params": {"experiment.name": name, "experiment.seed": str(seed)},
        "metrics": _metrics(**kwargs),
        "path": f"{name}-{seed}.json.gz",
    }


def test_qualification_needs_two_of_three_of_each():
    runs = [_record("a", 1), _record("a", 2), _record("a", 3, mi_last=0.4)]
    runs += [_record("b", 1), _record("b", 2, snr=2.0), _record("b", 3, snr=2.0)]
    runs += [_record("c", 1, h_last=0.5), _record("c", 2, fmt=0.5), _record("c", 3)]
    out = pilot.read(runs)
    assert (out["a"]["qualifies"], out["a"]["collapsed"]) == (True, 2)
    assert (out["b"]["qualifies"], out["b"]["precondition_held"]) == (False, 1)
    assert (out["c"]["qualifies"], out["c"]["collapsed"]) == (False, 1)
    assert pilot.read(runs[:2])["a"]["qualifies"] is None  # incomplete


def test_cli_reads_records(tmp_path):
    paths = []
    for seed in (1, 2, 3):
        record = _record("tether-collapse-pilot-x", seed)
        record["metrics"] = {
            k: {str(s): v for s, v in pts.items()} for k, pts in record["metrics"].items()
        }
        path = tmp_path / f"x-{seed}.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump({k: v for k, v in record.items() if k != "path"}, f)
        paths.append(str(path))
    result = CliRunner().invoke(app, ["analyze", "pilot", *paths], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "precondition in 3 of 3, template collapse in 3 of 3: qualifies" in result.output
    (tmp_path / "bad.json").write_text("{}")
    bad = CliRunner().invoke(app, ["analyze", "pilot", str(tmp_path / "bad.json")])
    assert bad.exit_code != 0 and "not a collapse-pilot record" in bad.output


def test_one_command_line_reaches_the_paper_and_the_harness():
    """``tether analyze paper`` is ``tether.analysis.paper`` with its own options
    (``--help`` included); ``known-answer`` is listed beside it."""
    runner = CliRunner()
    listing = runner.invoke(app, ["analyze", "--help"], env={"COLUMNS": "120"})
    assert all(name in listing.output for name in ("paper", "known-answer", "pilot"))
    usage = runner.invoke(app, ["analyze", "paper", "--help"])
    assert usage.exit_code == 0 and "usage: tether analyze paper" in usage.output
    assert "--finding" in usage.output  # the analysis's own options
    wrong = runner.invoke(app, ["analyze", "paper", "--finding", "z", "x.json"])
    assert wrong.exit_code == 2 and "invalid choice" in wrong.output


def _with_success(record, values, alarms=None):
    record["metrics"][pilot.SUCCESS] = dict(zip(PROBE_STEPS, values))
    record["tags"] = {f"alarm.{name}": str(it) for name, it in (alarms or {}).items()}
    return record


def test_lead_time_is_the_fall_minus_the_alarm():
    falling = [0.5, 0.5, 0.48, 0.45, 0.41, 0.39, 0.35, 0.3, 0.3]  # 0.10 below from 25 (0.39)
    # below the first by 0.10 at 10, 30 and 40, never at two points in a row
    dip = [0.5, 0.5, 0.38, 0.45, 0.41, 0.42, 0.39, 0.45, 0.38]
    assert pilot.success_fall(_with_success(_record("a", 5), dip)["metrics"]) is None
    assert (
        pilot.success_fall(_with_success(_record("a", 6), dip)["metrics"], pilot.LeadRules(hold=1))
        == 10
    )
    runs = [
        _with_success(_record("a", 1), falling, {"reading_drift": 15, "template_collapse": 30}),
        _with_success(_record("a", 2), [0.5] * 9, {"template_collapse": 20}),  # never falls
        _with_success(_record("a", 3), falling),  # no alarm
        _with_success(_record("a", 4, mi_last=0.4), falling, {"template_collapse": 5}),
    ]
    rows = pilot.lead_times(runs)
    by = {(r["seed"], r["alarm"]): r for r in rows}
    assert pilot.success_fall(runs[0]["metrics"]) == 25
    assert by[("1", "reading_drift")]["lead"] == 10
    assert by[("1", "template_collapse")]["lead"] == -5  # after the fall
    assert by[("1", "reading_drift")]["success_at_alarm"] == 0.45
    assert by[("2", "template_collapse")]["lead"] is None  # success never fell
    assert by[("3", None)]["alarm_iteration"] is None
    rate = pilot.alarm_first_rate(rows)
    # runs 1-3 collapsed (run 4 did not): 1 and 2 were warned first, 3 never
    assert (rate["runs"], rate["alarm_first"]) == (3, 2)
    assert 0.2 < rate["ci_low"] < 2 / 3 < rate["ci_high"] < 1.0
