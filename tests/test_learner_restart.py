"""Learner death recovered in place: a learner rank SIGKILLed mid-update (world size 1
and 2), as it gathers the weights for the rollout workers, or as the driver asks for its
state to checkpoint an iteration it has already logged. The driver rebuilds the group
from the last checkpoint, re-runs the lost iteration with the same seeds and finishes in
the same MLflow run, every step logged once; from the restart on its metrics equal those
of a run resumed from a copy of the same checkpoint."""

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
    ``state_dict`` (the weights the rollout workers then fail to fetch) or ``full_state``
    (iteration KILL_AT's checkpoint, after its metrics were logged)."""

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


@pytest.mark.parametrize(
    "world_size, method",
    [
        (1, "update"),
        # World size 2, the kill at the weights' fetch and at the checkpoint's state:
        # nightly (-m slow); CONTRIBUTING.md, "Tests", Nightly.
        pytest.param(2, "update", marks=pytest.mark.slow),
        pytest.param(1, "state_dict", marks=pytest.mark.slow),
        pytest.param(1, "full_state", marks=pytest.mark.slow),
    ],
)
def test_learner_rank_killed_is_rebuilt_in_place(
    micro_policy, models_dir, ray_local, tmp_path, monkeypatch, world_size, method
):
    from tether.platform.run.trainer import Trainer

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
    # (a death at the checkpoint: iteration KILL_AT had been logged, with no restart yet)
    assert restarts == {1: 0, 2: 0, 3: 0 if method == "full_state" else 1, 4: 1}

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


@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_learner_killed_before_the_first_checkpoint_is_rebuilt_from_the_start(
    micro_policy, models_dir, ray_local, tmp_path, monkeypatch
):
    """No checkpoint yet (``trainer.checkpoint_every`` = the run's length): a learner
    killed in iteration KILL_AT's update is rebuilt from the run's starting weights and
    the run starts over from iteration 1 in the same MLflow run, with the same seeds: the
    iterations before the kill run twice with equal metrics (the events of both) and are
    logged once."""
    from tether.platform.run.trainer import Trainer

    killer = Killer("update", rank=0)
    monkeypatch.setattr(LearnerGroup, "update", lambda group, *args: killer(group, *args))
    cfg = _config(tmp_path, models_dir, world_size=1)
    cfg.trainer.checkpoint_every = ITERATIONS  # the first checkpoint: after the last iteration
    failures, runs = [], {}  # iteration -> the metrics of each time it ran

    def on_event(kind, data):
        if kind == "learner_failed":
            failures.append(data)
        elif kind == "iteration":
            runs.setdefault(data["iteration"], []).append(
                {k: v for k, v in data.items() if not k.startswith(NOT_COMPARED)}
            )

    summary = Trainer(cfg, on_event).run()
    assert killer.killed is not None
    assert summary.status == "FINISHED" and summary.iterations == ITERATIONS
    assert len(failures) == 1 and "starting weights" in failures[0]["checkpoint"], failures
    client = MlflowClient(summary.tracking_uri)
    tags = client.get_run(summary.run_id).data.tags
    assert tags["tether.learner_restarts"] == "1"
    assert "rebuilt from the run's starting weights" in tags["tether.learner_restart_1"]
    before_the_kill = set(range(1, KILL_AT))
    assert {it for it, ran in runs.items() if len(ran) == 2} == before_the_kill
    for it in before_the_kill:  # re-run with the same seeds from the same weights: equal
        first, again = runs[it]
        different = {k: (v, again.get(k)) for k, v in first.items() if again.get(k) != v}
        assert not different and len(first) > 20, (it, different)
    logged = _metrics(client, summary.run_id, set(range(1, ITERATIONS + 1)))
    assert {len(values) for values in logged.values()} == {1} and len(logged) > 20 * ITERATIONS
    first_run = {(k, it): [v] for it, ran in runs.items() for k, v in ran[0].items()}
    assert {k: v for k, v in logged.items() if k[1] in before_the_kill} == {
        k: v for k, v in first_run.items() if k in logged and k[1] in before_the_kill
    }
