"""Where the probe's MI goes by each level's reward variance (issue 70, item 1):
``tether.diagnostics.mechanism`` on outcomes whose answer is known by construction, and
the probe collecting full episodes when ``diagnostics.probe.outcome_samples`` asks."""

from types import SimpleNamespace

import numpy as np
import pytest

from tether import seeds
from tether.diagnostics.mechanism import level_record, probe_mechanism
from tether.diagnostics.settings import DiagnosticsConfig
from tether.envs.settings import EnvConfig
from tether.platform.run.diagnosis import Diagnosis


def _outcomes(kinds):
    """kind per level: 'fail' (all 0), 'pass' (all 1), 'mixed' (half and half)."""
    table = {
        "fail": ([0.0] * 4, [False] * 4),
        "pass": ([1.0] * 4, [True] * 4),
        "mixed": ([0.0, 1.0, 0.0, 1.0], [False, True, False, True]),
    }
    return {g: tuple(np.array(v) for v in table[k]) for g, k in enumerate(kinds)}


def test_the_mi_lost_in_zero_variance_levels_gives_a_negative_gap():
    kinds = ["fail"] * 6 + ["pass"] * 2 + ["mixed"] * 8
    outcomes = _outcomes(kinds)
    first = {g: 0.5 for g in range(16)}
    rng = np.random.default_rng(0)
    # zero-variance levels lost 0.3 nats/token, the others 0.0 (+ small noise)
    now = {
        g: 0.5 - (0.3 if k != "mixed" else 0.0) + 0.01 * rng.standard_normal()
        for g, k in enumerate(kinds)
    }
    m = probe_mechanism(outcomes, now, first)
    assert m["mechanism/probe_levels"] == 16
    assert m["mechanism/probe_success"] == pytest.approx((2 * 4 + 8 * 2) / 64)
    assert (
        m["mechanism/probe_success_ci_low"]
        < m["mechanism/probe_success"]
        < m["mechanism/probe_success_ci_high"]
    )
    assert m["mechanism/probe_zero_rv_share"] == 0.5
    assert m["mechanism/probe_zero_rv_all_failed"] == 6 / 16
    assert m["mechanism/probe_zero_rv_all_succeeded"] == 2 / 16
    assert m["mechanism/probe_zero_rv_uninformative"] == 0.0
    assert m["mechanism/probe_mi_change/zero_rv"] == pytest.approx(-0.3, abs=0.02)
    assert m["mechanism/probe_mi_change/nonzero_rv"] == pytest.approx(0.0, abs=0.02)
    assert m["mechanism/probe_mi_change/gap"] == pytest.approx(-0.3, abs=0.02)
    assert (
        m["mechanism/probe_mi_change/gap_ci_high"] < 0
        and m["mechanism/probe_mi_change/gap_p"] < 1e-6
    )
    assert m["mechanism/probe_mi/zero_rv"] == pytest.approx(0.2, abs=0.02)
    assert m["mechanism/probe_mi/zero_rv_levels"] == 8


def test_an_even_loss_gives_a_gap_whose_interval_holds_zero():
    kinds = ["fail"] * 8 + ["mixed"] * 8
    rng = np.random.default_rng(1)
    now = {g: 0.2 + 0.05 * rng.standard_normal() for g in range(16)}
    m = probe_mechanism(_outcomes(kinds), now, {g: 0.5 for g in range(16)})
    assert (
        m["mechanism/probe_mi_change/gap_ci_low"] < 0 < m["mechanism/probe_mi_change/gap_ci_high"]
    )
    assert m["mechanism/probe_mi_change/zero_rv"] == pytest.approx(-0.3, abs=0.05)


def test_degenerate_outcomes_give_metrics_not_errors():
    assert probe_mechanism({}, {}) == {}
    one_each = {0: (np.array([1.0]), np.array([True]))}
    assert probe_mechanism(one_each, {0: 0.1}) == {}  # a single episode has no variance
    all_fail = _outcomes(["fail"] * 4)
    m = probe_mechanism(all_fail, {0: float("nan"), 1: 0.1}, None)  # unscored levels: NaN MI
    assert m["mechanism/probe_success"] == 0.0 and m["mechanism/probe_zero_rv_share"] == 1.0
    assert m["mechanism/probe_mi/zero_rv_levels"] == 1 and "mechanism/probe_mi/nonzero_rv" not in m
    assert not any("mi_change" in k for k in m)
    record = level_record(3, [10, 11, 12, 13], all_fail, {1: 0.1})
    assert record["levels"][1] == {
        "level": 11,
        "rewards": [0.0] * 4,
        "success": [False] * 4,
        "mi": 0.1,
    }
    assert record["levels"][0]["mi"] is None


def test_the_probe_plays_each_level_to_the_end_with_outcome_samples():
    calls, logged = [], {}

    def collect(specs, seed, max_turns):
        calls.append((specs, max_turns))
        return [
            SimpleNamespace(
                group_id=s.group_id,
                env_seed=s.env_seed,
                sample_index=s.sample_index,
                turns=[],
                reward=float(s.group_id % 2 == 0 and s.sample_index % 2 == 0),
                success=bool(s.group_id % 2 == 0 and s.sample_index % 2 == 0),
            )
            for s in specs
        ]

    class Learner:
        def __init__(self):
            self.scored = []

        def diagnose(self, collected, cfg, ema_state, *rest):  # carries the other keys
            return SimpleNamespace(ema_state=dict(ema_state), matrices={}, metrics={}, prompt_mi={})

        def probe(self, trajectories, cfg, ema_state, seed):
            self.scored.append([t.sample_index for t in trajectories])
            mi = 0.5 if not self.scored[:-1] else 0.2
            return SimpleNamespace(
                ema_state={"probe": {}},
                metrics={"collapse/probe/mi_estimate": mi},
                prompt_mi={g: {"mi": mi if g % 2 else 0.5, "pairs": 1.0} for g in range(8)},
            )

    cfg = DiagnosticsConfig(every=1, probe={"levels": 8, "every": 2, "outcome_samples": 4})
    diagnosis, learner = Diagnosis(cfg, 3, EnvConfig(), collect), Learner()
    tracker = SimpleNamespace(
        log_json=lambda data, path: logged.__setitem__(path, data), log_figure=lambda *a: None
    )
    first = diagnosis.run(1, [], learner, tracker)
    specs, max_turns = calls[0]
    assert max_turns is None and len(specs) == 32  # 8 levels x 4 episodes, to the end
    assert learner.scored[0] == [0] * 8  # one first turn a level is cross-scored
    assert first["mechanism/probe_success"] == pytest.approx(8 / 32)
    assert first["mechanism/probe_zero_rv_share"] == 0.5  # the odd levels all fail
    assert first["mechanism/probe_mi_change/zero_rv"] == 0.0
    second = diagnosis.run(2, [], learner, tracker)
    # the odd (zero-variance) levels lost 0.3 since the first point, the even ones nothing
    assert second["mechanism/probe_mi_change/zero_rv"] == pytest.approx(-0.3)
    assert second["mechanism/probe_mi_change/nonzero_rv"] == pytest.approx(0.0)
    assert sorted(logged) == ["probe_levels/iter_0001.json", "probe_levels/iter_0002.json"]
    assert (
        logged["probe_levels/iter_0001.json"]["levels"][0]["level"]
        == seeds.probe_levels(EnvConfig().val_seed_offset, 8)[0]
    )
    assert diagnosis.ema_state["probe_first_mi"]["1"] == 0.5  # the baseline a checkpoint keeps
