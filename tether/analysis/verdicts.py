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

Only noise-free runs enter a, b and d; c reads every level, of its own runs when given.
Pure functions of ``RunData`` (``tether analyze paper --protocol 2026-11-27``
loads them).

The sensitivity row, a secondary test outside the family (``sensitivity``): over the grid
of entropy coefficient x KL coefficient x top-p ratio, each factor's *spread* (the range
over its levels of the mean final success over the other factors' cells), the top-p
ratio's spread minus each other factor's with a bootstrap interval over cells.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict

import numpy as np

from .decide import NOT_REPRODUCED, REPRODUCED, UNDECIDED, decide, paired_effect, paired_power
from .runs import SUCCESS, RunData, arm_of, collapse_key
from .stats import paired_gain, prompt_points, spearman_rho, t_interval

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
    iteration of every run, a point shared by a seed's arms counted once: at iteration 1
    the arms are one policy (one warm start, no update told apart yet), so their three
    identical points are one measurement, not three."""
    out = {}
    for run in runs:
        z, h, s = (run.metrics.get(k, {}) for k in (PROBE_Z, PROBE_H, SUCCESS))
        for i in sorted(set(z) & set(h) & set(s)):
            out.setdefault((seed(run), i, z[i], h[i], s[i]), (seed(run), z[i], h[i], s[i]))
    return list(out.values())


def _rhos(points) -> tuple[float, float]:
    """Spearman rho of the probe's MI z-score and of its H(Z|X) with training success."""
    z, h, s = (np.array([p[k] for p in points], float) for k in (1, 2, 3))
    return spearman_rho(z, s), spearman_rho(h, s)


#: Row b's readings, each a label and a statistic of (rho(MI z), rho(H)): the protocol of
#: 2026-11-27's (``abs``: does MI predict success better than entropy predicts it, either
#: sign counting) decides; ``signed`` is the 2026-11-23 protocol's, shown beside it; the two
#: components are shown alone.
B_READINGS = {
    "abs": ("rho(MI z) - |rho(H)|  (decides: the protocol of 2026-11-27)", lambda z, h: z - abs(h)),
    "signed": ("rho(MI z) - rho(H)  (the protocol of 2026-11-23)", lambda z, h: z - h),
    "rho_mi_z": ("rho(MI z-score, success)  (the paper: +0.39)", lambda z, h: z),
    "rho_h": ("rho(H(Z|X), success)  (the paper: -0.14)", lambda z, h: h),
}


def b_test(runs: list[RunData], resamples: int = 2000, rng_seed: int = 0) -> dict:
    """Test b in ``paired_effect``'s shape: the statistic on every point, a percentile
    interval and the two one-sided bootstrap p-values from resampling whole seeds.
    ``readings`` holds each of `B_READINGS` on the same resamples (estimate and 95 %
    interval); the verdict is the ``abs`` reading's."""
    points = _points(runs)
    seeds = sorted({p[0] for p in points})
    out = {"n": len(seeds), "direction": 1, "sesoi": SESOI["b"], "sd": math.nan}
    out.update(mean=math.nan, ci_low=math.nan, ci_high=math.nan, points=len(points))
    out.update(p_paper=math.nan, p_short=math.nan, power=math.nan, readings={})
    if len(seeds) < 2 or len(points) < 3:
        return out
    by = defaultdict(list)
    for p in points:
        by[p[0]].append(p)
    rng = np.random.default_rng(rng_seed)
    drawn_rhos = []
    for _ in range(resamples):
        drawn = rng.choice(len(seeds), len(seeds))
        drawn_rhos.append(_rhos([p for k in drawn for p in by[seeds[k]]]))
    whole = _rhos(points)
    samples = {}
    for name, (_, reading) in B_READINGS.items():
        values = np.array([reading(*r) for r in drawn_rhos], float)
        samples[name] = values = values[~np.isnan(values)]
        low, high = np.percentile(values, [2.5, 97.5]) if len(values) else (math.nan,) * 2
        out["readings"][name] = {
            "mean": reading(*whole),
            "ci_low": float(low),
            "ci_high": float(high),
        }
    out.update(out["readings"]["abs"])
    boots = samples["abs"]
    if len(boots):
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


def family(runs: list[RunData], c_runs: list[RunData] | None = None) -> dict[str, dict]:
    """Every test of the family with its verdict (``decide``); c reads ``c_runs`` when
    given (its own records, each seed's levels from one warm start), else ``runs``."""
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
        "c": c_contrasts(runs if c_runs is None else c_runs),
    }
    tests = {k: paired_effect(v, DIRECTION[k], SESOI[k]) for k, v in values.items()}
    tests["b"] = b_test(clean)
    return decide(dict(sorted(tests.items())))


LOSS_SCALE = "filter/loss_scale"


def loss_scales(runs: list[RunData]) -> dict[str, dict]:
    """Per arm of the noise-free runs: the task loss's scale after filtering
    (``filter/loss_scale``, the kept ratio under ``filter.loss_scaling: linear``), its mean
    over each run's iterations, then over the runs with a 95 % t-interval, and the scaling
    the arm ran with.  The d rows compare arms whose task step differs by these factors
    while the KL and entropy terms keep full size, so a success difference between them
    is confounded with step size unless the scaling is ``none``."""
    by_arm = defaultdict(list)
    scaling = defaultdict(set)
    for run in runs:
        if noise(run) == 0.0 and (scale := run.metrics.get(LOSS_SCALE)):
            by_arm[arm_of(run)].append(float(np.mean(list(scale.values()))))
            scaling[arm_of(run)].add(run.params.get("filter.loss_scaling", "?"))
    return {
        arm: {**t_interval(values), "scaling": "/".join(sorted(scaling[arm]))}
        for arm, values in sorted(by_arm.items())
    }


def loss_scale_line(scales: dict[str, dict]) -> str:
    """One line under the family's table: each arm's task-step scale."""
    arms = ", ".join(
        f"{arm} {s['mean']:.3f} [{_num(s['ci_low'], '{:.3f}')}, {_num(s['ci_high'], '{:.3f}')}]"
        f" ({s['scaling']})"
        for arm, s in scales.items()
    )
    return f"task-step scale by arm (filter/loss_scale, d1/d2 compare these): {arms}"


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


def _num(x, fmt="{:+.3f}") -> str:
    """A table's number: "-" for a missing or NaN value."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def family_table(tests: dict[str, dict]):
    """The family as a rich table: each test's mean [95 %], p-values, power and verdict."""
    from rich.table import Table

    table = Table(title="Protocol of 2026-11-27 (docs/reproduction.md)")
    for name in ("test", "seeds", "mean [95 %]", "p / Holm", "power / Holm", "verdict"):
        table.add_column(name)

    for key, t in tests.items():
        table.add_row(
            TESTS.get(key, key),
            str(t["n"]),
            f"{_num(t['mean'])} [{_num(t['ci_low'])}, {_num(t['ci_high'])}]",
            f"{_num(t['p_paper'], '{:.3g}')} / {_num(t['p_paper_holm'], '{:.3g}')}",
            f"{_num(t['power'], '{:.2f}')} / {_num(t.get('power_holm'), '{:.2f}')}",
            t["verdict"] or f"none ({t['because']})",
        )
    return table


def b_readings_table(test: dict):
    """Row b read each way of `B_READINGS`, on one set of seed resamples."""
    from rich.table import Table

    table = Table(title=f"Row b, read both ways ({test['n']} seeds, {test['points']} points)")
    for name in ("reading", "estimate [95 %]"):
        table.add_column(name)
    for key, r in test["readings"].items():
        interval = f"{_num(r['mean'])} [{_num(r['ci_low'])}, {_num(r['ci_high'])}]"
        table.add_row(B_READINGS[key][0], interval)
    return table


#: The sensitivity sweep's factors (experiments/verdicts/sensitivity.yaml), in a reader's words.
FACTORS = {
    "algo.entropy_coef": "entropy coefficient",
    "algo.kl_coef": "KL coefficient",
    "filter.value": "top-p ratio",
}
TOP_P = "filter.value"
#: Levels each factor takes in the protocol's grid (3 x 3 x 3 = 27 cells): the verdict waits
#: for all of them, not for the levels that the parts pooled so far happen to hold.
GRID_LEVELS = 3


def sensitivity_cells(runs: list[RunData]) -> list[dict]:
    """One row per top-p trial with every factor set (the sweep's filter is top-p; other
    arms, e.g. a_d's, are not cells): its levels, final success with the Wilson interval
    its validation logged, and final probe I(X;Z) with its interval."""
    rows = []
    for run in runs:
        final = run.final_success()
        if arm_of(run) != "top_p" or any(run.param(k) is None for k in FACTORS) or final is None:
            continue
        rows.append(
            {
                "run": run.name,
                **{k: float(run.param(k)) for k in FACTORS},
                "success": final,
                "success_ci": run.final_success_interval(),
                "probe_mi": run.last(PROBE_MI),
                "probe_mi_ci": run.last_interval(PROBE_MI),
            }
        )
    return sorted(rows, key=lambda r: tuple(r[k] for k in FACTORS))


def _level_masks(levels: np.ndarray, values: list[np.ndarray]) -> list[np.ndarray]:
    """For each factor, [its levels, cells]: which cells sit at each level."""
    return [levels[:, j][None, :] == vals[:, None] for j, vals in enumerate(values)]


def _spreads(success: np.ndarray, masks: list[np.ndarray]) -> np.ndarray:
    """Each factor's range over its levels of the mean success of the cells at that level
    (NaN when a level has no cell); ``success`` is [cells] or [resamples, cells]."""
    out = []
    for mask in masks:
        with np.errstate(invalid="ignore", divide="ignore"):
            means = (success @ mask.T) / mask.sum(axis=1)  # [..., levels]
        out.append(np.ptp(means, axis=-1))  # NaN propagates from an empty level
    return np.stack(out, axis=-1)


def _spread_test(
    levels: np.ndarray, success: np.ndarray, resamples: int, rng, confidence: float = 0.95
) -> tuple[np.ndarray, list[np.ndarray], dict[int, tuple[float, float, float]]]:
    """The spreads, each factor's levels, and for each factor other than the top-p ratio
    (by column): the top-p spread minus its, with the percentile interval of a residual
    bootstrap: the cells' fitted values under the main-effects model (grand mean plus
    each factor's level mean minus it) plus residuals drawn with replacement, scaled by
    sqrt(n / (n - parameters)) for what the fit absorbed; the grid stays whole."""
    values = [np.unique(levels[:, j]) for j in range(levels.shape[1])]
    masks = _level_masks(levels, values)
    observed = _spreads(success, masks)
    grand = success.mean()
    fitted = np.full(len(success), grand)
    for mask in masks:
        for at in mask:
            fitted[at] += success[at].mean() - grand
    residuals = success - fitted
    fit = 1 + sum(len(v) - 1 for v in values)
    residuals *= np.sqrt(len(success) / max(len(success) - fit, 1))
    draws = rng.integers(0, len(success), (resamples, len(success)))
    boots = _spreads(fitted + residuals[draws], masks)  # [resamples, factors]
    tail = 50 * (1 - confidence)
    t = list(FACTORS).index(TOP_P)
    diffs = {}
    for j in range(levels.shape[1]):
        if j != t:
            diff = boots[:, t] - boots[:, j]
            diff = diff[~np.isnan(diff)]
            low, high = np.percentile(diff, [tail, 100 - tail]) if len(diff) else (np.nan,) * 2
            diffs[j] = (float(observed[t] - observed[j]), float(low), float(high))
    return observed, values, diffs


def _spread_verdict(diffs) -> tuple[str, str]:
    if all(mean < 0 and high < 0 for mean, _, high in diffs):
        return (
            REPRODUCED,
            "the top-p ratio's spread is the smallest, both differences' intervals below 0",
        )
    if all(mean > 0 and low > 0 for mean, low, _ in diffs):
        return (
            NOT_REPRODUCED,
            "the top-p ratio's spread is the largest, both differences' intervals above 0",
        )
    return UNDECIDED, "a difference's interval holds 0"


def sensitivity(
    runs: list[RunData], resamples: int = 2000, rng_seed: int = 0, confidence: float = 0.95
) -> dict:
    """The sensitivity row's test (docs/reproduction.md): the spreads, the top-p ratio's
    spread minus the entropy and KL coefficients' with percentile intervals from a
    residual bootstrap over the cells (``_spread_test``), and the verdict: **reproduced** when the top-p
    spread is the smallest and both differences' intervals lie below 0, **not
    reproduced** when it is the largest and both lie above 0, otherwise undecided; no
    verdict before every cell of the grid has a result."""
    cells = sensitivity_cells(runs)
    keys = list(FACTORS)
    out: dict = {"cells": cells, "spread": {}, "difference": {}, "verdict": None}
    if not cells:
        out["because"] = "no run sets every factor " + ", ".join(keys)
        return out
    levels = np.array([[c[k] for k in keys] for c in cells])
    success = np.array([c["success"] for c in cells])
    rng = np.random.default_rng(rng_seed)
    observed, values, diffs = _spread_test(levels, success, resamples, rng, confidence)
    for j, key in enumerate(keys):
        out["spread"][key] = {"spread": float(observed[j]), "levels": values[j].tolist()}
        if j in diffs:
            out["difference"][key] = dict(zip(("mean", "ci_low", "ci_high"), diffs[j]))
    grid = GRID_LEVELS ** len(keys)
    if len({tuple(row) for row in levels}) < len(cells):
        out["because"] = "a cell has more than one run (pool each part once)"
        return out
    if len(cells) < grid or any(len(v) != GRID_LEVELS for v in values):
        out["because"] = f"{len(cells)} cells with results of the protocol's {grid}-cell grid"
        return out
    out["verdict"], out["because"] = _spread_verdict(diffs.values())
    return out


def sensitivity_power(
    spread: float, sd: float, simulations: int = 200, resamples: int = 500, rng_seed: int = 0
) -> float:
    """The chance that the sensitivity row says reproduced when the entropy and KL
    coefficients each move final success by ``spread`` across their three levels
    (linearly), the top-p ratio not at all, and each cell's final success has noise of
    standard deviation ``sd``: the share of ``simulations`` simulated 27-cell grids."""
    grid = np.array([(i, j, m) for i in range(3) for j in range(3) for m in range(3)], float)
    truth = 0.5 + spread / 2 * (grid[:, 0] - 1) - spread / 2 * (grid[:, 1] - 1)
    rng = np.random.default_rng(rng_seed)
    hits = 0
    for _ in range(simulations):
        success = truth + rng.normal(0, sd, len(truth))
        _, _, diffs = _spread_test(grid, success, resamples, rng)
        hits += _spread_verdict(diffs.values())[0] == REPRODUCED
    return hits / simulations


def sensitivity_tables(row: dict) -> list:
    """The sensitivity row as rich tables: each cell, then the spreads and the verdict."""
    from rich.table import Table

    num = functools.partial(_num, fmt="{:.3f}")  # unsigned by default here

    def interval(x, ci):
        return f"{num(x)} [{num(ci[0])}, {num(ci[1])}]"

    cells = Table(title="Sensitivity sweep: final success and probe I(X;Z) per cell (95 %)")
    for name in (*FACTORS.values(), "final success", "probe I(X;Z)"):
        cells.add_column(name)
    for c in row["cells"]:
        cells.add_row(
            *(f"{c[k]:g}" for k in FACTORS),
            interval(c["success"], c["success_ci"]),
            interval(c["probe_mi"], c["probe_mi_ci"]),
        )
    spreads = Table(title="Spread of mean final success over each factor's levels")
    for name in ("factor", "spread", "top-p ratio's minus it [95 %]"):
        spreads.add_column(name)
    for key, s in row["spread"].items():
        d = row["difference"].get(key)
        diff = (
            "" if d is None else (f"{_num(d['mean'])} [{_num(d['ci_low'])}, {_num(d['ci_high'])}]")
        )
        spreads.add_row(FACTORS[key], num(s["spread"]), diff)
    spreads.caption = f"verdict: {row['verdict'] or 'none'} ({row['because']})"
    return [cells, spreads]


# ------------------------------------------------------------------ act against warn

#: Act against warn (docs/reproduction.md, the amendment of 2026-11-29, night): secondary,
#: each test one-sided at 0.05 on its own (no Holm), act minus warn per seed.
AVW_SESOI = {"probe_mi": 0.05, "success": 0.10}
AVW_VERDICTS = {
    REPRODUCED: "acting helps",
    NOT_REPRODUCED: "acting does not help by the SESOI",
    UNDECIDED: UNDECIDED,
}
#: warn "collapses early" when one of these alarms fires at or before this iteration
EARLY_ALARMS, EARLY_BY = ("reading_drift", "template_collapse"), 24


def mode_of(run: RunData) -> str:
    """A benchmark run's condition: ``act`` or ``warn`` (the template alarm's mode)."""
    return run.param("alarms.template_collapse.mode") or "warn"


def final_probe_mi(run: RunData) -> float | None:
    return run.last(PROBE_MI)


def first_turn_mi_last3(run: RunData) -> float | None:
    """The benchmark's own MI measure: first-turn I(X;Z) averaged over the last 3 points."""
    points = run.metrics.get(collapse_key("first_turn", "mi_estimate"), {})
    last = sorted(points)[-3:]
    return float(np.mean([points[s] for s in last])) if last else None


def first_alarm(run: RunData, names=EARLY_ALARMS) -> tuple[int, str] | None:
    """The first (iteration, name) among ``names`` that the run raised (None: never)."""
    return next(((i, n) for i, n in run.alarm_steps() if n in names), None)


def act_vs_warn(runs: list[RunData]) -> dict:
    """The act-against-warn row: per seed, each arm's final probe I(X;Z), final success,
    first early alarm (warn) and actions (act); the two paired tests with their verdicts;
    and how many seeds' warn runs collapsed early (the setting's condition)."""
    tests = {}
    for name, value in (("probe_mi", final_probe_mi), ("success", RunData.final_success)):
        gain = paired_gain(runs, "act", "warn", value, arm=mode_of).get("all", {})
        effect = paired_effect(gain.get("differences", []), 1, AVW_SESOI[name])
        decided = decide({name: effect})[name]  # a family of one: Holm leaves p as it is
        tests[name] = {**decided, "verdict": AVW_VERDICTS.get(decided["verdict"])}
    shown = paired_gain(runs, "act", "warn", first_turn_mi_last3, arm=mode_of).get("all", {})
    seeds = []
    by_seed: dict[str, dict[str, RunData]] = defaultdict(dict)
    for run in runs:
        by_seed[seed(run)][mode_of(run)] = run
    for s, arms in sorted(by_seed.items()):
        row: dict = {"seed": s}
        for mode, run in sorted(arms.items()):
            row[mode] = {
                "probe_mi": final_probe_mi(run),
                "first_turn_mi_last3": first_turn_mi_last3(run),
                "success": run.final_success(),
                "success_ci": run.final_success_interval(),
                "first_alarm": first_alarm(run),
                "actions": [(i, n) for i, n in run.alarm_steps() if n.startswith("action:")],
            }
        seeds.append(row)
    warned = [r["warn"] for r in seeds if "warn" in r]
    early = sum(1 for w in warned if w["first_alarm"] and w["first_alarm"][0] <= EARLY_BY)
    return {
        "tests": tests,
        # described, not tested: the benchmark's own MI measure, act minus warn
        "first_turn_mi_last3": t_interval(shown.get("differences", [])),
        "seeds": seeds,
        "warn_collapsed_early": early,
        "warn_runs": len(warned),
        "meets_condition": len(warned) > 0 and early > len(warned) / 2,
    }


def act_vs_warn_tables(row: dict) -> list:
    """The act-against-warn row as rich tables: each seed's arms, then the two tests."""
    from rich.table import Table

    def arm(a: dict | None) -> list[str]:
        if a is None:
            return ["-"] * 3
        alarm = a["first_alarm"]
        low, high = a["success_ci"]
        return [
            _num(a["probe_mi"], "{:.3f}"),
            f"{_num(a['success'], '{:.3f}')} [{_num(low, '{:.3f}')}, {_num(high, '{:.3f}')}]",
            f"{alarm[1]} at {alarm[0]}" if alarm else "none",
        ]

    per_seed = Table(title="Act against warn: each seed's final probe I(X;Z) and success")
    for name in ("seed", "warn MI", "warn success", "warn's first alarm"):
        per_seed.add_column(name)
    for name in ("act MI", "act success", "act's first alarm", "act's actions"):
        per_seed.add_column(name)
    for r in row["seeds"]:
        act = r.get("act")
        actions = ", ".join(f"{n.split(':')[1]} at {i}" for i, n in act["actions"]) if act else "-"
        per_seed.add_row(r["seed"], *arm(r.get("warn")), *arm(act), actions or "none")
    tests = Table(title="Act minus warn (one-sided at 0.05 each, no Holm)")
    for name in ("measure", "seeds", "mean [95 %]", "SESOI", "p (helps) / p (< SESOI)", "power"):
        tests.add_column(name)
    tests.add_column("verdict")
    for key, t in row["tests"].items():
        tests.add_row(
            {"probe_mi": "final probe I(X;Z)", "success": "final success"}[key],
            str(t["n"]),
            f"{_num(t['mean'])} [{_num(t['ci_low'])}, {_num(t['ci_high'])}]",
            f"{t['sesoi']:g}",
            f"{_num(t['p_paper'], '{:.3g}')} / {_num(t['p_short'], '{:.3g}')}",
            _num(t["power"], "{:.2f}"),
            t["verdict"] or f"none ({t['because']})",
        )
    shown = row["first_turn_mi_last3"]
    tests.add_row(
        "first-turn I(X;Z), last 3 points",
        str(shown["n"]),
        f"{_num(shown['mean'])} [{_num(shown['ci_low'])}, {_num(shown['ci_high'])}]",
        "",
        "",
        "",
        "described, not tested",
    )
    tests.caption = (
        f"warn collapsed early ({' or '.join(EARLY_ALARMS)} by iteration {EARLY_BY}) in "
        f"{row['warn_collapsed_early']} of {row['warn_runs']} seeds"
        + ("" if row["meets_condition"] else ": fewer than half, the setting's condition unmet")
    )
    return [per_seed, tests]
