"""Does acting on a collapse alarm help?  ``act`` against ``warn`` on an injected collapse.

Protocol (fixed before the runs; `benchmarks/RESULTS.md` records the outcome whatever it
shows):

Setting.  The quickstart with 8 groups of 4 (half its batch, for time; grounded FrozenLake warm start: its first-turn reasoning picks
out its own map among 8 well above chance, so MI has somewhere to fall from).  From
iteration ``--inject-from`` (4) on, the training reward is made independent of the
input: each turn scores the similarity (difflib ratio) of its reasoning to one fixed
reasoning string, whatever the map; rewards spread within groups, so the update follows
them, toward one template.  Validation (``val/success``) keeps the true task reward.
Diagnostics every 2 iterations, checkpoints every 2 (rollback targets), 12 iterations.
Every run starts from the same warm-started policy (the quickstart's seed-0 warm start,
passed as ``model.path``); the seed varies the levels, the samples and the updates.

Conditions.  ``warn``: the shipped alarms in warn mode.  ``act``: template_collapse and
low_entropy_collapse in act mode with their default responses (tighten the filter, raise
the KL coefficient, roll back to the last grounded checkpoint at half the learning rate;
low entropy: raise the entropy bonus, roll back), cooldown 2, at most 4 actions.
Seeds 0, 1, 2; the same seed gives both conditions the same levels and samples until the
first action.

Measured.  Per run: first-turn ``mi_estimate`` averaged over the last 3 diagnostic points
(with each point's bootstrap interval), ``retrieval_acc`` likewise, ``val/success`` at the
end (Wilson interval, 64 held-out levels), the alarms and actions.  Verdict: acting helps MI if
the paired difference act - warn over the seeds has a 95 % t-interval above 0 (3 seeds:
t with 2 degrees of freedom); it hurts if below 0; otherwise no difference shown.  The
same for ``val/success``.

    python benchmarks/act_vs_warn.py --out /tmp/act_vs_warn model.path=<cache>/tiny-<key>

Protocol 2 (2026-11-23, commit 05a9bbf; written after protocol 1's first run, warn seed 0, showed no fall
of MI in 12 iterations — first-turn I(X;Z) 0.56 -> 0.50, retrieval 1.00 -> 0.93, the
injected reward 0.46 -> 0.48 — and before any run of protocol 2).  Protocol 1's runs are
completed and reported as they are.  Everything as in protocol 1 except a stronger push
toward the template, so that ``warn`` actually collapses: learning rate 3e-3 (10x the
quickstart's), the injection from iteration 3, 16 iterations.  A declared pilot decides
the learning rate before the confirmatory runs: seed 100, ``warn`` only, lr 3e-3; if its
template_collapse alarm fires, the confirmatory runs use 3e-3; otherwise one more pilot at
1e-2, used if it fires there; if neither fires, protocol 2 is reported as "could not
induce collapse" and not run.  Confirmatory: seeds 0, 1, 2 x {warn, act}, the same
measures and verdict rule as protocol 1.  No pilot run enters a result.

    # pilot
    python benchmarks/act_vs_warn.py --out /tmp/avw2-pilot --seeds 100 --modes warn \
        --iterations 16 --inject-from 3 model.path=<cache>/tiny-<key> algo.lr=3e-3
    # confirmatory
    python benchmarks/act_vs_warn.py --out /tmp/avw2 --iterations 16 --inject-from 3 \
        model.path=<cache>/tiny-<key> algo.lr=<the pilot's>

Protocol 3 (2026-11-23, commit cb21249; written after protocol 2's pilot, before any run of protocol 3).
Protocol 2's lr 3e-3 pilot broke the reply format after the first update, before the
injection began (valid first-turn reasoning 0.97 -> 0.06 at iteration 2, training
reward 0.22 -> -0.50, then 0.0; `format_collapse` fired, `template_collapse` could not:
2 scoreable pairs a point), so protocol 2 could not induce a template collapse; its
second pilot (lr 1e-2) was stopped, since a larger step can only break the format sooner.
Protocol 3 is protocol 1 with a step between the two: learning rate 1e-3 (3.3x the
quickstart's; still 4 minibatches), the injection from iteration 3, 20 iterations.
Pilot: seed 100, ``warn`` only; if its template_collapse alarm fires, the confirmatory
runs (seeds 0, 1, 2 x {warn, act}, protocol 1's measures and verdict rule) use it;
otherwise protocol 3 is reported as "could not induce collapse" and not run.

    python benchmarks/act_vs_warn.py model.path=<cache>/tiny-<key> algo.lr=1e-3 \
        --out /tmp/avw3-pilot --seeds 100 --modes warn --iterations 20 --inject-from 3
    python benchmarks/act_vs_warn.py model.path=<cache>/tiny-<key> algo.lr=1e-3 \
        --out /tmp/avw3 --iterations 20 --inject-from 3

Protocol 4 (2026-11-23, commit feb3e18; written after protocols 1-3 failed to collapse ``warn`` and after
finding a of the reproduction suite (docs/reproduction.md) had run, before any run of
protocol 4).  A natural collapse instead of an injected one: finding a's top-p arm
(``experiments/paper/a_collapse.yaml`` with ``filter: top_p 0.9``, seeds 0, 1, 2, 30
iterations, 128 validation levels), where ``template_collapse`` fired in warn mode at
iteration 15 (seed 1) and 20 (seed 2) and not at all in seed 0.  Conditions.  ``warn``:
finding a's three top-p trials as they ran (sweep parent 09b35ba021414d10a77724547258ca3e
in the repro store), not rerun, to spend the CPU on the new arm.  ``act``: the same spec and
seeds with template_collapse and low_entropy_collapse in act mode with their default
responses, cooldown 2, at most 4 actions, and a checkpoint every 5 iterations (the
diagnostic points, so that rollback has targets).  Comparability check, decided before the
runs: each act run's ``rollout/success`` and first-turn ``mi_estimate`` at every iteration
before its first action must equal its warn trial's to 1e-6; if any differs, the warn arm
is not comparable (the code changed under it), protocol 4 is reported as "not comparable"
and the warn arm must be rerun on the current code before any verdict.  Measures and
verdict rule as protocol 1: first-turn ``mi_estimate`` averaged over the last 3 diagnostic
points (iterations 20, 25, 30), and the final ``val/success``; paired act - warn over the
3 seeds, 95 % t-interval (2 degrees of freedom): helps / hurts / no difference shown.  A
seed whose act run takes no action is the warn run again (difference 0 by construction,
confirmed by the check) and stays in the pairs.

    tether sweep experiments/paper/a_collapse.yaml sweep.name=avw4_act \
        'sweep.space={filter: {grid: [{strategy: top_p, mode: linear, value: 0.9}]}, experiment.seed: {grid: [0, 1, 2]}}' \
        alarms.template_collapse.mode=act alarms.low_entropy_collapse.mode=act \
        alarms.control.cooldown=2 alarms.control.max_actions=4 trainer.checkpoint_every=5 \
        sweep.max_concurrent=1 model.cache_dir=/tmp/repro/models experiment.output_dir=/tmp/repro/runs
    python benchmarks/act_vs_warn.py --compare <warn parent> <act parent> \
        --tracking sqlite:////tmp/repro/runs/mlflow.db

Protocol 4, amendment (2026-11-24, commit 1e6fe9e, after the comparability check failed, before any verdict
was computed).  The check failed for seeds 0 and 1: their act runs left their warn trials
at iterations 7 and 6 (``rollout/success``), before any action (the first actions were at
15 and 30), so a's trials are not the act runs' counterfactual: either the code changed
under them or the act arm's checkpoints (every 5 iterations; a's trials kept none) change
the trajectory.  As the protocol says, the warn arm is rerun on the current code, with
exactly the act arm's settings but the two alarm modes (so checkpoints every 5 iterations
in both), and the check is applied to the new pairs:

    tether sweep experiments/paper/a_collapse.yaml sweep.name=avw4_warn \
        'sweep.space={filter: {grid: [{strategy: top_p, mode: linear, value: 0.9}]}, experiment.seed: {grid: [0, 1, 2]}}' \
        alarms.control.cooldown=2 alarms.control.max_actions=4 trainer.checkpoint_every=5 \
        sweep.max_concurrent=1 model.cache_dir=/tmp/repro/models experiment.output_dir=/tmp/repro/runs
"""

from __future__ import annotations

import argparse
import difflib
import json
import time
from pathlib import Path

import numpy as np
from mlflow.tracking import MlflowClient
from scipy import stats

from tether.platform.config import load_config
from tether.platform.run.trainer import Trainer

TEMPLATE = "At (0,0), goal (3,3). Right, then down."
PREFIX = "collapse/first_turn"
PROBE_MI = "collapse/probe/mi_estimate"


class InjectedTrainer(Trainer):
    """The real driver; from ``inject_from`` on, training rewards ignore the input."""

    def __init__(self, cfg, inject_from: int, **kwargs) -> None:
        super().__init__(cfg, **kwargs)
        self.inject_from, self.injecting = inject_from, False

    def iteration(self, it: int):
        self.injecting = it >= self.inject_from  # training collection only, not validation
        try:
            return super().iteration(it)
        finally:
            self.injecting = False

    def collect(self, specs, sampling, seed, max_turns=None):
        trajectories = super().collect(specs, sampling, seed, max_turns)
        if self.injecting:
            for trajectory in trajectories:
                for turn in trajectory.turns:
                    turn.reward = difflib.SequenceMatcher(
                        None, turn.reasoning or "", TEMPLATE
                    ).ratio() / len(trajectory.turns)
        return trajectories


def run(spec: str, overrides: list[str], seed: int, mode: str, args) -> dict:
    cfg = load_config(
        spec,
        [
            *overrides,
            f"experiment.seed={seed}",
            f"experiment.output_dir={args.out}/{mode}-s{seed}",
            "experiment.name=act-vs-warn",
            f"experiment.run_name={mode}-s{seed}",
            f"trainer.iterations={args.iterations}",
            f"trainer.val_every={args.iterations}",
            "trainer.checkpoint_every=2",
            "trainer.val_episodes=64",
            "rollout.group_size=4",
            "diagnostics.every=2",
            "diagnostics.chain_every=100",
            "diagnostics.grad_snr_every=0",
            f"tracking.uri={args.tracking}",
            f"alarms.template_collapse.mode={mode}",
            f"alarms.low_entropy_collapse.mode={mode}",
            "alarms.control.cooldown=2",
            "alarms.control.max_actions=4",
        ],
    )
    started = time.perf_counter()
    summary = InjectedTrainer(cfg, args.inject_from).run()
    client = MlflowClient(summary.tracking_uri)
    return run_row(client, summary.run_id, seed, mode, time.perf_counter() - started)


def run_row(client, run_id: str, seed: int, mode: str, seconds: float) -> dict:
    """One run's measures, read back from MLflow."""

    def history(key):
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    mi, retrieval = history(f"{PREFIX}/mi_estimate"), history(f"{PREFIX}/retrieval_acc")
    last = sorted(mi)[-3:]
    run = client.get_run(run_id)
    tags = run.data.tags
    val, val_low, val_high = (history(f"val/success{s}") for s in ("", "_ci_low", "_ci_high"))
    return {
        "seed": seed,
        "mode": mode,
        "run_id": run_id,
        "status": run.info.status,
        "seconds": seconds,
        "mi_last3": float(np.mean([mi[s] for s in last])),
        "mi_points": {
            s: [
                mi[s],
                history(f"{PREFIX}/mi_estimate_ci_low")[s],
                history(f"{PREFIX}/mi_estimate_ci_high")[s],
            ]
            for s in sorted(mi)
        },
        "retrieval_last3": float(np.mean([retrieval[s] for s in last])),
        # The probe set's I(X;Z) at the last point (the verdicts protocol of 2026-11-27).
        "probe_mi_last": (lambda h: h[max(h)] if h else None)(history(PROBE_MI)),
        "val_success": val,
        "val_intervals": {s: (val_low[s], val_high[s]) for s in val},
        "alarms": sorted(k for k in tags if k.startswith("alarm.")),
        "actions": [tags[k] for k in sorted(tags) if k.startswith("control.")],
        "first_action": min(
            (int(tags[k].split(":")[0].split()[1]) for k in tags if k.startswith("control.")),
            default=None,
        ),
    }


def sweep_rows(client, parent_id: str, mode: str, strategy: str) -> list[dict]:
    """The finished trials of a sweep (MLflow parent run) with ``filter.strategy``."""
    parent = client.get_run(parent_id)
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'"
    )
    rows = []
    for child in children:
        params = child.data.params
        if params.get("filter.strategy") != strategy or child.info.status != "FINISHED":
            continue
        seconds = (child.info.end_time - child.info.start_time) / 1000
        rows.append(
            run_row(client, child.info.run_id, int(params["experiment.seed"]), mode, seconds)
        )
    return sorted(rows, key=lambda r: r["seed"])


def comparable(client, warn: dict, act: dict, tolerance: float = 1e-6) -> str | None:
    """None when the act run equals its warn run at every iteration up to and including its
    first action (all of them when it took none); else where they first differ."""
    last = act["first_action"]
    for key in ("rollout/success", f"{PREFIX}/mi_estimate"):
        w, a = (
            {m.step: m.value for m in client.get_metric_history(r["run_id"], key)}
            for r in (warn, act)
        )
        for step in sorted(set(w) | set(a)):
            if last is not None and step > last:
                break
            if step not in w or step not in a or abs(w[step] - a[step]) > tolerance:
                return f"{key} at iteration {step}: warn {w.get(step)}, act {a.get(step)}"
    if last is None and warn["val_success"] != act["val_success"]:
        return f"val/success: warn {warn['val_success']}, act {act['val_success']}"
    return None


def paired(rows: list[dict], key) -> str:
    warn = {r["seed"]: key(r) for r in rows if r["mode"] == "warn"}
    act = {r["seed"]: key(r) for r in rows if r["mode"] == "act"}
    diffs = np.array([act[s] - warn[s] for s in sorted(warn) if s in act])
    if len(diffs) < 2:
        return f"differences {diffs.tolist()}"
    mean, sem = diffs.mean(), diffs.std(ddof=1) / np.sqrt(len(diffs))
    low, high = (
        stats.t.interval(0.95, len(diffs) - 1, loc=mean, scale=sem) if sem > 0 else (mean, mean)
    )
    verdict = "act helps" if low > 0 else "act hurts" if high < 0 else "no difference shown"
    return (
        f"act - warn = {mean:+.3f} [{low:+.3f}, {high:+.3f}] over {len(diffs)} seeds "
        f"({', '.join(f'{d:+.3f}' for d in diffs)}): {verdict}"
    )


def decided(rows: list[dict], key, sesoi: float) -> str:
    """docs/reproduction.md's protocol of 2026-11-27 (its secondary act-vs-warn row, at
    0.05 on its own): act - warn per seed, reproduced / not reproduced / undecided."""
    from tether.analysis.decide import decide, paired_effect

    warn = {r["seed"]: key(r) for r in rows if r["mode"] == "warn"}
    act = {r["seed"]: key(r) for r in rows if r["mode"] == "act"}
    diffs = [act[s] - warn[s] for s in sorted(warn) if s in act and None not in (act[s], warn[s])]
    t = decide({"act": paired_effect(diffs, 1, sesoi)})["act"]
    return (
        f"act - warn = {t['mean']:+.3f} [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}] over "
        f"{t['n']} seeds: {t['verdict']} ({t['because']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", default="experiments/quickstart.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--inject-from", type=int, default=4)
    parser.add_argument("--modes", nargs="+", choices=["warn", "act"], default=["warn", "act"])
    parser.add_argument("--out", default="/tmp/act_vs_warn")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("WARN_PARENT", "ACT_PARENT"),
        help="protocol 4: compare two finished sweeps (MLflow parent run ids) instead of running",
    )
    parser.add_argument("--filter", default="top_p", help="--compare: the trials' filter.strategy")
    parser.add_argument("--tracking", help="--compare: the sweeps' MLflow tracking URI")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model.cache_dir=...")
    args = parser.parse_args()
    if args.compare:
        client = MlflowClient(args.tracking)
        warn, act = (
            sweep_rows(client, parent, mode, args.filter)
            for parent, mode in zip(args.compare, ("warn", "act"), strict=True)
        )
        by_seed = {r["seed"]: r for r in warn}
        differences = {
            r["seed"]: comparable(client, by_seed[r["seed"]], r)
            for r in act
            if r["seed"] in by_seed
        }
        for seed, difference in differences.items():
            print(f"seed {seed}: comparable before the first action: {difference or 'yes'}")
        if any(differences.values()):
            print("NOT COMPARABLE: rerun the warn arm on the current code before any verdict")
        rows = warn + act
    else:
        args.tracking = f"sqlite:///{Path(args.out).resolve() / 'mlflow.db'}"
        Path(args.out).mkdir(parents=True, exist_ok=True)
        rows = []
        for seed in args.seeds:
            for mode in args.modes:
                rows.append(run(args.spec, args.overrides, seed, mode, args))
                print(json.dumps(rows[-1]), flush=True)
    print()
    for r in rows:
        last_val = r["val_success"][max(r["val_success"])]
        low, high = r["val_intervals"][max(r["val_intervals"])]
        print(
            f"seed {r['seed']} {r['mode']:4}: MI (last 3 points) {r['mi_last3']:.3f}, retrieval "
            f"{r['retrieval_last3']:.3f}, val/success {r['val_success'][0]:.3f} -> {last_val:.3f} "
            f"[{low:.3f}, {high:.3f}], {r['seconds']:.0f} s; alarms {r['alarms']}; "
            f"actions {r['actions']}"
        )
    print("MI:", paired(rows, lambda r: r["mi_last3"]))
    print("retrieval:", paired(rows, lambda r: r["retrieval_last3"]))
    print("val/success:", paired(rows, lambda r: r["val_success"][max(r["val_success"])]))
    print("\nprotocol of 2026-11-27 (docs/reproduction.md), secondary, each at 0.05:")
    print("  final probe I(X;Z):", decided(rows, lambda r: r.get("probe_mi_last"), 0.05))
    print(
        "  final val/success:",
        decided(rows, lambda r: r["val_success"][max(r["val_success"])], 0.10),
    )


if __name__ == "__main__":
    main()
