"""The driver's old import path.

The driver is now a conductor with owned parts (docs/architecture.md, "The driver"):
the loop in ``trainer.py``, the workers in ``fleet.py``, the checkpoint schema in
``run_state.py``, alarms and their responses in ``alarm_responder.py``, recovery in
``recovery.py``.  Code written against ``tether.platform.driver`` keeps working through
these names; new code imports from the modules above.
"""

from .stages import RESAMPLE_GROUP_IDS, LevelSampler, Timers
from .trainer import RunSummary, Trainer

__all__ = ["RESAMPLE_GROUP_IDS", "LevelSampler", "RunSummary", "Timers", "Trainer"]
