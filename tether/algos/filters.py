"""SNR-aware group filter (docs/methods.md, section 5): keep whole prompt groups whose rewards vary.

A group's task gradient scales with the spread of its rewards, while the KL and
entropy regularisers do not; groups with near-zero reward variance (RV) feed the
update only input-agnostic regulariser gradient.  The filter scores each group by
its reward std (or variance) and keeps the high-score groups.

    result = snr_filter(group_rewards, FilterConfig(strategy="top_p", value=0.9))
    result.kept_groups   # original group indices, ascending
    result.loss_scale    # multiply advantages (or the task loss) by this
    result.metrics       # filter/* keys, see below

Strategies (registry ``FILTER_STRATEGIES``), on the candidate groups (all groups,
or only those with score > ``zero_tol`` when ``include_zero`` is False), ranked by
score descending with ties broken by original index (stable sort):
  - ``none``: keep every group (``include_zero`` is ignored: no filtering at all).
  - ``top_p``, ``mode="linear"`` (RAGEN's rule): ρ = value.  If ρ ≥ 1 keep all
    candidates.  Otherwise threshold = ρ·Σs − selection_eps (selection_eps = 0.01);
    walk the ranking and add a group while the cumulative score *before adding it*
    is below the threshold, stopping at the first s ≤ 0.  The kept set is thus the
    shortest prefix whose score mass reaches ρ·Σs − eps: the group that crosses the
    threshold is kept, the one after it is not.  If the walk stops on s ≤ 0 before
    reaching the threshold (only possible with negative scores) nothing is kept.
    E.g. s = [4,3,2,1], ρ = 0.7: threshold 6.99; before 4: 0 < 6.99 keep; before 3:
    4 < 6.99 keep; before 2: 7 ≥ 6.99 stop -> keep the groups scoring 4 and 3.
  - ``top_p``, ``mode="softmax"``: p = softmax(s); keep the shortest prefix whose
    cumulative p reaches ρ (ρ ≥ 1 keeps all candidates).
  - ``top_k``: keep max(1, int(value·n_groups)) best candidates (n_groups counts all
    groups; never more than there are candidates).
  - ``top_k_abs``: keep int(value) best candidates (value ≥ 1).
  - ``min_p``: keep candidates with s ≥ value·max(s).
``int(value·n)`` is evaluated with a 1e-9 guard so 0.29·100 gives 29, not 28.

Group score (``metric``) of the rewards ``reward`` names (registry ``FILTER_REWARDS``):
``"shaped"`` (the default) scores each trajectory's whole reward, format penalties and
partial credit included; ``"outcome"`` scores its task outcome, 1.0 where its ``success``
flag is set and 0.0 elsewhere (``success`` is then required), so a group in which every
trajectory failed the task scores 0 however its format penalties differ.  Only the
ranking and keeping use it: the caller's advantages stay on the shaped reward.  The
score is reward std (``"reward_std"``, the default, as RAGEN's code) or
reward variance (``"reward_variance"``, as the paper's text) with ``ddof`` (default 1).
A group with ≤ ddof trajectories has an undefined spread; it scores 0.  Variance is the
square of std, so both rank the groups alike: ``top_k`` and ``top_k_abs`` keep the same
groups on either; ``top_p`` (a share of the cumulative score mass) and ``min_p`` (a
ratio to the best score) compare magnitudes and can keep different ones.  E.g. stds
[3, 2, 2, 1], ρ = 0.5: std mass 8, threshold 3.99 -> keep 3 and the first 2 (3 < 3.99);
variance mass 18, threshold 8.99 -> keep 9 only (9 ≥ 8.99 after it).

Loss scaling after filtering (``loss_scaling``): ``none`` -> 1, ``linear`` -> kept
ratio, ``sqrt`` -> √(kept ratio); kept ratio = kept groups / all groups.

Metrics (all floats; "zero-variance" and the scores are those of the ranked rewards, so
with ``reward="outcome"`` zero outcome variance):
  filter/kept_groups, filter/kept_ratio, filter/kept_trajectories,
  filter/zero_variance_groups (score ≤ zero_tol), filter/empty (1 -> skip update),
  filter/loss_scale, filter/score_mean, filter/kept_score_mean,
  filter/kept_all_failed_outcome (kept groups in which every trajectory failed the task,
  classified as below; with ``reward="outcome"`` such a group scores 0, so the count is 0
  unless zero-score groups are kept: ``include_zero`` or strategy ``none``), and the
  breakdown of *dropped* groups:
    filter/dropped_all_failed      zero-variance, every trajectory failed (too hard)
    filter/dropped_all_succeeded   zero-variance, every trajectory succeeded (too easy)
    filter/dropped_uninformative   zero-variance, equal non-extreme rewards
    filter/dropped_unclassified    zero-variance, but no success flags / reward range given
    filter/dropped_nonzero_variance  had reward spread but ranked below the cut
  and the same causes over *every* zero-variance group, kept or not (with strategy
  ``none`` nothing is dropped, yet these are the groups the paper's mechanism is about):
    filter/zero_variance_all_failed, filter/zero_variance_all_succeeded,
    filter/zero_variance_uninformative, filter/zero_variance_unclassified
  Failure/success comes from ``success`` (per group, one bool per trajectory) when
  given; otherwise from ``reward_range=(min, max)`` of the env (all rewards == min ->
  failed, all == max -> succeeded, compared with np.isclose); otherwise unclassified.
  A zero-variance group whose success flags are mixed counts as uninformative.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .settings import FilterConfig


@dataclass
class FilterResult:
    kept_groups: list[int]  # original group indices, ascending
    loss_scale: float
    metrics: dict[str, float]
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [G] score of every group


#: ``metric`` -> whether the group score is the std (else the variance)
FILTER_METRICS = {"reward_std": True, "reward_variance": False}


def group_scores(
    group_rewards: Sequence[np.ndarray], metric: str = "reward_std", ddof: int = 1
) -> np.ndarray:
    """Std or variance (``metric``) of each group's rewards -> [G]; groups with ≤ ddof
    members score 0."""
    if metric not in FILTER_METRICS:
        raise ValueError(f"unknown filter metric {metric!r}; valid: {sorted(FILTER_METRICS)}")
    out = np.zeros(len(group_rewards), dtype=np.float64)
    for g, rewards in enumerate(group_rewards):
        r = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if not np.all(np.isfinite(r)):
            raise ValueError(f"group {g} has non-finite rewards {r.tolist()}")
        if r.size > ddof:
            var = float(np.var(r, ddof=ddof))
            out[g] = math.sqrt(var) if FILTER_METRICS[metric] else var
    return out


def _shaped_rewards(
    groups: list[np.ndarray], success: Sequence[np.ndarray] | None
) -> list[np.ndarray]:
    return groups


def _outcome_rewards(
    groups: list[np.ndarray], success: Sequence[np.ndarray] | None
) -> list[np.ndarray]:
    """1.0 per trajectory that succeeded at the task, 0.0 per one that did not."""
    if success is None:
        raise ValueError(
            "filter reward 'outcome' scores the task outcome and needs the success flags "
            "(one bool per trajectory of every group)"
        )
    out = []
    for g, (rewards, flags) in enumerate(zip(groups, success, strict=True)):
        flags = np.asarray(flags, dtype=bool).reshape(-1)
        if flags.size != rewards.size:
            raise ValueError(
                f"group {g} has {flags.size} success flags for {rewards.size} trajectories"
            )
        out.append(flags.astype(np.float64))
    return out


#: ``reward`` -> the per-trajectory values a group is scored on, from its shaped rewards
#: and success flags
FILTER_REWARDS: dict[
    str, Callable[[list[np.ndarray], Sequence[np.ndarray] | None], list[np.ndarray]]
] = {"shaped": _shaped_rewards, "outcome": _outcome_rewards}


# --------------------------------------------------------------------------- strategies
# Each takes the candidates' scores already sorted descending, the total group count
# and the config, and returns how many of the leading candidates to keep.


def _keep_none(sorted_scores: np.ndarray, n_groups: int, cfg: FilterConfig) -> int:
    return len(sorted_scores)


def _keep_top_p(sorted_scores: np.ndarray, n_groups: int, cfg: FilterConfig) -> int:
    if cfg.value >= 1.0:
        return len(sorted_scores)
    if cfg.mode == "softmax":
        if len(sorted_scores) == 0:
            return 0
        p = np.exp(
            sorted_scores - sorted_scores.max()
        )  # stable softmax, already in descending order
        cumulative = np.cumsum(p / p.sum())
        return min(int(np.searchsorted(cumulative, cfg.value, side="left")) + 1, len(sorted_scores))
    threshold = cfg.value * float(sorted_scores.sum()) - cfg.selection_eps
    cumulative, kept = 0.0, 0
    for s in sorted_scores:
        if cumulative >= threshold or s <= 0:
            break
        cumulative += float(s)
        kept += 1
    return kept if cumulative >= threshold else 0


def _int_guarded(x: float) -> int:
    return int(x + 1e-9)


def _keep_top_k(sorted_scores: np.ndarray, n_groups: int, cfg: FilterConfig) -> int:
    return min(max(1, _int_guarded(cfg.value * n_groups)), len(sorted_scores))


def _keep_top_k_abs(sorted_scores: np.ndarray, n_groups: int, cfg: FilterConfig) -> int:
    return min(_int_guarded(cfg.value), len(sorted_scores))


def _keep_min_p(sorted_scores: np.ndarray, n_groups: int, cfg: FilterConfig) -> int:
    if len(sorted_scores) == 0:
        return 0
    threshold = cfg.value * float(sorted_scores[0])
    return int(np.count_nonzero(sorted_scores >= threshold - 1e-12))  # sorted, so a prefix


# Each tightening takes the strategy's value and a response's factor, floor and start
# (``diagnostics.settings.TightenFilter``) and returns the next (strategy, value), or
# None when the strategy is at its bound.
Tightened = tuple[str, float] | None


def _tighten_none(value: float, factor: float, floor: float, start: float) -> Tightened:
    return "top_p", max(start, floor)  # no filter: start filtering


def _tighten_share(strategy: str) -> Callable[[float, float, float, float], Tightened]:
    """top_p's ratio or top_k's fraction times ``factor``, not below ``floor``."""

    def tighten(value: float, factor: float, floor: float, start: float) -> Tightened:
        return None if value <= floor else (strategy, max(floor, value * factor))

    return tighten


def _tighten_top_k_abs(value: float, factor: float, floor: float, start: float) -> Tightened:
    return "top_k_abs", float(max(1, min(value - 1, int(value * factor))))  # one group fewer


def _tighten_min_p(value: float, factor: float, floor: float, start: float) -> Tightened:
    return "min_p", min(1.0, value / factor)  # a higher share of the best score


@dataclass(frozen=True)
class FilterStrategy:
    """One filter strategy: how many of the ranked candidates it ``keep``s, and how an
    alarm's response ``tighten``s it."""

    keep: Callable[[np.ndarray, int, FilterConfig], int]
    tighten: Callable[[float, float, float, float], Tightened]


FILTER_STRATEGIES: dict[str, FilterStrategy] = {
    "none": FilterStrategy(_keep_none, _tighten_none),
    "top_p": FilterStrategy(_keep_top_p, _tighten_share("top_p")),
    "top_k": FilterStrategy(_keep_top_k, _tighten_share("top_k")),
    "top_k_abs": FilterStrategy(_keep_top_k_abs, _tighten_top_k_abs),
    "min_p": FilterStrategy(_keep_min_p, _tighten_min_p),
}

LOSS_SCALINGS: dict[str, Callable[[float], float]] = {
    "none": lambda kept_ratio: 1.0,
    "linear": lambda kept_ratio: kept_ratio,
    "sqrt": math.sqrt,
}


# --------------------------------------------------------------------------- breakdown


def _outcome_kind(
    g: int,
    rewards: np.ndarray,
    success: Sequence[np.ndarray] | None,
    reward_range: tuple[float, float] | None,
) -> str:
    """failed | succeeded | uninformative | unclassified: whether every trajectory of group
    g failed the task, every one succeeded, neither, or it is not known.  The breakdown of
    zero-variance groups by cause and ``filter/kept_all_failed_outcome`` both read it."""
    if rewards.size == 0:
        return "unclassified"
    if success is not None:
        flags = np.asarray(success[g], dtype=bool).reshape(-1)
        if flags.size == 0:
            return "unclassified"
        if not flags.any():
            return "failed"
        if flags.all():
            return "succeeded"
        return "uninformative"
    if reward_range is not None:
        low, high = reward_range
        if np.all(np.isclose(rewards, low)):
            return "failed"
        if np.all(np.isclose(rewards, high)):
            return "succeeded"
        return "uninformative"
    return "unclassified"


# --------------------------------------------------------------------------- entry point


def snr_filter(
    group_rewards: Sequence[np.ndarray],
    config: FilterConfig | None = None,
    *,
    success: Sequence[np.ndarray] | None = None,
    reward_range: tuple[float, float] | None = None,
    **overrides,
) -> FilterResult:
    """Select the groups to train on.  ``group_rewards[g]`` = rewards of group g's trajectories.

    ``config`` defaults to ``FilterConfig()``; keyword ``overrides`` replace its fields
    (``snr_filter(r, strategy="top_k", value=0.5)``).  ``success[g]`` (optional) holds
    one bool per trajectory of group g (required with ``reward="outcome"``);
    ``reward_range`` is the env's (min, max) reward.
    """
    cfg = config or FilterConfig()
    if overrides:
        unknown = sorted(set(overrides) - set(FilterConfig.model_fields))
        if unknown:
            raise ValueError(
                f"unknown filter option(s) {unknown}; valid: {sorted(FilterConfig.model_fields)}"
            )
        cfg = FilterConfig.model_validate({**cfg.model_dump(), **overrides})
    groups = [np.asarray(r, dtype=np.float64).reshape(-1) for r in group_rewards]
    n_groups = len(groups)
    if success is not None and len(success) != n_groups:
        raise ValueError(f"success has {len(success)} entries for {n_groups} groups")
    ranked = FILTER_REWARDS[cfg.reward](groups, success)  # what each group is scored on
    scores = group_scores(ranked, cfg.metric, cfg.ddof)  # [G]
    zero = scores <= cfg.zero_tol  # [G]

    order = np.argsort(-scores, kind="stable")  # descending, ties by original index
    if cfg.strategy != "none" and not cfg.include_zero:
        order = order[~zero[order]]
    n_keep = FILTER_STRATEGIES[cfg.strategy].keep(scores[order], n_groups, cfg)
    kept = sorted(int(g) for g in order[:n_keep])

    kept_mask = np.zeros(n_groups, dtype=bool)
    kept_mask[kept] = True
    outcome = [_outcome_kind(g, groups[g], success, reward_range) for g in range(n_groups)]
    kept_all_failed = sum(outcome[g] == "failed" for g in kept)
    kinds = {"failed": 0, "succeeded": 0, "uninformative": 0, "unclassified": 0}
    breakdown, every_zero = dict(kinds), dict(kinds)  # dropped ones; all of them
    for g in np.flatnonzero(zero):
        every_zero[outcome[g]] += 1
        breakdown[outcome[g]] += int(not kept_mask[g])
    dropped_nonzero = int(np.count_nonzero(~kept_mask & ~zero))

    kept_ratio = len(kept) / n_groups if n_groups else 0.0
    loss_scale = float(LOSS_SCALINGS[cfg.loss_scaling](kept_ratio))
    metrics = {
        "filter/kept_groups": float(len(kept)),
        "filter/kept_ratio": float(kept_ratio),
        "filter/kept_trajectories": float(sum(groups[g].size for g in kept)),
        "filter/zero_variance_groups": float(np.count_nonzero(zero)),
        "filter/empty": float(len(kept) == 0),
        "filter/loss_scale": loss_scale,
        "filter/score_mean": float(scores.mean()) if n_groups else 0.0,
        "filter/kept_score_mean": float(scores[kept].mean()) if kept else 0.0,
        "filter/kept_all_failed_outcome": float(kept_all_failed),
        "filter/dropped_all_failed": float(breakdown["failed"]),
        "filter/dropped_all_succeeded": float(breakdown["succeeded"]),
        "filter/dropped_uninformative": float(breakdown["uninformative"]),
        "filter/dropped_unclassified": float(breakdown["unclassified"]),
        "filter/dropped_nonzero_variance": float(dropped_nonzero),
        "filter/zero_variance_all_failed": float(every_zero["failed"]),
        "filter/zero_variance_all_succeeded": float(every_zero["succeeded"]),
        "filter/zero_variance_uninformative": float(every_zero["uninformative"]),
        "filter/zero_variance_unclassified": float(every_zero["unclassified"]),
    }
    return FilterResult(kept_groups=kept, loss_scale=loss_scale, metrics=metrics, scores=scores)
