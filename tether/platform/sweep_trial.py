"""What runs in a sweep trial's process: Tune's function trainable, one full training run
whose iterations are reported to Tune (``run_trial``), with the trial's config."""

from __future__ import annotations

import math
from typing import Any

from .events import Event
from .sweep_search import decode
from .sweep_spec import SweepSpec, flat_values, swept_fields


def run_trial(config: dict[str, Any], spec_json: str, parent_run_id: str) -> None:
    """Tune's function trainable: one full training run, metrics reported per iteration."""
    from ray import tune

    from .actor_pool import process_pool
    from .trainer import Trainer

    spec = SweepSpec.from_json(spec_json)
    values = decode(spec, config)
    trial_id = tune.get_context().get_trial_id()
    cfg = stop_when_collapsed(spec.build(values), spec.sweep.stop_collapsed)
    cfg.experiment.run_name = f"{spec.name}-{trial_id}"
    resolved = cfg.flat()
    tags = {
        "sweep.name": spec.name,
        "sweep.trial_id": trial_id,
        **{f"sweep.param.{k}": resolved.get(k, v) for k, v in swept_fields(spec).items()},
        **{f"sweep.param.{k}": v for k, v in flat_values(values).items()},
    }

    reported = [0]  # the last iteration Tune has

    def on_event(kind: str, data: dict) -> None:
        if kind == Event.TRACKING:  # the spool's start and drain lines, into the trial's log
            print(data["message"], flush=True)
        elif kind == Event.ITERATION and data["iteration"] > reported[0]:
            # (an iteration re-run after a learner rebuild is reported, as logged, once)
            reported[0] = data["iteration"]
            tune.report(
                {
                    k: float(v)
                    for k, v in data.items()
                    if k != "total" and isinstance(v, (int, float)) and math.isfinite(float(v))
                }
            )

    # Tune reuses this process (and its placement group) for the next trial with the same
    # resources; the process's pool keeps a finished trial's rollout workers and learner
    # for it, and ends them if that trial's constructor arguments differ (actor_pool.py).
    summary = Trainer(
        cfg, on_event, parent_run_id=parent_run_id, run_tags=tags, actor_pool=process_pool()
    ).run()
    if summary.status != "FINISHED":
        raise RuntimeError(f"trial {trial_id} ended {summary.status}")


def stop_when_collapsed(cfg, stop):
    """The trial's config with the listed MI alarms in stop mode after ``stop.points``
    collapsed diagnostic points (unchanged when ``stop`` is None)."""
    if stop is None:
        return cfg
    for name in stop.alarms:
        alarm = getattr(cfg.alarms, name)
        update = {"mode": "stop", "patience": stop.points}
        if hasattr(alarm, "within"):
            update["within"] = max(alarm.within, stop.points)
        setattr(cfg.alarms, name, alarm.model_copy(update=update))
    return cfg
