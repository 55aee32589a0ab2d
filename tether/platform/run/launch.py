"""A run's start and end, the steps ``Trainer.setup`` takes after the start-up path it
shares with a sweep (``preflight``: refusals that cost nothing, Ray, the policy): the
MLflow run, the actors the pool lends (rollout workers, learner) and this run's state on
the learner; and the MLflow run's last tags."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...actors.learner_group import LearnerGroup
from ...algos.update import UpdateSettings
from ..config import TetherConfig
from ..environment import environment_tags
from ..tracking.tracker import SPOOL_DIRNAME, Tracker
from .actor_pool import ActorPool, ActorRequest
from .events import Event
from .fleet import RolloutFleet, worker_request


def open_tracker(
    cfg: TetherConfig,
    output_dir: Path,
    emit: Callable[[str, dict], None],
    parent_run_id: str | None,
    run_tags: dict[str, str],
    resume_run_id: str | None,
) -> Tracker:
    """The run's MLflow run (the resumed one when ``resume_run_id``), its params and tags.
    Opened before the warm start, while the server is known to answer (``preflight``):
    MLflow names a run only as it creates it, so the run id every later write (spooled
    or not) and the checkpoints carry exists before any work starts."""
    tracker = Tracker(
        cfg.tracking_uri(),
        cfg.experiment.name,
        output_dir / "artifacts",
        run_name=cfg.experiment.run_name
        or f"{cfg.env.id.split('/')[-1]}-{cfg.algo.preset}-s{cfg.experiment.seed}",
        parent_run_id=parent_run_id,
        tags=run_tags,
        run_id=resume_run_id,
        settings=cfg.tracking,
        spool_root=output_dir / SPOOL_DIRNAME,
        notify=lambda message: emit(Event.TRACKING, {"message": message}),
        retention=cfg.retention,
    )
    if resume_run_id is None:
        # The run name is the run's name (and a tag), not a parameter: every sweep trial
        # has its own, which the UI's comparison views would offer as a varied param.
        tracker.log_params({k: v for k, v in cfg.flat().items() if k != "experiment.run_name"})
    tracker.set_tags({"tether.env": cfg.env.id, **environment_tags()})
    return tracker


def learner_request(cfg: TetherConfig, model_path: str) -> ActorRequest:
    """The learner group, keyed by all its constructor and resource options take, so a
    pool reuses a learner only where a new one would be equal."""
    a = cfg.algo
    args = {
        "use_critic": a.use_critic,
        "use_reference": a.kl_coef > 0,
        "threads": a.threads,
        "dtype": cfg.model.dtype,
        "world_size": a.learner_world_size,
        "num_cpus": a.num_cpus,
        "num_gpus": a.num_gpus,
        "lora": cfg.model.lora,
    }
    # A multi-rank FSDP group is not kept: its ranks' sharded modules and process
    # group would have to be re-initialised collectively, and a rank lost between
    # runs would hang the next run's first collective.
    return ActorRequest(
        "learner",
        (model_path, args),
        create=lambda: LearnerGroup.launch(model_path, **args),
        end=LearnerGroup.shutdown,
        reusable=a.learner_world_size == 1,
    )


def dtype_tags(learner, fleet: RolloutFleet, diagnostics_autocast: str) -> dict[str, str]:
    """What the run computed in: the parameters' dtype as the learner and each rollout
    worker loaded them (one name when all agree), the log-softmax's (float32), and the
    precision of the diagnostics' cross-scoring (``diagnostics.autocast`` as decided)."""
    used = {"learner": learner.dtype_effective()}
    for k, dtype in enumerate(fleet.dtypes()):
        used[f"rollout_worker{k}"] = dtype
    same = len(set(used.values())) == 1
    return {
        "model.dtype_effective": next(iter(used.values()))
        if same
        else ",".join(f"{k}={v}" for k, v in used.items()),
        "model.logprob_dtype": "float32",
        "diagnostics.autocast_effective": learner.diagnostics_precision(diagnostics_autocast),
    }


def checkout_actors(pool: ActorPool, cfg: TetherConfig, model_path: str, tracker: Tracker):
    """The rollout workers and the learner group from the pool (reused where equal to
    what this run asks for, else new); the ``tether.actors_reused`` tag says which."""
    workers, learner = pool.checkout(
        worker_request(cfg, model_path), learner_request(cfg, model_path)
    )
    reused = [kind for kind, again in pool.reused.items() if again]
    tracker.set_tags({"tether.actors_reused": ",".join(reused) or "none"})
    return workers, learner


def start_learner(learner, settings: UpdateSettings, cfg: TetherConfig) -> None:
    """The learner's run state: update settings in force, learning rates, seed."""
    a = cfg.algo
    learner.start_run(settings, lr=a.lr, critic_lr=a.critic_lr, seed=cfg.experiment.seed)


def close_tracker(tracker: Tracker, status: str, iterations_done: int, stop_reason) -> None:
    """The MLflow run's last tags (status, iterations done, why it stopped) and its end."""
    tracker.set_tags(
        {
            "tether.status": status,
            "tether.iterations_done": iterations_done,
            "tether.stop_reason": stop_reason or "completed"
            if status == "FINISHED"
            else status.lower(),
        }
    )
    tracker.finish(status)
