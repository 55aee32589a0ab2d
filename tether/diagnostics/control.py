"""Closed-loop responses to collapse alarms (``alarms.<name>.mode: act``).

An alarm in ``act`` mode has an ordered list of responses.  While the alarm is in breach,
the `Controller` takes the next response in its list, at most one action per iteration
across all alarms, no sooner than ``cooldown`` iterations after the previous one and no
more than ``max_actions`` in a run.  A response whose setting is already at its bound
(a filter at its floor, a coefficient at its ceiling, no grounded checkpoint to return to)
is passed over for the next one, and the pass is recorded (`Passed`: which alarm, which
response, why).  Each response may be taken ``times`` times.

The controller is pure: it reads `Knobs` (the settings it may change) and returns an
`Action` with the new knobs, and, for a rollback, the checkpoint to load; the driver
applies it.  The responses' and the controller's settings (and ``Knobs``) are schemas of
``diagnostics/settings.py``; this module is their logic.  ``state_dict()`` is JSON-safe, so a resumed run continues with the same
cursor, cooldown and count.

    controller = Controller({"template_collapse": [TightenFilter(), Rollback()]}, ControlConfig())
    controller = Controller.from_config(alarms_config)  # None when no alarm acts
    taken = controller.step(iteration, {"template_collapse": reference_iteration}, knobs, checkpoints)
    taken.response.effect(taken.target, run)   # the driver: e.g. a rollback's restore
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .settings import ALARM_NAMES, AlarmsConfig, ControlConfig, GroundedCheckpoint, Knobs, _Response


class Taken(NamedTuple):
    """A response the controller took: its record, the knobs after it, the response (whose
    ``effect`` the driver carries out) and, for a rollback, the checkpoint to return to."""

    action: Action
    knobs: Knobs
    response: _Response
    target: GroundedCheckpoint | None


@dataclass
class Action:
    """One response taken: what changed, why, and (for a rollback) where from."""

    iteration: int
    alarm: str
    kind: str
    before: dict[str, Any]
    after: dict[str, Any]
    rollback_to: dict[str, Any] | None = None

    @property
    def message(self) -> str:
        changed = [
            f"{k} {self.before[k]:.4g} -> {self.after[k]:.4g}"
            if isinstance(self.before[k], float)
            else f"{k} {self.before[k]} -> {self.after[k]}"
            for k in self.after
            if self.after[k] != self.before[k]
        ]
        where = (
            f"; weights and optimiser from iteration {self.rollback_to['iteration']} "
            f"({self.rollback_to['path']})"
            if self.rollback_to
            else ""
        )
        return f"{self.alarm} -> {self.kind}: {', '.join(changed) or 'no setting changed'}{where}"

    def to_dict(self) -> dict[str, Any]:
        """An ``alarms.json`` entry: shown beside the alarms as ``action:<kind>``."""
        return _entry("action", self)


@dataclass
class Passed:
    """A response passed over because it would have had no effect, and why."""

    iteration: int
    alarm: str
    kind: str
    why: str

    @property
    def message(self) -> str:
        return f"{self.alarm} -> {self.kind} passed over: {self.why}"

    def to_dict(self) -> dict[str, Any]:
        """An ``alarms.json`` entry, shown beside the actions as ``passed:<kind>``."""
        return _entry("passed", self)


def _entry(key: str, record: Action | Passed) -> dict[str, Any]:
    """``record`` as an act-mode ``alarms.json`` entry named ``<key>:<kind>``."""
    return {
        "name": f"{key}:{record.kind}",
        "iteration": record.iteration,
        "mode": "act",
        "message": record.message,
        "evidence": {},
        key: dataclasses.asdict(record),
    }


@dataclass
class Controller:
    responses: Mapping[str, Sequence[_Response]]
    config: ControlConfig
    #: per alarm: index of the next response, and how many times it has been taken
    cursor: dict[str, list[int]] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    #: responses passed over, in order (none of them counts as an action)
    passed: list[Passed] = field(default_factory=list)

    @classmethod
    def from_config(cls, config: AlarmsConfig) -> Controller | None:
        """The act-mode alarms' controller (None when no alarm acts)."""
        responses = {
            name: getattr(config, name).actions
            for name in ALARM_NAMES
            if getattr(config, name).mode == "act"
        }
        return cls(responses, config.control) if responses else None

    def step(
        self,
        iteration: int,
        breached: Mapping[str, int | None],
        knobs: Knobs,
        checkpoints: Sequence[GroundedCheckpoint],
    ) -> Taken | None:
        """At most one action for this iteration; ``breached`` maps each act-mode alarm now
        in breach to its reference iteration (or None)."""
        if len(self.actions) >= self.config.max_actions:
            return None
        if self.actions and iteration - self.actions[-1].iteration < self.config.cooldown:
            return None
        for name in self.responses:
            if name not in breached:
                continue
            responses = self.responses[name]
            index, used = self.cursor.setdefault(name, [0, 0])
            while index < len(responses):
                response = responses[index]
                result = response.apply(knobs, checkpoints, breached[name])
                used += 1
                if result is None or used >= response.times:
                    index, used = index + 1, 0
                self.cursor[name] = [index, used]
                if result is None:
                    why = response.passed_over(knobs, breached[name])
                    self.passed.append(Passed(iteration, name, response.kind, why))
                    continue
                new, target = result
                action = Action(
                    iteration,
                    name,
                    response.kind,
                    dataclasses.asdict(knobs),
                    dataclasses.asdict(new),
                    dataclasses.asdict(target) if target is not None else None,
                )
                self.actions.append(action)
                return Taken(action, new, response, target)
        return None

    def state_dict(self) -> dict[str, Any]:
        return {
            "cursor": {k: list(v) for k, v in self.cursor.items()},
            "actions": [dataclasses.asdict(a) for a in self.actions],
            "passed": [dataclasses.asdict(p) for p in self.passed],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.cursor = {k: list(v) for k, v in state["cursor"].items()}
        self.actions = [Action(**a) for a in state["actions"]]
        self.passed = [Passed(**p) for p in state.get("passed", [])]  # older checkpoints: none
