"""Closed-loop responses to collapse alarms (``alarms.<name>.mode: act``).

An alarm in ``act`` mode has an ordered list of responses.  While the alarm is in breach,
the `Controller` takes the next response in its list, at most one action per iteration
across all alarms, no sooner than ``cooldown`` iterations after the previous one and no
more than ``max_actions`` in a run.  A response whose setting is already at its bound
(a filter at its floor, a coefficient at its ceiling, no grounded checkpoint to return to)
is passed over for the next one.  Each response may be taken ``times`` times.

The controller is pure: it reads `Knobs` (the settings it may change) and returns an
`Action` with the new knobs, and, for a rollback, the checkpoint to load; the driver
applies it.  ``state_dict()`` is JSON-safe, so a resumed run continues with the same
cursor, cooldown and count.

    controller = Controller({"template_collapse": [TightenFilter(), Rollback()]}, ControlConfig())
    action = controller.step(iteration, {"template_collapse": reference_iteration}, knobs, checkpoints)
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class Knobs:
    """The settings a response may change, as the run uses them now."""

    filter_strategy: str
    filter_value: float
    kl_coef: float
    entropy_coef: float
    lr: float

    def metrics(self) -> dict[str, float]:
        """``control/…`` metrics: the settings in force this iteration."""
        return {
            "control/filter_value": self.filter_value,
            "control/kl_coef": self.kl_coef,
            "control/entropy_coef": self.entropy_coef,
            "control/lr": self.lr,
        }


@dataclass(frozen=True)
class GroundedCheckpoint:
    """A checkpoint saved while MI was significantly above its null."""

    iteration: int
    path: str


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")
    times: int = Field(1, ge=1, description="how many times this response may be taken in a run")

    @abc.abstractmethod
    def apply(
        self, knobs: Knobs, checkpoints: Sequence[GroundedCheckpoint], reference: int | None
    ) -> tuple[Knobs, GroundedCheckpoint | None] | None:
        """The new knobs (and a checkpoint to load), or None when this response has no effect."""


class TightenFilter(_Response):
    """Train on fewer, higher-signal groups: top_p / top_k / top_k_abs value times ``factor``
    (not below ``floor``); min_p ratio divided by ``factor`` (not above 1); no filter becomes
    top_p at ``start``."""

    kind: Literal["tighten_filter"] = "tighten_filter"
    factor: float = Field(0.8, gt=0, lt=1)
    floor: float = Field(
        0.3, gt=0, description="lowest top_p ratio / top_k fraction (top_k_abs: 1 group)"
    )
    start: float = Field(0.9, gt=0, le=1, description="top_p ratio when the run had no filter")

    def apply(self, knobs, checkpoints, reference):
        strategy, value = knobs.filter_strategy, knobs.filter_value
        if strategy == "none":
            new = ("top_p", max(self.start, self.floor))
        elif strategy == "min_p":
            new = (strategy, min(1.0, value / self.factor))
        elif strategy == "top_k_abs":
            new = (strategy, float(max(1, min(value - 1, int(value * self.factor)))))
        elif value <= self.floor:
            return None
        else:
            new = (strategy, max(self.floor, value * self.factor))
        if new == (strategy, value):
            return None
        return dataclasses.replace(knobs, filter_strategy=new[0], filter_value=new[1]), None


class _Raise(_Response):
    factor: float = Field(2.0, gt=1)
    initial: float = Field(0.001, gt=0, description="value taken when the coefficient is 0")
    ceiling: float = Field(0.1, gt=0)
    knob: ClassVar[str] = ""

    def apply(self, knobs, checkpoints, reference):
        value = getattr(knobs, self.knob)
        new = min(self.ceiling, value * self.factor if value > 0 else self.initial)
        if new <= value:
            return None
        return dataclasses.replace(knobs, **{self.knob: new}), None


class RaiseKl(_Raise):
    """Hold the policy nearer its initial (grounded) self: KL coefficient times ``factor``
    (``initial`` when it was 0: the learner then loads the reference policy)."""

    kind: Literal["raise_kl"] = "raise_kl"
    knob: ClassVar[str] = "kl_coef"


class RaiseEntropy(_Raise):
    """Entropy bonus times ``factor`` (``initial`` when it was 0)."""

    kind: Literal["raise_entropy"] = "raise_entropy"
    ceiling: float = Field(0.01, gt=0)
    knob: ClassVar[str] = "entropy_coef"


class Rollback(_Response):
    """Load the last checkpoint saved while MI was significantly above its null, at or before
    the alarm's reference point (weights and optimiser state), and multiply the learning
    rate by ``lr_factor``.  Uses the run's checkpoints (``trainer.checkpoint_every``)."""

    kind: Literal["rollback"] = "rollback"
    lr_factor: float = Field(0.5, gt=0, le=1)

    def apply(self, knobs, checkpoints, reference):
        eligible = [c for c in checkpoints if reference is None or c.iteration <= reference]
        if not eligible:
            return None
        target = max(eligible, key=lambda c: c.iteration)
        return dataclasses.replace(knobs, lr=knobs.lr * self.lr_factor), target


Response = Annotated[TightenFilter | RaiseKl | RaiseEntropy | Rollback, Field(discriminator="kind")]


class ControlConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cooldown: int = Field(
        3,
        ge=1,
        description=(
            "iterations after an action before the next (the diagnostics must see its effect: "
            "keep it at least diagnostics.every)"
        ),
    )
    max_actions: int = Field(4, ge=1, description="actions per run, over all alarms")


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
        return {
            "name": f"action:{self.kind}",
            "iteration": self.iteration,
            "mode": "act",
            "message": self.message,
            "evidence": {},
            "action": dataclasses.asdict(self),
        }


@dataclass
class Controller:
    responses: Mapping[str, Sequence[_Response]]
    config: ControlConfig
    #: per alarm: index of the next response, and how many times it has been taken
    cursor: dict[str, list[int]] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)

    def step(
        self,
        iteration: int,
        breached: Mapping[str, int | None],
        knobs: Knobs,
        checkpoints: Sequence[GroundedCheckpoint],
    ) -> tuple[Action, Knobs] | None:
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
                return action, new
        return None

    def state_dict(self) -> dict[str, Any]:
        return {
            "cursor": {k: list(v) for k, v in self.cursor.items()},
            "actions": [dataclasses.asdict(a) for a in self.actions],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.cursor = {k: list(v) for k, v in state["cursor"].items()}
        self.actions = [Action(**a) for a in state["actions"]]
