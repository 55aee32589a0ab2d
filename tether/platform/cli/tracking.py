"""The MLflow side of the command line: ``tether report`` and ``tether serve`` (their
options and help are in ``cli.py``; what they do is here)."""

from __future__ import annotations

import os
from pathlib import Path

from rich.table import Table
from rich.text import Text

from .console import console, fail


def tracking_uri(uri: str | None, output_dir: Path | None) -> str:
    """The given URI, else MLFLOW_TRACKING_URI, else output_dir's SQLite store (the rule
    of ``tether run``, ``config.tracking_uri``); a SQLite file that does not exist is an
    error here, not a new empty store."""
    from ..config import tracking_uri as default_rule

    uri = default_rule(uri or os.environ.get("MLFLOW_TRACKING_URI"), output_dir)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        fail(
            f"tracking: no MLflow store at {uri[len('sqlite:///') :]}; pass --tracking-uri "
            f"(the tracking.uri of the runs) or --output-dir (their experiment.output_dir)"
        )
    return uri


def check_choice(option: str, value: str, choices) -> None:
    if value not in choices:
        fail(f"{option} {value!r} is not one of {list(choices)}")


# -- tether report ------------------------------------------------------------------------
def report(
    target: str, uri: str | None, out: Path | None, settings, log: bool, finished_only: bool
) -> None:
    """Build the report of ``target`` into ``out``, print its tables, log it to MLflow."""
    from ...analysis.report import build_report
    from ...analysis.source import ReportError, load_target

    try:
        resolved, runs = load_target(uri, target)
    except ReportError as exc:
        fail(f"report: {exc}")
    if finished_only:
        runs = finished(runs, target)
    out = out or Path("tether_report") / target.replace("/", "_")
    result = build_report(
        runs,
        out,
        f"Tether report: {resolved.kind} {resolved.label} ({len(runs)} runs)",
        settings,
        resolved.sweep_base,
    )
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    for name, section in result.sections.items():
        if section.rows:
            console.print(section_table(name, section.rows))
    if log:
        log_to_mlflow(uri, resolved, target, out)
    console.print(
        f"report: [green]{(out / 'report.html').resolve()}[/] ({len(result.figures)} figures)"
    )


def finished(runs: list, target: str) -> list:
    """Only the runs that finished; the others named on the console."""
    left_out = [f"{r.name} ({r.status})" for r in runs if r.status != "FINISHED"]
    runs = [r for r in runs if r.status == "FINISHED"]
    if left_out:
        console.print(f"left out, not finished: {', '.join(left_out)}", highlight=False)
    if not runs:
        fail(f"report: no finished run in {target}")
    return runs


def _cell(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _with_interval(row: dict, key: str) -> str:
    low, high = (_cell(row.get(f"{key}_ci_{end}")) for end in ("low", "high"))
    return f"{_cell(row.get(key))} [{low}, {high}]"


def section_table(name: str, rows: list[dict]) -> Table:
    """A report section's rows; a value ``k`` with ``k_ci_low`` and ``k_ci_high`` beside
    it is one column, ``mean [low, high]``."""
    paired = {k for k in rows[0] if f"{k}_ci_low" in rows[0] and f"{k}_ci_high" in rows[0]}
    bounds = {f"{k}_ci_{end}" for k in paired for end in ("low", "high")}
    columns = [k for k in rows[0] if k != "run_id" and k not in bounds]
    table = Table(title=name)
    for column in columns:
        table.add_column(f"{column} (95% CI)" if column in paired else column, justify="right")
    for row in rows:
        table.add_row(
            # Text, not markup: "[nan, 0.6]" would read as a style tag and vanish.
            *[Text(_with_interval(row, k) if k in paired else _cell(row.get(k))) for k in columns]
        )
    return table


def log_to_mlflow(uri: str, resolved, target: str, out: Path) -> None:
    """The report as artifacts report/ of the run or sweep parent (or a report run)."""
    from mlflow.tracking import MlflowClient

    from ...analysis.report import log_report
    from ..config import TrackingConfig
    from ..tracking.tracker import SPOOL_DIRNAME, Tracker

    # Through a Tracker with its spool beside the report's directory (not in it: the
    # directory is what is uploaded): a server that goes away mid-upload leaves the
    # rest there for `tether sync-tracking`, not a traceback.
    tracker = Tracker(
        uri,
        MlflowClient(tracking_uri=uri).get_experiment(resolved.experiment_id).name,
        run_name=f"report-{target}",
        tags={"tether.kind": "report"},
        run_id=resolved.log_to,
        reopen=False,
        spool_root=out.with_name(f"{out.name}_{SPOOL_DIRNAME}"),
        settings=TrackingConfig(),
        notify=lambda message: console.print(f"[yellow]{message}[/]", highlight=False),
    )
    log_report(tracker, out)
    landed = tracker.finish() if resolved.log_to is None else tracker.flush()
    if landed:
        console.print(f"logged as artifacts report/ of run [cyan]{tracker.run_id}[/]")
    elif resolved.log_to is not None:
        console.print(
            f"[yellow]report/ of run {tracker.run_id} waits in "
            f"{tracker.spool.directory}: `tether sync-tracking "
            f"{tracker.spool.directory}` uploads it[/]",
            highlight=False,
        )


# -- tether serve -------------------------------------------------------------------------
def serve(uri: str, address: str | None, host: str, token: str | None, monitor: tuple) -> None:
    """The live monitor on Ray Serve until Ctrl-C; ``monitor`` = (port, experiments,
    refresh, sampling).  Ray and Serve stop with it (Ray only if this started it)."""
    from ..session import ClusterError, prepare_process, start_ray, stop_ray

    prepare_process(address)
    from ...dashboards.monitor import MonitorError, is_loopback, start_monitor

    if not is_loopback(host) and not token:
        fail(
            f"--host {host} is beyond localhost: pass --token (or TETHER_SERVE_TOKEN) so "
            f"the page is not open to the network"
        )
    try:
        started = start_ray(address, None, 1)
    except ClusterError as exc:
        fail(str(exc))
    import time

    from ray import serve as ray_serve

    port, experiments, refresh, sampling = monitor
    try:
        url = start_monitor(
            uri,
            host,
            port,
            token,
            experiments,
            refresh,
            sampling,
            warn=lambda line: console.print(f"[yellow]warning:[/] {line}"),
        )
    except MonitorError as exc:  # e.g. a Serve already on 0.0.0.0: leave it as it was
        stop_ray(started)
        fail(str(exc))
    try:
        console.print(f"Tether monitor on [green]{url}[/]  (MLflow {uri}); Ctrl-C stops it")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        console.print("stopping the monitor")
    finally:
        ray_serve.shutdown()
        stop_ray(started)
