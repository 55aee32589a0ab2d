"""The events a run reports while it trains, by name.

The ``Trainer`` and its parts call ``emit(kind, data)``; ``tether run`` shows them
(``cli/progress.RunDisplay``), a sweep trial forwards some to Tune (``sweep/trial.py``), and
without a hook the ones a user must see become log warnings (``log_warnings``).
``Event`` is a ``StrEnum``: a member equals its plain string, so a hook may compare
``kind == "iteration"`` as well as ``kind == Event.ITERATION``.

=================  ======================================  =================================
kind               emitted by                              data
=================  ======================================  =================================
warm_start         Trainer.setup (each warm-start step)    step, total, loss
started            Trainer.run (the MLflow run is open)    run_id, model_path, first_iteration
validation         Trainer.run (before training)           iteration (0), val/success
collecting         RolloutFleet.collect (each attempt)     attempt, workers, episodes
worker_failed      RolloutFleet.collect                    worker, attempt, error
iteration          Trainer.after_iteration                 iteration, total, and the metrics
alarm              AlarmResponder.record_alarm             name, iteration, mode, message
action             AlarmResponder.act (a response taken,   iteration, alarm, kind, message,
                   or passed over: kind ``passed_over``)   rollback_to
learner_failed     LearnerRecovery.recover                 error, restart, checkpoint
checkpoint_failed  recovery.checkpoint_failed              message
batch_refused      RolloutPipeline.batch (too stale)        message
tracking           the Tracker's spool (notify)            message
=================  ======================================  =================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum

__all__ = ["WARNINGS", "Emit", "Event", "fault_message", "log_warnings"]


class Event(StrEnum):
    WARM_START = "warm_start"
    STARTED = "started"
    VALIDATION = "validation"
    COLLECTING = "collecting"
    WORKER_FAILED = "worker_failed"
    ITERATION = "iteration"
    ALARM = "alarm"
    ACTION = "action"
    LEARNER_FAILED = "learner_failed"
    CHECKPOINT_FAILED = "checkpoint_failed"
    BATCH_REFUSED = "batch_refused"
    TRACKING = "tracking"


#: ``emit(kind, data)``: how the run reports an event.
Emit = Callable[[str, dict], None]

#: Events whose ``message`` a user must see even without a hook (logged as warnings).
WARNINGS = (Event.TRACKING, Event.CHECKPOINT_FAILED, Event.BATCH_REFUSED)


def log_warnings(kind: str, data: dict) -> None:
    """Without an event hook, the tracking spool's and a failed checkpoint's messages
    still reach the user (``WARNINGS``)."""
    if kind in WARNINGS:
        logging.getLogger(f"tether.{kind}").warning(data["message"])


def fault_message(kind: str, data: dict) -> str | None:
    """The one line a survived fault gets, wherever the run shows it (``tether run``'s
    display, a sweep trial's log); None for other events."""
    if kind == Event.WORKER_FAILED:
        return f"rollout worker {data['worker']} failed ({data['error']}); re-collecting its share"
    if kind == Event.LEARNER_FAILED:
        return (
            f"learner died ({data['error']}); restart {data['restart']}: "
            f"rebuilding from {data['checkpoint']}"
        )
    return None
