"""The rollout workers as one fleet: collection, a dead worker's restore, weight sync.

    fleet = RolloutFleet(cfg.rollout, emit)
    fleet.workers = [...]                       # from the actor pool (worker_request)
    stop_ids = fleet.start_run()                # this run's state on every worker
    trajectories = fleet.collect(specs, sampling, seed)
    fleet.sync_weights(learner, iteration)      # learner -> every worker

A worker (or its environment pool) that dies is restarted by Ray; the fleet waits for
it, gives it the current weights and collects its share again, counting the failure
(``rollout/worker_failures``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import ray

from .. import seeds
from ..actors.rollout_worker import RolloutWorker
from ..agent.episode import EpisodeSpec
from ..rollout.base import SamplingParams
from .actor_pool import ActorRequest
from .config import RolloutConfig, TetherConfig
from .events import Event


def first_line(exc: BaseException) -> str:
    """The line of a (Ray-wrapped) error that says what happened, not where."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    cause = getattr(exc, "cause", None)
    if cause is not None and str(cause).strip():
        return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1]}"
    return lines[0] if lines else type(exc).__name__


def worker_request(cfg: TetherConfig, model_path: str) -> ActorRequest:
    """The rollout workers, keyed by all their constructor and resource options take,
    so a pool reuses workers only where new ones would be equal."""
    r = cfg.rollout
    options = {"num_cpus": r.num_cpus_per_worker, "num_gpus": r.num_gpus_per_worker}
    args = (
        model_path,
        cfg.env.id,
        cfg.env_kwargs(),
        r.engine,
        r.num_cpus_per_worker,
        cfg.model.dtype,
        r.engine_kwargs,
        cfg.experiment.seed,
    )

    def end_workers(workers) -> None:  # a worker's environment pool goes with it
        for worker in workers:
            ray.kill(worker, no_restart=True)

    return ActorRequest(
        "rollout_workers",
        (r.num_workers, options, args),
        create=lambda: [
            RolloutWorker.options(**options).remote(*args) for _ in range(r.num_workers)
        ],
        end=end_workers,
    )


class RolloutFleet:
    def __init__(self, rollout: RolloutConfig, emit: Callable[[str, dict], None]) -> None:
        self.rollout, self.emit = rollout, emit
        self.workers: list = []
        #: worker deaths survived so far in this run (a checkpoint keeps it)
        self.failures = 0
        #: the weights the workers hold (None: the ones they loaded themselves)
        self.weights_ref, self.weights_version = None, 0

    def start_run(self) -> list[int]:
        """This run's state on every worker (new or reused); the engine's stop tokens."""
        for k, worker in enumerate(self.workers):
            self.call_when_up(k, worker.start_run)
        return ray.get(self.workers[0].stop_token_ids.remote())

    def collect(self, specs: list[EpisodeSpec], sampling: SamplingParams, seed: int):
        """Episodes spread over the workers (contiguous shares), gathered in order.

        A share whose worker (or its environment pool) died is collected again once
        Ray has restarted the actor and it has the current weights, so no trajectory
        is lost or counted twice.
        """
        shares = [s for s in np.array_split(np.arange(len(specs)), len(self.workers)) if len(s)]
        results: dict[int, list] = {}
        last_error = ""
        for attempt in range(self.rollout.max_collect_attempts):
            refs = {
                k: self.workers[k].collect.remote(
                    [specs[i] for i in share],
                    sampling,
                    seeds.worker_share(seed, k),
                    self.rollout.max_turns,
                )
                for k, share in enumerate(shares)
                if k not in results
            }
            self.emit(
                Event.COLLECTING,
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
                    self.failures += 1
                    last_error = first_line(exc)
                    self.emit(
                        Event.WORKER_FAILED, {"worker": k, "attempt": attempt, "error": last_error}
                    )
                    self.restore_worker(k)
            if len(results) == len(shares):
                return [t for k in range(len(shares)) for t in results[k]]
        raise RuntimeError(
            f"rollout workers failed {self.rollout.max_collect_attempts} "
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
        deadline = time.monotonic() + self.rollout.restart_timeout_s
        while True:
            try:
                return ray.get(method.remote(*args))
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"rollout worker {k} did not come back within "
                        f"rollout.restart_timeout_s = "
                        f"{self.rollout.restart_timeout_s} s"
                    ) from None
                time.sleep(0.25)

    def sync_weights(self, learner, version: int) -> None:
        """Learner -> rollout workers: the gathered full weights go into the Ray object
        store once and every worker fetches them from there (the CPU path).  A GPU
        engine that takes weights another way (vLLM: NCCL broadcast / collective RPC
        into its workers) does it behind ``RolloutEngine.load_state_dict``."""
        self.weights_ref, self.weights_version = learner.state_dict(), version
        loads = [worker.set_weights.remote(self.weights_ref, version) for worker in self.workers]
        for k, load in enumerate(loads):
            try:
                ray.get(load)
            except ray.exceptions.RayActorError:
                learner.check_alive("state_dict")  # the weights' source, not the worker?
                self.failures += 1
                self.restore_worker(k)

    def dtypes(self) -> list[str]:
        """The parameters' dtype as each worker loaded them."""
        return ray.get([w.dtype_effective.remote() for w in self.workers])

    def peak_rss_gb(self) -> dict[str, float]:
        """Each live worker's peak resident memory (GiB) since its previous reading."""
        # All workers are asked at once; one answer is awaited at a time so that a dead
        # worker (restarted at the next collect) costs only its own reading.
        readings = [worker.peak_rss_gb.remote() for worker in self.workers]
        peaks = {}
        for k, reading in enumerate(readings):
            try:
                peaks[f"rollout_worker{k}"] = ray.get(reading)
            except ray.exceptions.RayActorError:
                pass
        return peaks
