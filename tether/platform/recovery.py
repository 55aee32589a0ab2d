"""When something the run depends on fails mid-run: a learner rank dies (the group is
rebuilt from the last checkpoint and the lost iterations re-run), a checkpoint cannot
be written (training goes on with a warning, or stops), and a ``--resume`` (the MLflow
run counts and names its resumes).  A dead rollout worker is the fleet's own
business (``fleet.py``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..actors.learner_group import LearnerDied, LearnerGroup
from .checkpoint import CheckpointError, latest_checkpoint
from .launch import learner_request, start_learner
from .tracking import Tracker

if TYPE_CHECKING:
    from .trainer import Trainer


def recover_learner(trainer: Trainer, died: LearnerDied) -> int:
    """A learner rank died: end the group, start a new one (after a backoff) and load
    the last checkpoint into it and the driver (same seeds, same MLflow run); return
    the checkpoint's iteration. Up to ``trainer.max_learner_restarts`` times a run."""
    t, tracker = trainer.cfg.trainer, trainer.tracker
    directory = trainer.checkpoint_dir()
    while True:
        trainer.learner_restarts += 1
        restarts = trainer.learner_restarts
        path = latest_checkpoint(directory) if directory.is_dir() else None
        if path is None:
            raise RuntimeError(
                f"{died}; not rebuilt: no checkpoint yet "
                f"(trainer.checkpoint_every = {t.checkpoint_every})"
            ) from died
        if restarts > t.max_learner_restarts:
            raise RuntimeError(
                f"{died}; not rebuilt: trainer.max_learner_restarts = "
                f"{t.max_learner_restarts} used up"
            ) from died
        trainer.emit(
            "learner_failed", {"error": str(died), "restart": restarts, "checkpoint": str(path)}
        )
        tracker.set_tags(
            {
                "tether.learner_restarts": restarts,
                f"tether.learner_restart_{restarts}": f"after iteration "
                f"{trainer.iteration_done}: {died}; rebuilt from {path}",
            }
        )
        LearnerGroup.shutdown(trainer.learner)  # the survivors of a broken process group
        time.sleep(t.learner_restart_backoff_s * 2 ** (restarts - 1))
        try:
            trainer.learner = learner_request(trainer.cfg, trainer.model_path).create()
            trainer.actor_pool.replace("learner", trainer.learner)
            start_learner(trainer)
            return trainer.restore(path, resumed=False)
        except LearnerDied as again:
            died = again


def checkpoint_failed(exc: CheckpointError, trainer: Trainer) -> None:
    """A checkpoint not written (disk full, ...): the last good one stays; per
    ``trainer.checkpoint_errors`` training goes on with a warning, or the run stops
    (CheckpointError ends it FAILED, with one line naming both)."""
    trainer.responder.forget_unwritten()
    trainer.tracker.set_tags({"tether.checkpoint_error": str(exc)})
    if trainer.cfg.trainer.checkpoint_errors == "stop":
        raise exc
    trainer.emit(
        "checkpoint_failed",
        {"message": f"{exc}; training goes on (trainer.checkpoint_errors = warn)"},
    )


def record_resume(tracker: Tracker, iteration: int, path: Path) -> None:
    """Tags of a run continued by a new driver process (``--resume``): from which
    iteration, how many times, and from which checkpoint file."""
    resumes = (
        int(tracker.client.get_run(tracker.run_id).data.tags.get("tether.resume_count", "0")) + 1
    )
    tracker.set_tags(
        {
            "tether.resumed_from": iteration,
            "tether.resume_count": resumes,
            f"tether.resume_{resumes}": f"iteration {iteration} from {path}",
        }
    )
