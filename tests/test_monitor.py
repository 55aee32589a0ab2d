"""The live collapse monitor: the Serve app against a real MLflow store with a run in
progress, loaded in headless Chromium (Debian's package, driven by Playwright)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import urllib.error
import urllib.request

import pytest
from typer.testing import CliRunner

from tether.dashboards.monitor import authorised, is_loopback
from tether.diagnostics.alarms import AlarmMonitor, AlarmsConfig
from tether.platform.cli import app
from tether.platform.tracking import Tracker

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MI, H = "collapse/first_turn/mi_zscore_ema", "collapse/first_turn/conditional_entropy_est"


def test_token_and_host_rules():
    assert authorised(None, None, None)
    assert authorised("s3cret", "s3cret", None) and authorised("s3cret", None, "Bearer s3cret")
    assert not authorised("s3cret", None, None) and not authorised("s3cret", "guess", "Bearer x")
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--tracking-uri",
                                      "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "--token" in result.output


class TrainingRun(threading.Thread):
    """A Tether-shaped run written step by step as the driver does: the iteration's
    metrics, then the real alarm monitor, whose events become ``alarm.<name>`` tags and
    the ``alarms.json`` artifact. The MI proxy falls while entropy stays flat, so
    ``template_collapse`` fires. Iterations past ``pause_after`` wait for ``resume``."""

    def __init__(self, uri: str, iterations: int, pause_after: int):
        super().__init__(daemon=True)
        self.tracker = Tracker(uri, "monitor-test", run_name="live-frozenlake")
        self.tracker.log_params({"env.id": "tether/FrozenLake-v0", "filter.strategy": "top_p"})
        self.tracker.set_tags({"tether.env": "tether/FrozenLake-v0"})
        self.alarms = AlarmMonitor(AlarmsConfig.model_validate({"template_collapse": {"window": 3}}))
        self.iterations, self.pause_after = iterations, pause_after
        self.logged, self.resume, self.paused = 0, threading.Event(), threading.Event()

    def run(self):
        for it in range(1, self.iterations + 1):
            if it == self.pause_after + 1:
                self.paused.set()
                self.resume.wait(120)
            mi = 0.5 * 0.7 ** it
            metrics = {"rollout/success": 0.1 * it, "filter/kept_ratio": 1.0 - 0.05 * it,
                       "rollout/in_group_reward_std": 0.3, MI: 2.0 * 0.7 ** it, H: 1.0,
                       f"{H}_ci_low": 0.95, f"{H}_ci_high": 1.05,
                       "collapse/first_turn/mi_estimate": mi,
                       "collapse/first_turn/mi_estimate_ci_low": mi - 0.01,
                       "collapse/first_turn/mi_estimate_ci_high": mi + 0.01,
                       "collapse/first_turn/p_grounded": 0.001}
            self.tracker.log_metrics(metrics, step=it)
            for event in self.alarms.update(it, metrics):
                self.tracker.set_tags({f"alarm.{event.name}": event.iteration})
                self.tracker.log_json([e.to_dict() for e in self.alarms.events], "alarms.json")
            self.logged = it
        self.tracker.finish()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs the chromium package "
                                    "(scripts/setup.sh installs it)")


def check_page(url: str, run_id: str, latest: int, alarm: str, alarm_iteration: int,
               resume, final: int, shot: str, kept_last: float | None = None) -> None:
    """Load the page in headless Chromium: the run's row shows ``latest``, the alarm's
    banner is up, the plotly curves hold data up to ``latest``; after ``resume()`` the
    page refreshes to ``final`` and FINISHED. Saves a screenshot to ``shot``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(url, timeout=60_000)
        row = f"#run-{run_id}"
        page.wait_for_selector(f"{row} .latest-iteration", timeout=60_000)
        assert page.inner_text(f"{row} .latest-iteration") == str(latest)
        page.wait_for_selector(".alarm-banner", timeout=30_000)
        banner = page.inner_text(".alarm-banner")
        assert alarm in banner and f"iteration {alarm_iteration}" in banner
        # The curves are drawn (plotly traces) up to the latest iteration.
        mi_x = page.evaluate("document.getElementById('plot-mi').data.map(t => t.x)")
        assert len(mi_x) == 2 and max(max(x) for x in mi_x) == latest
        kept_y = page.evaluate("document.getElementById('plot-kept').data[0].y")
        assert len(kept_y) == latest and (kept_last is None or kept_y[-1] == pytest.approx(kept_last))
        assert page.evaluate("document.getElementById('plot-regime').data[0].x.length") == latest
        assert page.locator("#plot-mi .main-svg").count() > 0
        # The page refreshes while the run trains: the next iterations appear.
        resume()
        page.wait_for_function(f"document.querySelector('{row} .latest-iteration')"
                               f".textContent === '{final}'", timeout=120_000)
        page.wait_for_function(f"document.querySelector('{row}').children[1].textContent"
                               f" === 'FINISHED'", timeout=120_000)
        page.screenshot(path=shot, full_page=True)
        browser.close()
    assert os.path.getsize(shot) > 20_000


def screenshot_path(tmp_path, name: str) -> str:
    return os.path.join(os.environ.get("TETHER_SCREENSHOT_DIR", str(tmp_path)), name)


@needs_chromium
def test_monitor_page_shows_live_run_and_alarm(ray_local, tmp_path):
    from ray import serve

    from tether.dashboards.monitor import start_monitor

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = TrainingRun(uri, iterations=8, pause_after=6)
    run.start()
    assert run.paused.wait(120) and run.logged == 6
    fired = [e.iteration for e in run.alarms.events if e.name == "template_collapse"]
    assert fired and fired[0] <= 6
    port = free_port()
    url = start_monitor(uri, "127.0.0.1", port, token="t0k", refresh_s=1.0)
    try:
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=30)
        check_page(url, run.tracker.run_id, 6, "template_collapse", fired[0], run.resume.set,
                   8, screenshot_path(tmp_path, "monitor.png"), kept_last=0.7)
    finally:
        run.resume.set()
        serve.shutdown()


@pytest.mark.slow
@needs_chromium
def test_monitor_page_follows_a_real_training_run(ray_local, micro_policy, tmp_path):
    """A real micro training run (Trainer, Ray actors) in a thread, paused inside its 3rd
    iteration; a filter that keeps nothing makes ``empty_after_filter`` fire at 2."""
    from ray import serve

    from tests.conftest import micro_config_dict
    from tether.dashboards.monitor import start_monitor
    from tether.platform.config import build_config
    from tether.platform.driver import Trainer

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = build_config(micro_config_dict(
        tmp_path, rollout={"num_workers": 1}, algo={"kl_coef": 0.0},
        trainer={"iterations": 4, "val_every": 4, "checkpoint_every": 100},
        filter={"strategy": "top_p", "value": 0.0},
        diagnostics={"every": 1, "max_pairs": 8, "grad_snr_every": 0},
        alarms={"empty_after_filter": {"patience": 2}}, tracking={"uri": uri, "log_model": False}))
    cfg.model.path = str(micro_policy)
    paused, resume, started, outcome = (threading.Event(), threading.Event(), {}, {})

    def on_event(kind, data):
        if kind == "started":
            started["run_id"] = data["run_id"]
        if kind == "iteration" and data["iteration"] == 3:
            paused.set()
            resume.wait(600)

    def train():
        outcome["summary"] = Trainer(cfg, on_event).run()

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    assert paused.wait(900), "the training run did not reach iteration 3"
    url = start_monitor(uri, "127.0.0.1", free_port(), refresh_s=1.0)
    try:
        check_page(url, started["run_id"], 3, "empty_after_filter", 2, resume.set, 4,
                   screenshot_path(tmp_path, "monitor_real_run.png"), kept_last=0.0)
    finally:
        resume.set()
        thread.join(600)
        serve.shutdown()
    assert outcome["summary"].status == "FINISHED" and outcome["summary"].iterations == 4
