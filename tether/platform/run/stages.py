"""The iteration's stages that are not a single actor call: which levels train, the
group filter, dynamic sampling, advantages, validation episodes, memory readings, and
the timers every stage runs in.  Each is a function of its inputs (no run state)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

from ... import seeds
from ...actors.memory import peak_rss_gb
from ...agent.episode import EpisodeSpec
from ...agent.metrics import EPISODE_ENDS, group_rewards, group_trajectories, transcript
from ...algos.advantages import (
    AdvantageInputs,
    bound_params,
    compute_advantages,
    format_advantages,
)
from ...algos.filters import snr_filter
from ...algos.settings import AlgoConfig, FilterConfig
from ...rollout.base import SamplingParams
from ..config import TetherConfig, TrainerConfig
from ..tracking.tracker import Tracker
from .cadence import due
from .fleet import RolloutFleet

#: Group ids of dynamic-sampling round r start at r * RESAMPLE_GROUP_IDS (round 0, the
#: iteration's own collection, is 0 .. groups - 1), so groups of different rounds differ.
RESAMPLE_GROUP_IDS = 1000

#: what a validation logs (``val/…``)
VALIDATION_METRICS = (
    "val/success",
    "val/success_ci_low",
    "val/success_ci_high",
    "val/reward_mean",
    "val/format_ok_rate",
    "val/turns",
    # How held-out episodes end (agent.metrics.EPISODE_ENDS): where the policy fails.
    *(f"val/end/{kind}" for kind in EPISODE_ENDS),
)


class Timers(dict):
    """``with timers("collect"): ...`` adds the block's seconds to ``timing/collect``."""

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self[f"timing/{name}"] = self.get(f"timing/{name}", 0.0) + time.perf_counter() - start


class LevelSampler:
    """Training level seeds: a counter mapped below the validation seed range."""

    def __init__(self, seed: int, limit: int, position: int = 0) -> None:
        self.seed, self.limit, self.position = seed, limit, position

    def take(self, n: int) -> list[int]:
        levels = seeds.training_levels(self.seed, self.position, n, self.limit)
        self.position += n
        return levels

    def specs(self, n_groups: int, group_size: int, first_group_id: int) -> list[EpisodeSpec]:
        """The next ``n_groups`` levels, ``group_size`` episodes each."""
        return [
            EpisodeSpec(first_group_id + g, seed, k)
            for g, seed in enumerate(self.take(n_groups))
            for k in range(group_size)
        ]


def filter_groups(trajectories, filter_cfg: FilterConfig):
    """SNR-aware filter over whole groups (docs/methods.md, section 5): the filter's
    result and the ids of the groups it keeps."""
    groups = group_trajectories(trajectories)
    result = snr_filter(
        [np.array([t.reward for t in ts]) for ts in groups.values()],
        filter_cfg,
        success=[np.array([t.success for t in ts]) for ts in groups.values()],
    )
    ids = list(groups)
    return result, {ids[g] for g in result.kept_groups}


def group_spread(trajectories, group_id: int) -> float:
    return float(np.ptp([t.reward for t in trajectories if t.group_id == group_id]))


def dynamic_sampling(
    collected,
    kept: set[int],
    collect_round: Callable[[int], list],
    filter_cfg: FilterConfig,
    groups: int,
    max_rounds: int,
):
    """DAPO's dynamic sampling (docs/methods.md, section 6): drop the kept groups without
    reward spread and collect fresh groups (``collect_round(r)``, each round filtered the
    same way) until the batch has ``groups`` groups with spread or ``max_rounds`` rounds ran.

    Returns every trajectory collected this iteration (the first collection's first),
    the ids of the groups that train, and this stage's metrics (the rollout and filter
    metrics describe the first collection alone)."""
    pool = list(collected)
    kept = {g for g in kept if group_spread(pool, g) > 0}
    rounds = 0
    while len(kept) < groups and rounds < max_rounds:
        rounds += 1
        more = collect_round(rounds)
        pool += more
        _, extra = filter_groups(more, filter_cfg)
        kept |= {g for g in extra if group_spread(more, g) > 0}
    kept = set(sorted(kept)[:groups])
    return (
        pool,
        kept,
        {
            "filter/resample_rounds": float(rounds),
            "dynamic_sampling/collected_trajectories": float(len(pool) - len(collected)),
            "dynamic_sampling/kept_groups": float(len(kept)),
        },
    )


def advantages(batch, algo: AlgoConfig):
    """The batch with ``advantages`` and ``returns`` by ``algo.advantage`` (and the format
    term's ``format_advantages`` when ``algo.format_coef`` is on)."""
    inputs = AdvantageInputs(
        scores=batch.scores,
        group_index=batch.group_index,
        response_mask=batch.response_mask,
        token_rewards=batch.token_rewards,
        values=batch.values,
    )
    batch.advantages, batch.returns = compute_advantages(
        algo.advantage, inputs, **bound_params(algo.advantage, algo)
    )
    if algo.format_coef != 0.0:
        batch.format_advantages = format_advantages(batch.malformed_mask, batch.response_mask)
    return batch


def validation_episodes(
    cfg: TetherConfig, sampling: SamplingParams
) -> tuple[list[EpisodeSpec], SamplingParams]:
    """The held-out episodes (one per validation level) and how they are sampled."""
    temperature = cfg.trainer.val_temperature
    val_sampling = SamplingParams(
        **{
            **sampling.__dict__,
            "temperature": cfg.rollout.temperature if temperature is None else temperature,
        }
    )
    specs = [
        EpisodeSpec(k, cfg.env.val_seed_offset + k, 0) for k in range(cfg.trainer.val_episodes)
    ]
    return specs, val_sampling


def memory_metrics(learner, fleet: RolloutFleet) -> dict[str, float]:
    """``system/peak_rss_gb/<process>``: the peak resident memory (GiB) of the driver,
    each learner rank and each rollout worker since the previous iteration's reading
    (the first: since the process started); ``system/peak_rss_gb``: their sum, an
    upper bound on what these processes held at once (shared pages count in each)."""
    peaks = {"driver": peak_rss_gb(reset=True)}
    ranks = learner.peak_rss_gb()
    if len(ranks) == 1:
        peaks["learner"] = ranks[0]
    else:
        peaks.update({f"learner_rank{r}": v for r, v in enumerate(ranks)})
    peaks.update(fleet.peak_rss_gb())
    out = {f"system/peak_rss_gb/{name}": value for name, value in peaks.items()}
    out["system/peak_rss_gb"] = sum(peaks.values())
    return out


def log_samples(
    tracker: Tracker, t: TrainerConfig, it: int, trajectories, decode: Callable
) -> None:
    """Iteration ``it``'s sample transcripts and per-prompt rewards, at their cadence."""
    if t.samples_per_log and due(it, t.samples_every, first=True):
        text = "\n\n".join(transcript(tr, decode) for tr in trajectories[: t.samples_per_log])
        tracker.log_text(text, f"samples/iter_{it:04d}.txt")
    if due(it, t.samples_every, first=True, last=t.iterations):
        tracker.log_json(
            {"iteration": it, "groups": group_rewards(trajectories)},
            f"prompts/iter_{it:04d}.json",
        )


#: An iteration whose metrics hold one of these is logged whatever ``metrics_every`` says:
#: the diagnostic, gradient-SNR and validation points the analyses read.
POINT_PREFIXES = ("collapse/", "grad_snr/", "mechanism/", "val/")


def log_iteration(
    tracker: Tracker, t: TrainerConfig, it: int, metrics: dict, trajectories, decode: Callable
) -> None:
    """Iteration ``it``'s metrics and samples; ``timing/log`` (the logging's own time,
    which cannot be in the dict it logs) follows on its own and is added to ``metrics``."""
    started = time.perf_counter()
    logged = due(it, t.metrics_every, first=True, last=t.iterations) or any(
        key.startswith(POINT_PREFIXES) for key in metrics
    )
    if logged:
        tracker.log_metrics(metrics, step=it)
    log_samples(tracker, t, it, trajectories, decode)
    metrics["timing/log"] = time.perf_counter() - started
    if logged:
        tracker.log_metrics({"timing/log": metrics["timing/log"]}, step=it)
