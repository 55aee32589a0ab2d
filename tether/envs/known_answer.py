"""Known-answer tasks: small envs whose optimal policy is known, so a learning loop
can be checked against it (docs/methods.md, "Learning that can be checked").

- ``Choice`` (single turn): the state names one of ``n_options`` colours; answering
  that colour earns 1, any other colour 0.  A policy that ignores the prompt succeeds
  1/n_options of the time; the optimum is 1.
- ``Doors`` (multi turn): a level is a row of ``n_doors`` doors, each opened by one of
  ``n_keys`` keys, shown one door per turn.  The right key opens the door and the next
  one is shown; a wrong key ends the episode with 0; opening the last door earns 1.  A
  policy that ignores the state succeeds (1/n_keys)^n_doors of the time, the optimum
  is 1, and it needs the right action in *every* turn, so the learning signal must
  reach every turn's tokens.

Their demonstrations state what the prompt asks ("Door 2 needs blue.") and, with
probability ``noise``, answer at random: a warm start on ``noise=1`` demonstrations
writes the format and the reasoning but answers uniformly, the near-uniform start
the known-answer tests begin from.

This module imports neither torch nor Ray.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import MultiTurnTextEnv, SingleTurnTextEnv

COLOURS = ("red", "blue", "green", "gold", "pink", "grey", "teal", "plum")


def _check_count(name: str, value: int, low: int, high: int) -> int:
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


class ChoiceEnv(SingleTurnTextEnv):
    """Say the colour the state names (single turn, reward 1 or 0)."""

    reward_support = (0.0, 1.0)

    def __init__(
        self, n_options: int = 4, stochasticity: float = 0.0, format_penalty: float = -0.1
    ) -> None:
        super().__init__(stochasticity, format_penalty)
        self.options = COLOURS[: _check_count("n_options", n_options, 2, len(COLOURS))]
        self.target: str | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        rng = self._seed_level_rng(seed)
        self.target = self.options[int(rng.integers(len(self.options)))]
        return self.render(), {"optimal_plan_length": 1}

    def rules(self) -> str:
        return (
            f"Choice: answer with the colour the state names, one of {', '.join(self.options)}. "
            "Reward 1 for that colour, 0 for another."
        )

    def render(self) -> str:  # type: ignore[override]
        if self.target is None:
            return "No task: call reset()."
        return f"Say {self.target}."

    def score(self, answer: str) -> tuple[float, bool, bool]:
        said = answer.strip().lower()
        if said not in self.options:
            return 0.0, False, False
        right = said == self.target
        return float(right), True, right

    def demonstration(self, rng: np.random.Generator, noise: float = 0.0) -> tuple[str, str]:
        answer = self.target
        if rng.random() < noise:
            answer = self.options[int(rng.integers(len(self.options)))]
        return f"Asked for {self.target}.", str(answer)


class DoorsEnv(MultiTurnTextEnv):
    """Open ``n_doors`` doors in turn, each with its key (reward 1 after the last)."""

    max_actions_per_turn = 1

    def __init__(
        self,
        n_doors: int = 3,
        n_keys: int = 2,
        stochasticity: float = 0.0,
        format_penalty: float = -0.1,
    ) -> None:
        n_doors = _check_count("n_doors", n_doors, 1, 8)
        super().__init__(
            stochasticity,
            format_penalty,
            max_turns=n_doors,
            max_actions_per_turn=1,
            max_actions=n_doors,
        )
        self.n_doors = n_doors
        self.action_names = tuple(
            c.capitalize() for c in COLOURS[: _check_count("n_keys", n_keys, 2, len(COLOURS))]
        )
        self.keys: list[str] = []
        self.opened = 0
        self.failed = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        rng = self._seed_level_rng(seed)
        self.keys = [
            self.action_names[int(i)]
            for i in rng.integers(len(self.action_names), size=self.n_doors)
        ]
        self.opened, self.failed = 0, False
        self._start_episode()
        return self.render(), {"optimal_plan_length": self.n_doors}

    def _apply(self, action_name: str) -> tuple[float, bool, bool]:
        if action_name != self.keys[self.opened]:
            self.failed = True
            return 0.0, True, False
        self.opened += 1
        if self.opened == self.n_doors:
            return 1.0, True, True
        return 0.0, False, False

    def solve(self) -> list[str] | None:
        if self.failed or not self.keys:
            return None
        return self.keys[self.opened :]

    def rules(self) -> str:
        return (
            f"Doors: open {self.n_doors} doors one after another. Each door names its key; "
            f"answer with that key, one of {', '.join(self.action_names)}. A wrong key ends "
            "the episode with 0; opening the last door earns 1."
        )

    def render(self) -> str:  # type: ignore[override]
        if not self.keys:
            return "No doors: call reset()."
        if self.failed:
            return "The key did not fit."
        if self.opened == self.n_doors:
            return "All doors are open."
        return f"Door {self.opened + 1} of {self.n_doors} needs {self.keys[self.opened]}."

    def demonstration(self, rng: np.random.Generator, noise: float = 0.0) -> tuple[str, str]:
        key = self.keys[self.opened]
        answer = key
        if rng.random() < noise:
            answer = self.action_names[int(rng.integers(len(self.action_names)))]
        return f"Door {self.opened + 1} needs {key}.", answer
