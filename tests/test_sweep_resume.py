"""`tether sweep --resume` continues an interrupted family's trials from their last
checkpoint (issue 74, item 3): each report carries a Tune checkpoint naming the trial's
MLflow run and checkpoint directory (``sweep_trial.continued_from``), and a sweep whose
driver is SIGKILLed mid-trial, resumed, ends with the metrics of an uninterrupted one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.test_sweep import micro_sweep_sections, write_spec
from tether.analysis.source import metric_history
from tether.platform.sweep.trial import TRIAL_POINTER, continued_from

ITERATIONS = 16  # about 0.75 s each: the kill lands mid-trial (Tune saves its state every 5 s)
#: What both families must agree on, step by step (wall times and memory differ).
COMPARED = ("rollout/success", "rollout/reward_mean", "rollout/reasoning_length", "val/success")


def _tune_checkpoint(tmp_path: Path, pointer: str):
    from ray import tune

    directory = tmp_path / "tune_checkpoint"
    directory.mkdir(parents=True)
    (directory / TRIAL_POINTER).write_text(pointer)
    return tune.Checkpoint.from_directory(str(directory))


def test_a_restored_trial_continues_from_the_newest_checkpoint_its_pointer_names(tmp_path):
    checkpoints = tmp_path / "checkpoints" / "run-a"
    checkpoints.mkdir(parents=True)
    for it in (3, 4):
        (checkpoints / f"iter_{it:06d}.pt").write_bytes(b"")
    pointer = f'{{"run_id": "run-a", "checkpoints": "{checkpoints}"}}'
    assert continued_from(_tune_checkpoint(tmp_path, pointer)) == (
        checkpoints / "iter_000004.pt",
        "run-a",
    )
    assert continued_from(None) == (None, None)  # a new trial


def test_a_trial_interrupted_before_its_first_checkpoint_starts_again(tmp_path):
    empty = tmp_path / "checkpoints" / "run-b"
    empty.mkdir(parents=True)
    pointer = f'{{"run_id": "run-b", "checkpoints": "{empty}"}}'
    assert continued_from(_tune_checkpoint(tmp_path, pointer)) == (None, None)
    # reported before the run had started (no run id yet): starts again too
    assert continued_from(_tune_checkpoint(tmp_path / "x", "{}")) == (None, None)


def _spec(tmp_path: Path, models_dir: Path, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    return write_spec(
        directory,
        {
            "name": "resume-family",
            "search": "grid",
            "space": {"algo.entropy_coef": {"grid": [0.0, 0.01]}},
            "resources": {"cpu": 0.2},
            "max_concurrent": 1,
        },
        **micro_sweep_sections(
            directory, models_dir, "resume-test", ITERATIONS, diagnostics={"enabled": False}
        ),
    )


def _family(spec: Path) -> tuple[MlflowClient, dict[str, object]]:
    """The family's trial runs by their swept value."""
    data = yaml.safe_load(spec.read_text())
    uri = f"sqlite:///{Path(data['experiment']['output_dir']) / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = [
        r
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id])
        if "sweep.trial_id" in r.data.tags
    ]
    return client, {r.data.tags["sweep.param.algo.entropy_coef"]: r for r in runs}


def _sweep(spec: Path, *extra: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tether.platform.cli", "sweep", str(spec), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        **popen,
    )


def _kill_mid_trial(spec: Path, process: subprocess.Popen, timeout: float = 600) -> str:
    """SIGKILL the sweep's driver once its first trial has a checkpoint, has logged a
    later iteration (2), and Tune has saved its state since; return that trial's run id."""
    experiment = Path(yaml.safe_load(spec.read_text())["experiment"]["output_dir"]) / "sweeps"
    deadline = time.time() + timeout
    seen_at = None
    while time.time() < deadline:
        assert process.poll() is None, process.stdout.read()
        found = sorted(experiment.parent.glob("checkpoints/*/iter_*.pt"))
        if found and seen_at is None:
            run_id = found[0].parent.name
            steps = {m.step for m in _family(spec)[0].get_metric_history(run_id, "rollout/success")}
            if max(steps, default=0) >= 2:
                seen_at = time.time()
        if seen_at is not None:
            states = list(experiment.glob("*/experiment_state-*.json"))
            if states and max(p.stat().st_mtime for p in states) > seen_at:
                process.send_signal(signal.SIGKILL)
                process.wait()
                return run_id
        time.sleep(0.1)
    raise AssertionError("the first trial never reached iteration 2")


@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_a_killed_sweep_resumed_ends_with_the_metrics_of_an_uninterrupted_one(
    micro_policy, models_dir, tmp_path
):
    whole = _spec(tmp_path, models_dir, "whole")
    done = _sweep(whole)
    assert done.wait(timeout=900) == 0, done.stdout.read()[-4000:]

    broken = _spec(tmp_path, models_dir, "broken")
    interrupted = _kill_mid_trial(broken, _sweep(broken))
    client, before = _family(broken)
    killed = next(r for r in before.values() if r.info.run_id == interrupted)
    logged = metric_history(client, interrupted, "rollout/success")
    assert killed.info.status == "RUNNING" and max(logged) < ITERATIONS

    resumed = _sweep(broken, "--resume")
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output[-4000:]

    whole_client, uninterrupted = _family(whole)
    client, after = _family(broken)
    assert set(after) == set(uninterrupted) == {"0.0", "0.01"}
    continued = next(r for r in after.values() if r.info.run_id == interrupted)
    tags = continued.data.tags
    assert tags["tether.resume_count"] == "1"  # the same MLflow run, continued
    assert 1 <= int(tags["tether.resumed_from"]) < ITERATIONS
    for value, run in after.items():
        assert run.info.status == "FINISHED", value
        for key in COMPARED:
            assert metric_history(client, run.info.run_id, key) == metric_history(
                whole_client, uninterrupted[value].info.run_id, key
            ), (value, key)
