"""Rollout engines behind one interface; build one by name with ``make_engine``."""

from __future__ import annotations

from tether.rollout.base import Generation, RolloutEngine, SamplingParams
from tether.rollout.hf import HFRolloutEngine

#: Engine kinds available in this install, by name.
ENGINES: dict[str, type[RolloutEngine]] = {"hf": HFRolloutEngine}


def make_engine(kind: str, model, **kwargs) -> RolloutEngine:
    """Build a rollout engine by name, e.g. ``make_engine("hf", model, pad_token_id=0)``."""
    if kind in ENGINES:
        return ENGINES[kind](model, **kwargs)
    if kind == "vllm":
        raise ValueError("rollout engine 'vllm' is not available in this version of Tether "
                         "(planned: issue 4); use 'hf'")
    raise ValueError(f"unknown rollout engine {kind!r}; choose one of {sorted(ENGINES)}")


__all__ = ["ENGINES", "Generation", "HFRolloutEngine", "RolloutEngine", "SamplingParams", "make_engine"]
