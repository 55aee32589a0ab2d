"""A sweep's progress from Tune's callbacks: one plain line per trial event, or the
driver's ``progress.SweepDisplay`` bars; and the MLflow runs of trials Tune ended closed."""

from __future__ import annotations

from contextlib import contextmanager

from ray.tune import Callback

from .results import SUCCESS, finalize_child
from .search import decode, expected_trials
from .spec import SweepSpec, flat_values


class SweepProgress(Callback):
    """Tune callback: one plain line per trial event (readable in `ray job logs`) or, in a
    terminal, rich bars (trials done / running / left with an ETA, one bar per running
    trial); and the MLflow runs of trials that Tune ended (early stop, error) closed.
    Tune pickles its callbacks with the experiment for ``--resume``, so this holds plain
    data only: the bars belong to the driver process (``showing``)."""

    def __init__(
        self, tracking_uri: str, experiment_id: str, parent_run_id: str, spec_json: str
    ) -> None:
        self.tracking_uri, self.experiment_id = tracking_uri, experiment_id
        self.parent_run_id, self.spec_json = parent_run_id, spec_json

    def __getstate__(self):  # plain data only, whatever a later version caches here
        return {
            k: self.__dict__[k]
            for k in ("tracking_uri", "experiment_id", "parent_run_id", "spec_json")
        }

    def _spec(self) -> SweepSpec:
        spec = self.__dict__.get("_spec_cache")
        if spec is None:
            spec = self.__dict__["_spec_cache"] = SweepSpec.from_json(self.spec_json)
        return spec

    def _draw(self, trials, latest: dict | None = None, ended: str | None = None) -> None:
        if _display is not None and not _display.plain:
            spec = self._spec()
            _display.trials(
                trials,
                expected_trials(spec),
                lambda t: spec.build(decode(spec, t.config)).trainer.iterations,
                spec.base.trainer.iterations,
                spec.sweep.metric,
                latest,
                ended,
            )

    def on_step_end(self, iteration, trials, **info):
        if _display is not None and not _display.plain and _display.throttled():
            self._draw(trials)

    def on_trial_start(self, iteration, trials, trial, **info):
        values = ", ".join(
            f"{k}={v}" for k, v in flat_values(decode(self._spec(), trial.config)).items()
        )
        _say(f"trial {trial.trial_id} started: {values}")
        self._draw(trials)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if _display is not None and not _display.plain:  # the bars show it
            self._draw(trials, {trial.trial_id: result})
            return
        done = sum(t.status in ("TERMINATED", "ERROR") for t in trials)
        _say(
            f"trial {trial.trial_id} iteration {int(result.get('iteration', 0))}  "
            f"success {result.get(SUCCESS, float('nan')):.3f}  "
            f"[{done}/{max(len(trials), expected_trials(self._spec()))} trials done]"
        )

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._finalize(trial, "FINISHED")
        _say(f"trial {trial.trial_id} finished")
        self._draw(trials, ended=trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._finalize(trial, "FAILED")
        _say(f"trial {trial.trial_id} FAILED (error log: {trial.local_path})")
        self._draw(trials, ended=trial.trial_id)

    def _finalize(self, trial, status: str) -> None:
        """Close the trial's MLflow run if Tune ended it; with the server away, say so and
        leave it to the sweep's end (never raise: that would end the sweep)."""
        ids = (self.tracking_uri, self.experiment_id, self.parent_run_id)
        if not finalize_child(*ids, trial.trial_id, status):
            _say(
                f"trial {trial.trial_id}: tracking server {self.tracking_uri} is away; its "
                "run is closed at the sweep's end, once the server answers"
            )


_display = None  # the driver's SweepDisplay while Tune runs (never pickled)


@contextmanager
def showing(display):
    """Let the Tune callbacks of this process draw on ``display`` (None: plain prints)."""
    global _display
    previous, _display = _display, display
    try:
        yield
    finally:
        _display = previous


def _say(line: str) -> None:
    if _display is not None:
        _display.line(line)
    else:
        print(line, flush=True)
