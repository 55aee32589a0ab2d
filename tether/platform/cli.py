"""The ``tether`` command line: parses, builds the config, calls the platform."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Tether: multi-turn agent RL on Ray that detects and prevents template collapse.",
)
console = Console()
err_console = Console(stderr=True)

KEY_METRICS = [
    ("rollout/success", "success"),
    ("rollout/in_group_reward_std", "rv"),
    ("filter/kept_ratio", "kept"),
    ("actor/entropy", "entropy"),
    ("val/success", "val"),
]


def _with_interval(metrics: dict, key: str) -> str:
    """``value [low, high]`` when the metric's interval was logged, else the value."""
    value, low, high = metrics[key], metrics.get(f"{key}_ci_low"), metrics.get(f"{key}_ci_high")
    return f"{value:.3f}" if low is None or high is None else f"{value:.3f} [{low:.3f}, {high:.3f}]"


def fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _check_cluster(address: str | None) -> None:
    """One line and exit when nothing answers at the Ray address (light imports only)."""
    from .session import ClusterError, check_ray_reachable

    if address:
        try:
            check_ray_reachable(address)
        except ClusterError as exc:
            fail(str(exc))


def _check_dependencies() -> None:
    """One line and exit when transformers is outside Tether's declared range."""
    from .environment import DependencyError, check_installed

    try:
        check_installed("transformers")
    except DependencyError as exc:
        fail(str(exc))


def _config_and_overrides(
    config: Path | None, overrides: list[str] | None
) -> tuple[Path | None, list[str]]:
    """``tether run algo.lr=0.01`` (no YAML): the first argument is an override, not a
    config path, when it names no file and has a ``=``."""
    if config is not None and "=" in str(config) and not config.exists():
        return None, [str(config), *(overrides or [])]
    return config, list(overrides or [])


def _load(config: Path | None, overrides: list[str], address: str | None):
    from .config import ConfigError, load_config

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
    resume_from = resume_run_id = None
    if resume:
        from .checkpoint import ResumeError, check_same_parameters, resolve_resume
        from .config import ConfigError, build_config
        from .tracking import default_tracking_uri

        base = _load(config, overrides or [], address)
        uri = base.tracking.uri or default_tracking_uri(base.experiment.output_dir)
        try:
            resume_from, resume_run_id, saved = resolve_resume(resume, uri)
            # the run's own config, with this command's overrides on top
            cfg = build_config(
                saved, list(overrides or []) + ([f"ray.address={address}"] if address else [])
            )
            check_same_parameters(saved, cfg.model)
        except ResumeError as exc:
            fail(f"resume: {exc}")
        except ConfigError as exc:
            fail(f"config: {exc}")
    else:
        cfg = _load(config, overrides or [], address)
    from .session import ClusterError, prepare_process

    _check_dependencies()
    if cfg.ray.address != address:  # ray.address from the YAML: before the warm start
        _check_cluster(cfg.ray.address)
    prepare_process(cfg.ray.address)
    from .config import ConfigError
    from .progress import bars
    from .tracking import TrackingError
    from .trainer import Trainer

    progress = bars(console)
    tasks: dict[str, int] = {}

    plain = not console.is_terminal  # logs (ray job logs, CI): one line per event instead of bars

    def on_event(kind: str, data: dict) -> None:
        if plain and kind == "warm_start":
            if data["step"] % max(1, data["total"] // 10) == 0 or data["step"] == data["total"]:
                console.print(f"warm start {data['step']}/{data['total']} loss {data['loss']:.3f}")
        elif plain and kind == "iteration":
            info = "  ".join(
                f"{label} {data[key]:.3f}" for key, label in KEY_METRICS if key in data
            )
            console.print(
                f"iteration {data['iteration']}/{data['total']}  {info}  "
                f"({data.get('timing/iteration', 0):.1f} s)",
                highlight=False,
            )
        elif kind == "warm_start":
            if "warm" not in tasks:
                tasks["warm"] = progress.add_task("warm start", total=data["total"], info="")
            progress.update(tasks["warm"], completed=data["step"], info=f"loss {data['loss']:.3f}")
        elif kind == "started":
            console.print(f"MLflow run [cyan]{data['run_id']}[/]  model {data['model_path']}")
            if data.get("first_iteration", 1) > 1:
                console.print(f"resuming at iteration {data['first_iteration']}")
        elif kind == "alarm":
            style = "bold red" if data["mode"] == "stop" else "yellow"
            console.print(f"[{style}]ALARM[/] {data['message']}", highlight=False)
        elif kind == "action":
            console.print(
                f"[cyan]ACTION[/] iteration {data['iteration']}: {data['message']}", highlight=False
            )
        elif kind == "tracking":
            console.print(f"[yellow]{data['message']}[/]", highlight=False)
        elif kind == "learner_failed":
            console.print(
                f"[yellow]learner died ({data['error']}); restart {data['restart']}: "
                f"rebuilding from {data['checkpoint']}[/]",
                highlight=False,
            )
        elif kind == "checkpoint_failed":
            console.print(f"[yellow]{data['message']}[/]", highlight=False)
        elif kind == "worker_failed":
            console.print(
                f"[yellow]rollout worker {data['worker']} died "
                f"({data['error']}); re-collecting its share[/]",
                highlight=False,
            )
        elif kind == "validation":
            console.print(f"validation before training: success {data['val/success']:.3f}")
        elif kind == "iteration":
            if "train" not in tasks:
                tasks["train"] = progress.add_task("training", total=data["total"], info="")
            info = "  ".join(
                f"{label} {data[key]:.3f}" for key, label in KEY_METRICS if key in data
            )
            progress.update(tasks["train"], completed=data["iteration"], info=info)

    from ..envs.sandbox import SandboxUnavailable

    try:
        with progress:
            summary = Trainer(
                cfg, on_event, resume_from=resume_from, resume_run_id=resume_run_id
            ).run()
    except (ClusterError, TrackingError, SandboxUnavailable) as exc:
        fail(str(exc))
    except ConfigError as exc:  # a setting only the resolved model can refute (model.lora)
        fail(f"config: {exc}")
    except KeyboardInterrupt:
        fail("interrupted; the MLflow run is marked KILLED", code=130)
    except Exception as exc:  # an actor crash or a bug: one line here, details in the log
        if os.environ.get("TETHER_DEBUG"):
            raise
        fail(
            f"run failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
            f"(set TETHER_DEBUG=1 for the traceback)",
            code=1,
        )
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
    if "collapse/first_turn/p_grounded" in d:
        p = d["collapse/first_turn/p_grounded"]
        table.add_row(
            "reasoning depends on input",
            f"{'yes' if d.get('collapse/first_turn/grounded') else 'not shown'}"
            f" (permutation p = {p:.3g})",
        )
    console.print(table)
    console.print(f"MLflow run id: [cyan]{summary.run_id}[/]")
    console.print(f"Look at it: [green]{summary.ui_command}[/]")


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
        from .config import describe_fields

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
    from ..envs import ENV_IDS

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
        "only unfinished trials run, in the same MLflow parent.",
    ),
    address: str | None = typer.Option(
        None, "--address", help="Join this Ray cluster (default: RAY_ADDRESS, else a local Ray)."
    ),
):
    """Ray Tune sweep: one training run per trial, nested under one MLflow parent run."""
    _check_cluster(address)
    from .config import ConfigError
    from .session import prepare_process
    from .sweep_spec import load_sweep_spec

    try:
        sweep_spec = load_sweep_spec(spec, overrides or [])
    except ConfigError as exc:
        fail(f"sweep spec: {exc}")
    _check_dependencies()
    prepare_process(address or os.environ.get("RAY_ADDRESS") or sweep_spec.base.ray.address)
    from ..envs.sandbox import SandboxUnavailable
    from .progress import SweepDisplay
    from .session import ClusterError
    from .sweep import SweepError, results_table, run_sweep
    from .tracking import TrackingError

    try:  # bars in a terminal (warm start, trials with an ETA), else one line per event
        with SweepDisplay(console) as display:
            outcome = run_sweep(
                sweep_spec,
                resume=resume,
                address=address,
                echo=lambda line: console.print(line, highlight=False),
                display=display,
            )
    except (SweepError, ClusterError, TrackingError, SandboxUnavailable) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted; continue with `tether sweep <sweep.yaml> --resume`", code=130)
    except Exception as exc:  # a bug or a dead cluster: one line here, details in the log
        if os.environ.get("TETHER_DEBUG"):
            raise
        fail(
            f"sweep failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            f" (set TETHER_DEBUG=1 for the traceback)",
            code=1,
        )
    table = results_table(
        outcome.rows,
        sweep_spec.sweep.metric,
        f"Sweep {outcome.name}: trials ranked by {sweep_spec.sweep.metric}",
    )
    (console if console.is_terminal else Console(width=200)).print(table)  # job logs: no wrap
    console.print(
        f"{outcome.status}: {outcome.trials} trials in {outcome.seconds:.0f} s; "
        f"MLflow parent run [cyan]{outcome.parent_run_id}[/] (results: "
        f"sweep_results.csv)",
        highlight=False,
    )
    console.print(f"Look at it: [green]{outcome.ui_command}[/]")
    if outcome.status == "KILLED":
        console.print(f"interrupted: continue with `tether sweep {spec} --resume`")
        raise typer.Exit(130)
    if outcome.status == "FAILED":
        raise typer.Exit(1)


def _tracking_uri(uri: str | None, output_dir: Path | None) -> str:
    """The given URI, else output_dir's SQLite store (the embedded default of `tether run`);
    a SQLite file that does not exist is an error here, not a new empty store."""
    from .config import TetherConfig
    from .tracking import default_tracking_uri

    uri = (
        uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or default_tracking_uri(output_dir or TetherConfig().experiment.output_dir)
    )
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        fail(
            f"tracking: no MLflow store at {uri[len('sqlite:///') :]}; pass --tracking-uri "
            f"(the tracking.uri of the runs) or --output-dir (their experiment.output_dir)"
        )
    return uri


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
        ..., help="A run id, a sweep's parent run id, or an experiment name."
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
        help="MI proxy of the quartile, regime and sensitivity views (e.g. mi_zscore_ema).",
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
    """The paper's analyses (docs/methods.md, section 13) over MLflow runs: figures (PNG +
    HTML) and report.html."""
    from ..analysis.report import ReportSettings, build_report, log_report
    from ..analysis.runs import DIAGNOSTICS, SAMPLINGS
    from ..analysis.source import ReportError, load_target

    if sampling not in SAMPLINGS:
        fail(f"--sampling {sampling!r} is not one of {list(SAMPLINGS)}")
    if mi_name not in DIAGNOSTICS:
        fail(f"--mi {mi_name!r} is not one of {list(DIAGNOSTICS)}")
    uri = _tracking_uri(tracking_uri, output_dir)
    try:
        resolved, runs = load_target(uri, target)
    except ReportError as exc:
        fail(f"report: {exc}")
    if finished_only:
        left_out = [f"{r.name} ({r.status})" for r in runs if r.status != "FINISHED"]
        runs = [r for r in runs if r.status == "FINISHED"]
        if left_out:
            console.print(f"left out, not finished: {', '.join(left_out)}", highlight=False)
        if not runs:
            fail(f"report: no finished run in {target}")
    out = out or Path("tether_report") / target.replace("/", "_")
    settings = ReportSettings(sampling=sampling, mi_name=mi_name)
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
            table = Table(title=name)
            for column in section.rows[0]:
                if column != "run_id":
                    table.add_column(column, justify="right")
            for row in section.rows:
                table.add_row(
                    *[
                        f"{v:.3g}" if isinstance(v, float) else str(v)
                        for k, v in row.items()
                        if k != "run_id"
                    ]
                )
            console.print(table)
    if log:
        from mlflow.tracking import MlflowClient

        from .config import TrackingConfig
        from .tracking import SPOOL_DIRNAME, Tracker

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
    console.print(
        f"report: [green]{(out / 'report.html').resolve()}[/] ({len(result.figures)} figures)"
    )


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
    from .tracking import TrackingError, sync_spool

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
    from ..analysis.runs import SAMPLINGS

    if sampling not in SAMPLINGS:
        fail(f"--sampling {sampling!r} is not one of {list(SAMPLINGS)}")
    uri = _tracking_uri(tracking_uri, output_dir)
    from .session import ClusterError, prepare_process, start_ray, stop_ray

    prepare_process(address)
    from ..dashboards.monitor import MonitorError, is_loopback, start_monitor

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

    try:
        url = start_monitor(
            uri,
            host,
            port,
            token,
            experiment,
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


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
