"""Rollout engines behind one interface; build one by name with ``make_engine``."""

from __future__ import annotations

import importlib.util

from tether.rollout.base import Generation, RolloutEngine, SamplingParams
from tether.rollout.hf import HFRolloutEngine

#: Engine kinds available in this install, by name (vllm only where the package is).
ENGINES: dict[str, type[RolloutEngine]] = {"hf": HFRolloutEngine}


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def make_engine(kind: str, model, **kwargs) -> RolloutEngine:
    """Build a rollout engine by name: ``make_engine("hf", model, pad_token_id=0)`` takes a
    loaded model, ``make_engine("vllm", "path/to/model")`` a model path (vLLM loads it)."""
    if kind == "vllm":
        if not vllm_available():
            raise ValueError("rollout engine 'vllm' needs the vllm package (pip install "
                             "'tether[vllm]' on a CUDA machine); use 'hf' on CPU")
        from tether.rollout.vllm import VLLMRolloutEngine

        return VLLMRolloutEngine(model, **kwargs)
    if kind in ENGINES:
        return ENGINES[kind](model, **kwargs)
    raise ValueError(f"unknown rollout engine {kind!r}; choose one of {sorted(ENGINES) + ['vllm']}")


__all__ = ["ENGINES", "Generation", "HFRolloutEngine", "RolloutEngine", "SamplingParams",
           "make_engine", "vllm_available"]
