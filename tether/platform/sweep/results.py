"""A sweep's MLflow bookkeeping and its results: child runs found by their parent, runs
that Tune ended closed, and the trials ranked by the metric (rich table and CSV).

The sweep's end (``end_of_sweep``) takes the tracking spool's path: it waits for a
server that is away (up to ``tracking.drain_timeout_s``, as a run's end waits for its
spool), replays what trials left spooled on disk before it closes their runs, and when
the server stays away ends without the table rather than with an error."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.tracking import MlflowClient

from ...store import TrackingError, server_healthy
from ..tracking.tracker import sync_spool, transient, wait_for

if TYPE_CHECKING:
    from ..tracking.tracker import Tracker

SUCCESS = "rollout/success"
MI_ZSCORE = "collapse/first_turn/mi_zscore_ema"
P_GROUNDED = "collapse/first_turn/p_grounded"  # the input-dependence test at the last diagnosis


def _children(uri: str, experiment_id: str, parent_run_id: str, extra: str = "") -> list:
    query = f"tags.`mlflow.parentRunId` = '{parent_run_id}'" + (f" and {extra}" if extra else "")
    return MlflowClient(uri).search_runs([experiment_id], filter_string=query, max_results=5000)


def finalize_child(
    uri: str, experiment_id: str, parent_run_id: str, trial_id: str, status: str
) -> bool:
    """Tune ended a trial (early stop, error) that could not close its own MLflow run.

    With the tracking server away (checked once, then any availability error of the
    writes) it does nothing and returns False: a Tune callback that raised would end the
    whole sweep, and the sweep's end (``end_of_sweep``) replays the trials' spools and
    closes what is still RUNNING once the server answers."""
    if not server_healthy(uri, 5):
        return False
    client = MlflowClient(uri)
    try:
        for run in _children(
            uri, experiment_id, parent_run_id, f"tags.`sweep.trial_id` = '{trial_id}'"
        ):
            if run.info.status == "RUNNING":
                client.set_tag(run.info.run_id, "sweep.ended_by", "tune")
                client.set_terminated(run.info.run_id, status)
    except Exception as exc:
        if not (isinstance(exc, TrackingError) or transient(exc)):
            raise
        return False
    return True


def close_stale_children(uri: str, experiment_id: str, parent_run_id: str) -> int:
    """Child runs still RUNNING while no trial runs (an interrupted sweep) become KILLED."""
    client, closed = MlflowClient(uri), 0
    for run in _children(uri, experiment_id, parent_run_id):
        if run.info.status == "RUNNING":
            client.set_terminated(run.info.run_id, "KILLED")
            closed += 1
    return closed


def replay_children_spools(
    uri: str, experiment_id: str, parent_run_id: str, spool_root: Path
) -> int:
    """Replay the spools the sweep's trials left in ``spool_root`` (a trial whose server
    came back after its drain timeout): their writes, final status last, land before
    a still-RUNNING child is taken for one Tune killed.  Returns how many."""
    replayed = 0
    for run in _children(uri, experiment_id, parent_run_id):
        directory = Path(spool_root) / run.info.run_id
        if (directory / "meta.json").is_file():
            sync_spool(directory)
            replayed += 1
    return replayed


MI_ALARMS = ("template_collapse", "low_entropy_collapse")


def end_of_sweep(
    parent: Tracker,
    children_spools: Path,
    say: Callable[[str], None],
    metric: str,
    mode: str,
    collapse_penalty: float | None = None,
    collapse_alarms: tuple[str, ...] = MI_ALARMS,
) -> list[dict] | None:
    """The trials' spools replayed, stale children closed and the results rows, once
    the tracking server answers: a server that is away is waited for (one line, up to
    ``tracking.drain_timeout_s``), and a read or write it drops is tried again.  None
    (said in one line) when it did not answer in time."""
    ids, rows = (parent.uri, parent.experiment_id, parent.run_id), []
    timeout = parent.settings.drain_timeout_s

    def attempt() -> bool:
        if server_healthy(parent.uri, min(parent.settings.http_timeout_s, 5)):
            try:
                replay_children_spools(*ids, children_spools)
                close_stale_children(*ids)
                rows[:] = results_rows(*ids, metric, mode, collapse_penalty, collapse_alarms)
                return True
            except Exception as exc:
                if not (isinstance(exc, TrackingError) or transient(exc)):
                    raise
        if not attempt.said:
            say(
                f"sweep: tracking server {parent.uri} is away; waiting up to {timeout:g} s "
                f"(tracking.drain_timeout_s) to close the trials' runs and rank them"
            )
            attempt.said = True
        return False

    attempt.said = False
    if wait_for(attempt, timeout):
        return rows
    say(
        f"sweep: {parent.uri} did not answer within {timeout:g} s: no results table; the "
        f"trials' runs are in MLflow or spooled under {children_spools}, and "
        f"`tether sync-tracking` replays a spool once the server is back"
    )
    return None


def results_rows(
    uri: str,
    experiment_id: str,
    parent_run_id: str,
    metric: str,
    mode: str,
    collapse_penalty: float | None = None,
    collapse_alarms: tuple[str, ...] = MI_ALARMS,
) -> list[dict]:
    """One row per trial (its FINISHED child run if any, else its latest), ranked by the
    metric, or with ``collapse_penalty`` by the metric penalised when an MI alarm fired.
    ``collapsed`` flags those trials; ``stop_reason`` says why a trial ended early."""
    client = MlflowClient(uri)
    by_trial: dict[str, Any] = {}
    for run in sorted(
        _children(uri, experiment_id, parent_run_id), key=lambda r: r.info.start_time
    ):
        trial = run.data.tags.get("sweep.trial_id", run.info.run_id)
        if trial not in by_trial or by_trial[trial].info.status != "FINISHED":
            by_trial[trial] = run
    rows = [
        _trial_row(client, trial, run, metric, collapse_alarms) for trial, run in by_trial.items()
    ]
    sign = -1.0 if mode == "max" else 1.0
    for row in rows:
        row["objective"] = row[metric] + (
            sign * collapse_penalty if collapse_penalty and row["collapsed"] else 0.0
        )
    ranked_by = "objective" if collapse_penalty is not None else metric

    def order(row: dict) -> tuple:  # by the metric, then peak success; missing values last
        value, peak = row[ranked_by], row["success_peak"]
        return (
            math.isnan(value),
            0.0 if math.isnan(value) else sign * value,
            math.isnan(peak),
            0.0 if math.isnan(peak) else -peak,
            row["trial"],
        )

    rows.sort(key=order)
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
    return rows


def _trial_row(client, trial: str, run, metric: str, collapse_alarms: tuple[str, ...]) -> dict:
    """A trial's row: its swept values, how far it got, its metric and success, alarms."""
    from ...store import metric_history
    from ..tracking.tracker import metric_key

    def history(key: str) -> list[float]:  # one value per step (resumed runs)
        return [
            v for _, v in sorted(metric_history(client, run.info.run_id, metric_key(key)).items())
        ]

    success, target, tags = history(SUCCESS), history(metric), run.data.tags
    return {
        "trial": trial,
        "run_id": run.info.run_id,
        "status": run.info.status,
        **{
            k.removeprefix("sweep.param."): v
            for k, v in sorted(tags.items())
            if k.startswith("sweep.param.")
        },
        "iterations": len(success),
        metric: target[-1] if target else float("nan"),
        "success_peak": max(success) if success else float("nan"),
        "success_final": success[-1] if success else float("nan"),
        "mi_zscore_ema_final": run.data.metrics.get(MI_ZSCORE, float("nan")),
        "p_grounded_final": run.data.metrics.get(P_GROUNDED, float("nan")),
        "alarms": " ".join(
            sorted(k.removeprefix("alarm.") for k in tags if k.startswith("alarm."))
        ),
        "collapsed": any(f"alarm.{name}" in tags for name in collapse_alarms),
        "stop_reason": tags.get("tether.stop_reason", ""),
    }


_TAIL = [
    "objective",
    "success_peak",
    "success_final",
    "mi_zscore_ema_final",
    "p_grounded_final",
    "alarms",
    "collapsed",
    "iterations",
    "status",
    "stop_reason",
    "run_id",
]


def _swept_columns(rows: list[dict], metric: str) -> list[str]:
    fixed = {"rank", "trial", metric, *_TAIL}
    return [c for c in dict.fromkeys(k for r in rows for k in r) if c not in fixed]


def write_results_csv(rows: list[dict], metric: str, path: Path) -> None:
    columns = ["rank", "trial", *_swept_columns(rows, metric), metric, *_TAIL]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def results_table(rows: list[dict], metric: str, title: str):
    """The ranked trials as a rich Table (swept values, metric, success, MI z-score, alarms)."""
    from rich.table import Table

    swept = _swept_columns(rows, metric)
    table = Table(title=title)
    penalised = any(
        r["objective"] != r[metric]
        for r in rows
        if not (math.isnan(r[metric]) and math.isnan(r["objective"]))
    )
    for column in [
        "#",
        "trial",
        *swept,
        metric,
        *(["objective"] if penalised else []),
        "peak success",
        "final success",
        "MI z-score (EMA)",
        "input-dependence p",
        "alarms",
        "status",
    ]:
        table.add_column(column, justify="right" if column not in ("trial", "alarms") else "left")

    def num(value) -> str:
        return (
            "-"
            if value is None or (isinstance(value, float) and math.isnan(value))
            else f"{value:.3f}"
        )

    for r in rows:
        status = r["status"]
        if r["collapsed"]:
            status = (
                "COLLAPSED, stopped"
                if r["stop_reason"].startswith("alarm")
                else f"{status}, collapsed"
            )
        table.add_row(
            str(r["rank"]),
            r["trial"],
            *(str(r.get(c, "")) for c in swept),
            num(r[metric]),
            *([num(r["objective"])] if penalised else []),
            num(r["success_peak"]),
            num(r["success_final"]),
            num(r["mi_zscore_ema_final"]),
            num(r["p_grounded_final"]),
            r["alarms"] or "-",
            status,
            style="dim" if r["collapsed"] else None,
        )
    return table
