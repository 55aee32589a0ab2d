"""Multi-turn episodes: every live episode of a step is sampled in one batch.

The loop is pure: it talks to a rollout engine (token ids in, token ids out) and
to an ``EnvBatch`` (answers in, outcomes out).  ``LocalEnvBatch`` holds real
environments in this process; a Ray environment-pool actor wraps the same class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .. import seeds
from ..rollout.base import RolloutEngine, SamplingParams
from .chat import ChatFormatter
from .format import THINK_OPEN, parse_reply, system_prompt, user_prompt
from .types import Trajectory, Turn


@dataclass
class EnvObservation:
    state: str
    rules: str
    max_turns: int
    actions_left: int | None


@dataclass
class StepOutcome:
    state: str
    reward: float
    done: bool
    success: bool
    action_valid: bool
    actions_left: int | None
    executed_actions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EpisodeSpec:
    """Which level (env seed) and which sample of its group an episode is."""

    group_id: int
    env_seed: int
    sample_index: int = 0


class EnvBatch(Protocol):
    def reset(self, seeds: list[int]) -> list[EnvObservation]: ...

    def step(self, items: list[tuple[int, str | None]]) -> list[StepOutcome]: ...


class LocalEnvBatch:
    """A pool of environments of one kind; env ``i`` serves episode ``i``.

    An answer of ``None`` is a format error: the env's format penalty, no env step.
    """

    def __init__(self, env_id: str, env_kwargs: dict | None = None) -> None:
        from ..envs import make  # envs import neither torch nor Ray

        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self._make = make
        self.envs: list = []

    def _ensure(self, n: int) -> None:
        while len(self.envs) < n:
            self.envs.append(self._make(self.env_id, **self.env_kwargs))

    @staticmethod
    def _actions_left(env) -> int | None:
        fn = getattr(env, "actions_left", None)
        return fn() if callable(fn) else None

    def reset(self, seeds: list[int]) -> list[EnvObservation]:
        self._ensure(len(seeds))
        out = []
        for env, seed in zip(self.envs, seeds):
            state, _ = env.reset(seed=int(seed))
            out.append(
                EnvObservation(state, env.rules(), int(env.max_turns), self._actions_left(env))
            )
        return out

    def step(self, items: list[tuple[int, str | None]]) -> list[StepOutcome]:
        out = []
        for index, answer in items:
            env = self.envs[index]
            if answer is None:
                single_turn = env.max_turns <= 1
                out.append(
                    StepOutcome(
                        env.render(),
                        env.format_penalty,
                        single_turn,
                        False,
                        False,
                        self._actions_left(env),
                    )
                )
                continue
            state, reward, terminated, truncated, info = env.step(answer)
            out.append(
                StepOutcome(
                    state,
                    float(reward),
                    bool(terminated or truncated),
                    bool(info.get("success", False)),
                    bool(info.get("action_is_valid", False)),
                    self._actions_left(env),
                    list(info.get("executed_actions", [])),
                )
            )
        return out


def first_prompt_ids(
    formatter: ChatFormatter,
    rules: str,
    state: str,
    actions_left: int | None,
    max_reply_tokens: int,
) -> list[int]:
    """The token ids an episode's first generation starts from (system prompt with the
    env's rules, turn 1's user message, the assistant's opening): the one place this
    prompt is assembled, for the loop and for anything that scores a first turn."""
    return formatter.first_prompt_ids(
        system_prompt(rules), user_prompt(1, state, actions_left, max_reply_tokens)
    )


def run_episodes(
    engine: RolloutEngine,
    formatter: ChatFormatter,
    envs: EnvBatch,
    specs: list[EpisodeSpec],
    sampling: SamplingParams,
    seed: int = 0,
    max_turns: int | None = None,
) -> list[Trajectory]:
    """Play ``specs`` to the end, batching all live episodes of each turn."""
    if not specs:
        return []
    observations = envs.reset([s.env_seed for s in specs])
    trajectories: list[Trajectory] = []
    for spec, obs in zip(specs, observations):
        ids = first_prompt_ids(
            formatter, obs.rules, obs.state, obs.actions_left, sampling.max_new_tokens
        )
        trajectories.append(
            Trajectory(
                spec.group_id,
                spec.env_seed,
                spec.sample_index,
                token_ids=ids,
                loss_mask=[0] * len(ids),
                sampling_logprobs=[0.0] * len(ids),
            )
        )
    turn_limit = max(o.max_turns for o in observations)
    if max_turns is not None:
        turn_limit = min(turn_limit, max_turns)
    states = [o.state for o in observations]
    live = list(range(len(specs)))
    for turn_number in range(1, turn_limit + 1):
        # An episode whose next reply may not fit the model window ends here.
        fits = [
            i
            for i in live
            if len(trajectories[i].token_ids) + sampling.max_new_tokens <= engine.max_context
        ]
        for i in set(live) - set(fits):
            trajectories[i].context_truncated = True
        live = fits
        if not live:
            break
        generations = engine.generate(
            [trajectories[i].token_ids for i in live],
            sampling,
            seed=seeds.sampling_turn(seed, turn_number),
        )
        answers: list[tuple[int, str | None]] = []
        parsed_replies = []
        for i, gen in zip(live, generations):
            reply_text = formatter.decode(gen.token_ids)
            parsed = parse_reply(THINK_OPEN + reply_text)
            parsed_replies.append((reply_text, parsed, gen))
            answers.append((i, parsed.answer if parsed.format_ok else None))
        outcomes = envs.step(answers)
        next_live = []
        for i, (reply_text, parsed, gen), outcome in zip(live, parsed_replies, outcomes):
            traj = trajectories[i]
            prompt_end = len(traj.token_ids)
            traj.token_ids.extend(gen.token_ids)
            traj.loss_mask.extend([1] * len(gen.token_ids))
            traj.sampling_logprobs.extend(gen.logprobs)
            traj.turns.append(
                Turn(
                    prompt_end=prompt_end,
                    reply_start=prompt_end,
                    reply_end=len(traj.token_ids),
                    state=states[i],
                    reply_text=reply_text,
                    reasoning=parsed.reasoning,
                    answer=parsed.answer,
                    format_ok=parsed.format_ok,
                    action_valid=outcome.action_valid,
                    reward=outcome.reward,
                    executed_actions=outcome.executed_actions,
                    finish_reason=gen.finish_reason,
                    ended_episode=outcome.done,
                )
            )
            traj.success = traj.success or outcome.success
            states[i] = outcome.state
            if outcome.done or turn_number == turn_limit:
                continue
            segment = formatter.continuation_ids(
                user_prompt(
                    turn_number + 1,
                    outcome.state,
                    outcome.actions_left,
                    sampling.max_new_tokens,
                    previous_reward=outcome.reward,
                ),
                gen.token_ids,
            )
            traj.token_ids.extend(segment)
            traj.loss_mask.extend([0] * len(segment))
            traj.sampling_logprobs.extend([0.0] * len(segment))
            next_live.append(i)
        live = next_live
    return trajectories
