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

from tether.platform import sweep, sweep_progress
from tether.platform.progress import SweepDisplay
from tether.platform.sweep_spec import load_sweep_spec

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
    monkeypatch.setattr(sweep_progress, "finalize_child", lambda *a: None)  # no MLflow here
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
