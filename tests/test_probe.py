"""The diagnostic probe set: fixed held-out levels, one first turn each sampled by the
current policy, cross-scored in full (``collapse/probe/…``), at its cadence."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from tether import seeds
from tether.diagnostics.settings import DiagnosticsConfig
from tether.diagnostics.uncertainty import Uncertainty
from tether.envs.settings import EnvConfig
from tether.platform.diagnosis import Diagnosis


def test_probe_levels_are_fixed_distinct_and_held_out():
    levels = seeds.probe_levels(1_000_000, 64)
    assert len(set(levels)) == 64 and min(levels) > 1_000_000
    assert max(levels) < 1_000_000 + seeds.PROBE_SPAN
    assert levels == seeds.probe_levels(1_000_000, 64)  # no run seed: every run the same
    assert seeds.probe_levels(1_000_000, 8) == levels[:8]  # fewer levels: a prefix
    assert len(set(seeds.probe_levels(7, 5000))) == 5000
    with pytest.raises(ValueError):
        seeds.probe_levels(1_000_000, 0)


class ProbeLearner:
    """``learner.probe`` as the diagnosis stage sees it; records its calls."""

    def __init__(self):
        self.calls = []

    def diagnose(self, collected, cfg, ema_state, seed, heatmaps_due, chain_due):
        return SimpleNamespace(
            ema_state={**ema_state, "first_turn": {"sigma": 1.0}},
            prompt_mi={},
            matrices={},
            metrics={"collapse/first_turn/mi_estimate": 0.1},
        )

    def probe(self, trajectories, cfg, ema_state, seed):
        self.calls.append((len(trajectories), ema_state, seed))
        return SimpleNamespace(
            ema_state={"probe": {"sigma": float(len(self.calls))}},
            metrics={"collapse/probe/mi_estimate": 0.5},
        )


def test_diagnosis_collects_the_probe_levels_at_its_cadence():
    collected = []

    def collect(specs, seed):
        collected.append((specs, seed))
        return [SimpleNamespace(env_seed=s.env_seed, turns=[]) for s in specs]

    cfg = DiagnosticsConfig(every=1, probe={"levels": 16, "every": 3})
    env = EnvConfig(val_seed_offset=2_000)
    diagnosis, learner = Diagnosis(cfg, 5, env, collect), ProbeLearner()
    tracker = SimpleNamespace(log_json=lambda *a: None, log_figure=lambda *a: None)
    logged = {it: diagnosis.run(it, [], learner, tracker) for it in range(1, 8)}
    assert [it for it, m in logged.items() if "collapse/probe/mi_estimate" in m] == [1, 3, 6]
    assert all("collapse/first_turn/mi_estimate" in m for m in logged.values())
    specs, seed = collected[0]
    assert [s.env_seed for s in specs] == seeds.probe_levels(2_000, 16)
    assert [s.group_id for s in specs] == list(range(16)) and seed == seeds.probe(5, 1)
    # the probe's running averages are its own, carried between its points and kept
    # beside the batch samplings' (what a checkpoint saves)
    assert [call[1] for call in learner.calls] == [None, {"sigma": 1.0}, {"sigma": 2.0}]
    assert diagnosis.ema_state == {"first_turn": {"sigma": 1.0}, "probe": {"sigma": 3.0}}
    assert "timing/diagnose/probe/collect" in logged[3]


def test_no_probe_without_a_collection_or_when_disabled():
    learner = ProbeLearner()
    tracker = SimpleNamespace(log_json=lambda *a: None)
    assert "collapse/probe/mi_estimate" not in Diagnosis(DiagnosticsConfig(), 0).run(
        1, [], learner, tracker
    )
    off = DiagnosticsConfig(probe={"enabled": False})
    assert Diagnosis(off, 0, collect=lambda specs, seed: []).run(1, [], learner, tracker) == {
        "collapse/first_turn/mi_estimate": 0.1
    }
    assert learner.calls == []


def test_probe_diagnostics_score_every_level_against_every_prompt():
    """40 probe levels (more than the batch's max_pairs 32, and 40 x 40 cells, more than
    its max_cells 256): all pairs are scored, the bound is log 40, and the keys are the
    probe's, with intervals and the permutation test."""
    from tether.diagnostics.runner import probe_diagnostics
    from tether.policy.tiny import build_tiny_model, tiny_config

    model = build_tiny_model(tiny_config("micro", max_context=256), seed=0)
    rng = np.random.default_rng(0)
    prompts = [tuple(int(t) for t in rng.integers(5, 300, size=12)) for _ in range(40)]
    turns = {
        k: [SimpleNamespace(prompt_ids=p, reasoning_ids=p[:6], action_ids=(3,))]
        for k, p in enumerate(prompts)
    }
    extractor = SimpleNamespace(turns=lambda t: turns[t.group_id], answer_prefix_ids=(1, 2))
    trajectories = [SimpleNamespace(group_id=k) for k in range(40)]
    result = probe_diagnostics(
        model,
        trajectories,
        extractor,
        1.0,
        None,
        seed=3,
        uncertainty=Uncertainty(bootstrap=50, permutations=50, confidence=0.95, alpha=0.05),
    )
    m = result.metrics
    assert m["collapse/probe/num_pairs"] == 40 and m["collapse/probe/num_prompts"] == 40
    assert m["collapse/probe/mi_upper_bound"] == pytest.approx(math.log(40))
    for key in ("mi_estimate_ci_low", "mi_estimate_ci_high", "p_grounded", "retrieval_acc"):
        assert math.isfinite(m[f"collapse/probe/{key}"]), key
    assert not any(k.startswith("collapse/first_turn") for k in m)
    assert not any("/za/" in k or "/xa/" in k for k in m)  # no information chain
    assert "timing/diagnose/probe/xz" in m and set(result.ema_state) == {"probe"}


def test_the_closing_summary_shows_the_probe_and_reading_accuracy():
    from rich.console import Console

    from tether.platform.cli import _summary_table
    from tether.platform.trainer import RunSummary

    diagnostics = {
        "iteration": 30.0,
        "collapse/probe/mi_estimate": 2.5,
        "collapse/probe/mi_estimate_ci_low": 2.1,
        "collapse/probe/mi_estimate_ci_high": 2.9,
        "grounding/reading_acc": 0.75,
        "grounding/reading_acc_ci_low": 0.63,
        "grounding/reading_acc_ci_high": 0.84,
    }
    summary = RunSummary(
        "r", "sqlite://", "mlflow ui", 30, "FINISHED", 1.0, "m", last_diagnostics=diagnostics
    )
    console = Console(width=200, record=True)
    console.print(_summary_table(summary))
    text = console.export_text()
    assert "collapse/probe/mi_estimate @ 30" in text and "2.500 [2.100, 2.900]" in text
    assert "grounding/reading_acc @ 30" in text and "0.750 [0.630, 0.840]" in text


def test_the_probe_has_its_own_interval():
    from tether.diagnostics.settings import DiagnosticsConfig

    # Shipped: the probe's jackknife beside the batch's bootstrap (RESULTS, "Interval coverage").
    assert DiagnosticsConfig().probe_uncertainty().interval == "jackknife"
    assert DiagnosticsConfig().uncertainty().interval == "bootstrap"
    same = DiagnosticsConfig(interval="jackknife", probe={"interval": "same"})
    assert same.probe_uncertainty() == same.uncertainty()
    own = DiagnosticsConfig(probe={"interval": "jackknife"}, bootstrap=200)
    assert own.uncertainty().interval == "bootstrap"
    assert own.probe_uncertainty().interval == "jackknife"
    assert own.probe_uncertainty().bootstrap == 200  # the rest is the diagnostics'
