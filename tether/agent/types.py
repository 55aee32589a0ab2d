"""What a multi-turn episode records: per-turn text and the token masks the learner needs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Turn:
    """One agent turn."""

    #: Offset of this turn's prompt end (the forced ``<think>``) in the trajectory's ids.
    prompt_end: int
    #: Token span [start, end) of the sampled reply in the trajectory's ids.
    reply_start: int
    reply_end: int
    state: str
    reply_text: str
    reasoning: str | None
    answer: str | None
    format_ok: bool
    action_valid: bool
    reward: float
    executed_actions: list[str] = field(default_factory=list)
    finish_reason: str = "stop"
    #: The environment ended the episode at this turn (goal, hole, wrong key, the answer
    #: of a single-turn task), as opposed to a turn or context limit.
    ended_episode: bool = False


@dataclass
class Trajectory:
    """One episode of one prompt (group) sample, as one token sequence."""

    group_id: int
    env_seed: int
    sample_index: int
    token_ids: list[int] = field(default_factory=list)
    #: 1 on tokens the agent sampled, 0 on prompt/environment tokens.
    loss_mask: list[int] = field(default_factory=list)
    #: log-prob of each sampled token under the sampling distribution (0 elsewhere).
    sampling_logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    success: bool = False
    #: The episode stopped because the next prompt would not fit the model window.
    context_truncated: bool = False
    #: The weight version that sampled it (``RolloutFleet.weights_version``: 0 = the run's
    #: starting weights, +1 at every weight sync), stamped by the rollout worker.
    policy_version: int = 0

    @property
    def reward(self) -> float:
        """Trajectory score: sum of turn rewards (format penalties included)."""
        return float(sum(t.reward for t in self.turns))

    def token_rewards(self) -> list[float]:
        """Each turn's reward placed on the last token of that turn's reply."""
        rewards = [0.0] * len(self.token_ids)
        for turn in self.turns:
            if turn.reply_end > turn.reply_start:
                rewards[turn.reply_end - 1] += turn.reward
        return rewards

    def malformed_mask(self) -> list[float]:
        """1 on the reply tokens of each turn whose reply was malformed (no well-formed
        answer), 0 elsewhere: where the format term acts (``algo.format_coef``)."""
        mask = [0.0] * len(self.token_ids)
        for turn in self.turns:
            if not turn.format_ok:
                mask[turn.reply_start : turn.reply_end] = [1.0] * (
                    turn.reply_end - turn.reply_start
                )
        return mask
