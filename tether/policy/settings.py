"""The policy's settings: the ``model`` section of the run config and its warm start.

Nested into the run config (``tether.platform.config``) as ``algos/settings.py`` and
``diagnostics/settings.py`` are; ``model.lora`` is ``lora.LoraConfig``.  This module
imports neither torch nor transformers, so a config is validated without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from ..sections import StrictSection
from .lora import LoraConfig


class WarmStartConfig(StrictSection):
    episodes: int = Field(
        800,
        ge=0,
        description="Demonstration episodes written by the env's "
        "solver for supervised warm start (0 = no warm start).",
    )
    noise: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="Share of imperfect demonstration "
        "turns (random actions), so the warm policy succeeds only sometimes.",
    )
    epochs: int = Field(1, ge=1, description="Passes over the demonstrations.")
    batch_size: int = Field(8, ge=1, description="Episodes per SFT step.")
    lr: float = Field(2e-3, gt=0.0, description="AdamW learning rate of the warm start.")
    weight_decay: float = Field(
        0.0,
        ge=0.0,
        description="AdamW's decoupled weight decay in both stages of the warm start. "
        "Decay makes a tiny model give up memorised shortcuts for the copying circuit "
        "sooner (FrozenLake: 1.0 makes the goal copy form on seeds where it did not "
        "form without; benchmarks/history/2026-11-27.md).",
    )
    vocab_size: int = Field(512, ge=300, description="BPE vocabulary of the project tokenizer.")
    numerals: Literal["digits", "coordinates", "numbers"] = Field(
        "digits",
        description="Tokenizer numerals: digits (one a token), coordinates ((r,c) may "
        "merge into one token: copying a position is one token), numbers (and digit runs).",
    )
    state_turn_epochs: int = Field(
        0,
        ge=0,
        description="Curriculum: passes over every turn "
        "alone (observed state, then reply) before the full episodes, "
        "where copying the state is learned in few steps (0 = none).",
    )
    state_turn_batch_size: int = Field(32, ge=1, description="Turns per step of that stage.")
    state_turn_prompt: Literal["state", "user"] = Field(
        "state",
        description="What precedes each reply in that stage: state = 'State:' and the "
        "observed state alone (shortest); user = the turn's whole user message in the "
        "chat markup, as an episode lays it out, so the copying learned there is the "
        "copying the run needs (FrozenLake: the goal copy then carries over to the "
        "episode wherever the stage learns it; benchmarks/history/2026-11-27.md).",
    )
    restate: bool = Field(
        False,
        description="Demonstration reasoning opens with the whole "
        "observed state (FrozenLake: the map's rows), where the env supports it.",
    )
    weigh: bool = Field(
        False,
        description="Demonstration reasoning first says where each move toward the goal "
        "leads (a hole, safe, the goal), then chooses after 'So', where the env supports "
        "it (FrozenLake): the choice is written after the reading it depends on.",
    )
    input_free_fraction: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Share of demonstration turns whose reasoning is one of a few fluent "
        "phrasings that name nothing of the input (tether.policy.warmstart.INPUT_FREE), the "
        "answer unchanged: a template the policy can fall into, as a pretrained model's "
        "language prior offers one (docs/collapse.md). 0 = every reasoning grounded.",
    )
    autocast: Literal["none", "bfloat16", "auto"] = Field(
        "none",
        description="Mixed precision of the warm start: bfloat16 runs its forward and "
        "backward in bfloat16 autocast (weights, AdamW state and the loss in float32), "
        "1.7x faster on a CPU with AVX512-BF16 (benchmarks/RESULTS.md, 'Mixed "
        "precision'); none = float32 throughout; auto = bfloat16 where the CPU or GPU "
        "computes it natively, else none (tether.policy.precision).",
    )
    seed: int | None = Field(
        None,
        description="Seed of the warm start (demonstrations, "
        "tokenizer, init); None = experiment.seed. Fix it to share one "
        "cached warm start across the seeds of a sweep.",
    )


class ModelConfig(StrictSection):
    path: str | None = Field(
        None,
        description="A Hugging Face causal LM directory or hub id "
        "(None: the tiny CPU model that Tether builds and warm-starts).",
    )
    size: Literal["tiny", "small", "micro", "medium", "large", "qwen05b-shape"] = Field(
        "tiny",
        description="Built model size: tiny 4.3M, small 0.59M, micro 0.16M params; "
        "medium 29.6M and large 113.7M (for cost scaling; vocabulary 512); "
        "qwen05b-shape: Qwen2.5-0.5B's shape and 151,936-token vocabulary (494M params, "
        "random init, the project tokenizer padded with filler tokens; for measuring "
        "memory and time: set warm_start.episodes=0).",
    )
    max_context: int = Field(1024, ge=64, description="Model window in tokens (tiny model).")
    cache_dir: Path = Field(
        Path.home() / ".cache" / "tether" / "models",
        description="Where the warm-started tiny model is saved and reused.",
    )
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Parameter dtype of the learner (policy, reference; AdamW keeps its "
        "state in it too, no float32 master copy), the rollout engine and the diagnostics; "
        "log-softmax and entropy are always float32.  The run's tag "
        "model.dtype_effective records what each process loaded.",
    )
    lora: LoraConfig | None = Field(
        None,
        description="LoRA adapters (peft) instead of full fine-tuning: null = train every "
        "weight; set (e.g. model.lora.r=8) = train rank-r adapters only, the KL reference "
        "is the same model with its adapters disabled (no second copy), and the rollout "
        "engines get the merged weights.  Fields: r, alpha, dropout, target_modules.",
    )

    @model_validator(mode="after")
    def _path_exists(self):
        if self.path is not None and (
            "/" not in self.path or self.path.startswith((".", "/", "~"))
        ):
            p = Path(self.path).expanduser()
            if not p.exists():
                raise ValueError(f"model path {self.path!r} does not exist")
        return self
