"""The single-controller driver: one iteration reads top to bottom.

    collect -> filter -> prepare (old/ref log-probs) -> advantages -> update
            -> sync weights -> log -> checkpoint

Actors hold state (models, optimisers, environments); every computation is a call
into the pure core (``tether.agent``, ``tether.algos``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import ray
import torch

from ..actors.learner import Learner, ReferenceModel
from ..actors.rollout_worker import RolloutWorker
from ..agent.episode import EpisodeSpec
from ..agent.metrics import group_trajectories, rollout_metrics, transcript
from ..algos.advantages import AdvantageInputs, compute_advantages
from ..algos.batch import collate
from ..algos.filters import FilterConfig, snr_filter
from ..algos.update import UpdateSettings
from ..policy.load import load_model_and_tokenizer, resolve_policy
from ..rollout.base import SamplingParams
from .checkpoint import save_checkpoint
from .config import TetherConfig
from .session import start_ray, stop_ray
from .tracking import Tracker, default_tracking_uri


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
    last_metrics: dict[str, float] = field(default_factory=dict)


class LevelSampler:
    """Training level seeds: a counter mapped below the validation seed range."""

    def __init__(self, seed: int, limit: int, position: int = 0) -> None:
        self.seed, self.limit, self.position = seed, limit, position

    def take(self, n: int) -> list[int]:
        seeds = [(self.seed * 1_000_003 + self.position + k) % self.limit for k in range(n)]
        self.position += n
        return seeds


class Timers(dict):
    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self[f"timing/{name}"] = self.get(f"timing/{name}", 0.0) + time.perf_counter() - start


class Trainer:
    def __init__(self, cfg: TetherConfig, on_event: Callable[[str, dict], None] | None = None):
        self.cfg = cfg
        self.emit = on_event or (lambda kind, data: None)
        self.output_dir = Path(cfg.experiment.output_dir).expanduser().resolve()
        self.sampler = LevelSampler(cfg.experiment.seed, cfg.env.val_seed_offset)
        self.settings = UpdateSettings(
            clip_low=cfg.algo.clip_low, clip_high=cfg.algo.clip_high, kl_coef=cfg.algo.kl_coef,
            kl_estimator=cfg.algo.kl_estimator, entropy_coef=cfg.algo.entropy_coef,
            loss_agg=cfg.algo.loss_agg, ppo_epochs=cfg.algo.ppo_epochs,
            minibatches=cfg.algo.minibatches, micro_batch_size=cfg.algo.micro_batch_size,
            max_grad_norm=cfg.algo.max_grad_norm,
            temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0)
        self.filter_cfg = FilterConfig(**cfg.filter.model_dump())
        self.sampling = SamplingParams(max_new_tokens=cfg.rollout.max_reply_tokens,
                                       temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
        self.started_ray = False
        self.tracker: Tracker | None = None
        self.iteration_done = 0
        self.worker_failures = 0
        self.weights_ref, self.weights_version = None, 0

    # -- setup ------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.model_path = str(resolve_policy(
            cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens,
            progress=lambda step, total, loss: self.emit("warm_start", {
                "step": step, "total": total, "loss": loss})))
        _, self.tokenizer = load_model_and_tokenizer(self.model_path)
        uri = cfg.tracking.uri or default_tracking_uri(self.output_dir)
        self.tracker = Tracker(uri, cfg.experiment.name, self.output_dir / "artifacts",
                               run_name=cfg.experiment.run_name or
                               f"{cfg.env.id.split('/')[-1]}-{cfg.algo.preset}-s{cfg.experiment.seed}")
        self.tracker.log_params(cfg.flat())
        self.tracker.set_tags({"tether.model_path": self.model_path, "tether.env": cfg.env.id})
        required = cfg.rollout.num_workers * cfg.rollout.num_cpus_per_worker + cfg.algo.num_cpus
        self.started_ray = start_ray(cfg.ray.address, cfg.ray.num_cpus, required)
        env_kwargs = {"stochasticity": cfg.env.stochasticity,
                      "format_penalty": cfg.env.format_penalty, **cfg.env.kwargs}
        self.workers = [
            RolloutWorker.options(num_cpus=cfg.rollout.num_cpus_per_worker,
                                  num_gpus=cfg.rollout.num_gpus_per_worker).remote(
                self.model_path, cfg.env.id, env_kwargs, cfg.rollout.engine,
                cfg.rollout.num_cpus_per_worker, cfg.model.dtype)
            for _ in range(cfg.rollout.num_workers)]
        self.learner = Learner.options(num_cpus=cfg.algo.num_cpus, num_gpus=cfg.algo.num_gpus).remote(
            self.model_path, self.settings, cfg.algo.lr, cfg.algo.critic_lr, cfg.algo.use_critic,
            cfg.algo.threads, cfg.experiment.seed, cfg.model.dtype)
        self.reference = (ReferenceModel.options(num_cpus=0).remote(
            self.model_path, cfg.algo.threads, cfg.model.dtype) if cfg.algo.kl_coef > 0 else None)
        stops = ray.get(self.workers[0].stop_token_ids.remote())
        self.sampling = SamplingParams(**{**self.sampling.__dict__, "stop_token_ids": stops})

    # -- stages -----------------------------------------------------------------------
    def collect(self, specs: list[EpisodeSpec], sampling: SamplingParams, seed: int):
        """Episodes spread over the workers (contiguous shares), gathered in order.

        A share whose worker (or its environment pool) died is collected again once
        Ray has restarted the actor and it has the current weights, so no trajectory
        is lost or counted twice.
        """
        shares = [s for s in np.array_split(np.arange(len(specs)), len(self.workers)) if len(s)]
        results: dict[int, list] = {}
        for attempt in range(self.cfg.rollout.max_collect_attempts):
            refs = {k: self.workers[k].collect.remote([specs[i] for i in share], sampling,
                                                      seed * 131 + k, self.cfg.rollout.max_turns)
                    for k, share in enumerate(shares) if k not in results}
            for k, ref in refs.items():
                try:
                    results[k] = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                    self.worker_failures += 1
                    self.emit("worker_failed", {"worker": k, "attempt": attempt,
                                                "error": str(exc).splitlines()[0]})
                    self.restore_worker(k)
            if len(results) == len(shares):
                return [t for k in range(len(shares)) for t in results[k]]
        raise RuntimeError(f"rollout workers failed {self.cfg.rollout.max_collect_attempts} "
                           f"times in a row; giving up on this iteration")

    def restore_worker(self, k: int) -> None:
        """Give a (restarted) worker the current weights before it collects again."""
        if self.weights_ref is None:
            return
        try:
            ray.get(self.workers[k].set_weights.remote(self.weights_ref, self.weights_version))
        except ray.exceptions.RayError:
            pass  # still restarting: the next attempt will fail and come back here

    def training_specs(self, n_groups: int, first_group_id: int) -> list[EpisodeSpec]:
        seeds = self.sampler.take(n_groups)
        return [EpisodeSpec(first_group_id + g, seed, k) for g, seed in enumerate(seeds)
                for k in range(self.cfg.rollout.group_size)]

    def select_groups(self, trajectories):
        """SNR-aware filter over whole groups (SPEC §4)."""
        groups = group_trajectories(trajectories)
        result = snr_filter([np.array([t.reward for t in ts]) for ts in groups.values()],
                            self.filter_cfg,
                            success=[np.array([t.success for t in ts]) for ts in groups.values()])
        ids = list(groups)
        kept = [t for g in result.kept_groups for t in groups[ids[g]]]
        return kept, result

    def collect_and_filter(self, iteration: int):
        """Collect a batch; with dynamic sampling, re-collect until it is full of signal."""
        cfg = self.cfg
        seed = cfg.experiment.seed * 100_003 + iteration
        collected = self.collect(self.training_specs(cfg.rollout.groups, 0), self.sampling, seed)
        kept, result = self.select_groups(collected)
        if cfg.algo.dynamic_sampling:
            informative = [t for ts in group_trajectories(kept).values()
                           if np.ptp([t.reward for t in ts]) > 0 for t in ts]
            rounds = 0
            while (len(group_trajectories(informative)) < cfg.rollout.groups
                   and rounds < cfg.algo.max_resample_rounds):
                rounds += 1
                more = self.collect(self.training_specs(cfg.rollout.groups, 1000 * rounds),
                                    self.sampling, seed + 7 * rounds)
                extra, _ = self.select_groups(more)
                informative += [t for ts in group_trajectories(extra).values()
                                if np.ptp([t.reward for t in ts]) > 0 for t in ts]
            keep_ids = list(group_trajectories(informative))[:cfg.rollout.groups]
            kept = [t for t in informative if t.group_id in keep_ids]
            result.metrics["filter/resample_rounds"] = float(rounds)
        return collected, kept, result

    def advantages(self, batch, loss_scale: float):
        a = self.cfg.algo
        params = {"gae": {"gamma": a.gamma, "lam": a.lam},
                  "reinforce_pp": {"gamma": a.gamma}}.get(a.advantage, {})
        inputs = AdvantageInputs(scores=batch.scores, group_index=batch.group_index,
                                 response_mask=batch.response_mask,
                                 token_rewards=batch.token_rewards, values=batch.values)
        batch.advantages, batch.returns = compute_advantages(a.advantage, inputs, **params)
        batch.advantages = batch.advantages * loss_scale
        return batch

    def sync_weights(self, version: int) -> None:
        self.weights_ref, self.weights_version = self.learner.state_dict.remote(), version
        for k, worker in enumerate(self.workers):
            try:
                ray.get(worker.set_weights.remote(self.weights_ref, version))
            except ray.exceptions.RayActorError:
                self.worker_failures += 1
                self.restore_worker(k)

    # -- one iteration ----------------------------------------------------------------
    def iteration(self, it: int) -> dict[str, float]:
        timers = Timers()
        with timers("collect"):
            collected, kept, filtered = self.collect_and_filter(it)
        metrics = rollout_metrics(collected, reasoning_tokens=self.count_tokens)
        metrics["rollout/tokens_per_s"] = metrics["rollout/generated_tokens"] / timers["timing/collect"]
        metrics.update(filtered.metrics)
        if kept:
            with timers("prepare"):
                batch = collate(kept, self.tokenizer.pad_token_id)
                batch = ray.get(self.learner.prepare.remote(
                    batch, self.cfg.algo.recompute_old_logprobs))
                if self.reference is not None:
                    batch.ref_logprobs = ray.get(self.reference.logprobs.remote(
                        batch, self.settings.temperature, self.settings.micro_batch_size))
            with timers("advantages"):
                batch = self.advantages(batch, filtered.loss_scale)
            with timers("update"):
                metrics.update(ray.get(self.learner.update.remote(batch)))
            with timers("sync"):
                self.sync_weights(it)
        metrics["filter/update_skipped"] = float(not kept)
        metrics["rollout/worker_failures"] = float(self.worker_failures)
        metrics.update(timers)
        metrics["timing/iteration"] = sum(timers.values())
        self.last_collected = collected
        return metrics

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def validate(self) -> dict[str, float]:
        cfg = self.cfg
        temperature = cfg.trainer.val_temperature
        sampling = SamplingParams(**{**self.sampling.__dict__, "temperature":
                                     cfg.rollout.temperature if temperature is None else temperature})
        specs = [EpisodeSpec(k, cfg.env.val_seed_offset + k, 0) for k in range(cfg.trainer.val_episodes)]
        trajectories = self.collect(specs, sampling, seed=cfg.experiment.seed + 99_991)
        m = rollout_metrics(trajectories, prefix="val", reasoning_tokens=self.count_tokens)
        return {k: v for k, v in m.items() if k in ("val/success", "val/reward_mean",
                                                     "val/format_ok_rate", "val/turns")}

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> RunSummary:
        started = time.perf_counter()
        status = "FAILED"
        val_history: dict[int, float] = {}
        metrics: dict[str, float] = {}
        try:
            self.setup()
            self.emit("started", {"run_id": self.tracker.run_id, "model_path": self.model_path})
            val = self.validate()
            val_history[0] = val["val/success"]
            self.tracker.log_metrics(val, step=0)
            self.emit("validation", {"iteration": 0, **val})
            t = self.cfg.trainer
            for it in range(1, t.iterations + 1):
                metrics = self.iteration(it)
                if it % t.val_every == 0 or it == t.iterations:
                    val = self.validate()
                    val_history[it] = val["val/success"]
                    metrics.update(val)
                self.tracker.log_metrics(metrics, step=it)
                if t.samples_per_log and (it % t.samples_every == 0 or it == 1):
                    text = "\n\n".join(transcript(tr, self.tokenizer.decode)
                                       for tr in self.last_collected[:t.samples_per_log])
                    self.tracker.log_text(text, f"samples/iter_{it:04d}.txt")
                if it % t.checkpoint_every == 0 or it == t.iterations:
                    self.checkpoint(it)
                self.iteration_done = it
                self.emit("iteration", {"iteration": it, "total": t.iterations, **metrics})
            if self.cfg.tracking.log_model:
                final_dir = self.output_dir / "models" / self.tracker.run_id
                ray.get(self.learner.save.remote(str(final_dir)))
                self.tracker.log_artifacts(final_dir, "model")
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            if self.tracker is not None:
                self.tracker.set_tags({"tether.status": status,
                                       "tether.iterations_done": self.iteration_done})
                self.tracker.finish(status)
            stop_ray(self.started_ray)
        return RunSummary(self.tracker.run_id, self.tracker.uri, self.tracker.ui_command(),
                          self.iteration_done, status, time.perf_counter() - started,
                          self.model_path, val_history, metrics)

    def checkpoint(self, it: int) -> Path:
        learner_state = ray.get(self.learner.full_state.remote())
        driver_state = {"iteration": it, "sampler_position": self.sampler.position,
                        "run_id": self.tracker.run_id, "numpy_rng": np.random.get_state(),
                        "torch_rng": torch.get_rng_state(), "config": self.cfg.model_dump(mode="json")}
        path = save_checkpoint(self.output_dir / "checkpoints" / self.tracker.run_id, it,
                               {"learner": learner_state, "driver": driver_state})
        self.tracker.set_tags({"tether.last_checkpoint": str(path)})
        return path
