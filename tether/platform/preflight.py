"""One start-up path for ``tether run`` and ``tether sweep``: the checks and steps both
take before their first training iteration, cheapest refusal first.

1. ``start_up(address)``: once the config is read and before Ray or transformers load:
   transformers within Tether's range, the cluster this process will join answers, and
   the process environment (quiet libraries, local Ray on 127.0.0.1, the Ray token).
2. ``refuse_early(cfg, address)``: before Ray starts: the cluster and the tracking
   server answer, and an environment that runs model-written code has its sandbox.
3. ``connect(cfg, address)``: join the cluster or start a local Ray big enough for the
   run's actors (``TetherConfig.actor_resources``, the one resource formula).
4. ``wait_until_fits(check, cfg, joined)``: the run (or one sweep trial) fits the
   cluster, waiting for an autoscaler's node types when this process joined one.
5. ``resolve_model(cfg, progress)``: the policy, warm-started and cached when the config
   asks for the tiny model, with a LoRA adapter's targets checked against it.

``Trainer.setup`` takes steps 2-5 for a run; ``run_sweep`` takes them once for all its
trials (each trial then finds Ray running and the warm start cached).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .config import ConfigError, TetherConfig
from .environment import check_installed
from .session import check_ray_reachable, prepare_process, start_ray, wait_for_autoscaler

#: ``progress(step, total, loss)`` of the warm start.
Progress = Callable[[int, int, float], None]


def check_dependencies() -> None:
    """DependencyError (one line) when transformers is outside Tether's declared range:
    an older one would fail mid-run inside an actor."""
    check_installed("transformers")


def start_up(address: str | None) -> None:
    """Once the config is read, before Ray or transformers are imported: transformers in
    range, the cluster at ``address`` (the one this process will join; None: a local Ray)
    answers within seconds, and this process's environment is set."""
    check_dependencies()
    if address:
        check_ray_reachable(address)
    prepare_process(address)


def refuse_early(cfg: TetherConfig, address: str | None) -> None:
    """Fail in seconds, before Ray starts or the warm start runs: an unreachable cluster
    at ``address`` or tracking server, an environment that runs untrusted code without a
    sandbox.  (Once this has passed, a tracking server that goes away spools the writes.)"""
    from ..envs import runs_untrusted_code
    from ..envs.sandbox import resolve_isolation
    from ..store import check_tracking_reachable

    if address:
        check_ray_reachable(address)
    check_tracking_reachable(cfg.tracking_uri())
    if runs_untrusted_code(cfg.env.id):  # refuse before anything starts (one line)
        resolve_isolation(cfg.sandbox.isolation)


def connect(cfg: TetherConfig, address: str | None, actors: TetherConfig | None = None) -> bool:
    """Join the cluster at ``address`` or start a local Ray with CPUs enough for the
    actors of ``actors`` (default ``cfg``; a sweep passes none: its trials ask Tune);
    True when this call started Ray (not when Ray was already initialised)."""
    required = actors.actor_resources()["CPU"] if actors is not None else 0
    return start_ray(
        address,
        cfg.ray.num_cpus,
        required,
        cfg.ray.task_events_in_gcs,
        cfg.ray.malloc_mmap_threshold,
    )


def wait_until_fits(
    check: Callable[[], Any], cfg: TetherConfig, joined: bool, refusals: tuple = ()
) -> None:
    """``check()`` that the run fits the cluster (it raises ClusterError or one of
    ``refusals`` when not); on a cluster this process joined, wait up to
    ``ray.autoscaler_wait_s`` for its autoscaler to say how far it can grow."""
    wait_for_autoscaler(check, cfg.ray.autoscaler_wait_s if joined else 0.0, refusals)


def resolve_model(cfg: TetherConfig, progress: Progress | None = None) -> str:
    """The policy's path (warm-started and cached when the config asks for the tiny
    model), with a LoRA adapter's targets checked against it (before any actor)."""
    from ..policy.load import resolve_policy
    from ..policy.lora import check_targets_for_path

    model_path = str(
        resolve_policy(
            cfg.model,
            cfg.env,
            cfg.experiment.seed,
            cfg.rollout.max_reply_tokens,
            isolation=cfg.sandbox.isolation,
            progress=progress,
        )
    )
    if cfg.model.lora is not None:
        try:
            check_targets_for_path(cfg.model.lora, model_path)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return model_path
