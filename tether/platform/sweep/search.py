"""A sweep's search as Ray Tune takes it: the parameter space (labels Tune and Optuna can
show, decoded back to config values), the number of trials a design makes, the search
algorithm and scheduler (``TuneConfig``) and the progress table."""

from __future__ import annotations

import json
import math
from typing import Any

from .results import SUCCESS
from .spec import SweepSpec


def label(value: Any) -> Any:
    """How a value shows in Tune's tables and configs: scalars as they are, a section's
    mapping as ``k=v, k=v`` (Optuna takes scalars only; decode() maps labels back)."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={label(v)}" for k, v in value.items())
    return json.dumps(value) if isinstance(value, list) else value


def _case_label(path: str, value: Any) -> str:
    return (
        f"{path}={label(value)}"
        if not isinstance(value, dict)
        else ", ".join(f"{path}.{k}={label(v)}" for k, v in value.items())
    )


def param_space(spec: SweepSpec) -> dict[str, Any]:
    from ray import tune

    sweep = spec.sweep
    if sweep.design == "one_at_a_time":
        return {
            "case": tune.grid_search(
                [_case_label(path, v) for path, d in sweep.space.items() for v in d.grid]
            )
        }
    space = {}
    for path, d in sweep.space.items():
        if d.kind == "grid":
            space[path] = tune.grid_search([label(v) for v in d.grid])
        elif d.kind == "choice":
            space[path] = tune.choice([label(v) for v in d.choice])
        elif d.kind == "uniform":
            space[path] = tune.uniform(*d.uniform)
        elif d.kind == "loguniform":
            space[path] = tune.loguniform(*d.loguniform)
        else:
            space[path] = tune.randint(d.randint[0], d.randint[1] + 1)  # Tune: upper excluded
    return space


def decode(spec: SweepSpec, config: dict[str, Any]) -> dict[str, Any]:
    """A trial's Tune config back to ``{dotted path: value}``."""
    sweep = spec.sweep
    if "case" in config:
        cases = {_case_label(path, v): {path: v} for path, d in sweep.space.items() for v in d.grid}
        return dict(cases[config["case"]])
    out = {}
    for path, value in config.items():
        d = sweep.space[path]
        if d.values is not None:
            value = next((v for v in d.values if label(v) == value), value)
        out[path] = value.item() if hasattr(value, "item") else value  # numpy scalars
    return out


def expected_trials(spec: SweepSpec) -> int:
    sweep = spec.sweep
    if sweep.design == "one_at_a_time":
        return sum(len(d.grid) for d in sweep.space.values()) * sweep.num_samples
    grid = math.prod(len(d.grid) for d in sweep.space.values() if d.kind == "grid")
    return grid * sweep.num_samples


def tune_config(spec: SweepSpec):
    from ray import tune

    sweep = spec.sweep
    seed = sweep.seed if sweep.seed is not None else spec.base.experiment.seed
    if sweep.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(seed=seed)
    else:
        from ray.tune.search.basic_variant import BasicVariantGenerator

        search_alg = BasicVariantGenerator(
            random_state=seed, max_concurrent=sweep.max_concurrent or 0
        )
    scheduler = None
    if sweep.scheduler.asha is not None:
        from ray.tune.schedulers import ASHAScheduler

        a = sweep.scheduler.asha
        scheduler = ASHAScheduler(
            time_attr="iteration",  # Tether's own: the same count after a resume
            max_t=a.max_t or spec.base.trainer.iterations,
            grace_period=a.grace_period,
            reduction_factor=a.reduction_factor,
        )
    # reuse_actors: a trial's process is kept for the next trial, which skips importing
    # torch and tether again (seconds of CPU per trial on a small machine), and so are its
    # rollout workers and learner when the next trial's are the same (run_trial).
    return tune.TuneConfig(
        metric=sweep.metric,
        mode=sweep.mode,
        search_alg=search_alg,
        scheduler=scheduler,
        num_samples=sweep.num_samples,
        reuse_actors=True,
        max_concurrent_trials=sweep.max_concurrent if sweep.search == "optuna" else None,
    )


def reporter(spec: SweepSpec):
    """The progress table (every 30 s and at the end): trials, swept values, metric."""
    from ray.tune import CLIReporter

    metrics = {
        "iteration": "iter",
        spec.sweep.metric: spec.sweep.metric.split("/")[-1],
        SUCCESS: "success",
    }
    return CLIReporter(
        parameter_columns=list(param_space(spec)),
        metric_columns=metrics,
        max_report_frequency=30,
        sort_by_metric=True,
        max_column_length=48,
    )
