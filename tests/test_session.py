"""A local Ray started by Tether says its auth mode explicitly: no token-auth warning."""

import os
import subprocess
import sys

import pytest


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python process with ``env``; it must exit 0."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_local_ray_prints_no_auth_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    env["HOME"] = str(tmp_path)  # a fresh machine: no ~/.ray/auth_token yet
    code = (
        "from tether.platform.session import start_ray, stop_ray\n"
        "started = start_ray(None, 1, 1)\n"
        "import ray; print('auth', ray.cluster_resources().get('CPU'))\n"
        "stop_ray(started)\n"
    )
    out = _run(code, env)
    assert "auth 1.0" in out.stdout
    assert "Token authentication" not in out.stderr + out.stdout
    assert "WARNING" not in out.stderr, out.stderr[-2000:]


@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_local_ray_gcs_keeps_capped_task_events(tmp_path):
    """``ray.task_events_in_gcs`` reaches the GCS server a run starts (its environment)
    and bounds what it keeps: 40 actor calls, at most 5 task attempts' events held."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_task_events_max_num_task_in_gcs"}
    code = (
        "import os, time, psutil, ray\n"
        "from tether.platform import preflight\n"
        "from tether.platform.config import build_config\n"
        "from tether.platform.session import prepare_process, stop_ray\n"
        "prepare_process(None)\n"
        "cfg = build_config({}, ['ray.num_cpus=1', 'ray.task_events_in_gcs=5'])\n"
        "started = preflight.connect(cfg, None)\n"
        "gcs = [p for p in psutil.Process().children(recursive=True)\n"
        "       if os.path.basename(p.cmdline()[0]) == 'gcs_server']\n"
        "print('gcs env', gcs[0].environ().get('RAY_task_events_max_num_task_in_gcs'))\n"
        "@ray.remote(num_cpus=0)\n"
        "class Echo:\n"
        "    def step(self, x):\n"
        "        return x\n"
        "actor = Echo.remote()\n"
        "ray.get([actor.step.remote(i) for i in range(40)])\n"
        "from ray._private.state import state\n"
        "held, deadline = [], time.monotonic() + 60\n"
        "# Callers report every second: poll until the count has held for 3 s (or 60 s).\n"
        "while time.monotonic() < deadline and not (\n"
        "    len(held) >= 6 and held[-1] > 0 and len(set(held[-6:])) == 1\n"
        "):\n"
        "    time.sleep(0.5)\n"
        "    held.append(len(state._get_all_task_events()))\n"
        "print('held', max(held))\n"
        "stop_ray(started)\n"
    )
    out = _run(code, env)
    assert "gcs env 5" in out.stdout, out.stdout
    held = int(out.stdout.split("held ")[1].split()[0])
    assert 0 < held <= 5, out.stdout


def test_actors_start_with_the_mmap_threshold_in_their_environment(tmp_path):
    """``ray.malloc_mmap_threshold`` is in each worker's environment from its start (glibc
    reads it once, at start-up: ``/proc/<pid>/environ`` is the environment the process
    was started with, not a later ``os.environ`` change)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    code = (
        "import os, ray\n"
        "from tether.platform.session import start_ray, stop_ray\n"
        "started = start_ray(None, 1, 1, malloc_mmap_threshold=65536)\n"
        "@ray.remote\n"
        "class Probe:\n"
        "    def initial(self):\n"
        "        raw = open(f'/proc/{os.getpid()}/environ', 'rb').read().split(b'\\0')\n"
        "        return [e.decode() for e in raw if e.startswith(b'MALLOC_MMAP')]\n"
        "print('initial', ray.get(Probe.remote().initial.remote()))\n"
        "stop_ray(started)\n"
    )
    out = _run(code, env)
    assert "initial ['MALLOC_MMAP_THRESHOLD_=65536']" in out.stdout, out.stdout[-2000:]
