"""The environment's settings: the ``env`` section of the run config.

Nested into the run config (``tether.platform.config``) as ``algos/settings.py`` is; the
``sandbox`` section is ``sandbox/isolation.py``'s ``SandboxConfig``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ..sections import StrictSection


class EnvConfig(StrictSection):
    id: str = Field(
        "tether/FrozenLake-v0",
        description="Environment id, e.g. tether/Sokoban-v0, "
        "tether/FrozenLake-v0, tether/Countdown-v0 (short names work too).",
    )
    stochasticity: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Noise p in [0, 1]: "
        "random action replacement (multi-turn) or reward replacement "
        "(single-turn).",
    )
    format_penalty: float = Field(
        -0.1, le=0.0, description="Reward for an unparseable or invalid reply (no env step)."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra constructor arguments of the env (e.g. size, frozen_fraction, "
        "dim); a name its constructor does not take fails when the config is read.",
    )
    val_seed_offset: int = Field(
        1_000_000,
        ge=1,
        description="Held-out validation levels use "
        "seeds from this offset on; training seeds stay below it.",
    )
