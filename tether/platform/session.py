"""Starting (or joining) Ray, with local services on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Keeps library progress bars and chatter out of the console and the job logs.
log = logging.getLogger(__name__)

QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "PYTHONWARNINGS": "ignore::UserWarning",
}


def prepare_process(address: str | None) -> None:
    """Environment for this process; call before Ray or transformers are imported.

    Quiets library chatter and, when joining a cluster, sends the local Ray token:
    Ray >= 2.59 starts clusters with token auth on while a client stays in mode
    "disabled" unless RAY_AUTH_MODE says otherwise (read once, at import).
    """
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not address:
        keep_local_ray_on_loopback()
    if address and "RAY_AUTH_MODE" not in os.environ and TOKEN_FILE.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


def keep_local_ray_on_loopback() -> None:
    """Make a local Ray started by this process bind its services to 127.0.0.1.

    On Linux Ray replaces ``_node_ip_address="127.0.0.1"`` by the machine's outward
    address (``resolve_ip_for_localhost``) unless multi-node clustering is off, as it is
    by default on macOS; the switch is read once, when Ray is imported.  Only for a
    local instance: a driver joining a cluster must advertise a reachable address.
    """
    if "RAY_ADDRESS" not in os.environ:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


TOKEN_FILE = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))


class ClusterError(RuntimeError):
    """Ray cannot be started or reached (the message says what to do)."""


def check_ray_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail in seconds, with one line, when nothing listens at a ``host:port`` Ray address.

    ``ray.init`` itself keeps retrying an unreachable GCS for minutes."""
    target = address.removeprefix("ray://")
    if address == "auto" or ":" not in target:
        return  # "auto" reads the local cluster file; Ray reports that case itself
    host, _, port = target.rpartition(":")
    try:
        port_number = int(port.split("/")[0])
    except ValueError:
        raise ClusterError(f"Ray address {address!r} is not host:port") from None
    try:
        with socket.create_connection((host.strip("[]"), port_number), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ClusterError(
            f"the Ray cluster at {address} is unreachable ({reason}); start it "
            f"with `ray start --head`, check ray.address / --address, or drop "
            f"it to start a local Ray"
        ) from None


def start_ray(
    address: str | None,
    num_cpus: int | None,
    required_cpus: float,
    task_events_in_gcs: int | None = None,
    malloc_mmap_threshold: int | None = None,
) -> bool:
    """Join ``address`` or start a fresh local Ray; return True if this call started it.

    ``address="local"`` always starts a new local instance, so a stale
    ``ray_current_cluster`` file from an earlier ``ray stop`` is never joined.
    ``task_events_in_gcs`` caps the task events a local Ray's GCS keeps
    (``cap_gcs_task_events``); a cluster joined keeps its own setting.
    ``malloc_mmap_threshold`` goes into the workers' environment as glibc's
    ``MALLOC_MMAP_THRESHOLD_`` (read when each worker process starts), here and on a
    cluster joined alike.
    """
    import ray

    if ray.is_initialized():
        return False
    runtime_env = {
        "env_vars": {
            "TOKENIZERS_PARALLELISM": "false",
            **QUIET_ENV,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
    }
    if malloc_mmap_threshold is not None:
        runtime_env["env_vars"]["MALLOC_MMAP_THRESHOLD_"] = str(malloc_mmap_threshold)
    if address:
        check_ray_reachable(address)
    try:
        if address:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        else:
            explicit_local_auth_mode()
            cap_gcs_task_events(task_events_in_gcs)
            cpus = num_cpus or max(os.cpu_count() or 1, int(-(-required_cpus // 1)))
            ray.init(
                address="local",
                num_cpus=cpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                runtime_env=runtime_env,
                log_to_driver=bool(os.environ.get("TETHER_RAY_LOGS")),
            )
    except Exception as exc:  # Ray raises several types (ConnectionError, RuntimeError, ...)
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise ClusterError(f"could not start or join {where}: {exc}".splitlines()[0]) from None
    interrupt_on_sigterm()
    return True


#: Ray's settings (``ray_config_def.h``), read from the environment by every Ray process
#: when it starts, the GCS server included: the task attempts whose events the GCS keeps,
#: and the evicted attempts it remembers (per job) so that their late events stay out.
TASK_EVENTS_ENV = (
    "RAY_task_events_max_num_task_in_gcs",
    "RAY_task_events_max_dropped_task_attempts_tracked_per_job_in_gcs",
)


def cap_gcs_task_events(cap: int | None) -> None:
    """Make the GCS server of a local Ray started after this keep the status events of at
    most ``cap`` task attempts, and remember at most ``cap`` evicted ones per job (Ray's
    defaults: 100000 and 1000000).

    Every actor method call is a task whose events its caller reports to the GCS, which
    keeps them in memory (for ``ray.timeline`` and the state API) until the first cap,
    then evicts the oldest finished ones and remembers each evicted attempt until the
    second: at Ray's defaults the GCS server grows by about 3 kB per call for 100000 calls
    (to ~350 MB), then more slowly for a million more (measured:
    ``benchmarks/gcs_task_events.py``).  Set in this process's environment, which
    ``ray.init`` passes to the GCS server it spawns (Ray reads ``RAY_<setting>`` when a
    process starts).  None leaves the environment as it is (these variables there, or
    Ray's defaults)."""
    if cap is not None:
        for name in TASK_EVENTS_ENV:
            os.environ[name] = str(cap)


def explicit_local_auth_mode() -> None:
    """Ray >= 2.59 turns token authentication on for a new local cluster, and warns that
    it did so, whenever RAY_AUTH_MODE is unset.  Say it explicitly (the same security, no
    warning): set the variable and refresh Ray's cached config, as Ray itself does when it
    turns the mode on (``authentication_token_setup._enable_token_auth``).  A user's own
    RAY_AUTH_MODE wins; a Ray without token auth is left alone."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._raylet import Config
    except ImportError:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    Config.initialize("")


def interrupt_on_sigterm() -> None:
    """Make SIGTERM (``kill``, a scheduler's preemption) end the process like Ctrl-C.

    ``ray.init`` installs a handler that dumps a stack and aborts on SIGTERM, which
    leaves the MLflow run RUNNING and the local Ray's processes behind; raising
    KeyboardInterrupt instead runs the same clean-up as Ctrl-C (run marked KILLED,
    actors ended, Ray stopped).  Installed after ``ray.init``, in the main thread only.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def stop_ray(started: bool) -> None:
    import ray

    if started and ray.is_initialized():
        ray.shutdown()


@dataclass(frozen=True)
class ResourceDemand:
    """``count`` actors (config field ``count_field``) of ``cpus``/``gpus`` each."""

    name: str
    count_field: str
    count: int
    cpus_field: str
    cpus: float
    gpus_field: str
    gpus: float


def autoscaler_published() -> bool:
    """Whether the cluster's autoscaler has published its node types (Ray private API)."""
    try:
        from ray._private.state import state

        return state.get_cluster_config() is not None
    except Exception:
        return False


def autoscaling_cluster() -> bool:
    """Whether an autoscaler with node types of its own (``ray up``'s, KubeRay's) runs the
    cluster.  Its status report (GCS key ``__autoscaling_status``, what ``ray status``
    shows) names the configured types; a fixed cluster's read-only monitor names one
    type per node, ``node_<id>``."""
    if autoscaler_published():
        return True
    try:
        from ray.experimental.internal_kv import _internal_kv_get

        status = json.loads(_internal_kv_get("__autoscaling_status") or b"{}")
    except Exception:
        return False
    report = status.get("autoscaler_report") or {}
    types = set(report.get("active_nodes") or {}) | set(
        (report.get("node_type_mapping") or {}).values()
    )
    return any(not str(t).startswith("node_") for t in types)


def wait_for_autoscaler(check: Callable[[], Any], wait_s: float, refusals: tuple = ()) -> Any:
    """``check()`` (a capacity check that raises ClusterError or one of ``refusals`` when
    the cluster cannot fit the run).  On a refusal from a cluster that may autoscale
    (``wait_s`` > 0: one this process joined), wait up to ``wait_s`` for its autoscaler:
    once it has published its node types, check again against what they can grow to; if
    it runs but publishes none (Ray's v1 autoscaler does not), the capacity is unknown and
    the run goes ahead (Ray scales for it, or leaves its actors pending), with a warning."""
    try:
        return check()
    except (ClusterError, *refusals) as refusal:
        if wait_s <= 0 or autoscaler_published():
            raise
        deadline = time.monotonic() + wait_s
        while not autoscaler_published():
            if autoscaling_cluster():
                log.warning(
                    "%s; but the cluster autoscales and its autoscaler does not say how "
                    "far: going ahead, Ray will add nodes for the run (or leave its "
                    "actors pending if none of its node types fits)",
                    refusal,
                )
                return None
            if time.monotonic() >= deadline:
                raise
            time.sleep(1.0)
    return check()


def cluster_capacity() -> tuple[dict[str, float], dict[str, float]]:
    """(total, largest single node) of CPU and GPU the cluster can ever have: the live
    nodes, or, on an autoscaling cluster, what its node types can grow to."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    total = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
    largest = {k: max((n.get(k, 0.0) for n in nodes), default=0.0) for k in ("CPU", "GPU")}
    try:  # the autoscaler's node types (Ray private API; absent on a fixed cluster)
        from ray._private.state import state

        config = state.get_cluster_config()
        grown = state.get_max_resources_from_cluster_config() or {}
    except Exception:
        config, grown = None, {}
    for group in getattr(config, "node_group_configs", None) or ():
        if group.max_count != 0:
            for k in largest:
                largest[k] = max(largest[k], float(group.resources.get(k, 0)))
    for k in total:
        total[k] = max(total[k], float(grown.get(k, 0)))
    return total, largest


def check_resources(demands: list[ResourceDemand]) -> None:
    """Fail at start, in one line, when the config asks for CPUs or GPUs the cluster can
    never provide (Ray would otherwise leave the actors pending forever)."""
    total, largest = cluster_capacity()
    for resource, key in (("cpus", "CPU"), ("gpus", "GPU")):
        for d in demands:
            each, field = getattr(d, resource), getattr(d, f"{resource}_field")
            if each > largest[key]:
                raise ClusterError(
                    f"{field} = {each:g}: each {d.name} asks for {each:g} {key} but no node of "
                    f"the cluster has more than {largest[key]:g}; lower it or add bigger nodes"
                )
        asked = sum(d.count * getattr(d, resource) for d in demands)
        if asked > total[key]:
            parts = " + ".join(
                f"{d.count_field} {d.count} x {getattr(d, f'{resource}_field')} "
                f"{getattr(d, resource):g}"
                for d in demands
                if getattr(d, resource)
            )
            raise ClusterError(
                f"the config asks for {asked:g} {key} ({parts}) but the cluster "
                f"can provide at most {total[key]:g}; lower them or use a bigger "
                f"cluster (ray.address)"
            )
