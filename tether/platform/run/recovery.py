"""When something the run depends on fails mid-run: a learner rank dies (the group is
rebuilt from the last checkpoint, or before the first one from the run's starting
weights, and the lost iterations re-run), a checkpoint cannot
be written (training goes on with a warning, or stops), and a ``--resume`` (the MLflow
run counts and names its resumes).  A dead rollout worker is the fleet's own
business (``fleet.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ...actors.learner_group import LearnerDied
from ..config import TrainerConfig
from ..tracking.tracker import Tracker
from .alarm_responder import AlarmResponder
from .checkpoint import CheckpointError, latest_checkpoint
from .events import Event

#: where a learner that died before the run's first checkpoint is rebuilt from
STARTING_WEIGHTS = "the run's starting weights (no checkpoint yet)"


class LearnerRecovery:
    """Rebuilds a learner group a rank of which died, from the run's last checkpoint (none
    yet: from the run's start), up to ``trainer.max_learner_restarts`` times a run
    (counted in ``restarts``)."""

    def __init__(self, cfg: TrainerConfig, emit: Callable[[str, dict], None]) -> None:
        self.cfg, self.emit = cfg, emit
        #: learner groups rebuilt after a rank died (this process)
        self.restarts = 0

    def recover(
        self,
        died: LearnerDied,
        directory: Path,
        tracker: Tracker,
        iteration_done: int,
        shutdown: Callable[[], None],
        rebuild: Callable[[Path | None], int],
    ) -> int:
        """End the broken group (``shutdown``), wait a backoff, ``rebuild`` a new one at
        the last checkpoint in ``directory`` (None before the first: at the run's start)
        (same seeds, same MLflow run) and return the iteration it is at; a rank that dies
        during the rebuild counts as another."""
        t = self.cfg
        while True:
            self.restarts += 1
            path = latest_checkpoint(directory) if directory.is_dir() else None
            origin = str(path) if path is not None else STARTING_WEIGHTS
            if self.restarts > t.max_learner_restarts:
                raise RuntimeError(
                    f"{died}; not rebuilt: trainer.max_learner_restarts = "
                    f"{t.max_learner_restarts} used up"
                ) from died
            self.emit(
                Event.LEARNER_FAILED,
                {"error": str(died), "restart": self.restarts, "checkpoint": origin},
            )
            tracker.set_tags(
                {
                    "tether.learner_restarts": self.restarts,
                    f"tether.learner_restart_{self.restarts}": f"after iteration "
                    f"{iteration_done}: {died}; rebuilt from {origin}",
                }
            )
            shutdown()  # the survivors of a broken process group
            time.sleep(t.learner_restart_backoff_s * 2 ** (self.restarts - 1))
            try:
                return rebuild(path)
            except LearnerDied as again:
                died = again


def checkpoint_failed(
    exc: CheckpointError,
    cfg: TrainerConfig,
    responder: AlarmResponder,
    tracker: Tracker,
    emit: Callable[[str, dict], None],
) -> None:
    """A checkpoint not written (disk full, ...): the last good one stays; per
    ``trainer.checkpoint_errors`` training goes on with a warning, or the run stops
    (CheckpointError ends it FAILED, with one line naming both)."""
    responder.forget_unwritten()
    tracker.set_tags({"tether.checkpoint_error": str(exc)})
    if cfg.checkpoint_errors == "stop":
        raise exc
    emit(
        Event.CHECKPOINT_FAILED,
        {"message": f"{exc}; training goes on (trainer.checkpoint_errors = warn)"},
    )


def record_resume(tracker: Tracker, iteration: int, path: Path) -> None:
    """Tags of a run continued by a new driver process (``--resume``): from which
    iteration, how many times, and from which checkpoint file."""
    resumes = int(tracker.opened_tags.get("tether.resume_count", "0")) + 1  # (read at open)
    tracker.set_tags(
        {
            "tether.resumed_from": iteration,
            "tether.resume_count": resumes,
            f"tether.resume_{resumes}": f"iteration {iteration} from {path}",
        }
    )
