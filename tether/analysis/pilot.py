"""The collapse pilot's rules (docs/collapse.md, protocol of 2026-12-06), read from its records.

Each part of the pilot exports its finished run to a record (``run_part.sh``: the run's
params, tags and every metric's history).  This module applies the protocol's rules to
those records as they were written before any run, and nothing else:

- **precondition, by mid-run**: the mean of ``filter/zero_variance_groups`` over the
  iterations 16-25 is at least 6, and ``grad_snr/q1/snr`` is below 1 at iterations 20 and 25;
- **collapse**: the probe's ``mi_estimate`` at the last point at least 0.08 nats/token below
  the first point's, with the last upper bound below the first lower bound; the probe's
  ``conditional_entropy_est`` at the last point not below the first point's lower bound
  (else a *low-entropy* collapse); ``rollout/format_ok_rate`` at least 0.90 at each of the
  last 5 iterations (else a *format* collapse);
- **qualification**: the precondition in at least 2 of 3 runs and a collapse in at least 2 of 3.

Pure: records in, rows and verdicts out (no MLflow, no torch).  ``lead_times`` reads the
alarms' lead over the fall of held-out success (the confirmation's table).
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

PROBE = "collapse/probe/"
ZERO_RV = "filter/zero_variance_groups"
LOW_SNR = "grad_snr/q1/snr"
FORMAT_OK = "rollout/format_ok_rate"
GAP = "mechanism/probe_mi_change/gap"


@dataclass(frozen=True)
class Rules:
    """The protocol's thresholds, as committed before the runs (docs/collapse.md)."""

    mid_run: tuple[int, int] = (16, 25)
    min_zero_rv_groups: float = 6.0
    snr_points: tuple[int, ...] = (20, 25)
    max_low_snr: float = 1.0
    min_mi_drop: float = 0.08
    format_window: int = 5
    min_format_ok: float = 0.90
    runs: int = 3
    min_precondition: int = 2
    min_collapsed: int = 2


RULES = Rules()


def load(path: str | Path) -> dict:
    """A pilot record: ``{"run_id", "params", "tags", "metrics": {key: {step: value}}}``
    with steps as ints; ValueError (one line) when the file is not one."""
    path = Path(path)
    try:
        with gzip.open(path, "rt") if path.name.endswith(".gz") else open(path) as f:
            data = json.load(f)
        metrics = {
            key: {int(step): float(v) for step, v in points.items()}
            for key, points in data["metrics"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: not a collapse-pilot record ({err})") from None
    return {**data, "metrics": metrics, "path": str(path)}


def _point(metrics: dict, key: str, step: int) -> float | None:
    value = metrics.get(key, {}).get(step)
    return None if value is None or not math.isfinite(value) else value


def precondition(metrics: dict, rules: Rules = RULES) -> dict:
    """The mechanism's precondition by mid-run; ``holds`` is None when a metric is missing."""
    low, high = rules.mid_run
    zero = [v for s, v in metrics.get(ZERO_RV, {}).items() if low <= s <= high]
    snr = [_point(metrics, LOW_SNR, s) for s in rules.snr_points]
    zero_mean = sum(zero) / len(zero) if zero else None
    missing = zero_mean is None or any(v is None for v in snr)
    holds = (
        None
        if missing
        else zero_mean >= rules.min_zero_rv_groups and all(v < rules.max_low_snr for v in snr)
    )
    return {"zero_rv_mean": zero_mean, "low_snr": snr, "holds": holds}


def collapse(metrics: dict, rules: Rules = RULES) -> dict:
    """The protocol's collapse reading: ``regime`` is template | low_entropy | format |
    none, or None when the probe was not read at two points."""
    steps = sorted(metrics.get(PROBE + "mi_estimate", {}))
    if len(steps) < 2:
        return {"regime": None, "first": None, "last": None}
    first, last = steps[0], steps[-1]

    def probe(name: str, step: int) -> float | None:
        return _point(metrics, PROBE + name, step)

    mi = [probe("mi_estimate", s) for s in (first, last)]
    mi_low, mi_high = probe("mi_estimate_ci_low", first), probe("mi_estimate_ci_high", last)
    h_first_low = probe("conditional_entropy_est_ci_low", first)
    h_last = probe("conditional_entropy_est", last)
    fmt = metrics.get(FORMAT_OK, {})
    tail = [fmt[s] for s in sorted(fmt)[-rules.format_window :]]
    out = {
        "first": first,
        "last": last,
        "mi": mi,
        "mi_drop": None if None in mi else mi[0] - mi[1],
        "separated": None if None in (mi_low, mi_high) else mi_high < mi_low,
        "h_last": h_last,
        "h_first_low": h_first_low,
        "format_ok_min": min(tail) if tail else None,
        "gap": [_point(metrics, GAP + s, last) for s in ("", "_ci_low", "_ci_high")],
    }
    if None in (out["mi_drop"], out["separated"], h_last, h_first_low, out["format_ok_min"]):
        return {**out, "regime": None}
    lost = out["mi_drop"] >= rules.min_mi_drop and out["separated"]
    if not lost:
        regime = "none"
    elif out["format_ok_min"] < rules.min_format_ok:
        regime = "format"
    elif h_last < h_first_low:
        regime = "low_entropy"
    else:
        regime = "template"
    return {**out, "regime": regime}


def candidate(record: dict) -> str:
    """The candidate a record belongs to (its spec's experiment name, else its file name)."""
    name = record.get("params", {}).get("experiment.name")
    return name or Path(record["path"]).name.rsplit("-", 1)[0]


def read(records: list[dict], rules: Rules = RULES) -> dict[str, dict]:
    """Per candidate: its rows (one per run, by seed) and its verdict."""
    by_candidate: dict[str, list[dict]] = {}
    for record in records:
        metrics = record["metrics"]
        val = metrics.get("val/success", {})
        row = {
            "seed": record.get("params", {}).get("experiment.seed", "?"),
            "precondition": precondition(metrics, rules),
            "collapse": collapse(metrics, rules),
            "val": [val[s] for s in sorted(val)],
        }
        by_candidate.setdefault(candidate(record), []).append(row)
    return {
        name: {"rows": sorted(rows, key=lambda r: str(r["seed"])), **verdict(rows, rules)}
        for name, rows in sorted(by_candidate.items())
    }


def verdict(rows: list[dict], rules: Rules = RULES) -> dict:
    """The qualification rule; ``qualifies`` is None until the candidate's runs are in."""
    held = sum(r["precondition"]["holds"] is True for r in rows)
    collapsed = sum(r["collapse"]["regime"] == "template" for r in rows)
    complete = len(rows) >= rules.runs
    qualifies = (
        held >= rules.min_precondition and collapsed >= rules.min_collapsed if complete else None
    )
    return {
        "precondition_held": held,
        "collapsed": collapsed,
        "runs": len(rows),
        "qualifies": qualifies,
    }


# -- alarm lead times (docs/collapse.md, "Confirmation and lead times") ---------------------
SUCCESS = "mechanism/probe_success"


@dataclass(frozen=True)
class LeadRules:
    """When held-out success counts as fallen: the first of ``hold`` consecutive probe
    points whose ``mechanism/probe_success`` is each at least ``fall`` below the first
    point's (two in a row: a false rate of at most 0.03 over 40 points, docs/collapse.md)."""

    fall: float = 0.10
    hold: int = 2


LEAD_RULES = LeadRules()


def alarms(record: dict) -> dict[str, int]:
    """Each alarm's first iteration, from the run's ``alarm.<name>`` tags."""
    return {
        key.split(".", 1)[1]: int(float(value))
        for key, value in record.get("tags", {}).items()
        if key.startswith("alarm.")
    }


def success_fall(metrics: dict, rules: LeadRules = LEAD_RULES) -> int | None:
    """The first probe point from which held-out success stays ``rules.fall`` below the
    run's first point for ``rules.hold`` points in a row; None when it never does (or was
    not measured)."""
    points = sorted(metrics.get(SUCCESS, {}).items())
    if len(points) < 2:
        return None
    below = [value <= points[0][1] - rules.fall for _, value in points[1:]]
    steps = [step for step, _ in points[1:]]
    return next(
        (steps[i] for i in range(len(below) - rules.hold + 1) if all(below[i : i + rules.hold])),
        None,
    )


def _success_at(metrics: dict, step: int) -> float | None:
    """Held-out success at the last probe point at or before ``step``."""
    points = [(s, v) for s, v in sorted(metrics.get(SUCCESS, {}).items()) if s <= step]
    return points[-1][1] if points else None


def lead_times(records: list[dict], rules: LeadRules = LEAD_RULES) -> list[dict]:
    """Per run and alarm: the alarm's iteration, the iteration success fell, the lead
    (fall minus alarm; positive: the alarm came first; None when success never fell),
    success at the alarm and at the end.  A run without an alarm gets one row, alarm None."""
    rows = []
    for record in records:
        metrics = record["metrics"]
        fall = success_fall(metrics, rules)
        points = sorted(metrics.get(SUCCESS, {}))
        end = metrics[SUCCESS][points[-1]] if points else None
        base = {
            "candidate": candidate(record),
            "seed": record.get("params", {}).get("experiment.seed", "?"),
            "regime": collapse(metrics)["regime"],
            "fall": fall,
            "success_end": end,
        }
        fired = alarms(record) or {None: None}
        for name, step in sorted(fired.items(), key=lambda kv: (kv[1] is None, kv[1] or 0)):
            rows.append(
                {
                    **base,
                    "alarm": name,
                    "alarm_iteration": step,
                    "lead": None if step is None or fall is None else fall - step,
                    "success_at_alarm": None if step is None else _success_at(metrics, step),
                }
            )
    return rows


def alarm_first_rate(rows: list[dict]) -> dict:
    """Among the runs that collapsed (regime template): how many had an alarm at or before
    the success fall (or an alarm while success never fell), with the Wilson 95 % interval."""
    from scipy.stats import binomtest

    by_run: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["regime"] == "template":
            by_run.setdefault((row["candidate"], row["seed"]), []).append(row)
    first = sum(
        any(
            r["alarm_iteration"] is not None
            and (r["fall"] is None or r["alarm_iteration"] <= r["fall"])
            for r in run_rows
        )
        for run_rows in by_run.values()
    )
    n = len(by_run)
    ci = binomtest(first, n).proportion_ci(0.95, method="wilson") if n else None
    low, high = (ci.low, ci.high) if ci else (None, None)
    return {"runs": n, "alarm_first": first, "ci_low": low, "ci_high": high}
