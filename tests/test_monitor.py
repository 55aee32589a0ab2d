"""The live collapse monitor: the Serve app against a real MLflow store with a real micro
training run in progress, loaded in headless Chromium (Debian's package, driven by
Playwright); its API (token, cookie, NaN) and the page's handling of hostile run data and
of intervals."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from typer.testing import CliRunner

from tests.mlflow_runs import write_run
from tether.dashboards.monitor import (
    COOKIE,
    Monitor,
    MonitorError,
    authorised,
    check_serve_address,
    cookie_value,
    is_loopback,
)
from tether.dashboards.monitor_data import evidence_lines
from tether.platform.cli.main import app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
H = "collapse/first_turn/conditional_entropy_est"
MI_EST = "collapse/first_turn/mi_estimate"


def test_token_and_host_rules():
    assert authorised(None, None, None)
    assert authorised("s3cret", "Bearer s3cret", None)
    assert authorised("s3cret", None, cookie_value("s3cret"))
    assert cookie_value("s3cret") != "s3cret" and len(cookie_value("s3cret")) == 64
    assert not authorised("s3cret", None, None) and not authorised("s3cret", "Bearer x", "s3cret")
    assert not authorised("s3cret", "s3cret", cookie_value("other"))
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    result = CliRunner().invoke(
        app, ["serve", "--host", "0.0.0.0", "--tracking-uri", "http://127.0.0.1:1"]
    )
    assert result.exit_code == 2 and "--token" in result.output
    # The address an already-running Serve keeps: same -> fine; loopback or a token ->
    # one warning line; beyond localhost without a token -> refused.
    assert check_serve_address(("127.0.0.1", 8600), ("127.0.0.1", 8600), None) is None
    warning = check_serve_address(("127.0.0.1", 8600), ("127.0.0.2", 8000), None)
    assert "127.0.0.2:8000" in warning and "\n" not in warning
    assert "0.0.0.0:8600" in check_serve_address(("127.0.0.1", 8600), ("0.0.0.0", 8600), "t")
    with pytest.raises(MonitorError, match=r"already running .* on 0\.0\.0\.0:8600 .*--token"):
        check_serve_address(("127.0.0.1", 8600), ("0.0.0.0", 8600), None)


def test_alarm_evidence_intervals_as_text():
    lines = evidence_lines(
        {
            "iteration": [3.0, 4.0],
            MI_EST: [0.3, 0.2],
            MI_EST + "_ci_low": [0.2, 0.11],
            MI_EST + "_ci_high": [0.4, 0.29],
            MI_EST + "_p_grounded": [0.01, 0.2],
            "x_ci_high": 1.5,
        }
    )
    assert lines == [
        f"{MI_EST} 95% CI [0.11, 0.29]",
        f"{MI_EST}_p_grounded = 0.2 (permutation test)",
        "x 95% CI [?, 1.5]",
    ]
    assert evidence_lines(None) == [] and evidence_lines({"a": 1}) == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs the chromium package (scripts/setup.sh installs it)"
)


def check_page(
    url: str,
    run_id: str,
    latest: int,
    alarm: str,
    alarm_iteration: int,
    resume,
    final: int,
    shot: str,
    kept_last: float | None = None,
    probe_at: int | None = None,
) -> None:
    """Load the page in headless Chromium: the run's row shows ``latest``, the alarm's
    banner is up, the plotly curves hold data up to ``latest``; after ``resume()`` the
    page refreshes to ``final`` and FINISHED. Saves a screenshot to ``shot``.
    ``probe_at``: the one iteration the run scored its probe set at, drawn beside the
    batch's I(X;Z) with its interval, and its reading accuracy in the table and a plot."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(url, timeout=60_000)
        row = f"#run-{run_id}"
        page.wait_for_selector(f"{row} .latest-iteration", timeout=60_000)
        assert page.inner_text(f"{row} .latest-iteration") == str(latest)
        page.wait_for_selector(".alarm-banner", timeout=30_000)
        banner = page.inner_text(".alarm-banner")
        assert alarm in banner and f"iteration {alarm_iteration}" in banner
        # The curves are drawn (plotly traces) up to the latest iteration.
        # (I(X;Z) and H(Z|X); their interval bands and I(X;Z)'s null level are traces of
        # their own)
        mi_x = page.evaluate(
            "document.getElementById('plot-mi').data"
            ".filter(t => !t.fill && !(t.meta && t.meta.null)).map(t => t.x)"
        )
        assert len(mi_x) == 2 and all(max(x) == latest for x in mi_x)
        null_x = page.evaluate(
            "document.getElementById('plot-mi').data"
            ".filter(t => t.meta && t.meta.null).map(t => t.x)"
        )
        assert len(null_x) == 1 and max(null_x[0]) == latest  # the run logged the null level
        bands = page.evaluate("document.getElementById('plot-mi').data.filter(t => t.fill).length")
        assert bands == 2  # the run logged both intervals
        kept_y = page.evaluate("document.getElementById('plot-kept').data[0].y")
        assert len(kept_y) == latest and (
            kept_last is None or kept_y[-1] == pytest.approx(kept_last)
        )
        assert page.evaluate("document.getElementById('plot-regime').data[0].x.length") == latest
        if probe_at is not None:
            probe = page.evaluate(
                "document.getElementById('plot-probe').data"
                ".filter(t => !t.fill && !(t.meta && t.meta.null)).map(t => [t.name, t.x])"
            )
            assert [x for name, x in probe if name.endswith(" probe_mi")] == [[probe_at]]
            assert [max(x) for name, x in probe if name.endswith(" mi")] == [latest]
            reading = page.evaluate(
                "document.getElementById('plot-reading').data.map(t => [Boolean(t.fill), t.x])"
            )
            # the band (a closed polygon: the steps there and back) and the curve
            assert reading == [[True, [probe_at, probe_at]], [False, [probe_at]]]
            cell = page.inner_text(f"{row} .reading")
            assert cell.count("[") == 1 and 0.0 <= float(cell.split()[0]) <= 1.0, cell
            assert page.inner_text(f"{row} .probe-mi").count("[") == 1
        assert page.locator("#plot-mi .main-svg").count() > 0
        # The page refreshes while the run trains: the next iterations appear.
        resume()
        # (predicates as functions: the page's CSP forbids evaluating strings)
        page.wait_for_function(
            f"() => document.querySelector('{row} .latest-iteration').textContent === '{final}'",
            timeout=120_000,
        )
        page.wait_for_function(
            f"() => document.querySelector('{row}').children[1].textContent === 'FINISHED'",
            timeout=120_000,
        )
        page.screenshot(path=shot, full_page=True)
        browser.close()
    assert os.path.getsize(shot) > 20_000


def screenshot_path(tmp_path, name: str) -> str:
    return os.path.join(os.environ.get("TETHER_SCREENSHOT_DIR", str(tmp_path)), name)


@needs_chromium
def test_monitor_page_follows_a_real_training_run(ray_local, micro_policy, tmp_path):
    """A real micro training run (Trainer, Ray actors, the collapse diagnostics on every
    iteration) in a thread, paused inside its 3rd iteration; a filter that keeps nothing
    makes the real alarm monitor's ``empty_after_filter`` fire at 2.  The page is behind
    a token: the API refuses a request without it, the page's link logs in."""
    from ray import serve

    from tests.conftest import micro_config_dict
    from tether.dashboards.monitor import start_monitor
    from tether.platform.config import build_config
    from tether.platform.run.trainer import Trainer

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = build_config(
        micro_config_dict(
            tmp_path,
            rollout={"num_workers": 1},
            algo={"kl_coef": 0.0},
            trainer={"iterations": 4, "val_every": 4, "checkpoint_every": 100},
            filter={"strategy": "top_p", "value": 0.0},
            diagnostics={"every": 1, "max_pairs": 8, "grad_snr_every": 0},
            alarms={"empty_after_filter": {"patience": 2}},
            tracking={"uri": uri, "log_model": False},
        )
    )
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
    port = free_port()
    url = start_monitor(uri, "127.0.0.1", port, token="t0k", refresh_s=1.0)
    try:
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=30)
        check_page(
            url,
            started["run_id"],
            3,
            "empty_after_filter",
            2,
            resume.set,
            4,
            screenshot_path(tmp_path, "monitor_real_run.png"),
            kept_last=0.0,
            probe_at=1,  # the probe set's default cadence: every 10 and at 1
        )
    finally:
        resume.set()
        thread.join(600)
        serve.shutdown()
    assert outcome["summary"].status == "FINISHED" and outcome["summary"].iterations == 4


# ---------------------------------------------------------------- hostile data, NaN, intervals

IT_XSS = '<img src=x onerror="window.__xss=1">'
NAME_XSS = '<script>window.__xss=2</script><img src=x onerror="window.__xss=3">run'
EVIDENCE_XSS = '<img src=x onerror="window.__xss=4">'
GROUNDED = "collapse/first_turn/grounded"
P_GROUNDED = "collapse/first_turn/p_grounded"  # the test shared by mi_estimate and the z-scores
LABEL = 32  # the page shortens run names in plot legends to this many characters


def write_monitor_runs(uri: str) -> dict[str, str]:
    """Four runs in a real SQLite store: one with intervals, null levels and a grounded
    verdict; one without (an older run); one whose MI is NaN at step 2 (logged through the
    MLflow client: Tracker drops non-finite values); one whose name and alarm are markup."""
    from mlflow.entities import Metric

    mi = {s: 0.6 - 0.1 * s for s in range(1, 5)}
    flat = {s: 1.0 for s in mi}
    success = {"rollout/success": {s: 0.2 * s for s in mi}}
    band = {
        MI_EST: mi,
        # step 2's interval reaches far below (a log_jackknife band at the ceiling can):
        # the plot keeps the curves' scale and lets that band run off it
        MI_EST + "_ci_low": {s: -40.0 if s == 2 else v - 0.05 for s, v in mi.items()},
        MI_EST + "_ci_high": {s: v + 0.05 for s, v in mi.items()},
        MI_EST + "_null_q95": {s: 0.15 for s in mi},
        P_GROUNDED: {s: 0.004 * s for s in mi},
        GROUNDED: flat,
        H: flat,
        H + "_ci_low": {s: 0.9 for s in mi},
        H + "_ci_high": {s: 1.1 for s in mi},
        **success,
    }
    ids = {
        "band": write_run(uri, "monitor-test", "grounded-run", band).run_id,
        "plain": write_run(
            uri, "monitor-test", "plain-run", {MI_EST: mi, H: flat, **success}
        ).run_id,
    }
    nan = write_run(uri, "monitor-test", "nan-run", {MI_EST: mi, H: flat, **success}, finish=False)
    later = int(time.time() * 1000) + 1000  # the later write of a step wins
    nan.client.log_batch(nan.run_id, metrics=[Metric(MI_EST, math.nan, later, 2)])
    nan.finish()
    ids["nan"] = nan.run_id
    alarm = {
        "name": "template_collapse",
        "iteration": IT_XSS,
        "time": 0.0,
        "mode": "warn",
        "message": "<b>not bold</b>",
        "evidence": {
            MI_EST + "_ci_low": [0.1, 0.12],
            MI_EST + "_ci_high": [0.3, 0.32],
            P_GROUNDED: [0.5],
            EVIDENCE_XSS + "_ci_low": [1.0],
        },
    }
    ids["hostile"] = write_run(
        uri, "monitor-test", NAME_XSS, {MI_EST: mi, **success}, alarms=[alarm]
    ).run_id
    return ids


def call(monitor: Monitor, path: str, query: str = "", headers: dict | None = None):
    """One GET through the monitor's Serve handler (a real starlette request)."""
    from starlette.requests import Request

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "root_path": "",
        "scheme": "http",
        "query_string": query.encode(),
        "server": ("127.0.0.1", 8600),
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    return asyncio.run(monitor(Request(scope)))


def strict_json(body: bytes) -> dict:
    return json.loads(body, parse_constant=lambda c: pytest.fail(f"{c} in an API answer"))


def test_monitor_api_token_cookie_nan_and_intervals(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = write_monitor_runs(uri)
    monitor = Monitor(uri, None, "t0k", 1.0, "first_turn")
    bearer = {"Authorization": "Bearer t0k"}
    assert call(monitor, "/api/runs").status_code == 401
    assert call(monitor, "/api/runs", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert call(monitor, "/monitor.js").status_code == 200  # code, no data: no token
    assert "location" not in monitor.scripts["/monitor.js"]  # the page never reads a token
    # The one-time link: a wrong token sets nothing; the right one becomes an HttpOnly,
    # SameSite=Strict cookie (a digest, not the token) and a redirect without it.
    wrong = call(monitor, "/", "token=nope")
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    login = call(monitor, "/", "token=t0k&sampling=x")
    assert login.status_code == 303 and login.headers["location"] == "/?sampling=x"
    cookie = login.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={cookie_value('t0k')};") and "t0k" not in cookie
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    page = call(monitor, "/", headers={"Cookie": f"{COOKIE}={cookie_value('t0k')}"})
    assert page.status_code == 200 and b'src="monitor.js"' in page.body
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert call(monitor, "/", headers={"Cookie": f"{COOKIE}=t0k"}).status_code == 401
    # One run's NaN is null in the answer (strict JSON), the other runs are whole.
    answer = call(monitor, "/api/runs", headers=bearer)
    assert answer.status_code == 200
    runs = {r["run_id"]: r for r in strict_json(answer.body)["runs"]}
    assert set(runs) == set(ids.values())
    assert runs[ids["nan"]]["curves"]["mi"]["y"] == [
        0.5,
        None,
        pytest.approx(0.3),
        pytest.approx(0.2),
    ]
    # The band series: the interval and null level aligned to the curve's steps.
    mi = runs[ids["band"]]["curves"]["mi"]
    assert mi["x"] == [1, 2, 3, 4]
    assert mi["ci_low"] == pytest.approx([0.45, -40.0, 0.25, 0.15])
    assert mi["ci_high"] == pytest.approx([0.55, 0.45, 0.35, 0.25])
    assert mi["null_q95"] == [0.15] * 4
    assert mi["p_grounded"] == pytest.approx([0.004, 0.008, 0.012, 0.016])
    assert runs[ids["band"]]["curves"]["entropy"]["ci_high"] == [1.1] * 4
    assert runs[ids["band"]]["curves"]["grounded"]["y"] == [1.0] * 4
    assert not {"ci_low", "ci_high", "null_q95"} & set(runs[ids["plain"]]["curves"]["mi"])
    # A run whose alarms.json cannot be read is listed with the reason, the others whole.
    broken = write_run(
        uri,
        "monitor-test",
        "broken-run",
        {MI_EST: {1: 0.5}},
        alarms=[{"name": "template_collapse", "iteration": 1}],
    )
    broken.log_text("{not json", "alarms.json")
    answer = call(monitor, "/api/runs", headers=bearer)
    runs = {r["run_id"]: r for r in strict_json(answer.body)["runs"]}
    assert runs[broken.run_id]["error"].startswith("cannot read this run: JSONDecodeError")
    assert runs[ids["band"]]["curves"]["mi"]["ci_low"] == pytest.approx([0.45, -40.0, 0.25, 0.15])
    (alarm,) = runs[ids["hostile"]]["alarms"]
    assert runs[ids["hostile"]]["name"] == NAME_XSS and alarm["iteration"] == IT_XSS
    assert alarm["evidence"] == [
        f"{MI_EST} 95% CI [0.12, 0.32]",
        f"{P_GROUNDED} = 0.5 (permutation test)",
        f"{EVIDENCE_XSS} 95% CI [1, ?]",
    ]


@needs_chromium
@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_monitor_page_escapes_run_data_and_draws_intervals(ray_local, tmp_path):
    from playwright.sync_api import sync_playwright
    from ray import serve

    from tether.dashboards.monitor import start_monitor

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = write_monitor_runs(uri)
    port = free_port()
    url = start_monitor(uri, "127.0.0.1", port, token="t0k", refresh_s=1.0)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/runs", headers={"Authorization": "Bearer t0k"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            runs = {r["run_id"]: r for r in strict_json(answer.read())["runs"]}
        assert runs[ids["nan"]]["curves"]["mi"]["y"][1] is None
        # Serve keeps its first address: asking for another gives one warning line and
        # the URL where the monitor really is.
        warnings = []
        again = start_monitor(
            uri, "127.0.0.2", free_port(), token="t0k", refresh_s=1.0, warn=warnings.append
        )
        assert again == url and len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0]
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
            )
            page = browser.new_page(viewport={"width": 1300, "height": 1100})
            page.goto(url, timeout=60_000)
            assert page.url == f"http://127.0.0.1:{port}/"  # the token left the address
            assert page.evaluate("document.cookie") == ""  # HttpOnly
            for run_id in ids.values():
                page.wait_for_selector(f"#run-{run_id} .latest-iteration", timeout=60_000)
            # Markup in the run name, the alarm's iteration, message and evidence is text.
            assert page.evaluate("window.__xss === undefined")
            assert page.locator("img, b, script:not([src])").count() == 0
            banner = page.inner_text(".alarm-banner")
            assert f"in run {NAME_XSS} at iteration {IT_XSS}: <b>not bold</b>" in banner
            assert f"{EVIDENCE_XSS} 95% CI [1, ?]" in banner and "[0.12, 0.32]" in banner
            assert page.inner_text(f"#run-{ids['hostile']} td") == NAME_XSS
            alarms_cell = page.inner_text(f"#run-{ids['hostile']} .alarms")
            assert alarms_cell == f"template_collapse@{IT_XSS}"
            legend = page.evaluate(
                "Array.from(document.querySelectorAll('#plot-mi .legendtext'))"
                ".map(e => e.textContent)"
            )
            assert f"{NAME_XSS[:LABEL]}… mi" in legend
            page.wait_for_selector(f"path.ci-band[data-run='{ids['band']}']", timeout=30_000)
            # Intervals: a band for each curve of the run that logged them, none for the others.
            for run_id, bands in ((ids["band"], 2), (ids["plain"], 0), (ids["nan"], 0)):
                assert page.locator(f"#plot-mi path.ci-band[data-run='{run_id}']").count() == bands
            # the band spans the curve's steps: 4 corners (plotly drops collinear points)
            band = page.get_attribute(f"path.ci-band[data-run='{ids['band']}']", "d")
            assert band.startswith("M") and band.count("L") >= 3
            null = page.evaluate(
                f"document.getElementById('plot-mi').data.filter(t => t.meta && "
                f"t.meta.null === '{ids['band']}').map(t => t.y)"
            )
            assert null == [[0.15] * 4]
            # values 0.15 (null) to 1.0 (H): the band is cut at their span again below
            y_range = page.evaluate("document.getElementById('plot-mi').layout.yaxis.range")
            assert y_range == [pytest.approx(-0.7 - 0.09), pytest.approx(1.1 + 0.09)]
            # bands all wider than the curve's movement (a Wilson interval around a flat
            # rate) are the noise to see: autoscale, as the report's band_limits does
            flat = page.evaluate(
                "bandRange([{y: [0.84, 0.83, 0.86]}, {meta: {band: 'r'}, "
                "y: [0.92, 0.91, 0.94, 0.78, 0.75, 0.76]}])"
            )
            assert flat is None
            assert page.inner_text(f"#run-{ids['band']} .mi") == "0.200 [0.150, 0.250]"
            assert (
                page.inner_text(f"#run-{ids['band']} .grounded")
                == "yes (permutation test, p = 0.016 for I(X;Z))"
            )
            assert page.inner_text(f"#run-{ids['plain']} .mi") == "0.200"
            assert page.inner_text(f"#run-{ids['plain']} .grounded") == "–"
            # The NaN run is drawn with a gap; the others are drawn whole.
            nan_y = page.evaluate(
                "document.getElementById('plot-mi').data.filter(t => t.name "
                "=== 'nan-run mi').map(t => t.y)"
            )
            assert nan_y == [[0.5, None, pytest.approx(0.3), pytest.approx(0.2)]]
            assert page.locator("#plot-mi .main-svg").count() > 0
            page.screenshot(path=screenshot_path(tmp_path, "monitor_intervals.png"), full_page=True)
            browser.close()
    finally:
        serve.shutdown()
