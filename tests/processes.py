"""Test helper: which of Tether's actor processes are still alive under this process."""

import os
import time
from pathlib import Path


def tether_actor_processes(timeout: float = 60.0) -> list[str]:
    """Titles of the live actor processes of Tether's kinds under this process (its local
    Ray): waits up to ``timeout`` seconds for them to be gone, then lists what is left."""
    kinds = ("ray::RolloutWorker", "ray::Learner", "ray::EnvPoolActor")
    deadline = time.time() + timeout
    while True:
        parents, titles = {}, {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if stat[0] != "Z":
                parents[int(pid)], titles[int(pid)] = int(stat[1]), title
        mine = {os.getpid()}
        for _ in range(8):
            mine |= {pid for pid, ppid in parents.items() if ppid in mine}
        alive = [titles[pid] for pid in mine if titles[pid].startswith(kinds)]
        if not alive or time.time() > deadline:
            return alive
        time.sleep(1)
