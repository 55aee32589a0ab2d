"""A local Ray started by Tether says its auth mode explicitly: no token-auth warning."""

import os
import subprocess
import sys


def test_local_ray_prints_no_auth_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    env["HOME"] = str(tmp_path)  # a fresh machine: no ~/.ray/auth_token yet
    code = (
        "from tether.platform.session import start_ray, stop_ray\n"
        "started = start_ray(None, 1, 1)\n"
        "import ray; print('auth', ray.cluster_resources().get('CPU'))\n"
        "stop_ray(started)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "auth 1.0" in out.stdout
    assert "Token authentication" not in out.stderr + out.stdout
    assert "WARNING" not in out.stderr, out.stderr[-2000:]
