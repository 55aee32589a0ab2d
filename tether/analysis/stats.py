"""The paper's cross-run numbers (docs/methods.md, section 13), as pure functions of
``RunData``.

- ``spearman_table``: each diagnostic against task success over every (run, checkpoint)
  where both were logged, with a Fisher-z confidence interval (Bonett & Wright's
  variance for Spearman's rho);
- ``rv_quartiles``: prompt groups (the paper's unit) by reward-variance quartile, with
  mean success and pointwise MI per quartile;
- ``regimes``: each run's path in the (H(Z|X), I(X;Z)) plane and the regime
  (docs/methods.md, section 1) of its last point;
- ``stochasticity_curves`` and ``sensitivity_trajectories``: the sweeps' views;
- ``t_interval`` and ``paired_gain``: per-seed differences between two filter arms, with
  their t-interval (the reproduction's old and new verdicts both use them).
Each returns its rows plus ``notes`` naming what could not be computed and why.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from .runs import SUCCESS, RunData, arm_of, collapse_key, diagnostic_key

REGIMES = {
    (True, True): "diverse and grounded",
    (True, False): "template collapse",
    (False, True): "compressed but grounded",
    (False, False): "low-entropy collapse",
}


@dataclass
class Result:
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def paired_points(
    runs: list[RunData], x_key: str, y_key: str
) -> tuple[np.ndarray, np.ndarray, list]:
    """Values of two metrics at every (run, step) where both were logged."""
    xs, ys, where = [], [], []
    for run in runs:
        x, y = run.metrics.get(x_key, {}), run.metrics.get(y_key, {})
        for step in sorted(set(x) & set(y)):
            xs.append(x[step]), ys.append(y[step]), where.append((run.run_id, step))
    return np.array(xs, dtype=float), np.array(ys, dtype=float), where


def spearman_ci(x, y, confidence: float = 0.95) -> dict:
    """Spearman's rho and p-value (scipy) with a Fisher-z interval, SE² = (1 + rho²/2)/(n − 3)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    out = {"n": n, "rho": math.nan, "p": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    res = stats.spearmanr(x, y)
    rho = float(res.statistic)
    out.update(rho=rho, p=float(res.pvalue))
    if n > 3:
        if abs(rho) >= 1:
            out.update(ci_low=rho, ci_high=rho)
        else:
            se = math.sqrt((1 + rho * rho / 2) / (n - 3))
            z, zc = math.atanh(rho), float(stats.norm.ppf(0.5 + confidence / 2))
            out.update(ci_low=math.tanh(z - zc * se), ci_high=math.tanh(z + zc * se))
    return out


#: Said beside every comparison of MI with entropy (finding b).
SHARED_MATRIX_NOTE = (
    "H(Z|X) (conditional_entropy_est) and H(Z) (reasoning_entropy_est) come from the same "
    "cross-score matrix as the MI estimates (H(Z|X) = -mean(matched), H(Z) = -mean(marginal), "
    "mi_estimate = H(Z) - H(Z|X)), so they are not independent measurements of the policy; "
    "reasoning_token_entropy is the policy's token entropy on the reasoning tokens of the "
    "update (a separate forward pass)"
)


def spearman_table(
    runs: list[RunData],
    sampling: str,
    diagnostics,
    success_key: str = SUCCESS,
    confidence: float = 0.95,
) -> Result:
    result = Result()
    for name in diagnostics:
        key = diagnostic_key(sampling, name)
        x, y, _ = paired_points(runs, key, success_key)
        if len(x) == 0:
            result.notes.append(f"{key}: not logged together with {success_key} in any run")
            continue
        row = {"diagnostic": name, "metric": key, **spearman_ci(x, y, confidence)}
        if math.isnan(row["rho"]):
            result.notes.append(
                f"{key}: Spearman undefined on {len(x)} checkpoint(s) "
                f"(needs ≥ 3 with both series varying)"
            )
        result.rows.append(row)
    if result.rows:
        result.notes.append(SHARED_MATRIX_NOTE)
    return result


def spearman_rho(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho, NaN with fewer than 3 points or a constant side."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(stats.spearmanr(x, y).statistic)


def spearman_by_run_bootstrap(
    runs: list[RunData],
    sampling: str,
    diagnostics,
    reference: str = "conditional_entropy_est",
    success_key: str = SUCCESS,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Result:
    """Spearman's rho of each diagnostic with success, and its difference from the
    ``reference`` diagnostic's rho, with percentile intervals from a bootstrap that draws
    whole runs with replacement (a run's checkpoints are not independent of each other,
    which the Fisher-z interval of ``spearman_table`` assumes).  Every resample draws the
    same runs for all diagnostics.  A diagnostic and the reference are paired with success
    at the same (run, step) points (where all three were logged), so each difference
    compares two correlations on identical points."""
    result = Result()
    ref_key = diagnostic_key(sampling, reference)
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, len(runs), len(runs)) for _ in range(resamples)] if runs else []
    tail = 100 * (1 - confidence) / 2

    def interval(values: list[float]) -> tuple[float, float]:
        values = np.asarray(values, float)
        values = values[~np.isnan(values)]
        if len(values) < 0.9 * resamples:  # undefined in too many resamples: no interval
            return math.nan, math.nan
        lo, hi = np.percentile(values, [tail, 100 - tail])
        return float(lo), float(hi)

    for name in diagnostics:
        key = diagnostic_key(sampling, name)
        per_run = []  # (diagnostic, reference, success) at the run's common steps, or None
        for run in runs:
            x, ref, y = (run.metrics.get(k, {}) for k in (key, ref_key, success_key))
            steps = sorted(set(x) & set(ref) & set(y))
            per_run.append(
                np.array(
                    [[x[t] for t in steps], [ref[t] for t in steps], [y[t] for t in steps]],
                    dtype=float,
                )
                if steps
                else None
            )
        used = [a for a in per_run if a is not None]
        n = sum(a.shape[1] for a in used)
        if len(used) < 2 or n < 4:
            result.notes.append(
                f"{key}: by-run bootstrap needs >= 2 runs and >= 4 checkpoints "
                f"with {ref_key} and {success_key}; found {len(used)} run(s), "
                f"{n} checkpoint(s)"
            )
            continue

        def both(indices, per_run=per_run) -> tuple[float, float]:
            parts = [per_run[i] for i in indices if per_run[i] is not None]
            if not parts:
                return math.nan, math.nan
            a = np.concatenate(parts, axis=1)
            return spearman_rho(a[0], a[2]), spearman_rho(a[1], a[2])

        rho, rho_ref = both(range(len(runs)))
        boot = [both(d) for d in draws]
        lo, hi = interval([b[0] for b in boot])
        row = {
            "diagnostic": name,
            "runs": len(used),
            "n": n,
            "rho": rho,
            "ci_low": lo,
            "ci_high": hi,
        }
        if key != ref_key:
            dlo, dhi = interval([b[0] - b[1] for b in boot])
            row.update(
                {"ref_rho": rho_ref, "diff": rho - rho_ref, "diff_ci_low": dlo, "diff_ci_high": dhi}
            )
        result.rows.append(row)
    if result.rows:
        result.notes.append(
            f"{confidence:.0%} percentile intervals over {resamples} resamples "
            f"of whole runs (seed {seed}); diff = rho - rho({reference}) "
            "on the same points"
        )
        result.notes.append(SHARED_MATRIX_NOTE)
    return result


def quartile_of(values: np.ndarray) -> np.ndarray:
    """Quartile 1..4 of each value by the sample's quartile edges, right-closed bins
    (a value equal to an edge goes to the lower quartile, as ``pandas.qcut``)."""
    edges = np.quantile(values, [0.25, 0.5, 0.75])
    return 1 + np.searchsorted(edges, values, side="left")


def group_rv(rewards) -> float:
    """A prompt's reward variance RV (ddof 1, the filter's default; 0 with < 2 rewards)."""
    r = np.asarray(rewards, dtype=float)
    return float(r.var(ddof=1)) if r.size > 1 else 0.0


def prompt_points(runs: list[RunData]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """Finding d's unit, as the paper's: prompt groups, not batch means.  One point per
    (run, diagnosed iteration, group) of the runs' ``prompt_mi`` records: the group's
    reward variance, its success rate (mean of its success flags) and the pointwise MI of
    its first-turn prompt (NaN when none of its pairs was scored) -> (rv, success, mi,
    where), ``where`` = (run id, iteration, group id)."""
    rv, success, mi, where = [], [], [], []
    for run in runs:
        for it in sorted(run.prompt_mi):
            for group in run.prompt_mi[it]:
                flags = group.get("success") or []
                if not group.get("rewards") or not flags:
                    continue
                rv.append(group_rv(group["rewards"]))
                success.append(float(np.mean(flags)))
                mi.append(math.nan if group.get("mi") is None else float(group["mi"]))
                where.append((run.run_id, int(it), int(group["group_id"])))
    return np.array(rv, float), np.array(success, float), np.array(mi, float), where


def rv_quartiles(runs: list[RunData], mi_name: str = "mi_estimate") -> Result:
    """Mean success and MI per quartile of reward variance over prompt groups
    (``prompt_points``), as the paper's finding d.  Quartile edges are the sample's
    quartiles and a value on an edge goes to the lower quartile (``quartile_of``), so when
    more than a quarter of the prompts share one RV (e.g. zero-variance groups) a quartile
    can be empty: its row says n = 0.  The MI is the first-turn pointwise MI of each
    prompt's share of ``mi_estimate`` (``mi_name`` names it in the notes)."""
    result = Result()
    rv, success, mi, where = prompt_points(runs)
    if len(rv) < 4:
        result.notes.append(
            f"RV quartiles need >= 4 prompt groups with prompt-level diagnostics "
            f"(prompt_mi/iter_N.json, logged at each diagnostic point); found {len(rv)}"
        )
        return result
    quartile = quartile_of(rv)
    if np.isnan(mi).all():
        result.notes.append(f"{mi_name}: no prompt-level MI; RV quartiles show success only")
    for q in range(1, 5):
        sel = quartile == q
        has_mi = sel & ~np.isnan(mi)
        result.rows.append(
            {
                "quartile": q,
                "n": int(sel.sum()),
                "rv_low": float(rv[sel].min()) if sel.any() else math.nan,
                "rv_high": float(rv[sel].max()) if sel.any() else math.nan,
                "success": float(success[sel].mean()) if sel.any() else math.nan,
                "mi_n": int(has_mi.sum()),
                "mi": float(mi[has_mi].mean()) if has_mi.any() else math.nan,
            }
        )
    empty = [r["quartile"] for r in result.rows if r["n"] == 0]
    if empty:
        result.notes.append(
            f"RV quartile(s) {empty} empty: more than a quarter of the {len(rv)} prompt groups "
            "share one reward variance (ties go to the lower quartile)"
        )
    result.extra["assignments"] = {w: int(q) for w, q in zip(where, quartile)}
    return result


#: H(Z|X) per reasoning token above which reasoning counts as high-entropy (nats/token):
#: about 1.6 equally likely choices per token; a template written near-deterministically
#: sits far below it, sampled free text far above.
ENTROPY_THRESHOLD = 0.5


def _side(low: float | None, high: float | None, threshold: float) -> bool | None:
    """True above, False below, None when the interval straddles (or is missing)."""
    if low is None or high is None:
        return None
    return True if low >= threshold else False if high < threshold else None


def regimes(
    runs: list[RunData],
    sampling: str,
    h_name: str = "conditional_entropy_est",
    mi_name: str = "mi_estimate",
    alpha: float = 0.05,
    entropy_threshold: float = ENTROPY_THRESHOLD,
) -> Result:
    """Each run's (H(Z|X), I(X;Z)) path and the regime of its last diagnosed point, by
    absolute criteria (never relative to the other runs in the report):

    - grounded vs input-blind: the permutation test of input dependence logged with the
      proxies (``p_grounded`` < ``alpha``: grounded; otherwise input-blind);
    - high vs low entropy: the H(Z|X) interval against ``entropy_threshold`` (nats/token);
    - "undetermined" when the interval straddles the threshold or a test is missing.
    """
    result = Result()
    h_key, mi_key = collapse_key(sampling, h_name), collapse_key(sampling, mi_name)
    p_key = collapse_key(sampling, "p_grounded")
    paths = {}
    for run in runs:
        h, mi, where = paired_points([run], h_key, mi_key)
        if len(h):
            paths[run.run_id] = (np.array([s for _, s in where]), h, mi)
        else:
            result.notes.append(f"{run.name}: no {h_key} with {mi_key}; not on the regime plot")
    for run in runs:
        if run.run_id not in paths:
            continue
        steps, h, mi = paths[run.run_id]
        step = int(steps[-1])

        def at(key, run=run, step=step):
            return run.metrics.get(key, {}).get(step)

        p = at(p_key)
        grounded = None if p is None else bool(p < alpha)
        high = _side(at(f"{h_key}_ci_low"), at(f"{h_key}_ci_high"), entropy_threshold)
        if grounded is None or high is None:
            missing = (
                "no input-dependence test"
                if grounded is None
                else f"H(Z|X) interval straddles {entropy_threshold:g}"
            )
            regime = f"undetermined ({missing})"
        else:
            regime = REGIMES[(high, grounded)]
        result.rows.append(
            {
                "run_id": run.run_id,
                "run": run.name,
                "step": step,
                "entropy": float(h[-1]),
                "entropy_ci_low": at(f"{h_key}_ci_low"),
                "entropy_ci_high": at(f"{h_key}_ci_high"),
                "mi": float(mi[-1]),
                "mi_ci_low": at(f"{mi_key}_ci_low"),
                "mi_ci_high": at(f"{mi_key}_ci_high"),
                "p_grounded": p,
                "regime": regime,
            }
        )
    result.extra.update(
        paths=paths, h_key=h_key, mi_key=mi_key, alpha=alpha, entropy_threshold=entropy_threshold
    )
    if result.rows:
        result.notes.append(
            f"regimes: grounded = p_grounded < {alpha:g} (permutation test); high "
            f"entropy = H(Z|X) interval above {entropy_threshold:g} nats/token"
        )
    return result


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _sort_key(value):
    return (0, value, "") if isinstance(value, float) else (1, 0.0, str(value))


def filter_label(run: RunData) -> str:
    strategy = run.param("filter.strategy") or "none"
    return "none" if strategy == "none" else "filter"


def stochasticity_curves(runs: list[RunData], path: str = "env.stochasticity") -> Result:
    """Final success against the env's stochasticity, filter vs none (mean over seeds),
    and the filter's gain at every level both were run."""
    result = Result()
    cells: dict[tuple[str, float], list[float]] = {}
    for run in runs:
        p, success = _number(run.param(path)), run.final_success()
        if not isinstance(p, float) or success is None:
            continue
        cells.setdefault((filter_label(run), p), []).append(success)
    levels = sorted({p for _, p in cells})
    if len(levels) < 2:
        result.notes.append(
            f"success vs stochasticity needs runs at ≥ 2 values of {path}; found {len(levels)}"
        )
        return result
    for p in levels:
        row = {"stochasticity": p}
        for label in ("filter", "none"):
            row[label] = float(np.mean(cells[(label, p)])) if (label, p) in cells else math.nan
            row[f"{label}_runs"] = len(cells.get((label, p), []))
        row["gain"] = row["filter"] - row["none"]
        result.rows.append(row)
    if not any(r["none_runs"] for r in result.rows) or not any(
        r["filter_runs"] for r in result.rows
    ):
        result.notes.append(
            "success vs stochasticity: no runs without a filter or none with "
            "one; the gain is undefined"
        )
    return result


def sensitivity_trajectories(
    runs: list[RunData], fields: list[str], mi_key: str, base: dict | None = None
) -> Result:
    """For each swept field, its values in order, each as (final I(X;Z), final success)
    with 95 % intervals. With ``base`` (a one-at-a-time sweep's base values) a field's
    trajectory holds the trials that vary only that field; without it (a product grid)
    each value is the mean over the trials at that value, whatever the other fields. A
    value's interval is the t-interval over its trials; a value of one trial has the
    interval that trial logged (its validation's Wilson interval, its MI's interval)."""
    result = Result()
    values = {f: [_number(r.param(f)) for r in runs] for f in fields}
    for f in fields:
        chosen = [
            k
            for k in range(len(runs))
            if base is None
            or all(str(values[g][k]) == str(_number(base.get(g))) for g in fields if g != f)
        ]
        points: dict = {}
        for k in chosen:
            run = runs[k]
            mi, success = run.last(mi_key), run.final_success()
            if values[f][k] is None or success is None:
                continue
            points.setdefault(values[f][k], []).append((mi, success, run))
        if len(points) < 2:
            result.notes.append(
                f"sensitivity of {f}: {len(points)} value(s) with results"
                + (
                    " among the trials whose other swept fields are at their base value"
                    if base is not None
                    else ""
                )
                + "; no trajectory, the point alone"
            )
            if not points:
                continue
        for value in sorted(points, key=_sort_key):
            at = points[value]
            trials = [r for _, _, r in at]
            mi = _value_interval(
                [m for m, _, _ in at], [r.last_interval(mi_key) for r in trials if r.has(mi_key)]
            )
            success = _value_interval(
                [s for _, s, _ in at], [r.final_success_interval() for r in trials]
            )
            result.rows.append(
                {
                    "field": f,
                    "value": value,
                    "runs": len(at),
                    "mi": mi["mean"],
                    "mi_ci_low": mi["ci_low"],
                    "mi_ci_high": mi["ci_high"],
                    "success": success["mean"],
                    "success_ci_low": success["ci_low"],
                    "success_ci_high": success["ci_high"],
                }
            )
        if not any(m is not None for pts in points.values() for m, _, _ in pts):
            result.notes.append(f"sensitivity of {f}: {mi_key} not logged; success only")
    return result


def _value_interval(values: list, logged: list[list[float | None]]) -> dict:
    """Mean and 95 % t-interval of one swept value's trials; for a single trial, the
    interval it ``logged`` with that value (NaN where it logged none)."""
    out = t_interval(values)
    if out["n"] == 1 and len(logged) == 1:
        low, high = logged[0]
        if low is not None and high is not None:
            out.update(ci_low=float(low), ci_high=float(high))
    return out


def t_interval(values, confidence: float = 0.95) -> dict:
    """Mean and Student-t interval of independent values (e.g. one per seed)."""
    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], float)
    out = {
        "n": len(v),
        "mean": float(v.mean()) if len(v) else math.nan,
        "ci_low": math.nan,
        "ci_high": math.nan,
    }
    if len(v) >= 2:
        half = float(
            stats.t.ppf(0.5 + confidence / 2, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))
        )
        out.update(ci_low=out["mean"] - half, ci_high=out["mean"] + half)
    return out


def final_success(run: RunData) -> float | None:
    return run.final_success()


def paired_gain(
    runs: list[RunData],
    treated: str,
    control: str,
    value=final_success,
    by: tuple[str, ...] = (),
    arm=arm_of,
) -> dict:
    """Per seed (and per value of each ``by`` param): ``value(treated) - value(control)``
    between the runs of two arms with the same seed (``arm(run)`` names a run's arm: its
    filter by default); mean and t-interval over seeds in each cell."""
    cells: dict[tuple, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for run in runs:
        v = value(run)
        if v is None:
            continue
        cell = tuple(float(run.param(p)) for p in by)
        cells[cell][arm(run)][str(run.param("experiment.seed"))] = v
    out = {}
    for cell, arms in sorted(cells.items()):
        seeds = sorted(set(arms.get(treated, {})) & set(arms.get(control, {})))
        diffs = [arms[treated][s] - arms[control][s] for s in seeds]
        label = ",".join(f"{p}={c:g}" for p, c in zip(by, cell)) or "all"
        out[label] = {
            "seeds": seeds,
            "differences": diffs,
            **t_interval(diffs),
            treated: t_interval(list(arms.get(treated, {}).values())),
            control: t_interval(list(arms.get(control, {}).values())),
        }
    return out
