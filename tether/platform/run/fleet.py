"""The rollout workers as one fleet: collection, a dead worker's restore, weight sync.

    fleet = RolloutFleet(cfg.rollout, emit)
    fleet.workers = [...]                       # from the actor pool (worker_request)
    stop_ids = fleet.start_run()                # this run's state on every worker
    trajectories = fleet.collect(specs, sampling, seed)
    handle = fleet.collect_async(specs, sampling, seed)   # non-blocking: a Collection
    trajectories = handle.result()              # what collect() returns
    fleet.sync_weights(learner)                 # learner -> every worker, version + 1

A worker (or its environment pool) that dies is restarted by Ray; the fleet waits for
it, gives it the current weights and collects its share again, counting the failure
(``rollout/worker_failures``).  So does a share sampled with weights older than the
ones the fleet had sent when the collection started (a worker restarted between
calls, which came back with the model path's weights).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import ray

from ... import seeds
from ...actors.rollout_worker import RolloutWorker
from ...agent.episode import EpisodeSpec
from ...rollout.base import SamplingParams
from ..config import RolloutConfig, TetherConfig
from .actor_pool import ActorRequest
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
        r.autocast,
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
        #: the weights the workers hold (None: the ones they loaded themselves) and their
        #: version (0: the starting weights; +1 at every sync)
        self.weights_ref, self.weights_version = None, 0
        self.pending_loads: list = []

    def start_run(self) -> list[int]:
        """This run's state on every worker (new or reused); the engine's stop tokens."""
        for k, worker in enumerate(self.workers):
            self.call_when_up(k, worker.start_run)
        return ray.get(self.workers[0].stop_token_ids.remote())

    def collect(
        self,
        specs: list[EpisodeSpec],
        sampling: SamplingParams,
        seed: int,
        max_turns: int | None = None,
    ):
        """Episodes spread over the workers (contiguous shares), gathered in order: the
        result of ``collect_async``'s handle."""
        return self.collect_async(specs, sampling, seed, max_turns).result()

    def collect_async(
        self,
        specs: list[EpisodeSpec],
        sampling: SamplingParams,
        seed: int,
        max_turns: int | None = None,
    ) -> Collection:
        """Start collecting (the shares go to the workers now) and return the handle
        whose ``result()`` waits for the episodes.  A worker runs its calls in the order
        they were sent, so the collection samples with the weights sent before it.
        ``max_turns`` caps each episode's turns (None: ``rollout.max_turns``)."""
        return Collection(self, specs, sampling, seed, max_turns)

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

    def sync_weights(self, learner, wait: bool = True) -> None:
        """Learner -> rollout workers as weight version ``weights_version + 1``: the
        gathered full weights go into the Ray object store once and every worker fetches
        them from there (the CPU path).  A GPU engine that takes weights another way
        (vLLM: NCCL broadcast / collective RPC into its workers) does it behind
        ``RolloutEngine.load_state_dict``.

        ``wait=False`` (asynchronous rollouts): the loads queue behind the collections
        the workers are running and this returns once the learner has the weights out; a
        worker that misses them is caught by the next collection's version check."""
        self.weights_ref = learner.state_dict()
        self.weights_version += 1
        loads = [
            worker.set_weights.remote(self.weights_ref, self.weights_version)
            for worker in self.workers
        ]
        if not wait:
            learner.check_alive("state_dict")  # the weights' source answered
            self.pending_loads = loads  # (dropped unread: a failed one is noticed later)
            return
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


class Collection:
    """One collection in flight: the shares were sent at construction, ``result()``
    gathers them in order, collecting a failed share again (up to
    ``rollout.max_collect_attempts`` attempts) once its worker is back with the current
    weights, so no trajectory is lost or counted twice."""

    def __init__(
        self,
        fleet: RolloutFleet,
        specs: list[EpisodeSpec],
        sampling: SamplingParams,
        seed: int,
        max_turns: int | None = None,
    ) -> None:
        self.fleet, self.specs, self.sampling, self.seed = fleet, specs, sampling, seed
        self.max_turns = fleet.rollout.max_turns if max_turns is None else max_turns
        self.shares = [
            s for s in np.array_split(np.arange(len(specs)), len(fleet.workers)) if len(s)
        ]
        self.results: dict[int, list] = {}
        self.attempt, self.last_error = 0, ""
        self.refs = self._send()

    def _send(self) -> dict:
        """The shares not collected yet, to their workers (this attempt)."""
        fleet = self.fleet
        #: the version every share of this attempt must at least be sampled with
        self.min_version = fleet.weights_version
        refs = {
            k: fleet.workers[k].collect.remote(
                [self.specs[i] for i in share],
                self.sampling,
                seeds.worker_share(self.seed, k),
                self.max_turns,
            )
            for k, share in enumerate(self.shares)
            if k not in self.results
        }
        fleet.emit(
            Event.COLLECTING,
            {
                "attempt": self.attempt,
                "workers": sorted(refs),
                "episodes": sum(len(self.shares[k]) for k in refs),
            },
        )
        return refs

    def result(self) -> list:
        fleet = self.fleet
        while True:
            for k, ref in self.refs.items():
                try:
                    share = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                    self._failed(k, first_line(exc))
                    continue
                version = min((t.policy_version for t in share), default=self.min_version)
                if version < self.min_version:
                    self._failed(
                        k,
                        f"share sampled with weight version {version} < {self.min_version} "
                        "(the worker restarted without the current weights)",
                    )
                    continue
                self.results[k] = share
            if len(self.results) == len(self.shares):
                return [t for k in range(len(self.shares)) for t in self.results[k]]
            self.attempt += 1
            if self.attempt >= fleet.rollout.max_collect_attempts:
                raise RuntimeError(
                    f"rollout workers failed {fleet.rollout.max_collect_attempts} "
                    f"times in a row; giving up on this iteration (last error: "
                    f"{self.last_error})"
                )
            self.refs = self._send()

    def _failed(self, k: int, error: str) -> None:
        fleet = self.fleet
        fleet.failures += 1
        self.last_error = error
        fleet.emit(Event.WORKER_FAILED, {"worker": k, "attempt": self.attempt, "error": error})
        fleet.restore_worker(k)

    def cancel(self) -> None:
        """Drop the collection: shares still queued on a worker are cancelled (one that
        runs finishes; its result is not read)."""
        for ref in self.refs.values():
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001 - already done, or the worker is gone
                pass
