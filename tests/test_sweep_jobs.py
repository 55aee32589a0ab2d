"""Sweeps as Ray jobs on a real local cluster (`ray start --head` on 127.0.0.1):
`ray job submit` runs a smoke sweep to SUCCEEDED; `ray job stop` ends a sweep midway,
cleanly, and `tether sweep --resume` re-runs only the trials that had not finished.

The cluster runs in its own process group and temp dir, and is stopped by signalling
that group: `ray stop` would stop every Ray on the machine, not just this one.
"""

from __future__ import annotations

import csv
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.processes import wait_for_group_to_end

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
RAY = shutil.which("ray") or str(Path(os.sys.executable).parent / "ray")
SWEEP_YAML = "experiments/stochasticity_smoke.yaml"
#: The smoke spec cut to 2 short iterations a trial: these tests are about jobs, not training.
SHORT = (
    "trainer.iterations=2",
    "trainer.val_every=2",
    "trainer.val_episodes=4",
    "trainer.samples_every=1",
    "rollout.groups=2",
    "diagnostics.every=2",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str, every: float = 3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, micro_policy):
    """A 2-CPU head node with the dashboard (job API) on 127.0.0.1."""
    temp_dir = tempfile.mkdtemp(prefix="rsw", dir="/tmp")  # short: Ray's socket paths
    log = tmp_path_factory.mktemp("cluster") / "ray_start.log"
    dashboard = f"http://127.0.0.1:{_free_port()}"
    # Ray >= 2.59 clusters use token auth; the `ray` CLI sends the token only in mode
    # "token", and `ray start` in that mode needs one to exist. A fresh machine has no
    # ~/.ray/auth_token (the nightly's clean machine failed here): this cluster's own,
    # beside its temp dir, for the head and every CLI call.
    token = Path(temp_dir) / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "PATH": f"{Path(os.sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN", None)  # it would win over the path
    with log.open("w") as out:
        head = subprocess.Popen(
            [
                RAY,
                "start",
                "--head",
                f"--port={_free_port()}",
                "--node-ip-address=127.0.0.1",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard.rsplit(':', 1)[1]}",
                "--num-cpus=2",
                # Its own agent port: another Ray on this machine (a test's local instance)
                # holds the default 52365, and job submission then finds "no available agent".
                f"--dashboard-agent-listen-port={_free_port()}",
                f"--temp-dir={temp_dir}",
                "--disable-usage-stats",
                "--block",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def dashboard_up():
        if head.poll() is not None:
            raise AssertionError(f"ray start exited: {log.read_text()[-2000:]}")
        try:
            return urllib.request.urlopen(f"{dashboard}/api/version", timeout=5).status == 200
        except urllib.error.HTTPError:
            return True  # up, and asking for the cluster's token (401)
        except OSError:
            return False

    try:
        _wait(dashboard_up, 240, "the Ray dashboard")
        yield {
            "address": dashboard,
            "env": env,
            "models": str(Path(micro_policy).parent),
            "pid": head.pid,  # its processes (workers, actors) are this one's descendants
            "logs": Path(temp_dir) / "session_latest" / "logs",
        }
    finally:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(head.pid, sig)  # the group this fixture started, nothing else
            except ProcessLookupError:
                break
            try:
                head.wait(grace)
            except subprocess.TimeoutExpired:
                continue
            wait_for_group_to_end(head.pid, grace)  # its other processes too (else SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _ray(cluster, *args, check=True, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [RAY, *args], cwd=REPO, env=cluster["env"], capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _submit(cluster, job_id: str, *sweep_args: str, shape: tuple[str, ...] = SHORT) -> None:
    """``tether sweep SWEEP_YAML`` as job ``job_id``: the spec cut to ``shape``, then
    ``sweep_args``."""
    # A longer stop grace than Ray's 3 s default, so `ray job stop` lets Tune end the
    # trials and save its state (the README's recipe).
    runtime_env = json.dumps({"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "90"}})
    _ray(
        cluster,
        "job",
        "submit",
        "--address",
        cluster["address"],
        "--submission-id",
        job_id,
        "--working-dir",
        ".",
        "--runtime-env-json",
        runtime_env,
        "--no-wait",
        "--",
        "tether",
        "sweep",
        SWEEP_YAML,
        *shape,
        *sweep_args,
    )


def _status(cluster, job_id: str) -> str:
    out = _ray(cluster, "job", "status", job_id, "--address", cluster["address"])
    text = out.stdout + out.stderr
    running = re.search(rf"Status for job '{job_id}': (\w+)", text)
    if running:
        return running.group(1)
    ended = re.search(rf"Job '{job_id}' (succeeded|failed|was stopped)", text)
    assert ended, text
    return {"succeeded": "SUCCEEDED", "failed": "FAILED", "was stopped": "STOPPED"}[ended[1]]


def _alive_actor_classes(cluster) -> list[str]:
    out = _ray(
        cluster,
        "list",
        "actors",
        "--address",
        cluster["address"],
        "--filter",
        "state=ALIVE",
        "--format",
        "json",
        "--limit",
        "1000",
    )
    text = out.stdout.strip()
    return [a["class_name"] for a in json.loads(text)] if text.startswith("[") else []


def _logs(cluster, job_id: str) -> str:
    return _ray(cluster, "job", "logs", job_id, "--address", cluster["address"]).stdout


def _wait_for_job(cluster, job_id: str, timeout: float) -> str:
    return _wait(
        lambda: (s := _status(cluster, job_id)) in ("SUCCEEDED", "FAILED", "STOPPED") and s,
        timeout,
        f"job {job_id}",
        every=5,
    )


def _runs(out: Path):
    uri = f"sqlite:///{out / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tether-sweep-smoke")
    if experiment is None:
        return client, None, []
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("tether.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    return client, (parents[0] if parents else None), children


def _results_csv(client, parent_id: str, tmp_path: Path) -> list[dict]:
    path = client.download_artifacts(parent_id, "sweep_results.csv", str(tmp_path))
    with open(path) as f:
        return list(csv.DictReader(f))


def test_ray_job_submit_runs_a_sweep_to_success(cluster, tmp_path):
    out = tmp_path / "out"
    two_filters = "sweep.space={filter: {grid: [{strategy: top_p}, {strategy: none}]}}"
    _submit(
        cluster,
        "sweep-ok",
        f"experiment.output_dir={out}",
        f"model.cache_dir={cluster['models']}",
        "rollout.max_reply_tokens=48",
        two_filters,
    )
    status = _wait_for_job(cluster, "sweep-ok", 1800)
    logs = _logs(cluster, "sweep-ok")
    assert status == "SUCCEEDED", logs[-4000:]
    # The job's log shows progress: trial lines, Tune's status table, the ranked results.
    assert logs.count(" iteration 2 ") == 2 and "Number of trials: 2/2 (2 TERMINATED)" in logs
    assert "trials ranked by rollout/success" in logs and "FINISHED: 2 trials" in logs
    client, parent, children = _runs(out)
    assert parent is not None and parent.info.status == "FINISHED"
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["sweep.param.filter.strategy"] for c in children} == {"top_p", "none"}
    assert {c.data.params["filter.strategy"] for c in children} == {"top_p", "none"}
    for child in children:
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "rollout/success")]
        assert sorted(steps) == [1, 2]
    rows = _results_csv(client, parent.info.run_id, tmp_path)
    assert sorted(r["run_id"] for r in rows) == sorted(c.info.run_id for c in children)


def test_ray_job_stop_then_resume_reruns_only_unfinished_trials(cluster, tmp_path):
    out = tmp_path / "out"
    args = (
        f"experiment.output_dir={out}",
        f"model.cache_dir={cluster['models']}",
        "rollout.max_reply_tokens=48",
    )
    _submit(cluster, "sweep-stop", *args)

    def one_finished_one_running():
        assert _status(cluster, "sweep-stop") in ("PENDING", "RUNNING"), _logs(
            cluster, "sweep-stop"
        )[-3000:]
        _, _, children = _runs(out)
        states = [c.info.status for c in children]
        return states.count("FINISHED") >= 1 and states.count("RUNNING") >= 1

    _wait(one_finished_one_running, 1800, "a finished and a running trial", every=2)
    _ray(cluster, "job", "stop", "sweep-stop", "--address", cluster["address"], timeout=300)
    assert _wait_for_job(cluster, "sweep-stop", 300) == "STOPPED"
    logs = _logs(cluster, "sweep-stop")

    # Clean end: the sweep's parent and the interrupted trials' runs are closed, and no
    # trial actor is left on the cluster.
    client, parent, children = _runs(out)
    assert parent.info.status == "KILLED", logs[-3000:]
    assert parent.data.tags["sweep.status"] == "interrupted"
    assert all(c.info.status in ("FINISHED", "KILLED") for c in children), (
        [(c.data.tags.get("sweep.trial_id"), c.info.status) for c in children],
        logs[-3000:],
    )
    finished = {
        c.data.tags["sweep.trial_id"]: c.info.run_id
        for c in children
        if c.info.status == "FINISHED"
    }
    assert 1 <= len(finished) < 4

    trial_actors = {"RolloutWorker", "Learner", "EnvPoolActor", "ImplicitFunc"}
    _wait(
        lambda: not trial_actors & set(_alive_actor_classes(cluster)),
        120,
        "the trial actors to end",
    )

    _submit(cluster, "sweep-resume", *args, "--resume")
    status = _wait_for_job(cluster, "sweep-resume", 1800)
    resumed_logs = _logs(cluster, "sweep-resume")
    assert status == "SUCCEEDED", resumed_logs[-4000:]
    client, parent_after, children = _runs(out)
    assert parent_after.info.run_id == parent.info.run_id  # the same MLflow parent run
    assert parent_after.info.status == "FINISHED"
    by_trial: dict[str, list] = {}
    for child in children:
        by_trial.setdefault(child.data.tags["sweep.trial_id"], []).append(child)
    assert len(by_trial) == 4
    for trial, runs in by_trial.items():
        assert [r.info.status for r in runs].count("FINISHED") == 1, trial
        if trial in finished:  # finished before the stop: never run again
            assert [r.info.run_id for r in runs] == [finished[trial]]
            assert f"trial {trial} started" not in resumed_logs
    rows = _results_csv(client, parent.info.run_id, tmp_path)
    assert len(rows) == 4 and all(r["status"] == "FINISHED" for r in rows)
