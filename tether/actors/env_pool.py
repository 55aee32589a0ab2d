"""Environment-pool actor: a thin Ray wrapper around ``LocalEnvBatch``."""

from __future__ import annotations

import ray

from ..agent.episode import EnvObservation, LocalEnvBatch, StepOutcome


class EpisodesLost(RuntimeError):
    """The pool restarted mid-collection: its environments' episode state is gone."""


@ray.remote(max_restarts=-1, max_task_retries=3)
class EnvPoolActor:
    """Restarts when it dies (``max_restarts``); a ``reset`` that was in flight is retried
    on the new process, while a ``step`` into episodes the dead process held raises
    ``EpisodesLost``, so the driver collects that worker's share again."""

    def __init__(self, env_id: str, env_kwargs: dict) -> None:
        self.pool = LocalEnvBatch(env_id, env_kwargs)
        self.live = 0  # episodes reset in this process
        self.resets = self.steps = 0

    def start_run(self) -> None:
        """A new run: no live episodes, counters at zero (each episode's state comes from
        its seed at ``reset``, so the environments themselves carry nothing over)."""
        self.live = self.resets = self.steps = 0

    def reset(self, seeds: list[int]) -> list[EnvObservation]:
        observations = self.pool.reset(seeds)
        self.live, self.resets, self.steps = len(seeds), self.resets + 1, 0
        return observations

    def step(self, items: list[tuple[int, str | None]]) -> list[StepOutcome]:
        lost = [index for index, _ in items if index >= self.live]
        if lost:
            raise EpisodesLost(
                f"environment pool restarted: episodes {lost[:5]} of this "
                f"collection are gone; collect the share again"
            )
        self.steps += 1
        return self.pool.step(items)

    def stats(self) -> dict[str, int]:
        """Resets served by this process, and steps since the last reset."""
        return {"resets": self.resets, "steps": self.steps}


class RemoteEnvBatch:
    """The ``EnvBatch`` protocol over an environment-pool actor."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def reset(self, seeds: list[int]) -> list[EnvObservation]:
        return ray.get(self.actor.reset.remote(seeds))

    def step(self, items: list[tuple[int, str | None]]) -> list[StepOutcome]:
        return ray.get(self.actor.step.remote(items))
