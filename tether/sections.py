"""The base of every config section: one strictness for the whole run config.

Every section of the run config (``tether.platform.config``), the sections the pure
core owns (``algos/settings.py``, ``diagnostics/settings.py``, ``policy/settings.py``,
``policy/lora.py``, ``envs/sandbox/isolation.py``) and the sweep spec's
(``platform/sweep/spec.py``) derive from ``StrictSection``: an unknown key is an error
(a misspelt field never passes silently as a default), and a value assigned after
construction is validated like one given to the constructor.  This module imports
only pydantic, so every layer may use it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictSection"]


class StrictSection(BaseModel):
    """A config section: unknown keys refused, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
