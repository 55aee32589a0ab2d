"""A real template collapse, caught: runs whose reasoning really stops depending on its
input, through the real loop (local Ray, rollout worker, learner, collapse diagnostics,
MLflow), and the ``template_collapse`` alarm (default settings) firing from the
diagnostics those runs computed, then ending the run (a sweep's ``stop_collapsed``) or
acting on it (act mode: tighten the filter, then roll back to a grounded checkpoint).

Default set: the template-prone micro policy (``tests/degenerate_policies.py``): on
Choice with 8 colours, half its reasoning names the asked colour (answered in words
Choice does not accept) and half is one of 8 input-blind plans (answered with a colour).
Choice with stochasticity 1 pays a valid answer a coin flip whatever the input and an
invalid one the format penalty, so GRPO (no filter, lr 5e-3) moves the policy onto the
plans.  Two builds of the policy (2026-11-25; the micro warm start is not bit-identical
between builds): I(X;Z) 0.129 -> 0.000 nats/token (p_grounded 0.001 -> 0.20), alarm at
iteration 6; and 0.211 -> 0.002 (p 0.001 -> 0.23), alarm at 5; H(Z|X) stayed at
0.26-0.36 in both, and the grounded replies fell from ~45 % to ~3 %.  (lr 2e-3 fired at
9; lr 1e-2 broke the format instead.)

No slow version on the paper's setting: finding a's no-filter arm, seed 0
(experiments/paper/a_collapse.yaml), run on this code (2026-11-26, stop_collapsed, 2
points) started from I(X;Z) 0.022 nats/token (0.518 in docs/reproduction.md's runs of
44e70b8), and by iteration 25 its alarm had not fired (MI's interval apart from the
reference at 20 only; valid reasoning fell to 0.08 at 10, then recovered).

Each run's alarm is checked against the metrics MLflow holds, not only against the
alarm's own account: the reference point was significantly grounded, MI's interval now
lies wholly below the reference's, by at least a quarter, and H(Z|X) did not fall.
"""

from __future__ import annotations

import hashlib

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import micro_config_dict
from tests.degenerate_policies import (
    TEMPLATE_ENV,
    TEMPLATE_PLANS,
    TEMPLATE_STEPS,
    build_template_prone_policy,
)
from tether.platform.config import build_config
from tether.platform.run.trainer import Trainer
from tether.platform.sweep.spec import CollapseStop
from tether.platform.sweep.trial import stop_when_collapsed

MI = "collapse/first_turn/mi_estimate"
P = "collapse/first_turn/p_grounded"
H = "collapse/first_turn/conditional_entropy_est"
#: the most iterations a template-prone run may take to collapse
MAX_ITERATIONS = 12


def history(summary, key: str) -> dict[int, float]:
    client = MlflowClient(summary.tracking_uri)
    return {m.step: m.value for m in client.get_metric_history(summary.run_id, key)}


def assert_template_collapse_in_the_logged_metrics(summary, iteration: int) -> int:
    """The run's ``template_collapse`` event fired at ``iteration``, and the metrics the
    run logged to MLflow bear it out (the alarm's criteria, recomputed from the logged
    values with the default settings); returns the reference iteration."""
    events = [a for a in summary.alarms if a["name"] == "template_collapse"]
    assert [e["iteration"] for e in events] == [iteration], summary.alarms
    assert "low_entropy_collapse" not in {a["name"] for a in summary.alarms}
    evidence = events[0]["evidence"]
    mi, low, high = (
        history(summary, MI),
        history(summary, f"{MI}_ci_low"),
        history(summary, f"{MI}_ci_high"),
    )
    p, h_low, h_high = (
        history(summary, P),
        history(summary, f"{H}_ci_low"),
        history(summary, f"{H}_ci_high"),
    )
    # The evidence is the run's own diagnostics, as logged.
    for it, value in zip(evidence["iteration"], evidence[MI]):
        assert mi[int(it)] == pytest.approx(value)
    (reference,) = (int(r) for r in evidence["reference_iteration"])
    assert reference < iteration
    assert p[reference] < 0.05 / 10, "the reference was significantly grounded"
    grounded = [it for it in p if it < iteration and p[it] < 0.05 / 10]
    assert len(grounded) >= 2, "grounding replicated before the fall"
    assert high[iteration] < low[reference], "MI's interval lies wholly below the reference's"
    assert mi[reference] - mi[iteration] >= 0.25 * mi[reference]
    assert h_high[iteration] >= h_low[reference], "H(Z|X) did not fall: a template, not silence"
    return reference


# ------------------------------------------------------------------ the micro collapse


@pytest.fixture(scope="module")
def template_prone_policy(micro_policy, models_dir):
    recipe = repr((TEMPLATE_ENV, TEMPLATE_PLANS, TEMPLATE_STEPS)).encode()
    digest = hashlib.sha256(recipe).hexdigest()[:8]
    return build_template_prone_policy(micro_policy, models_dir / f"template-prone-{digest}")


def _config(tmp_path, models_dir, policy, iterations: int, alarms: dict):
    cfg = build_config(
        micro_config_dict(
            tmp_path,
            env={**TEMPLATE_ENV, "stochasticity": 1.0},
            model={"path": str(policy)},
            rollout={"num_workers": 1, "groups": 16, "group_size": 4},
            algo={
                "preset": "grpo",
                "kl_coef": 0.0,
                "entropy_coef": 0.0,
                "lr": 5e-3,
                "micro_batch_size": 16,
            },
            filter={"strategy": "none", "value": 1.0},
            diagnostics={
                "every": 1,
                "samplings": ["first_turn"],
                "information_chain": False,
                "grad_snr_every": 0,
                "heatmap_every": 1000,
            },
            trainer={
                "iterations": iterations,
                "val_every": 1000,
                "val_episodes": 2,
                "checkpoint_every": 1,
                "samples_every": 1000,
            },
            alarms=alarms,
            tracking={"log_model": False},
        )
    )
    cfg.model.cache_dir = models_dir
    return cfg


@pytest.fixture(scope="module")
def stopped(template_prone_policy, models_dir, ray_local, tmp_path_factory):
    """The run as a sweep trial with ``stop_collapsed: {alarms: [template_collapse],
    points: 2}`` runs it."""
    cfg = _config(
        tmp_path_factory.mktemp("stop"), models_dir, template_prone_policy, MAX_ITERATIONS, {}
    )
    cfg = stop_when_collapsed(cfg, CollapseStop(alarms=["template_collapse"], points=2))
    return Trainer(cfg).run()


def test_stop_collapsed_ends_the_run_when_its_reasoning_becomes_a_template(stopped):
    summary = stopped
    assert summary.status == "FINISHED" and summary.stop_reason, summary
    fired = summary.iterations
    assert fired < MAX_ITERATIONS
    assert summary.stop_reason == f"alarm template_collapse at iteration {fired}"
    reference = assert_template_collapse_in_the_logged_metrics(summary, fired)
    # A real collapse: the input-dependence test that was significant is no longer, and
    # the grounded (invalid-answer) replies gave way to the plans (valid answers).
    p, valid = history(summary, P), history(summary, "rollout/action_valid_rate")
    assert p[reference] < 0.005 and p[fired] > 0.05
    assert valid[fired] - valid[1] > 0.25
    tags = MlflowClient(summary.tracking_uri).get_run(summary.run_id).data.tags
    assert tags["tether.stop_reason"] == summary.stop_reason
    assert tags["tether.last_checkpoint"].endswith(f"iter_{fired:06d}.pt")


def test_act_mode_tightens_the_filter_then_rolls_back_to_grounded_weights(
    stopped, template_prone_policy, models_dir, ray_local, tmp_path
):
    """The same run with the alarm in act mode (default responses; cooldown 1), two
    iterations past where it fired: tighten_filter at the firing iteration, rollback to
    the last grounded checkpoint at or before the reference the next, and the iteration
    after samples from grounded weights again."""
    fired = stopped.iterations
    alarms = {"template_collapse": {"mode": "act"}, "control": {"cooldown": 1}}
    summary = Trainer(_config(tmp_path, models_dir, template_prone_policy, fired + 2, alarms)).run()
    assert summary.status == "FINISHED" and summary.iterations == fired + 2
    reference = assert_template_collapse_in_the_logged_metrics(summary, fired)
    tags = MlflowClient(summary.tracking_uri).get_run(summary.run_id).data.tags
    assert tags["control.1"] == (
        f"iteration {fired}: template_collapse -> tighten_filter: "
        "filter_strategy none -> top_p, filter_value 1 -> 0.9"
    )
    rollback = tags["control.2"]
    assert rollback.startswith(
        f"iteration {fired + 1}: template_collapse -> rollback: lr 0.005 -> 0.0025; "
        "weights and optimiser from iteration "
    ), rollback
    target = int(rollback.split("from iteration ")[1].split()[0])
    p = history(summary, P)
    assert target <= reference and p[target] < 0.005, "the target was a grounded checkpoint"
    assert history(summary, "control/filter_value")[fired + 1] == 0.9
    assert history(summary, "control/lr")[fired + 2] == 0.0025
    # Back on grounded weights: reasoning depends on the input again and the grounded
    # replies (invalid answers) are back.
    valid = history(summary, "rollout/action_valid_rate")
    assert p[fired + 2] < 0.05, p
    assert valid[fired + 2] < valid[fired + 1] - 0.1, valid
