"""Kill the driver mid-run (SIGKILL), resume the same MLflow run from its checkpoint
with ``tether run --resume``, and read back a metric history in which every step
appears once: the steps re-run after the resume point that the run already held are not
logged again."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import micro_config_dict
from tether.analysis.source import metric_history
from tether.platform.sweep.results import results_rows

ITERATIONS, CHECKPOINT_EVERY = 5, 2


def _wait_for_step(client_uri, out, step, process, timeout=600):
    """Wait until the run has logged ``rollout/success`` at ``step``; return the run id.

    MLflow is only read once a checkpoint exists (the run's tables are made by then:
    a reader racing the first writer's table creation fails)."""
    deadline = time.time() + timeout
    run_id = None
    while time.time() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"run ended early: {process.stdout.read()}")
        if run_id is None:
            found = list(out.glob("checkpoints/*/iter_*.pt"))
            run_id = found[0].parent.name if found else None
        elif step in {
            m.step for m in MlflowClient(client_uri).get_metric_history(run_id, "rollout/success")
        }:
            return run_id
        time.sleep(0.2)
    raise AssertionError(f"step {step} never logged")


def _leftover_ray(driver_pid: int, timeout: float = 30.0) -> list[str]:
    """Processes of the Ray session the driver started (its name ends in the driver's pid)."""
    session = re.compile(rf"session_[0-9_-]+_{driver_pid}\b")
    deadline = time.time() + timeout
    while True:
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        alive = [line for line in ps.splitlines() if session.search(line)]
        if not alive or time.time() > deadline:
            return alive
        time.sleep(1)


def test_sigkill_then_resume_continues_the_same_run(micro_policy, models_dir, tmp_path):
    cfg = micro_config_dict(
        tmp_path,
        rollout={"num_workers": 1},
        algo={"preset": "grpo", "kl_coef": 0.0, "micro_batch_size": 8},
        trainer={
            "iterations": ITERATIONS,
            "val_every": ITERATIONS,
            "val_episodes": 2,
            "checkpoint_every": CHECKPOINT_EVERY,
            "samples_per_log": 0,
        },
        diagnostics={"every": 2, "max_pairs": 8, "information_chain": False, "grad_snr_every": 0},
        tracking={"log_model": False},
        model={"cache_dir": str(models_dir)},
        ray={"num_cpus": 2},
    )
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(cfg))
    tether = [sys.executable, "-m", "tether.platform.cli"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "runs"
    uri = f"sqlite:///{out / 'mlflow.db'}"
    first = subprocess.Popen(
        tether + ["run", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    # Step 3 is logged after the checkpoint of iteration 2 and before the next one (4):
    # killed now, the resumed run starts at 3 again, and does not log it a second time.
    run_id = _wait_for_step(uri, out, 3, first)
    killed_at = time.time() * 1000
    first.send_signal(signal.SIGKILL)  # the driver only; Ray's processes die with it
    first.wait()
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "RUNNING"  # nobody closed it
    logged_before = {m.step for m in client.get_metric_history(run_id, "rollout/success")}
    assert logged_before >= {1, 2, 3}
    checkpoints = sorted(p.name for p in (out / "checkpoints" / run_id).glob("iter_*.pt"))
    resume_point = int(checkpoints[-1][5:11])
    rerun = {s for s in logged_before if s > resume_point}
    assert rerun, "killed right after a checkpoint: nothing to re-run"

    done = subprocess.run(
        tether + ["run", str(spec), "--resume", run_id],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming at iteration {resume_point + 1}" in done.stdout
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["tether.resumed_from"] == str(resume_point)
    assert tags["tether.resume_count"] == "1"
    assert tags["tether.resume_1"].startswith(f"iteration {resume_point} from ")
    assert tags["tether.iterations_done"] == str(ITERATIONS)

    # Every step appears once: the steps logged before the kill keep their entries, the
    # re-run ones (they ran again: their iteration lines) are not logged a second time.
    for m in rerun:
        assert f"iteration {m}/{ITERATIONS}" in done.stdout, done.stdout
    for key in ("rollout/success", "rollout/reward_mean", "timing/collect", "timing/iteration"):
        history = client.get_metric_history(run_id, key)
        steps = sorted(m.step for m in history)
        assert steps == list(range(1, ITERATIONS + 1)), (key, steps)
        for m in history:
            assert (m.timestamp > killed_at) == (m.step > max(rerun)), (key, m)
    series = metric_history(client, run_id, "rollout/success")
    assert sorted(series) == list(range(1, ITERATIONS + 1))
    val = metric_history(client, run_id, "val/success")
    assert set(val) == {0, ITERATIONS}
    # The sweep results table (a reader of MLflow) counts each iteration once.
    client.set_tag(run_id, "mlflow.parentRunId", "parent-of-resume-test")
    [row] = results_rows(
        uri, run.info.experiment_id, "parent-of-resume-test", "rollout/success", "max"
    )
    assert row["iterations"] == ITERATIONS
    assert row["success_final"] == metric_history(client, run_id, "rollout/success")[ITERATIONS]
    assert not _leftover_ray(first.pid), "Ray processes outlived their SIGKILLed driver"


def test_sigterm_ends_the_run_like_ctrl_c(micro_policy, models_dir, tmp_path):
    """`kill <pid>` (SIGTERM) mid-run: one line, exit 130, the MLflow run marked KILLED,
    and no process of the local Ray left behind (Ray's own handler would abort instead)."""
    cfg = micro_config_dict(
        tmp_path,
        rollout={"num_workers": 1},
        algo={"preset": "grpo", "kl_coef": 0.0},
        trainer={
            "iterations": 50,
            "val_every": 50,
            "val_episodes": 2,
            "checkpoint_every": 1,
            "samples_per_log": 0,
        },
        diagnostics={"enabled": False},
        tracking={"log_model": False},
        model={"cache_dir": str(models_dir)},
        ray={"num_cpus": 2},
    )
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "runs"
    uri = f"sqlite:///{out / 'mlflow.db'}"
    run = subprocess.Popen(
        [sys.executable, "-m", "tether.platform.cli", "run", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    run_id = _wait_for_step(uri, out, 1, run)
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 130, output[-3000:]
    assert "interrupted; the MLflow run is marked KILLED" in output
    assert "SIGTERM received" not in output  # Ray's abort handler did not run
    finished = MlflowClient(uri).get_run(run_id)
    assert finished.info.status == "KILLED"
    assert finished.data.tags["tether.status"] == "KILLED"
    assert _leftover_ray(run.pid) == []


def test_a_resume_that_changes_the_trained_parameters_is_refused_in_one_line(tmp_path):
    """Adding LoRA to (or dropping it from) a resumed run, or changing its rank, size or
    model path, is refused before anything starts; other overrides pass."""
    import pytest

    from tether.platform.config import build_config
    from tether.platform.run.checkpoint import ResumeError, check_same_parameters

    saved = build_config(micro_config_dict(tmp_path), []).model_dump(mode="json")
    check_same_parameters(saved, build_config(saved, ["algo.lr=0.01"]).model)
    for overrides, says in (
        (["model.lora.r=4"], "written without model.lora, and this resume adds it"),
        (["model.size=tiny"], "model.size was 'micro'"),
    ):
        with pytest.raises(ResumeError, match=says) as err:
            check_same_parameters(saved, build_config(saved, overrides).model)
        assert "\n" not in str(err.value)
    with_lora = build_config(saved, ["model.lora.r=4"]).model_dump(mode="json")
    check_same_parameters(with_lora, build_config(with_lora, ["model.lora.alpha=8"]).model)
    with pytest.raises(ResumeError, match="model.lora.r was 4"):
        check_same_parameters(with_lora, build_config(with_lora, ["model.lora.r=8"]).model)
    with pytest.raises(ResumeError, match="drops it"):
        check_same_parameters(with_lora, build_config(with_lora, ["model.lora=null"]).model)
    assert saved["model"]["lora"] is None, "build_config left the saved tree as it was"


def test_a_resume_target_may_be_the_checkpoint_the_run_dir_checkpoints_or_the_output_dir(
    tmp_path,
):
    """``--resume`` finds the newest checkpoint from the file itself, the run's checkpoint
    directory, the output directory's ``checkpoints/`` or the output directory; a directory
    without one is refused naming where it looked."""
    import pytest
    import torch

    from tether.platform.run.checkpoint import ResumeError, resolve_resume

    def write(run_id: str, iteration: int, when: float):
        path = tmp_path / "out" / "checkpoints" / run_id / f"iter_{iteration:06d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"driver": {"run_id": run_id, "config": {"seen": run_id}}}, path)
        os.utime(path, (when, when))
        return path

    write("old", 9, 1_000)
    newest = write("new", 4, 2_000)
    out = tmp_path / "out"
    for target in (newest, newest.parent, out / "checkpoints", out):
        path, run_id, config = resolve_resume(str(target), "sqlite:///unused.db")
        assert (path, run_id, config) == (newest, "new", {"seen": "new"}), target
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResumeError, match="no checkpoint"):
        resolve_resume(str(tmp_path / "empty"), "sqlite:///unused.db")


@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_a_resumed_run_keeps_the_validation_intervals_of_before_the_resume(
    micro_policy, models_dir, ray_local, tmp_path
):
    """The checkpoint keeps each validation's Wilson interval beside its success rate,
    so a resumed run's summary shows the intervals of the validations before the resume
    (not ``[v, v]``, the CLI's stand-in for an interval it does not have)."""
    from tests.conftest import checkpointed_run_config
    from tether.platform.run.trainer import Trainer

    first = Trainer(checkpointed_run_config(tmp_path, models_dir, 2, {"val_every": 1})).run()
    assert sorted(first.val_intervals) == [0, 1, 2]
    cfg = checkpointed_run_config(tmp_path, models_dir, 3, {"val_every": 1})
    checkpoint = cfg.experiment.output_dir / "checkpoints" / first.run_id / "iter_000002.pt"
    resumed = Trainer(cfg, resume_from=checkpoint, resume_run_id=first.run_id).run()
    assert resumed.status == "FINISHED" and resumed.run_id == first.run_id
    assert sorted(resumed.val_history) == sorted(resumed.val_intervals) == [0, 1, 2, 3]
    for step in (0, 1, 2):
        assert resumed.val_history[step] == first.val_history[step]
        assert resumed.val_intervals[step] == first.val_intervals[step], step
    for step, (low, high) in resumed.val_intervals.items():
        # two held-out episodes: a Wilson interval that is wide, around the rate
        assert low <= resumed.val_history[step] <= high and high - low > 0.3, step
