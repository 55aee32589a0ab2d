"""The tests behind docs/reproduction.md's verdicts, as pure functions of ``RunData``.

Each finding of the reproduction suite (``experiments/paper/``) is decided by a test
stated in docs/reproduction.md before its confirmatory runs; this module computes them:

- ``collapse_rows`` / ``collapse_verdict`` (finding a): per run, did first-turn I(X;Z) fall
  from a significant iteration-1 value beyond the uncertainty of both estimates while
  H(Z|X) did not fall beyond its own, and how many seeds of each arm did so;
- ``paired_gain`` (findings a, c, d): a per-seed difference between two arms of a sweep,
  its mean and t-interval over seeds;
- ``quartile_trend`` (finding d): MI and success by reward-variance quartile of prompt
  groups (the paper's unit), monotone or not, and the top-minus-bottom quartile
  difference with a Welch interval;
- ``spearman_by_run_bootstrap`` (finding b, the report's by-run Spearman analysis);
- ``verdict_a`` ... ``verdict_d_quartiles``: the protocol's rule that turns those numbers
  into a verdict (reproduced / partly / not at this scale), with the reason in words.

``tether analyze paper <targets> --finding a|b|c|d`` prints them as JSON; without
``--finding``, the protocol of 2026-11-27's family (``tether.analysis.verdicts``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

from .runs import COMPARED_DIAGNOSTICS, SUCCESS, RunData, collapse_key
from .stats import (  # noqa: F401  (t_interval and paired_gain are this module's API too)
    final_success,
    paired_gain,
    prompt_points,
    quartile_of,
    spearman_by_run_bootstrap,
    t_interval,
)

REPRODUCED, PARTLY, NOT_AT_THIS_SCALE = "reproduced", "partly", "not at this scale"
#: Seeds per compared arm the protocol's counting rules are written for.
MIN_SEEDS = 3


def _at(run: RunData, key: str, step: int) -> float | None:
    return run.metrics.get(key, {}).get(step)


def collapse_rows(
    runs: list[RunData],
    sampling: str = "first_turn",
    mi_name: str = "mi_estimate",
    h_name: str = "conditional_entropy_est",
    alpha: float = 0.05,
    min_drop_fraction: float = 0.25,
) -> list[dict]:
    """Per run: I(X;Z) and H(Z|X) with their intervals at the first and the last diagnosed
    iteration, and ``collapsed``: the first point is significantly grounded (permutation
    ``p_grounded`` < ``alpha``), the last MI interval lies wholly below the first one and
    MI fell by at least ``min_drop_fraction`` of its first value, and the last H(Z|X)
    interval does not lie wholly below the first one (within-input entropy did not fall)."""
    mi_key, h_key = collapse_key(sampling, mi_name), collapse_key(sampling, h_name)
    p_key = collapse_key(sampling, "p_grounded")
    rows = []
    for run in runs:
        steps = sorted(set(run.metrics.get(mi_key, {})) & set(run.metrics.get(h_key, {})))
        if len(steps) < 2:
            rows.append(
                {
                    "run": run.name,
                    "run_id": run.run_id,
                    "collapsed": None,
                    "why": f"{len(steps)} diagnosed iteration(s)",
                }
            )
            continue
        a, b = steps[0], steps[-1]
        row = {
            "run": run.name,
            "run_id": run.run_id,
            "seed": run.param("experiment.seed"),
            "filter": run.param("filter.strategy") or "none",
            "first": a,
            "last": b,
            "final_success": run.final_success(),
            "alarms": [f"{name}@{step}" for step, name in run.alarm_steps()],
        }
        for tag, step in (("first", a), ("last", b)):
            for name, key in (("mi", mi_key), ("h", h_key)):
                row[f"{name}_{tag}"] = _at(run, key, step)
                row[f"{name}_{tag}_ci"] = (
                    _at(run, f"{key}_ci_low", step),
                    _at(run, f"{key}_ci_high", step),
                )
            row[f"p_{tag}"] = _at(run, p_key, step)
        missing = [
            k for k in ("mi_first_ci", "mi_last_ci", "h_first_ci", "h_last_ci") if None in row[k]
        ] + (["p_first"] if row["p_first"] is None else [])
        row["mi_change"] = row["mi_last"] - row["mi_first"]
        row["h_change"] = row["h_last"] - row["h_first"]
        if missing:
            row.update(collapsed=None, why=f"not logged: {', '.join(missing)}")
        else:
            grounded = row["p_first"] < alpha
            separated = row["mi_last_ci"][1] < row["mi_first_ci"][0]
            big = row["mi_first"] - row["mi_last"] >= min_drop_fraction * row["mi_first"]
            h_fell = row["h_last_ci"][1] < row["h_first_ci"][0]
            row.update(
                first_grounded=grounded,
                mi_fell=separated and big,
                h_fell=h_fell,
                collapsed=bool(grounded and separated and big and not h_fell),
            )
        rows.append(row)
    return rows


def collapse_verdict(rows: list[dict]) -> dict:
    """Finding a's counts: collapsed seeds per arm, and the per-seed MI change of top-p
    minus none (positive: the filter kept more of I(X;Z))."""
    arms: dict[str, dict[str, dict]] = defaultdict(dict)
    for row in rows:
        if row.get("collapsed") is not None:
            arms[row["filter"]][str(row["seed"])] = row
    counts = {
        arm: {"collapsed": sum(r["collapsed"] for r in by_seed.values()), "seeds": len(by_seed)}
        for arm, by_seed in arms.items()
    }
    none, top_p = arms.get("none", {}), arms.get("top_p", {})
    seeds = sorted(set(none) & set(top_p))
    diffs = [top_p[s]["mi_change"] - none[s]["mi_change"] for s in seeds]
    return {
        "counts": counts,
        "mi_change_top_p_minus_none": {"seeds": seeds, "differences": diffs, **t_interval(diffs)},
    }


def quartile_trend(runs: list[RunData]) -> dict:
    """Success and MI by reward-variance quartile of prompt groups (the paper's unit;
    ``stats.prompt_points``: one point per group of each diagnosed batch, its RV, success
    rate and first-turn pointwise MI), whether each rises monotonically from Q1 (lowest RV)
    to Q4, and Q4 - Q1 with a Welch interval over the prompts.  An empty quartile (ties:
    more than a quarter of the prompts share one RV) leaves the trend undefined."""
    rv, success, mi, _ = prompt_points(runs)
    if len(rv) < 8:
        return {
            "note": f"{len(rv)} prompt groups with prompt-level diagnostics (prompt_mi/iter_N.json)"
        }
    q = quartile_of(rv)
    out: dict = {"unit": "prompt groups", "prompts": len(rv)}
    for name, vals in (("success", success), ("mi", mi)):
        groups = [vals[(q == k) & ~np.isnan(vals)] for k in range(1, 5)]
        means = [float(g.mean()) if len(g) else math.nan for g in groups]
        top, bottom = groups[3], groups[0]
        diff = {"mean": math.nan, "ci_low": math.nan, "ci_high": math.nan}
        if len(top) >= 2 and len(bottom) >= 2:
            va, vb = top.var(ddof=1) / len(top), bottom.var(ddof=1) / len(bottom)
            se = math.sqrt(va + vb)
            dof = (
                (va + vb) ** 2 / (va**2 / (len(top) - 1) + vb**2 / (len(bottom) - 1))
                if va + vb > 0
                else 1.0
            )
            half = float(stats.t.ppf(0.975, dof)) * se
            d = float(top.mean() - bottom.mean())
            diff = {"mean": d, "ci_low": d - half, "ci_high": d + half}
        out[name] = {
            "means": means,
            "n": [len(g) for g in groups],
            "monotone_increasing": bool(all(np.diff(means) > 0)),
            "q4_minus_q1": diff,
        }
    return out


def _above(interval: dict) -> bool:
    """The interval lies wholly above 0 (an undefined interval does not)."""
    low = interval.get("ci_low")
    return low is not None and not math.isnan(low) and low > 0


def _verdict(verdict: str | None, because: str) -> dict:
    return {"verdict": verdict, "because": because}


def verdict_a(counts: dict, mi_change_difference: dict) -> dict:
    """Finding a: reproduced when >= 2/3 of the no-filter seeds collapse, <= 1/3 of the
    top-p seeds do, and the per-seed I(X;Z) change (top-p minus none) has a t-interval
    above 0; partly when only the no-filter part holds; otherwise not at this scale."""
    none, top_p = counts.get("none"), counts.get("top_p")
    if not none or not top_p or min(none["seeds"], top_p["seeds"]) < MIN_SEEDS:
        return _verdict(None, f"needs >= {MIN_SEEDS} finished seeds in each of none and top_p")
    said = (
        f"no filter: {none['collapsed']} of {none['seeds']} seeds collapsed; "
        f"top-p: {top_p['collapsed']} of {top_p['seeds']}"
    )
    if 3 * none["collapsed"] < 2 * none["seeds"]:
        return _verdict(NOT_AT_THIS_SCALE, said)
    fails = []
    if 3 * top_p["collapsed"] > top_p["seeds"]:
        fails.append("top-p collapsed in more than a third of its seeds")
    if not _above(mi_change_difference):
        fails.append("the I(X;Z) change, top-p minus none, has an interval reaching 0 or below")
    if not fails:
        return _verdict(REPRODUCED, said + "; I(X;Z) change top-p minus none above 0")
    return _verdict(PARTLY, said + "; the filter part fails: " + " and ".join(fails))


def verdict_b(by_run_rows: list[dict], proxy: str = "mi_zscore") -> dict:
    """Finding b: reproduced when rho(``proxy``) with success and rho(``proxy``) -
    rho(H(Z|X)) both have by-run bootstrap intervals above 0; partly when exactly one
    does; otherwise not at this scale."""
    row = next((r for r in by_run_rows if r["diagnostic"] == proxy), None)
    if row is None:
        return _verdict(None, f"no by-run Spearman row for {proxy}")
    rho_above = _above(row)
    diff_above = _above({"ci_low": row.get("diff_ci_low")})
    said = (
        f"rho({proxy}) interval {'above' if rho_above else 'not above'} 0; rho({proxy}) - "
        f"rho(H(Z|X)) interval {'above' if diff_above else 'not above'} 0"
    )
    return _verdict({2: REPRODUCED, 1: PARTLY, 0: NOT_AT_THIS_SCALE}[rho_above + diff_above], said)


def verdict_c(contrast: dict, moderate_gain: dict) -> dict:
    """Finding c: reproduced when the per-seed contrast (mean gain at 10/20/50 % minus mean
    gain at 0/100 %) and the mean gain at 10/20/50 % both have t-intervals above 0; partly
    when the contrast's point estimate is above 0 but an interval is not; otherwise not at
    this scale."""
    if contrast.get("n", 0) < MIN_SEEDS:
        return _verdict(None, f"needs >= {MIN_SEEDS} seeds with every noise level in both arms")
    if not contrast["mean"] > 0:
        return _verdict(NOT_AT_THIS_SCALE, "the contrast's point estimate is <= 0")
    if _above(contrast) and _above(moderate_gain):
        return _verdict(REPRODUCED, "contrast and moderate-noise gain both above 0")
    return _verdict(PARTLY, "the contrast's point estimate is above 0, an interval is not")


def verdict_d_filters(top_p_minus_none: dict, top_p_minus_top_k: dict) -> dict:
    """Finding d (filters): reproduced when top-p minus none has a t-interval above 0 and
    top-p minus top-k is >= 0 in point; partly when both points are >= 0 but the first
    interval is not above 0; otherwise not at this scale."""
    if min(top_p_minus_none.get("n", 0), top_p_minus_top_k.get("n", 0)) < MIN_SEEDS:
        return _verdict(None, f"needs >= {MIN_SEEDS} seeds in each of none, top_k and top_p")
    vs_none, vs_k = top_p_minus_none["mean"], top_p_minus_top_k["mean"]
    said = f"top-p minus none {vs_none:+.3f}, top-p minus top-k {vs_k:+.3f}"
    if _above(top_p_minus_none) and vs_k >= 0:
        return _verdict(REPRODUCED, said + "; the first interval above 0")
    if vs_none >= 0 and vs_k >= 0:
        return _verdict(PARTLY, said + "; the first interval reaches 0 or below")
    return _verdict(NOT_AT_THIS_SCALE, said + "; a point estimate below 0")


def verdict_d_quartiles(mi_trend: dict) -> dict:
    """Finding d (reward-variance quartiles of prompts): reproduced when mean pointwise
    I(X;Z) rises strictly from Q1 to Q4 and Q4 - Q1 has a Welch interval above 0; otherwise
    not at this scale.  No verdict when a quartile holds no prompt with MI (RV ties)."""
    if "means" not in mi_trend:
        return _verdict(None, "no quartiles (too few prompt groups)")
    empty = [k + 1 for k, n in enumerate(mi_trend.get("n", ())) if n == 0]
    if empty:
        return _verdict(
            None,
            f"quartile(s) {empty} hold no prompt with MI: more than a quarter of the prompts "
            "share one reward variance, so the quartiles are not four groups",
        )
    monotone, above = mi_trend["monotone_increasing"], _above(mi_trend["q4_minus_q1"])
    said = (
        f"I(X;Z) by quartile {'rises' if monotone else 'does not rise'} strictly; Q4 - Q1 "
        f"interval {'above' if above else 'not above'} 0"
    )
    return _verdict(REPRODUCED if monotone and above else NOT_AT_THIS_SCALE, said)


#: Params that may differ between the runs of one finding: what a sweep varies, names, and
#: where each run wrote (a part's own directory and store).
COMPARED = (
    "filter.",
    "experiment.seed",
    "env.stochasticity",
    "experiment.run_name",
    "experiment.output_dir",
    "tracking.uri",
)


def differing_settings(runs: list[RunData]) -> dict[str, list[str]]:
    """Logged settings (params) whose values differ between runs, other than those the
    findings compare (``COMPARED``), among the runs that logged them (a setting added to
    Tether after a run started is absent from it, not different): empty when runs pooled
    from several sweeps are one design."""
    keys = sorted({k for r in runs for k in r.params if not k.startswith(COMPARED)})
    out = {}
    for key in keys:
        values = sorted({r.params[key] for r in runs if key in r.params})
        if len(values) > 1:
            out[key] = values
    return out


def _finite(value):
    """NaN and infinities as null: the output is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    from . import records
    from .source import ReportError, load_target

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "targets",
        nargs="+",
        metavar="target",
        help="sweep parent run ids, run ids, experiment names or record files (--export); "
        "several are pooled (e.g. the parts of a sweep run on several machines)",
    )
    parser.add_argument("--tracking-uri", help="e.g. sqlite:////abs/mlflow.db (stores only)")
    parser.add_argument(
        "--export",
        metavar="FILE",
        help="also write the finished runs of the seeds whose every arm finished to a record "
        "file (*.json[.gz]) that later calls take as a target, without the store",
    )
    parser.add_argument(
        "--restore",
        metavar="URI",
        help="also log the pooled finished runs to this MLflow store as the children of one "
        "new parent run (e.g. sqlite:////abs/ui.db), for MLflow's UI to compare runs whose "
        "stores are gone (experiment tether-restored); prints the parent's id",
    )
    parser.add_argument(
        "--protocol",
        choices=["2026-11-27", "2026-11-23"],
        help="2026-11-27 (the default without --finding): the seven tests of one family, "
        "Holm-corrected, from the pooled targets (experiments/verdicts/); 2026-11-23 (the "
        "default with --finding): the old suite's tests, one finding at a time "
        "(experiments/paper/)",
    )
    parser.add_argument(
        "--finding",
        choices=["a", "b", "c", "d"],
        help="with --protocol 2026-11-23: a collapse, b MI vs entropy, c stochasticity, "
        "d filters (docs/reproduction.md)",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="with the protocol of 2026-11-27: print the family as a table, not JSON",
    )
    parser.add_argument(
        "--sensitivity",
        action="store_true",
        help="with the protocol of 2026-11-27: the sensitivity sweep's row (each cell's final "
        "success and probe I(X;Z), the factors' spreads, the verdict), not the family",
    )
    parser.add_argument(
        "--act-vs-warn",
        action="store_true",
        help="with the protocol of 2026-11-27: the act-against-warn row (each seed's warn and "
        "act runs of benchmarks/act_vs_warn.py: final probe I(X;Z) and success, act minus "
        "warn, the verdicts), not the family",
    )
    parser.add_argument(
        "--c-targets",
        nargs="+",
        metavar="target",
        help="with the protocol of 2026-11-27: what finding c reads, apart from the family's "
        "targets (each seed's every noise level from one warm start: a whole c part, or c's "
        "noisy arms with the a_d record they pair with); without it, c reads the targets",
    )
    parser.add_argument("--sampling", default="first_turn", help="the diagnostics' sampling")
    parser.add_argument(
        "--mi",
        default="mi_estimate",
        help="the I(X;Z) estimate a and c test (d: prompt-level mi_estimate)",
    )
    args = parser.parse_args(argv)
    protocol = args.protocol or ("2026-11-23" if args.finding else "2026-11-27")
    old = protocol == "2026-11-23"
    if old != (args.finding is not None):
        parser.error("--finding a|b|c|d goes with --protocol 2026-11-23, and only with it")
    if old and (args.sensitivity or args.act_vs_warn):
        parser.error("--sensitivity and --act-vs-warn go with the protocol of 2026-11-27")
    if args.sensitivity and args.act_vs_warn:
        parser.error("--sensitivity and --act-vs-warn are two rows: name one")
    if args.c_targets and (
        old or args.sensitivity or args.act_vs_warn or args.export or args.restore
    ):
        parser.error("--c-targets goes with the family (the protocol of 2026-11-27) only")
    # an export keeps the prompt-level rewards too: the report's heatmaps read them
    with_prompts = not old or bool(args.export)
    try:
        # a target named twice stays twice: ``repeated`` refuses it below
        by_target, c_by_target = (
            [(t, load_target(args.tracking_uri, t, with_prompts=with_prompts)[1]) for t in ts]
            for ts in (args.targets, args.c_targets or [])
        )
    except ReportError as exc:
        print(f"paper: {exc}", file=sys.stderr)
        return 2
    loaded = [run for _, runs in by_target for run in runs]
    c_loaded = [run for _, runs in c_by_target for run in runs]
    if args.export:
        source = {"tracking_uri": args.tracking_uri, "targets": args.targets}
        try:
            print(f"paper: {records.export(loaded, args.export, source)}", file=sys.stderr)
        except ValueError as exc:
            print(f"paper: {exc}", file=sys.stderr)
            return 2
    runs = [r for r in loaded if r.status == "FINISHED"]  # a stopped trial is not a result
    c_runs = [r for r in c_loaded if r.status == "FINISHED"] if args.c_targets else None
    for pooled in (runs, c_runs or []):  # c's set may hold a_d's records again: apart
        if twice := records.repeated(pooled):
            print(f"paper: the same trial more than once (same params): {twice}", file=sys.stderr)
            return 2
    if args.restore:
        name = "restored: " + " ".join(Path(t).name for t in args.targets)[:200]
        parent = records.restore(runs, args.restore, "tether-restored", name)
        print(f"paper: {len(runs)} runs -> {args.restore}, parent run {parent}", file=sys.stderr)
    every = runs + (c_runs or [])
    out: dict = {
        "runs": len(runs),
        **({"c_runs": len(c_runs)} if c_runs is not None else {}),
        # pooled runs must differ only in what the findings compare
        "settings_that_differ": differing_settings(every),
        # the Tether commit(s) the runs trained on (a verdict's runs share one)
        "commits": sorted({r.tags.get("env.tether_commit", "unknown") for r in every}),
        # each record's warm starts by content (None: no hash kept beside it)
        "warm_starts": records.warm_starts(args.targets + (args.c_targets or [])),
        "not_finished": [
            f"{r.name} ({r.status}, iteration {r.latest_iteration})"
            for r in loaded + c_loaded
            if r.status != "FINISHED"
        ],
    }
    if not old:
        from rich.console import Console

        from .verdicts import (
            act_vs_warn,
            act_vs_warn_tables,
            b_readings_table,
            family,
            family_table,
            loss_scale_line,
            loss_scales,
            sensitivity,
            sensitivity_tables,
        )

        if args.act_vs_warn:  # a seed's two arms ran in one part, from one warm start
            for name, lines in out["warm_starts"].items():
                if why := records.one_warm_start({name: lines}):
                    print(f"paper: a seed's arms must share one warm start: {why}", file=sys.stderr)
                    return 2
            out["act_vs_warn"] = act_vs_warn(runs)
        elif args.sensitivity:  # its cells share one warm start, or a factor carries it
            if why := records.one_warm_start(out["warm_starts"]):
                print(
                    f"paper: the sensitivity parts must share one warm start: {why}",
                    file=sys.stderr,
                )
                return 2
            out["sensitivity"] = sensitivity(runs)
        else:  # a seed's arms in two records (a_d's 0 %, c's noise) pair on one warm start
            for group in (by_target, c_by_target):
                seeds_of = {
                    Path(t).name: {r.params.get("experiment.seed", "") for r in rs}
                    for t, rs in group
                    if records.is_record_file(t)
                }
                if why := records.seeds_share_warm_starts(out["warm_starts"], seeds_of):
                    print(
                        f"paper: a seed's records must share one warm start: {why}",
                        file=sys.stderr,
                    )
                    return 2
            out["tests"] = family(runs, c_runs)
            out["loss_scales"] = loss_scales(runs)
        if args.table:
            if args.act_vs_warn:
                tables = act_vs_warn_tables(out["act_vs_warn"])
            elif args.sensitivity:
                tables = sensitivity_tables(out["sensitivity"])
            else:
                tables = [family_table(out["tests"]), b_readings_table(out["tests"]["b"])]
            # at least 132 columns: a narrower console (a pipe: 80) wraps every cell
            console = Console(width=max(132, Console().width))
            for table in tables:
                console.print(table)
            if "loss_scales" in out:
                print(loss_scale_line(out["loss_scales"]))
            c_count = f", c {out['c_runs']}" if c_runs is not None else ""
            print(
                f"runs {out['runs']}{c_count} {out['commits']}; "
                f"differ: {out['settings_that_differ']}"
            )
            return 0
    elif args.finding == "a":
        rows = collapse_rows(runs, args.sampling, args.mi)
        counted = collapse_verdict(rows)
        out.update(
            rows=rows,
            **counted,
            val_success_top_p_minus_none=paired_gain(runs, "top_p", "none"),
            **verdict_a(counted["counts"], counted["mi_change_top_p_minus_none"]),
        )
    elif args.finding == "b":
        by_run = spearman_by_run_bootstrap(
            runs, args.sampling, COMPARED_DIAGNOSTICS, success_key=SUCCESS
        )
        out.update(spearman_by_run=by_run.rows, notes=by_run.notes, **verdict_b(by_run.rows))
    elif args.finding == "c":
        out["gain_by_level"] = paired_gain(runs, "top_p", "none", by=("env.stochasticity",))
        mi_key = collapse_key(args.sampling, args.mi)
        out["final_mi_gain_by_level"] = paired_gain(
            runs, "top_p", "none", value=lambda r: r.last(mi_key), by=("env.stochasticity",)
        )
        gains = defaultdict(dict)  # seed -> level -> gain
        for level, cell in out["gain_by_level"].items():
            for seed, d in zip(cell["seeds"], cell["differences"]):
                gains[seed][float(level.split("=")[1])] = d
        moderate, extreme = (0.1, 0.2, 0.5), (0.0, 1.0)
        full = [g for g in gains.values() if all(p in g for p in moderate + extreme)]
        contrast = [
            float(np.mean([g[p] for p in moderate]) - np.mean([g[p] for p in extreme]))
            for g in full
        ]
        moderate_gain = [float(np.mean([g[p] for p in moderate])) for g in full]
        out["moderate_minus_extreme_gain"] = {"per_seed": contrast, **t_interval(contrast)}
        out["moderate_gain"] = {"per_seed": moderate_gain, **t_interval(moderate_gain)}
        out.update(verdict_c(out["moderate_minus_extreme_gain"], out["moderate_gain"]))
    else:
        out["top_p_minus_none"] = paired_gain(runs, "top_p", "none")
        out["top_p_minus_top_k"] = paired_gain(runs, "top_p", "top_k")
        out["top_k_minus_none"] = paired_gain(runs, "top_k", "none")
        out["rv_quartiles"] = quartile_trend(runs)
        out["verdict_filters"] = verdict_d_filters(
            out["top_p_minus_none"].get("all", {}), out["top_p_minus_top_k"].get("all", {})
        )
        out["verdict_quartiles"] = verdict_d_quartiles(out["rv_quartiles"].get("mi", {}))
    json.dump(_finite(out), sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
