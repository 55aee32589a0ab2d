"""The ``reading_drift`` alarm: reading accuracy on the probe set falls significantly from
its best point while the probe's MI test still says grounded.  It fires on the recorded
drift (what the policy read before and after 30 iterations) and stays silent on a run
whose rates do not drift, on noise, and when MI says "not grounded"."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import binomtest

from tether.diagnostics.alarms import AlarmMonitor
from tether.diagnostics.settings import AlarmsConfig, ReadingDriftConfig, Rollback

READ = "grounding/reading_acc"
P = "collapse/probe/p_grounded"


def point(hits, levels=64, p=0.001, metric=READ):
    """A probe point as the diagnostics log it: the rate, its 95 % Wilson interval, p."""
    ci = binomtest(hits, levels).proportion_ci(0.95, method="wilson")
    return {
        metric: hits / levels,
        f"{metric}_ci_low": ci.low,
        f"{metric}_ci_high": ci.high,
        "grounding/levels": levels,
        P: p,
    }


def only_reading(**settings):
    """Every alarm but reading_drift off, so each test sees this one alone."""
    off = {name: {"mode": "off"} for name in AlarmsConfig.model_fields if name != "control"}
    return AlarmsConfig(**{**off, "reading_drift": {"mode": "warn", **settings}})


def feed(monitor, points):
    """``points``: iteration -> metrics (probe points only; the iterations between log none)."""
    events = []
    for it in range(1, max(points) + 1):
        events += monitor.update(it, points.get(it, {"rollout/success": 0.5}))
    return events


def test_defaults_warn_and_act_rolls_back():
    config = AlarmsConfig().reading_drift
    assert config.mode == "warn" and config.metric == READ and config.p_metric == P
    assert [type(a) for a in config.actions] == [Rollback]
    assert "reading_drift" in AlarmMonitor(AlarmsConfig()).alarms


def test_fires_when_reading_falls_beyond_both_intervals_while_grounded():
    hits = {1: 58, 5: 60, 10: 57, 15: 52, 20: 44, 25: 35, 30: 31}
    monitor = AlarmMonitor(only_reading())
    events = feed(monitor, {it: point(h) for it, h in hits.items()})
    # 99 % Wilson intervals: 44/64 at 20 [0.527, 0.813] still touches 60/64 [0.812, 0.981]
    # (the best point, at 5); 35/64 at 25 [0.390, 0.695] lies wholly below it
    assert [(e.name, e.iteration, e.mode) for e in events] == [("reading_drift", 25, "warn")]
    event = events[0]
    assert event.evidence["reference_iteration"] == [5.0]
    assert event.evidence["iteration"] == [1.0, 5.0, 10.0, 15.0, 20.0, 25.0]
    assert "grounded" in event.message and "iteration 5" in event.message
    assert monitor.alarms["reading_drift"].in_breach  # once per episode of breach


def test_silent_when_the_mi_test_says_not_grounded():
    """A fall of reading while MI is no longer significant is template collapse's to
    report (its own alarm), not a drift the MI test cannot see."""
    points = {1: point(60), 5: point(58), 10: point(30, p=0.4), 15: point(25, p=0.2)}
    assert feed(AlarmMonitor(only_reading()), points) == []


def test_silent_on_noise_and_on_a_small_fall():
    rng = np.random.default_rng(3)
    for _ in range(20):  # 20 runs of 30 probe points at a steady 0.8
        points = {5 * k + 1: point(int(rng.binomial(64, 0.8))) for k in range(30)}
        assert feed(AlarmMonitor(only_reading()), points) == []
    # intervals apart at 1,000 levels, but a fall of 0.06 < min_drop 0.1
    points = {1: point(900, 1000), 5: point(840, 1000)}
    assert feed(AlarmMonitor(only_reading()), points) == []
    assert [e.iteration for e in feed(AlarmMonitor(only_reading(min_drop=0.05)), points)] == [5]


def test_patience_and_re_arming():
    points = {1: point(60), 5: point(30), 10: point(60), 15: point(30), 20: point(29)}
    fired = feed(AlarmMonitor(only_reading()), points)
    assert [e.iteration for e in fired] == [5, 15]  # recovered at 10: re-armed
    fired = feed(AlarmMonitor(only_reading(patience=2)), points)
    assert [e.iteration for e in fired] == [20]


def test_state_round_trip():
    points = {1: point(60), 5: point(58), 10: point(40), 15: point(38)}
    whole = AlarmMonitor(only_reading(patience=2), clock=lambda: 0.0)
    expected = feed(whole, points)
    first = AlarmMonitor(only_reading(patience=2), clock=lambda: 0.0)
    for it in range(1, 11):
        first.update(it, points.get(it, {}))
    state = json.loads(json.dumps(first.state_dict()))
    resumed = AlarmMonitor(only_reading(patience=2), clock=lambda: 0.0)
    resumed.load_state_dict(state)
    for it in range(11, 16):
        resumed.update(it, points.get(it, {}))
    assert [e.to_dict() for e in resumed.events] == [e.to_dict() for e in expected]
    assert [e.iteration for e in expected] == [15]


# The recorded case (benchmarks/history/2026-11-24.md, "What the policy reads after 30
# iterations"): 128 held-out FrozenLake levels, temperature 1, the warm start and the
# final models (iteration 30) of two 30-iteration quickstart runs, seeds 3 and 5; the
# permutation test said grounded (p 0.001) at iteration 30 in both.  Per fact:
RECORDED = {
    "grounding/player_right": {"warm start": 121, "seed 3": 61, "seed 5": 99},
    "grounding/goal_right": {"warm start": 89, "seed 3": 45, "seed 5": 52},
    # the decision did not drift: the first move stayed as often optimal or became more so
    "grounding/first_move_optimal": {"warm start": 70, "seed 3": 79, "seed 5": 75},
}


@pytest.mark.parametrize("metric", ["grounding/player_right", "grounding/goal_right"])
@pytest.mark.parametrize("seed", ["seed 3", "seed 5"])
def test_fires_on_the_recorded_drift(metric, seed):
    recorded = RECORDED[metric]
    points = {
        1: point(recorded["warm start"], 128, metric=metric),
        30: point(recorded[seed], 128, metric=metric),
    }
    events = feed(AlarmMonitor(only_reading(metric=metric)), points)
    assert [(e.name, e.iteration) for e in events] == [("reading_drift", 30)]


@pytest.mark.parametrize("seed", ["seed 3", "seed 5"])
def test_silent_on_the_recorded_rate_that_did_not_drift(seed):
    metric = "grounding/first_move_optimal"
    recorded = RECORDED[metric]
    points = {
        1: point(recorded["warm start"], 128, metric=metric),
        30: point(recorded[seed], 128, metric=metric),
    }
    assert feed(AlarmMonitor(only_reading(metric=metric)), points) == []


def test_config_is_strict():
    with pytest.raises(ValueError):
        ReadingDriftConfig(mode="act", actions=[])
    with pytest.raises(ValueError):
        ReadingDriftConfig(min_drop=1.5)


# The probe set on a 30-iteration quickstart (benchmarks/history/2026-11-26.md, "The probe
# set and reading accuracy on a 30-iteration quickstart"): hits of 64 probe levels.
QUICKSTART = {
    "grounding/player_right": [62, 60, 57, 49, 43, 43, 43],
    "grounding/goal_right": [30, 31, 31, 34, 32, 25, 28],
    READ: [29, 30, 31, 23, 22, 18, 18],
}


def quickstart_points():
    points = {}
    for k, it in enumerate((1, 5, 10, 15, 20, 25, 30)):
        points[it] = {}
        for metric, hits in QUICKSTART.items():
            points[it].update(point(hits[k], 64, metric=metric))
    return points


def test_a_fall_of_one_fact_that_the_others_dilute_fires():
    """The player named right fell 0.969 -> 0.672 while the goal, right about half the
    time throughout, kept `reading_acc`'s intervals overlapping: watching each fact (the
    default) fires at 20 on the player; `reading_acc` alone stays silent."""
    events = feed(AlarmMonitor(only_reading()), quickstart_points())
    assert [(e.name, e.iteration) for e in events] == [("reading_drift", 20)]
    assert events[0].evidence["metric"] == ["grounding/player_right"]
    assert "3 rate(s) watched" in events[0].message
    assert feed(AlarmMonitor(only_reading(each_fact=False)), quickstart_points()) == []


def test_watching_each_fact_keeps_the_false_alarm_rate():
    """Steady facts (player 0.95, goal 0.5, both = reading_acc) on 64 levels: the
    Bonferroni-widened intervals keep false alarms under 1 per 1,000 points (measured on
    another seed: 0.19 per 1,000 over 21,000 points, 0.76 with reading_acc alone)."""
    rng = np.random.default_rng(11)
    fired = 0
    for _ in range(100):  # 3,000 points: at 1 per 1,000 the mean is 3, P(> 9) < 0.001
        monitor = AlarmMonitor(only_reading(), clock=lambda: 0.0)
        for k in range(30):
            player, goal = rng.random(64) < 0.95, rng.random(64) < 0.5
            fired += len(
                monitor.update(
                    5 * k + 1,
                    {
                        READ: (player & goal).mean(),
                        "grounding/player_right": player.mean(),
                        "grounding/goal_right": goal.mean(),
                        "grounding/levels": 64.0,
                        P: 0.001,
                    },
                )
            )
    assert fired <= 9, fired
