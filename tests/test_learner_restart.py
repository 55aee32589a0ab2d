"""Learner death recovered in place: a learner rank SIGKILLed mid-update (world size 1
and 2), or as it gathers the weights for the rollout workers. The driver rebuilds the group from the last checkpoint, re-runs the lost
iteration with the same seeds and finishes in the same MLflow run; from the restart on
its metrics equal those of a run resumed from a copy of the same checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
import threading

import pytest
import ray
from mlflow.tracking import MlflowClient

from tests.conftest import micro_config_dict
from tether.actors.learner_group import LearnerGroup
from tether.platform.config import build_config

ITERATIONS, KILL_AT = 4, 3
NOT_COMPARED = ("timing/", "system/", "rollout/tokens_per_s", "tether.learner_restarts")


def _config(tmp_path, models_dir, world_size):
    cfg = build_config(
        micro_config_dict(
            tmp_path,
            rollout={"num_workers": 1, "groups": 2, "group_size": 4, "num_cpus_per_worker": 0.5},
            algo={
                "preset": "grpo",
                "kl_coef": 0.0,
                "micro_batch_size": 8,
                "ppo_epochs": 2,
                "learner_world_size": world_size,
                "num_cpus": 0.5,
                "threads": 1,
            },
            trainer={
                "iterations": ITERATIONS,
                "val_every": ITERATIONS,
                "val_episodes": 2,
                "checkpoint_every": 1,
                "samples_per_log": 0,
                "learner_restart_backoff_s": 0.5,
            },
            diagnostics={"enabled": False},
            tracking={"log_model": False},
        )
    )
    cfg.model.cache_dir = models_dir
    return cfg


class Killer:
    """Wraps ``LearnerGroup.<method>`` in this (driver) process: at its KILL_AT-th call,
    rank ``rank`` is SIGKILLed 50 ms into ``update`` (while it runs), or just before
    ``state_dict`` (the weights the rollout workers then fail to fetch)."""

    def __init__(self, method: str, rank: int):
        self.method, self.rank, self.calls, self.killed = method, rank, 0, None
        self.original = getattr(LearnerGroup, method)

    def __call__(self, group, *args):
        self.calls += 1
        if self.calls == KILL_AT:
            pid = ray.get(group.ranks[self.rank].__ray_call__.remote(lambda actor: os.getpid()))
            if self.method == "update":
                threading.Timer(0.05, self.kill, (pid,)).start()
            else:
                self.kill(pid)
        return self.original(group, *args)

    def kill(self, pid):
        os.kill(pid, signal.SIGKILL)
        self.killed = pid


def _metrics(client, run_id, steps):
    out = {}
    for key in client.get_run(run_id).data.metrics:
        if key.startswith(NOT_COMPARED):
            continue
        for m in client.get_metric_history(run_id, key):
            if m.step in steps:
                out.setdefault((key, m.step), []).append(m.value)
    return out


@pytest.mark.parametrize("world_size, method", [(1, "update"), (2, "update"), (1, "state_dict")])
def test_learner_rank_killed_is_rebuilt_in_place(
    micro_policy, models_dir, ray_local, tmp_path, monkeypatch, world_size, method
):
    from tether.platform.driver import Trainer

    killer = Killer(method, rank=world_size - 1)
    monkeypatch.setattr(LearnerGroup, method, lambda group, *args: killer(group, *args))
    events, saved = [], tmp_path / "restart_point.pt"

    def on_event(kind, data):
        if kind == "started":
            events.append(("started", data["run_id"]))
        elif kind == "learner_failed":  # keep the checkpoint it rebuilds from (pruned later)
            events.append((kind, data))
            shutil.copy(data["checkpoint"], saved)

    summary = Trainer(_config(tmp_path / "killed", models_dir, world_size), on_event).run()
    monkeypatch.setattr(LearnerGroup, method, killer.original)
    assert killer.killed is not None
    assert summary.status == "FINISHED" and summary.iterations == ITERATIONS
    failures = [d for kind, d in events if kind == "learner_failed"]
    assert len(failures) == 1 and f"died during {method}" in failures[0]["error"], failures
    assert failures[0]["checkpoint"].endswith(f"iter_{KILL_AT - 1:06d}.pt")
    assert events[0] == ("started", summary.run_id)  # one MLflow run throughout

    client = MlflowClient(summary.tracking_uri)
    run = client.get_run(summary.run_id)
    assert run.data.tags["tether.learner_restarts"] == "1"
    assert "rebuilt from" in run.data.tags["tether.learner_restart_1"]
    restarts = {
        m.step: m.value
        for m in client.get_metric_history(summary.run_id, "tether.learner_restarts")
    }
    assert restarts == {1: 0, 2: 0, 3: 1, 4: 1}

    # The reference: a fresh driver resumed from the same checkpoint (as `--resume` does).
    reference = Trainer(
        _config(tmp_path / "resumed", models_dir, world_size), resume_from=saved
    ).run()
    assert reference.status == "FINISHED"
    steps = set(range(KILL_AT, ITERATIONS + 1))
    after = _metrics(client, summary.run_id, steps)
    expected = _metrics(MlflowClient(reference.tracking_uri), reference.run_id, steps)
    assert all(len(values) == 1 for values in after.values())  # each step logged once
    assert set(after) == set(expected) and len(after) > 20
    different = {k: (after[k], expected[k]) for k in after if after[k] != expected[k]}
    assert not different, different


def test_learner_killed_before_the_first_checkpoint_is_rebuilt_from_the_start(
    micro_policy, models_dir, ray_local, tmp_path, monkeypatch
):
    """No checkpoint yet (``trainer.checkpoint_every`` = the run's length): a learner
    killed in iteration KILL_AT's update is rebuilt from the run's starting weights and
    the run starts over from iteration 1 in the same MLflow run, with the same seeds: the
    iterations before the kill, logged twice, log equal values both times."""
    from tether.platform.driver import Trainer

    killer = Killer("update", rank=0)
    monkeypatch.setattr(LearnerGroup, "update", lambda group, *args: killer(group, *args))
    cfg = _config(tmp_path, models_dir, world_size=1)
    cfg.trainer.checkpoint_every = ITERATIONS  # the first checkpoint: after the last iteration
    failures = []

    def on_event(kind, data):
        if kind == "learner_failed":
            failures.append(data)

    summary = Trainer(cfg, on_event).run()
    assert killer.killed is not None
    assert summary.status == "FINISHED" and summary.iterations == ITERATIONS
    assert len(failures) == 1 and "starting weights" in failures[0]["checkpoint"], failures
    client = MlflowClient(summary.tracking_uri)
    tags = client.get_run(summary.run_id).data.tags
    assert tags["tether.learner_restarts"] == "1"
    assert "rebuilt from the run's starting weights" in tags["tether.learner_restart_1"]
    before_the_kill = set(range(1, KILL_AT))
    twice = _metrics(client, summary.run_id, before_the_kill)
    assert {len(values) for values in twice.values()} == {2} and len(twice) > 20
    different = {k: v for k, v in twice.items() if v[0] != v[1]}
    assert not different, different
    once = _metrics(client, summary.run_id, set(range(KILL_AT, ITERATIONS + 1)))
    assert {len(values) for values in once.values()} == {1}
