"""Rollout metrics from trajectories (pure; the names are the MLflow keys the paper's
analyses read, docs/methods.md)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from scipy.stats import binomtest

from .types import Trajectory


def group_trajectories(trajectories: list[Trajectory]) -> dict[int, list[Trajectory]]:
    """Trajectories by group id, groups and members in a stable order."""
    groups: dict[int, list[Trajectory]] = defaultdict(list)
    for traj in trajectories:
        groups[traj.group_id].append(traj)
    return {g: sorted(ts, key=lambda t: t.sample_index) for g, ts in sorted(groups.items())}


def group_rewards(trajectories: list[Trajectory]) -> list[dict]:
    """Per prompt (group): its env seed, the members' rewards and successes, in group order.
    The prompt-level reward and reward-variance heatmaps of the report read these."""
    return [
        {
            "group_id": g,
            "env_seed": ts[0].env_seed,
            "rewards": [float(t.reward) for t in ts],
            "success": [float(t.success) for t in ts],
        }
        for g, ts in group_trajectories(trajectories).items()
    ]


def _mean_interval(name: str, values: list[float], z: float = 1.96) -> dict[str, float]:
    """``{name}_ci_low/_ci_high``: a normal-approximation 95 % interval of the mean (the
    point itself with fewer than two values, 0 with none)."""
    if len(values) < 2:
        mean = float(np.mean(values)) if values else 0.0
        return {f"{name}_ci_low": mean, f"{name}_ci_high": mean}
    mean, half = float(np.mean(values)), z * float(np.std(values, ddof=1)) / np.sqrt(len(values))
    return {f"{name}_ci_low": mean - half, f"{name}_ci_high": mean + half}


def _proportion_interval(name: str, successes: int, n: int) -> dict[str, float]:
    """``{name}_ci_low/_ci_high``: the 95 % Wilson interval of a proportion."""
    interval = binomtest(successes, n).proportion_ci(0.95, method="wilson")
    return {f"{name}_ci_low": float(interval.low), f"{name}_ci_high": float(interval.high)}


#: How an episode ended (``episode_ends``): success, or the first reason it failed.
EPISODE_ENDS = ("success", "format", "invalid_action", "failed", "unfinished")


def episode_end(trajectory: Trajectory) -> str:
    """How one episode ended: ``success``; else by its last turn: ``format`` (the reply did
    not parse), ``invalid_action`` (parsed, but no valid action), ``failed`` (the env ended
    the episode without success: a hole, a wrong key, a wrong single-turn answer) or
    ``unfinished`` (a turn, action or context limit ended it first)."""
    if trajectory.success:
        return "success"
    if not trajectory.turns:
        return "unfinished"
    last = trajectory.turns[-1]
    if not last.format_ok:
        return "format"
    if not last.action_valid:
        return "invalid_action"
    return "failed" if last.ended_episode else "unfinished"


def episode_ends(trajectories: list[Trajectory]) -> dict[str, float]:
    """``end/<kind>``: the share of episodes that ended each way (they sum to 1): where a
    policy fails, read per iteration (docs/methods.md, "What the update sees")."""
    ends = [episode_end(t) for t in trajectories]
    return {f"end/{kind}": ends.count(kind) / len(ends) for kind in EPISODE_ENDS}


def rollout_metrics(
    trajectories: list[Trajectory], prefix: str = "rollout", reasoning_tokens=None
) -> dict[str, float]:
    """Success, reward statistics, in-group reward spread, lengths and format rates.

    ``reasoning_tokens(text) -> int`` counts reasoning tokens (default: words).
    """
    if not trajectories:
        return {}
    count = reasoning_tokens or (lambda text: len(text.split()))
    rewards = np.array([t.reward for t in trajectories])
    turns = [turn for t in trajectories for turn in t.turns]
    groups = group_trajectories(trajectories)
    group_std = np.array(
        [np.std([t.reward for t in ts], ddof=1) if len(ts) > 1 else 0.0 for ts in groups.values()]
    )
    reasoning = [count(turn.reasoning) for turn in turns if turn.reasoning is not None]
    reply_lengths = [turn.reply_end - turn.reply_start for turn in turns]
    out = {
        "success": float(np.mean([t.success for t in trajectories])),
        **_proportion_interval(
            "success", sum(bool(t.success) for t in trajectories), len(trajectories)
        ),
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "in_group_reward_std": float(group_std.mean()),
        "zero_variance_groups": float(np.sum(group_std <= 1e-10)),
        "turns": float(np.mean([len(t.turns) for t in trajectories])),
        "response_length": float(np.mean(reply_lengths)) if reply_lengths else 0.0,
        "reasoning_length": float(np.mean(reasoning)) if reasoning else 0.0,
        **_mean_interval("reasoning_length", reasoning),
        "valid_reasoning_rate": float(np.mean([bool(turn.reasoning) for turn in turns]))
        if turns
        else 0.0,
        "format_ok_rate": float(np.mean([turn.format_ok for turn in turns])) if turns else 0.0,
        "action_valid_rate": float(np.mean([turn.action_valid for turn in turns]))
        if turns
        else 0.0,
        "length_truncated_rate": float(np.mean([turn.finish_reason == "length" for turn in turns]))
        if turns
        else 0.0,
        "context_truncated": float(np.mean([t.context_truncated for t in trajectories])),
        "trajectories": float(len(trajectories)),
        "generated_tokens": float(sum(reply_lengths)),
        **episode_ends(trajectories),
    }
    return {f"{prefix}/{k}": v for k, v in out.items()}


def transcript(trajectory: Trajectory, decode) -> str:
    """A readable transcript with the per-turn outcome, for sample artifacts."""
    lines = [
        f"=== group {trajectory.group_id} sample {trajectory.sample_index} "
        f"(env seed {trajectory.env_seed}) reward {trajectory.reward:+.2f} "
        f"success {trajectory.success}",
        decode(trajectory.token_ids),
    ]
    for k, turn in enumerate(trajectory.turns, 1):
        lines.append(
            f"--- turn {k}: format_ok={turn.format_ok} valid={turn.action_valid} "
            f"executed={turn.executed_actions} reward={turn.reward:+.2f}"
        )
    return "\n".join(lines)
