"""A sweep's progress: plain lines where stdout is not a terminal (logs, `ray job logs`),
rich bars (warm start; trials done / running / left with an ETA) in a terminal; the Tune
callback stays picklable either way.  No Ray, no training: Tune's trials are stand-ins."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from tether.platform.cli.progress import SweepDisplay
from tether.platform.sweep import progress as sweep_progress
from tether.platform.sweep import runner as sweep
from tether.platform.sweep.spec import load_sweep_spec

ROOT = Path(__file__).resolve().parents[1]


def trial(trial_id, status, iteration=0, success=None):
    result = {"training_iteration": iteration} if iteration else {}
    if success is not None:
        result["rollout/success"] = success
    return SimpleNamespace(
        trial_id=trial_id,
        status=status,
        last_result=result,
        config={"filter": "strategy=none"},
        local_path="/tmp/x",
    )


@pytest.fixture
def callback(monkeypatch):
    monkeypatch.setattr(sweep_progress, "finalize_child", lambda *a: True)  # no MLflow here
    spec = load_sweep_spec(ROOT / "experiments" / "filters_smoke.yaml")
    return sweep.SweepProgress("sqlite:///unused.db", "0", "parent", spec.to_json())


def events(cb):
    """A 4-trial sweep's first events, as Tune would call the callback."""
    a, b = trial("a", "RUNNING"), trial("b", "PENDING")
    cb.on_trial_start(0, [a, b], a)
    cb.on_step_end(0, [a, b])
    cb.on_trial_result(
        1, [a, b], a, {"training_iteration": 1, "iteration": 1, "rollout/success": 0.25}
    )
    cb.on_trial_complete(2, [a, b], a)  # Tune sets the status after its callbacks
    a.status, a.last_result = "TERMINATED", {"training_iteration": 24}
    return [a, b]


def test_not_a_terminal_prints_one_line_per_event(callback):
    out = io.StringIO()
    display = SweepDisplay(Console(file=out, width=200))
    assert display.plain
    with display, sweep.showing(display):
        for step in range(1, 21):
            display.warm_start(step, 20, 1.0 / step)
        events(callback)
        display.line("trial b FAILED (error log: /" + "x" * 300 + ")")
    lines = out.getvalue().splitlines()[:-1]
    assert out.getvalue().splitlines()[-1].endswith("x)")  # one line, not wrapped at 80
    assert lines[:3] == [
        "warm start 2/20 loss 0.500",
        "warm start 4/20 loss 0.250",
        "warm start 6/20 loss 0.167",
    ]
    assert "warm start 20/20 loss 0.050" in lines
    assert lines[-3:] == [
        "trial a started: filter.strategy=none",
        "trial a iteration 1  success 0.250  [0/4 trials done]",
        "trial a finished",
    ]
    assert "\x1b" not in out.getvalue()  # no bars, no cursor movement


def test_without_a_display_lines_go_to_stdout(callback, capsys):
    events(callback)  # run_sweep called from code (tests, benchmarks): display=None
    assert capsys.readouterr().out.splitlines()[-1] == "trial a finished"


def test_terminal_shows_bars_and_the_callback_stays_picklable(callback):
    out = io.StringIO()
    display = SweepDisplay(Console(file=out, force_terminal=True, width=160))
    with display, sweep.showing(display):
        display.warm_start(10, 20, 0.5)
        trials = events(callback)
        assert display.progress.tasks[1].description == "trials 1/4 done, 0 running, 3 left"
        # c: before --resume it got to iteration 6; here it starts again and reports 2
        trials.append(trial("c", "RUNNING", iteration=6, success=0.0))
        display._last_refresh = 0.0  # on_step_end redraws at most once a second
        callback.on_step_end(3, trials)
        assert display.progress.tasks[-1].completed == 0
        callback.on_trial_result(
            4, trials, trials[-1], {"training_iteration": 2, "rollout/success": 0.5}
        )
        restored = pickle.loads(pickle.dumps(callback))  # what Tune saves for --resume
        rows = {t.description: t for t in display.progress.tasks}
    assert restored.__dict__ == {
        k: callback.__dict__[k]
        for k in ("tracking_uri", "experiment_id", "parent_run_id", "spec_json")
    }
    with pytest.raises(TypeError):
        pickle.dumps(display)
    overall = rows["trials 1/4 done, 1 running, 2 left"]
    assert (overall.completed, overall.total) == (24 + 2, 4 * 24)  # iterations, all trials
    assert (
        rows["  trial c"].completed == 2
        and rows["  trial c"].fields["info"] == "rollout/success 0.500"
    )
    assert "  trial a" not in rows  # finished: its bar is gone
    assert rows["warm start"].completed == 10
    text = out.getvalue()
    assert "trial a started" in text and "trial a iteration" not in text  # bars, not lines


def test_run_display_shows_every_event_the_run_emits():
    """`tether run`'s display has a line (or a bar) for every named event but the
    collection attempts; kinds arrive as the named events or as their plain strings."""
    from tether.platform.cli.progress import RunDisplay
    from tether.platform.run.events import Event

    samples = {
        Event.WARM_START: {"step": 10, "total": 10, "loss": 0.5},
        Event.STARTED: {"run_id": "abc", "model_path": "/m", "first_iteration": 3},
        Event.VALIDATION: {"iteration": 0, "val/success": 0.25},
        Event.COLLECTING: {"attempt": 1, "workers": [0], "episodes": 4},
        Event.WORKER_FAILED: {"worker": 1, "attempt": 1, "error": "boom"},
        Event.ITERATION: {
            "iteration": 1,
            "total": 2,
            "rollout/success": 0.5,
            "timing/iteration": 1,
        },
        Event.ALARM: {"name": "a", "iteration": 1, "mode": "stop", "message": "mi fell"},
        Event.ACTION: {"iteration": 1, "alarm": "a", "kind": "k", "message": "kl up"},
        Event.LEARNER_FAILED: {"error": "dead", "restart": 1, "checkpoint": "/c"},
        Event.CHECKPOINT_FAILED: {"message": "disk full"},
        Event.BATCH_REFUSED: {"message": "batch 3 versions old"},
        Event.TRACKING: {"message": "spooling"},
    }
    assert set(samples) == set(Event)
    out = io.StringIO()
    display = RunDisplay(Console(file=out, width=200))
    assert display.plain
    with display:
        for kind, data in samples.items():
            display(str(kind.value), data)
    lines = [line for line in out.getvalue().splitlines() if line]  # the bars end with one
    assert lines == [
        "warm start 10/10 loss 0.500",
        "MLflow run abc  model /m",
        "resuming at iteration 3",
        "validation before training: success 0.250",
        "rollout worker 1 failed (boom); re-collecting its share",
        "iteration 1/2  success 0.500  (1.0 s)",
        "ALARM mi fell",
        "ACTION iteration 1: kl up",
        "learner died (dead); restart 1: rebuilding from /c",
        "disk full",
        "batch 3 versions old",
        "spooling",
    ]
    bars = RunDisplay(Console(file=io.StringIO(), width=200), plain=False)
    with bars:
        bars(Event.WARM_START, samples[Event.WARM_START])
        bars(Event.ITERATION, samples[Event.ITERATION])
    assert set(bars.tasks) == {"warm", "train"}


def test_a_trial_ending_while_the_tracking_server_is_away_does_not_end_the_sweep(
    monkeypatch, capsys
):
    """Tune's trial-end callback closes a run Tune ended; with the server away it says so
    in one line and leaves the run to the sweep's end, where it used to raise out of the
    callback (which ends the whole sweep)."""
    import socket

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail fast, not in minutes
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = load_sweep_spec(ROOT / "experiments" / "filters_smoke.yaml")
    cb = sweep.SweepProgress(f"http://127.0.0.1:{port}", "0", "parent", spec.to_json())
    a = trial("a", "RUNNING")
    cb.on_trial_complete(2, [a], a)
    cb.on_trial_error(2, [a], a)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"trial a: tracking server http://127.0.0.1:{port} is away; its run is closed at "
        "the sweep's end, once the server answers"
    )
    assert lines[1] == "trial a finished" and lines[3].startswith("trial a FAILED")
