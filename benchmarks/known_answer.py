"""Known-answer RL: does the real loop reach each task's optimum, per algorithm and seed,
and does each deliberate breakage fail the test?  (issue 32; `tether.testing.learning`)

Every run goes through the trainer with local Ray (rollout worker, env pool, learner,
filter, update).  A run **passes** (`tether.testing.learning.passes`) when held-out
success (128 levels) reaches the task's target (Choice 0.9 in 40 iterations, Doors 0.85
in 40; optimum 1.0), at least 0.2 above its start, with every update on-policy.  A
breakage is **caught** when the broken run does not pass.

    python benchmarks/known_answer.py --out /tmp/ka                      # the whole matrix
    python benchmarks/known_answer.py --tasks doors --presets grpo --seeds 0
    python benchmarks/known_answer.py --breakages-only
    python benchmarks/known_answer.py --seeds 1 --no-breakages --models /tmp/ka-models
    python benchmarks/known_answer.py --tasks doors --presets ppo --no-breakages \
        --set algo.kl_coef=0.05 algo.lr_schedule=cosine      # a candidate recipe

Writes ``<out>/known_answer.json`` and prints one row per run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tether.testing.learning import (  # noqa: E402
    BREAKAGES,
    TASKS,
    KnownAnswerResult,
    broken,
    cell_passes,
    known_answer_config,
    passes,
    run_known_answer,
)

#: Which task shows each breakage (a mask on later turns needs a multi-turn task).
BREAKAGE_TASKS = {
    "advantage_sign": "choice",
    "turn_mask": "doors",
    "old_logprobs": "choice",
    "loss_scale": "choice",
    "lr_not_applied": "choice",
}


def sections_of(overrides: list[str]) -> dict[str, dict]:
    """``section.key=value`` overrides (values read as YAML) as the sections
    ``known_answer_config`` adds to each run's config."""
    from tether.platform.config import parse_override

    sections: dict[str, dict] = {}
    for text in overrides:
        path, value = parse_override(text)
        if len(path) != 2:
            raise SystemExit(f"--set {text!r}: give section.key=value")
        sections.setdefault(path[0], {})[path[1]] = value
    return sections


def one_run(
    task,
    preset,
    seed,
    out: Path,
    breakage: str | None = None,
    models: Path | None = None,
    sections: dict | None = None,
) -> dict:
    name = f"{task}-{preset}-s{seed}" + (f"-{breakage}" if breakage else "")
    cfg = known_answer_config(
        task, preset, seed, out / name, models or out / "models", **(sections or {})
    )
    started = time.perf_counter()
    with broken(breakage) if breakage else contextlib.nullcontext():
        result = run_known_answer(cfg)
    verdict = passes(result, task)
    row = {
        "task": task,
        "preset": preset,
        "seed": seed,
        "breakage": breakage,
        "algo": cfg.algo.model_dump(include=RECIPE_FIELDS),
        "val_before": result.val_before,
        "val_after": result.val_after,
        "passes": verdict[0],
        "why": verdict[1],
        "success": result.success,
        "max_clipfrac": max(result.clipfrac or [float("nan")]),
        "status": result.status,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(
        f"{name:32s} val {row['val_before']:.3f} -> {row['val_after']:.3f}  "
        f"passes={row['passes']} ({row['why']})  ({row['seconds']} s)",
        flush=True,
    )
    return row


def as_result(row: dict) -> KnownAnswerResult:
    """A row back as the result the pass rules read."""
    return KnownAnswerResult(
        row["val_before"], row["val_after"], row["success"], [row["max_clipfrac"]], row["status"]
    )


#: The algorithm settings a row records (those a per-task recipe may change).
RECIPE_FIELDS = {"lr", "lr_schedule", "kl_coef", "entropy_coef", "clip_low", "clip_high"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/tether_known_answer"))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--presets", nargs="+", default=["grpo", "drgrpo", "dapo", "ppo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--breakages-only", action="store_true")
    parser.add_argument("--no-breakages", action="store_true", help="the matrix only")
    parser.add_argument(
        "--models", type=Path, help="warm-start cache, shareable (default <out>/models)"
    )
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a setting of every unbroken run (e.g. algo.kl_coef=0.05); "
        "the breakages run as the tests run them",
    )
    args = parser.parse_args()
    sections = sections_of(args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    if not args.breakages_only:
        for task in args.tasks:
            for preset in args.presets:
                cell = [
                    one_run(task, preset, seed, args.out, models=args.models, sections=sections)
                    for seed in args.seeds
                ]
                rows += cell
                ok, why = cell_passes([as_result(r) for r in cell], task)
                print(f"{task}-{preset} over seeds {args.seeds}: passes={ok} ({why})", flush=True)
    for breakage in () if args.no_breakages else BREAKAGES:
        rows.append(
            one_run(BREAKAGE_TASKS[breakage], "grpo", 0, args.out, breakage, models=args.models)
        )
    (args.out / "known_answer.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out / 'known_answer.json'}")


if __name__ == "__main__":
    main()
