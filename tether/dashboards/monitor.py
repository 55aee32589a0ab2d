"""The live collapse monitor (`tether serve`): a Ray Serve application over MLflow.

One page (plain HTML + plotly, no login by default) shows every Tether run of the
store, running and finished: I(X;Z) and H(Z|X) over training with their 95 % intervals
and the permutation-null level I(X;Z) must clear, the regime plot, success and kept
ratio, the latest iteration of each run, and a banner for every alarm; it re-reads
``api/runs`` every few seconds while runs train.

Bound to 127.0.0.1 unless told otherwise; beyond localhost a token is required. API
clients send ``Authorization: Bearer <token>``; a browser opens ``/?token=<token>``
once, which sets an HttpOnly, SameSite=Strict cookie and redirects to the token-free
URL, so the token never stays in the address bar, the history or the page's script.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Callable
from pathlib import Path

from .monitor_data import MonitorSource, json_safe, monitor_payload

HERE = Path(__file__).parent
COOKIE = "tether_monitor"
#: The page's own headers: scripts only from this server (no inline script, no
#: injected handler runs even if markup slipped through), no referrer, no framing.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' "
    "'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class MonitorError(RuntimeError):
    """The monitor cannot start safely (one line: what, where, what to do)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cookie_value(token: str) -> str:
    """The session cookie holds a digest of the token, not the token itself (cookies
    are shared by every port of a host)."""
    return hmac.new(token.encode(), b"tether-monitor-session", hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def authorised(token: str | None, header: str | None, cookie: str | None) -> bool:
    """No token configured, or ``Authorization: Bearer <token>``, or the session cookie."""
    if not token:
        return True
    if header and header.startswith("Bearer ") and _same(header[7:], token):
        return True
    return bool(cookie) and _same(cookie, cookie_value(token))


def json_response(data, status_code: int = 200):
    from starlette.responses import Response

    return Response(
        json.dumps(json_safe(data), allow_nan=False, default=str),
        status_code=status_code,
        media_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


class Monitor:
    """The Serve deployment's body (wrapped by ``serve.deployment`` in ``build_app``)."""

    def __init__(
        self,
        tracking_uri: str,
        experiments: list[str] | None,
        token: str | None,
        refresh_s: float,
        sampling: str,
    ) -> None:
        self.source = MonitorSource(tracking_uri, experiments)
        self.token, self.refresh_s, self.sampling = token, refresh_s, sampling
        self.page = (
            (HERE / "monitor.html")
            .read_text()
            .replace("__REFRESH_MS__", str(int(refresh_s * 1000)))
        )
        self.scripts = {"/monitor.js": (HERE / "monitor.js").read_text()}

    def script(self, path: str) -> str:
        if path not in self.scripts:  # plotly's bundle (~4 MB) is read on first use
            from plotly.offline import get_plotlyjs

            self.scripts[path] = get_plotlyjs()
        return self.scripts[path]

    async def __call__(self, request):
        from starlette.responses import HTMLResponse, RedirectResponse, Response

        path = "/" + request.url.path.strip("/")
        if path in ("/plotly.js", "/monitor.js"):  # code, no data: no token needed
            return Response(
                self.script(path),
                media_type="application/javascript",
                headers={"Cache-Control": "max-age=3600"},
            )
        given = request.query_params.get("token")
        if given is not None:  # the one-time link: trade the token for a cookie
            if self.token and not _same(given, self.token):
                return json_response({"error": "wrong token"}, 401)
            rest = request.url.remove_query_params("token").query
            response = RedirectResponse(path + (f"?{rest}" if rest else ""), status_code=303)
            if self.token:
                response.set_cookie(
                    COOKIE, cookie_value(self.token), httponly=True, samesite="strict", path="/"
                )
            return response
        if not authorised(
            self.token, request.headers.get("authorization"), request.cookies.get(COOKIE)
        ):
            return json_response(
                {
                    "error": "a token is required: open the page once as "
                    "/?token=TOKEN, or send 'Authorization: Bearer TOKEN'"
                },
                401,
            )
        if path == "/api/runs":
            return json_response(
                monitor_payload(self.source.runs(), self.sampling, self.source.errors)
            )
        if path in ("/", "/index.html"):
            return HTMLResponse(self.page, headers=PAGE_HEADERS)
        return json_response({"error": f"no page {request.url.path}"}, 404)


def build_app(
    tracking_uri: str,
    experiments: list[str] | None = None,
    token: str | None = None,
    refresh_s: float = 5.0,
    sampling: str = "first_turn",
):
    from ray import serve

    deployment = serve.deployment(Monitor, name="tether-monitor", ray_actor_options={"num_cpus": 0})
    return deployment.bind(tracking_uri, experiments, token, refresh_s, sampling)


def serve_address() -> tuple[str, int]:
    """The HTTP host and port Serve's proxies actually use in the connected cluster."""
    from ray.serve.context import _get_global_client

    options = _get_global_client().http_config
    return options.host, options.port


def check_serve_address(
    asked: tuple[str, int], actual: tuple[str, int], token: str | None
) -> str | None:
    """None when Serve listens where asked. A Serve already running in the cluster keeps
    its first HTTP options: beyond localhost without a token that is refused
    (``MonitorError``), otherwise it is one line of warning."""
    if tuple(actual) == tuple(asked):
        return None
    where = (
        f"Ray Serve was already running in this Ray cluster on {actual[0]}:{actual[1]} "
        f"and keeps that address (asked for {asked[0]}:{asked[1]})"
    )
    if not is_loopback(actual[0]) and not token:
        raise MonitorError(
            f"{where}, which is beyond localhost, and no token was given: "
            f"stop it (`serve shutdown -y`) and start the monitor again, or "
            f"pass --token"
        )
    return f"{where}; the monitor is served there"


def start_monitor(
    tracking_uri: str,
    host: str = "127.0.0.1",
    port: int = 8600,
    token: str | None = None,
    experiments: list[str] | None = None,
    refresh_s: float = 5.0,
    sampling: str = "first_turn",
    warn: Callable[[str], None] = print,
) -> str:
    """Start Serve on (host, port) in the connected Ray cluster and deploy the monitor;
    returns the page URL (with the one-time ``?token=`` when a token is set). Refuses a
    non-loopback host without a token, also when Serve already listens on one."""
    from ray import serve

    if not is_loopback(host) and not token:
        raise MonitorError(
            f"serve.host={host} is beyond localhost: pass a token (--token or "
            f"TETHER_SERVE_TOKEN) so the page is not open to the network"
        )
    serve.start(http_options={"host": host, "port": port})
    actual_host, actual_port = serve_address()
    warning = check_serve_address((host, port), (actual_host, actual_port), token)
    if warning:
        warn(warning)
    serve.run(
        build_app(tracking_uri, experiments, token, refresh_s, sampling),
        name="tether-monitor",
        route_prefix="/",
    )
    shown = "127.0.0.1" if actual_host in ("0.0.0.0", "::") else actual_host
    shown = f"[{shown}]" if ":" in shown else shown  # an IPv6 address
    return f"http://{shown}:{actual_port}/" + (f"?token={token}" if token else "")
