"""Actor reuse between runs: the pool's rules on plain objects, then real runs on one pool.

The same config run on a fresh actor set and again on the same (reused) actors, after
a run with another learning rate, entropy coefficient and filter has trained them,
logs the same metrics and ends with the same weights; a run whose workers would be
built differently gets new workers (and keeps the learner); a failed run ends its
actors instead of handing them on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import micro_config_dict
from tests.processes import assert_actor_processes_ended, tether_actor_processes
from tether.platform.run.actor_pool import ActorPool, ActorRequest


# -- the pool's rules ------------------------------------------------------------------
class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def request(self, kind: str, key, reusable: bool = True) -> ActorRequest:
        def create():
            self.events.append(("create", f"{kind}:{key}"))
            return {"kind": kind, "key": key}

        def end(actors):
            self.events.append(("end", f"{actors['kind']}:{actors['key']}"))

        return ActorRequest(kind, key, create, end, reusable)


def test_equal_keys_are_reused_and_differing_ones_end_before_new_ones_start():
    log, pool = Log(), ActorPool(keep=True)
    workers, learner = pool.checkout(log.request("workers", ("a", 1)), log.request("learner", 1))
    pool.checkin(healthy=True)
    assert log.events == [("create", "workers:('a', 1)"), ("create", "learner:1")]
    assert pool.reused == {"workers": False, "learner": False}

    log.events.clear()
    again, other = pool.checkout(log.request("workers", ("a", 1)), log.request("learner", 2))
    assert again is workers and other is not learner
    assert pool.reused == {"workers": True, "learner": False}
    # The old learner ended before the new one started (it holds the resources).
    assert log.events == [("end", "learner:1"), ("create", "learner:2")]
    with pytest.raises(RuntimeError, match="one run at a time"):
        pool.checkout(log.request("workers", ("a", 1)))

    log.events.clear()
    pool.checkin(healthy=False)  # a failed run hands nothing on
    assert sorted(log.events) == [("end", "learner:2"), ("end", "workers:('a', 1)")]
    assert pool.idle == {} and pool.lent == {}


def test_unrequested_unreusable_and_non_keeping_pools_end_their_actors():
    log, pool = Log(), ActorPool(keep=True)
    pool.checkout(log.request("workers", 1), log.request("learner", 1, reusable=False))
    pool.checkin(healthy=True)
    assert ("end", "learner:1") in log.events and list(pool.idle) == ["workers"]
    log.events.clear()
    pool.checkout(log.request("learner", 1))  # nobody asks for the workers: they end first
    assert log.events == [("end", "workers:1"), ("create", "learner:1")]
    pool.checkin(healthy=True)
    log.events.clear()
    pool.close()
    assert log.events == [("end", "learner:1")] and pool.idle == {}

    log, plain = Log(), ActorPool(keep=False)  # `tether run`: everything ends with the run
    plain.checkout(log.request("workers", 1))
    plain.checkin(healthy=True)
    assert log.events == [("create", "workers:1"), ("end", "workers:1")] and plain.idle == {}


# -- real runs ---------------------------------------------------------------------------
def _config(tmp_path: Path, models_dir, name: str, **sections):
    from tether.platform.config import build_config

    base = {
        "rollout": {"num_workers": 2, "num_cpus_per_worker": 0.5},
        "algo": {
            "preset": "grpo",
            "kl_coef": 0.01,
            "micro_batch_size": 4,
            "num_cpus": 0.5,
            "threads": 1,
        },
        "trainer": {
            "iterations": 2,
            "val_every": 2,
            "val_episodes": 4,
            "checkpoint_every": 100,
            "samples_every": 1,
        },
        "diagnostics": {"every": 2, "max_pairs": 8, "grad_snr_every": 2, "grad_snr_buckets": 2},
        "tracking": {"log_model": False},
    }
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    cfg = build_config(micro_config_dict(tmp_path, **base))
    cfg.model.cache_dir = models_dir
    cfg.experiment.run_name = name
    return cfg


def _handles(trainer) -> dict[str, list]:
    """The run's actors: rollout workers, their environment pools, learner ranks."""
    import ray

    return {
        "workers": list(trainer.fleet.workers),
        "env_pools": ray.get([w.env_pool_handle.remote() for w in trainer.fleet.workers]),
        "learner": list(trainer.learner.ranks),
    }


def _pids(handles) -> list[int]:
    import ray

    return ray.get([h.__ray_call__.remote(lambda self: os.getpid()) for h in handles])


class Recorder:
    """Driver-event hook: notes the run's actors (ids and pids) once they are up."""

    def __init__(self) -> None:
        self.trainer, self.handles, self.actors, self.pids = None, None, None, None

    def __call__(self, kind: str, data: dict) -> None:
        if kind == "started":
            self.handles = _handles(self.trainer)
            self.actors = {
                kind: [h._actor_id.hex() for h in handles] for kind, handles in self.handles.items()
            }
            self.pids = {kind: _pids(handles) for kind, handles in self.handles.items()}


def _run(cfg, pool):
    from tether.platform.run.trainer import Trainer

    recorder = Recorder()
    trainer = Trainer(cfg, recorder, actor_pool=pool)
    recorder.trainer = trainer
    return trainer.run(), recorder


def _metrics(summary) -> dict[str, dict[int, float]]:
    """Every logged metric but wall times and memory readings (a process's peak RSS
    depends on what it ran before), as {key: {step: value}}."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary.tracking_uri)
    keys = [
        k
        for k in client.get_run(summary.run_id).data.metrics
        if not k.startswith(("timing/", "system/")) and k != "rollout/tokens_per_s"
    ]
    return {
        k: {m.step: m.value for m in client.get_metric_history(summary.run_id, k)} for k in keys
    }


def _weights(pool):
    import ray

    return ray.get(pool.idle["learner"].actors.state_dict())


def _dead(handle, timeout: float = 30.0) -> bool:
    import ray

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            ray.get(handle.__ray_call__.remote(lambda self: None), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return True
        time.sleep(0.5)
    return False


@pytest.fixture(scope="module")
def pooled_runs(micro_policy, models_dir, ray_local, tmp_path_factory):
    """C on fresh actors, D (other lr, entropy coefficient, filter) and C again on the
    same actors, then C with other environment kwargs; final learner weights after each."""
    tmp = tmp_path_factory.mktemp("pool")
    pool = ActorPool(keep=True)
    c = _config(tmp, models_dir, "C")
    d = _config(
        tmp,
        models_dir,
        "D",
        algo={"lr": 5e-3, "entropy_coef": 0.05},
        filter={"strategy": "top_k", "value": 0.5},
    )
    e = _config(tmp, models_dir, "E", env={"stochasticity": 0.3})
    runs, weights = {}, {}
    try:
        for name, cfg in (("fresh", c), ("other", d), ("again", c), ("other_env", e)):
            runs[name] = _run(cfg, pool)
            weights[name] = {k: v.clone() for k, v in _weights(pool).items()}
            reused = dict(pool.reused)
            runs[name] = (*runs[name], reused)
        yield runs, weights, pool
    finally:
        pool.close()


def test_reused_actors_reproduce_a_fresh_run_exactly(pooled_runs):
    runs, weights, _ = pooled_runs
    (fresh, first, reused_first), (other, second, reused_second), (again, third, reused_third) = (
        runs["fresh"],
        runs["other"],
        runs["again"],
    )
    assert fresh.status == other.status == again.status == "FINISHED"
    assert reused_first == {"rollout_workers": False, "learner": False}
    assert reused_second == reused_third == {"rollout_workers": True, "learner": True}
    # No new actor process: the same actors (workers, their env pools, the learner rank)
    # and the same pids served all three runs.
    assert first.actors == second.actors == third.actors
    assert first.pids == second.pids == third.pids
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(again.tracking_uri).get_run(again.run_id).data.tags
    assert tags["tether.actors_reused"] == "rollout_workers,learner"

    # The run in between trained the same actors to other weights with other settings...
    assert any(not (weights["fresh"][k] == weights["other"][k]).all() for k in weights["fresh"])
    # ...yet the repeat starts from the model path's weights, a fresh optimiser, its own
    # settings and seed: every metric of every iteration, and the final weights, are equal.
    expected, got = _metrics(fresh), _metrics(again)
    assert {
        "rollout/success",
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/entropy",
        "val/success",
        "collapse/first_turn/num_pairs",
        "grad_snr/q1/task_grad_norm",
    } <= set(expected)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == expected[key], key
    assert sorted(expected["actor/pg_loss"]) == [1, 2]
    for k in weights["fresh"]:
        assert (weights["again"][k] == weights["fresh"][k]).all(), k


def test_other_environment_kwargs_get_new_workers_and_keep_the_learner(pooled_runs):
    runs, _, pool = pooled_runs
    summary, recorder, reused = runs["other_env"]
    before = runs["again"][1]
    assert summary.status == "FINISHED"
    assert reused == {"rollout_workers": False, "learner": True}
    assert recorder.actors["learner"] == before.actors["learner"]
    assert not set(recorder.actors["workers"]) & set(before.actors["workers"])
    assert not set(recorder.actors["env_pools"]) & set(before.actors["env_pools"])
    assert not set(recorder.pids["workers"]) & set(before.pids["workers"])
    assert recorder.pids["learner"] == before.pids["learner"]
    # The workers they replaced were ended, and their environment pools with them.
    assert all(_dead(h) for h in [*before.handles["workers"], *before.handles["env_pools"]])
    assert [w._actor_id.hex() for w in pool.idle["rollout_workers"].actors] == recorder.actors[
        "workers"
    ]


def test_a_failed_run_ends_its_actors_instead_of_handing_them_on(pooled_runs, tmp_path, models_dir):
    from tether.platform.run.trainer import Trainer

    _, _, pool = pooled_runs
    import ray

    workers = list(pool.idle["rollout_workers"].actors)
    env_pools = ray.get([w.env_pool_handle.remote() for w in workers])
    learner = pool.idle["learner"].actors
    cfg = _config(tmp_path, models_dir, "E", env={"stochasticity": 0.3})

    def fail(kind: str, data: dict) -> None:
        if kind == "iteration":
            raise RuntimeError("injected failure after iteration 1")

    assert (
        sorted(t.split(".")[0].split()[0] for t in tether_actor_processes(timeout=0))
        == ["ray::EnvPoolActor"] * 2 + ["ray::Learner"] + ["ray::RolloutWorker"] * 2
    )  # idle
    trainer = Trainer(cfg, fail, actor_pool=pool)
    with pytest.raises(RuntimeError, match="injected"):
        trainer.run()
    assert pool.reused == {"rollout_workers": True, "learner": True}
    assert pool.idle == {} and pool.lent == {}
    assert all(_dead(handle) for handle in [*workers, *env_pools, *learner.ranks])
    assert_actor_processes_ended()
