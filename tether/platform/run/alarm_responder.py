"""The run's alarms and what answers them: events, act-mode responses, the settings
those responses change (the knobs), and the grounded checkpoints a rollback returns to.

    responder = AlarmResponder(cfg, emit)
    responder.tracker = tracker                     # once the MLflow run is open
    stop = responder.respond(it, metrics, learner, fleet)   # after every iteration
    responder.live                                  # the filter, update settings and lr in force

The controller that decides a response is ``tether/diagnostics/control.py``; this part
applies it (learner, filter, weights) and records it (console, MLflow tags, alarms.json).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...algos.settings import FilterConfig
from ...algos.update import UpdateSettings
from ...diagnostics.alarms import AlarmMonitor
from ...diagnostics.control import Controller
from ...diagnostics.settings import GroundedCheckpoint, Knobs
from ..config import TetherConfig
from ..tracking.tracker import Tracker
from .checkpoint import load_checkpoint
from .events import Event
from .fleet import RolloutFleet

#: grounded checkpoints kept as rollback targets (the first and the newest; protected from
#: pruning)
GROUNDED_KEPT = 3


@dataclass(frozen=True)
class LiveSettings:
    """The settings in force that an act-mode response may change, as one object: the
    filter, the update settings and the learning rate.  ``knobs`` is the controller's
    view of them; ``with_knobs`` the settings after a response."""

    filter: FilterConfig
    update: UpdateSettings
    lr: float

    @classmethod
    def from_config(cls, cfg: TetherConfig) -> LiveSettings:
        update = UpdateSettings.from_config(
            cfg.algo, cfg.rollout.temperature, iterations=cfg.trainer.iterations
        )
        return cls(cfg.filter, update, cfg.algo.lr)

    @property
    def knobs(self) -> Knobs:
        f, u = self.filter, self.update
        return Knobs(f.strategy, f.value, u.kl_coef, u.entropy_coef, self.lr)

    def with_knobs(self, knobs: Knobs) -> LiveSettings:
        """The filter's strategy and value, the KL and entropy coefficients and the
        learning rate of ``knobs``; everything else as it is."""
        fields = {**self.filter.model_dump(), "strategy": knobs.filter_strategy}
        return LiveSettings(
            FilterConfig.model_validate({**fields, "value": knobs.filter_value}),
            dataclasses.replace(
                self.update, kl_coef=knobs.kl_coef, entropy_coef=knobs.entropy_coef
            ),
            knobs.lr,
        )


@dataclass(frozen=True)
class _RunEffects:
    """``RunEffects`` on this run's learner and rollout workers."""

    learner: object
    fleet: RolloutFleet

    def restore(self, path: str) -> None:
        self.learner.load_full_state(load_checkpoint(Path(path))["learner"])
        self.fleet.sync_weights(self.learner)


class AlarmResponder:
    def __init__(self, cfg: TetherConfig, emit: Callable[[str, dict], None]) -> None:
        self.cfg, self.emit = cfg.alarms, emit
        self.tracker: Tracker | None = None
        self.alarms = AlarmMonitor(cfg.alarms)
        #: act-mode alarms' responses (None when no alarm acts)
        self.controller = Controller.from_config(cfg.alarms)
        #: the settings a response may change, as the run uses them now
        self.live = LiveSettings.from_config(cfg)
        #: checkpoints saved while MI was significantly above its null
        self.grounded: list[GroundedCheckpoint] = []
        self.stop_reason: str | None = None

    @property
    def knobs(self) -> Knobs:
        return self.live.knobs

    @property
    def filter_cfg(self) -> FilterConfig:
        """The filter in force: the config's, tightened by act-mode responses."""
        return self.live.filter

    @property
    def settings(self) -> UpdateSettings:
        """The update settings in force (coefficients raised by act-mode responses)."""
        return self.live.update

    # -- after every iteration ----------------------------------------------------------
    def respond(self, it: int, metrics: dict[str, float], learner, fleet: RolloutFleet) -> bool:
        """Record the alarms ``metrics`` raise, take an act-mode response while one is in
        breach; True when a stop-mode alarm ends the run (``stop_reason`` says which)."""
        for event in self.alarms.update(it, metrics):
            self.record_alarm(event)
        if self.controller is not None:
            self.act(it, learner, fleet)
        if not self.alarms.stop_requested:
            return False
        stop = next(e for e in self.alarms.events if e.mode == "stop")
        self.stop_reason = f"alarm {stop.name} at iteration {stop.iteration}"
        return True

    def metrics(self) -> dict[str, float]:
        """``control/…``: the knobs in force and the responses taken (when an alarm acts)."""
        if self.controller is None:
            return {}
        return {**self.knobs.metrics(), "control/actions": float(len(self.controller.actions))}

    def record_alarm(self, event) -> None:
        """Console line, MLflow tag ``alarm.<name>`` = iteration, and the alarms.json artifact."""
        self.emit(
            Event.ALARM,
            {
                "name": event.name,
                "iteration": event.iteration,
                "mode": event.mode,
                "message": event.message,
            },
        )
        self.tracker.set_tags({f"alarm.{event.name}": event.iteration})
        self.log_alarms()

    def log_alarms(self) -> None:
        """alarms.json: the alarms' events and the responses taken, in order."""
        control = [*self.controller.passed, *self.controller.actions] if self.controller else []
        entries = sorted(  # stable: at one iteration, alarms, then passes, then the action
            [e.to_dict() for e in self.alarms.events] + [c.to_dict() for c in control],
            key=lambda e: (e["iteration"], e["mode"] == "act"),
        )
        self.tracker.log_json(entries, "alarms.json")

    def act(self, it: int, learner, fleet: RolloutFleet) -> None:
        """While an act-mode alarm is in breach, take its next response (the controller
        decides), apply it and record it; say which responses it passed over, and why."""
        before = len(self.controller.passed)
        taken = self.controller.step(it, self.alarms.in_breach("act"), self.knobs, self.grounded)
        for passed in self.controller.passed[before:]:
            said = {"alarm": passed.alarm, "kind": "passed_over", "message": passed.message}
            self.emit(Event.ACTION, {"iteration": it, **said, "rollback_to": None})
        if taken is None:
            if len(self.controller.passed) > before:
                self.log_alarms()
            return
        action, knobs, response, target = taken
        response.effect(target, _RunEffects(learner, fleet))
        self.apply_knobs(knobs, learner)
        self.emit(
            Event.ACTION,
            {
                "iteration": it,
                "alarm": action.alarm,
                "kind": action.kind,
                "message": action.message,
                "rollback_to": action.rollback_to,
            },
        )
        self.tracker.set_tags(
            {f"control.{len(self.controller.actions)}": f"iteration {it}: {action.message}"}
        )
        self.log_alarms()

    def apply_knobs(self, knobs: Knobs, learner) -> None:
        """The controller's settings into the live settings and the learner."""
        self.live = self.live.with_knobs(knobs)
        learner.adjust(self.live.update, self.live.lr)

    # -- grounded checkpoints -------------------------------------------------------------
    def grounded_now(self, metrics: dict[str, float], diagnostics: dict[str, float]) -> bool:
        """MI at the latest diagnostic point (this iteration's ``metrics``, else the last
        ``diagnostics``) passed the test a template-collapse reference passes
        (p < alpha / window): a checkpoint now is a rollback target."""
        c = self.cfg.template_collapse
        p = metrics.get(c.p_metric, diagnostics.get(c.p_metric))
        return p is not None and p < c.alpha / c.window

    def note_checkpoint(self, it: int, path: Path, metrics, diagnostics) -> None:
        """Before checkpoint ``path`` of iteration ``it`` is written: keep it as a rollback
        target when the run is grounded now (only when an alarm acts)."""
        if self.controller is not None and self.grounded_now(metrics, diagnostics):
            kept = [*self.grounded, GroundedCheckpoint(it, str(path))]
            # The first stays: a collapse's reference is often the run's first grounded
            # point, and a rollback goes to a checkpoint at or before it (with only the
            # newest kept, a run grounded for 4 checkpoints had none to return to).
            if len(kept) > GROUNDED_KEPT:
                kept = [kept[0], *kept[-(GROUNDED_KEPT - 1) :]]
            self.grounded = kept

    def protected(self) -> tuple[Path, ...]:
        """Checkpoints that pruning must keep: the rollback targets."""
        return tuple(Path(c.path) for c in self.grounded)

    def forget_unwritten(self) -> None:
        """After a checkpoint failed to write: no rollback target without its file."""
        self.grounded = [c for c in self.grounded if Path(c.path).is_file()]

    # -- what a checkpoint keeps -----------------------------------------------------------
    def control_state(self) -> dict | None:
        """The controller, knobs and grounded checkpoints (None when no alarm acts)."""
        if self.controller is None:
            return None
        return {
            "controller": self.controller.state_dict(),
            "knobs": dataclasses.asdict(self.knobs),
            "grounded": [dataclasses.asdict(c) for c in self.grounded],
        }

    def load(self, alarms: dict, control: dict | None, learner) -> None:
        """Back to a checkpoint's alarms and (when an alarm acts) control state."""
        self.alarms.load_state_dict(alarms)
        if self.controller is not None and control is not None:
            self.controller.load_state_dict(control["controller"])
            self.grounded = [GroundedCheckpoint(**c) for c in control["grounded"]]
            self.apply_knobs(Knobs(**control["knobs"]), learner)
