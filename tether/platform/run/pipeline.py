"""Asynchronous rollouts: training batches collected ahead of the learner, never more
than ``rollout.max_staleness`` weight versions old (docs/architecture.md, "Asynchronous
rollouts"; docs/methods.md for the off-policy correction that goes with it).

    pipeline = RolloutPipeline(fleet, sampler, cfg)    # k = cfg.rollout.max_staleness
    collected = pipeline.batch(it, sampling, collect)  # iteration it's batch
    metrics.update(pipeline.metrics())                 # async/staleness_* (k >= 1)
    pipeline.sync_weights(learner)                     # after the update
    pipeline.restart(learner)                          # a restored learner: drop, sync
    pipeline.drop()                                    # nothing in flight any more

Iteration j's batch is the sampler's next ``rollout.groups`` levels, ``group_size``
episodes each, with the collection seed of iteration j; ``collect`` is the synchronous
collection.  k = 0 is the synchronous loop exactly: ``collect(specs, sampling, seed)``
now, the update, then a weight sync that waits for every worker.

With k >= 1, before the learner updates on batch it the batches of iterations it+1 ..
it+k are already on their way to the workers (``RolloutFleet.collect_async``), and the
weights each update makes are sent at once without waiting (a worker takes them after
the collection it is running).  A worker runs its calls in the order they were sent, so
batch j, sent during iteration j-k before that iteration's update, is sampled with the
weights of the last sync before it: the learner makes at most k syncs (one per update)
before it trains on batch j.

The rule: the staleness of a trajectory is the learner's weight version when it trains
on it minus ``Trajectory.policy_version``; a batch one of whose trajectories is more
than k versions old is refused, never trained on: it is collected again at once with
the current weights (``async/refused_batches``).  Only an extra sync (an act-mode alarm's
rollback) can make that happen.  A checkpoint does not keep the batches in flight: its
sampler position is the one before them, so a resumed (or rebuilt) run collects their
levels again, with the checkpoint's weights.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ... import seeds
from ..config import TetherConfig
from .events import Event
from .fleet import Collection, RolloutFleet
from .stages import LevelSampler


def staleness(trajectories, version: int) -> np.ndarray:
    """Per trajectory: how many weight versions it is behind ``version``."""
    return np.array([version - t.policy_version for t in trajectories], dtype=np.int64)


class RolloutPipeline:
    def __init__(self, fleet: RolloutFleet, sampler: LevelSampler, cfg: TetherConfig) -> None:
        self.fleet, self.sampler, self.rollout = fleet, sampler, cfg.rollout
        self.run_seed, self.last_iteration = cfg.experiment.seed, cfg.trainer.iterations
        self.max_staleness = cfg.rollout.max_staleness
        #: iteration -> (its collection in flight, the sampler position before its levels)
        self.in_flight: dict[int, tuple[Collection, int]] = {}
        #: batches refused for staleness and collected again (this process)
        self.refused = 0
        self.lag = np.zeros(0, dtype=np.int64)  # the last batch's staleness per trajectory

    def request(self, it: int, sampling) -> tuple:
        """Iteration ``it``'s training collection: (specs, sampling, seed)."""
        r = self.rollout
        specs = self.sampler.specs(r.groups, r.group_size, 0)
        return specs, sampling, seeds.collection(self.run_seed, it)

    def batch(self, it: int, sampling, collect: Callable) -> list:
        """Iteration ``it``'s trajectories; with k >= 1 also send the batches up to
        iteration it+k (at most the run's last) to the workers."""
        if self.max_staleness == 0:
            return collect(*self.request(it, sampling))
        for j in range(it, min(it + self.max_staleness, self.last_iteration) + 1):
            if j not in self.in_flight:
                position = self.sampler.position
                self.in_flight[j] = (self.fleet.collect_async(*self.request(j, sampling)), position)
        collection, _ = self.in_flight.pop(it)
        collected = collection.result()
        self.lag = staleness(collected, self.fleet.weights_version)
        if self.lag.max(initial=0) > self.max_staleness:
            self.refused += 1
            self.fleet.emit(
                Event.BATCH_REFUSED,
                {
                    "message": f"iteration {it}: batch refused, {int(self.lag.max())} weight "
                    f"versions old > rollout.max_staleness = {self.max_staleness}; "
                    "collected again with the current weights"
                },
            )
            collected = self.fleet.collect(collection.specs, collection.sampling, collection.seed)
            self.lag = staleness(collected, self.fleet.weights_version)
        return collected

    def metrics(self) -> dict[str, float]:
        """``async/staleness_mean`` and ``_max`` of the batch just returned (versions
        behind the learner), ``async/refused_batches`` so far; none at k = 0."""
        if self.max_staleness == 0:
            return {}
        return {
            "async/staleness_mean": float(self.lag.mean()) if self.lag.size else 0.0,
            "async/staleness_max": float(self.lag.max(initial=0)),
            "async/refused_batches": float(self.refused),
        }

    def sync_weights(self, learner) -> None:
        """The update's weights to the workers: waited for at k = 0; with k >= 1 they
        queue behind the collections in flight."""
        self.fleet.sync_weights(learner, wait=self.max_staleness == 0)

    def restart(self, learner) -> None:
        """A restored learner (checkpoint, rebuild): the batches in flight were sampled by
        weights it does not descend from, so they are dropped; its weights are sent and
        waited for."""
        self.drop()
        self.fleet.sync_weights(learner)

    def sampler_position(self) -> int:
        """The sampler position a checkpoint keeps: before the batches in flight."""
        return min((p for _, p in self.in_flight.values()), default=self.sampler.position)

    def drop(self) -> None:
        """Forget the batches in flight (a restored or rolled-back learner, the run's
        end): their queued shares are cancelled."""
        for collection, _ in self.in_flight.values():
            collection.cancel()
        self.in_flight = {}
