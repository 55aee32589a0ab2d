"""The collapse diagnostics of a run, at their cadences: cross-score MI proxies with the
pre-update policy (docs/methods.md, section 2), on the batch and on the probe set, their
heatmaps, and gradient SNR (section 10).  The learner computes; this part decides when,
has the probe set's first turns collected, keeps the MI running averages between
iterations and logs the heatmaps."""

from __future__ import annotations

import time
from collections.abc import Callable

from ... import seeds
from ...agent.episode import EpisodeSpec
from ...envs.settings import EnvConfig
from ..config import DiagnosticsConfig
from ..tracking.tracker import Tracker
from .cadence import due

#: ``collect(specs, seed, max_turns)``: the probe's episodes (one turn each with
#: ``max_turns`` 1, to the end with None), sampled by the current policy at the rollout
#: temperature (the trainer's fleet)
ProbeCollect = Callable[[list[EpisodeSpec], int, int | None], list]


def prompt_mi_path(it: int) -> str:
    """Artifact of iteration ``it``'s prompt-level diagnostics (apart from ``prompts/``,
    whose ``iter_N.json`` files are the heatmaps')."""
    return f"prompt_mi/iter_{it:04d}.json"


def prompt_mi_record(it: int, collected, prompt_mi: dict[int, dict[str, float]]) -> dict:
    """Per group of the diagnosed batch: its env seed, rewards and successes
    (``group_rewards``) and the pointwise MI of its first-turn prompt with the number of
    scored pairs (null when none of its pairs was scored): what finding d's prompt-level
    reward-variance quartiles need (docs/methods.md, section 13)."""
    from ...agent.metrics import group_rewards

    groups = []
    for group in group_rewards(collected):
        scored = prompt_mi.get(int(group["group_id"]))
        groups.append(
            {
                **group,
                "mi": scored["mi"] if scored else None,
                "pairs": scored["pairs"] if scored else 0,
            }
        )
    return {"iteration": it, "sampling": "first_turn", "mi": "mi_estimate", "groups": groups}


class Diagnosis:
    def __init__(
        self,
        cfg: DiagnosticsConfig,
        seed: int,
        env: EnvConfig | None = None,
        collect: ProbeCollect | None = None,
    ) -> None:
        """``env``: the run's env (the probe's levels are drawn from its held-out seeds,
        ``val_seed_offset``, and read against its true states); without ``collect`` there
        is no probe."""
        self.cfg, self.seed, self.collect = cfg, seed, collect
        self.env = env or EnvConfig()
        self.probe_levels = seeds.probe_levels(self.env.val_seed_offset, cfg.probe.levels)
        #: the MI diagnostics' running averages, the probe's under "probe" (a checkpoint
        #: keeps them)
        self.ema_state: dict = {}

    def grad_snr_due(self, it: int) -> bool:
        return self.cfg.enabled and due(it, self.cfg.grad_snr_every)

    def run(self, it: int, collected, learner, tracker: Tracker) -> dict[str, float]:
        """The MI proxies of ``collected`` (``collapse/…``) when diagnostics are due."""
        d = self.cfg
        if not d.enabled or not due(it, d.every, first=True):
            return {}
        result = learner.diagnose(
            collected,
            d,
            self.ema_state,
            seeds.diagnostics(self.seed, it),
            due(it, d.heatmap_every, first=True),
            d.information_chain and due(it, d.chain_every, first=True),
        )
        self.ema_state = result.ema_state
        result.metrics.update(self.probe(it, learner, tracker))
        if result.prompt_mi:
            tracker.log_json(prompt_mi_record(it, collected, result.prompt_mi), prompt_mi_path(it))
        started = time.perf_counter()
        for sampling, (scores, column) in result.matrices.items():
            from ...diagnostics.plots import cross_score_heatmap

            figure = cross_score_heatmap(scores, column, f"{sampling} cross-scores, iteration {it}")
            tracker.log_figure(figure, f"diagnostics/cross_scores_{sampling}_{it:04d}.png")
            import matplotlib.pyplot as plt

            plt.close(figure)
        if result.matrices:
            result.metrics["timing/diagnose/heatmaps"] = time.perf_counter() - started
        return result.metrics

    def probe(self, it: int, learner, tracker: Tracker) -> dict[str, float]:
        """The probe set's ``collapse/probe/…`` at its cadence: each probe level's first
        turn sampled by the current policy, cross-scored against all probe prompts; and
        what those turns state about their input, scored against the true states
        (``grounding/…``, reading accuracy)."""
        from ...agent.reading import grounding_metrics

        p = self.cfg.probe
        if self.collect is None or not p.enabled or not due(it, p.every, first=True):
            return {}
        started = time.perf_counter()
        samples = max(1, p.outcome_samples)  # with outcomes: each level played to the end
        specs = [
            EpisodeSpec(k, level, s)
            for k, level in enumerate(self.probe_levels)
            for s in range(samples)
        ]
        episodes = self.collect(specs, seeds.probe(self.seed, it), None if p.outcome_samples else 1)
        trajectories = [t for t in episodes if t.sample_index == 0]  # one first turn a level
        collected = time.perf_counter()
        reading = grounding_metrics(trajectories, self.env.id, self.env.kwargs)
        read = time.perf_counter()
        result = learner.probe(
            trajectories, self.cfg, self.ema_state.get("probe"), seeds.diagnostics(self.seed, it)
        )
        self.ema_state = {**self.ema_state, **result.ema_state}
        mechanism = (
            self.mechanism(it, episodes, result.prompt_mi, tracker) if p.outcome_samples else {}
        )
        return {
            **result.metrics,
            **reading,
            **mechanism,
            "timing/diagnose/probe/collect": collected - started,
            "timing/diagnose/probe/reading": read - collected,
            "timing/diagnose/probe/total": time.perf_counter() - started,
        }

    def mechanism(self, it: int, episodes, prompt_mi: dict, tracker: Tracker) -> dict[str, float]:
        """``mechanism/probe…``: where the probe's MI goes, by each level's reward variance
        under the current policy (docs/methods.md, "The mechanism, measured"); the first
        probe point's per-level MI is kept (and checkpointed) as the baseline."""
        from ...diagnostics.mechanism import level_outcomes, level_record, probe_mechanism

        outcomes = level_outcomes(episodes)
        level_mi = {int(g): float(v["mi"]) for g, v in prompt_mi.items()}
        first = self.ema_state.get("probe_first_mi")
        if first is None:
            first = self.ema_state["probe_first_mi"] = {str(g): v for g, v in level_mi.items()}
        metrics = probe_mechanism(outcomes, level_mi, {int(g): v for g, v in first.items()})
        record = level_record(it, self.probe_levels, outcomes, level_mi)
        tracker.log_json(record, f"probe_levels/iter_{it:04d}.json")
        return metrics
