"""The single-controller driver: one iteration reads top to bottom.

    collect -> filter -> [dynamic sampling] -> diagnose -> prepare (old/ref log-probs)
            -> advantages -> [gradient SNR] -> update -> sync weights
            -> validate, log, alarms, checkpoint

Actors hold state (models, optimisers, environments); every computation is a call
into the pure core (``tether.agent``, ``tether.algos``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import ray
import torch

from .. import seeds
from ..actors.learner_group import LearnerDied, LearnerGroup
from ..actors.memory import peak_rss_gb
from ..actors.rollout_worker import RolloutWorker
from ..agent.chat import ChatFormatter
from ..agent.episode import EpisodeSpec
from ..agent.metrics import group_rewards, group_trajectories, rollout_metrics, transcript
from ..agent.pairs import SpanExtractor
from ..algos.advantages import AdvantageInputs, compute_advantages
from ..algos.batch import collate
from ..algos.filters import snr_filter
from ..algos.settings import FilterConfig
from ..algos.update import UpdateSettings
from ..diagnostics.alarms import AlarmMonitor
from ..diagnostics.control import GroundedCheckpoint, Knobs
from ..envs import runs_untrusted_code
from ..envs.sandbox import resolve_isolation
from ..policy.load import load_tokenizer, resolve_policy
from ..policy.lora import check_targets_for_path
from ..rollout.base import SamplingParams
from .actor_pool import ActorPool, ActorRequest
from .checkpoint import (
    CheckpointError,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from .config import ConfigError, TetherConfig
from .environment import check_installed, environment_tags
from .session import check_ray_reachable, check_resources, start_ray, stop_ray, wait_for_autoscaler
from .tracking import SPOOL_DIRNAME, Tracker, default_tracking_uri


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


class LevelSampler:
    """Training level seeds: a counter mapped below the validation seed range."""

    def __init__(self, seed: int, limit: int, position: int = 0) -> None:
        self.seed, self.limit, self.position = seed, limit, position

    def take(self, n: int) -> list[int]:
        levels = seeds.training_levels(self.seed, self.position, n, self.limit)
        self.position += n
        return levels


#: Group ids of dynamic-sampling round r start at r * RESAMPLE_GROUP_IDS (round 0, the
#: iteration's own collection, is 0 .. groups - 1), so groups of different rounds differ.
RESAMPLE_GROUP_IDS = 1000


def _first_line(exc: BaseException) -> str:
    """The line of a (Ray-wrapped) error that says what happened, not where."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    cause = getattr(exc, "cause", None)
    if cause is not None and str(cause).strip():
        return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1]}"
    return lines[0] if lines else type(exc).__name__


def _warn(kind: str, data: dict) -> None:
    """Without an event hook, the tracking spool's and a failed checkpoint's messages
    still reach the user."""
    if kind in ("tracking", "checkpoint_failed"):
        logging.getLogger(f"tether.{kind}").warning(data["message"])


class Timers(dict):
    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self[f"timing/{name}"] = self.get(f"timing/{name}", 0.0) + time.perf_counter() - start


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
        """``on_event(kind, data)`` receives progress ("warm_start", "started", "validation",
        "iteration" with the iteration's metrics, "alarm", "worker_failed", "tracking" with
        the tracking spool's one-line messages); a sweep
        passes ``parent_run_id`` (the MLflow run is nested under it), ``run_tags`` and a
        keeping ``actor_pool`` (its trial process's: the next trial reuses the actors).
        Without one, the run's actors end with the run."""
        check_installed("transformers")  # before any actor: an older one fails mid-run
        self.cfg = cfg
        self.actor_pool = actor_pool or ActorPool(keep=False)
        self.parent_run_id, self.run_tags = parent_run_id, dict(run_tags or {})
        #: A checkpoint to continue from, and the MLflow run it belongs to (same run, same steps).
        self.resume_from, self.resume_run_id = resume_from, resume_run_id
        self.emit = on_event or _warn
        self.output_dir = Path(cfg.experiment.output_dir).expanduser().resolve()
        self.sampler = LevelSampler(cfg.experiment.seed, cfg.env.val_seed_offset)
        self.settings = UpdateSettings.from_config(cfg.algo, cfg.rollout.temperature)
        #: the filter in force: the config's, tightened by act-mode responses
        self.filter_cfg: FilterConfig = cfg.filter
        self.sampling = SamplingParams(
            max_new_tokens=cfg.rollout.max_reply_tokens,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
        )
        self.started_ray = False
        self.tracker: Tracker | None = None
        self.iteration_done = 0
        self.worker_failures = 0
        self.learner_restarts = 0  # learner groups rebuilt after a rank died (this process)
        self.weights_ref, self.weights_version = None, 0
        self.mi_ema_state: dict = {}
        self.alarms = AlarmMonitor(cfg.alarms)
        #: act-mode alarms' responses (None when no alarm acts), the settings they may
        #: change, and the checkpoints saved while MI was significantly above its null
        self.controller = cfg.alarms.controller()
        self.knobs = Knobs(
            cfg.filter.strategy,
            cfg.filter.value,
            cfg.algo.kl_coef,
            cfg.algo.entropy_coef,
            cfg.algo.lr,
        )
        self.grounded_checkpoints: list[GroundedCheckpoint] = []
        self.stop_reason: str | None = None
        self.val_history: dict[int, float] = {}
        self.val_intervals: dict[int, tuple[float, float]] = {}
        self.last_metrics: dict[str, float] = {}
        self.last_diagnostics: dict[str, float] = {}

    # -- setup ------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        if cfg.ray.address:  # before the warm start: an unreachable cluster fails in seconds
            check_ray_reachable(cfg.ray.address)
        if runs_untrusted_code(cfg.env.id):  # refuse before anything starts (one line)
            resolve_isolation(cfg.sandbox.isolation)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        demands = cfg.resource_demands()  # before the warm start: a run that can't fit fails now
        self.started_ray = start_ray(
            cfg.ray.address, cfg.ray.num_cpus, sum(d.count * d.cpus for d in demands)
        )
        # Joining an autoscaling cluster: its node types may not be published yet.
        wait_for_autoscaler(
            lambda: check_resources(demands), cfg.ray.autoscaler_wait_s if cfg.ray.address else 0.0
        )
        self.model_path = str(
            resolve_policy(
                cfg.model,
                cfg.env,
                cfg.experiment.seed,
                cfg.rollout.max_reply_tokens,
                isolation=cfg.sandbox.isolation,
                progress=lambda step, total, loss: self.emit(
                    "warm_start", {"step": step, "total": total, "loss": loss}
                ),
            )
        )
        if cfg.model.lora is not None:  # adapter targets the model has (before any actor)
            try:
                check_targets_for_path(cfg.model.lora, self.model_path)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        self.tokenizer = load_tokenizer(self.model_path)
        self.spans = SpanExtractor(ChatFormatter(self.tokenizer))
        uri = cfg.tracking.uri or default_tracking_uri(self.output_dir)
        self.tracker = Tracker(
            uri,
            cfg.experiment.name,
            self.output_dir / "artifacts",
            run_name=cfg.experiment.run_name
            or f"{cfg.env.id.split('/')[-1]}-{cfg.algo.preset}-s{cfg.experiment.seed}",
            parent_run_id=self.parent_run_id,
            tags=self.run_tags,
            run_id=self.resume_run_id,
            settings=cfg.tracking,
            spool_root=self.output_dir / SPOOL_DIRNAME,
            notify=lambda message: self.emit("tracking", {"message": message}),
        )
        if self.resume_run_id is None:
            # The run name is the run's name (and a tag), not a parameter: every sweep trial
            # has its own, which the UI's comparison views would offer as a varied param.
            self.tracker.log_params(
                {k: v for k, v in cfg.flat().items() if k != "experiment.run_name"}
            )
        self.tracker.set_tags(
            {"tether.model_path": self.model_path, "tether.env": cfg.env.id, **environment_tags()}
        )
        self.workers, self.learner = self.actor_pool.checkout(*self.actor_requests())
        self.tracker.set_tags(
            {
                "tether.actors_reused": ",".join(
                    kind for kind, reused in self.actor_pool.reused.items() if reused
                )
                or "none"
            }
        )
        # This run's own state, on new and reused actors alike: nothing of an earlier run
        # (weights, optimiser, settings, seed, counters) carries over.
        self.learner.start_run(
            self.settings, lr=cfg.algo.lr, critic_lr=cfg.algo.critic_lr, seed=cfg.experiment.seed
        )
        for k, worker in enumerate(self.workers):
            self.call_when_up(k, worker.start_run)
        stops = ray.get(self.workers[0].stop_token_ids.remote())
        self.sampling = SamplingParams(**{**self.sampling.__dict__, "stop_token_ids": stops})
        self.tracker.set_tags(self.dtype_tags())

    def dtype_tags(self) -> dict[str, str]:
        """What the run computed in: the parameters' dtype as the learner and each rollout
        worker loaded them (one name when all agree), and the log-softmax's (float32)."""
        used = {"learner": self.learner.dtype_effective()}
        for k, dtype in enumerate(ray.get([w.dtype_effective.remote() for w in self.workers])):
            used[f"rollout_worker{k}"] = dtype
        same = len(set(used.values())) == 1
        return {
            "model.dtype_effective": next(iter(used.values()))
            if same
            else ",".join(f"{k}={v}" for k, v in used.items()),
            "model.logprob_dtype": "float32",
        }

    def actor_requests(self) -> list[ActorRequest]:
        """The rollout workers and the learner group, keyed by all their constructors and
        resource options take, so a pool reuses actors only where new ones would be equal."""
        cfg, r, a = self.cfg, self.cfg.rollout, self.cfg.algo
        env_kwargs = cfg.env_kwargs()
        worker_options = {"num_cpus": r.num_cpus_per_worker, "num_gpus": r.num_gpus_per_worker}
        worker_args = (
            self.model_path,
            cfg.env.id,
            env_kwargs,
            r.engine,
            r.num_cpus_per_worker,
            cfg.model.dtype,
            r.engine_kwargs,
            cfg.experiment.seed,
        )
        learner_args = {
            "use_critic": a.use_critic,
            "use_reference": a.kl_coef > 0,
            "threads": a.threads,
            "dtype": cfg.model.dtype,
            "world_size": a.learner_world_size,
            "num_cpus": a.num_cpus,
            "num_gpus": a.num_gpus,
            "lora": cfg.model.lora,
        }

        def end_workers(workers) -> None:  # a worker's environment pool goes with it
            for worker in workers:
                ray.kill(worker, no_restart=True)

        return [
            ActorRequest(
                "rollout_workers",
                (r.num_workers, worker_options, worker_args),
                create=lambda: [
                    RolloutWorker.options(**worker_options).remote(*worker_args)
                    for _ in range(r.num_workers)
                ],
                end=end_workers,
            ),
            # A multi-rank FSDP group is not kept: its ranks' sharded modules and process
            # group would have to be re-initialised collectively, and a rank lost between
            # runs would hang the next run's first collective.
            ActorRequest(
                "learner",
                (self.model_path, learner_args),
                create=lambda: LearnerGroup.launch(self.model_path, **learner_args),
                end=LearnerGroup.shutdown,
                reusable=a.learner_world_size == 1,
            ),
        ]

    # -- stages -----------------------------------------------------------------------
    def collect(self, specs: list[EpisodeSpec], sampling: SamplingParams, seed: int):
        """Episodes spread over the workers (contiguous shares), gathered in order.

        A share whose worker (or its environment pool) died is collected again once
        Ray has restarted the actor and it has the current weights, so no trajectory
        is lost or counted twice.
        """
        shares = [s for s in np.array_split(np.arange(len(specs)), len(self.workers)) if len(s)]
        results: dict[int, list] = {}
        last_error = ""
        for attempt in range(self.cfg.rollout.max_collect_attempts):
            refs = {
                k: self.workers[k].collect.remote(
                    [specs[i] for i in share],
                    sampling,
                    seeds.worker_share(seed, k),
                    self.cfg.rollout.max_turns,
                )
                for k, share in enumerate(shares)
                if k not in results
            }
            self.emit(
                "collecting",
                {
                    "attempt": attempt,
                    "workers": sorted(refs),
                    "episodes": sum(len(shares[k]) for k in refs),
                },
            )
            for k, ref in refs.items():
                try:
                    results[k] = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                    self.worker_failures += 1
                    last_error = _first_line(exc)
                    self.emit(
                        "worker_failed", {"worker": k, "attempt": attempt, "error": last_error}
                    )
                    self.restore_worker(k)
            if len(results) == len(shares):
                return [t for k in range(len(shares)) for t in results[k]]
        raise RuntimeError(
            f"rollout workers failed {self.cfg.rollout.max_collect_attempts} "
            f"times in a row; giving up on this iteration (last error: "
            f"{last_error})"
        )

    def restore_worker(self, k: int) -> None:
        """Wait until a (restarting) worker answers, and give it the current weights."""
        worker = self.workers[k]
        if self.weights_ref is None:  # the initial weights: the ones it loads itself
            self.call_when_up(k, worker.stop_token_ids)
        else:
            self.call_when_up(k, worker.set_weights, self.weights_ref, self.weights_version)

    def call_when_up(self, k: int, method, *args):
        """``ray.get(method.remote(*args))`` on worker ``k``, once it answers.

        Calls into an actor that Ray is restarting fail at once (ActorUnavailableError)
        rather than wait, so this polls until the new process is up (it loads the
        model) or ``rollout.restart_timeout_s`` has passed."""
        deadline = time.monotonic() + self.cfg.rollout.restart_timeout_s
        while True:
            try:
                return ray.get(method.remote(*args))
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"rollout worker {k} did not come back within "
                        f"rollout.restart_timeout_s = "
                        f"{self.cfg.rollout.restart_timeout_s} s"
                    ) from None
                time.sleep(0.25)

    def training_specs(self, n_groups: int, first_group_id: int) -> list[EpisodeSpec]:
        levels = self.sampler.take(n_groups)
        return [
            EpisodeSpec(first_group_id + g, seed, k)
            for g, seed in enumerate(levels)
            for k in range(self.cfg.rollout.group_size)
        ]

    def filter_groups(self, trajectories):
        """SNR-aware filter over whole groups (docs/methods.md, section 5): the filter's
        result and the ids of the groups it keeps."""
        groups = group_trajectories(trajectories)
        result = snr_filter(
            [np.array([t.reward for t in ts]) for ts in groups.values()],
            self.filter_cfg,
            success=[np.array([t.success for t in ts]) for ts in groups.values()],
        )
        ids = list(groups)
        return result, {ids[g] for g in result.kept_groups}

    def dynamic_sampling(self, iteration: int, collected, kept: set[int]):
        """DAPO's dynamic sampling (docs/methods.md, section 6): drop the kept groups without reward spread and collect
        fresh groups (each round filtered the same way) until the batch has
        ``rollout.groups`` groups with spread or ``algo.max_resample_rounds`` rounds ran.

        Returns every trajectory collected this iteration (the first collection's
        first), the ids of the groups that train, and this stage's metrics (the rollout
        and filter metrics describe the first collection alone)."""
        pool = list(collected)
        kept = {g for g in kept if self.group_spread(pool, g) > 0}
        rounds = 0
        while len(kept) < self.cfg.rollout.groups and rounds < self.cfg.algo.max_resample_rounds:
            rounds += 1
            more = self.collect(
                self.training_specs(self.cfg.rollout.groups, RESAMPLE_GROUP_IDS * rounds),
                self.sampling,
                seeds.collection(self.cfg.experiment.seed, iteration, rounds),
            )
            pool += more
            _, extra = self.filter_groups(more)
            kept |= {g for g in extra if self.group_spread(more, g) > 0}
        kept = set(sorted(kept)[: self.cfg.rollout.groups])
        return (
            pool,
            kept,
            {
                "filter/resample_rounds": float(rounds),
                "dynamic_sampling/collected_trajectories": float(len(pool) - len(collected)),
                "dynamic_sampling/kept_groups": float(len(kept)),
            },
        )

    @staticmethod
    def group_spread(trajectories, group_id: int) -> float:
        return float(np.ptp([t.reward for t in trajectories if t.group_id == group_id]))

    def diagnose(self, it: int, collected) -> dict[str, float]:
        """Cross-score MI proxies with the pre-update policy (docs/methods.md, section 2),
        at the cadence."""
        d = self.cfg.diagnostics
        if not d.enabled or not (it == 1 or it % d.every == 0):
            return {}
        heatmap = it % d.heatmap_every == 0 or it == 1
        chain = d.information_chain and (it % d.chain_every == 0 or it == 1)
        result = self.learner.diagnose(
            collected,
            d,
            self.mi_ema_state,
            seeds.diagnostics(self.cfg.experiment.seed, it),
            heatmap,
            chain,
        )
        self.mi_ema_state = result.ema_state
        started = time.perf_counter()
        for sampling, (scores, column) in result.matrices.items():
            from ..diagnostics.plots import cross_score_heatmap

            figure = cross_score_heatmap(scores, column, f"{sampling} cross-scores, iteration {it}")
            self.tracker.log_figure(figure, f"diagnostics/cross_scores_{sampling}_{it:04d}.png")
            import matplotlib.pyplot as plt

            plt.close(figure)
        if result.matrices:
            result.metrics["timing/diagnose/heatmaps"] = time.perf_counter() - started
        return result.metrics

    def prepare(self, trajectories):
        """Padded batch with old-policy (and reference) log-probs and critic values."""
        batch = collate(
            trajectories,
            self.tokenizer.pad_token_id,
            reasoning_masks=[self.spans.reasoning_mask(t) for t in trajectories],
        )
        return self.learner.prepare(batch, self.cfg.algo.recompute_old_logprobs)

    def advantages(self, batch):
        a = self.cfg.algo
        params = {"gae": {"gamma": a.gamma, "lam": a.lam}, "reinforce_pp": {"gamma": a.gamma}}.get(
            a.advantage, {}
        )
        inputs = AdvantageInputs(
            scores=batch.scores,
            group_index=batch.group_index,
            response_mask=batch.response_mask,
            token_rewards=batch.token_rewards,
            values=batch.values,
        )
        batch.advantages, batch.returns = compute_advantages(a.advantage, inputs, **params)
        return batch

    def sync_weights(self, version: int) -> None:
        """Learner -> rollout workers: the gathered full weights go into the Ray object
        store once and every worker fetches them from there (the CPU path).  A GPU
        engine that takes weights another way (vLLM: NCCL broadcast / collective RPC
        into its workers) does it behind ``RolloutEngine.load_state_dict``."""
        self.weights_ref, self.weights_version = self.learner.state_dict(), version
        loads = [worker.set_weights.remote(self.weights_ref, version) for worker in self.workers]
        for k, load in enumerate(loads):
            try:
                ray.get(load)
            except ray.exceptions.RayActorError:
                self.learner.check_alive("state_dict")  # the weights' source, not the worker?
                self.worker_failures += 1
                self.restore_worker(k)

    # -- one iteration ----------------------------------------------------------------
    def iteration(self, it: int) -> dict[str, float]:
        timers, d = Timers(), self.cfg.diagnostics
        with timers("collect"):
            collected = self.collect(
                self.training_specs(self.cfg.rollout.groups, 0),
                self.sampling,
                seeds.collection(self.cfg.experiment.seed, it),
            )
        metrics = rollout_metrics(collected, reasoning_tokens=self.count_tokens)
        metrics["rollout/tokens_per_s"] = (
            metrics["rollout/generated_tokens"] / timers["timing/collect"]
        )
        with timers("filter"):
            filtered, kept = self.filter_groups(collected)
        metrics.update(filtered.metrics)
        pool = collected
        if self.cfg.algo.dynamic_sampling:
            with timers("dynamic_sampling"):
                pool, kept, resampled = self.dynamic_sampling(it, collected, kept)
            metrics.update(resampled)
        with timers("diagnose"):
            metrics.update(self.diagnose(it, collected))
        if kept:
            with timers("prepare"):
                batch = self.prepare(pool)
            with timers("advantages"):
                batch = self.advantages(batch)
            if d.enabled and d.grad_snr_every and it % d.grad_snr_every == 0:
                with timers("grad_snr"):
                    metrics.update(self.learner.grad_snr(batch, d.grad_snr_buckets))
            train = batch.select([i for i, t in enumerate(pool) if t.group_id in kept])
            train.advantages = train.advantages * filtered.loss_scale
            with timers("update"):
                metrics.update(self.learner.update(train))
            with timers("sync"):
                self.sync_weights(it)
        metrics["filter/update_skipped"] = float(not kept)
        if self.controller is not None:
            metrics.update(
                self.knobs.metrics(), **{"control/actions": float(len(self.controller.actions))}
            )
        metrics["rollout/worker_failures"] = float(self.worker_failures)
        metrics["tether.learner_restarts"] = float(self.learner_restarts)
        metrics.update(self.memory_metrics())
        metrics.update(timers)
        metrics["timing/iteration"] = sum(timers.values())
        self.last_collected = collected
        return metrics

    def memory_metrics(self) -> dict[str, float]:
        """``system/peak_rss_gb/<process>``: the peak resident memory (GiB) of the driver,
        each learner rank and each rollout worker since the previous iteration's reading
        (the first: since the process started); ``system/peak_rss_gb``: their sum, an
        upper bound on what these processes held at once (shared pages count in each)."""
        peaks = {"driver": peak_rss_gb(reset=True)}
        ranks = self.learner.peak_rss_gb()
        if len(ranks) == 1:
            peaks["learner"] = ranks[0]
        else:
            peaks.update({f"learner_rank{r}": v for r, v in enumerate(ranks)})
        # All workers are asked at once; one answer is awaited at a time so that a dead
        # worker (restarted at the next collect) costs only its own reading.
        readings = [worker.peak_rss_gb.remote() for worker in self.workers]
        for k, reading in enumerate(readings):
            try:
                peaks[f"rollout_worker{k}"] = ray.get(reading)
            except ray.exceptions.RayActorError:
                pass
        out = {f"system/peak_rss_gb/{name}": value for name, value in peaks.items()}
        out["system/peak_rss_gb"] = sum(peaks.values())
        return out

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def validate(self) -> dict[str, float]:
        cfg = self.cfg
        temperature = cfg.trainer.val_temperature
        sampling = SamplingParams(
            **{
                **self.sampling.__dict__,
                "temperature": cfg.rollout.temperature if temperature is None else temperature,
            }
        )
        specs = [
            EpisodeSpec(k, cfg.env.val_seed_offset + k, 0) for k in range(cfg.trainer.val_episodes)
        ]
        trajectories = self.collect(specs, sampling, seed=seeds.validation(cfg.experiment.seed))
        m = rollout_metrics(trajectories, prefix="val", reasoning_tokens=self.count_tokens)
        return {
            k: v
            for k, v in m.items()
            if k
            in (
                "val/success",
                "val/success_ci_low",
                "val/success_ci_high",
                "val/reward_mean",
                "val/format_ok_rate",
                "val/turns",
            )
        }

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> RunSummary:
        started = time.perf_counter()
        status = "FAILED"
        try:
            self.setup()
            first = self.restore(self.resume_from) + 1 if self.resume_from else 1
            self.emit(
                "started",
                {
                    "run_id": self.tracker.run_id,
                    "model_path": self.model_path,
                    "first_iteration": first,
                },
            )
            if first == 1:
                self.log_validation(0, {})
                self.emit("validation", {"iteration": 0, "val/success": self.val_history[0]})
            it = first
            while it <= self.cfg.trainer.iterations:
                try:
                    metrics = self.iteration(it)
                    if self.after_iteration(it, metrics):
                        break
                    it += 1
                except LearnerDied as died:  # rebuilt from the last checkpoint: re-run from there
                    it = self.recover_learner(died) + 1
            if self.cfg.tracking.log_model:
                final_dir = self.output_dir / "models" / self.tracker.run_id
                self.learner.save(str(final_dir))
                self.tracker.log_artifacts(final_dir, "model")
            status = "FINISHED"
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM, or Tune ending a trial
            status = "KILLED"  # (its report() calls sys.exit(0))
            raise
        finally:
            if self.tracker is not None:
                self.tracker.set_tags(
                    {
                        "tether.status": status,
                        "tether.iterations_done": self.iteration_done,
                        "tether.stop_reason": self.stop_reason or "completed"
                        if status == "FINISHED"
                        else status.lower(),
                    }
                )
                self.tracker.finish(status)
            self.release_actors(keep=status == "FINISHED")
            stop_ray(self.started_ray)
        return RunSummary(
            run_id=self.tracker.run_id,
            tracking_uri=self.tracker.uri,
            ui_command=self.tracker.ui_command(),
            iterations=self.iteration_done,
            status=status,
            seconds=time.perf_counter() - started,
            model_path=self.model_path,
            val_history=self.val_history,
            last_metrics=self.last_metrics,
            val_intervals=self.val_intervals,
            last_diagnostics=self.last_diagnostics,
            stop_reason=self.stop_reason,
            alarms=[e.to_dict() for e in self.alarms.events],
        )

    def recover_learner(self, died: LearnerDied) -> int:
        """A learner rank died: end the group, start a new one (after a backoff) and load
        the last checkpoint into it and the driver (same seeds, same MLflow run); return
        the checkpoint's iteration. Up to ``trainer.max_learner_restarts`` times a run."""
        t = self.cfg.trainer
        directory = self.output_dir / "checkpoints" / self.tracker.run_id
        while True:
            self.learner_restarts += 1
            path = latest_checkpoint(directory) if directory.is_dir() else None
            if path is None:
                raise RuntimeError(
                    f"{died}; not rebuilt: no checkpoint yet "
                    f"(trainer.checkpoint_every = {t.checkpoint_every})"
                ) from died
            if self.learner_restarts > t.max_learner_restarts:
                raise RuntimeError(
                    f"{died}; not rebuilt: trainer.max_learner_restarts = "
                    f"{t.max_learner_restarts} used up"
                ) from died
            self.emit(
                "learner_failed",
                {"error": str(died), "restart": self.learner_restarts, "checkpoint": str(path)},
            )
            self.tracker.set_tags(
                {
                    "tether.learner_restarts": self.learner_restarts,
                    f"tether.learner_restart_{self.learner_restarts}": f"after iteration {self.iteration_done}: {died}; rebuilt "
                    f"from {path}",
                }
            )
            LearnerGroup.shutdown(self.learner)  # the survivors of a broken process group
            time.sleep(t.learner_restart_backoff_s * 2 ** (self.learner_restarts - 1))
            try:
                self.learner = next(
                    r for r in self.actor_requests() if r.kind == "learner"
                ).create()
                self.actor_pool.replace("learner", self.learner)
                self.learner.start_run(
                    self.settings,
                    lr=self.cfg.algo.lr,
                    critic_lr=self.cfg.algo.critic_lr,
                    seed=self.cfg.experiment.seed,
                )
                return self.restore(path, resumed=False)
            except LearnerDied as again:
                died = again

    def release_actors(self, keep: bool) -> None:
        """Hand this run's actors back to the pool: a keeping pool holds them for the next
        run if this one finished (``keep``); otherwise they end (a worker's environment
        pool goes with it), so a Ray that outlives the run gets their resources back."""
        self.actor_pool.checkin(healthy=keep)
        self.workers, self.learner = [], None

    def log_validation(self, it: int, metrics: dict[str, float]) -> None:
        val = self.validate()
        self.val_history[it] = val["val/success"]
        self.val_intervals[it] = (val["val/success_ci_low"], val["val/success_ci_high"])
        metrics.update(val)
        if it == 0:
            self.tracker.log_metrics(val, step=0)

    def after_iteration(self, it: int, metrics: dict[str, float]) -> bool:
        """Validate, log, keep samples, check alarms, checkpoint; True ends the run."""
        t = self.cfg.trainer
        if it % t.val_every == 0 or it == t.iterations:
            self.log_validation(it, metrics)
        logging_started = time.perf_counter()
        self.tracker.log_metrics(metrics, step=it)
        if t.samples_per_log and (it % t.samples_every == 0 or it == 1):
            text = "\n\n".join(
                transcript(tr, self.tokenizer.decode)
                for tr in self.last_collected[: t.samples_per_log]
            )
            self.tracker.log_text(text, f"samples/iter_{it:04d}.txt")
        if it % t.samples_every == 0 or it == 1 or it == t.iterations:
            self.tracker.log_json(
                {"iteration": it, "groups": group_rewards(self.last_collected)},
                f"prompts/iter_{it:04d}.json",
            )
        # The logging's own time cannot be in the dict it logs: it follows on its own.
        metrics["timing/log"] = time.perf_counter() - logging_started
        self.tracker.log_metrics({"timing/log": metrics["timing/log"]}, step=it)
        self.iteration_done, self.last_metrics = it, metrics
        if any(key.startswith("collapse/") for key in metrics):
            self.last_diagnostics = {
                "iteration": float(it),
                **{k: v for k, v in metrics.items() if k.startswith("collapse/")},
            }
        self.emit("iteration", {"iteration": it, "total": t.iterations, **metrics})
        for event in self.alarms.update(it, metrics):
            self.record_alarm(event)
        if self.controller is not None:
            self.act(it)
        if self.alarms.stop_requested:
            stop = next(e for e in self.alarms.events if e.mode == "stop")
            self.stop_reason = f"alarm {stop.name} at iteration {stop.iteration}"
            self.checkpoint(it)
            return True
        if t.checkpoint_every and (it % t.checkpoint_every == 0 or it == t.iterations):
            self.checkpoint(it)
        return False

    def restore(self, path: Path, resumed: bool = True) -> int:
        """Load a checkpoint into the learner, workers and driver; return its iteration.
        ``resumed``: a new driver process (``--resume``), counted in the resume tags."""
        state = load_checkpoint(path)
        driver = state["driver"]
        self.learner.load_full_state(state["learner"])
        self.sampler.position = driver["sampler_position"]
        self.mi_ema_state = driver["mi_ema_state"]
        self.alarms.load_state_dict(driver["alarms"])
        if self.controller is not None and "control" in driver:
            control = driver["control"]
            self.controller.load_state_dict(control["controller"])
            self.grounded_checkpoints = [GroundedCheckpoint(**c) for c in control["grounded"]]
            self.apply_knobs(Knobs(**control["knobs"]))
        self.worker_failures = driver["worker_failures"]
        self.val_history = dict(driver.get("val_history", {}))
        np.random.set_state(driver["numpy_rng"])
        torch.set_rng_state(driver["torch_rng"])
        self.sync_weights(driver["iteration"])
        self.iteration_done = driver["iteration"]
        if not resumed:
            return driver["iteration"]
        resumes = (
            int(
                self.tracker.client.get_run(self.tracker.run_id).data.tags.get(
                    "tether.resume_count", "0"
                )
            )
            + 1
        )
        self.tracker.set_tags(
            {
                "tether.resumed_from": driver["iteration"],
                "tether.resume_count": resumes,
                f"tether.resume_{resumes}": f"iteration {driver['iteration']} from {path}",
            }
        )
        self.iteration_done = driver["iteration"]
        return driver["iteration"]

    def record_alarm(self, event) -> None:
        """Console line, MLflow tag ``alarm.<name>`` = iteration, and the alarms.json artifact."""
        self.emit(
            "alarm",
            {
                "name": event.name,
                "iteration": event.iteration,
                "mode": event.mode,
                "message": event.message,
            },
        )
        self.tracker.set_tags({f"alarm.{event.name}": event.iteration})
        self.log_alarms()

    def log_alarms(self) -> None:
        """alarms.json: the alarms' events and the responses taken, in order."""
        actions = [a.to_dict() for a in self.controller.actions] if self.controller else []
        entries = sorted(
            [e.to_dict() for e in self.alarms.events] + actions,
            key=lambda e: (e["iteration"], e["mode"] == "act"),
        )
        self.tracker.log_json(entries, "alarms.json")

    def act(self, it: int) -> None:
        """While an act-mode alarm is in breach, take its next response (the controller
        decides, ``tether/diagnostics/control.py``), apply it and record it."""
        taken = self.controller.step(
            it, self.alarms.in_breach("act"), self.knobs, self.grounded_checkpoints
        )
        if taken is None:
            return
        action, knobs = taken
        if action.rollback_to is not None:
            self.learner.load_full_state(
                load_checkpoint(Path(action.rollback_to["path"]))["learner"]
            )
        self.apply_knobs(knobs)
        if action.rollback_to is not None:
            self.sync_weights(it)
        self.emit(
            "action",
            {
                "iteration": it,
                "alarm": action.alarm,
                "kind": action.kind,
                "message": action.message,
                "rollback_to": action.rollback_to,
            },
        )
        self.tracker.set_tags(
            {f"control.{len(self.controller.actions)}": f"iteration {it}: {action.message}"}
        )
        self.log_alarms()

    def apply_knobs(self, knobs: Knobs) -> None:
        """The controller's settings into the filter, the update settings and the learner."""
        self.knobs = knobs
        self.filter_cfg = FilterConfig.model_validate(
            {
                **self.filter_cfg.model_dump(),
                "strategy": knobs.filter_strategy,
                "value": knobs.filter_value,
            }
        )
        self.settings = dataclasses.replace(
            self.settings, kl_coef=knobs.kl_coef, entropy_coef=knobs.entropy_coef
        )
        self.learner.adjust(self.settings, knobs.lr)

    def checkpoint(self, it: int) -> Path | None:
        if not self.cfg.trainer.checkpoint_every:  # 0: this run keeps no checkpoints
            return None
        learner_state = self.learner.full_state()
        driver_state = {
            "iteration": it,
            "sampler_position": self.sampler.position,
            "run_id": self.tracker.run_id,
            "numpy_rng": np.random.get_state(),
            "torch_rng": torch.get_rng_state(),
            "config": self.cfg.model_dump(mode="json"),
            "mi_ema_state": self.mi_ema_state,
            "alarms": self.alarms.state_dict(),
            "worker_failures": self.worker_failures,
            "val_history": self.val_history,
        }
        directory = self.output_dir / "checkpoints" / self.tracker.run_id
        if self.controller is not None:
            if self.grounded_now():
                self.grounded_checkpoints = [
                    *self.grounded_checkpoints,
                    GroundedCheckpoint(it, str(checkpoint_path(directory, it))),
                ][-3:]
            driver_state["control"] = {
                "controller": self.controller.state_dict(),
                "knobs": dataclasses.asdict(self.knobs),
                "grounded": [dataclasses.asdict(c) for c in self.grounded_checkpoints],
            }
        try:
            path = save_checkpoint(
                directory,
                it,
                {"learner": learner_state, "driver": driver_state},
                protect=tuple(Path(c.path) for c in self.grounded_checkpoints),
            )
        except CheckpointError as exc:
            return self.checkpoint_failed(exc)
        self.tracker.set_tags({"tether.last_checkpoint": str(path)})
        return path

    def checkpoint_failed(self, exc: CheckpointError) -> None:
        """A checkpoint not written (disk full, ...): the last good one stays; per
        ``trainer.checkpoint_errors`` training goes on with a warning, or the run stops
        (CheckpointError ends it FAILED, with one line naming both)."""
        self.grounded_checkpoints = [c for c in self.grounded_checkpoints if Path(c.path).is_file()]
        self.tracker.set_tags({"tether.checkpoint_error": str(exc)})
        if self.cfg.trainer.checkpoint_errors == "stop":
            raise exc
        self.emit(
            "checkpoint_failed",
            {"message": f"{exc}; training goes on (trainer.checkpoint_errors = warn)"},
        )

    def grounded_now(self) -> bool:
        """MI at the latest diagnostic point passed the test a template-collapse reference
        passes (p < alpha / window): a checkpoint now is a rollback target."""
        c = self.cfg.alarms.template_collapse
        p = self.last_metrics.get(c.p_metric, self.last_diagnostics.get(c.p_metric))
        return p is not None and p < c.alpha / c.window
