"""Act-mode alarms: the controller's responses, bounds, cooldown and cap (pure), and the
driver applying them in a real run (local Ray, MLflow): settings change and are logged,
a rollback restores the checkpoint's weights and optimiser state exactly, and a resumed
run continues with the controller's state."""

from __future__ import annotations

import json

import pytest
import torch
from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from tests.conftest import micro_config_dict
from tether.diagnostics.alarms import AlarmMonitor, AlarmsConfig
from tether.diagnostics.control import Controller
from tether.diagnostics.settings import (
    ControlConfig,
    GroundedCheckpoint,
    Knobs,
    RaiseEntropy,
    RaiseKl,
    Rollback,
    TightenFilter,
)
from tether.platform.config import build_config
from tether.platform.run.checkpoint import load_checkpoint
from tether.platform.run.trainer import Trainer

KNOBS = Knobs("top_p", 0.9, 0.0, 0.001, 3e-4)
GROUNDED = [GroundedCheckpoint(5, "/c/iter_5.pt"), GroundedCheckpoint(10, "/c/iter_10.pt")]


def test_each_response_changes_its_setting_within_its_bounds():
    new, target = TightenFilter(factor=0.5, floor=0.3).apply(KNOBS, GROUNDED, None)
    assert (new.filter_strategy, new.filter_value, target) == ("top_p", 0.45, None)
    assert TightenFilter(factor=0.1, floor=0.3).apply(KNOBS, [], None)[0].filter_value == 0.3
    assert TightenFilter(floor=0.9).apply(KNOBS, [], None) is None  # at its floor
    none = Knobs("none", 0.0, 0.0, 0.0, 1e-3)
    assert TightenFilter(start=0.8).apply(none, [], None)[0].filter_value == 0.8
    top_k_abs = Knobs("top_k_abs", 3.0, 0.0, 0.0, 1e-3)
    assert TightenFilter(factor=0.9).apply(top_k_abs, [], None)[0].filter_value == 2.0
    assert TightenFilter().apply(Knobs("top_k_abs", 1.0, 0, 0, 1e-3), [], None) is None
    assert RaiseKl(initial=0.01).apply(KNOBS, [], None)[0].kl_coef == 0.01  # from 0
    assert (
        RaiseKl(ceiling=0.05).apply(Knobs("top_p", 0.9, 0.04, 0, 1e-3), [], None)[0].kl_coef == 0.05
    )
    assert RaiseKl(ceiling=0.05).apply(Knobs("top_p", 0.9, 0.05, 0, 1e-3), [], None) is None
    assert RaiseEntropy().apply(KNOBS, [], None)[0].entropy_coef == 0.002
    new, target = Rollback(lr_factor=0.5).apply(KNOBS, GROUNDED, None)
    assert new.lr == 1.5e-4 and target == GROUNDED[1]
    assert Rollback().apply(KNOBS, GROUNDED, 7)[1] == GROUNDED[0]  # at or before the reference
    assert Rollback().apply(KNOBS, GROUNDED, 4) is None  # nothing grounded before


def test_every_filter_strategy_tightens_to_a_filter_that_keeps_fewer_groups_or_says_its_bound():
    """Each strategy declares its own tightening (algos/filters.py): applied until its
    bound, the kept count never rises and the value stays one its config accepts."""
    from tether.algos.filters import FILTER_STRATEGIES, FilterConfig, snr_filter

    rewards = [[float(g % 3 == 0), 0.0, 1.0, float(g % 2)] for g in range(16)]
    starts = {"none": 0.0, "top_p": 0.9, "top_k": 0.9, "top_k_abs": 12.0, "min_p": 0.1}
    assert set(starts) == set(FILTER_STRATEGIES)
    for strategy, value in starts.items():
        knobs, kept, steps = Knobs(strategy, value, 0.0, 0.0, 1e-3), 16, 0
        while (step := TightenFilter(factor=0.7).apply(knobs, [], None)) is not None:
            knobs, steps = step[0], steps + 1
            cfg = FilterConfig(strategy=knobs.filter_strategy, value=knobs.filter_value)
            now = len(snr_filter(rewards, cfg).kept_groups)
            assert now <= kept, (strategy, knobs)
            kept = now
            assert steps < 50, strategy
        assert steps >= 1, strategy


def test_controller_order_skips_cooldown_cap_and_times():
    controller = Controller(
        {"template_collapse": [TightenFilter(floor=0.95), RaiseKl(times=2), Rollback()]},
        ControlConfig(cooldown=2, max_actions=3),
    )
    knobs, taken = KNOBS, []
    for it in range(1, 12):
        step = controller.step(it, {"template_collapse": None}, knobs, GROUNDED)
        if step is not None:
            action, knobs, _, _ = step
            taken.append((it, action.kind))
    # tighten_filter is at its floor already (passed over); raise_kl twice, 2 apart; then the cap.
    assert taken == [(1, "raise_kl"), (3, "raise_kl"), (5, "rollback")]
    assert knobs.kl_coef == 0.002 and knobs.lr == 1.5e-4
    assert controller.step(20, {"template_collapse": None}, knobs, GROUNDED) is None
    # Not in breach: nothing; another controller from the state continues where it stopped.
    fresh = Controller(controller.responses, controller.config)
    fresh.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert fresh.cursor == controller.cursor and [a.kind for a in fresh.actions] == [
        k for _, k in taken
    ]


def test_controller_waits_for_a_breach_and_records_what_changed():
    controller = Controller(
        {"reward_variance_collapse": [TightenFilter(factor=0.5)]}, ControlConfig()
    )
    assert controller.step(1, {}, KNOBS, []) is None
    action, knobs, _, _ = controller.step(2, {"reward_variance_collapse": None}, KNOBS, [])
    assert action.message == "reward_variance_collapse -> tighten_filter: filter_value 0.9 -> 0.45"
    entry = action.to_dict()
    assert (
        entry["name"] == "action:tighten_filter"
        and entry["mode"] == "act"
        and entry["iteration"] == 2
    )
    assert controller.step(9, {"reward_variance_collapse": None}, knobs, []) is None  # list used up


def test_a_response_with_no_effect_is_passed_over_and_said():
    """A rollback with no grounded checkpoint at or before the alarm's reference (here 1,
    as reading_drift's reference was in every act run of the act-against-warn row) has no
    effect: the controller passes it over for the next response and records why."""
    controller = Controller(
        {"reading_drift": [Rollback(), TightenFilter(floor=0.95)]}, ControlConfig(cooldown=1)
    )
    assert controller.step(12, {"reading_drift": 1}, KNOBS, GROUNDED) is None
    assert [(p.iteration, p.alarm, p.kind) for p in controller.passed] == [
        (12, "reading_drift", "rollback"),
        (12, "reading_drift", "tighten_filter"),
    ]
    assert controller.actions == []
    rollback, tighten = (p.to_dict() for p in controller.passed)
    assert rollback["name"] == "passed:rollback" and rollback["mode"] == "act"
    assert rollback["message"] == (
        "reading_drift -> rollback passed over: "
        "no grounded checkpoint at or before iteration 1 to return to"
    )
    assert tighten["message"].endswith("the filter is at its bound (top_p 0.9)")
    # With a target at or before the reference the same list acts, and passes nothing.
    acting = Controller({"reading_drift": [Rollback()]}, ControlConfig())
    action, _, response, target = acting.step(12, {"reading_drift": 5}, KNOBS, GROUNDED)
    assert action.rollback_to["iteration"] == 5 and acting.passed == []
    assert target.iteration == 5 and isinstance(response, Rollback)
    # The passes survive a checkpoint; a checkpoint from before they were kept has none.
    fresh = Controller(controller.responses, controller.config)
    fresh.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert fresh.passed == controller.passed
    fresh.load_state_dict({"cursor": {}, "actions": []})
    assert fresh.passed == []


def test_the_responder_says_a_pass_on_the_console_and_in_alarms_json():
    from tether.platform.run.alarm_responder import AlarmResponder

    cfg = build_config({"alarms": {"reading_drift": {"mode": "act"}}})
    events, logged = [], []
    responder = AlarmResponder(cfg, emit=lambda kind, data: events.append((kind, data)))
    responder.tracker = type(
        "T", (), {"set_tags": lambda self, t: None, "log_json": lambda self, o, p: logged.append(o)}
    )()
    responder.alarms.in_breach = lambda mode="act": {"reading_drift": 1}
    responder.grounded = [GroundedCheckpoint(2, "/c/iter_2.pt")]
    responder.act(12, learner=None, fleet=None)  # nothing to load: no learner call
    ((kind, data),) = events
    assert kind == "action" and data["kind"] == "passed_over" and data["rollback_to"] is None
    assert data["message"].startswith("reading_drift -> rollback passed over: no grounded")
    assert [e["name"] for e in logged[-1]] == ["passed:rollback"]


def test_act_mode_needs_responses_and_builds_a_controller():
    with pytest.raises(ValidationError, match="needs at least one entry"):
        AlarmsConfig.model_validate({"output_length_collapse": {"mode": "act"}})
    with pytest.raises(ValidationError):
        AlarmsConfig.model_validate(
            {"template_collapse": {"mode": "act", "actions": [{"kind": "pray"}]}}
        )
    assert Controller.from_config(AlarmsConfig()) is None
    config = AlarmsConfig.model_validate({"template_collapse": {"mode": "act"}})
    assert [r.kind for r in Controller.from_config(config).responses["template_collapse"]] == [
        "tighten_filter",
        "rollback",
    ]


def test_act_defaults_follow_the_paper_and_keep_the_regularisers_as_options():
    """The paper (Theorem M.2): KL and entropy regularisation do not prevent template
    collapse and can lower I(X;Z); its remedy is the filter.  Both MI alarms default to
    tighten the filter, then roll back; raise_kl / raise_entropy are still accepted."""
    config = AlarmsConfig.model_validate(
        {"template_collapse": {"mode": "act"}, "low_entropy_collapse": {"mode": "act"}}
    )
    responses = Controller.from_config(config).responses
    for name in ("template_collapse", "low_entropy_collapse"):
        assert [r.kind for r in responses[name]] == ["tighten_filter", "rollback"]
    optional = AlarmsConfig.model_validate(
        {
            "template_collapse": {
                "mode": "act",
                "actions": [{"kind": "raise_kl"}, {"kind": "raise_entropy"}],
            }
        }
    )
    assert [r.kind for r in optional.template_collapse.actions] == ["raise_kl", "raise_entropy"]


def test_a_run_grounded_for_many_checkpoints_keeps_one_to_roll_back_to(tmp_path):
    """Checkpoints at iterations 1-6 all grounded, the collapse's reference at 1 (the
    run's first grounded point, as in tests/test_template_collapse.py on a CPU where p
    stayed below 0.005 for four iterations): the first is kept beside the newest, so
    the rollback has a target; keeping only the newest three left none."""
    from tether.diagnostics.settings import Rollback
    from tether.platform.run.alarm_responder import GROUNDED_KEPT, AlarmResponder

    cfg = build_config({"alarms": {"template_collapse": {"mode": "act"}}})
    responder = AlarmResponder(cfg, emit=lambda *a: None)
    p_key = cfg.alarms.template_collapse.p_metric
    for it in range(1, 7):
        responder.note_checkpoint(it, tmp_path / f"ckpt_{it}", {p_key: 0.001}, {})
    kept = [c.iteration for c in responder.grounded]
    assert kept == [1, 5, 6] and len(kept) == GROUNDED_KEPT
    assert Rollback().apply(responder.knobs, responder.grounded, 1)[1].iteration == 1
    assert Rollback().apply(responder.knobs, responder.grounded, 5)[1].iteration == 5
    responder.note_checkpoint(7, tmp_path / "ckpt_7", {p_key: 0.4}, {})  # not grounded
    assert [c.iteration for c in responder.grounded] == [1, 5, 6]


def test_monitor_reports_act_alarms_in_breach():
    config = AlarmsConfig.model_validate(
        {
            "empty_after_filter": {
                "mode": "act",
                "patience": 1,
                "actions": [{"kind": "tighten_filter"}],
            }
        }
    )
    monitor = AlarmMonitor(config, clock=lambda: 0.0)
    monitor.update(1, {"filter/empty": 0.0})
    assert monitor.in_breach() == {}
    monitor.update(2, {"filter/empty": 1.0})
    assert monitor.in_breach() == {"empty_after_filter": None}
    assert monitor.in_breach("warn") == {}


# ------------------------------------------------------------------ in a real run

# rollout/worker_failures is 0 at every iteration of a healthy run: read as a valid-reasoning
# rate it breaches format_collapse at once (a synthetic alarm that holds), read as a
# p-value every checkpoint counts as grounded (a rollback target).
ACT = {
    "format_collapse": {
        "mode": "act",
        "reasoning_metric": "rollout/worker_failures",
        "min_rate": 0.5,
        "patience": 1,
        "actions": [
            {"kind": "raise_kl", "initial": 0.01},
            {"kind": "raise_entropy", "initial": 0.002},
            {"kind": "rollback", "lr_factor": 0.5},
            {"kind": "tighten_filter", "start": 0.9},
            {"kind": "tighten_filter", "factor": 0.5},
        ],
    },
    "template_collapse": {"p_metric": "rollout/worker_failures"},
    "control": {"cooldown": 1, "max_actions": 4},
}


def _config(tmp_path, models_dir, iterations):
    cfg = build_config(
        micro_config_dict(
            tmp_path,
            rollout={"num_workers": 1},
            algo={"preset": "grpo", "kl_coef": 0.0, "entropy_coef": 0.001, "lr": 1e-3},
            filter={"strategy": "none", "value": 1.0},
            trainer={
                "iterations": iterations,
                "val_every": 100,
                "val_episodes": 2,
                "checkpoint_every": 1,
                "samples_per_log": 0,
            },
            diagnostics={"enabled": False},
            alarms=ACT,
            tracking={"log_model": False},
        )
    )
    cfg.model.cache_dir = models_dir
    return cfg


def _history(client, run_id, key):
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _entries(summary):
    client = MlflowClient(summary.tracking_uri)
    with open(client.download_artifacts(summary.run_id, "alarms.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def acted(micro_policy, models_dir, ray_local, tmp_path_factory):
    """Five iterations, an action at each of 1-4 (the cap), a copy of the rollback's target
    taken when it happens (later checkpoints replace it on disk)."""
    tmp = tmp_path_factory.mktemp("act")
    cfg = _config(tmp, models_dir, 5)
    # Every checkpoint stays: the rollback test reads iteration 3's, which is neither among
    # the newest two nor a rollback target (the first grounded one and the newest two are).
    cfg.retention.checkpoints = 10
    targets = []

    def on_event(kind, data):
        if kind == "action" and data["rollback_to"]:
            targets.append(load_checkpoint(data["rollback_to"]["path"])["learner"])

    return cfg, Trainer(cfg, on_event).run(), targets


def test_actions_change_settings_and_are_logged(acted):
    cfg, summary, _ = acted
    assert summary.status == "FINISHED" and summary.iterations == 5
    client = MlflowClient(summary.tracking_uri)
    # The settings in force at each iteration: an action at the end of iteration k acts from k + 1.
    assert _history(client, summary.run_id, "control/kl_coef") == {
        1: 0.0,
        2: 0.01,
        3: 0.01,
        4: 0.01,
        5: 0.01,
    }
    assert _history(client, summary.run_id, "control/entropy_coef") == {
        1: 0.001,
        2: 0.001,
        3: 0.002,
        4: 0.002,
        5: 0.002,
    }
    assert _history(client, summary.run_id, "control/lr") == {
        1: 1e-3,
        2: 1e-3,
        3: 1e-3,
        4: 5e-4,
        5: 5e-4,
    }
    assert _history(client, summary.run_id, "control/filter_value") == {
        1: 1.0,
        2: 1.0,
        3: 1.0,
        4: 1.0,
        5: 0.9,
    }
    # The KL term enters the loss once raised: the learner loaded the reference mid-run.
    kl = _history(client, summary.run_id, "actor/kl_coef")
    assert 1 not in kl and kl[2] == kl[3] == kl[4] == 0.01
    # The cap (4) holds: the fifth response is never taken.
    assert _history(client, summary.run_id, "control/actions") == {
        1: 0.0,
        2: 1.0,
        3: 2.0,
        4: 3.0,
        5: 4.0,
    }
    tags = client.get_run(summary.run_id).data.tags
    assert tags["control.1"] == "iteration 1: format_collapse -> raise_kl: kl_coef 0 -> 0.01"
    assert tags["control.3"].startswith(
        "iteration 3: format_collapse -> rollback: lr 0.001 -> 0.0005; "
        "weights and optimiser from iteration 2"
    )
    assert tags["control.4"] == (
        "iteration 4: format_collapse -> tighten_filter: "
        "filter_strategy none -> top_p, filter_value 1 -> 0.9"
    )
    assert "control.5" not in tags
    assert [(e["iteration"], e["name"]) for e in _entries(summary)] == [
        (1, "format_collapse"),
        (1, "action:raise_kl"),
        (2, "action:raise_entropy"),
        (3, "action:rollback"),
        (4, "action:tighten_filter"),
    ]


def test_an_acting_run_checkpoints_at_iteration_1_as_a_rollback_target(
    micro_policy, models_dir, ray_local, tmp_path
):
    """Checkpointing every 2 iterations, an acting run also checkpoints at iteration 1:
    without it, a reference at 1 (reading_drift measured from the run's start) had no
    grounded checkpoint to roll back to, and the rollback was passed over."""
    cfg = _config(tmp_path, models_dir, 2)
    cfg.trainer.checkpoint_every = 2
    summary = Trainer(cfg).run()
    assert summary.status == "FINISHED"
    saved = cfg.experiment.output_dir / "checkpoints" / summary.run_id
    assert sorted(p.name for p in saved.glob("iter_*.pt")) == ["iter_000001.pt", "iter_000002.pt"]
    grounded = load_checkpoint(saved / "iter_000002.pt")["driver"]["control"]["grounded"]
    assert [c["iteration"] for c in grounded] == [1, 2]


def test_rollback_restores_weights_and_optimiser_exactly(acted):
    cfg, summary, targets = acted
    # The rollback at iteration 3 loaded iteration 2's checkpoint; iteration 3's checkpoint
    # is written right after it, with no update in between.
    (target,) = targets
    after = load_checkpoint(
        cfg.experiment.output_dir / "checkpoints" / summary.run_id / "iter_000003.pt"
    )["learner"]
    assert set(target["model"]) == set(after["model"])
    for name, tensor in target["model"].items():
        assert torch.equal(tensor, after["model"][name]), name
    assert set(target["optimizer"]["state"]) == set(after["optimizer"]["state"])
    for pid, state in target["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(
                torch.as_tensor(value), torch.as_tensor(after["optimizer"]["state"][pid][key])
            )
    assert [g["lr"] for g in after["optimizer"]["param_groups"]] == [
        0.5 * g["lr"] for g in target["optimizer"]["param_groups"]
    ]
    assert after["updates"] == target["updates"]


@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_resumed_run_continues_with_the_controllers_state(acted, models_dir, ray_local, tmp_path):
    _, whole, _ = acted
    first = Trainer(_config(tmp_path, models_dir, 2)).run()
    cfg = _config(tmp_path, models_dir, 5)
    checkpoint = cfg.experiment.output_dir / "checkpoints" / first.run_id / "iter_000002.pt"
    resumed = Trainer(cfg, resume_from=checkpoint, resume_run_id=first.run_id).run()
    assert resumed.status == "FINISHED" and resumed.run_id == first.run_id

    def actions(summary):
        return [(e["iteration"], e["name"]) for e in _entries(summary) if e["mode"] == "act"]

    assert actions(resumed) == actions(whole)
    for key in (
        "control/filter_value",
        "control/kl_coef",
        "control/entropy_coef",
        "control/lr",
        "control/actions",
    ):
        assert _history(MlflowClient(resumed.tracking_uri), resumed.run_id, key) == _history(
            MlflowClient(whole.tracking_uri), whole.run_id, key
        ), key
