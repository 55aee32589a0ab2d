"""Bad cluster input fails at start with one clear line."""

import socket
import subprocess
import sys
import time
from pathlib import Path


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_address_says_so_within_30_seconds(tmp_path):
    port = _closed_port()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tether.platform.cli", "run", "experiments/quickstart.yaml",
         f"experiment.output_dir={tmp_path}", f"model.cache_dir={tmp_path / 'models'}",
         "--address", f"127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent)
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port} is unreachable" in lines[0] and "ray start --head" in lines[0]
    assert elapsed < 30, f"took {elapsed:.1f} s"
    assert not (tmp_path / "models").exists()  # failed before the warm start
