"""`tether report` on MLflow runs with known metric histories (real MLflow client, SQLite):
Spearman values against scipy on the same data, RV quartile assignments against pandas,
regime quadrants, the files and MLflow artifacts, and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from scipy import stats as scipy_stats
from typer.testing import CliRunner

from tests.mlflow_runs import write_run
from tether.analysis import stats, views
from tether.analysis.report import ReportSettings, analyse, build_report
from tether.analysis.source import ReportError, load_target
from tether.platform.cli.main import app
from tether.platform.tracking.tracker import Tracker

STEPS = range(1, 7)
MI = "collapse/first_turn/mi_estimate"
H = "collapse/first_turn/conditional_entropy_est"
ZS = "collapse/first_turn/mi_zscore_ema"
#: (stochasticity, filter strategy, final (H, MI)) of the four trials: one per regime
TRIALS = [
    (0.0, "top_p", (0.9, 0.8)),
    (0.0, "none", (0.9, 0.1)),
    (0.2, "top_p", (0.2, 0.7)),
    (0.2, "none", (0.1, 0.2)),
]


def histories(k: int, rng, final) -> dict[str, dict[int, float]]:
    h = {
        key: {s: float(rng.uniform(0, 1)) for s in STEPS}
        for key in (
            "rollout/success",
            "rollout/in_group_reward_std",
            "filter/kept_ratio",
            "filter/zero_variance_groups",
            ZS,
        )
    }
    h[MI] = {s: float(rng.uniform(0.3, 0.6)) for s in STEPS}
    h[H] = {s: float(rng.uniform(0.3, 0.6)) for s in STEPS}
    h[H][6], h[MI][6] = final
    # The final point's interval and input-dependence test decide its regime.
    h[f"{H}_ci_low"], h[f"{H}_ci_high"] = {6: final[0] - 0.1}, {6: final[0] + 0.1}
    h[f"{MI}_ci_low"], h[f"{MI}_ci_high"] = {6: final[1] - 0.1}, {6: final[1] + 0.1}
    h["collapse/first_turn/p_grounded"] = {6: 0.001 if final[1] > 0.5 else 0.4}
    h["val/success"] = {0: 0.0, 6: 0.25 * k}
    return h


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A sweep parent with four trials, a run missing diagnostics, a run resumed over
    step 3, and an experiment without Tether runs."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    rng = np.random.default_rng(7)
    prompt_rng = np.random.default_rng(11)  # apart, so the histories stay as they were
    parent = Tracker(uri, "report-tests", run_name="sweep", tags={"tether.kind": "sweep"})
    data, prompt_data = {}, {}
    for k, (p, strategy, final) in enumerate(TRIALS):
        h = histories(k, rng, final)
        # Prompt-level diagnostics: two groups per diagnosed step, rewards [0, u] (RV u²/2)
        # and a pointwise MI drawn apart from them.
        prompt_mi = {
            s: [
                {
                    "group_id": g,
                    "rewards": [0.0, float(prompt_rng.uniform(0.01, 1))],
                    "success": [0.0, float(g)],
                    "mi": float(prompt_rng.uniform(0, 0.7)),
                }
                for g in range(2)
            ]
            for s in STEPS
        }
        t = write_run(
            uri,
            "report-tests",
            f"trial{k}",
            h,
            parent_run_id=parent.run_id,
            params={"env.stochasticity": str(p), "filter.strategy": strategy},
            tags={"sweep.param.env.stochasticity": p, "sweep.param.filter.strategy": strategy},
            alarms=[
                {
                    "name": "template_collapse",
                    "iteration": 4,
                    "mode": "warn",
                    "message": "MI fell",
                    "evidence": {ZS: [1.0, 0.2]},
                }
            ]
            if k == 1
            else None,
            prompts={
                1: [
                    {
                        "group_id": 0,
                        "env_seed": 11,
                        "rewards": [0, 1, 1, 0],
                        "success": [0, 1, 1, 0],
                    },
                    {
                        "group_id": 1,
                        "env_seed": 12,
                        "rewards": [0, 0, 0, 0],
                        "success": [0, 0, 0, 0],
                    },
                ]
            }
            if k == 0
            else None,
            prompt_mi=prompt_mi,
        )
        data[t.run_id], prompt_data[t.run_id] = h, prompt_mi
    parent.finish()
    # Resumed: step 3 logged twice, the later write is the truth.
    resumed_h = histories(5, rng, (0.5, 0.5))
    resumed = write_run(uri, "report-tests", "resumed", resumed_h, finish=False)
    resumed_h["rollout/success"][3] = 0.987
    resumed.log_metrics({"rollout/success": 0.987}, step=3)
    resumed.finish()
    nodiag_h = {k: v for k, v in histories(6, rng, (0.5, 0.5)).items() if "collapse" not in k}
    nodiag = write_run(uri, "report-tests", "no-diagnostics", nodiag_h)
    data[resumed.run_id], data[nodiag.run_id] = resumed_h, nodiag_h
    other = Tracker(uri, "not-tether", run_name="plain")
    other.log_metrics({"loss": 1.0}, step=1)
    return {
        "uri": uri,
        "parent": parent.run_id,
        "data": data,
        "prompt_data": prompt_data,
        "root": root,
        "trials": list(data)[:4],
        "resumed": resumed.run_id,
        "nodiag": nodiag.run_id,
    }


def test_sweep_numbers_match_scipy_pandas_and_regimes(store, tmp_path):
    target, runs = load_target(store["uri"], store["parent"])
    assert target.kind == "sweep" and {r.run_id for r in runs} == set(store["trials"])
    # Spearman of each diagnostic vs success over every (run, step): scipy on the same data.
    table = {
        r["diagnostic"]: r
        for r in stats.spearman_table(
            runs, "first_turn", ["mi_estimate", "mi_zscore_ema", "conditional_entropy_est"]
        ).rows
    }
    for name, key in (("mi_estimate", MI), ("mi_zscore_ema", ZS), ("conditional_entropy_est", H)):
        x = [store["data"][rid][key][s] for rid in store["trials"] for s in STEPS]
        y = [store["data"][rid]["rollout/success"][s] for rid in store["trials"] for s in STEPS]
        expected = scipy_stats.spearmanr(x, y)
        assert table[name]["n"] == 24
        assert table[name]["rho"] == pytest.approx(expected.statistic, abs=1e-12)
        assert table[name]["p"] == pytest.approx(expected.pvalue, rel=1e-9)
        se = math.sqrt((1 + expected.statistic**2 / 2) / 21)
        assert table[name]["ci_low"] == pytest.approx(
            math.tanh(math.atanh(expected.statistic) - 1.959963984540054 * se), abs=1e-9
        )
        assert table[name]["ci_low"] < table[name]["rho"] < table[name]["ci_high"]
    # RV quartiles over prompt groups: the same assignment as pandas.qcut on the same prompts.
    quart = stats.rv_quartiles(runs)
    points = list(quart.extra["assignments"])  # (run id, iteration, group id)
    assert len(points) == 4 * len(STEPS) * 2

    def group(rid, it, g):
        return store["prompt_data"][rid][it][g]

    rv = [np.var(group(*p)["rewards"], ddof=1) for p in points]
    expected_q = pd.qcut(rv, 4, labels=False) + 1
    assert [quart.extra["assignments"][p] for p in points] == list(expected_q)
    for row in quart.rows:
        sel = [p for p, q in zip(points, expected_q) if q == row["quartile"]]
        assert row["n"] == len(sel) == 12
        assert row["success"] == pytest.approx(
            np.mean([np.mean(group(*p)["success"]) for p in sel])
        )
        assert row["mi"] == pytest.approx(np.mean([group(*p)["mi"] for p in sel]))
    # Regimes, by absolute criteria: the permutation test (p < 0.05) and the H(Z|X)
    # interval against 0.5 nats/token.  Never relative to the other runs: each run alone
    # gets the same regime.
    reg = {r["run"]: r["regime"] for r in stats.regimes(runs, "first_turn").rows}
    assert reg == {
        "trial0": "diverse and grounded",
        "trial1": "template collapse",
        "trial2": "compressed but grounded",
        "trial3": "low-entropy collapse",
    }
    for run in runs:
        assert stats.regimes([run], "first_turn").rows[0]["regime"] == reg[run.name]
    straddling = stats.regimes(runs, "first_turn", entropy_threshold=0.85).rows
    assert {r["run"]: r["regime"] for r in straddling}[
        "trial0"
    ] == "undetermined (H(Z|X) interval straddles 0.85)"
    row = next(r for r in stats.regimes(runs, "first_turn").rows if r["run"] == "trial1")
    assert (row["p_grounded"], row["entropy_ci_low"]) == (0.4, pytest.approx(0.8))
    # Success vs stochasticity: the final val/success (0.25 k) of each cell, and the gain.
    rows = {r["stochasticity"]: r for r in stats.stochasticity_curves(runs).rows}
    assert (rows[0.0]["filter"], rows[0.0]["none"], rows[0.2]["gain"]) == (0.0, 0.25, 0.5 - 0.75)
    # The whole report: files, the alarm on the MI curves, heatmaps from prompts/.
    report = build_report(runs, tmp_path, "sweep")
    names = {f.name for f in report.figures}
    assert {
        "spearman",
        "rv_quartiles",
        "stochasticity",
        "sensitivity",
        "regimes",
        "collapse_first_turn",
        "dynamics",
    } <= names
    assert any(n.startswith("heatmaps_") for n in names)
    collapse = next(f for f in report.figures if f.name == "collapse_first_turn")
    assert (4, "template_collapse (trial1)") in collapse.panels[1].vlines
    dynamics = next(f for f in report.figures if f.name == "dynamics")
    assert all(not p.vlines for p in dynamics.panels)  # not a curve the alarm concerns
    for name in names:
        assert (tmp_path / f"{name}.png").stat().st_size > 5000
    saved = json.loads((tmp_path / "report.json").read_text())
    saved_rho = {r["diagnostic"]: r["rho"] for r in saved["spearman"]["rows"]}
    assert saved_rho["mi_zscore_ema"] == pytest.approx(table["mi_zscore_ema"]["rho"])
    assert "mi_zscore" not in saved_rho  # never logged: a note, not a number
    assert any("mi_zscore:" in n for n in saved["spearman"]["notes"])
    assert "template collapse" in (tmp_path / "report.html").read_text()


def test_resumed_step_takes_last_value_and_missing_metrics_are_noted(store):
    target, runs = load_target(store["uri"], "report-tests")
    assert target.kind == "experiment" and len(runs) == 6  # the sweep parent is not a run
    resumed = next(r for r in runs if r.run_id == store["resumed"])
    assert resumed.metrics["rollout/success"][3] == 0.987
    _, figures, notes = analyse(runs, ReportSettings())  # the report without drawing it
    assert any("no-diagnostics" in n and "regime plot" in n for n in notes)
    assert {"regimes", "dynamics", "spearman"} <= {f.name for f in figures}
    dyn = next(f for f in figures if f.name == "dynamics")
    assert "no-diagnostics" in {s.name for p in dyn.panels for s in p.series}
    assert any("reasoning_length" in n for n in notes)  # never logged: said so


def test_cli_report_logs_to_the_sweep_parent_and_bad_input_fails_clearly(store, tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        app,
        ["report", store["parent"], "--tracking-uri", store["uri"], "--out", str(tmp_path / "r")],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "report.html").is_file()
    client = MlflowClient(tracking_uri=store["uri"])
    logged = {f.path for f in client.list_artifacts(store["parent"], "report")}
    assert {"report/report.html", "report/spearman.png", "report/regimes.html"} <= logged
    for target, message in (
        ("0" * 32, "is not a run id or an experiment name"),
        ("no-such-experiment", "is not a run id or an experiment name"),
        ("not-tether", "has no Tether runs"),
    ):
        with pytest.raises(ReportError, match=message):
            load_target(store["uri"], target)
        result = runner.invoke(
            app,
            [
                "report",
                target,
                "--tracking-uri",
                store["uri"],
                "--no-log",
                "--out",
                str(tmp_path / "x"),
            ],
        )
        assert result.exit_code == 2 and message in " ".join(result.output.split())
    result = runner.invoke(
        app, ["report", "x", "--tracking-uri", f"sqlite:///{tmp_path / 'missing.db'}"]
    )
    assert result.exit_code == 2 and "no MLflow store" in " ".join(result.output.split())
    assert not (tmp_path / "missing.db").exists()


def test_sensitivity_one_at_a_time_uses_the_sweep_base():
    """Each field's trajectory holds the trials that vary only it (others at the base)."""
    from tether.analysis.runs import RunData

    def trial(name, entropy, kl, mi, success):
        return RunData(
            name,
            name,
            tags={
                "sweep.param.algo.entropy_coef": str(entropy),
                "sweep.param.algo.kl_coef": str(kl),
            },
            metrics={
                MI: {2: mi},
                "val/success": {0: 0.0, 2: success},
                "val/success_ci_low": {0: 0.0, 2: success - 0.05},
                "val/success_ci_high": {0: 0.1, 2: success + 0.05},
            },
        )

    runs = [
        trial("e0", 0.0, 0.0, 0.1, 0.2),
        trial("e1", 0.01, 0.0, 0.3, 0.4),
        trial("k1", 0.001, 0.01, 0.5, 0.6),
        trial("k2", 0.001, 0.1, 0.7, 0.8),
    ]
    fields = ["algo.entropy_coef", "algo.kl_coef"]
    result = stats.sensitivity_trajectories(
        runs, fields, MI, base={"algo.entropy_coef": 0.001, "algo.kl_coef": 0.0}
    )
    rows = [(r["field"], r["value"], r["mi"], r["success"]) for r in result.rows]
    assert rows == [
        ("algo.entropy_coef", 0.0, 0.1, 0.2),
        ("algo.entropy_coef", 0.01, 0.3, 0.4),
        ("algo.kl_coef", 0.01, 0.5, 0.6),
        ("algo.kl_coef", 0.1, 0.7, 0.8),
    ]
    # A value of one trial has the interval its final validation logged (not step 0's);
    # its MI logged none.
    first = result.rows[0]
    assert (first["success_ci_low"], first["success_ci_high"]) == pytest.approx((0.15, 0.25))
    assert math.isnan(first["mi_ci_low"]) and math.isnan(first["mi_ci_high"])
    # A product grid (no base): each value averages over the other field's values.
    grid = [trial(f"{e}-{k}", e, k, e + k, 2 * e + k) for e in (0.0, 1.0) for k in (0.0, 2.0)]
    rows = stats.sensitivity_trajectories(grid, fields, MI).rows
    assert [(r["field"], r["value"], r["runs"], r["mi"]) for r in rows] == [
        ("algo.entropy_coef", 0.0, 2, 1.0),
        ("algo.entropy_coef", 1.0, 2, 2.0),
        ("algo.kl_coef", 0.0, 2, 0.5),
        ("algo.kl_coef", 2.0, 2, 2.5),
    ]
    # Two trials a value: the t-interval over them (t at 1 df times the SD over sqrt 2).
    half = scipy_stats.t.ppf(0.975, 1) * np.std([0.0, 2.0], ddof=1) / math.sqrt(2)
    assert (rows[0]["mi_ci_low"], rows[0]["mi_ci_high"]) == pytest.approx((1 - half, 1 + half))
    assert (rows[0]["success_ci_low"], rows[0]["success_ci_high"]) == pytest.approx(
        (1 - half, 1 + half)
    )
    # The report reads the probe's I(X;Z) when every trial logged one (a fixed prompt set).
    probe = "collapse/probe/mi_estimate"
    for run in grid:
        run.metrics[probe] = {2: 10 * run.metrics[MI][2]}
    sections, _, _ = analyse(grid, ReportSettings())
    assert [r["mi"] for r in sections["sensitivity"].rows] == [10.0, 20.0, 5.0, 25.0]
    assert any(probe in note for note in sections["sensitivity"].notes)
    figure = views.sensitivity_figure(stats.sensitivity_trajectories(grid, fields, MI), MI)
    bars = [s for panel in figure.panels for s in panel.series if s.error is not None]
    assert len(bars) == 2 and bars[0].mode == "markers"
    assert bars[0].error == (
        [r["success_ci_low"] for r in rows[:2]],
        [r["success_ci_high"] for r in rows[:2]],
    )


def test_cli_report_finished_only_leaves_out_a_stopped_trial(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rng = np.random.default_rng(3)
    write_run(uri, "finished-only", "done-a", histories(4, rng, (0.5, 0.5)))
    write_run(uri, "finished-only", "done-b", histories(5, rng, (0.4, 0.6)))
    stopped = write_run(
        uri, "finished-only", "stopped", histories(6, rng, (0.5, 0.5)), finish=False
    )
    stopped.finish("KILLED")
    runner = CliRunner()
    args = ["report", "finished-only", "--tracking-uri", uri, "--no-log"]
    everything = runner.invoke(app, [*args, "--out", str(tmp_path / "all")])
    assert everything.exit_code == 0, everything.output
    assert "(3 runs)" in (tmp_path / "all" / "report.html").read_text()
    finished = runner.invoke(app, [*args, "--finished-only", "--out", str(tmp_path / "fin")])
    assert finished.exit_code == 0, finished.output
    assert "left out, not finished: stopped (KILLED)" in " ".join(finished.output.split())
    assert "(2 runs)" in (tmp_path / "fin" / "report.html").read_text()


def test_a_very_wide_band_runs_off_the_plot_instead_of_setting_its_scale(tmp_path):
    """A `log_jackknife` interval at the ceiling can reach tens of nats below in a few
    batches: both renderers keep the curves' scale (their span again beyond them) and let
    that band run off it; bands that fit leave the scale alone."""
    from tether.analysis.render import Figure, Panel, Series, band_limits, save

    x, y = [1, 2, 3, 4], [2.0, 2.0, 1.5, 1.0]
    narrow = Series("mi", x, y, mode="lines", error=([v - 0.1 for v in y], [v + 0.1 for v in y]))
    assert band_limits(Panel("fits", series=[narrow])) is None
    assert band_limits(Panel("no band", series=[Series("mi", x, y)])) is None
    # Bands that are all wider than the curve's movement (a Wilson interval around a flat
    # rate: the quickstart's reading accuracy) are the noise to see, and stay whole.
    rate = [0.84, 0.83, 0.86]
    wilson = Series("acc", x[:3], rate, error=([0.76, 0.75, 0.78], [0.92, 0.91, 0.94]))
    assert band_limits(Panel("flat rate", series=[wilson])) is None
    wide = Series("mi", x, y, mode="lines", error=([1.9, -39.0, 1.4, 0.9], [2.1, 2.1, 1.6, 1.1]))
    panel = Panel("wide", xlabel="iteration", series=[wide])
    assert band_limits(panel) == (0.0, 2.1)  # down to 1.0 - (2.0 - 1.0), up to the band's top
    interactive = save(Figure("wide", "wide", [panel]), tmp_path)
    low, high = interactive.layout.yaxis.range
    assert low == pytest.approx(-0.105) and high == pytest.approx(2.205)
    assert (tmp_path / "wide.png").stat().st_size > 0


def test_report_tables_print_a_value_with_its_interval_in_one_column():
    from rich.console import Console

    from tether.platform.cli.tracking import section_table

    rows = [
        {"run_id": "r", "field": "f", "mi": 0.34, "mi_ci_low": 0.3, "mi_ci_high": 0.38},
        {"run_id": "s", "field": "g", "mi": 0.5, "mi_ci_low": math.nan, "mi_ci_high": 0.6},
    ]
    console = Console(width=120, record=True)
    console.print(section_table("sensitivity", rows))
    text = console.export_text()
    assert "mi (95% CI)" in text and "0.34 [0.3, 0.38]" in text and "0.5 [nan, 0.6]" in text
    assert "mi_ci_low" not in text and "run_id" not in text


def test_sweep_base_is_read_from_the_parent_run(tmp_path):
    """A one-at-a-time sweep's parent holds its base values (``sweep_base.json``, written by
    ``platform/sweep/runner.py``); analysis reads them without parsing the sweep spec."""
    import json

    from mlflow.tracking import MlflowClient

    from tether.analysis.source import sweep_base

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("s", artifact_location=(tmp_path / "a").as_uri())
    parent = client.create_run(experiment).info.run_id
    base = {"algo.entropy_coef": 0.001, "algo.kl_coef": 0.0}
    client.log_text(parent, json.dumps(base), "sweep_base.json")
    assert sweep_base(client, parent) == base
    grid = client.create_run(experiment).info.run_id
    client.log_text(grid, "null", "sweep_base.json")  # a design that varies every field
    assert sweep_base(client, grid) is None
    assert sweep_base(client, client.create_run(experiment).info.run_id) is None  # older sweep
