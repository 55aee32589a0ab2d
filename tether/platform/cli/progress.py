"""Progress in a terminal (rich bars with an ETA) or in a log (one plain line per event).

``tether run`` and ``tether sweep`` share the bars: the warm start, the training
iterations, and for a sweep the trials (done / running / left) with an ETA over all of
them plus one bar per running trial.  Where stdout is not a terminal (``ray job logs``,
CI, a file) nothing is redrawn: each event is one line.  ``RunDisplay`` shows a run's
events (``events.Event``); ``SweepDisplay`` a sweep's trials, from Tune's callbacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..run.events import Event, fault_message

__all__ = ["KEY_METRICS", "RunDisplay", "SweepDisplay", "bars"]

DONE = ("TERMINATED", "ERROR")

#: (metric, label) shown with each iteration, and (but the last) in the run's summary.
KEY_METRICS = [
    ("rollout/success", "success"),
    ("rollout/in_group_reward_std", "rv"),
    ("filter/kept_ratio", "kept"),
    ("actor/entropy", "entropy"),
    ("val/success", "val"),
]


def bars(console: Console, speed_estimate_period: float = 30.0) -> Progress:
    """The progress bars of ``tether run`` and ``tether sweep``: what, bar, count, time
    spent, time left (ETA), and a free-text ``info`` field."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
        speed_estimate_period=speed_estimate_period,
    )


def key_metrics(data: dict) -> str:
    """``success 0.250  rv 0.433 ...``: the key metrics an iteration reported."""
    return "  ".join(f"{label} {data[key]:.3f}" for key, label in KEY_METRICS if key in data)


class RunDisplay:
    """A run's events as ``tether run`` shows them: the warm start and the iterations as
    bars in a terminal, one line each in a log; the run's start, validation, alarms,
    actions, failures and the tracking spool's messages as lines either way.  Call it as
    the Trainer's ``on_event`` inside ``with display:``."""

    #: The events shown (each by its method ``_<kind>``); the others pass silently.
    SHOWN = frozenset(Event) - {Event.COLLECTING}

    def __init__(self, console: Console, plain: bool | None = None) -> None:
        self.console = console
        self.plain = not console.is_terminal if plain is None else plain
        self.progress = bars(console)
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> RunDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def __call__(self, kind: str, data: dict) -> None:
        if kind in self.SHOWN:
            getattr(self, f"_{kind}")(data)

    def _say(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def _warm_start(self, data: dict) -> None:
        step, total, loss = data["step"], data["total"], data["loss"]
        if self.plain:
            if step % max(1, total // 10) == 0 or step == total:
                self.console.print(f"warm start {step}/{total} loss {loss:.3f}")
            return
        if "warm" not in self.tasks:
            self.tasks["warm"] = self.progress.add_task("warm start", total=total, info="")
        self.progress.update(self.tasks["warm"], completed=step, info=f"loss {loss:.3f}")

    def _iteration(self, data: dict) -> None:
        if self.plain:
            self._say(
                f"iteration {data['iteration']}/{data['total']}  {key_metrics(data)}  "
                f"({data.get('timing/iteration', 0):.1f} s)"
            )
            return
        if "train" not in self.tasks:
            self.tasks["train"] = self.progress.add_task("training", total=data["total"], info="")
        self.progress.update(
            self.tasks["train"], completed=data["iteration"], info=key_metrics(data)
        )

    def _started(self, data: dict) -> None:
        self.console.print(f"MLflow run [cyan]{data['run_id']}[/]  model {data['model_path']}")
        if data.get("first_iteration", 1) > 1:
            self.console.print(f"resuming at iteration {data['first_iteration']}")

    def _validation(self, data: dict) -> None:
        self.console.print(f"validation before training: success {data['val/success']:.3f}")

    def _alarm(self, data: dict) -> None:
        style = "bold red" if data["mode"] == "stop" else "yellow"
        self._say(f"[{style}]ALARM[/] {data['message']}")

    def _action(self, data: dict) -> None:
        self._say(f"[cyan]ACTION[/] iteration {data['iteration']}: {data['message']}")

    def _tracking(self, data: dict) -> None:
        self._say(f"[yellow]{data['message']}[/]")

    _checkpoint_failed = _batch_refused = _tracking

    def _learner_failed(self, data: dict) -> None:
        self._say(f"[yellow]{fault_message(Event.LEARNER_FAILED, data)}[/]")

    def _worker_failed(self, data: dict) -> None:
        self._say(f"[yellow]{fault_message(Event.WORKER_FAILED, data)}[/]")


class SweepDisplay:
    """A sweep's progress, driven from the driver process (the warm start's callback and
    the Tune callback ``sweep.SweepProgress``): rich bars in a terminal, plain lines
    otherwise.  Not picklable by design; the Tune callback only looks it up
    (``sweep.showing``), so it never travels with the pickled experiment."""

    def __init__(self, console: Console, plain: bool | None = None) -> None:
        self.console = console
        self.plain = not console.is_terminal if plain is None else plain
        # The sweep's ETA: the average pace since this process started (trials take
        # minutes each, so rich's default 30 s window would mostly show no estimate).
        self.progress = bars(console, speed_estimate_period=24 * 3600.0)
        self._warm: int | None = None
        self._overall: int | None = None
        self._trial_tasks: dict[str, int] = {}
        self._iterations: dict[str, int] = {}  # trial id -> its trainer.iterations
        self._results: dict[str, dict] = {}  # trial id -> its last result in this process
        self._last_refresh = 0.0

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> SweepDisplay:
        if not self.plain:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self.plain:
            self.progress.stop()

    def __reduce__(self):  # a live terminal display belongs to one process
        raise TypeError("SweepDisplay is not picklable (it holds the terminal)")

    # -- events ------------------------------------------------------------------------
    def line(self, text: str) -> None:
        """A line above the bars (or in the log: never wrapped, one event a line)."""
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def warm_start(self, step: int, total: int, loss: float) -> None:
        if self.plain:
            if step % max(1, total // 10) == 0 or step == total:
                self.line(f"warm start {step}/{total} loss {loss:.3f}")
            return
        if self._warm is None:
            self._warm = self.progress.add_task("warm start", total=total, info="")
        self.progress.update(self._warm, completed=step, total=total, info=f"loss {loss:.3f}")

    def trials(
        self,
        trials: list,
        expected: int,
        iterations_of: Callable[[Any], int],
        default_iterations: int,
        metric: str | None = None,
        latest: dict[str, dict] | None = None,
        ended: str | None = None,
    ) -> None:
        """Redraw the sweep's bars from Tune's trial list: the overall bar counts iterations
        over all trials (a finished or stopped trial counts in full; trials not created
        yet count ``default_iterations``), so its ETA covers the whole sweep.  ``latest``:
        results Tune has not stored in their trials yet (trial id -> result); ``ended``: a
        trial Tune is ending (its status changes after the callbacks).  A running
        trial counts the iterations it reported to this process: after ``--resume`` an
        unfinished trial starts again from its first iteration."""
        if self.plain:
            return
        seen = self._results
        seen.update(latest or {})
        iterations = self._iterations
        status = {t.trial_id: "TERMINATED" if t.trial_id == ended else t.status for t in trials}
        for t in trials:  # each trial's own trainer.iterations (a swept field, maybe)
            if t.trial_id not in iterations:
                iterations[t.trial_id] = iterations_of(t)
            if status[t.trial_id] not in DONE and status[t.trial_id] != "RUNNING":
                seen.pop(t.trial_id, None)  # pending (again): its next result says where
        total_trials = max(expected, len(trials))
        done = sum(s in DONE for s in status.values())
        running = sum(s == "RUNNING" for s in status.values())
        left = total_trials - done - running

        def progress(t) -> int:
            n = iterations[t.trial_id]
            return n if status[t.trial_id] in DONE else min(n, _iteration(seen.get(t.trial_id, {})))

        work_total = (
            sum(iterations[t.trial_id] for t in trials)
            + (total_trials - len(trials)) * default_iterations
        )
        work_done = sum(progress(t) for t in trials)
        description = f"trials {done}/{total_trials} done, {running} running, {left} left"
        info = "(iterations of all trials)"
        if self._overall is None:  # from what is done already (a resumed sweep): the
            self._overall = self.progress.add_task(  # ETA counts this run's pace only
                description, total=work_total, completed=work_done, info=info
            )
        self.progress.update(
            self._overall, description=description, total=work_total, completed=work_done, info=info
        )
        self._trial_bars(trials, status, progress, metric)

    def _trial_bars(self, trials: list, status: dict, progress, metric: str | None) -> None:
        """One bar per running trial (``progress(t)``: its iterations done); a trial that
        stopped running loses its bar."""
        for t in trials:
            task = self._trial_tasks.get(t.trial_id)
            if status[t.trial_id] == "RUNNING":
                result = self._results.get(t.trial_id, {})
                info = "" if metric not in result else f"{metric} {result[metric]:.3f}"
                if task is None:
                    task = self._trial_tasks[t.trial_id] = self.progress.add_task(
                        f"  trial {t.trial_id}", total=self._iterations[t.trial_id], info=""
                    )
                self.progress.update(task, completed=progress(t), info=info)
            elif task is not None:
                self.progress.remove_task(self._trial_tasks.pop(t.trial_id))

    def throttled(self) -> bool:
        """True at most once a second (for redraws on every step of Tune's loop)."""
        now = time.monotonic()
        if now - self._last_refresh < 1.0:
            return False
        self._last_refresh = now
        return True


def _iteration(result: dict) -> int:
    """A trial's last reported iteration: Tether's own count (the same after a resume
    from a checkpoint), else Tune's count of reports."""
    return int(result.get("iteration", result.get("training_iteration", 0)) or 0)
