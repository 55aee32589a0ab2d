"""Update settings for a direct caller of the update (a test, a benchmark), built the way
a run builds them: from an ``algo`` section, by ``UpdateSettings.from_config``.

The baseline is neutral, so a test's arithmetic holds whatever the run defaults are: no
preset, no KL, no entropy bonus, token-mean aggregation; every other field is the
``algo`` section's default unless given.
"""

from __future__ import annotations

from typing import Any

from ..algos.settings import AlgoConfig
from ..algos.update import UpdateSettings

#: What the baseline sets besides the ``algo`` section's defaults.
NEUTRAL = {"preset": None, "kl_coef": 0.0, "entropy_coef": 0.0, "loss_agg": "token-mean"}


def update_settings(
    temperature: float = 1.0, iterations: int | None = None, **algo: Any
) -> UpdateSettings:
    """``UpdateSettings`` of ``AlgoConfig(**NEUTRAL, **algo)`` at sampling ``temperature``,
    for a run of ``iterations`` updates: required with a decaying ``lr_schedule`` (which
    spans them), one update otherwise."""
    config = AlgoConfig(**{**NEUTRAL, **algo})
    if iterations is None:
        if config.lr_schedule != "constant":
            raise TypeError(f"lr_schedule {config.lr_schedule} needs the run's iterations")
        iterations = 1
    return UpdateSettings.from_config(config, temperature, iterations=iterations)
