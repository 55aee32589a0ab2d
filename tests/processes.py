"""Test helpers: Tether's actor processes still alive under this process (its local Ray)."""

import os
import time
from pathlib import Path

KINDS = ("ray::RolloutWorker", "ray::Learner", "ray::EnvPoolActor")


def tether_actor_processes(timeout: float = 60.0) -> list[str]:
    """Titles of the live actor processes of Tether's kinds under this process: waits up
    to ``timeout`` seconds for them to be gone, then lists what is left."""
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
        alive = [titles[pid] for pid in mine if titles[pid].startswith(KINDS)]
        if not alive or time.time() > deadline:
            return alive
        time.sleep(1)


def assert_actor_processes_ended(timeout: float = 60.0) -> None:
    """No rollout worker, environment pool or learner process is left under this process
    (within ``timeout`` seconds): whatever ended the run ended its actors too."""
    left = tether_actor_processes(timeout)
    assert left == [], f"actor processes still alive after {timeout:g} s: {left}"


def group_processes(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, _ppid, pgrp = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state != "Z":
            found.append(int(pid))
    return found


def wait_for_group_to_end(pgid: int, timeout: float) -> list[int]:
    """Poll until process group ``pgid`` has no live process or ``timeout`` seconds
    passed; what is left (empty: the group ended)."""
    deadline = time.monotonic() + timeout
    while (left := group_processes(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
