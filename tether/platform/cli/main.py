"""The ``tether`` command line: parses, builds the config, calls the platform."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .console import console, fail
from .progress import KEY_METRICS

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Tether: multi-turn agent RL on Ray that detects and prevents template collapse.",
)


def _with_interval(metrics: dict, key: str) -> str:
    """``value [low, high]`` when the metric's interval was logged, else the value."""
    value, low, high = metrics[key], metrics.get(f"{key}_ci_low"), metrics.get(f"{key}_ci_high")
    return f"{value:.3f}" if low is None or high is None else f"{value:.3f} [{low:.3f}, {high:.3f}]"


def _check_cluster(address: str | None) -> None:
    """One line and exit when nothing answers at the Ray address (light imports only)."""
    from ..session import ClusterError, check_ray_reachable

    if address:
        try:
            check_ray_reachable(address)
        except ClusterError as exc:
            fail(str(exc))


def _start_up(address: str | None) -> None:
    """The start-up checks of ``tether run`` and ``tether sweep`` once the config is read
    (``preflight.start_up``): one line and exit when one refuses."""
    from ..environment import DependencyError
    from ..preflight import start_up
    from ..session import ClusterError

    try:
        start_up(address)
    except (DependencyError, ClusterError) as exc:
        fail(str(exc))


@contextmanager
def _failures(what: str, interrupted: str, refusals: tuple = ()):
    """A run's or a sweep's errors as one line and an exit code: a refusal (its own
    message), a config only the resolved model refutes, Ctrl-C (130), anything else (1;
    ``TETHER_DEBUG=1`` raises it with its traceback)."""
    from ...envs.sandbox import SandboxUnavailable
    from ...store import TrackingError
    from ..config import ConfigError
    from ..session import ClusterError

    try:
        yield
    except (ClusterError, TrackingError, SandboxUnavailable, *refusals) as exc:
        fail(str(exc))
    except ConfigError as exc:  # a setting only the resolved model can refute (model.lora)
        fail(f"config: {exc}")
    except KeyboardInterrupt:
        fail(interrupted, code=130)
    except Exception as exc:  # an actor crash or a bug: one line here, details in the log
        if os.environ.get("TETHER_DEBUG"):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        fail(
            f"{what} failed: {type(exc).__name__}: {first} (set TETHER_DEBUG=1 for the traceback)",
            code=1,
        )


def _config_and_overrides(
    config: Path | None, overrides: list[str] | None
) -> tuple[Path | None, list[str]]:
    """``tether run algo.lr=0.01`` (no YAML): the first argument is an override, not a
    config path, when it names no file and has a ``=``."""
    if config is not None and "=" in str(config) and not config.exists():
        return None, [str(config), *(overrides or [])]
    return config, list(overrides or [])


def _load(config: Path | None, overrides: list[str], address: str | None):
    from ..config import ConfigError, load_config

    extra = list(overrides or [])
    if address:
        extra.append(f"ray.address={address}")
    try:
        return load_config(config, extra)
    except ConfigError as exc:
        fail(f"config: {exc}")


@app.command()
def run(
    config: Path | None = typer.Argument(
        None, help="Experiment YAML (default: the embedded defaults)."
    ),
    overrides: list[str] | None = typer.Argument(
        None, help="Dotted overrides, e.g. algo.kl_coef=0.01 rollout.groups=4."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Join this Ray cluster (default: start a local Ray on 127.0.0.1)."
    ),
    resume: str | None = typer.Option(
        None,
        "--resume",
        help="Continue a run from its "
        "last checkpoint: a checkpoint file, a directory (the newest checkpoint in it, "
        "its checkpoints/ or their run subdirectories), or an MLflow run id "
        "(same MLflow run).",
    ),
):
    """Train an agent: warm start (cached), Ray actors, MLflow tracking."""
    _check_cluster(address)  # first: an unreachable --address fails in seconds
    config, overrides = _config_and_overrides(config, overrides)
    if resume:
        cfg, resume_from, resume_run_id = _resumed_config(config, overrides, address, resume)
    else:
        cfg, resume_from, resume_run_id = _load(config, overrides, address), None, None
    _start_up(cfg.ray.address)  # ray.address from the YAML too: before the warm start
    from ..run.trainer import Trainer
    from .progress import RunDisplay

    with _failures("run", "interrupted; the MLflow run is marked KILLED"):
        with RunDisplay(console) as display:  # bars in a terminal, else a line per event
            summary = Trainer(
                cfg, display, resume_from=resume_from, resume_run_id=resume_run_id
            ).run()
    console.print(_summary_table(summary))
    console.print(f"MLflow run id: [cyan]{summary.run_id}[/]")
    console.print(f"Look at it: [green]{summary.ui_command}[/]")


def _resumed_config(config: Path | None, overrides: list[str], address: str | None, resume: str):
    """``--resume``: (the run's own config with this command's overrides on top, the
    checkpoint to continue from, the MLflow run it belongs to)."""
    from ..config import ConfigError, build_config
    from ..run.checkpoint import ResumeError, check_same_parameters, resolve_resume

    base = _load(config, overrides, address)
    try:
        resume_from, resume_run_id, saved = resolve_resume(resume, base.tracking_uri())
        cfg = build_config(saved, overrides + ([f"ray.address={address}"] if address else []))
        check_same_parameters(saved, cfg.model)
    except ResumeError as exc:
        fail(f"resume: {exc}")
    except ConfigError as exc:
        fail(f"config: {exc}")
    return cfg, resume_from, resume_run_id


def _summary_table(summary) -> Table:
    """The run's summary: status, alarms, validation with intervals, last metrics, the
    last diagnostic point's MI proxies and input-dependence test."""
    table = Table(title="Tether run summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("status", summary.status)
    table.add_row("iterations", str(summary.iterations))
    if summary.stop_reason:
        table.add_row("stopped by", summary.stop_reason)
    table.add_row("alarms", ", ".join(sorted({a["name"] for a in summary.alarms})) or "none")
    table.add_row("wall time", f"{summary.seconds:.0f} s")
    for step, value in sorted(summary.val_history.items()):
        low, high = summary.val_intervals.get(step, (value, value))
        table.add_row(f"val/success @ {step}", f"{value:.3f} [{low:.3f}, {high:.3f}]")
    for key, _label in KEY_METRICS[:-1]:
        if key in summary.last_metrics:
            table.add_row(f"{key} (last)", _with_interval(summary.last_metrics, key))
    d = summary.last_diagnostics
    for name in ("mi_estimate", "retrieval_acc", "conditional_entropy_est"):
        key = f"collapse/first_turn/{name}"
        if key in d:
            table.add_row(f"{key} @ {int(d['iteration'])}", _with_interval(d, key))
    for key in ("collapse/probe/mi_estimate", "grounding/reading_acc"):  # the probe set's
        if key in d:
            table.add_row(f"{key} @ {int(d['iteration'])}", _with_interval(d, key))
    if "collapse/first_turn/p_grounded" in d:
        p = d["collapse/first_turn/p_grounded"]
        table.add_row(
            "reasoning depends on input",
            f"{'yes' if d.get('collapse/first_turn/grounded') else 'not shown'}"
            f" (permutation p = {p:.3g})",
        )
    return table


@app.command("config")
def show_config(
    config: Path | None = typer.Argument(None, help="Experiment YAML."),
    overrides: list[str] | None = typer.Argument(None, help="Dotted overrides."),
    fields: bool = typer.Option(
        False,
        "--fields",
        help="List every field with its "
        "default (or, given a YAML, its value) and "
        "description instead.",
    ),
):
    """Validate a config and print the resolved tree (nothing starts)."""
    import yaml

    config, overrides = _config_and_overrides(config, overrides)

    if fields:
        from ..config import describe_fields

        # Without a YAML: the defaults a run uses (the default preset applied); with
        # one (and overrides): that config's values.
        cfg = _load(config, overrides or [], None) if config or overrides else None
        title = "defaults, preset applied" if cfg is None else "values of this config"
        table = Table(title=f"Tether config fields ({title}; override as section.key=value)")
        for column in ("field", "default" if cfg is None else "value", "description"):
            table.add_column(column)
        for path, default, description in describe_fields(cfg):
            table.add_row(path, str(default), description)
        console.print(table)
        return
    cfg = _load(config, overrides or [], None)
    console.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), highlight=False)


@app.command()
def envs():
    """List the registered environments."""
    from ...envs import ENV_IDS

    for env_id in ENV_IDS:
        console.print(env_id)


@app.command()
def sweep(
    spec: Path = typer.Argument(
        ..., help="Sweep spec YAML: a run config plus a sweep: section (experiments/*_smoke.yaml)."
    ),
    overrides: list[str] | None = typer.Argument(
        None,
        help="Dotted overrides of the "
        "run config or the sweep, e.g. "
        "sweep.num_samples=8 algo.lr=1e-4.",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue an interrupted sweep: "
        "unfinished trials go on from their last checkpoint, in the same MLflow runs.",
    ),
    address: str | None = typer.Option(
        None, "--address", help="Join this Ray cluster (default: RAY_ADDRESS, else a local Ray)."
    ),
):
    """Ray Tune sweep: one training run per trial, nested under one MLflow parent run."""
    _check_cluster(address)
    from ..config import ConfigError
    from ..sweep.spec import load_sweep_spec

    try:
        sweep_spec = load_sweep_spec(spec, overrides or [])
    except ConfigError as exc:
        fail(f"sweep spec: {exc}")
    _start_up(address or os.environ.get("RAY_ADDRESS") or sweep_spec.base.ray.address)
    from ..sweep.runner import SweepError, run_sweep
    from .progress import SweepDisplay

    interrupted = "interrupted; continue with `tether sweep <sweep.yaml> --resume`"
    with _failures("sweep", interrupted, (SweepError,)):
        # bars in a terminal (warm start, trials with an ETA), else one line per event
        with SweepDisplay(console) as display:
            outcome = run_sweep(
                sweep_spec,
                resume=resume,
                address=address,
                echo=lambda line: console.print(line, highlight=False),
                display=display,
            )
    _print_sweep_outcome(outcome, sweep_spec.sweep.metric)
    if outcome.status == "KILLED":
        console.print(f"interrupted: continue with `tether sweep {spec} --resume`")
        raise typer.Exit(130)
    if outcome.status == "FAILED":
        raise typer.Exit(1)


def _print_sweep_outcome(outcome, metric: str) -> None:
    """The trials ranked by the sweep's metric, the status and where the results are."""
    from ..sweep.runner import results_table

    table = results_table(outcome.rows, metric, f"Sweep {outcome.name}: trials ranked by {metric}")
    (console if console.is_terminal else Console(width=200)).print(table)  # job logs: no wrap
    console.print(
        f"{outcome.status}: {outcome.trials} trials in {outcome.seconds:.0f} s; "
        f"MLflow parent run [cyan]{outcome.parent_run_id}[/] "
        + ("(results: sweep_results.csv)" if outcome.rows else "(no results table)"),
        highlight=False,
    )
    console.print(f"Look at it: [green]{outcome.ui_command}[/]")


TRACKING_URI = typer.Option(
    None,
    "--tracking-uri",
    help="MLflow tracking URI of the runs "
    "(default: MLFLOW_TRACKING_URI, else the SQLite store under "
    "--output-dir).",
)
OUTPUT_DIR = typer.Option(
    None,
    "--output-dir",
    help="experiment.output_dir of the runs, "
    "whose mlflow.db is read when no tracking URI is given.",
)


@app.command()
def report(
    target: str = typer.Argument(
        ..., help="A run id, a sweep's parent run id, an experiment name, or a record file."
    ),
    tracking_uri: str | None = TRACKING_URI,
    output_dir: Path | None = OUTPUT_DIR,
    out: Path | None = typer.Option(
        None, "--out", help="Where to write the report (default: ./tether_report/<target>)."
    ),
    sampling: str = typer.Option(
        "first_turn",
        "--sampling",
        help="Cross-scoring sampling the analyses use: first_turn | trajectory.",
    ),
    mi_name: str = typer.Option(
        "mi_estimate",
        "--mi",
        help="MI proxy of the quartile, regime and sensitivity views (e.g. mi_zscore_ema); "
        "the sensitivity view reads the probe's when every run logged one.",
    ),
    log: bool = typer.Option(
        True,
        "--log/--no-log",
        help="Log the report as artifacts (report/) of the run or sweep parent.",
    ),
    finished_only: bool = typer.Option(
        False,
        "--finished-only",
        help="Only runs that finished (not a killed or failed trial whose rerun is also "
        "there: it would count twice).",
    ),
):
    """The paper's analyses (docs/methods.md §13) over MLflow runs: figures (PNG +
    HTML) and report.html."""
    from ...analysis.report import ReportSettings
    from ...analysis.runs import DIAGNOSTICS, SAMPLINGS
    from . import tracking as cli_tracking

    cli_tracking.check_choice("--sampling", sampling, SAMPLINGS)
    cli_tracking.check_choice("--mi", mi_name, DIAGNOSTICS)
    from ...analysis.records import is_record_file

    # a record file (tether analyze paper --export) needs no store
    uri = None if is_record_file(target) else cli_tracking.tracking_uri(tracking_uri, output_dir)
    settings = ReportSettings(sampling=sampling, mi_name=mi_name)
    cli_tracking.report(target, uri, out, settings, log and uri is not None, finished_only)


@app.command("sync-tracking")
def sync_tracking(
    spool: Path = typer.Argument(
        ...,
        help="A tracking spool directory "
        "(<output_dir>/tracking_spool/<run id>) left by "
        "a run whose server was away when it ended.",
    ),
):
    """Replay a run's spooled tracking writes (metrics, params, tags, artifacts, final
    status) into its MLflow server, in order; writes already there are not duplicated."""
    from ...store import TrackingError
    from ..tracking.tracker import sync_spool

    try:
        run_id, count = sync_spool(spool, notify=lambda m: console.print(m, highlight=False))
    except TrackingError as exc:
        fail(str(exc))
    console.print(f"replayed {count} writes into run [cyan]{run_id}[/]")


@app.command()
def serve(
    tracking_uri: str | None = TRACKING_URI,
    output_dir: Path | None = OUTPUT_DIR,
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Interface to bind. Beyond localhost (e.g. 0.0.0.0) a --token is required.",
    ),
    port: int = typer.Option(8600, "--port", help="HTTP port of the page."),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="TETHER_SERVE_TOKEN",
        help="Require this token: open the page once as "
        "http://HOST:PORT/?token=TOKEN (it becomes an "
        "HttpOnly cookie; API: header 'Authorization: "
        "Bearer TOKEN'). Default: no login (localhost "
        "only).",
    ),
    experiment: list[str] | None = typer.Option(
        None, "--experiment", help="Only these experiments (repeatable; default all)."
    ),
    refresh: float = typer.Option(5.0, "--refresh", min=0.5, help="Page refresh, seconds."),
    sampling: str = typer.Option(
        "first_turn", "--sampling", help="Cross-scoring sampling shown: first_turn | trajectory."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Run Serve on this Ray cluster (default: a local Ray)."
    ),
):
    """Live collapse monitor: a Ray Serve page of the MLflow runs, refreshing while they train."""
    from ...analysis.runs import SAMPLINGS
    from . import tracking as cli_tracking

    cli_tracking.check_choice("--sampling", sampling, SAMPLINGS)
    uri = cli_tracking.tracking_uri(tracking_uri, output_dir)
    cli_tracking.serve(uri, address, host, token, (port, experiment, refresh, sampling))


from .analyze import analyze_app  # noqa: E402

app.add_typer(analyze_app, name="analyze")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
