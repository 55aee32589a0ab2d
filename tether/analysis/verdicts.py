"""The tests of docs/reproduction.md's protocol of 2026-11-27, from run histories.

Seven tests, one family (Holm-corrected by ``decide.decide``), each a difference per
RL seed between arms that share the seed's warm start, or for b a correlation
bootstrapped over seeds:

- a1: the no-filter arm's I(X;Z) on the probe set, last diagnosed iteration minus first
  (the paper: it falls);
- a2: that change, top-p minus no filter (the paper: the filter keeps more);
- d1, d2: final success, top-p minus no filter and top-p minus top-k;
- d3: the seed's prompt groups by reward-variance quartile, mean first-turn pointwise MI
  of the top quartile minus the bottom (the paper: MI rises with RV);
- b: Spearman rho(probe MI z-score, success) minus abs(rho(probe H(Z|X), success)) over
  every (run, diagnosed iteration), whole seeds resampled;
- c: the filter's gain in final success at 20 % noise minus the mean of its gains at 0 %
  and 100 %.

Only noise-free runs enter a, b and d; c reads every level.  Pure functions of
``RunData`` (``python -m tether.analysis.paper --protocol 2026-11-27`` loads them).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from .decide import decide, paired_effect, paired_power
from .runs import SUCCESS, RunData, arm_of, collapse_key
from .stats import paired_gain, prompt_points, spearman_rho

PROBE_MI = collapse_key("probe", "mi_estimate")
PROBE_Z = collapse_key("probe", "mi_zscore")
PROBE_H = collapse_key("probe", "conditional_entropy_est")
#: The smallest effects of interest the protocol fixed before its runs.
SESOI = {"a1": 0.08, "a2": 0.05, "d1": 0.10, "d2": 0.10, "d3": 0.05, "b": 0.27, "c": 0.10}
DIRECTION = {"a1": -1, "a2": 1, "d1": 1, "d2": 1, "d3": 1, "b": 1, "c": 1}
NOISE_LEVELS = (0.0, 0.2, 1.0)


def noise(run: RunData) -> float:
    return float(run.param("env.stochasticity") or 0.0)


def seed(run: RunData) -> str:
    return str(run.param("experiment.seed"))


def probe_mi_change(run: RunData) -> float | None:
    """Probe I(X;Z) at the last diagnosed iteration minus at the first (None with < 2)."""
    points = run.metrics.get(PROBE_MI, {})
    if len(points) < 2:
        return None
    return points[max(points)] - points[min(points)]


def differences(runs: list[RunData], treated: str, control: str, value) -> list[float]:
    """value(treated) - value(control) per seed, over seeds both arms have (``paired_gain``)."""
    return paired_gain(runs, treated, control, value).get("all", {}).get("differences", [])


def quartile_gap(runs: list[RunData]) -> float | None:
    """Mean pointwise MI of the top reward-variance quartile of prompt groups minus the
    bottom's.  With 0/1 rewards in groups of 8 a group's RV takes five values, so the
    quartiles are inclusive: the top holds every group at or above the 75th percentile
    of RV, the bottom every group at or below the 25th (never empty; None when they are
    the same groups, all at one RV, or hold no MI)."""
    rv, _, mi, _ = prompt_points(runs)
    scored = ~np.isnan(mi)
    rv, mi = rv[scored], mi[scored]
    if len(rv) < 8:
        return None
    low, high = np.quantile(rv, [0.25, 0.75])
    if low == high:
        return None
    return float(mi[rv >= high].mean() - mi[rv <= low].mean())


def _points(runs: list[RunData]) -> list[tuple[str, float, float, float]]:
    """(seed, probe MI z-score, probe H(Z|X), training success) at every diagnosed
    iteration of every run."""
    out = []
    for run in runs:
        z, h, s = (run.metrics.get(k, {}) for k in (PROBE_Z, PROBE_H, SUCCESS))
        out += [(seed(run), z[i], h[i], s[i]) for i in sorted(set(z) & set(h) & set(s))]
    return out


def _b_statistic(points) -> float:
    z, h, s = (np.array([p[k] for p in points], float) for k in (1, 2, 3))
    return spearman_rho(z, s) - abs(spearman_rho(h, s))


def b_test(runs: list[RunData], resamples: int = 2000, rng_seed: int = 0) -> dict:
    """Test b in ``paired_effect``'s shape: the statistic on every point, a percentile
    interval and the two one-sided bootstrap p-values from resampling whole seeds."""
    points = _points(runs)
    seeds = sorted({p[0] for p in points})
    out = {"n": len(seeds), "direction": 1, "sesoi": SESOI["b"], "sd": math.nan}
    out.update(mean=math.nan, ci_low=math.nan, ci_high=math.nan)
    out.update(p_paper=math.nan, p_short=math.nan, power=math.nan)
    if len(seeds) < 2 or len(points) < 3:
        return out
    by = defaultdict(list)
    for p in points:
        by[p[0]].append(p)
    rng = np.random.default_rng(rng_seed)
    boots = []
    for _ in range(resamples):
        drawn = rng.choice(len(seeds), len(seeds))
        boots.append(_b_statistic([p for k in drawn for p in by[seeds[k]]]))
    boots = np.asarray(boots)
    boots = boots[~np.isnan(boots)]
    out["mean"] = _b_statistic(points)
    if len(boots):
        out["ci_low"], out["ci_high"] = (float(x) for x in np.percentile(boots, [2.5, 97.5]))
        # The bootstrap's spread is the statistic's standard error; as the per-seed SD that
        # ``paired_power`` takes (it divides by sqrt(n)) that is se x sqrt(n).
        out["sd"] = float(boots.std(ddof=1)) * math.sqrt(len(seeds))
        out["power"] = paired_power(len(seeds), SESOI["b"], out["sd"])
        out["p_paper"] = float((1 + (boots <= 0).sum()) / (1 + len(boots)))
        out["p_short"] = float((1 + (boots >= SESOI["b"]).sum()) / (1 + len(boots)))
    return out


def c_contrasts(runs: list[RunData]) -> list[float]:
    """Per seed with every level: gain at 20 % minus the mean gain at 0 % and 100 %."""
    cells = paired_gain(runs, "top_p", "none", by=("env.stochasticity",))
    gains = {
        level: dict(zip(cell["seeds"], cell["differences"]))
        for level, cell in ((float(k.split("=")[1]), c) for k, c in cells.items())
    }
    if not all(level in gains for level in NOISE_LEVELS):
        return []
    seeds = sorted(set.intersection(*(set(gains[level]) for level in NOISE_LEVELS)))
    return [gains[0.2][s] - (gains[0.0][s] + gains[1.0][s]) / 2 for s in seeds]


def family(runs: list[RunData]) -> dict[str, dict]:
    """Every test of the family with its verdict (``decide``)."""
    clean = [r for r in runs if noise(r) == 0.0]
    final = RunData.final_success
    per_seed = defaultdict(list)
    for run in clean:
        per_seed[seed(run)].append(run)
    none_change = [probe_mi_change(r) for r in clean if arm_of(r) == "none"]
    values = {
        "a1": [v for v in none_change if v is not None],
        "a2": differences(clean, "top_p", "none", probe_mi_change),
        "d1": differences(clean, "top_p", "none", final),
        "d2": differences(clean, "top_p", "top_k", final),
        "d3": [g for rs in per_seed.values() if (g := quartile_gap(rs)) is not None],
        "c": c_contrasts(runs),
    }
    tests = {k: paired_effect(v, DIRECTION[k], SESOI[k]) for k, v in values.items()}
    tests["b"] = b_test(clean)
    return decide(dict(sorted(tests.items())))


#: What each test compares, in a reader's words (the table's first column).
TESTS = {
    "a1": "a1. no filter: probe I(X;Z) change",
    "a2": "a2. I(X;Z) change, top-p - none",
    "b": "b. rho(MI z) - |rho(H(Z|X))|",
    "c": "c. gain at 20 % - gain at 0/100 %",
    "d1": "d1. success, top-p - none",
    "d2": "d2. success, top-p - top-k",
    "d3": "d3. MI, top - bottom RV quartile",
}


def family_table(tests: dict[str, dict]):
    """The family as a rich table: each test's mean [95 %], p-values, power and verdict."""
    from rich.table import Table

    table = Table(title="Protocol of 2026-11-27 (docs/reproduction.md)")
    for name in ("test", "seeds", "mean [95 %]", "p / Holm", "power / Holm", "verdict"):
        table.add_column(name)

    def num(x, fmt="{:+.3f}"):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)

    for key, t in tests.items():
        table.add_row(
            TESTS.get(key, key),
            str(t["n"]),
            f"{num(t['mean'])} [{num(t['ci_low'])}, {num(t['ci_high'])}]",
            f"{num(t['p_paper'], '{:.3g}')} / {num(t['p_paper_holm'], '{:.3g}')}",
            f"{num(t['power'], '{:.2f}')} / {num(t.get('power_holm'), '{:.2f}')}",
            t["verdict"] or f"none ({t['because']})",
        )
    return table
