"""What runs in a sweep trial's process: Tune's function trainable, one full training run
whose iterations are reported to Tune (``run_trial``), with the trial's config.

Every report carries a Tune checkpoint that names the trial's MLflow run and its
checkpoint directory (``trial.json``, a few bytes: the weights stay in Tether's own
checkpoints).  A trial that ``tether sweep --resume`` restores gets it back from
``tune.get_checkpoint()`` and continues that MLflow run from the newest checkpoint in
that directory, at the trial's cadence (``sweep.checkpoint_every``), instead of from
its first iteration."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from ..run.checkpoint import latest_checkpoint
from ..run.events import Event, fault_message
from .search import decode
from .spec import SweepSpec, flat_values, swept_fields


def run_trial(config: dict[str, Any], spec_json: str, parent_run_id: str) -> None:
    """Tune's function trainable: one full training run, metrics reported per iteration."""
    from ray import tune

    from ..run.actor_pool import process_pool
    from ..run.trainer import Trainer

    spec = SweepSpec.from_json(spec_json)
    values = decode(spec, config)
    trial_id = tune.get_context().get_trial_id()
    cfg = stop_when_collapsed(spec.build(values), spec.sweep.stop_collapsed)
    if spec.sweep.checkpoint_every:
        cfg.trainer.checkpoint_every = spec.sweep.checkpoint_every
    cfg.experiment.run_name = f"{spec.name}-{trial_id}"
    tags = trial_tags(spec, cfg, values, trial_id)

    resume_from, resume_run_id = continued_from(tune.get_checkpoint())
    if resume_from is not None:
        print(f"trial {trial_id}: continuing run {resume_run_id} from {resume_from}", flush=True)
    reported = [0]  # the last iteration Tune has
    pointer: dict[str, str] = {}  # what this trial's Tune checkpoints name

    def on_event(kind: str, data: dict) -> None:
        if kind == Event.TRACKING:  # the spool's start and drain lines, into the trial's log
            print(data["message"], flush=True)
        elif kind in (Event.WORKER_FAILED, Event.LEARNER_FAILED):  # a fault survived
            print(f"trial {trial_id}: {fault_message(kind, data)}", flush=True)
        elif kind == Event.STARTED:
            pointer.update(
                run_id=data["run_id"], checkpoints=str(trainer.checkpoint_dir().resolve())
            )
        elif kind == Event.ITERATION and data["iteration"] > reported[0]:
            # (an iteration re-run after a learner rebuild is reported, as logged, once)
            reported[0] = data["iteration"]
            metrics = {
                k: float(v)
                for k, v in data.items()
                if k != "total" and isinstance(v, (int, float)) and math.isfinite(float(v))
            }
            with tempfile.TemporaryDirectory() as directory:
                (Path(directory) / TRIAL_POINTER).write_text(json.dumps(pointer))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))

    # Tune reuses this process (and its placement group) for the next trial with the same
    # resources; the process's pool keeps a finished trial's rollout workers and learner
    # for it, and ends them if that trial's constructor arguments differ (actor_pool.py).
    trainer = Trainer(
        cfg,
        on_event,
        parent_run_id=parent_run_id,
        run_tags=tags,
        actor_pool=process_pool(),
        resume_from=resume_from,
        resume_run_id=resume_run_id,
    )
    summary = trainer.run()
    if summary.status != "FINISHED":
        raise RuntimeError(f"trial {trial_id} ended {summary.status}")


def trial_tags(spec: SweepSpec, cfg, values: dict, trial_id: str) -> dict[str, Any]:
    """The trial run's sweep tags: the sweep, the trial and each swept field's value."""
    resolved = cfg.flat()
    return {
        "sweep.name": spec.name,
        "sweep.trial_id": trial_id,
        **{f"sweep.param.{k}": resolved.get(k, v) for k, v in swept_fields(spec).items()},
        **{f"sweep.param.{k}": v for k, v in flat_values(values).items()},
    }


#: The file of a trial's Tune checkpoint: {"run_id": ..., "checkpoints": <directory>}.
TRIAL_POINTER = "trial.json"


def continued_from(checkpoint) -> tuple[Path | None, str | None]:
    """(Tether checkpoint, MLflow run id) a restored trial continues from, read from its
    Tune ``checkpoint``; (None, None) for a new trial, or for one interrupted before its
    first Tether checkpoint (it starts again, in a new MLflow run)."""
    if checkpoint is None:
        return None, None
    with checkpoint.as_directory() as directory:
        pointer = json.loads((Path(directory) / TRIAL_POINTER).read_text())
    newest = latest_checkpoint(Path(pointer["checkpoints"])) if pointer else None
    return (newest, pointer["run_id"]) if newest is not None else (None, None)


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
