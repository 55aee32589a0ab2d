"""The MLflow UI on a Tether sweep, in a real browser: the link Tether prints opens the
experiment on its runs (not MLflow 3's GenAI overview), the trials are listed under the
sweep, and the compare view offers the swept param and the metric, not the run name."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.test_monitor import CHROMIUM, needs_chromium, screenshot_path
from tests.test_sweep import micro_sweep_sections, write_spec
from tether.platform.sweep.runner import run_sweep
from tether.platform.sweep.spec import load_sweep_spec

#: How long a check waits for the page to show what it looks for (the UI renders after its
#: API calls answer, slower on a loaded machine); a check passes as soon as it holds.
UI_TIMEOUT_MS = 60_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_ui(uri: str, port: int, log: Path) -> subprocess.Popen:
    ui = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
            "ui",
            "--backend-store-uri",
            uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 240
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            return ui
        except OSError:
            if ui.poll() is not None:
                raise AssertionError(log.read_text()[-2000:]) from None
            time.sleep(1)
    ui.kill()
    raise AssertionError("mlflow ui did not answer: " + log.read_text()[-2000:])


@contextlib.contextmanager
def _ui_serving(uri: str, log: Path):
    """``mlflow ui`` on the store at a free port (yielded) for the block's duration."""
    port = _free_port()
    ui = _serve_ui(uri, port, log)
    try:
        yield port
    finally:
        ui.terminate()
        try:
            ui.wait(30)
        except subprocess.TimeoutExpired:
            ui.kill()


@needs_chromium
def test_mlflow_ui_opens_a_sweep_on_its_runs_and_compares_the_swept_params(
    micro_policy, models_dir, ray_local, tmp_path
):
    from playwright.sync_api import expect, sync_playwright

    path = write_spec(
        tmp_path,
        {
            "name": "ui-sweep",
            "search": "grid",
            "max_concurrent": 1,
            "space": {"algo.entropy_coef": {"grid": [0.001, 0.01]}},
            "resources": {"cpu": 0.2},
        },
        **micro_sweep_sections(
            tmp_path, models_dir, "ui-test", iterations=2, diagnostics={"enabled": False}
        ),
    )
    outcome = run_sweep(load_sweep_spec(path), echo=lambda line: None)
    assert outcome.status == "FINISHED" and outcome.trials == 2
    link = re.search(r"http://127\.0\.0\.1:5000/(\S+)", outcome.ui_command).group(1)
    assert "workflowType=machine_learning" in link
    runs = [r["run_id"] for r in outcome.rows]
    names = {f"ui-sweep-{r['trial']}" for r in outcome.rows}
    with _ui_serving(outcome.tracking_uri, tmp_path / "ui.log") as port:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/{link}", timeout=120_000)
            page.wait_for_selector("text=ui-sweep", timeout=120_000)  # the runs table
            page.click(".ag-row button")  # expand the sweep
            for name in sorted(names):  # wait for the trials' rows (or fail at the timeout)
                expect(page.locator(".ag-root")).to_contain_text(name, timeout=UI_TIMEOUT_MS)
            table = page.inner_text(".ag-root")
            assert all(name in table for name in names), table[:2000]
            assert "Token Usage" not in page.inner_text("body")  # not the GenAI overview
            page.screenshot(path=screenshot_path(tmp_path, "mlflow_ui_runs.png"), full_page=True)
            compare = (
                "#/compare-runs?runs="
                + urllib.parse.quote(json.dumps(runs))
                + "&experiments="
                + urllib.parse.quote(json.dumps([outcome.experiment_id]))
                + "&workflowType=machine_learning"
            )
            page.goto(f"http://127.0.0.1:{port}/{compare}", timeout=120_000)
            page.wait_for_selector("text=Parallel Coordinates Plot", timeout=120_000)
            # The plot's axes: the one param the trials varied (the run name is no param).
            expect(page.locator("body")).to_contain_text("algo.entropy_coef", timeout=UI_TIMEOUT_MS)
            plot = page.inner_text("body")
            assert "algo.entropy_coef" in plot and "experiment.run_name" not in plot
            # The metric is offered: type it into the plot's metric picker.
            page.click("text=val/success >> nth=0")
            page.keyboard.type("rollout/succ")
            option = page.get_by_role("option", name="rollout/success", exact=True)
            option.first.wait_for(state="attached", timeout=UI_TIMEOUT_MS)  # in the list
            assert option.count() >= 1
            page.screenshot(path=screenshot_path(tmp_path, "mlflow_ui_compare.png"), full_page=True)
            browser.close()
    assert os.path.getsize(screenshot_path(tmp_path, "mlflow_ui_compare.png")) > 10_000


@pytest.mark.slow  # nightly: the restore itself is checked in tests/test_verdicts.py
@needs_chromium
def test_mlflow_ui_compares_the_sensitivity_grid_restored_from_records(tmp_path):
    """The sensitivity sweep's view: its trials, pooled from the record files of its parts
    and restored to a store (``paper --restore``), in MLflow's compare view as parallel
    coordinates over the three swept parameters, coloured by the final probe I(X;Z).
    TETHER_UI_RECORDS (a glob of record files, e.g. the committed sensitivity parts) draws
    those runs instead of a built-in grid; TETHER_SCREENSHOT_DIR keeps the picture."""
    import glob

    from playwright.sync_api import expect, sync_playwright

    from tests.test_verdicts import sensitivity_grid
    from tether.analysis import records
    from tether.analysis.source import load_target
    from tether.analysis.verdicts import FACTORS, PROBE_MI

    named = sorted(glob.glob(os.environ.get("TETHER_UI_RECORDS", "")))
    runs = [r for path in named for r in records.load(path)] or sensitivity_grid(
        {"algo.entropy_coef": 0.15, "algo.kl_coef": -0.15, "filter.value": 0.005}
    )
    uri = f"sqlite:///{tmp_path}/ui.db"
    parent = records.restore(runs, uri, "tether-restored", "sensitivity")
    target, restored = load_target(uri, parent)
    assert len(restored) == len(runs)
    picture = screenshot_path(tmp_path, "mlflow_ui_sensitivity.png")
    with _ui_serving(uri, tmp_path / "ui.log") as port:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
            )
            page = browser.new_page(viewport={"width": 1600, "height": 1100})
            compare = (
                "#/compare-runs?runs="
                + urllib.parse.quote(json.dumps([r.run_id for r in restored]))
                + "&experiments="
                + urllib.parse.quote(json.dumps([target.experiment_id]))
                + "&workflowType=machine_learning"
            )
            page.goto(f"http://127.0.0.1:{port}/{compare}", timeout=120_000)
            page.wait_for_selector("text=Parallel Coordinates Plot", timeout=120_000)
            # MLflow 3.17 opens its assistant beside the view; closed, the plot has the width.
            assistant = page.get_by_role("button", name="Close", exact=True)
            if assistant.count() == 1:
                assistant.click()
            body = page.locator("body")
            for key in FACTORS:  # the swept parameters are the plot's axes
                expect(body).to_contain_text(key, timeout=UI_TIMEOUT_MS)
            plot = page.locator(".js-plotly-plot")
            assert "experiment.seed" not in plot.inner_text()
            # The colour is the metric axis's: make the final probe I(X;Z) the only metric,
            # in place of MLflow's default (the first metric the runs share).
            logged = {k for r in restored for k in r.metrics}
            default = next(w for w in plot.inner_text().split() if w in logged)
            page.click(f"text={default} >> nth=0")  # the metric picker's chip
            page.keyboard.press("Backspace")  # unselects the last (only) metric
            page.keyboard.type(PROBE_MI)
            option = page.get_by_role("option", name=PROBE_MI, exact=True)
            option.first.wait_for(state="attached", timeout=UI_TIMEOUT_MS)  # filtered to it
            page.keyboard.press("Enter")  # selects the active (first) option
            page.keyboard.press("Escape")
            expect(plot).to_contain_text(PROBE_MI, timeout=UI_TIMEOUT_MS)
            if default != PROBE_MI:
                expect(plot).not_to_contain_text(default, timeout=UI_TIMEOUT_MS)
            page.screenshot(path=picture, full_page=True)
            browser.close()
    assert os.path.getsize(picture) > 10_000
