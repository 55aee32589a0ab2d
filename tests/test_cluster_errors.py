"""Bad cluster input fails at start with one clear line."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_address_says_so_before_ray_is_imported(tmp_path):
    """One line, and in seconds: the refusal comes from one refused connection before
    Ray is imported (``ray.init`` keeps retrying an unreachable GCS for minutes).  What
    ran is checked, not how long it took (a loaded machine stretches a stopwatch): a
    ``ray`` first on the path that notes its import and fails stands in for Ray."""
    port = _closed_port()
    stand_in, imported = tmp_path / "stand_in", tmp_path / "ray_imported"
    (stand_in / "ray").mkdir(parents=True)
    (stand_in / "ray" / "__init__.py").write_text(
        f"open({str(imported)!r}, 'w').close()\n"
        "raise ImportError('ray imported before the address was checked')\n"
    )
    pythonpath = os.pathsep.join(filter(None, [str(stand_in), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.platform.cli",
            "run",
            "experiments/quickstart.yaml",
            f"experiment.output_dir={tmp_path}",
            f"model.cache_dir={tmp_path / 'models'}",
            "--address",
            f"127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard, not the check
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "PYTHONPATH": pythonpath},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port} is unreachable" in lines[0] and "ray start --head" in lines[0]
    assert not imported.exists(), "ray was imported before the refusal"
    assert not (tmp_path / "models").exists()  # failed before the warm start


LOCAL_RAY_ADDRESSES = """
from tether.platform.session import prepare_process, start_ray, stop_ray
prepare_process(None)  # as the CLI does, before Ray is imported
import ray
started = start_ray(None, 1, 1)
print("NODE", ray.nodes()[0]["NodeManagerAddress"])
print("GCS", ray.get_runtime_context().gcs_address)
stop_ray(started)
"""


def test_local_ray_services_stay_on_loopback(tmp_path):
    """A local Ray started the way the CLI starts it advertises and binds 127.0.0.1,
    not the machine's outward address (Ray's default on Linux)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")
    }
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_RAY_ADDRESSES],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = dict(
        line.split(" ", 1)
        for line in done.stdout.splitlines()
        if line.startswith(("NODE ", "GCS "))
    )
    assert found["NODE"] == "127.0.0.1", done.stdout
    assert found["GCS"].startswith("127.0.0.1:"), done.stdout


def test_a_refused_run_waits_for_an_autoscaler_only_when_asked(ray_local, monkeypatch):
    """A cluster that cannot fit the run and has published no autoscaler node types (a
    local Ray has none): with a wait, the refusal comes after it; without, at once."""
    from tether.platform.session import (
        ClusterError,
        ResourceDemand,
        autoscaler_published,
        check_resources,
        wait_for_autoscaler,
    )

    assert not autoscaler_published()
    demand = [
        ResourceDemand(
            "rollout worker",
            "rollout.num_workers",
            1,
            "rollout.num_cpus_per_worker",
            1.0,
            "rollout.num_gpus_per_worker",
            1.0,
        )
    ]
    # What the wait does is recorded, not timed: the checks it runs and the sleeps it asks
    # for (real ones, on the real clock), so a loaded machine cannot fail it.
    from tether.platform import session

    checks, sleeps = [], []

    def sleep(seconds):
        sleeps.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(session, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))

    def check(demands):
        checks.append(demands)
        return check_resources(demands)

    with pytest.raises(
        ClusterError, match="asks for 1 GPU but no node of the cluster has more than 0"
    ):
        wait_for_autoscaler(lambda: check(demand), 0.0)
    assert len(checks) == 1 and sleeps == []  # at once
    checks.clear()
    started = time.monotonic()
    with pytest.raises(ClusterError):
        wait_for_autoscaler(lambda: check(demand), 3.0)
    assert len(checks) == 1 and sleeps and set(sleeps) == {1.0}  # polled until the end
    assert time.monotonic() - started >= 3.0  # the whole window (a lower bound)
    fits = [
        ResourceDemand(
            "learner", "algo.learner_world_size", 1, "algo.num_cpus", 0.5, "algo.num_gpus", 0.0
        )
    ]
    checks.clear()
    sleeps.clear()
    assert wait_for_autoscaler(lambda: check(fits), 30.0) is None  # fits: no wait
    assert len(checks) == 1 and sleeps == []
