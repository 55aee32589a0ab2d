"""Kill the driver mid-run (SIGKILL), resume the same MLflow run from its checkpoint,
and read back a metric history in which every step appears exactly as resumed."""

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import micro_config_dict


def _wait_for_checkpoint(directory, iteration, process, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list(directory.glob(f"checkpoints/*/iter_{iteration:06d}.pt")):
            return
        if process.poll() is not None:
            raise AssertionError(f"run ended early: {process.stdout.read()}")
        time.sleep(1)
    raise AssertionError("no checkpoint in time")


@pytest.mark.slow
def test_sigkill_then_resume_continues_the_same_run(micro_policy, models_dir, tmp_path):
    cfg = micro_config_dict(tmp_path, trainer={"iterations": 4, "val_every": 4,
                                               "checkpoint_every": 1},
                            diagnostics={"every": 1}, model={"cache_dir": str(models_dir)})
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(cfg))
    tether = [sys.executable, "-m", "tether.platform.cli"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(tether + ["run", str(spec)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env,
                             start_new_session=True)
    out = tmp_path / "runs"
    _wait_for_checkpoint(out, 2, first)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and everything it started
    first.wait()
    [ckpt_dir] = list(out.glob("checkpoints/*"))
    run_id = ckpt_dir.name
    uri = f"sqlite:///{out / 'mlflow.db'}"
    client = MlflowClient(uri)
    before = {m.step for m in client.get_metric_history(run_id, "rollout/success")}
    assert {1, 2} <= before

    done = subprocess.run(tether + ["run", str(spec), "--resume", run_id], capture_output=True,
                          text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    resumed_from = int(run.data.tags["tether.resumed_from"])
    assert resumed_from >= 2 and run.data.tags["tether.resume_count"] == "1"
    history = client.get_metric_history(run_id, "rollout/success")
    steps = {m.step for m in history}
    assert steps == {1, 2, 3, 4}  # no step missing
    # Steps re-run after the resume point carry the resumed values as their last value.
    last = {}
    for m in sorted(history, key=lambda m: m.timestamp):
        last[m.step] = m
    for step in range(resumed_from + 1, 5):
        assert last[step].timestamp >= max(m.timestamp for m in history if m.step <= resumed_from)
    val = {m.step for m in client.get_metric_history(run_id, "val/success")}
    assert {0, 4} <= val
