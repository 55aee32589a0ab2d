"""``RolloutPipeline`` without Ray: a fake fleet whose workers stamp each batch with the
version they hold when it is sent, the way a Ray actor runs its calls in order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tether import seeds
from tether.platform.config import build_config
from tether.platform.run.pipeline import RolloutPipeline
from tether.platform.run.stages import LevelSampler


class FakeCollection:
    def __init__(self, fleet, specs, sampling, seed):
        self.specs, self.sampling, self.seed = specs, sampling, seed
        self.version, self.cancelled = fleet.weights_version, False
        fleet.sent.append(seed)

    def result(self):
        return [SimpleNamespace(policy_version=self.version, spec=s) for s in self.specs]

    def cancel(self):
        self.cancelled = True


class FakeFleet:
    def __init__(self):
        self.weights_version, self.sent, self.events, self.waited = 0, [], [], []

    def collect_async(self, specs, sampling, seed):
        return FakeCollection(self, specs, sampling, seed)

    def collect(self, specs, sampling, seed):
        return self.collect_async(specs, sampling, seed).result()

    def sync_weights(self, learner, wait=True):
        self.weights_version += 1
        self.waited.append(wait)

    def emit(self, kind, data):
        self.events.append((kind, data))


def _pipeline(k, last=10):
    """(fleet, sampler, pipeline, sampling); batch i's seed is ``seeds.collection(0, i)``."""
    fleet, sampler = FakeFleet(), LevelSampler(0, 10_000)
    cfg = build_config(
        {
            "rollout": {"max_staleness": k, "groups": 2, "group_size": 2},
            "trainer": {"iterations": last},
        }
    )
    return fleet, sampler, RolloutPipeline(fleet, sampler, cfg), "sampling"


def _seed(it):
    return seeds.collection(0, it)


def test_k0_is_one_synchronous_collection_per_iteration():
    fleet, sampler, pipeline, sampling = _pipeline(0)
    calls = []

    def collect(specs, sampling, seed):
        calls.append(seed)
        return fleet.collect(specs, sampling, seed)

    for it in (1, 2, 3):
        pipeline.batch(it, sampling, collect)
        assert pipeline.metrics() == {}
        pipeline.sync_weights(None)
    assert calls == [_seed(1), _seed(2), _seed(3)] and fleet.waited == [True] * 3
    assert sampler.position == 3 * 2 and not pipeline.in_flight


@pytest.mark.parametrize("k", [1, 2, 3])
def test_batches_run_k_ahead_and_stay_within_the_bound(k):
    fleet, sampler, pipeline, sampling = _pipeline(k, last=6)
    lags = {}
    for it in range(1, 7):
        collected = pipeline.batch(it, sampling, None)
        lags[it] = fleet.weights_version - min(t.policy_version for t in collected)
        assert sorted(pipeline.in_flight) == list(range(it + 1, min(it + k, 6) + 1))
        assert pipeline.metrics()["async/staleness_max"] == lags[it]
        pipeline.sync_weights(None)  # one update per iteration
    assert lags == {it: min(it - 1, k) for it in range(1, 7)}  # k behind once running
    assert fleet.sent == [_seed(it) for it in range(1, 7)]  # each batch once, in order
    assert fleet.waited == [False] * 6 and pipeline.refused == 0


def test_a_batch_too_old_is_refused_and_collected_again():
    fleet, sampler, pipeline, sampling = _pipeline(1)
    pipeline.batch(1, sampling, None)
    pipeline.sync_weights(None)
    pipeline.sync_weights(None)  # an extra sync (a rollback): batch 2 is now 2 behind
    collected = pipeline.batch(2, sampling, None)
    assert all(t.policy_version == fleet.weights_version for t in collected)
    assert pipeline.metrics()["async/staleness_max"] == 0
    assert pipeline.metrics()["async/refused_batches"] == 1
    assert (
        fleet.events[0][0] == "batch_refused"
        and "max_staleness = 1" in (fleet.events[0][1]["message"])
    )
    assert fleet.sent[-1] == _seed(2)  # the same batch (levels, seed) again


def test_checkpoint_position_is_before_the_batches_in_flight_and_drop_cancels():
    fleet, sampler, pipeline, sampling = _pipeline(2)
    pipeline.batch(1, sampling, None)  # batches 2 and 3 in flight: 4 levels taken ahead
    assert sampler.position == 3 * 2 and pipeline.sampler_position() == 2
    in_flight = [c for c, _ in pipeline.in_flight.values()]
    pipeline.drop()
    assert not pipeline.in_flight and all(c.cancelled for c in in_flight)
    assert pipeline.sampler_position() == sampler.position
