"""The live collapse monitor (`tether serve`): a Ray Serve application over MLflow.

One page (plain HTML + plotly, no login by default) shows every Tether run of the
store, running and finished: I(X;Z) and H(Z|X) over training, the regime plot, success
and kept ratio, the latest iteration of each run, and a banner for every alarm; it
re-reads ``api/runs`` every few seconds while runs train. Bound to 127.0.0.1 unless
told otherwise; beyond localhost a token is required (``?token=`` on the page URL, or
``Authorization: Bearer <token>`` on the API).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import time

from ..analysis.runs import KEPT_RATIO, SUCCESS, VAL_SUCCESS, RunData, collapse_key

MONITOR_METRICS = ("mi_estimate", "mi_zscore_ema", "conditional_entropy_est")
WANTED = re.compile(r"^(rollout/success|filter/kept_ratio|val/success|collapse/[^/]+/("
                    + "|".join(MONITOR_METRICS) + r"))$")


def monitor_payload(runs: list[RunData], sampling: str = "first_turn") -> dict:
    """What the page draws, per run: status, latest iteration, curves and alarms."""
    keys = {"mi": collapse_key(sampling, "mi_estimate"),
            "mi_zscore_ema": collapse_key(sampling, "mi_zscore_ema"),
            "entropy": collapse_key(sampling, "conditional_entropy_est"),
            "success": SUCCESS, "val_success": VAL_SUCCESS, "kept_ratio": KEPT_RATIO}
    out = []
    for run in runs:
        curves = {}
        for name, key in keys.items():
            steps, values = run.series(key)
            curves[name] = {"x": steps.tolist(), "y": values.tolist()}
        alarms = [{"name": a.get("name"), "iteration": a.get("iteration"), "mode": a.get("mode"),
                   "message": a.get("message", "")} for a in run.alarms] or [
            {"name": name, "iteration": step, "mode": "", "message": ""}
            for step, name in run.alarm_steps()]
        out.append({"run_id": run.run_id, "name": run.name, "status": run.status,
                    "latest_iteration": run.latest_iteration, "curves": curves,
                    "alarms": alarms})
    return {"sampling": sampling, "time": time.time(), "runs": out}


class MonitorSource:
    """Tether runs of an MLflow store (optionally some experiments), re-read on demand;
    finished runs are read once and cached."""

    def __init__(self, tracking_uri: str, experiments: list[str] | None = None,
                 max_runs: int = 50) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiments, self.max_runs = experiments, max_runs
        self.cache: dict[str, RunData] = {}

    def runs(self) -> list[RunData]:
        from ..analysis.source import is_tether_run, load_run

        if self.experiments:
            found = [self.client.get_experiment_by_name(n) for n in self.experiments]
            ids = [e.experiment_id for e in found if e is not None]
        else:
            ids = [e.experiment_id for e in self.client.search_experiments()]
        if not ids:
            return []
        listed = [r for r in self.client.search_runs(ids, max_results=self.max_runs,
                                                     order_by=["attributes.start_time DESC"])
                  if is_tether_run(r)]
        runs = []
        for r in listed:
            cached = self.cache.get(r.info.run_id)
            if cached is None or cached.status == "RUNNING" or r.info.status == "RUNNING":
                cached = load_run(self.client, r, with_prompts=False, wanted=WANTED)
                if r.info.status != "RUNNING":
                    self.cache[r.info.run_id] = cached
            runs.append(cached)
        return runs


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def authorised(token: str | None, query_token: str | None, header: str | None) -> bool:
    if not token:
        return True
    given = query_token or (header[7:] if header and header.startswith("Bearer ") else "")
    return hmac.compare_digest(given.encode(), token.encode())


class Monitor:
    """The Serve deployment's body (wrapped by ``serve.deployment`` in ``build_app``)."""

    def __init__(self, tracking_uri: str, experiments: list[str] | None, token: str | None,
                 refresh_s: float, sampling: str) -> None:
        from pathlib import Path

        self.source = MonitorSource(tracking_uri, experiments)
        self.token, self.refresh_s, self.sampling = token, refresh_s, sampling
        self.page = (Path(__file__).with_name("monitor.html").read_text()
                     .replace("__REFRESH_MS__", str(int(refresh_s * 1000))))
        self.plotly_js = None

    async def __call__(self, request):
        from starlette.responses import HTMLResponse, JSONResponse, Response

        path = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        if path != "plotly.js" and not authorised(  # the library holds no data: no token
                self.token, request.query_params.get("token"), request.headers.get("authorization")):
            return JSONResponse({"error": "a valid token is required (?token=...)"},
                                status_code=401)
        if path == "runs":
            payload = monitor_payload(self.source.runs(), self.sampling)
            return Response(json.dumps(payload, allow_nan=False, default=str),
                            media_type="application/json")
        if path == "plotly.js":
            if self.plotly_js is None:
                from plotly.offline import get_plotlyjs

                self.plotly_js = get_plotlyjs()
            return Response(self.plotly_js, media_type="application/javascript",
                            headers={"Cache-Control": "max-age=86400"})
        if path in ("", "index.html"):
            return HTMLResponse(self.page)
        return JSONResponse({"error": f"no page {request.url.path}"}, status_code=404)


def build_app(tracking_uri: str, experiments: list[str] | None = None, token: str | None = None,
              refresh_s: float = 5.0, sampling: str = "first_turn"):
    from ray import serve

    deployment = serve.deployment(Monitor, name="tether-monitor",
                                  ray_actor_options={"num_cpus": 0})
    return deployment.bind(tracking_uri, experiments, token, refresh_s, sampling)


def start_monitor(tracking_uri: str, host: str = "127.0.0.1", port: int = 8600,
                  token: str | None = None, experiments: list[str] | None = None,
                  refresh_s: float = 5.0, sampling: str = "first_turn") -> str:
    """Start Serve on (host, port) in the connected Ray cluster and deploy the monitor;
    returns the page URL. Refuses a non-loopback host without a token."""
    from ray import serve

    if not is_loopback(host) and not token:
        raise ValueError(f"serve.host={host} is beyond localhost: pass a token (--token or "
                         f"TETHER_SERVE_TOKEN) so the page is not open to the network")
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(tracking_uri, experiments, token, refresh_s, sampling),
              name="tether-monitor", route_prefix="/")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
