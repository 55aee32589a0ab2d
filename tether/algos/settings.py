"""The algorithm's settings: the ``algo`` and ``filter`` sections of the run config.

One pydantic model per group, nested into the run config (``tether.platform.config``)
the way ``AlarmsConfig`` is.  Every name a field may take is the key set of the
registry that implements it (``ADVANTAGE_ESTIMATORS``, ``AGGREGATION_MODES``,
``KL_ESTIMATORS``, ``FILTER_STRATEGIES``, ``LOSS_SCALINGS``, ``PRESETS``); the
tuples below spell those names without importing torch, and a test keeps each
tuple equal to its registry.  This module imports neither torch nor Ray, so a
config is validated (and a bad one refused) without either.

See docs/methods.md for what each setting computes.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from ..sections import StrictSection
from .presets import PRESETS

#: ``advantages.ADVANTAGE_ESTIMATORS``
ADVANTAGE_NAMES = ("gae", "grpo", "drgrpo", "rloo", "reinforce_pp")
#: ``losses.AGGREGATION_MODES``
AGGREGATION_NAMES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "turn-mean-token-mean",
)
#: ``losses.KL_ESTIMATORS``
KL_ESTIMATOR_NAMES = ("k1", "k2", "k3", "abs", "low_var_kl")
#: ``filters.FILTER_STRATEGIES``
FILTER_STRATEGY_NAMES = ("none", "top_p", "top_k", "top_k_abs", "min_p")
#: ``filters.FILTER_METRICS``
FILTER_METRIC_NAMES = ("reward_std", "reward_variance")
#: ``filters.FILTER_REWARDS``
FILTER_REWARD_NAMES = ("shaped", "outcome")
#: ``filters.LOSS_SCALINGS``
LOSS_SCALING_NAMES = ("none", "linear", "sqrt")
#: ``losses.OFF_POLICY_CORRECTIONS`` and "none"
OFF_POLICY_NAMES = ("none", "tis", "decoupled")
#: ``presets.PRESETS``
PRESET_NAMES = ("ppo", "grpo", "drgrpo", "dapo")


class AlgoConfig(StrictSection):
    """Advantages, policy loss, regularisers, optimiser and learner resources."""

    preset: Literal[PRESET_NAMES] | None = Field(
        "grpo", description="Algorithm preset; explicitly set fields override it."
    )
    advantage: Literal[ADVANTAGE_NAMES] = Field(
        "grpo", description="Advantage estimator (docs/methods.md, section 7)."
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount (gae, reinforce_pp).")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda.")
    loss_agg: Literal[AGGREGATION_NAMES] = Field(
        "seq-mean-token-mean", description="Loss aggregation mode."
    )
    clip_low: float = Field(0.2, ge=0.0, le=1.0, description="PPO lower clip ε_low.")
    clip_high: float = Field(
        0.28, ge=0.0, le=10.0, description="PPO upper clip ε_high (0.28 = DAPO clip-higher)."
    )
    dual_clip: float | None = Field(
        None,
        gt=1.0,
        description="Dual-clip constant c > 1: caps "
        "the loss of a negative-advantage token at −A·c (None = off).",
    )
    kl_coef: float = Field(
        0.0, ge=0.0, description="KL-to-reference coefficient (0 = no reference model)."
    )
    kl_estimator: Literal[KL_ESTIMATOR_NAMES] = Field(
        "k3", description="Per-token KL estimator: k1, k2, k3, abs, or low_var_kl (k3 clamped)."
    )
    entropy_coef: float = Field(
        0.001, ge=0.0, description="Entropy bonus (RAGEN-2 uses 0.001; docs/methods.md §8)."
    )
    format_coef: float = Field(
        0.0,
        ge=0.0,
        description="Weight of the format term: a clipped policy-gradient term that pushes "
        "malformed replies down and well-formed ones up, its advantage centred on the "
        "batch's share of malformed replies instead of a group's rewards, so it keeps the "
        "reply format without giving a group whose episodes all fail a reward spread "
        "(env.format_penalty does). Counted with the regularisers (docs/methods.md).",
    )
    lr: float = Field(
        1e-4, gt=0.0, description="Policy learning rate (tiny model; RAGEN-2 uses 1e-6 for 3B)."
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="Policy learning rate over the run: constant, or from lr down toward 0 "
        "at the end of the last iteration, linearly (TRL's default) or on a half cosine; "
        "logged as actor/lr (docs/methods.md).",
    )
    critic_lr: float = Field(5e-4, gt=0.0, description="Critic learning rate (gae).")
    adam_eps: float = Field(
        1e-8,
        gt=0.0,
        description="AdamW epsilon of the policy optimiser (torch's default 1e-8). Near "
        "the gradients' typical size it damps the full-size steps AdamW gives weights "
        "whose gradient is mostly noise (docs/methods.md).",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch.")
    minibatches: int = Field(1, ge=1, description="Optimiser steps per epoch.")
    micro_batch_size: int = Field(
        16,
        ge=1,
        description="Trajectories per forward/backward (gradient accumulation; memory only).",
    )
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    logprob_chunk_tokens: int = Field(
        1024,
        ge=0,
        description="Token positions per chunk of the "
        "vocabulary head, float32 log-softmax and entropy in the learner and the "
        "diagnostics (memory only: at most this many x vocab logits exist at once; "
        "0 = all positions at once).",
    )
    autocast: Literal["none", "bfloat16", "auto"] = Field(
        "none",
        description="Mixed precision of the learner's forwards (update, recomputed "
        "old-policy and reference log-probs): bfloat16 runs the transformer body in "
        "bfloat16 autocast; the weights, AdamW state, vocabulary head, log-softmax and "
        "loss stay float32 (1.5x faster updates on a CPU with AVX512-BF16, "
        "benchmarks/RESULTS.md, 'Mixed precision'); none = as model.dtype throughout; "
        "auto = bfloat16 where the learner's CPU or GPU computes it natively, else none "
        "(decided in the learner process; the tag model.dtype_effective says which).",
    )
    dynamic_sampling: bool = Field(
        False, description="DAPO: drop zero-variance groups and re-collect until the batch is full."
    )
    max_resample_rounds: int = Field(
        3, ge=0, description="Re-collection rounds (dynamic sampling)."
    )
    shared_prefix: bool = Field(
        True,
        description="Learner forwards run each GRPO group's "
        "common prompt once per micro-batch (rows ordered by group); the "
        "same loss and gradients as the plain forward, on fewer tokens.",
    )
    recompute_old_logprobs: bool = Field(
        False,
        description="Recompute old-policy log-probs "
        "in the learner instead of reusing the sampler's (they "
        "agree when weights sync every iteration; recompute "
        "when the engine's numerics differ, e.g. vLLM).",
    )
    off_policy: Literal[OFF_POLICY_NAMES] = Field(
        "none",
        description="Off-policy correction of the policy-gradient term by the behaviour "
        "weight w = π_old/π_behaviour per token (π_old: the learner's recomputed "
        "log-probs, π_behaviour: the sampler's): none; tis = min(w, tis_cap) (truncated "
        "importance sampling, Yao et al. 2025, veRL/SkyRL); decoupled = AReaL's decoupled "
        "PPO (Fu et al. 2025): π_old is the proximal policy, tokens with w > "
        "decoupled_cap are left out. Both need recompute_old_logprobs: true "
        "(docs/methods.md, asynchronous rollouts).",
    )
    tis_cap: float = Field(
        2.0, gt=0.0, description="Truncation C of the tis weight min(w, C) (Yao et al. use 2)."
    )
    decoupled_cap: float = Field(
        5.0,
        gt=1.0,
        description="decoupled: tokens whose behaviour weight w exceeds this are left out "
        "of the loss (AReaL's behav_imp_weight_cap; must be > 1).",
    )
    use_critic: bool = Field(False, description="Train a value model (gae).")
    learner_world_size: int = Field(
        1,
        ge=1,
        description="Learner ranks: Ray actors forming "
        "one torch.distributed group (gloo on CPU, NCCL on GPU) "
        "that shards policy, critic and reference with FSDP2 "
        "(1 = a single unsharded learner).",
    )
    num_cpus: float = Field(1.0, ge=0.0, description="Ray CPUs of each learner rank.")
    num_gpus: float = Field(
        0.0,
        ge=0.0,
        description="Ray GPUs of each learner rank (> 0 "
        "puts the learner on GPU, NCCL between ranks).",
    )
    threads: int = Field(2, ge=1, description="torch threads of each learner rank.")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        preset = data.get("preset", "grpo")
        if preset is None:
            return data
        if preset not in PRESETS:
            return data  # the Literal check reports it
        merged = {k: v for k, v in PRESETS[preset].items() if k in cls.model_fields}
        merged.update(data)  # explicit values (and unknown keys, for the error) win
        return merged

    @model_validator(mode="after")
    def _consistent(self):
        if self.advantage == "gae" and not self.use_critic:
            raise ValueError("advantage 'gae' needs use_critic: true")
        if self.off_policy != "none" and not self.recompute_old_logprobs:
            raise ValueError(
                f"off_policy {self.off_policy!r} needs recompute_old_logprobs: true (its "
                "weight compares the learner's log-probs with the sampler's; without "
                "recomputing they are the same numbers)"
            )
        return self


class FilterConfig(StrictSection):
    """The SNR-aware filter: which prompt groups train (docs/methods.md, section 5)."""

    strategy: Literal[FILTER_STRATEGY_NAMES] = Field(
        "top_p", description="SNR-aware filter: which prompt groups train."
    )
    value: float = Field(
        0.9,
        ge=0.0,
        description="ρ for top_p, fraction for top_k, count for top_k_abs, ratio for min_p.",
    )
    mode: Literal["linear", "softmax"] = Field(
        "linear", description="top_p mode: linear (score mass) or softmax (probability mass)."
    )
    metric: Literal[FILTER_METRIC_NAMES] = Field(
        "reward_std",
        description="Group score the strategies rank by: reward_std (RAGEN's code; the "
        "default, docs/methods.md section 5 says why) or reward_variance (the paper's text). "
        "top_k / top_k_abs rank alike on both; top_p (cumulative mass) and min_p (ratio to "
        "the best) can keep different groups.",
    )
    reward: Literal[FILTER_REWARD_NAMES] = Field(
        "shaped",
        description="What the group score is the spread of: shaped (each episode's whole "
        "reward, format penalties and partial credit included; the default) or outcome "
        "(its task success, 1 or 0, so a group in which every episode failed scores 0). "
        "Only which groups train changes; advantages stay on the shaped reward.",
    )
    ddof: int = Field(1, ge=0, description="Degrees of freedom of the group std/var.")
    include_zero: bool = Field(False, description="Keep zero-score groups eligible (top_p).")
    loss_scaling: Literal[LOSS_SCALING_NAMES] = Field(
        "none",
        description="Scale advantages (so the task loss) by the kept ratio (linear: the "
        "paper's rescaling after filtering, used by experiments/paper/) or its root (sqrt); "
        "none keeps them.",
    )
    selection_eps: float = Field(
        0.01,
        ge=0.0,
        description="Linear top_p keeps groups until "
        "their score mass reaches ρ·Σs − selection_eps.",
    )
    zero_tol: float = Field(
        1e-10, ge=0.0, description="A group scoring at most this counts as zero-variance."
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_score(cls, data: Any) -> Any:
        """``score: std | var`` (the setting's name before ``metric``, e.g. in the config a
        checkpoint saved) is read as ``metric``; a ``metric`` given too wins (a resume's
        override of an old run's config)."""
        if isinstance(data, dict) and "score" in data:
            data = dict(data)
            legacy = data.pop("score")
            if "metric" in data:
                return data
            names = {"std": "reward_std", "var": "reward_variance"}
            if legacy not in names:
                raise ValueError(f"score must be std or var (got {legacy!r}); use `metric`")
            data["metric"] = names[legacy]
        return data

    @model_validator(mode="after")
    def _value_range(self):
        if not math.isfinite(self.value):
            raise ValueError(f"value must be a finite number (got {self.value})")
        if self.strategy in ("top_p", "top_k", "min_p") and not 0.0 <= self.value <= 1.0:
            raise ValueError(f"value must be in [0, 1] for strategy {self.strategy!r}")
        if self.strategy == "top_k_abs" and self.value < 1:
            raise ValueError(
                f"value for top_k_abs is a group count and must be ≥ 1 (got "
                f"{self.value}; a fraction is truncated)"
            )
        return self
