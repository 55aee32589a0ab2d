"""Collapse alarms (docs/methods.md, section 4): named, timestamped events with the evidence that raised them.

`AlarmMonitor` is pure and stateful: feed it the iteration's metrics dict once per
iteration and it returns the events that fired. A missing (or non-finite) metric
does not advance the alarms that read it. Each alarm fires once per episode of
breach and re-arms after the condition clears. ``state_dict()`` is JSON-safe.

    monitor = AlarmMonitor(AlarmsConfig(template_collapse=TemplateCollapseConfig(mode="stop")))

(the settings, ``AlarmsConfig`` and one schema per alarm, are in ``settings.py``)
    for it in range(1, n + 1):
        for event in monitor.update(it, metrics):
            print(event.message)          # the driver records tags/artifacts, stops on mode == "stop"
"""

from __future__ import annotations

import abc
import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .settings import (
    ALARM_NAMES,
    AlarmsConfig,
    EmptyAfterFilterConfig,
    FormatCollapseConfig,
    LowEntropyCollapseConfig,
    OutputLengthCollapseConfig,
    ReadingDriftConfig,
    RewardVarianceCollapseConfig,
    TemplateCollapseConfig,
)

# The alarms' settings (one schema per alarm, and ``AlarmsConfig``) are in settings.py.


# ------------------------------------------------------------------ events


@dataclass
class AlarmEvent:
    """One fired alarm. ``evidence`` maps metric keys (and ``iteration``) to the window's values."""

    name: str
    iteration: int
    time: float
    mode: Literal["warn", "act", "stop"]
    message: str
    evidence: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AlarmEvent:
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

    #: The alarm's settings class (``settings.ALARM_SETTINGS``): its name, summary and schema.
    settings: type | None = None
    name: str = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.settings is not None:
            cls.name = cls.settings.name

    def __init__(self, config):
        self.config = config
        self.in_breach = False

    @abc.abstractmethod
    def _observe(self, iteration: int, metrics: Mapping[str, Any]) -> tuple[bool, str, dict] | None:
        """(breached, message, evidence), or None when the metrics it reads are missing."""

    def update(self, iteration: int, metrics: Mapping[str, Any], now: float) -> AlarmEvent | None:
        observed = self._observe(iteration, metrics)
        if observed is None:  # metrics missing: the alarm does not advance
            return None
        breached, message, evidence = observed
        if not breached:
            self.in_breach = False  # recovered: re-arm
            return None
        if self.in_breach:  # same episode: already fired
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
        self.history = (self.history + [[float(iteration), *values]])[-self.config.window :]
        return True

    def _evidence(self) -> dict[str, list[float]]:
        columns = list(zip(*self.history))
        return {
            "iteration": list(columns[0]),
            **{k: list(c) for k, c in zip(self.keys, columns[1:])},
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "history": [list(row) for row in self.history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.history = [list(row) for row in state["history"]]


class _MiEntropyAlarm(_WindowAlarm):
    """MI fell beyond the uncertainty of both estimates from an earlier point where it was
    significantly above its null; ``_entropy_ok`` judges H(Z|X) by its intervals too.

    A row of the window is [iteration, MI, MI low, MI high, p, H, H low, H high].  The
    reference is the earlier significant point (p < alpha / window) with the highest interval
    floor; a breach is MI's interval now lying wholly below it, by at least
    ``min_drop_fraction`` of the reference value.  An MI at noise level is never
    significant, so it is never a reference: no fall within noise of zero can fire.
    """

    def __init__(self, config):
        super().__init__(config)
        mi, h = config.mi_metric, config.entropy_metric
        self.keys = (
            mi,
            f"{mi}_ci_low",
            f"{mi}_ci_high",
            config.p_metric,
            h,
            f"{h}_ci_low",
            f"{h}_ci_high",
        )
        self.recent: list[bool] = []  # separated?, for the last `within` points
        self.reference: int | None = None

    @abc.abstractmethod
    def _entropy_ok(self, entropy_fell: bool) -> bool:
        """Whether H(Z|X) (fell: its interval now wholly below the reference's) fits this alarm."""

    def _observe(self, iteration, metrics):
        if not self._push(iteration, metrics):
            return None
        *earlier, now = self.history
        c = self.config
        references = [row for row in earlier if row[4] < c.alpha / c.window]
        if len(references) < c.min_references:
            self.recent = []
            return False, "", {}
        ref = max(references, key=lambda row: row[2])  # earliest on ties
        self.reference = int(ref[0])
        separated = now[3] < ref[2] and ref[1] - now[1] >= c.min_drop_fraction * abs(ref[1])
        entropy_fell = now[7] < ref[6]
        within = max(c.within, c.patience)
        self.recent = (self.recent + [separated and self._entropy_ok(entropy_fell)])[-within:]
        count = sum(self.recent)
        message = (
            f"{self.name}: {c.mi_metric} fell from {ref[1]:.4g} [{ref[2]:.4g}, {ref[3]:.4g}] "
            f"(iteration {int(ref[0])}, p_grounded {ref[4]:.3g}) to {now[1]:.4g} "
            f"[{now[2]:.4g}, {now[3]:.4g}], intervals apart at {count} of the last "
            f"{len(self.recent)} diagnostic point(s); {c.entropy_metric} {ref[5]:.4g} "
            f"[{ref[6]:.4g}, {ref[7]:.4g}] -> {now[5]:.4g} [{now[6]:.4g}, {now[7]:.4g}] "
            f"({'fell' if entropy_fell else 'did not fall'})"
        )
        return count >= c.patience, message, {**self._evidence(), "reference_iteration": [ref[0]]}

    def state_dict(self):
        return {**super().state_dict(), "recent": list(self.recent)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if "recent" in state:
            self.recent = [bool(v) for v in state["recent"]]
        else:  # a checkpoint from before `within`: a streak
            self.recent = [True] * int(state["streak"])


class TemplateCollapseAlarm(_MiEntropyAlarm):
    settings = TemplateCollapseConfig

    def _entropy_ok(self, entropy_fell: bool) -> bool:
        return not entropy_fell


class LowEntropyCollapseAlarm(_MiEntropyAlarm):
    settings = LowEntropyCollapseConfig

    def _entropy_ok(self, entropy_fell: bool) -> bool:
        return entropy_fell


class OutputLengthCollapseAlarm(_WindowAlarm):
    """The mean reasoning length fell by more than ``drop_fraction`` from the window's peak,
    and the peak's interval lies wholly above the current one."""

    settings = OutputLengthCollapseConfig

    def __init__(self, config):
        super().__init__(config)
        self.keys = (config.metric, f"{config.metric}_ci_low", f"{config.metric}_ci_high")

    def _observe(self, iteration, metrics):
        if not self._push(iteration, metrics):
            return None
        peak_row = max(self.history, key=lambda row: row[1])
        now = self.history[-1]
        if peak_row[1] <= 0:
            return False, "", {}
        drop = (peak_row[1] - now[1]) / peak_row[1]
        message = (
            f"{self.name}: {self.config.metric} fell {drop:.0%} from {peak_row[1]:.4g} "
            f"[{peak_row[2]:.4g}, {peak_row[3]:.4g}] (iteration {int(peak_row[0])}) to "
            f"{now[1]:.4g} [{now[2]:.4g}, {now[3]:.4g}] within {len(self.history)} observations"
        )
        return drop > self.config.drop_fraction and now[3] < peak_row[2], message, self._evidence()


class _StreakAlarm(_Alarm):
    """Counts consecutive breaching observations; ``recent`` keeps the last ``patience`` rows."""

    def __init__(self, config):
        super().__init__(config)
        self.streak = 0
        self.recent: list[list[float]] = []

    def _record(self, iteration: int, value: float) -> None:
        self.recent = (self.recent + [[float(iteration), value]])[-self.config.patience :]

    def _evidence(self) -> dict[str, list[float]]:
        return {
            "iteration": [row[0] for row in self.recent],
            self.config.metric: [row[1] for row in self.recent],
        }

    def state_dict(self):
        return {
            **super().state_dict(),
            "streak": self.streak,
            "recent": [list(r) for r in self.recent],
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.streak = int(state["streak"])
        self.recent = [list(r) for r in state["recent"]]


class RewardVarianceCollapseAlarm(_StreakAlarm):
    settings = RewardVarianceCollapseConfig

    def __init__(self, config):
        super().__init__(config)
        self.baseline_values: list[float] = []

    def _observe(self, iteration, metrics):
        value = _value(metrics, self.config.metric)
        if value is None:
            return None
        self._record(iteration, value)
        if len(self.baseline_values) < self.config.baseline_iterations:
            self.baseline_values.append(value)  # still building the baseline: no verdict
            return False, "", {}
        baseline = sum(self.baseline_values) / len(self.baseline_values)
        if baseline < self.config.min_baseline:  # no spread to lose: no verdict
            self.streak = 0
            return False, "", {}
        self.streak = self.streak + 1 if value < self.config.fraction * baseline else 0
        message = (
            f"{self.name}: {self.config.metric} below {self.config.fraction:g}x its baseline "
            f"{baseline:.4g} for {self.streak} consecutive iterations (now {value:.4g})"
        )
        evidence = {**self._evidence(), "baseline": [baseline]}
        return self.streak >= self.config.patience, message, evidence

    def state_dict(self):
        return {**super().state_dict(), "baseline_values": list(self.baseline_values)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.baseline_values = [float(v) for v in state["baseline_values"]]


class EmptyAfterFilterAlarm(_StreakAlarm):
    settings = EmptyAfterFilterConfig

    def _observe(self, iteration, metrics):
        value = _value(metrics, self.config.metric)
        if value is None:
            return None
        self._record(iteration, value)
        self.streak = self.streak + 1 if value >= 0.5 else 0  # 1/True = the filter kept nothing
        message = (
            f"{self.name}: the filter kept no group for {self.streak} consecutive iterations; "
            f"updates are being skipped"
        )
        return self.streak >= self.config.patience, message, self._evidence()


class FormatCollapseAlarm(_StreakAlarm):
    """Valid reasoning or valid actions below ``min_rate`` for ``patience`` iterations: a
    policy that stopped writing reasoning (or actions) is a collapse of its own.
    ``recent`` rows are [iteration, reasoning rate, action rate]."""

    settings = FormatCollapseConfig

    def _observe(self, iteration, metrics):
        c = self.config
        reasoning, action = _value(metrics, c.reasoning_metric), _value(metrics, c.action_metric)
        if reasoning is None or action is None:
            return None
        self.recent = (self.recent + [[float(iteration), reasoning, action]])[-c.patience :]
        self.streak = self.streak + 1 if min(reasoning, action) < c.min_rate else 0
        lost = (
            " and ".join(
                name
                for name, rate in (("reasoning", reasoning), ("actions", action))
                if rate < c.min_rate
            )
            or "nothing"
        )
        message = (
            f"{self.name}: valid {lost} below {c.min_rate:g} of turns for {self.streak} "
            f"consecutive iterations ({c.reasoning_metric} {reasoning:.3g}, "
            f"{c.action_metric} {action:.3g})"
        )
        return self.streak >= c.patience, message, self._evidence()

    def _evidence(self) -> dict[str, list[float]]:
        columns = list(zip(*self.recent))
        return {
            "iteration": list(columns[0]),
            self.config.reasoning_metric: list(columns[1]),
            self.config.action_metric: list(columns[2]),
        }


@functools.lru_cache(maxsize=4096)
def _wilson(hits: int, n: int, confidence: float) -> tuple[float, float]:
    from scipy.stats import binomtest

    ci = binomtest(hits, n).proportion_ci(confidence, method="wilson")
    return float(ci.low), float(ci.high)


class ReadingDriftAlarm(_Alarm):
    """Reading accuracy on the probe set (``metric``, and with ``each_fact`` every
    ``grounding/<fact>_right`` the point logs) fell from its best point in the window
    beyond the uncertainty of both (their Wilson intervals lie apart) and by at least
    ``min_drop``, while the probe's permutation test still says grounded (p < alpha) at
    the current point: MI cannot see this drift, the reading check can.  With k rates
    watched, each interval's coverage is 1 - (1 - ``confidence``) / k (Bonferroni), so
    watching the facts too does not raise the false-alarm rate.

    Each rate keeps a window of rows [iteration, rate, levels, p]; the best point is the
    one with the highest interval floor (earliest on ties), and the best point of the
    rate that fell is the ``reference`` a rollback returns to at or before."""

    settings = ReadingDriftConfig

    def __init__(self, config):
        super().__init__(config)
        self.histories: dict[str, list[list[float]]] = {}
        self.streak = 0
        self.reference: int | None = None

    def _watched(self, metrics: Mapping[str, Any]) -> list[str]:
        facts = [
            key
            for key in metrics
            if self.config.each_fact
            and key.startswith("grounding/")
            and key.endswith("_right")
            and key != self.config.metric
        ]
        return [self.config.metric, *sorted(facts)]

    @staticmethod
    def _interval(row: list[float], confidence: float) -> tuple[float, float]:
        n = int(round(row[2]))
        if n < 1:
            return 0.0, 1.0
        return _wilson(min(n, max(0, int(round(row[1] * n)))), n, confidence)

    def _observe(self, iteration, metrics):
        c = self.config
        levels, p = _value(metrics, c.levels_metric), _value(metrics, c.p_metric)
        rates = {key: _value(metrics, key) for key in self._watched(metrics)}
        rates = {key: value for key, value in rates.items() if value is not None}
        if levels is None or p is None or c.metric not in rates:
            return None
        confidence = 1.0 - (1.0 - c.confidence) / len(rates)
        judged = {}  # rate -> (its best row, that row's interval, the current interval)
        for key, rate in rates.items():
            history = self.histories.get(key, []) + [[float(iteration), rate, levels, p]]
            history = self.histories[key] = history[-c.window :]
            best = max(history, key=lambda row: self._interval(row, confidence)[0])
            judged[key] = (
                best,
                self._interval(best, confidence),
                self._interval(history[-1], confidence),
            )
        fell = [
            key
            for key, (best, best_ci, now_ci) in judged.items()
            if now_ci[1] < best_ci[0] and best[1] - rates[key] >= c.min_drop
        ]
        grounded = p < c.alpha
        self.streak = self.streak + 1 if fell and grounded else 0
        key = max(fell, key=lambda k: (judged[k][0][1] - rates[k], k)) if fell else c.metric
        best, best_ci, now_ci = judged[key]
        history = self.histories[key]
        self.reference = int(best[0])
        message = (
            f"{self.name}: {key} fell from {best[1]:.3g} [{best_ci[0]:.3g}, {best_ci[1]:.3g}] "
            f"(iteration {int(best[0])}) to {history[-1][1]:.3g} [{now_ci[0]:.3g}, "
            f"{now_ci[1]:.3g}] ({confidence:.2%} Wilson intervals, {len(rates)} rate(s) "
            f"watched, {int(levels)} levels) at {self.streak} consecutive probe point(s), "
            f"while {c.p_metric} {p:.3g} {'<' if grounded else '>='} {c.alpha:g} (the MI "
            f"test says {'grounded' if grounded else 'not grounded'})"
        )
        columns = list(zip(*history))
        evidence = {
            "metric": [key],
            "iteration": list(columns[0]),
            key: list(columns[1]),
            c.levels_metric: list(columns[2]),
            c.p_metric: list(columns[3]),
            "reference_iteration": [best[0]],
        }
        return self.streak >= c.patience, message, evidence

    def state_dict(self):
        return {
            **super().state_dict(),
            "histories": {k: [list(r) for r in rows] for k, rows in self.histories.items()},
            "streak": self.streak,
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.histories = {k: [list(r) for r in rows] for k, rows in state["histories"].items()}
        self.streak = int(state.get("streak", 0))


def _statistics() -> dict[str, type[_Alarm]]:
    """Each declared alarm's statistic, the ``_Alarm`` subclass whose ``settings`` is its
    settings class, in ``ALARM_NAMES`` order; a declared alarm without one is an error."""
    found, stack = {}, list(_Alarm.__subclasses__())
    while stack:
        cls = stack.pop()
        stack += cls.__subclasses__()
        if cls.settings is not None:
            found[cls.name] = cls
    missing = [name for name in ALARM_NAMES if name not in found]
    if missing:
        raise TypeError(
            f"declared alarms without a statistic (an _Alarm with settings=): {missing}"
        )
    return {name: found[name] for name in ALARM_NAMES}


ALARMS: dict[str, type[_Alarm]] = _statistics()


# ------------------------------------------------------------------ monitor


class AlarmMonitor:
    """Runs every alarm whose mode is not ``off`` over the stream of per-iteration metrics."""

    def __init__(self, config: AlarmsConfig | None = None, clock: Callable[[], float] = time.time):
        self.config = config or AlarmsConfig()
        self.clock = clock
        self.alarms: dict[str, _Alarm] = {
            name: cls(getattr(self.config, name))
            for name, cls in ALARMS.items()
            if getattr(self.config, name).mode != "off"
        }
        self.events: list[AlarmEvent] = []

    def update(self, iteration: int, metrics: Mapping[str, Any]) -> list[AlarmEvent]:
        """Feed one iteration's metrics; returns the events that fired now (also kept in ``events``)."""
        now = self.clock()
        fired = [
            event
            for alarm in self.alarms.values()
            if (event := alarm.update(iteration, metrics, now)) is not None
        ]
        self.events.extend(fired)
        return fired

    def in_breach(self, mode: str = "act") -> dict[str, int | None]:
        """The alarms of ``mode`` now in breach, each with its reference iteration (MI
        alarms: the grounded point MI fell from; None for the others)."""
        return {
            name: getattr(alarm, "reference", None)
            for name, alarm in self.alarms.items()
            if alarm.in_breach and alarm.config.mode == mode
        }

    @property
    def stop_requested(self) -> bool:
        """True once any alarm in ``stop`` mode has fired."""
        return any(event.mode == "stop" for event in self.events)

    def state_dict(self) -> dict[str, Any]:
        return {
            "alarms": {name: alarm.state_dict() for name, alarm in self.alarms.items()},
            "events": [event.to_dict() for event in self.events],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, alarm_state in state["alarms"].items():
            if name in self.alarms:  # an alarm switched off since the checkpoint is ignored
                self.alarms[name].load_state_dict(alarm_state)
        self.events = [AlarmEvent.from_dict(e) for e in state["events"]]
