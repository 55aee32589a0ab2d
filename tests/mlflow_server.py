"""Test helper: a real ``mlflow server`` on 127.0.0.1 (SQLite backend, a free port) that a
test can kill and start again on the same port and store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    def __init__(self, root: Path) -> None:
        self.root, self.port = Path(root), free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.root.mkdir(parents=True, exist_ok=True)

    def start(self, timeout: float = 300.0) -> None:
        # a loaded 2-core machine has taken ~110 s between the server's start and its
        # first answer (its job executor and uvicorn start-up), so the wait is generous
        mlflow = Path(sys.executable).with_name("mlflow")
        self.process = subprocess.Popen(
            [
                str(mlflow),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
            ],
            stdout=open(self.root / "server.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # its own process group: kill() takes its workers too
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}"
                )
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=1)
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"mlflow server did not answer within {timeout} s")

    def kill(self) -> None:
        """SIGKILL the server and its workers (no goodbye: as a crash or a lost host)."""
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
