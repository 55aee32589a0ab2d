"""Reading accuracy of first turns (``grounding/…``): what the reasoning states about the
input, scored against the true state of each level (``envs/reading.py``), with 95 %
Wilson intervals.  Pure (no Ray); docs/methods.md, section 2, "Reading accuracy"."""

from __future__ import annotations

from ..envs import make
from ..envs.reading import reading_checks, reading_defined
from .metrics import _proportion_interval
from .types import Trajectory


def grounding_metrics(
    trajectories: list[Trajectory], env_id: str, env_kwargs: dict | None = None
) -> dict[str, float]:
    """``grounding/<check>`` (share of levels, with ``_ci_low`` / ``_ci_high``) over the first
    turn of each trajectory, ``grounding/reading_acc`` (every fact of the input right),
    ``grounding/levels`` and ``grounding/defined`` (1; 0 with nothing else for an env
    without a checker).  A trajectory without a first turn counts as read wrong."""
    env = make(env_id, **dict(env_kwargs or {}))
    if not reading_defined(env):
        return {"grounding/defined": 0.0}
    hits: dict[str, int] = {}
    for trajectory in trajectories:
        env.reset(seed=int(trajectory.env_seed))
        turn = trajectory.turns[0] if trajectory.turns else None
        checks = reading_checks(env, turn and turn.reasoning, turn and turn.answer)
        if turn is None:
            checks = {key: False for key in checks}
        for key, ok in checks.items():
            hits[key] = hits.get(key, 0) + int(bool(ok))
    n = len(trajectories)
    out = {"grounding/defined": 1.0, "grounding/levels": float(n)}
    for key, count in hits.items():
        name = "grounding/reading_acc" if key == "reading" else f"grounding/{key}"
        out[name] = count / n
        out.update(_proportion_interval(name, count, n))
    return out
