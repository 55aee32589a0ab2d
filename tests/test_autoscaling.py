"""Autoscaling on Ray's fake multi-node provider: a Tether run that asks for more
rollout workers than the head can hold makes the autoscaler add (fake) GPU worker
nodes, and the run completes on them.

The cluster is this test's own: ``ray start --head`` on a free port with its own temp
dir and ``RAY_FAKE_CLUSTER=1``; fake nodes are raylets the autoscaler's monitor
starts on this machine.  It is torn down by killing exactly the processes of that
temp dir (never ``ray stop``, which would stop every Ray on the machine).

The delayed variant holds the autoscaler's monitor back (a ``sitecustomize`` on the
head's ``PYTHONPATH`` sleeps in the monitor process only) so that the run is submitted
to a cluster whose autoscaler has not started yet: the state in which the capacity check
used to refuse a run it should have scaled for.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import micro_config_dict

WORKERS, MAX_GPU_NODES = 2, 3
MONITOR_DELAY_S = 30  # the delayed variant: the autoscaler starts this long after the head

DELAY_MONITOR = """
import os, sys, time
script = (getattr(sys, "argv", None) or [""])[0]
if script.endswith("monitor.py") and os.sep + "autoscaler" + os.sep in script:
    time.sleep(float(os.environ["TETHER_TEST_MONITOR_DELAY_S"]))
    with open(os.environ["TETHER_TEST_MONITOR_STARTED"], "w") as f:
        f.write(repr(time.time()))
"""

POLL_NODES = """
import json, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
peak = 0
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    gpu = sum(n["Resources"].get("GPU", 0) for n in alive)
    peak = max(peak, len(alive))
    print(json.dumps({"nodes": len(alive), "gpus": gpu, "peak": peak}), flush=True)
    time.sleep(1)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_cluster_config(gcs_address: str) -> dict:
    """The autoscaler config of the fake provider: a CPU-only head and a GPU worker type."""
    return {
        "cluster_name": "tether-fake",
        "max_workers": MAX_GPU_NODES,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs_address,
        },
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            "gpu_worker": {
                "resources": {"CPU": 1, "GPU": 1},
                "node_config": {},
                "min_workers": 0,
                "max_workers": MAX_GPU_NODES,
            },
        },
        "head_node_type": "ray.head.default",
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        "docker": {},
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
    }


def _cluster_pids(temp_dir: str) -> list[int]:
    """The cluster's processes (their arguments name its temp dir) and their descendants
    (workers, whose titles are ``ray::...``)."""
    ps = subprocess.run(
        ["ps", "-ww", "-eo", "pid=,ppid=,args="],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "100000"},
    ).stdout
    rows = [line.split(None, 2) for line in ps.splitlines()]
    parent = {int(r[0]): int(r[1]) for r in rows}
    roots = {int(r[0]) for r in rows if len(r) == 3 and temp_dir in r[2]} - {os.getpid()}

    def under_root(pid: int) -> bool:
        while pid > 1:
            if pid in roots:
                return True
            pid = parent.get(pid, 1)
        return False

    return sorted(pid for pid in parent if under_root(pid))


def _kill_cluster(temp_dir: str) -> None:
    for _ in range(3):  # the monitor may start a node while we kill: sweep again
        for pid in _cluster_pids(temp_dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1)


@pytest.fixture
def fake_cluster(request):
    """(address, env) of a fresh fake-autoscaling Ray cluster; killed by PID afterwards.
    Parametrised indirectly with a delay (seconds) before its autoscaler starts."""
    delay = getattr(request, "param", 0)
    temp_dir = tempfile.mkdtemp(prefix="tfas")  # short: Ray's socket paths have a length limit
    port = _free_port()
    address = f"127.0.0.1:{port}"
    config = Path(temp_dir) / "autoscaler.json"
    config.write_text(json.dumps(fake_cluster_config(address)))
    env = {
        **os.environ,
        "RAY_FAKE_CLUSTER": "1",
        "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    if delay:
        hooks = Path(temp_dir) / "hooks"
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(DELAY_MONITOR)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hooks), env.get("PYTHONPATH")]))
        env["TETHER_TEST_MONITOR_DELAY_S"] = str(delay)
        env["TETHER_TEST_MONITOR_STARTED"] = str(Path(temp_dir) / "monitor_started")
    ray_cli = str(Path(sys.executable).with_name("ray"))  # this venv's Ray
    try:
        for _ in range(2):  # a free port can be taken by another Ray in between
            # Every fixed default port of a head moved to a free one: other Rays run here.
            ports = [
                f"--{name}={_free_port()}"
                for name in (
                    "dashboard-port",
                    "ray-client-server-port",
                    "dashboard-agent-listen-port",
                    "dashboard-agent-grpc-port",
                    "metrics-export-port",
                    "runtime-env-agent-port",
                )
            ]
            started = subprocess.run(
                [
                    ray_cli,
                    "start",
                    "--head",
                    f"--port={port}",
                    *ports,
                    "--node-ip-address=127.0.0.1",
                    f"--temp-dir={temp_dir}",
                    "--num-cpus=1",
                    "--num-gpus=0",
                    f"--autoscaling-config={config}",
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            if started.returncode == 0:
                break
            _kill_cluster(temp_dir)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield address, env
    finally:
        _kill_cluster(temp_dir)
        assert not _cluster_pids(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fake_cluster", [0, MONITOR_DELAY_S], ids=["autoscaler-up", "autoscaler-late"], indirect=True
)
def test_run_needing_more_workers_than_the_head_scales_out(
    fake_cluster, micro_policy, models_dir, tmp_path
):
    address, env = fake_cluster
    # Each rollout worker needs a GPU; the head has none, so every worker needs a new node.
    cfg = micro_config_dict(
        tmp_path,
        rollout={"num_workers": WORKERS, "num_gpus_per_worker": 1, "num_cpus_per_worker": 1},
        algo={"preset": "grpo", "kl_coef": 0.0, "num_cpus": 1, "micro_batch_size": 8},
        trainer={"iterations": 1, "val_every": 1, "val_episodes": 2, "samples_per_log": 0},
        diagnostics={"enabled": False},
        tracking={"log_model": False},
        model={"cache_dir": str(models_dir)},
    )
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(cfg))
    poller = subprocess.Popen(
        [sys.executable, "-c", POLL_NODES, address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    marker = env.get("TETHER_TEST_MONITOR_STARTED")
    if marker:  # control: without waiting for the autoscaler, the run is refused
        refused = subprocess.run(
            [
                sys.executable,
                "-m",
                "tether.platform.cli",
                "run",
                str(spec),
                "--address",
                address,
                "ray.autoscaler_wait_s=0",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if not Path(marker).exists():  # (only meaningful while the autoscaler is still down)
            assert refused.returncode != 0
            assert "can provide at most" in refused.stdout + refused.stderr
    submitted = time.time()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tether.platform.cli",
                "run",
                str(spec),
                "--address",
                address,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        poller.send_signal(signal.SIGKILL)
        samples = [
            json.loads(line)
            for line in poller.communicate()[0].splitlines()
            if line.startswith("{")
        ]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if marker:  # the run was submitted before the autoscaler ran
        started = float(Path(marker).read_text())
        assert submitted < started, "the autoscaler was up before the run was submitted"
        print(f"autoscaler started {started - submitted:.0f} s after the run was submitted")
    peak = max(s["peak"] for s in samples)
    peak_gpus = max(s["gpus"] for s in samples)
    print(
        f"fake autoscaling: started with {samples[0]['nodes']} node(s), reached {peak} "
        f"nodes ({peak_gpus:.0f} fake GPUs) for {WORKERS} GPU rollout workers"
    )
    assert samples[0]["nodes"] == 1  # the head alone
    assert WORKERS + 1 <= peak <= MAX_GPU_NODES + 1
    assert peak_gpus >= WORKERS
    run_id = done.stdout.split("MLflow run id:")[1].split()[0]
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    batch = cfg["rollout"]["groups"] * cfg["rollout"]["group_size"]
    assert [m.value for m in client.get_metric_history(run_id, "rollout/trajectories")] == [batch]
