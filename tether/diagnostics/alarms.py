"""Collapse alarms (SPEC §3): named, timestamped events with the evidence that raised them.

`AlarmMonitor` is pure and stateful: feed it the iteration's metrics dict once per
iteration and it returns the events that fired. A missing (or non-finite) metric
does not advance the alarms that read it. Each alarm fires once per episode of
breach and re-arms after the condition clears. ``state_dict()`` is JSON-safe.

    monitor = AlarmMonitor(AlarmsConfig(template_collapse=TemplateCollapseConfig(mode="stop")))
    for it in range(1, n + 1):
        for event in monitor.update(it, metrics):
            print(event.message)          # the driver records tags/artifacts, stops on mode == "stop"
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

AlarmMode = Literal["off", "warn", "stop"]
_MODE = "off: not tracked; warn: record the event and continue; stop: record it, checkpoint and end the run"


# ------------------------------------------------------------------ config

class _AlarmConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TemplateCollapseConfig(_AlarmConfig):
    mode: AlarmMode = Field("warn", description=_MODE)
    mi_metric: str = Field("collapse/first_turn/mi_zscore_ema", description="MI proxy watched for a fall")
    entropy_metric: str = Field("collapse/first_turn/conditional_entropy_est",
                                description="within-input entropy H(Z|X) that must stay flat or rise")
    window: int = Field(10, ge=2, description="observations (iterations with both metrics) in the running window")
    drop_fraction: float = Field(0.3, gt=0, lt=1, description="MI fall from its positive window peak, as a fraction of the peak")
    entropy_tolerance: float = Field(0.05, ge=0, description="relative entropy fall since the MI peak still counted as flat")


class LowEntropyCollapseConfig(_AlarmConfig):
    mode: AlarmMode = Field("warn", description=_MODE)
    mi_metric: str = Field("collapse/first_turn/mi_zscore_ema", description="MI proxy watched for a fall")
    entropy_metric: str = Field("collapse/first_turn/conditional_entropy_est",
                                description="within-input entropy H(Z|X) watched for a fall")
    window: int = Field(10, ge=2, description="observations (iterations with both metrics) in the running window")
    drop_fraction: float = Field(0.3, gt=0, lt=1, description="MI fall from its positive window peak, as a fraction of the peak")
    entropy_drop_fraction: float = Field(0.1, gt=0, lt=1, description="relative entropy fall since the MI peak that counts as falling")


class RewardVarianceCollapseConfig(_AlarmConfig):
    mode: AlarmMode = Field("warn", description=_MODE)
    metric: str = Field("rollout/in_group_reward_std", description="mean in-group reward std of the batch")
    baseline_iterations: int = Field(10, ge=1, description="first observations averaged into the baseline")
    fraction: float = Field(0.1, gt=0, lt=1, description="breach when the metric is below this fraction of the baseline")
    patience: int = Field(10, ge=1, description="consecutive breaching observations before the alarm fires")


class OutputLengthCollapseConfig(_AlarmConfig):
    mode: AlarmMode = Field("warn", description=_MODE)
    metric: str = Field("rollout/reasoning_length", description="mean reasoning length in tokens")
    window: int = Field(10, ge=2, description="observations in the running window")
    drop_fraction: float = Field(0.5, gt=0, lt=1, description="fall from the window's peak, as a fraction of the peak")


class EmptyAfterFilterConfig(_AlarmConfig):
    mode: AlarmMode = Field("warn", description=_MODE)
    metric: str = Field("filter/empty", description="1 when the SNR filter kept no group this iteration, else 0")
    patience: int = Field(5, ge=1, description="consecutive empty iterations before the alarm fires")


class AlarmsConfig(_AlarmConfig):
    """Thresholds and modes of the collapse alarms (SPEC §3)."""
    template_collapse: TemplateCollapseConfig = Field(default_factory=TemplateCollapseConfig,
                                                      description="MI falls while H(Z|X) stays flat or rises")
    low_entropy_collapse: LowEntropyCollapseConfig = Field(default_factory=LowEntropyCollapseConfig,
                                                           description="MI and H(Z|X) both fall")
    reward_variance_collapse: RewardVarianceCollapseConfig = Field(
        default_factory=RewardVarianceCollapseConfig, description="in-group reward std stays far below its baseline")
    output_length_collapse: OutputLengthCollapseConfig = Field(
        default_factory=OutputLengthCollapseConfig, description="mean reasoning length drops within a window")
    empty_after_filter: EmptyAfterFilterConfig = Field(default_factory=EmptyAfterFilterConfig,
                                                       description="the filter kept nothing several iterations running")


# ------------------------------------------------------------------ events

@dataclass
class AlarmEvent:
    """One fired alarm. ``evidence`` maps metric keys (and ``iteration``) to the window's values."""
    name: str
    iteration: int
    time: float
    mode: Literal["warn", "stop"]
    message: str
    evidence: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AlarmEvent":
        return cls(**dict(data))


def _value(metrics: Mapping[str, Any], key: str) -> float | None:
    """The metric as a float, or None when missing or not finite."""
    if key not in metrics or metrics[key] is None:
        return None
    try:
        value = float(metrics[key])
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


# ------------------------------------------------------------------ alarms

class _Alarm(abc.ABC):
    """Base: subclasses define ``_observe`` returning (breached, message, evidence) or None."""
    name: str = ""

    def __init__(self, config):
        self.config = config
        self.in_breach = False

    @abc.abstractmethod
    def _observe(self, iteration: int, metrics: Mapping[str, Any]) -> tuple[bool, str, dict] | None:
        """(breached, message, evidence), or None when the metrics it reads are missing."""

    def update(self, iteration: int, metrics: Mapping[str, Any], now: float) -> AlarmEvent | None:
        observed = self._observe(iteration, metrics)
        if observed is None:                # metrics missing: the alarm does not advance
            return None
        breached, message, evidence = observed
        if not breached:
            self.in_breach = False          # recovered: re-arm
            return None
        if self.in_breach:                  # same episode: already fired
            return None
        self.in_breach = True
        return AlarmEvent(self.name, iteration, now, self.config.mode, message, evidence)

    def state_dict(self) -> dict[str, Any]:
        return {"in_breach": self.in_breach}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.in_breach = bool(state["in_breach"])


class _WindowAlarm(_Alarm):
    """Keeps the last ``window`` observations of some metrics: rows of [iteration, *values]."""
    keys: tuple[str, ...] = ()

    def __init__(self, config):
        super().__init__(config)
        self.history: list[list[float]] = []

    def _push(self, iteration: int, metrics: Mapping[str, Any]) -> bool:
        values = [_value(metrics, key) for key in self.keys]
        if any(v is None for v in values):
            return False
        self.history = (self.history + [[float(iteration), *values]])[-self.config.window:]
        return True

    def _evidence(self) -> dict[str, list[float]]:
        columns = list(zip(*self.history))
        return {"iteration": list(columns[0]), **{k: list(c) for k, c in zip(self.keys, columns[1:])}}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "history": [list(row) for row in self.history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.history = [list(row) for row in state["history"]]


class _MiEntropyAlarm(_WindowAlarm):
    """MI fell from its positive window peak by > drop_fraction; ``_entropy_ok`` judges H(Z|X)."""

    def __init__(self, config):
        super().__init__(config)
        self.keys = (config.mi_metric, config.entropy_metric)

    @abc.abstractmethod
    def _entropy_ok(self, relative_change: float) -> bool:
        """Whether H(Z|X)'s relative change since the MI peak matches this alarm."""

    def _observe(self, iteration, metrics):
        if not self._push(iteration, metrics):
            return None
        peak_row = max(self.history, key=lambda row: row[1])        # earliest peak on ties
        _, mi_peak, h_at_peak = peak_row
        _, mi_now, h_now = self.history[-1]
        if mi_peak <= 0:
            return False, "", {}
        mi_drop = (mi_peak - mi_now) / mi_peak
        h_change = (h_now - h_at_peak) / max(abs(h_at_peak), 1e-8)
        breached = mi_drop > self.config.drop_fraction and self._entropy_ok(h_change)
        message = (f"{self.name}: {self.config.mi_metric} fell {mi_drop:.0%} from its peak {mi_peak:.4g} "
                   f"(iteration {int(peak_row[0])}) to {mi_now:.4g}, while {self.config.entropy_metric} "
                   f"changed {h_change:+.0%} ({h_at_peak:.4g} -> {h_now:.4g})")
        return breached, message, self._evidence()


class TemplateCollapseAlarm(_MiEntropyAlarm):
    name = "template_collapse"

    def _entropy_ok(self, relative_change: float) -> bool:
        return relative_change >= -self.config.entropy_tolerance


class LowEntropyCollapseAlarm(_MiEntropyAlarm):
    name = "low_entropy_collapse"

    def _entropy_ok(self, relative_change: float) -> bool:
        return relative_change < -self.config.entropy_drop_fraction


class OutputLengthCollapseAlarm(_WindowAlarm):
    name = "output_length_collapse"

    def __init__(self, config):
        super().__init__(config)
        self.keys = (config.metric,)

    def _observe(self, iteration, metrics):
        if not self._push(iteration, metrics):
            return None
        peak_row = max(self.history, key=lambda row: row[1])
        peak, now = peak_row[1], self.history[-1][1]
        if peak <= 0:
            return False, "", {}
        drop = (peak - now) / peak
        message = (f"{self.name}: {self.config.metric} fell {drop:.0%} from {peak:.4g} "
                   f"(iteration {int(peak_row[0])}) to {now:.4g} within {len(self.history)} observations")
        return drop > self.config.drop_fraction, message, self._evidence()


class _StreakAlarm(_Alarm):
    """Counts consecutive breaching observations; ``recent`` keeps the last ``patience`` rows."""

    def __init__(self, config):
        super().__init__(config)
        self.streak = 0
        self.recent: list[list[float]] = []

    def _record(self, iteration: int, value: float) -> None:
        self.recent = (self.recent + [[float(iteration), value]])[-self.config.patience:]

    def _evidence(self) -> dict[str, list[float]]:
        return {"iteration": [row[0] for row in self.recent], self.config.metric: [row[1] for row in self.recent]}

    def state_dict(self):
        return {**super().state_dict(), "streak": self.streak, "recent": [list(r) for r in self.recent]}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.streak = int(state["streak"])
        self.recent = [list(r) for r in state["recent"]]


class RewardVarianceCollapseAlarm(_StreakAlarm):
    name = "reward_variance_collapse"

    def __init__(self, config):
        super().__init__(config)
        self.baseline_values: list[float] = []

    def _observe(self, iteration, metrics):
        value = _value(metrics, self.config.metric)
        if value is None:
            return None
        self._record(iteration, value)
        if len(self.baseline_values) < self.config.baseline_iterations:
            self.baseline_values.append(value)      # still building the baseline: no verdict
            return False, "", {}
        baseline = sum(self.baseline_values) / len(self.baseline_values)
        self.streak = self.streak + 1 if value < self.config.fraction * baseline else 0
        message = (f"{self.name}: {self.config.metric} below {self.config.fraction:g}x its baseline "
                   f"{baseline:.4g} for {self.streak} consecutive iterations (now {value:.4g})")
        evidence = {**self._evidence(), "baseline": [baseline]}
        return self.streak >= self.config.patience, message, evidence

    def state_dict(self):
        return {**super().state_dict(), "baseline_values": list(self.baseline_values)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.baseline_values = [float(v) for v in state["baseline_values"]]


class EmptyAfterFilterAlarm(_StreakAlarm):
    name = "empty_after_filter"

    def _observe(self, iteration, metrics):
        value = _value(metrics, self.config.metric)
        if value is None:
            return None
        self._record(iteration, value)
        self.streak = self.streak + 1 if value >= 0.5 else 0     # 1/True = the filter kept nothing
        message = (f"{self.name}: the filter kept no group for {self.streak} consecutive iterations; "
                   f"updates are being skipped")
        return self.streak >= self.config.patience, message, self._evidence()


ALARMS: dict[str, type[_Alarm]] = {cls.name: cls for cls in (
    TemplateCollapseAlarm, LowEntropyCollapseAlarm, RewardVarianceCollapseAlarm,
    OutputLengthCollapseAlarm, EmptyAfterFilterAlarm)}


# ------------------------------------------------------------------ monitor

class AlarmMonitor:
    """Runs every alarm whose mode is not ``off`` over the stream of per-iteration metrics."""

    def __init__(self, config: AlarmsConfig | None = None, clock: Callable[[], float] = time.time):
        self.config = config or AlarmsConfig()
        self.clock = clock
        self.alarms: dict[str, _Alarm] = {
            name: cls(getattr(self.config, name)) for name, cls in ALARMS.items()
            if getattr(self.config, name).mode != "off"}
        self.events: list[AlarmEvent] = []

    def update(self, iteration: int, metrics: Mapping[str, Any]) -> list[AlarmEvent]:
        """Feed one iteration's metrics; returns the events that fired now (also kept in ``events``)."""
        now = self.clock()
        fired = [event for alarm in self.alarms.values()
                 if (event := alarm.update(iteration, metrics, now)) is not None]
        self.events.extend(fired)
        return fired

    @property
    def stop_requested(self) -> bool:
        """True once any alarm in ``stop`` mode has fired."""
        return any(event.mode == "stop" for event in self.events)

    def state_dict(self) -> dict[str, Any]:
        return {"alarms": {name: alarm.state_dict() for name, alarm in self.alarms.items()},
                "events": [event.to_dict() for event in self.events]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, alarm_state in state["alarms"].items():
            if name in self.alarms:          # an alarm switched off since the checkpoint is ignored
                self.alarms[name].load_state_dict(alarm_state)
        self.events = [AlarmEvent.from_dict(e) for e in state["events"]]
