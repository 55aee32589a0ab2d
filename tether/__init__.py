"""Tether: Ray-native multi-turn agent RL that detects and prevents template collapse.

Importing the package registers its environments with gymnasium (the convention for
third-party environments), so ``gymnasium.make("tether/FrozenLake-v0")`` works after
``import tether``, as does ``gymnasium.make("tether:tether/FrozenLake-v0")`` without
it.  Registration imports gymnasium and the environments, never torch or Ray.
"""

from .envs import register_all as _register_envs

__version__ = "0.1.0"

_register_envs()
