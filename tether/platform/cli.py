"""The ``tether`` command line: parses, builds the config, calls the platform."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Tether: multi-turn agent RL on Ray that detects and prevents "
                       "template collapse.")
console = Console()
err_console = Console(stderr=True)

KEY_METRICS = [("rollout/success", "success"), ("rollout/in_group_reward_std", "rv"),
               ("filter/kept_ratio", "kept"), ("actor/entropy", "entropy"),
               ("val/success", "val")]


def fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _load(config: Optional[Path], overrides: list[str], address: Optional[str]):
    from .config import ConfigError, load_config

    extra = list(overrides or [])
    if address:
        extra.append(f"ray.address={address}")
    try:
        return load_config(config, extra)
    except ConfigError as exc:
        fail(f"config: {exc}")


@app.command()
def run(config: Optional[Path] = typer.Argument(None, help="Experiment YAML (default: the "
                                                "embedded defaults)."),
        overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides, e.g. "
                                                        "algo.kl_coef=0.01 rollout.groups=4."),
        address: Optional[str] = typer.Option(None, "--address", help="Join this Ray cluster "
                                              "(default: start a local Ray on 127.0.0.1).")):
    """Train an agent: warm start (cached), Ray actors, MLflow tracking."""
    cfg = _load(config, overrides or [], address)
    from .session import quiet_libraries

    quiet_libraries()
    from .driver import Trainer
    from .session import ClusterError
    from .tracking import TrackingError

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn(
        "{task.completed}/{task.total}"), TimeElapsedColumn(), TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"), console=console, transient=False)
    tasks: dict[str, int] = {}

    plain = not console.is_terminal  # logs (ray job logs, CI): one line per event instead of bars

    def on_event(kind: str, data: dict) -> None:
        if plain and kind == "warm_start":
            if data["step"] % max(1, data["total"] // 10) == 0 or data["step"] == data["total"]:
                console.print(f"warm start {data['step']}/{data['total']} loss {data['loss']:.3f}")
        elif plain and kind == "iteration":
            info = "  ".join(f"{label} {data[key]:.3f}" for key, label in KEY_METRICS if key in data)
            console.print(f"iteration {data['iteration']}/{data['total']}  {info}  "
                          f"({data.get('timing/iteration', 0):.1f} s)", highlight=False)
        elif kind == "warm_start":
            if "warm" not in tasks:
                tasks["warm"] = progress.add_task("warm start", total=data["total"], info="")
            progress.update(tasks["warm"], completed=data["step"], info=f"loss {data['loss']:.3f}")
        elif kind == "started":
            console.print(f"MLflow run [cyan]{data['run_id']}[/]  model {data['model_path']}")
        elif kind == "validation":
            console.print(f"validation before training: success {data['val/success']:.3f}")
        elif kind == "iteration":
            if "train" not in tasks:
                tasks["train"] = progress.add_task("training", total=data["total"], info="")
            info = "  ".join(f"{label} {data[key]:.3f}" for key, label in KEY_METRICS if key in data)
            progress.update(tasks["train"], completed=data["iteration"], info=info)

    try:
        with progress:
            summary = Trainer(cfg, on_event).run()
    except (ClusterError, TrackingError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted; the MLflow run is marked KILLED", code=130)
    except Exception as exc:  # an actor crash or a bug: one line here, details in the log
        if os.environ.get("TETHER_DEBUG"):
            raise
        fail(f"run failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
             f"(set TETHER_DEBUG=1 for the traceback)", code=1)
    table = Table(title="Tether run summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("status", summary.status)
    table.add_row("iterations", str(summary.iterations))
    table.add_row("wall time", f"{summary.seconds:.0f} s")
    for step, value in sorted(summary.val_history.items()):
        table.add_row(f"val/success @ {step}", f"{value:.3f}")
    for key, label in KEY_METRICS[:-1]:
        if key in summary.last_metrics:
            table.add_row(f"{key} (last)", f"{summary.last_metrics[key]:.3f}")
    console.print(table)
    console.print(f"MLflow run id: [cyan]{summary.run_id}[/]")
    console.print(f"Look at it: [green]{summary.ui_command}[/]")


@app.command("config")
def show_config(config: Optional[Path] = typer.Argument(None, help="Experiment YAML."),
                overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides.")):
    """Validate a config and print the resolved tree (nothing starts)."""
    import yaml

    cfg = _load(config, overrides or [], None)
    console.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), highlight=False)


@app.command()
def envs():
    """List the registered environments."""
    from ..envs import ENV_IDS

    for env_id in ENV_IDS:
        console.print(env_id)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
