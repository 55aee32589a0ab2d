"""A run's start and end.  ``setup_run``: what a run needs before its first iteration,
in the order it is checked and built: refusals that cost nothing (an unreachable
cluster, no sandbox), Ray, the policy (the warm start), the MLflow run, and the actors
the pool lends (rollout workers, learner).  ``end_run``: the MLflow run's last tags,
the actors back to the pool, Ray stopped if the run started it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..actors.learner_group import LearnerGroup
from ..agent.chat import ChatFormatter
from ..agent.pairs import SpanExtractor
from ..envs import runs_untrusted_code
from ..envs.sandbox import resolve_isolation
from ..policy.load import load_tokenizer, resolve_policy
from ..policy.lora import check_targets_for_path
from ..rollout.base import SamplingParams
from .actor_pool import ActorRequest
from .config import ConfigError, TetherConfig
from .environment import environment_tags
from .fleet import RolloutFleet, worker_request
from .session import check_ray_reachable, check_resources, start_ray, stop_ray, wait_for_autoscaler
from .tracking import SPOOL_DIRNAME, Tracker, default_tracking_uri

if TYPE_CHECKING:
    from .trainer import Trainer


def refuse_early(cfg: TetherConfig, output_dir: Path) -> None:
    """Fail in seconds, before the warm start: an unreachable cluster, an environment
    that runs untrusted code without a sandbox; then the output directory."""
    if cfg.ray.address:
        check_ray_reachable(cfg.ray.address)
    if runs_untrusted_code(cfg.env.id):  # refuse before anything starts (one line)
        resolve_isolation(cfg.sandbox.isolation)
    output_dir.mkdir(parents=True, exist_ok=True)


def resolve_model(cfg: TetherConfig, emit: Callable[[str, dict], None]) -> str:
    """The policy's path (warm-started and cached when the config asks for the tiny
    model), with a LoRA adapter's targets checked against it (before any actor)."""
    model_path = str(
        resolve_policy(
            cfg.model,
            cfg.env,
            cfg.experiment.seed,
            cfg.rollout.max_reply_tokens,
            isolation=cfg.sandbox.isolation,
            progress=lambda step, total, loss: emit(
                "warm_start", {"step": step, "total": total, "loss": loss}
            ),
        )
    )
    if cfg.model.lora is not None:
        try:
            check_targets_for_path(cfg.model.lora, model_path)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return model_path


def open_tracker(
    cfg: TetherConfig,
    output_dir: Path,
    model_path: str,
    emit: Callable[[str, dict], None],
    parent_run_id: str | None,
    run_tags: dict[str, str],
    resume_run_id: str | None,
) -> Tracker:
    """The run's MLflow run (the resumed one when ``resume_run_id``), its params and tags."""
    tracker = Tracker(
        cfg.tracking.uri or default_tracking_uri(output_dir),
        cfg.experiment.name,
        output_dir / "artifacts",
        run_name=cfg.experiment.run_name
        or f"{cfg.env.id.split('/')[-1]}-{cfg.algo.preset}-s{cfg.experiment.seed}",
        parent_run_id=parent_run_id,
        tags=run_tags,
        run_id=resume_run_id,
        settings=cfg.tracking,
        spool_root=output_dir / SPOOL_DIRNAME,
        notify=lambda message: emit("tracking", {"message": message}),
    )
    if resume_run_id is None:
        # The run name is the run's name (and a tag), not a parameter: every sweep trial
        # has its own, which the UI's comparison views would offer as a varied param.
        tracker.log_params({k: v for k, v in cfg.flat().items() if k != "experiment.run_name"})
    tracker.set_tags(
        {"tether.model_path": model_path, "tether.env": cfg.env.id, **environment_tags()}
    )
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


def dtype_tags(learner, fleet: RolloutFleet) -> dict[str, str]:
    """What the run computed in: the parameters' dtype as the learner and each rollout
    worker loaded them (one name when all agree), and the log-softmax's (float32)."""
    used = {"learner": learner.dtype_effective()}
    for k, dtype in enumerate(fleet.dtypes()):
        used[f"rollout_worker{k}"] = dtype
    same = len(set(used.values())) == 1
    return {
        "model.dtype_effective": next(iter(used.values()))
        if same
        else ",".join(f"{k}={v}" for k, v in used.items()),
        "model.logprob_dtype": "float32",
    }


def setup_run(trainer: Trainer) -> None:
    """Everything before iteration 1, cheapest refusal first: Ray (joined or started),
    the policy, the tokenizer, the MLflow run, the actors and this run's state on them."""
    cfg = trainer.cfg
    refuse_early(cfg, trainer.output_dir)
    demands = cfg.resource_demands()  # before the warm start: a run that can't fit fails now
    trainer.started_ray = start_ray(
        cfg.ray.address, cfg.ray.num_cpus, sum(d.count * d.cpus for d in demands)
    )
    # Joining an autoscaling cluster: its node types may not be published yet.
    wait_for_autoscaler(
        lambda: check_resources(demands), cfg.ray.autoscaler_wait_s if cfg.ray.address else 0.0
    )
    trainer.model_path = model_path = resolve_model(cfg, trainer.emit)
    trainer.tokenizer = load_tokenizer(model_path)
    trainer.spans = SpanExtractor(ChatFormatter(trainer.tokenizer))
    trainer.tracker = trainer.responder.tracker = open_tracker(
        cfg,
        trainer.output_dir,
        model_path,
        trainer.emit,
        trainer.parent_run_id,
        trainer.run_tags,
        trainer.resume_run_id,
    )
    pool = trainer.actor_pool
    trainer.fleet.workers, trainer.learner = pool.checkout(
        worker_request(cfg, model_path), learner_request(cfg, model_path)
    )
    reused = [kind for kind, again in pool.reused.items() if again]
    trainer.tracker.set_tags({"tether.actors_reused": ",".join(reused) or "none"})
    # This run's own state, on new and reused actors alike: nothing of an earlier run
    # (weights, optimiser, settings, seed, counters) carries over.
    start_learner(trainer)
    stops = trainer.fleet.start_run()
    trainer.sampling = SamplingParams(**{**trainer.sampling.__dict__, "stop_token_ids": stops})
    trainer.tracker.set_tags(dtype_tags(trainer.learner, trainer.fleet))


def start_learner(trainer: Trainer) -> None:
    """The learner's run state: update settings in force, learning rates, seed."""
    a = trainer.cfg.algo
    trainer.learner.start_run(
        trainer.responder.settings, lr=a.lr, critic_lr=a.critic_lr, seed=trainer.cfg.experiment.seed
    )


def end_run(trainer: Trainer, status: str) -> None:
    """Tag and end the MLflow run, hand the actors back to the pool (a keeping pool holds
    them for the next run if this one finished; otherwise they end, a worker's
    environment pool with it) and stop a Ray this run started."""
    if trainer.tracker is not None:
        stop_reason = trainer.responder.stop_reason
        trainer.tracker.set_tags(
            {
                "tether.status": status,
                "tether.iterations_done": trainer.iteration_done,
                "tether.stop_reason": stop_reason or "completed"
                if status == "FINISHED"
                else status.lower(),
            }
        )
        trainer.tracker.finish(status)
    trainer.actor_pool.checkin(healthy=status == "FINISHED")
    trainer.fleet.workers, trainer.learner = [], None
    stop_ray(trainer.started_ray)
