"""What the live monitor serves: per run, its curves with their 95 % intervals and
permutation-null levels, its alarms with their evidence, all as JSON-safe data.

Pure (no Ray, no HTTP): ``MonitorSource`` reads the MLflow store, ``monitor_payload``
shapes it. Non-finite numbers become ``null`` (``json_safe``), and a run that cannot be
read or shaped is reported with an ``error`` instead of failing the answer for every
run.
"""

from __future__ import annotations

import math
import re
import time

from ..analysis.runs import (
    KEPT_RATIO,
    READING_ACC,
    READING_DEFINED,
    SUCCESS,
    VAL_SUCCESS,
    RunData,
    collapse_key,
)
from ..diagnostics.proxies import PROXIES, p_value_key

#: The page's curve name -> the proxy it draws (``collapse/<sampling>/<proxy>``): the
#: proxies declared with a ``monitor`` name (`tether.diagnostics.proxies`).
MONITORED = {p.monitor: p.name for p in PROXIES if p.monitor}
MONITOR_METRICS = tuple(MONITORED.values())
#: Companions of a collapse metric K, logged as ``K_<extra>``: its 95 % interval,
#: the 95th percentile of its permutation null and the permutation p-value (RAGEN-2's MI
#: proxies, each with the test that says whether it is above chance).
EXTRAS = ("ci_low", "ci_high", "null_q95", "p_grounded")
WANTED = re.compile(
    r"^(rollout/success|filter/kept_ratio|val/success|collapse/[^/]+/(grounded|p_grounded)|"
    r"collapse/[^/]+/(" + "|".join(MONITOR_METRICS) + r")(_(" + "|".join(EXTRAS) + r"))?|"
    r"grounding/(reading_acc(_ci_low|_ci_high)?|defined))$"
)


def json_safe(value):
    """``value`` with every NaN / inf replaced by None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def curve(run: RunData, key: str) -> dict:
    """A metric's steps and values, plus each companion (``ci_low``, ``null_q95``, ...) the
    run logged, aligned to those steps (None where a step has none)."""
    steps, values = run.series(key)
    out = {"x": steps.tolist(), "y": values.tolist()}
    for extra in EXTRAS:
        points = run.metrics.get(f"{key}_{extra}") or run.metrics.get(_shared_test(key, extra))
        if points:
            out[extra] = [points.get(step) for step in out["x"]]
    return out


def _shared_test(key: str, extra: str) -> str:
    """The key of the permutation test that speaks for a proxy (`proxies.p_value_key`):
    mi_estimate, mi_zscore and mi_zscore_ema share one (a permutation moves only the matched
    scores), logged once as ``collapse/<sampling>/p_grounded``."""
    prefix, _, name = key.rpartition("/")
    test = p_value_key(name) if extra == "p_grounded" else None
    return f"{prefix}/{test}" if test else ""


def _latest(value):
    return value[-1] if isinstance(value, list) and value else value


def _number(value) -> str:
    value = _latest(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.4g}"
    return "?" if value is None or value == [] else str(value)


def evidence_lines(evidence) -> list[str]:
    """An alarm's uncertainty evidence as text: ``<K> 95% CI [low, high]`` for every
    ``<K>_ci_low`` / ``<K>_ci_high`` pair and ``<key> = p`` for every ``*p_grounded`` key
    (the value at the alarm's iteration: the last of the window's values)."""
    if not isinstance(evidence, dict):
        return []
    lines, seen = [], set()
    for key in evidence:
        key = str(key)
        base = re.sub(r"_ci_(low|high)$", "", key)
        if base != key and base not in seen:
            seen.add(base)
            lines.append(
                f"{base} 95% CI [{_number(evidence.get(base + '_ci_low'))}, "
                f"{_number(evidence.get(base + '_ci_high'))}]"
            )
        elif key.endswith("p_grounded"):
            lines.append(f"{key} = {_number(evidence[key])} (permutation test)")
    return lines


def alarm_entry(alarm) -> dict:
    """One ``alarms.json`` event as the page shows it; any field may be of any type (the
    page writes them as text)."""
    if not isinstance(alarm, dict):
        return {"name": str(alarm), "iteration": None, "mode": "", "message": "", "evidence": []}
    iteration = alarm.get("iteration")
    return {
        "name": str(alarm.get("name", "")),
        "iteration": iteration if isinstance(iteration, (int, float, str)) else str(iteration),
        "mode": str(alarm.get("mode") or ""),
        "message": str(alarm.get("message") or ""),
        "evidence": evidence_lines(alarm.get("evidence")),
    }


def run_entry(run: RunData, keys: dict[str, str]) -> dict:
    alarms = [alarm_entry(a) for a in run.alarms] or [
        {"name": name, "iteration": step, "mode": "", "message": "", "evidence": []}
        for step, name in run.alarm_steps()
    ]
    return {
        "run_id": run.run_id,
        "name": run.name,
        "status": run.status,
        "latest_iteration": run.latest_iteration,
        "curves": {name: curve(run, key) for name, key in keys.items()},
        "alarms": alarms,
    }


def monitor_payload(
    runs: list[RunData], sampling: str = "first_turn", errors: dict[str, str] | None = None
) -> dict:
    """What the page draws, per run: status, latest iteration, curves (with intervals and
    null levels where logged) and alarms; JSON-safe."""
    keys = {
        **{page_name: collapse_key(sampling, name) for page_name, name in MONITORED.items()},
        "grounded": collapse_key(sampling, "grounded"),
        # the fixed probe set (docs/methods.md, section 2) and reading accuracy on it
        "probe_mi": collapse_key("probe", "mi_estimate"),
        "reading": READING_ACC,
        "reading_defined": READING_DEFINED,
        "success": SUCCESS,
        "val_success": VAL_SUCCESS,
        "kept_ratio": KEPT_RATIO,
    }
    errors = dict(errors or {})
    out = []
    for run in runs:
        try:
            entry = run_entry(run, keys) if run.run_id not in errors else None
        except Exception as exc:  # one run's odd data must not hide the others
            errors[run.run_id] = f"cannot show this run: {type(exc).__name__}: {exc}"
            entry = None
        if entry is None:
            entry = {
                "run_id": run.run_id,
                "name": run.name,
                "status": run.status,
                "latest_iteration": None,
                "curves": {},
                "alarms": [],
                "error": errors[run.run_id],
            }
        out.append(entry)
    return json_safe({"sampling": sampling, "time": time.time(), "runs": out})


class MonitorSource:
    """Tether runs of an MLflow store (optionally some experiments), re-read on demand;
    finished runs are read once and cached. A run that cannot be read is listed with
    the reason in ``errors``."""

    def __init__(
        self, tracking_uri: str, experiments: list[str] | None = None, max_runs: int = 50
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiments, self.max_runs = experiments, max_runs
        self.cache: dict[str, RunData] = {}
        self.errors: dict[str, str] = {}

    def runs(self) -> list[RunData]:
        from ..analysis.source import is_tether_run, load_run

        if self.experiments:
            found = [self.client.get_experiment_by_name(n) for n in self.experiments]
            ids = [e.experiment_id for e in found if e is not None]
        else:
            ids = [e.experiment_id for e in self.client.search_experiments()]
        if not ids:
            return []
        listed = [
            r
            for r in self.client.search_runs(
                ids, max_results=self.max_runs, order_by=["attributes.start_time DESC"]
            )
            if is_tether_run(r)
        ]
        runs = []
        for r in listed:
            run_id = r.info.run_id
            cached = self.cache.get(run_id)
            if cached is None or cached.status == "RUNNING" or r.info.status == "RUNNING":
                try:
                    cached = load_run(self.client, r, with_prompts=False, wanted=WANTED)
                    self.errors.pop(run_id, None)
                except Exception as exc:  # e.g. an unreadable alarms.json: show why, go on
                    self.errors[run_id] = f"cannot read this run: {type(exc).__name__}: {exc}"
                    cached = RunData(run_id, r.info.run_name or run_id[:8], r.info.status)
                if r.info.status != "RUNNING" and run_id not in self.errors:
                    self.cache[run_id] = cached
            runs.append(cached)
        return runs
