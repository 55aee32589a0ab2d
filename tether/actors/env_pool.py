"""Environment-pool actor: a thin Ray wrapper around ``LocalEnvBatch``."""

from __future__ import annotations

import ray

from ..agent.episode import EnvObservation, LocalEnvBatch, StepOutcome


@ray.remote(max_restarts=-1, max_task_retries=3)
class EnvPoolActor:
    def __init__(self, env_id: str, env_kwargs: dict) -> None:
        self.pool = LocalEnvBatch(env_id, env_kwargs)

    def reset(self, seeds: list[int]) -> list[EnvObservation]:
        return self.pool.reset(seeds)

    def step(self, items: list[tuple[int, str | None]]) -> list[StepOutcome]:
        return self.pool.step(items)


class RemoteEnvBatch:
    """The ``EnvBatch`` protocol over an environment-pool actor."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def reset(self, seeds: list[int]) -> list[EnvObservation]:
        return ray.get(self.actor.reset.remote(seeds))

    def step(self, items: list[tuple[int, str | None]]) -> list[StepOutcome]:
        return ray.get(self.actor.step.remote(items))
