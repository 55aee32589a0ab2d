"""Collapse alarms: each tripped by a stream built for it, silent on a healthy stream."""

import json

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

from tether.diagnostics.alarms import ALARMS, AlarmMonitor
from tether.diagnostics.settings import (
    AlarmsConfig,
    EmptyAfterFilterConfig,
    TemplateCollapseConfig,
)

MI = "collapse/first_turn/mi_estimate"
H = "collapse/first_turn/conditional_entropy_est"
RV = "rollout/in_group_reward_std"
LEN = "rollout/reasoning_length"
EMPTY = "filter/empty"
P = "collapse/first_turn/p_grounded"
VR = "rollout/valid_reasoning_rate"
VA = "rollout/action_valid_rate"
READ = "grounding/reading_acc"
PROBE_P = "collapse/probe/p_grounded"


def mi_point(mi, h, half=0.1, p=0.001, h_half=0.05):
    """One diagnostic point of the first-turn proxies: values, intervals and p-value."""
    return {
        MI: mi,
        f"{MI}_ci_low": mi - half,
        f"{MI}_ci_high": mi + half,
        P: p,
        H: h,
        f"{H}_ci_low": h - h_half,
        f"{H}_ci_high": h + h_half,
    }


def reading_point(hits, levels=64, p=0.001):
    """One probe point's reading accuracy with its Wilson interval, and the probe's p."""
    from scipy.stats import binomtest

    ci = binomtest(hits, levels).proportion_ci(0.95, method="wilson")
    return {
        READ: hits / levels,
        f"{READ}_ci_low": ci.low,
        f"{READ}_ci_high": ci.high,
        "grounding/levels": levels,
        PROBE_P: p,
    }


def length_point(mean, half=2.0):
    return {LEN: mean, f"{LEN}_ci_low": mean - half, f"{LEN}_ci_high": mean + half}


def healthy(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {
            **mi_point(1.0 + 0.05 * rng.standard_normal(), 2.0 + 0.05 * rng.standard_normal()),
            RV: 0.5 + 0.05 * rng.standard_normal(),
            **length_point(40 + rng.standard_normal()),
            EMPTY: 0.0,
            VR: 0.9,
            VA: 0.95,
            **reading_point(int(rng.binomial(64, 0.85))),
        }
        for _ in range(n)
    ]


def run(monitor, stream, start=1):
    events = []
    for it, metrics in enumerate(stream, start=start):
        events += monitor.update(it, metrics)
    return events


def fake_clock():
    ticks = iter(range(10_000))
    return lambda: float(next(ticks))


def test_healthy_stream_is_silent():
    monitor = AlarmMonitor(AlarmsConfig())
    assert run(monitor, healthy()) == []
    assert not monitor.stop_requested


def test_template_collapse_fires_once_when_mi_falls_beyond_both_intervals_and_entropy_holds():
    mi = [1.0] * 5 + [0.9, 0.8, 0.75, 0.7, 0.6, 0.5, 0.45, 0.4]
    # Intervals +-0.1: 0.8 [0.7, 0.9] still touches 1.0 [0.9, 1.1]; 0.75 [0.65, 0.85] is the
    # first apart (iteration 8); patience 2 fires at the second (iteration 9).
    stream = [mi_point(v, 2.0 + 0.01 * k) for k, v in enumerate(mi)]  # entropy drifts up
    monitor = AlarmMonitor(AlarmsConfig(), clock=fake_clock())
    events = run(monitor, stream)
    assert [(e.name, e.iteration, e.mode) for e in events] == [("template_collapse", 9, "warn")]
    event = events[0]
    assert "\n" not in event.message and "template_collapse" in event.message
    assert "[0.9, 1.1]" in event.message and "p_grounded" in event.message
    assert event.evidence["iteration"] == [float(i) for i in range(1, 10)]
    assert event.evidence[MI] == mi[:9]
    assert event.evidence[f"{MI}_ci_low"] == pytest.approx([v - 0.1 for v in mi[:9]])
    assert event.evidence[P] == [0.001] * 9 and event.evidence["reference_iteration"] == [1.0]
    assert len(event.evidence[H]) == 9
    assert event.time == 8.0  # one clock tick per update


def test_patience_one_fires_at_the_first_separation():
    mi = [1.0] * 3 + [0.7]
    events = run(
        AlarmMonitor(AlarmsConfig(template_collapse={"patience": 1})),
        [mi_point(v, 2.0) for v in mi],
    )
    assert [(e.name, e.iteration) for e in events] == [("template_collapse", 4)]


def test_a_fall_within_noise_of_zero_never_fires():
    # The quickstart's false alarm: MI 0.0109 -> 0.0053 (a "52 % fall") at noise level, never
    # significantly above its null (p ~ 0.3-0.6), with intervals straddling zero.
    stream = [
        mi_point(v, 2.0, half=0.02, p=p)
        for v, p in [
            (0.0109, 0.31),
            (0.0095, 0.4),
            (0.0080, 0.45),
            (0.0053, 0.6),
            (0.001, 0.7),
            (0.0, 0.8),
        ]
    ]
    assert run(AlarmMonitor(AlarmsConfig(template_collapse={"patience": 1})), stream) == []


def test_a_large_relative_fall_inside_the_intervals_does_not_fire():
    # Significant at first, then a 60 % fall that stays within the uncertainty of both points.
    stream = [
        mi_point(1.0, 2.0, half=0.5),
        mi_point(0.4, 2.0, half=0.5),
        mi_point(0.4, 2.0, half=0.5),
    ]
    assert run(AlarmMonitor(AlarmsConfig(template_collapse={"patience": 1})), stream) == []


def test_patience_counts_separated_points_among_the_last_within():
    mi = [1.0, 1.0, 0.6, 1.0, 0.6, 0.6]  # apart, back, apart twice
    stream = [mi_point(v, 2.0) for v in mi]
    # Default: 2 of the last 3 points apart -> fires at 5; consecutive (within = 2) at 6.
    assert [e.iteration for e in run(AlarmMonitor(AlarmsConfig()), stream)] == [5]
    consecutive = AlarmsConfig(template_collapse={"within": 2})
    assert [e.iteration for e in run(AlarmMonitor(consecutive), stream)] == [6]
    # Apart once in every three points never reaches 2 of 3.
    sparse = [mi_point(v, 2.0) for v in [1.0, 1.0] + [0.6, 1.0, 1.0] * 4]
    assert run(AlarmMonitor(AlarmsConfig()), sparse) == []


def test_one_significant_point_is_not_a_reference():
    # An input-blind policy is 'significant' at a rate of alpha / window by chance; one such
    # point followed by a fall must not fire (min_references 2), two must.
    once = [mi_point(0.3, 2.0, p=0.001)] + [mi_point(0.0, 2.0, p=0.5)] * 4
    assert run(AlarmMonitor(AlarmsConfig()), once) == []
    assert [
        e.iteration
        for e in run(AlarmMonitor(AlarmsConfig(template_collapse={"min_references": 1})), once)
    ] == [3]
    twice = [mi_point(0.3, 2.0, p=0.001)] * 2 + [mi_point(0.0, 2.0, p=0.5)] * 3
    assert [e.iteration for e in run(AlarmMonitor(AlarmsConfig()), twice)] == [4]


def test_low_entropy_collapse_fires_when_both_fall():
    stream = [mi_point(1.0 - 0.12 * k, 2.0 - 0.1 * k) for k in range(8)]
    events = run(AlarmMonitor(AlarmsConfig()), stream)
    # MI apart from 1.0 from k = 2 (0.76 +- 0.1 < 0.9) but a 25 % fall only from k = 3 (0.64);
    # H apart from k = 2 (1.8 + 0.05 < 1.95): breaches at iterations 4 and 5, fires at 5.
    assert [(e.name, e.iteration) for e in events] == [("low_entropy_collapse", 5)]


def test_entropy_falling_within_its_interval_counts_as_holding():
    stream = [mi_point(1.0 - 0.15 * k, 2.0 - 0.03 * k) for k in range(5)]  # H apart only at k >= 4
    events = run(AlarmMonitor(AlarmsConfig()), stream)
    assert [(e.name, e.iteration) for e in events] == [("template_collapse", 4)]


def test_format_collapse_fires_when_reasoning_or_actions_vanish():
    stream = [
        {VR: 0.9, VA: 0.9},
        {VR: 0.0, VA: 0.9},
        {VR: 0.0, VA: 0.0},
        {VR: 0.5, VA: 0.01},
        {VR: 0.5, VA: 0.0},
    ]
    events = run(AlarmMonitor(AlarmsConfig()), stream)
    assert [(e.name, e.iteration) for e in events] == [("format_collapse", 3)]
    assert "reasoning and actions" in events[0].message
    assert events[0].evidence[VR] == [0.0, 0.0]


def test_reward_variance_collapse_needs_a_baseline_above_noise():
    stream = [{RV: 0.02}] * 10 + [{RV: 0.0}] * 20  # a spread that was never there
    assert run(AlarmMonitor(AlarmsConfig()), stream) == []


def test_output_length_fall_within_noise_does_not_fire():
    lengths = [4, 4, 1, 1, 1]  # 75 % fall, but the intervals overlap
    stream = [length_point(v, half=3.0) for v in lengths]
    assert run(AlarmMonitor(AlarmsConfig()), stream) == []


def test_reward_variance_collapse_needs_ten_consecutive_below_a_tenth_of_baseline():
    stream = [{RV: 0.5}] * 10 + [{RV: 0.01}] * 9 + [{RV: 0.3}] + [{RV: 0.01}] * 10
    events = run(AlarmMonitor(AlarmsConfig()), stream)
    # The breach at 11..19 is broken at 20; the streak 21..30 reaches 10 at 30.
    assert [(e.name, e.iteration) for e in events] == [("reward_variance_collapse", 30)]
    assert events[0].evidence["baseline"] == [pytest.approx(0.5)]
    assert events[0].evidence[RV] == [0.01] * 10


def test_output_length_collapse():
    lengths = [40, 41, 39, 40, 35, 30, 25, 19, 15, 15]
    events = run(AlarmMonitor(AlarmsConfig()), [length_point(v) for v in lengths])
    assert [(e.name, e.iteration) for e in events] == [("output_length_collapse", 8)]  # 19 < 41 / 2


def test_empty_after_filter_counts_consecutive_observations_and_rearms():
    flags = [1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1]
    events = run(AlarmMonitor(AlarmsConfig()), [{EMPTY: float(f)} for f in flags])
    # 6..10 fires at 10; still breaching at 11, 12 (no repeat); recovers at 13; 14..18 fires at 18.
    assert [(e.name, e.iteration) for e in events] == [
        ("empty_after_filter", 10),
        ("empty_after_filter", 18),
    ]


def test_missing_and_nan_metrics_do_not_advance_an_alarm():
    stream = []
    for _ in range(5):
        stream += [{EMPTY: 1.0}, {}, {EMPTY: float("nan")}, {"other": 3.0}]
    events = run(AlarmMonitor(AlarmsConfig()), stream)
    assert [(e.name, e.iteration) for e in events] == [
        ("empty_after_filter", 17)
    ]  # the 5th observation


def test_stop_mode_and_off_mode():
    config = AlarmsConfig(
        empty_after_filter=EmptyAfterFilterConfig(mode="stop", patience=2),
        template_collapse=TemplateCollapseConfig(mode="off"),
    )
    monitor = AlarmMonitor(config)
    assert "template_collapse" not in monitor.alarms
    mi = [mi_point(1.0, 2.0), mi_point(0.1, 2.0), mi_point(0.1, 2.0)]
    assert run(monitor, mi) == []  # template alarm switched off
    events = run(monitor, [{EMPTY: 1}, {EMPTY: 1}], start=4)
    assert [(e.name, e.mode) for e in events] == [("empty_after_filter", "stop")]
    assert monitor.stop_requested


def test_warn_mode_does_not_request_stop():
    monitor = AlarmMonitor(AlarmsConfig(empty_after_filter=EmptyAfterFilterConfig(patience=1)))
    assert [e.mode for e in run(monitor, [{EMPTY: 1}])] == ["warn"]
    assert not monitor.stop_requested


def test_state_round_trip_resumes_exactly():
    rng = np.random.default_rng(1)
    stream = healthy(15)
    for k in range(15):  # every alarm collapses in the second half
        stream.append(
            {
                **mi_point(1.0 * 0.85 ** (k + 1), 2.0 + 0.01 * k),
                RV: 0.01,
                **length_point(40 * 0.9 ** (k + 1)),
                EMPTY: 1.0,
                VR: 0.0,
                VA: 0.0,
                **reading_point(int(54 * 0.9 ** (k + 1))),
                "noise": rng.normal(),
            }
        )
    uninterrupted = AlarmMonitor(AlarmsConfig(), clock=lambda: 0.0)
    expected = run(uninterrupted, stream)
    assert {e.name for e in expected} == set(ALARMS) - {"low_entropy_collapse"}

    first = AlarmMonitor(AlarmsConfig(), clock=lambda: 0.0)
    before = run(first, stream[:20])
    state = json.loads(json.dumps(first.state_dict()))  # JSON-safe
    resumed = AlarmMonitor(AlarmsConfig(), clock=lambda: 0.0)
    resumed.load_state_dict(state)
    after = run(resumed, stream[20:], start=21)
    assert [e.to_dict() for e in before + after] == [e.to_dict() for e in expected]
    assert [e.to_dict() for e in resumed.events] == [e.to_dict() for e in expected]
    assert resumed.state_dict() == uninterrupted.state_dict()


def _fields(model_cls, path=""):
    for name, info in model_cls.model_fields.items():
        yield f"{path}{name}", info
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from _fields(info.annotation, f"{path}{name}.")


def test_config_fields_are_documented_and_strict():
    fields = list(_fields(AlarmsConfig))
    assert len(fields) > 20
    for path, info in fields:
        assert info.description, f"{path} has no description"
        assert not info.is_required(), f"{path} has no default"
    with pytest.raises(ValidationError):
        AlarmsConfig(template_collapse={"mode": "loud"})
    with pytest.raises(ValidationError):
        AlarmsConfig(template_collapse={"alpha": 1.5})
    with pytest.raises(ValidationError):
        AlarmsConfig(typo_alarm={"mode": "warn"})
    config = AlarmsConfig.model_validate({"template_collapse": {"mode": "stop", "window": 5}})
    assert config.template_collapse.mode == "stop" and config.template_collapse.window == 5
