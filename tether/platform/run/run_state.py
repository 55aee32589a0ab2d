"""Everything a checkpoint keeps of the driver: one schema, written and read here.

A checkpoint file is ``{"learner": <the learner's full state>, "driver": <RunState>}``
(``checkpoint.py`` writes and reads the file).  ``RunState.to_checkpoint()`` is the
``driver`` part and ``RunState.from_checkpoint()`` reads it back; a field added here is
saved and restored by the same two lines, so a resumed run cannot silently lose it.
Checkpoints written before a field existed load with that field's default.
``Trainer.checkpoint`` gathers a RunState from the run's parts and ``Trainer.restore``
hands it back to them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class RunState:
    #: the last iteration this state includes (training resumes at the next)
    iteration: int
    #: the MLflow run the checkpoint belongs to (``--resume`` continues it)
    run_id: str
    #: the run's config (``model_dump(mode="json")``), checked by ``--resume``
    config: dict
    #: training level seeds handed out so far (``LevelSampler.position``)
    sampler_position: int
    #: the MI diagnostics' running averages
    mi_ema_state: dict
    #: ``AlarmMonitor.state_dict()``
    alarms: dict
    #: rollout-worker failures survived so far (``rollout/worker_failures``)
    worker_failures: int
    #: validation step -> val/success
    val_history: dict[int, float] = field(default_factory=dict)
    #: validation step -> (low, high) of val/success (95 % Wilson interval)
    val_intervals: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: ``AlarmResponder.state_dict()`` when an alarm acts (controller, knobs, grounded
    #: checkpoints); None otherwise
    control: dict | None = None
    #: the driver's random generators (numpy's legacy global state, torch's CPU state;
    #: by default their state when the RunState is made)
    numpy_rng: Any = field(default_factory=np.random.get_state)
    torch_rng: Any = field(default_factory=torch.get_rng_state)

    def to_checkpoint(self) -> dict:
        """The ``driver`` part of a checkpoint file."""
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if state["control"] is None:  # as before RunState: no key when no alarm acts
            del state["control"]
        return state

    @classmethod
    def from_checkpoint(cls, driver: dict) -> RunState:
        """Read a checkpoint's ``driver`` part (fields it lacks take their defaults)."""
        known = {f.name for f in dataclasses.fields(cls)}
        state = cls(**{k: v for k, v in driver.items() if k in known})
        state.val_history = {int(k): float(v) for k, v in state.val_history.items()}
        state.val_intervals = {
            int(k): (float(low), float(high)) for k, (low, high) in state.val_intervals.items()
        }
        return state

    def restore_rng(self) -> None:
        """Put the driver's random generators back where they were at the checkpoint."""
        np.random.set_state(self.numpy_rng)
        torch.set_rng_state(self.torch_rng)
