"""Iteration cost against model size, group size and number of turns (issue 19 item 5).

Each grid point is one run of the real driver (``tether run experiments/scale/scaling.yaml``
plus the point's overrides, in a subprocess under ``flock /tmp/tether-cpu.lock``); its
``timing/<stage>`` and ``system/peak_rss_gb/...`` metrics are read back from the run's
SQLite MLflow store.  ``--iterations`` run (default 2); each metric's median over
iterations 2, 3, ... is reported (the first includes first calls into fresh actors, and
its memory readings include loading the model).

Every process computes on one thread (``OMP_NUM_THREADS=1``, ``algo.threads: 1``): the
machine's 2 cores are shared with other jobs.  Axes (the others held at 2 groups x group
size 4, 2 turns, 48-token replies):

- ``size``: small (0.59 M), tiny (4.3 M), medium (29.6 M), large (113.7 M), randomly
  initialised, float32; qwen05b-shape (494 M, vocabulary 151,936) in bfloat16.
- ``group``: group size 2, 4, 8, 16 on the 4.3 M model;
- ``turns``: at most 1, 2, 3, 5 turns on the 4.3 M model.
  Both 4.3 M axes start from a short (cached) warm start, so replies close
  ``</think>`` and the collapse diagnostics have reasoning to score; a random policy
  writes no ``</think>`` and the diagnostics score nothing (``collapse/*/num_pairs``).

Costs are fitted as power laws, ``cost = c * x ** b``: least squares on log cost against
log x (``scipy.stats.linregress``), ``b`` with a t interval on n - 2 degrees of freedom.

    python benchmarks/scaling.py run --axis group --iterations 5   # each point under the lock
    python benchmarks/scaling.py run --axis size --points small tiny medium large
    python benchmarks/scaling.py report --plot benchmarks/scaling.png   # tables + fits
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent
SPEC = HERE.parent / "experiments" / "scale" / "scaling.yaml"
RESULTS = HERE / "scaling_results.json"
LOCK = "/tmp/tether-cpu.lock"

#: A short warm start (50 SFT steps; the quickstart's recipe without its state-turn stage
#: and with 400 demonstrations instead of 1,000): enough for replies in the format, whose
#: reasoning the diagnostics then score; what the policy knows does not change the cost.
WARM_START = {
    "model.warm_start.episodes": 400,
    "model.warm_start.noise": 0.3,
    "model.warm_start.epochs": 1,
    "model.warm_start.batch_size": 8,
    "model.warm_start.lr": 2.0e-3,
    "model.warm_start.numerals": "coordinates",
    "model.warm_start.restate": "true",
}
SIZES = {
    "small": {},
    "tiny": {},
    "medium": {},
    "large": {},
    "qwen05b-shape": {"model.dtype": "bfloat16"},  # float32 needs ~14 GiB (RESULTS.md)
}
AXES = {
    "size": {k: {"model.size": k, **extra} for k, extra in SIZES.items()},
    "group": {str(g): {"rollout.group_size": g, **WARM_START} for g in (2, 4, 8, 16)},
    "turns": {str(t): {"rollout.max_turns": t, **WARM_START} for t in (1, 2, 3, 5)},
}
#: The two 4.3 M axes cross at group size 4, 2 turns: one run serves both.
SHARED = {("turns", "2"): ("group", "4")}
#: What each axis's x is in a fit, read from the record.
AXIS_X = {"size": "parameters", "group": "group_size", "turns": "turns"}
#: The driver's stages reported (``prepare``: the old-policy log-probs before the update).
STAGES = ("collect", "diagnose", "prepare", "update", "sync")
KEEP = ("timing/", "system/peak_rss_gb", "rollout/", "actor/entropy")


@dataclass
class PowerLaw:
    """``cost = c * x ** exponent`` fitted on log-log; the interval is None with < 3 points."""

    exponent: float
    stderr: float
    ci_low: float | None
    ci_high: float | None
    n: int
    r2: float


def fit_power_law(x, y, confidence: float = 0.95) -> PowerLaw:
    """Least squares of log y on log x; a t interval on the slope (n - 2 degrees of freedom)."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    if len(lx) < 2:
        raise ValueError("a power law needs at least 2 points")
    fit = stats.linregress(lx, ly)
    n = len(lx)
    if n < 3:
        return PowerLaw(float(fit.slope), math.nan, None, None, n, 1.0)
    half = stats.t.ppf(0.5 + confidence / 2, n - 2) * fit.stderr
    return PowerLaw(
        float(fit.slope),
        float(fit.stderr),
        float(fit.slope - half),
        float(fit.slope + half),
        n,
        float(fit.rvalue**2),
    )


# ------------------------------------------------------------------------- running


def parameter_count(model_dir: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def read_run(output_dir: Path) -> tuple[dict, dict, dict]:
    """The latest run's metrics (the kept prefixes): each one's median over iterations
    2, 3, ... (iteration 1 left out), every iteration's ``timing/iteration``, and its tags."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{output_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tether-scaling")
    run = client.search_runs([experiment.experiment_id], order_by=["start_time DESC"])[0]
    metrics, per_iteration = {}, {}
    for key in run.data.metrics:
        if key.startswith(KEEP) or key.endswith("/num_pairs"):
            history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            kept = [v for step, v in history.items() if step >= 2]
            if kept:
                metrics[key] = float(np.median(kept))
            if key == "timing/iteration":
                per_iteration = {str(step): round(v, 3) for step, v in sorted(history.items())}
    return metrics, per_iteration, {"run_id": run.info.run_id, **run.data.tags}


def run_point(axis: str, label: str, out: Path, iterations: int, extra: list[str]) -> dict:
    overrides = {**AXES[axis][label]}
    overrides.update({"trainer.iterations": iterations, "trainer.val_every": iterations})
    output_dir = out / "runs" / f"{axis}-{label}"
    overrides["experiment.output_dir"] = str(output_dir)
    overrides["model.cache_dir"] = str(out / "models")
    args = [f"{k}={v}" for k, v in overrides.items()] + extra
    command = [sys.executable, "-c", "from tether.platform.cli.main import app; app()", "run"]
    command += [str(SPEC), *args]
    # One thread per process: on a shared, loaded 2-core machine torch's intra-op threads
    # wait on descheduled siblings (~10x slower at load 12; benchmarks/RESULTS.md).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held only while this point runs
        load_before, started_utc = os.getloadavg(), datetime.now(UTC).isoformat(timespec="seconds")
        started = time.perf_counter()
        done = subprocess.run(command, env=env, cwd=HERE.parent, capture_output=True, text=True)
        wall = time.perf_counter() - started
        load_after, ended_utc = os.getloadavg(), datetime.now(UTC).isoformat(timespec="seconds")
    (output_dir / "command.log").write_text(done.stdout + done.stderr)
    record = {
        "axis": axis,
        "label": label,
        "overrides": args,
        "returncode": done.returncode,
        "wall_s": round(wall, 1),
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in load_after],
        "started_utc": started_utc,
        "ended_utc": ended_utc,
    }
    if done.returncode != 0:
        record["error"] = (done.stderr.strip().splitlines() or ["?"])[-1][:300]
        return record
    metrics, per_iteration, tags = read_run(output_dir)
    record.update(
        run_id=tags["run_id"],
        status=tags.get("tether.status"),
        dtype=tags.get("model.dtype_effective"),
        model_path=tags.get("tether.model_path"),
        parameters=parameter_count(tags["tether.model_path"]),
        metrics=metrics,
        iteration_s=per_iteration,
    )
    return record


def cut_diagnostics(record: dict) -> dict:
    """The diagnostics with work to do, for a randomly initialised policy (which writes no
    ``</think>``): the same episodes as the size axis (2 groups x 4, 2 turns, 48-token
    replies) collected in this process, every reply cut into a 40-token reasoning and the
    rest as the action, cross-scored at the default sizes (benchmarks/vocab_diagnostics.py)."""
    import torch
    from vocab_diagnostics import collect_and_score

    from tether.policy.load import load_model_and_tokenizer

    torch.set_num_threads(1)  # as the learner (algo.threads: 1 in the spec)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        load_before = os.getloadavg()
        model, tokenizer = load_model_and_tokenizer(record["model_path"], record["dtype"])
        result = collect_and_score(model, tokenizer, groups=2, group_size=4, max_turns=2)
        load_after = os.getloadavg()
    del model
    result["load_before"] = [round(v, 2) for v in load_before]
    result["load_after"] = [round(v, 2) for v in load_after]
    return result


def save(record: dict, path: Path) -> None:
    records = json.loads(path.read_text()) if path.exists() else []
    records = [r for r in records if (r["axis"], r["label"]) != (record["axis"], record["label"])]
    path.write_text(json.dumps([*records, record], indent=1) + "\n")


# ------------------------------------------------------------------------- reporting


def x_of(record: dict) -> float:
    m = record["metrics"]
    if record["axis"] == "size":
        return float(record["parameters"])
    if record["axis"] == "group":
        return float(record["label"])
    return m["rollout/turns"]  # the measured mean (a warm policy may end an episode early)


def costs(record: dict) -> dict[str, float]:
    m = record["metrics"]
    out = {stage: m.get(f"timing/{stage}", 0.0) for stage in STAGES}
    out["iteration"] = m["timing/iteration"]
    out["peak_rss_sum"] = m["system/peak_rss_gb"]
    out["peak_rss_learner"] = m["system/peak_rss_gb/learner"]
    out["peak_rss_worker"] = m["system/peak_rss_gb/rollout_worker0"]
    cut = record.get("cut_diagnostics", {})
    if cut.get("status") == "ok":
        out["diagnose_cut"] = cut["diagnose_s"]
    return out


def ordered(records: list[dict], axis: str) -> list[dict]:
    done = [r for r in records if r["axis"] == axis and r.get("metrics")]
    for (shared_axis, label), source in SHARED.items():
        if shared_axis == axis and not any(r["label"] == label for r in done):
            done += [
                {**r, "axis": axis, "label": label}
                for r in records
                if (r["axis"], r["label"]) == source and r.get("metrics")
            ]
    return sorted(done, key=x_of)


def table(records: list[dict], axis: str) -> str:
    rows = ordered(records, axis)
    if not rows:
        return ""
    head = (
        "| point | parameters | dtype | trajectories | turns | generated tokens | pairs "
        "(first_turn / trajectory) | collect s | diagnose s | prepare s | update s | sync s "
        "| iteration s (min-max of 2+) | diagnose on cut replies s (pairs) "
        "| x baseline | peak RSS learner / worker / driver / sum GiB | load before -> after |"
    )
    lines = [head, "|---" * 17 + "|"]
    base = next((r for r in rows if r["label"] == "tiny"), rows[0])  # the "x baseline" column
    base_s = base["metrics"]["timing/iteration"]
    for r in rows:
        m, c = r["metrics"], costs(r)
        pairs = " / ".join(
            f"{m.get(f'collapse/{s}/num_pairs', 0):.0f}" for s in ("first_turn", "trajectory")
        )
        lines.append(
            f"| {r['axis']} {r['label']} | {r['parameters']:,} | {r['dtype']} "
            f"| {m['rollout/trajectories']:.0f} | {m['rollout/turns']:.2f} "
            f"| {m['rollout/generated_tokens']:.0f} | {pairs} | "
            + " | ".join(f"{c[s]:.2f}" for s in STAGES)
            + f" | {c['iteration']:.2f} ({spread(r)}) | {cut_cell(r)} | {c['iteration'] / base_s:.2f} "
            f"| {c['peak_rss_learner']:.2f} / {c['peak_rss_worker']:.2f} / "
            f"{m['system/peak_rss_gb/driver']:.2f} / {c['peak_rss_sum']:.2f} "
            f"| {r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f} |"
        )
    return "\n".join(lines)


def spread(record: dict) -> str:
    kept = [v for step, v in record["iteration_s"].items() if int(step) >= 2]
    return f"{min(kept):.2f}-{max(kept):.2f}" if len(kept) > 1 else "one"


def cut_cell(record: dict) -> str:
    cut = record.get("cut_diagnostics")
    if cut is None:
        return "-"
    if cut.get("status") != "ok":
        return cut.get("status", "?")
    pairs = "/".join(str(v["pairs"]) for v in cut["samplings"].values())
    return f"{cut['diagnose_s']:.1f} ({pairs})"


def fits(records: list[dict], axis: str, exclude: tuple[str, ...] = ()) -> dict[str, PowerLaw]:
    rows = [r for r in ordered(records, axis) if r["label"] not in exclude]
    if len(rows) < 2:
        return {}
    xs = [x_of(r) for r in rows]
    out = {}
    for name in costs(rows[0]):
        ys = [costs(r).get(name, 0.0) for r in rows]
        if min(ys) > 0:
            out[name] = fit_power_law(xs, ys)
    return out


def fit_table(records: list[dict]) -> str:
    lines = ["| axis (x) | points | cost | exponent b | 95 % interval | R² |", "|---" * 6 + "|"]
    variants = [("size", ()), ("size", ("qwen05b-shape",)), ("group", ()), ("turns", ())]
    for axis, exclude in variants:
        if exclude and not any(r["label"] in exclude for r in ordered(records, axis)):
            continue
        for name, f in fits(records, axis, exclude).items():
            interval = (
                "n/a (2 points)" if f.ci_low is None else f"[{f.ci_low:.2f}, {f.ci_high:.2f}]"
            )
            note = " without 0.5 B" if exclude else ""
            lines.append(
                f"| {axis} ({AXIS_X[axis]}){note} | {f.n} | {name} | {f.exponent:.2f} "
                f"| {interval} | {f.r2:.3f} |"
            )
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    axes_done = [a for a in AXES if ordered(records, a)]
    fig, grid = plt.subplots(2, len(axes_done), figsize=(4.2 * len(axes_done), 7), squeeze=False)
    for col, axis in enumerate(axes_done):
        rows = ordered(records, axis)
        xs = [x_of(r) for r in rows]
        names = (*STAGES, "iteration", "diagnose_cut")
        for k, name in enumerate(names):
            points = [(x, costs(r)[name]) for x, r in zip(xs, rows) if name in costs(r)]
            if not points or (axis == "size" and name == "diagnose"):
                continue  # a random policy's diagnose scores next to nothing: see diagnose_cut
            grid[0][col].plot(
                *zip(*points),
                "o--" if name == "diagnose_cut" else "o-",
                color=f"C{k}",
                label=name,
                lw=2.5 if name == "iteration" else 1.2,
            )
        for name in ("peak_rss_learner", "peak_rss_worker", "peak_rss_sum"):
            grid[1][col].plot(xs, [costs(r)[name] for r in rows], "s-", label=name[9:])
        for row, unit in ((0, "seconds (median of iterations 2+)"), (1, "peak RSS, GiB")):
            ax = grid[row][col]
            ax.set_xscale("log")
            ax.set_yscale("log")
            if axis != "size":  # plain numbers at the measured points
                ax.set_xticks(xs, [f"{x:.3g}" for x in xs])
                ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_ylabel(unit)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        grid[0][col].set_title(f"{axis} axis")
        grid[1][col].set_xlabel(AXIS_X[axis] + (" (mean measured)" if axis == "turns" else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an axis's points (each under the CPU lock)")
    run.add_argument("--axis", choices=sorted(AXES), required=True)
    run.add_argument("--points", nargs="*", help="labels of the axis (default: all)")
    run.add_argument("--out", type=Path, default=Path("/tmp/scaling"))
    run.add_argument(
        "--iterations", type=int, default=2, help="per run; the medians of 2, 3, ... are reported"
    )
    run.add_argument("--results", type=Path, default=RESULTS)
    run.add_argument("overrides", nargs="*", help="extra dotted overrides for every point")
    diag = sub.add_parser("diagnostics", help="size axis: the diagnostics on cut replies")
    diag.add_argument("--points", nargs="*", help="size labels (default: all recorded)")
    diag.add_argument("--results", type=Path, default=RESULTS)
    report = sub.add_parser("report", help="tables, fitted exponents, plot")
    report.add_argument("--results", type=Path, default=RESULTS)
    report.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "run":
        for label in args.points or list(AXES[args.axis]):
            record = run_point(args.axis, label, args.out, args.iterations, args.overrides)
            save(record, args.results)
            summary = {k: record.get(k) for k in ("label", "returncode", "wall_s", "error")}
            summary.update(
                {k: round(v, 2) for k, v in costs(record).items()} if "metrics" in record else {}
            )
            print(json.dumps(summary), flush=True)
        return
    records = json.loads(args.results.read_text())
    if args.command == "diagnostics":
        for record in ordered(records, "size"):
            if args.points is None or record["label"] in args.points:
                record["cut_diagnostics"] = cut_diagnostics(record)
                save(record, args.results)
                print(record["label"], json.dumps(record["cut_diagnostics"]), flush=True)
        return
    for axis in AXES:
        if ordered(records, axis):
            print(f"\n{axis} axis\n\n{table(records, axis)}")
    print("\n" + fit_table(records))
    if args.plot:
        plot(records, args.plot)
        print(f"\nplot: {args.plot} ({args.plot.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
