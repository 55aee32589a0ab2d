"""Degenerate policies through the whole loop: real local Ray, real MLflow, 2 iterations,
diagnostics (information chain and gradient SNR included) at every iteration.

A policy that stops writing reasoning or actions is a collapse the platform must report,
never a crash: every run finishes, logs what happened (valid rates, pair counts) and the
format alarm fires where reasoning or actions vanished.
"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import micro_config_dict
from tests.degenerate_policies import REPLIES, build_degenerate_policy
from tether.platform.config import build_config
from tether.platform.run.trainer import Trainer

#: immediate_eos (empty like empty_reasoning) and untrained run nightly (-m slow;
#: CONTRIBUTING.md, "Tests", Nightly).
NIGHTLY = {"immediate_eos", "untrained"}
POLICIES = [
    pytest.param(name, marks=pytest.mark.slow) if name in NIGHTLY else name
    for name in [*REPLIES, "untrained"]
]
#: policies whose replies carry no valid reasoning or no valid action: format_collapse fires
VANISHED = {"empty_reasoning", "no_action", "unterminated", "immediate_eos", "babble"}


@pytest.fixture(scope="module")
def degenerate_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("degenerate")


_SUMMARIES: dict = {}


def run_policy(name, micro_policy, degenerate_dir):
    """Two iterations of the policy (once per test session), all runs in one MLflow store."""
    if name not in _SUMMARIES:
        path = build_degenerate_policy(name, micro_policy, degenerate_dir / name)
        cfg = build_config(
            micro_config_dict(
                degenerate_dir / f"run-{name}",
                model={"path": str(path)},
                experiment={"name": "degenerate", "run_name": name},
                rollout={"num_workers": 1, "groups": 2, "group_size": 4, "max_reply_tokens": 48},
                diagnostics={
                    "every": 1,
                    "chain_every": 1,
                    "grad_snr_every": 1,
                    "grad_snr_buckets": 2,
                },
                trainer={"iterations": 2, "val_every": 2, "val_episodes": 4, "checkpoint_every": 2},
                tracking={"uri": f"sqlite:///{degenerate_dir / 'mlflow.db'}", "log_model": False},
            )
        )
        _SUMMARIES[name] = Trainer(cfg).run()
    return _SUMMARIES[name]


@pytest.mark.parametrize("name", POLICIES)
def test_degenerate_policy_gives_metrics_and_alarms_not_a_crash(
    name, micro_policy, degenerate_dir, ray_local
):
    summary = run_policy(name, micro_policy, degenerate_dir)
    assert summary.status == "FINISHED" and summary.iterations == 2
    client = MlflowClient(summary.tracking_uri)
    metrics = client.get_run(summary.run_id).data.metrics

    def history(key):
        return {m.step: m.value for m in client.get_metric_history(summary.run_id, key)}

    # Rollout metrics and the diagnostics' counts exist at both iterations, whatever the replies.
    for key in (
        "rollout/valid_reasoning_rate",
        "rollout/action_valid_rate",
        "collapse/first_turn/num_pairs",
        "filter/kept_groups",
    ):
        assert set(history(key)) == {1, 2}, key
    valid_reasoning = history("rollout/valid_reasoning_rate")
    alarms = {a["name"] for a in summary.alarms}
    if name in VANISHED:
        assert "format_collapse" in alarms
        event = next(a for a in summary.alarms if a["name"] == "format_collapse")
        assert event["iteration"] == 2 and "rollout/valid_reasoning_rate" in event["evidence"]
        assert client.get_run(summary.run_id).data.tags["alarm.format_collapse"] == "2"
    if name in ("empty_reasoning", "unterminated", "immediate_eos", "babble"):
        # No reasoning to cross-score: the link reports its counts and no MI proxy.
        assert valid_reasoning == {1: 0.0, 2: 0.0}
        assert metrics["collapse/first_turn/num_pairs"] == 0
        assert "collapse/first_turn/mi_estimate" not in metrics
    if name == "no_action":  # an empty answer makes the whole reply malformed
        assert (
            metrics["rollout/action_valid_rate"] == 0.0 and metrics["rollout/format_ok_rate"] == 0.0
        )
    if name == "constant":
        # Well-formed, and scored: reasoning that ignores its input is not significantly grounded.
        assert min(valid_reasoning.values()) >= 0.5 and "format_collapse" not in alarms
        assert metrics["collapse/first_turn/num_pairs"] > 0
        # Sampled at temperature 1 from a model fine-tuned to one reply, the reasoning may
        # still lean on the prompt a little: no evidence at the level the alarms require
        # of a grounded reference (p < alpha / window = 0.005), and the verdict agrees
        # with the p-value.
        p = metrics["collapse/first_turn/p_grounded"]
        assert p >= 0.005
        assert metrics["collapse/first_turn/grounded"] == float(p < 0.05)
        low, high = (
            metrics["collapse/first_turn/mi_estimate_ci_low"],
            metrics["collapse/first_turn/mi_estimate_ci_high"],
        )
        assert low <= metrics["collapse/first_turn/mi_estimate"] <= high
    if name == "babble":
        assert metrics["rollout/length_truncated_rate"] == 1.0


def test_report_and_regimes_over_degenerate_runs(micro_policy, degenerate_dir, ray_local, tmp_path):
    """The report reads runs with no MI at all (no valid reasoning) beside scored ones, and
    no degenerate run is called grounded."""
    from tether.analysis.report import build_report
    from tether.analysis.source import load_target

    summaries = [
        run_policy(name, micro_policy, degenerate_dir) for name in ("empty_reasoning", "constant")
    ]
    _, runs = load_target(summaries[0].tracking_uri, "degenerate")
    assert {"empty_reasoning", "constant"} <= {r.name for r in runs}
    report = build_report(runs, tmp_path / "report", "degenerate policies")
    html = (tmp_path / "report" / "report.html").read_text()
    assert "degenerate policies" in html and "format_collapse" in html
    regimes = {row["run"]: row["regime"] for row in report.sections["regimes"].rows}
    assert "empty_reasoning" not in regimes  # nothing to place on the plot
    assert regimes["constant"] in ("template collapse", "low-entropy collapse") or regimes[
        "constant"
    ].startswith("undetermined"), regimes
    assert any("empty_reasoning" in note for note in report.notes)
