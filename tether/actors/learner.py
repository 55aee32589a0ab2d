"""Learner and reference-model actors: state (model, optimiser) around the pure update."""

from __future__ import annotations

import math
from pathlib import Path

import ray
import torch

from ..algos.batch import TrajectoryBatch
from ..algos.update import UpdateSettings, batch_logprobs, batch_values, policy_update
from ..policy.critic import ValueModel
from ..policy.load import load_model_and_tokenizer


@ray.remote(max_restarts=0)
class Learner:
    def __init__(self, model_path: str, settings: UpdateSettings, lr: float, critic_lr: float,
                 use_critic: bool, threads: int, seed: int, dtype: str = "float32") -> None:
        torch.set_num_threads(max(1, math.ceil(threads)))
        torch.manual_seed(seed)
        self.model, self.tokenizer = load_model_and_tokenizer(model_path, dtype)
        self.settings = settings
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.critic = ValueModel(model_path) if use_critic else None
        self.critic_optimizer = (torch.optim.AdamW(self.critic.parameters(), lr=critic_lr)
                                 if self.critic is not None else None)
        self.updates = 0
        self.extractor = None

    def prepare(self, batch: TrajectoryBatch, recompute_old_logprobs: bool) -> TrajectoryBatch:
        """Old-policy log-probs (and critic values) before the update.

        The sampler ran on exactly these weights, so its log-probs are the old
        policy's; recomputing them is a full forward pass spent on the same numbers.
        """
        s = self.settings
        if recompute_old_logprobs:
            batch.old_logprobs = batch_logprobs(self.model, batch, s.temperature, s.micro_batch_size)
        else:
            batch.old_logprobs = batch.sampling_logprobs.clone()
        if self.critic is not None:
            batch.values = batch_values(self.critic, batch, s.micro_batch_size)
        return batch

    def update(self, batch: TrajectoryBatch) -> dict[str, float]:
        metrics = policy_update(self.model, self.optimizer, batch, self.settings,
                                seed=self.updates, critic=self.critic,
                                critic_optimizer=self.critic_optimizer)
        self.updates += 1
        return metrics

    def diagnose(self, trajectories, diagnostics_cfg, ema_state: dict | None, seed: int,
                 keep_matrices: bool, information_chain: bool = True):
        """Cross-score MI proxies with the current (pre-update) policy."""
        from ..agent.chat import ChatFormatter
        from ..agent.pairs import SpanExtractor
        from ..diagnostics.runner import collapse_diagnostics

        if self.extractor is None:
            self.extractor = SpanExtractor(ChatFormatter(self.tokenizer))
        with torch.no_grad():
            return collapse_diagnostics(
                self.model, trajectories, self.extractor, diagnostics_cfg.samplings,
                diagnostics_cfg.max_pairs, self.settings.temperature, ema_state, seed,
                information_chain, diagnostics_cfg.method, keep_matrices,
                max_cells=diagnostics_cfg.max_cells)

    def grad_snr(self, batch: TrajectoryBatch, n_buckets: int) -> dict[str, float]:
        from ..diagnostics.runner import gradient_snr

        return gradient_snr(self.model, batch, self.settings, n_buckets)

    def state_dict(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def save(self, path: str) -> str:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        return path

    def full_state(self) -> dict:
        """Everything a checkpoint needs to resume the learner."""
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "updates": self.updates, "torch_rng": torch.get_rng_state()}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
        return state

    def load_full_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]
        torch.set_rng_state(state["torch_rng"])
        if self.critic is not None and "critic" in state:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])


@ray.remote(max_restarts=-1, max_task_retries=3)
class ReferenceModel:
    """The frozen initial policy, for the KL regulariser."""

    def __init__(self, model_path: str, threads: int, dtype: str = "float32") -> None:
        torch.set_num_threads(max(1, math.ceil(threads)))
        self.model, _ = load_model_and_tokenizer(model_path, dtype)

    def logprobs(self, batch: TrajectoryBatch, temperature: float, micro_batch_size: int):
        return batch_logprobs(self.model, batch, temperature, micro_batch_size)
