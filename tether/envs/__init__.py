"""Tether's text environments, registered with gymnasium and made by id.

    from tether.envs import make
    env = make("sokoban", stochasticity=0.1)      # or "tether/Sokoban-v0"
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("Up || Left")

``make`` returns the *unwrapped* env (no gymnasium wrappers), because the agent
loop needs the env's own methods (``rules``, ``solve``, ``demonstration``) and
must not have its text actions type-checked by a wrapper.  The same ids work
with plain ``gymnasium.make``.

This package imports neither torch nor Ray.
"""

from __future__ import annotations

import importlib
import inspect

import gymnasium as gym

from .base import MultiTurnTextEnv, SingleTurnTextEnv, TextEnv
from .countdown import CountdownEnv
from .frozenlake import FrozenLakeEnv
from .sokoban import SokobanEnv

#: short name -> (gymnasium id, entry point).  Add new envs here.
_ENVS: dict[str, tuple[str, str]] = {
    "sokoban": ("tether/Sokoban-v0", "tether.envs.sokoban:SokobanEnv"),
    "frozenlake": ("tether/FrozenLake-v0", "tether.envs.frozenlake:FrozenLakeEnv"),
    "countdown": ("tether/Countdown-v0", "tether.envs.countdown:CountdownEnv"),
    "metamathqa": ("tether/MetaMathQA-v0", "tether.envs.metamath:MetaMathQAEnv"),
    "searchqa": ("tether/SearchQA-v0", "tether.envs.searchqa:SearchQAEnv"),
    "webshop": ("tether/WebShop-v0", "tether.envs.webshop:WebShopEnv"),
    "deepcoder": ("tether/DeepCoder-v0", "tether.envs.deepcoder:DeepCoderEnv"),
    # Known-answer tasks (optimum known; the learning tests and benchmarks use them).
    "choice": ("tether/Choice-v0", "tether.envs.known_answer:ChoiceEnv"),
    "doors": ("tether/Doors-v0", "tether.envs.known_answer:DoorsEnv"),
}
ENV_IDS: tuple[str, ...] = tuple(env_id for env_id, _ in _ENVS.values())
#: Every accepted spelling, normalised (see ``_normalise``) -> gymnasium id.
SHORT_NAMES: dict[str, str] = {}
for _short, (_env_id, _) in _ENVS.items():
    SHORT_NAMES[_short] = _env_id


def _normalise(name: str) -> str:
    """``"tether/Frozen_Lake-v0"``, ``"FrozenLake"`` and ``"frozenlake"`` all -> ``"frozenlake"``."""
    key = name.strip().lower()
    if key.startswith("tether/"):
        key = key[len("tether/") :]
    if key.endswith("-v0"):
        key = key[:-3]
    return key.replace("_", "").replace("-", "").replace(" ", "")


def register_all() -> None:
    """Register every env with gymnasium; safe to call any number of times."""
    for env_id, entry_point in _ENVS.values():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)


def make(env_id: str, **kwargs) -> TextEnv:
    """Build an env by gymnasium id or short name, passing ``kwargs`` to its
    constructor.  Raises ValueError for an unknown id, listing the valid ones."""
    key = _normalise(env_id) if isinstance(env_id, str) else ""
    if key not in SHORT_NAMES:
        raise ValueError(_unknown(env_id))
    register_all()
    env = gym.make(SHORT_NAMES[key], disable_env_checker=True, **kwargs).unwrapped
    assert isinstance(env, TextEnv)
    return env


def _unknown(env_id) -> str:
    return (
        f"unknown environment {env_id!r}; valid ids: {', '.join(ENV_IDS)} "
        f"(or short names {', '.join(sorted(SHORT_NAMES))})"
    )


def env_class(env_id: str) -> type | None:
    """The class of the env of ``env_id`` (imported, not built); None for an unknown id."""
    key = _normalise(env_id) if isinstance(env_id, str) else ""
    if key not in _ENVS:
        return None
    module, _, name = _ENVS[key][1].partition(":")
    return getattr(importlib.import_module(module), name)


#: constructor arguments set by their own config fields, never by ``env.kwargs``
OWN_FIELDS = {
    "stochasticity": "env.stochasticity",
    "format_penalty": "env.format_penalty",
    "isolation": "sandbox.isolation",
}


def check_env(env_id: str, kwargs: dict) -> None:
    """Raise ValueError, naming the setting, for an unknown env id or an ``env.kwargs``
    name that the env's constructor does not take (nothing is built: a typo fails before
    Ray starts, not in every rollout worker)."""
    cls = env_class(env_id)
    if cls is None:
        raise ValueError(f"env.id: {_unknown(env_id)}")
    params = inspect.signature(cls.__init__).parameters
    takes = [
        n
        for n, p in params.items()
        if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    for name in sorted(kwargs):
        if name in OWN_FIELDS:
            raise ValueError(f"env.kwargs.{name}: set it as {OWN_FIELDS[name]}, not in env.kwargs")
        if name not in takes:
            others = ", ".join(n for n in takes if n not in OWN_FIELDS)
            raise ValueError(
                f"env.kwargs.{name}: {cls.__name__} takes no {name!r}; it takes {others}"
            )


def runs_untrusted_code(env_id: str) -> bool:
    """Whether the env of ``env_id`` executes model-written code (and so takes the
    run config's ``sandbox.isolation``); False for an unknown id."""
    return bool(getattr(env_class(env_id), "runs_untrusted_code", False))


def demonstration_options(env_id: str) -> frozenset[str]:
    """The options the env's demonstrator takes besides ``rng`` and ``noise`` (FrozenLake:
    ``restate``, ``weigh``); empty for an unknown id."""
    cls = env_class(env_id)
    if cls is None:
        return frozenset()
    return frozenset(inspect.signature(cls.demonstration).parameters) - {"self", "rng", "noise"}


def require_demonstration_options(env_id: str, options) -> None:
    """Raise ValueError, naming the setting, for a warm-start option in ``options``
    (``restate``, ``weigh``) that the env's demonstrator does not take."""
    for option in sorted(set(options) - demonstration_options(env_id)):
        raise ValueError(
            f"model.warm_start.{option}: {env_id}'s demonstrations cannot {option}; "
            "leave it false for this env"
        )


register_all()

__all__ = [
    "ENV_IDS",
    "SHORT_NAMES",
    "CountdownEnv",
    "FrozenLakeEnv",
    "MultiTurnTextEnv",
    "SingleTurnTextEnv",
    "SokobanEnv",
    "TextEnv",
    "check_env",
    "make",
    "register_all",
    "runs_untrusted_code",
]
