"""The single-controller driver: one iteration reads top to bottom.

    collect -> filter -> [dynamic sampling] -> diagnose -> prepare (old/ref log-probs)
            -> advantages -> [gradient SNR] -> update -> sync weights
            -> validate, log, alarms, checkpoint

The Trainer conducts; its parts hold the state: the ``RolloutFleet`` (workers,
collection, weight sync), the ``RolloutPipeline`` (batches collected ahead), the learner
group, ``Diagnosis`` (MI running averages), the ``AlarmResponder`` (alarms, act-mode
knobs, grounded checkpoints), the ``LevelSampler``.  ``RunState`` is what a checkpoint
keeps of them; ``recovery`` handles a dead learner and a checkpoint that cannot be
written; ``cadence.due`` decides every "every N iterations".  Every computation is a
call into the pure core (``tether.agent``, ``tether.algos``) or an actor.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ... import seeds
from ...actors.learner_group import LearnerDied, LearnerGroup
from ...actors.memory import release_free_memory
from ...agent.chat import ChatFormatter
from ...agent.metrics import rollout_metrics
from ...agent.pairs import SpanExtractor
from ...algos.batch import collate
from ...policy.load import load_tokenizer
from ...rollout.base import SamplingParams
from .. import preflight
from ..config import TetherConfig
from ..session import check_resources, stop_ray
from .actor_pool import ActorPool
from .alarm_responder import AlarmResponder
from .cadence import due
from .checkpoint import CheckpointError, checkpoint_path, load_checkpoint, save_checkpoint
from .diagnosis import Diagnosis
from .events import Event, log_warnings
from .fleet import RolloutFleet
from .launch import (
    checkout_actors,
    close_tracker,
    dtype_tags,
    learner_request,
    open_tracker,
    start_learner,
)
from .pipeline import RolloutPipeline
from .recovery import LearnerRecovery, checkpoint_failed, record_resume
from .run_state import RunState
from .stages import (
    RESAMPLE_GROUP_IDS,
    VALIDATION_METRICS,
    LevelSampler,
    Timers,
    advantages,
    dynamic_sampling,
    filter_groups,
    log_iteration,
    memory_metrics,
    validation_episodes,
)


@dataclass
class RunSummary:
    run_id: str
    tracking_uri: str
    ui_command: str
    iterations: int
    status: str
    seconds: float
    model_path: str
    val_history: dict[int, float] = field(default_factory=dict)
    stop_reason: str | None = None
    alarms: list[dict] = field(default_factory=list)
    last_metrics: dict[str, float] = field(default_factory=dict)
    #: validation step -> (low, high) of val/success (95 % Wilson interval)
    val_intervals: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: the metrics of the last iteration that ran the collapse diagnostics
    last_diagnostics: dict[str, float] = field(default_factory=dict)


class Trainer:
    def __init__(
        self,
        cfg: TetherConfig,
        on_event: Callable[[str, dict], None] | None = None,
        parent_run_id: str | None = None,
        run_tags: dict[str, str] | None = None,
        resume_from: Path | None = None,
        resume_run_id: str | None = None,
        actor_pool: ActorPool | None = None,
    ):
        """``on_event(kind, data)`` receives the run's events (``events.Event``: the warm
        start's steps, "started", each iteration's metrics, alarms, actions, failures, the
        tracking spool's one-line messages); a sweep
        passes ``parent_run_id`` (the MLflow run is nested under it), ``run_tags`` and a
        keeping ``actor_pool`` (its trial process's: the next trial reuses the actors).
        Without one, the run's actors end with the run."""
        preflight.check_dependencies()  # before any actor: an older one fails mid-run
        self.cfg = cfg
        self.actor_pool = actor_pool or ActorPool(keep=False)
        self.parent_run_id, self.run_tags = parent_run_id, dict(run_tags or {})
        #: A checkpoint to continue from, and the MLflow run it belongs to (same run, same steps).
        self.resume_from, self.resume_run_id = resume_from, resume_run_id
        self.emit = on_event or log_warnings
        self.output_dir = Path(cfg.experiment.output_dir).expanduser().resolve()
        self.sampler = LevelSampler(cfg.experiment.seed, cfg.env.val_seed_offset)
        self.sampling = SamplingParams(
            max_new_tokens=cfg.rollout.max_reply_tokens,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
        )
        self.fleet = RolloutFleet(cfg.rollout, self.emit)
        self.pipeline = RolloutPipeline(self.fleet, self.sampler, cfg)
        self.responder = AlarmResponder(cfg, self.emit)
        self.diagnosis = Diagnosis(  # the probe set: one turn per level, the current policy
            cfg.diagnostics, cfg.experiment.seed, cfg.env, self.collect_probe
        )
        self.recovery = LearnerRecovery(cfg.trainer, self.emit)
        # Built by setup(): Ray, the policy, the MLflow run, the learner.
        self.started_ray = False
        self.model_path: str | None = None
        self.tokenizer, self.spans, self.learner = None, None, None
        self.tracker = None
        self.iteration_done = 0
        #: the last iteration whose metrics the run holds: a learner rebuilt in place and a
        #: resumed run re-run the iterations after their checkpoint, logged once all the same
        self.logged_through = 0
        self.start_state: RunState | None = None  # the driver's parts before iteration 1
        self.val_history: dict[int, float] = {}
        self.val_intervals: dict[int, tuple[float, float]] = {}
        self.last_metrics: dict[str, float] = {}
        self.last_diagnostics: dict[str, float] = {}
        self.last_collected: list = []

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> RunSummary:
        started = time.perf_counter()
        status = "FAILED"
        try:
            self.setup()
            first = self.restore(self.resume_from) + 1 if self.resume_from else 1
            self.emit(
                Event.STARTED,
                {
                    "run_id": self.tracker.run_id,
                    "model_path": self.model_path,
                    "first_iteration": first,
                },
            )
            if first == 1:
                self.log_validation(0, {})
                self.emit(Event.VALIDATION, {"iteration": 0, "val/success": self.val_history[0]})
            self.train(first)
            if self.cfg.tracking.log_model:
                final_dir = self.output_dir / "models" / self.tracker.run_id
                self.learner.save(str(final_dir))
                self.tracker.log_artifacts(final_dir, "model")
            status = "FINISHED"
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM, or Tune ending a trial
            status = "KILLED"  # (its report() calls sys.exit(0))
            raise
        finally:
            self.close(status)
        return self.summary(status, time.perf_counter() - started)

    def train(self, first: int) -> None:
        """Iterations ``first`` .. ``trainer.iterations``, or until an alarm stops the run;
        a dead learner is rebuilt and the iterations since its checkpoint run again."""
        if first == 1:  # the driver's part of "a checkpoint at iteration 0", kept in memory
            self.start_state = copy.deepcopy(self.run_state(0))
        it = first
        while it <= self.cfg.trainer.iterations:
            try:
                metrics = self.iteration(it)
                if self.after_iteration(it, metrics):
                    break
                # glibc keeps the pages an iteration frees: hand them back (RESULTS, "Soak")
                release_free_memory()
                it += 1
            except LearnerDied as died:  # rebuilt from the last checkpoint: re-run from there
                it = 1 + self.recovery.recover(
                    died,
                    self.checkpoint_dir(),
                    self.tracker,
                    self.iteration_done,
                    shutdown=lambda: LearnerGroup.shutdown(self.learner),
                    rebuild=self.rebuild_learner,
                )

    def iteration(self, it: int) -> dict[str, float]:
        timers, cfg = Timers(), self.cfg
        with timers("collect"):  # with max_staleness >= 1: collected ahead, waited for here
            collected = self.pipeline.batch(it, self.sampling, self.collect)
        metrics = rollout_metrics(collected, reasoning_tokens=self.count_tokens)
        metrics["rollout/tokens_per_s"] = (
            metrics["rollout/generated_tokens"] / timers["timing/collect"]
        )
        metrics.update(self.pipeline.metrics())
        with timers("filter"):
            filtered, kept = filter_groups(collected, self.responder.filter_cfg)
        metrics.update(filtered.metrics)
        pool = collected
        if cfg.algo.dynamic_sampling:
            with timers("dynamic_sampling"):
                pool, kept, resampled = self.resample(it, collected, kept)
            metrics.update(resampled)
        with timers("diagnose"):
            metrics.update(self.diagnosis.run(it, collected, self.learner, self.tracker))
        if kept:
            with timers("prepare"):
                batch = self.prepare(pool)
            with timers("advantages"):
                batch = advantages(batch, cfg.algo)
            if self.diagnosis.grad_snr_due(it):
                with timers("grad_snr"):
                    metrics.update(self.learner.grad_snr(batch, cfg.diagnostics.grad_snr_buckets))
            train = batch.select([i for i, t in enumerate(pool) if t.group_id in kept])
            train.advantages = train.advantages * filtered.loss_scale
            with timers("update"):
                metrics.update(self.learner.update(train))
            with timers("sync"):
                self.pipeline.sync_weights(self.learner)
        metrics["filter/update_skipped"] = float(not kept)
        metrics.update(self.responder.metrics())
        metrics["rollout/worker_failures"] = float(self.fleet.failures)
        metrics["tether.learner_restarts"] = float(self.recovery.restarts)
        metrics.update(memory_metrics(self.learner, self.fleet))
        metrics.update(timers)
        metrics["timing/iteration"] = sum(timers.values())
        self.last_collected = collected
        return metrics

    def after_iteration(self, it: int, metrics: dict[str, float]) -> bool:
        """Validate, log, keep samples, check alarms, checkpoint; True ends the run."""
        t = self.cfg.trainer
        if due(it, t.val_every, last=t.iterations):
            self.log_validation(it, metrics)
        if it > self.logged_through:  # else re-run after a learner rebuild: logged already
            log_iteration(self.tracker, t, it, metrics, self.last_collected, self.tokenizer.decode)
            self.logged_through = it
        self.iteration_done, self.last_metrics = it, metrics
        if any(key.startswith("collapse/") for key in metrics):
            self.last_diagnostics = {
                "iteration": float(it),
                **{k: v for k, v in metrics.items() if k.startswith(("collapse/", "grounding/"))},
            }
        self.emit(Event.ITERATION, {"iteration": it, "total": t.iterations, **metrics})
        if self.responder.respond(it, metrics, self.learner, self.fleet):
            self.checkpoint(it)  # a stop-mode alarm: the run ends resumable
            return True
        acting = self.responder.controller is not None  # iteration 1: a rollback target
        if due(it, t.checkpoint_every, first=acting, last=t.iterations):
            self.checkpoint(it)
        return False

    # -- the stages' calls ------------------------------------------------------------
    def collect(self, specs, sampling: SamplingParams, seed: int, max_turns: int | None = None):
        """Episodes from the fleet (a subclass may wrap every synchronous collection here)."""
        return self.fleet.collect(specs, sampling, seed, max_turns)

    def collect_probe(self, specs, seed: int, max_turns: int | None):
        return self.collect(specs, self.sampling, seed, max_turns)

    def resample(self, it: int, collected, kept: set[int]):
        """Dynamic sampling: round r collects fresh groups with ids from r * 1000."""
        r = self.cfg.rollout
        return dynamic_sampling(
            collected,
            kept,
            lambda round_: self.collect(
                self.sampler.specs(r.groups, r.group_size, RESAMPLE_GROUP_IDS * round_),
                self.sampling,
                seeds.collection(self.cfg.experiment.seed, it, round_),
            ),
            self.responder.filter_cfg,
            r.groups,
            self.cfg.algo.max_resample_rounds,
        )

    def prepare(self, trajectories):
        """Padded batch with old-policy (and reference) log-probs and critic values."""
        batch = collate(
            trajectories,
            self.tokenizer.pad_token_id,
            reasoning_masks=[self.spans.reasoning_mask(t) for t in trajectories],
        )
        return self.learner.prepare(batch, self.cfg.algo.recompute_old_logprobs)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def validate(self) -> dict[str, float]:
        specs, sampling = validation_episodes(self.cfg, self.sampling)
        trajectories = self.collect(
            specs, sampling, seed=seeds.validation(self.cfg.experiment.seed)
        )
        m = rollout_metrics(trajectories, prefix="val", reasoning_tokens=self.count_tokens)
        return {k: v for k, v in m.items() if k in VALIDATION_METRICS}

    def log_validation(self, it: int, metrics: dict[str, float]) -> None:
        val = self.validate()
        self.val_history[it] = val["val/success"]
        self.val_intervals[it] = (val["val/success_ci_low"], val["val/success_ci_high"])
        metrics.update(val)
        if it == 0:
            self.tracker.log_metrics(val, step=0)

    # -- checkpoints ------------------------------------------------------------------
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints" / self.tracker.run_id

    def run_state(self, it: int) -> RunState:
        """What a checkpoint keeps of the driver's parts after iteration ``it``."""
        return RunState(
            iteration=it,
            run_id=self.tracker.run_id,
            config=self.cfg.model_dump(mode="json"),
            sampler_position=self.pipeline.sampler_position(),
            mi_ema_state=self.diagnosis.ema_state,
            alarms=self.responder.alarms.state_dict(),
            worker_failures=self.fleet.failures,
            val_history=self.val_history,
            val_intervals=self.val_intervals,
            control=self.responder.control_state(),
        )

    def checkpoint(self, it: int) -> Path | None:
        """The learner's full state and the parts' ``RunState`` into ``iter_<it>.pt`` (none
        when ``trainer.checkpoint_every`` is 0); a failed write: ``recovery``."""
        if not self.cfg.trainer.checkpoint_every:  # 0: this run keeps no checkpoints
            return None
        learner_state, directory = self.learner.full_state(), self.checkpoint_dir()
        self.responder.note_checkpoint(
            it, checkpoint_path(directory, it), self.last_metrics, self.last_diagnostics
        )
        state = {"learner": learner_state, "driver": self.run_state(it).to_checkpoint()}
        keep, protect = self.cfg.retention.checkpoints, self.responder.protected()
        try:  # the newest ``keep`` stay, and the protected (a rollback's targets)
            path = save_checkpoint(directory, it, state, keep, protect)
        except CheckpointError as exc:
            return checkpoint_failed(exc, self.cfg.trainer, self.responder, self.tracker, self.emit)
        self.tracker.set_tags({"tether.last_checkpoint": str(path)})
        return path

    def restore(self, path: Path, resumed: bool = True) -> int:
        """Load a checkpoint into the learner, workers and driver; return its iteration.
        ``resumed``: a new driver process (``--resume``), counted in the resume tags."""
        saved = load_checkpoint(path)
        self.learner.load_full_state(saved["learner"])
        iteration = self.return_to(RunState.from_checkpoint(saved["driver"]))
        if resumed:
            record_resume(self.tracker, iteration, path)
            self.logged_through = self.tracker.opened_last_step  # (a process cut after logging)
        return iteration

    def return_to(self, state: RunState) -> int:
        """``state`` back to the driver's parts, the learner's weights to the workers."""
        self.sampler.position = state.sampler_position
        self.diagnosis.ema_state = state.mi_ema_state
        self.responder.load(state.alarms, state.control, self.learner)
        self.fleet.failures = state.worker_failures
        self.val_history, self.val_intervals = state.val_history, state.val_intervals
        state.restore_rng()
        self.pipeline.restart(self.learner)  # batches in flight dropped, weights sent
        self.iteration_done = state.iteration
        return state.iteration

    def rebuild_learner(self, path: Path | None) -> int:
        """A new learner group in place of a dead one, at checkpoint ``path``; None (no
        checkpoint yet): at the run's start (a new group holds the starting weights)."""
        self.learner = learner_request(self.cfg, self.model_path).create()
        self.actor_pool.replace("learner", self.learner)
        start_learner(self.learner, self.responder.settings, self.cfg)
        path = path or self.resume_from
        if path is None:
            return self.return_to(copy.deepcopy(self.start_state))
        return self.restore(path, resumed=False)

    # -- start and end ----------------------------------------------------------------
    def setup(self) -> None:
        """Everything before iteration 1, cheapest refusal first: Ray (joined or started),
        the MLflow run, the policy, the actors and this run's state on them."""
        cfg = self.cfg
        preflight.refuse_early(cfg, cfg.ray.address)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.started_ray = preflight.connect(cfg, cfg.ray.address, actors=cfg)
        # Before the warm start: a run that can't fit fails now (joining an autoscaling
        # cluster: its node types may not be published yet).
        preflight.wait_until_fits(
            lambda: check_resources(cfg.resource_demands()), cfg, joined=bool(cfg.ray.address)
        )
        # The MLflow run before the warm start: from here on a server that is away spools.
        self.tracker = self.responder.tracker = open_tracker(
            cfg, self.output_dir, self.emit, self.parent_run_id, self.run_tags, self.resume_run_id
        )
        self.model_path = preflight.resolve_model(
            cfg,
            lambda step, total, loss: self.emit(
                Event.WARM_START, {"step": step, "total": total, "loss": loss}
            ),
        )
        self.tokenizer = load_tokenizer(self.model_path)
        self.spans = SpanExtractor(ChatFormatter(self.tokenizer))
        self.fleet.workers, self.learner = checkout_actors(
            self.actor_pool, cfg, self.model_path, self.tracker
        )
        # This run's own state, on new and reused actors alike: nothing of an earlier run
        # (weights, optimiser, settings, seed, counters) carries over.
        start_learner(self.learner, self.responder.settings, cfg)
        stops = self.fleet.start_run()
        self.sampling = SamplingParams(**{**self.sampling.__dict__, "stop_token_ids": stops})
        tags = dtype_tags(self.learner, self.fleet, cfg.diagnostics.autocast)
        self.tracker.set_tags({"tether.model_path": self.model_path, **tags})

    def close(self, status: str) -> None:
        """End the MLflow run and hand the actors back to the pool: a keeping pool holds
        them for the next run if this one finished; otherwise they end (a worker's
        environment pool goes with it), so a Ray that outlives the run gets their
        resources back. Stop Ray if this run started it."""
        self.pipeline.drop()
        if self.tracker is not None:
            close_tracker(self.tracker, status, self.iteration_done, self.responder.stop_reason)
        self.actor_pool.checkin(healthy=status == "FINISHED")
        self.fleet.workers, self.learner = [], None
        stop_ray(self.started_ray)

    def summary(self, status: str, seconds: float) -> RunSummary:
        return RunSummary(
            run_id=self.tracker.run_id,
            tracking_uri=self.tracker.uri,
            ui_command=self.tracker.ui_command(),
            iterations=self.iteration_done,
            status=status,
            seconds=seconds,
            model_path=self.model_path,
            val_history=self.val_history,
            last_metrics=self.last_metrics,
            val_intervals=self.val_intervals,
            last_diagnostics=self.last_diagnostics,
            stop_reason=self.responder.stop_reason,
            alarms=[e.to_dict() for e in self.responder.alarms.events],
        )
