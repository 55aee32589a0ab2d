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
from tether.platform.run.diagnosis import Diagnosis


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

    def collect(specs, seed, max_turns):
        collected.append((specs, seed))
        assert max_turns == 1  # first turns only without outcome_samples
        return [
            SimpleNamespace(env_seed=s.env_seed, sample_index=s.sample_index, turns=[])
            for s in specs
        ]

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
    assert Diagnosis(off, 0, collect=lambda specs, seed, max_turns: []).run(
        1, [], learner, tracker
    ) == {"collapse/first_turn/mi_estimate": 0.1}
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

    from tether.platform.cli.main import _summary_table
    from tether.platform.run.trainer import RunSummary

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

    # Shipped: log_jackknife for both, each chosen by its own protocol (RESULTS, "Interval
    # coverage" and "Alarm quality").
    assert DiagnosticsConfig().probe_uncertainty().interval == "log_jackknife"
    assert DiagnosticsConfig().uncertainty().interval == "log_jackknife"
    same = DiagnosticsConfig(interval="jackknife", probe={"interval": "same"})
    assert same.probe_uncertainty() == same.uncertainty()
    own = DiagnosticsConfig(probe={"interval": "jackknife"}, bootstrap=200)
    assert own.uncertainty().interval == "log_jackknife"
    assert own.probe_uncertainty().interval == "jackknife"
    assert own.probe_uncertainty().bootstrap == 200  # the rest is the diagnostics'


def test_bfloat16_scoring_stays_near_float32(micro_policy):
    """``diagnostics.autocast``: the probe's cross-scoring in bfloat16 autocast (the head
    and the log-softmax in float32) gives the float32 proxies to within a hundredth of a
    nat per token on real first turns of the micro policy, and does run in bfloat16 (the
    numbers are not float32's to the bit)."""
    import torch

    from tests.test_episode import _setup
    from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
    from tether.agent.pairs import SpanExtractor
    from tether.algos.update import autocast
    from tether.diagnostics.runner import probe_diagnostics

    model, _, formatter, engine, sampling = _setup(micro_policy)
    specs = [EpisodeSpec(k, level, 0) for k, level in enumerate(seeds.probe_levels(10**6, 16))]
    trajectories = run_episodes(
        engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 4, max_turns=1
    )
    unc = Uncertainty(bootstrap=0, permutations=0, confidence=0.95, alpha=0.05)
    metrics = {}
    for precision in ("none", "bfloat16"):
        with torch.no_grad(), autocast(model, precision):
            metrics[precision] = probe_diagnostics(
                model, trajectories, SpanExtractor(formatter), 1.0, None, 3, uncertainty=unc
            ).metrics
    full, mixed = metrics["none"], metrics["bfloat16"]
    keys = ("mi_estimate", "conditional_entropy_est", "mi_seq_estimate")
    assert any(full[f"collapse/probe/{k}"] != mixed[f"collapse/probe/{k}"] for k in keys)
    for key in keys:
        assert mixed[f"collapse/probe/{key}"] == pytest.approx(
            full[f"collapse/probe/{key}"], abs=0.01
        ), key


@pytest.mark.parametrize("precision", ["none", "bfloat16"])
def test_the_learner_scores_in_the_diagnostics_precision(micro_policy, monkeypatch, precision):
    """The learner's batch and probe cross-scoring run under ``diagnostics.autocast`` (as
    decided for its device), whatever the update's own ``algo.autocast``."""
    import torch

    import tether.diagnostics.runner as runner
    from tether.actors.learner import Learner
    from tether.testing.settings import update_settings

    seen = []
    for name in ("collapse_diagnostics", "probe_diagnostics"):
        monkeypatch.setattr(
            runner, name, lambda *a, **k: seen.append(torch.is_autocast_enabled("cpu"))
        )
    threads = torch.get_num_threads()
    try:
        learner = Learner.__ray_actor_class__(str(micro_policy), False, 1, use_reference=False)
        learner.start_run(update_settings(), lr=1e-3, critic_lr=0.0, seed=0)
        cfg = DiagnosticsConfig(autocast=precision)
        learner.diagnose([], cfg, None, 0, False)
        learner.probe([], cfg, None, 0)
    finally:
        torch.set_num_threads(threads)
    assert seen == [precision == "bfloat16"] * 2
