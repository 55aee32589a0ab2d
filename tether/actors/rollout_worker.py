"""Rollout-worker actor: an engine, a chat formatter and its own environment-pool actor."""

from __future__ import annotations

import math

import ray
import torch

from ..agent.chat import ChatFormatter
from ..agent.episode import EpisodeSpec, run_episodes
from ..agent.types import Trajectory
from ..policy.load import load_model, load_model_and_tokenizer, load_tokenizer
from ..policy.precision import resolve_autocast
from ..rollout import make_engine_for
from ..rollout.base import SamplingParams
from .env_pool import EnvPoolActor, RemoteEnvBatch
from .memory import peak_rss_gb


# Readings ("status") run on their own thread: with asynchronous rollouts a worker is
# busy collecting ahead when the driver asks, and must not make it wait for that.
@ray.remote(max_restarts=-1, max_task_retries=0, concurrency_groups={"status": 1})
class RolloutWorker:
    def __init__(
        self,
        model_path: str,
        env_id: str,
        env_kwargs: dict,
        engine: str,
        threads: float,
        dtype: str = "float32",
        engine_kwargs: dict | None = None,
        seed: int = 0,
        autocast: str = "none",
    ) -> None:
        torch.set_num_threads(max(1, math.ceil(threads)))
        self.model_path, self.dtype = model_path, dtype
        if engine == "vllm":  # vLLM loads the weights itself; here only the tokenizer
            self.tokenizer = load_tokenizer(model_path)
            model = str(model_path)
            engine_kwargs = {"dtype": dtype, "seed": seed, **(engine_kwargs or {})}
        else:
            model, self.tokenizer = load_model_and_tokenizer(model_path, dtype)
            device = str((engine_kwargs or {}).get("device", "cpu")).split(":")[0]
            engine_kwargs = {
                "autocast": resolve_autocast(autocast, device),
                **(engine_kwargs or {}),
            }
        self.formatter = ChatFormatter(self.tokenizer)
        self.engine = make_engine_for(engine, model, self.tokenizer, **(engine_kwargs or {}))
        self.env_pool = EnvPoolActor.options(num_cpus=0).remote(env_id, env_kwargs)
        self.envs = RemoteEnvBatch(self.env_pool)
        self.weights_version = -1

    def start_run(self) -> None:
        """Per-run state, the same for a new worker and one a pool reuses: the model path's
        weights (loaded again only if a run changed them: ``set_weights`` sets a version
        >= 0) and the environment pool's counters.  Everything else is per call (seeds,
        sampling) or fixed by the constructor's arguments."""
        if self.weights_version != -1:
            initial = load_model(self.model_path, self.dtype).state_dict()
            self.engine.load_state_dict(initial)
            self.weights_version = -1
        ray.get(self.env_pool.start_run.remote())

    def stop_token_ids(self) -> tuple[int, ...]:
        return self.formatter.stop_token_ids()

    def set_weights(self, state_dict: dict, version: int) -> int:
        self.engine.load_state_dict(state_dict)
        self.weights_version = version
        return version

    def collect(
        self,
        specs: list[EpisodeSpec],
        sampling: SamplingParams,
        seed: int,
        max_turns: int | None = None,
    ) -> list[Trajectory]:
        """The episodes, each stamped with the weight version that sampled them (weights
        change only between calls: an actor runs one call at a time)."""
        trajectories = run_episodes(
            self.engine, self.formatter, self.envs, specs, sampling, seed, max_turns=max_turns
        )
        for trajectory in trajectories:  # -1: the model path's own weights, version 0
            trajectory.policy_version = max(self.weights_version, 0)
        return trajectories

    @ray.method(concurrency_group="status")
    def peak_rss_gb(self) -> float:
        """Peak resident memory (GiB) since the previous call (`memory.peak_rss_gb`)."""
        return peak_rss_gb(reset=True)

    def dtype_effective(self) -> str:
        """The dtype of the engine's parameters as loaded; an engine that loads its own
        weights out of reach (vLLM) reports the dtype it was asked for, marked so."""
        model = getattr(self.engine, "model", None)
        if isinstance(model, torch.nn.Module):
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
            autocast = getattr(self.engine, "autocast", "none")
            return dtype if autocast == "none" else f"{dtype} ({autocast} autocast)"
        return f"{self.dtype} (requested)"

    def env_pool_handle(self):
        return self.env_pool
