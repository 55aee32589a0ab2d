"""Fault injection: rollout workers and environment pools killed mid-collection.

Each run trains 5 iterations of the micro model through real Ray and MLflow and
kills an actor with ``ray.kill(..., no_restart=False)`` once per iteration while
that iteration's episodes are being collected.  Ray restarts the actor; the driver
collects the dead worker's share again.  Read back from MLflow, every iteration
has exactly the configured batch, and because a share is re-collected with the
same seed and weights, both runs log the same rollouts.
"""

import threading
import time

import pytest
import ray
from mlflow.tracking import MlflowClient

from tests.conftest import checkpointed_run_config
from tether.platform.run.trainer import Trainer

ITERATIONS = 5


def _config(tmp_path, models_dir):
    return checkpointed_run_config(
        tmp_path,
        models_dir,
        ITERATIONS,
        rollout={"num_workers": 2},
        trainer={"checkpoint_every": ITERATIONS, "samples_per_log": 0},
    )


class FaultInjector:
    """Driver-event hook: one kill per training iteration, while its collection runs."""

    def __init__(self, target: str):
        self.target, self.trainer = target, None
        self.kills, self.failures, self.batches = 0, [], {}
        self.training = False
        self.pool, self.pool_resets = None, 0
        self.thread: threading.Thread | None = None

    def __call__(self, kind: str, data: dict) -> None:
        if kind in ("validation", "iteration"):  # workers idle: note the pool's state
            self.training = True
            self.join()
            if kind == "iteration":
                self.batches[data["iteration"]] = sorted(
                    (t.group_id, t.sample_index) for t in self.trainer.last_collected
                )
            if self.target == "env_pool":
                self.pool = ray.get(self.trainer.fleet.workers[0].env_pool_handle.remote())
                self.pool_resets = ray.get(self.pool.stats.remote())["resets"]
        elif kind == "worker_failed":
            self.failures.append(data)
        elif (
            kind == "collecting"
            and self.training
            and data["attempt"] == 0
            and self.kills < ITERATIONS
        ):
            self.kills += 1
            if self.target == "rollout_worker":  # its collect task is in flight: it fails
                ray.kill(self.trainer.fleet.workers[1], no_restart=False)
            else:  # once the pool holds this collection's episodes, mid-episode
                self.thread = threading.Thread(target=self.kill_pool_mid_episode, daemon=True)
                self.thread.start()

    def kill_pool_mid_episode(self) -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            stats = ray.get(self.pool.stats.remote())
            if stats["resets"] > self.pool_resets and stats["steps"] >= 1:
                ray.kill(self.pool, no_restart=False)
                return
            time.sleep(0.01)
        raise AssertionError("the collection never stepped its environments")

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=120)
            self.thread = None


def _run_with_faults(target, tmp_path, models_dir):
    cfg = _config(tmp_path, models_dir)
    injector = FaultInjector(target)
    trainer = Trainer(cfg, on_event=injector)
    injector.trainer = trainer
    summary = trainer.run()
    return cfg, summary, injector


def _history(summary, key):
    client = MlflowClient(summary.tracking_uri)
    return {m.step: m.value for m in client.get_metric_history(summary.run_id, key)}


@pytest.fixture(scope="module")
def faulty_runs(micro_policy, models_dir, ray_local, tmp_path_factory):
    return {
        target: _run_with_faults(target, tmp_path_factory.mktemp(target), models_dir)
        for target in ("rollout_worker", "env_pool")
    }


@pytest.mark.parametrize("target", ["rollout_worker", "env_pool"])
def test_run_survives_five_kills_with_full_batches(faulty_runs, target):
    cfg, summary, injector = faulty_runs[target]
    assert summary.status == "FINISHED" and summary.iterations == ITERATIONS
    assert injector.kills == ITERATIONS
    # Each kill cost exactly one share, collected again.
    assert len(injector.failures) == ITERATIONS, injector.failures
    print(
        f"{target}: {injector.kills} kills; failures: "
        f"{[f['error'][:80] for f in injector.failures]}"
    )
    batch = cfg.rollout.groups * cfg.rollout.group_size
    assert _history(summary, "rollout/trajectories") == {
        it: batch for it in range(1, ITERATIONS + 1)
    }
    assert _history(summary, "rollout/worker_failures")[ITERATIONS] == ITERATIONS
    # No trajectory lost or counted twice: every (group, sample) of the batch exactly once.
    grid = sorted((g, k) for g in range(cfg.rollout.groups) for k in range(cfg.rollout.group_size))
    assert injector.batches == {it: grid for it in range(1, ITERATIONS + 1)}


def test_recollected_shares_match_across_fault_kinds(faulty_runs):
    """Same seeds and weights: a share collected again is the share that was lost."""
    (_, worker_run, _), (_, pool_run, _) = faulty_runs["rollout_worker"], faulty_runs["env_pool"]
    for key in ("rollout/reward_mean", "rollout/response_length", "rollout/success"):
        assert _history(worker_run, key) == _history(pool_run, key), key
