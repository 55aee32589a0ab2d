"""Base classes for Tether's text environments.

Every environment is a ``gymnasium.Env`` whose observations and actions are text.
``step`` takes the *answer* text of a reply (what stood inside ``<answer>``), never
raises on bad input, and reports ``info["action_is_valid"]``.  An invalid answer
costs ``format_penalty`` and leaves the state untouched (no env step).

The ``stochasticity`` knob p (docs/methods.md, section 11):
- multi-turn envs: each executed action is replaced, with probability p, by a
  uniformly random valid action (FrozenLake's slip, generalised);
- single-turn envs: with probability p the reward is replaced by a uniform draw
  from the env's reward support.

This package imports neither torch nor Ray.
"""

from __future__ import annotations

import abc
import string
from typing import Any

import gymnasium as gym
import numpy as np

ACTION_SEPARATOR = "||"
TEXT_CHARSET = string.printable
MAX_TEXT = 100_000


class TextEnv(gym.Env, abc.ABC):
    """A seeded text environment with a stochasticity knob and a format penalty."""

    metadata = {"render_modes": ["ansi"]}
    #: Upper bounds used by the agent loop and the prompt.
    max_turns: int = 1
    max_actions_per_turn: int = 1
    max_actions: int = 1
    #: True for envs that execute model-written code: the run passes them
    #: ``isolation=`` from the config's ``sandbox`` section.
    runs_untrusted_code: bool = False

    def __init__(self, stochasticity: float = 0.0, format_penalty: float = -0.1) -> None:
        if not 0.0 <= float(stochasticity) <= 1.0:
            raise ValueError(f"stochasticity must be in [0, 1], got {stochasticity}")
        self.stochasticity = float(stochasticity)
        self.format_penalty = float(format_penalty)
        self.observation_space = gym.spaces.Text(max_length=MAX_TEXT, charset=TEXT_CHARSET)
        self.action_space = gym.spaces.Text(max_length=MAX_TEXT, charset=TEXT_CHARSET)
        self.render_mode = "ansi"
        self.seed_value: int | None = None

    # -- to be provided by subclasses -------------------------------------------------
    @abc.abstractmethod
    def rules(self) -> str:
        """The environment's rules, for the system prompt."""
        ...

    @abc.abstractmethod
    def render(self) -> str:  # type: ignore[override]
        """The current state as text (what the agent observes)."""
        ...

    @abc.abstractmethod
    def demonstration(self, rng: np.random.Generator, noise: float = 0.0) -> tuple[str, str]:
        """A short (reasoning, answer) pair for the current state, used to warm-start
        a policy.  With probability ``noise`` the answer is deliberately imperfect."""

    # -- shared helpers ----------------------------------------------------------------
    def _seed_level_rng(self, seed: int | None) -> np.random.Generator:
        """Level generation uses its own generator so that a seed names a level,
        independently of how many stochastic draws happened before."""
        super().reset(seed=seed)
        self.seed_value = seed
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        return np.random.default_rng([int(seed), 0x7E7E])

    def _invalid(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info = {
            "action_is_valid": False,
            "invalid_reason": reason,
            "success": False,
            "executed_actions": [],
            "requested_actions": [],
        }
        return self.render(), self.format_penalty, False, False, info


class MultiTurnTextEnv(TextEnv):
    """Multi-turn env whose answer is one or more action names joined by ``||``."""

    max_turns = 5
    max_actions_per_turn = 2
    max_actions = 10
    #: Valid action names, in a fixed order (matching is case-insensitive).
    action_names: tuple[str, ...] = ()

    def __init__(
        self,
        stochasticity: float = 0.0,
        format_penalty: float = -0.1,
        max_turns: int | None = None,
        max_actions_per_turn: int | None = None,
        max_actions: int | None = None,
    ) -> None:
        super().__init__(stochasticity, format_penalty)
        self.max_turns = int(max_turns or type(self).max_turns)
        self.max_actions_per_turn = int(max_actions_per_turn or type(self).max_actions_per_turn)
        self.max_actions = int(max_actions or type(self).max_actions)
        self.actions_taken = 0
        # No episode until reset(): a step before it is invalid rather than a crash.
        self.done = True

    def _start_episode(self) -> None:
        """Subclasses call this from reset() once the new level is in place."""
        self.actions_taken = 0
        self.done = False

    def _reset_result(self, **info: Any) -> tuple[str, dict[str, Any]]:
        """What reset() returns once the episode has started: the first observation, and
        ``info`` with the length of the optimal plan from here (None: no plan)."""
        plan = self.solve()
        return self.render(), {**info, "optimal_plan_length": None if plan is None else len(plan)}

    def _demonstration_actions(self, rng: np.random.Generator, noise: float) -> list[str]:
        """The moves of a demonstration: the optimal plan's next moves, as many as this
        turn may take, or, with probability ``noise`` or when there is no plan, as many
        uniformly random moves."""
        plan = self.solve() or []
        budget = max(1, min(self.max_actions_per_turn, self.actions_left()))
        n = min(budget, len(plan)) if plan else budget
        if rng.random() < noise or not plan:
            return [
                self.action_names[int(i)] for i in rng.integers(0, len(self.action_names), size=n)
            ]
        return plan[:n]

    def parse_actions(self, answer: str) -> list[str] | None:
        """Split an answer into canonical action names, or None if any is invalid."""
        if not isinstance(answer, str):
            return None
        parts = [p.strip() for p in answer.split(ACTION_SEPARATOR)]
        if not parts or len(parts) > self.max_actions_per_turn:
            return None
        lookup = {name.lower(): name for name in self.action_names}
        names = [lookup.get(p.lower()) for p in parts]
        if any(n is None for n in names):
            return None
        return names  # type: ignore[return-value]

    def actions_left(self) -> int:
        return max(0, self.max_actions - self.actions_taken)

    def step(self, action: str):  # type: ignore[override]
        if self.done or self.actions_left() <= 0:
            return self._invalid("episode is over")
        names = self.parse_actions(action)
        if names is None:
            return self._invalid(f"not 1..{self.max_actions_per_turn} of {list(self.action_names)}")
        total, executed, requested, success = 0.0, [], [], False
        for name in names:
            if self.actions_left() <= 0 or self.done:
                break
            requested.append(name)
            if self.stochasticity > 0.0 and self.np_random.random() < self.stochasticity:
                name = self.action_names[int(self.np_random.integers(len(self.action_names)))]
            reward, self.done, success = self._apply(name)
            self.actions_taken += 1
            total += reward
            executed.append(name)
        truncated = (not self.done) and self.actions_left() <= 0
        info = {
            "action_is_valid": True,
            "success": bool(success),
            "executed_actions": executed,
            "requested_actions": requested,
        }
        return self.render(), float(total), bool(self.done), bool(truncated), info

    @abc.abstractmethod
    def _apply(self, action_name: str) -> tuple[float, bool, bool]:
        """Apply one action; return (reward, episode_done, success)."""
        ...

    @abc.abstractmethod
    def solve(self) -> list[str] | None:
        """An optimal plan (action names) from the current state, or None."""
        ...


class SingleTurnTextEnv(TextEnv):
    """Single-turn env: one answer, one reward, then the episode ends."""

    max_turns = 1
    #: Rewards the env can give; a stochastic reward is a uniform draw from them.
    reward_support: tuple[float, ...] = (0.0, 1.0)

    @abc.abstractmethod
    def score(self, answer: str) -> tuple[float, bool, bool]:
        """Score an answer: (reward, valid, success).  Must never raise."""
        ...

    def step(self, action: str):  # type: ignore[override]
        if not isinstance(action, str):
            return self._invalid("answer is not text")
        reward, valid, success = self.score(action)
        if not valid:
            obs, penalty, _, _, info = self._invalid("unparseable answer")
            return obs, penalty, True, False, info
        if self.stochasticity > 0.0 and self.np_random.random() < self.stochasticity:
            reward = float(
                self.reward_support[int(self.np_random.integers(len(self.reward_support)))]
            )
        info = {"action_is_valid": True, "success": bool(success), "executed_actions": [action]}
        return self.render(), float(reward), True, False, info
