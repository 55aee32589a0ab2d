"""MLflow tracking: one MLflow run per training run, SQLite by default.

All writes go through ``MlflowClient`` with an explicit run id, so nothing depends
on MLflow's process-global "active run" (Ray Tune trials share a process).

Tracking never stops training. With a spool directory (the run's output directory,
``tracking_spool/<run id>/``), a write the tracking server cannot take (unreachable,
5xx, rate-limited) goes to a durable on-disk spool instead: ``spool.jsonl``, one record
per write in order, with copies of the artifact files beside it. While the spool holds
anything, later writes join it without touching the network, and the server's
``/health`` is probed at most every ``tracking.probe_every_s``; once it answers, the
spool is replayed in order and writing goes direct again. Replays are idempotent: a
metric keeps the timestamp it was logged with, and MLflow's SQL store skips a metric
identical in key, timestamp, step and value; params, tags and artifacts overwrite with
the same content. The run's final status is itself a record, so it is set only after
everything before it has landed. What a run could not replay before it ended stays on
disk: ``tether run --resume`` replays it first, or ``tether sync-tracking DIR``.
Per-iteration artifacts are thinned with age (``retention.py``); a delete is a record too.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ...store import (
    TrackingError,
    check_tracking_reachable,
    ensure_experiment,
    is_http,
    metric_history,
    server_healthy,
)
from .retention import ArtifactThinning, delete_artifact, deletion_refused, thinned_iteration
from .spool import Spool

if TYPE_CHECKING:
    from ..config import TrackingConfig
    from .retention import RetentionConfig

_INVALID_KEY_CHARS = re.compile(r"[^/\w.\- :]")
_MAX_PARAM_VALUE = 6000
SPOOL_DIRNAME = "tracking_spool"
#: The key every logged iteration's metrics carry (the driver's iteration time): how far a
#: reopened run's metrics reach.
ITERATION_KEY = "timing/iteration"

log = logging.getLogger("tether.tracking")


def metric_key(name: str) -> str:
    """An MLflow-safe metric name (``retrieval_acc@2`` -> ``retrieval_acc_at_2``)."""
    return _INVALID_KEY_CHARS.sub("_", name.replace("@", "_at_"))


def wait_for(done: Callable[[], bool], timeout_s: float) -> bool:
    """Call ``done`` about every second until it is True (True) or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    return True


def bound_http_retries(settings: TrackingConfig) -> None:
    """MLflow's own HTTP retry budget, bounded (defaults only: a variable the user set
    wins). MLflow 3 retries a failed request ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (7)
    times with exponential backoff (factor 2), minutes per write with the server down;
    the spool makes those minutes unnecessary."""
    for name, value in (
        ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", settings.http_max_retries),
        ("MLFLOW_HTTP_REQUEST_TIMEOUT", settings.http_timeout_s),
        ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", settings.http_backoff_factor),
    ):
        os.environ.setdefault(name, str(value))


def transient(exc: BaseException) -> bool:
    """An error of the server's availability (spool and retry later), not of the write
    (a changed param value, a bad key: raise)."""
    if isinstance(exc, MlflowException):
        return exc.get_http_status_code() >= 500 or exc.get_http_status_code() == 429
    import requests

    return isinstance(exc, (requests.exceptions.RequestException, ConnectionError, TimeoutError))


class Tracker:
    """Writes one run: params, per-iteration metrics, tags, text and file artifacts.

    ``spool_root`` turns the spool on (records under ``spool_root/<run id>``; None: a write
    the server does not take raises, as MLflow's client does); ``settings`` are the
    ``tracking.*`` knobs; ``notify`` receives the one line said when spooling starts and
    the one when the spool has drained (default: a warning on the ``tether.tracking``
    logger). ``reopen=False`` writes into an existing run without marking it RUNNING
    (a report written back into a finished run). ``retention``: thin the run's
    per-iteration artifacts with age (None: keep everything written)."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        artifact_root: Path | None = None,
        run_name: str | None = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        spool_root: Path | None = None,
        settings: TrackingConfig | None = None,
        notify: Callable[[str], None] | None = None,
        reopen: bool = True,
        retention: RetentionConfig | None = None,
    ) -> None:
        if settings is None:
            from ..config import TrackingConfig

            settings = TrackingConfig()
        self.settings = settings
        if is_http(uri) and spool_root is not None:
            bound_http_retries(settings)
        check_tracking_reachable(uri)
        self.uri = uri
        self.notify = notify or log.warning
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = ensure_experiment(self.client, experiment, artifact_root)
        if run_id is not None:
            self.run_id = run_id
        else:
            all_tags = {k: str(v) for k, v in (tags or {}).items()}  # REST: strings only
            if run_name:
                all_tags["mlflow.runName"] = run_name
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=run_name)
            self.run_id = run.info.run_id
        self.spool = (
            Spool(Path(spool_root) / self.run_id, uri, self.run_id)
            if spool_root is not None and settings.spool
            else None
        )
        self._next_probe = 0.0
        self.thinning = ArtifactThinning(retention) if retention is not None else None
        if self.spool is not None and self.spool.pending:  # an earlier process's writes first
            self.notify(
                f"tracking: replaying {self.spool.pending} spooled writes from "
                f"{self.spool.directory}"
            )
            self._drain()
        #: a reopened run's tags and last iteration with metrics (after the replay; read now)
        self.opened_tags, self.opened_last_step = {}, 0
        if run_id is not None and reopen:  # after the replay: it may end in a final status
            self.opened_tags = self.client.get_run(run_id).data.tags
            self.opened_last_step = max(
                metric_history(self.client, run_id, ITERATION_KEY), default=0
            )
            self._write({"op": "reopen"})
            self._adopt_artifacts()

    # -- the writes ---------------------------------------------------------------------
    def log_params(self, params: dict[str, Any]) -> None:
        self._write(
            {"op": "params", "params": {k: str(v)[:_MAX_PARAM_VALUE] for k, v in params.items()}}
        )

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)  # kept in the spool: a replay is a duplicate MLflow skips
        items = [
            [metric_key(k), float(v), now, int(step)]
            for k, v in metrics.items()
            if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))
        ]
        if items:
            self._write({"op": "metrics", "metrics": items})

    def set_tags(self, tags: dict[str, Any]) -> None:
        if tags:
            self._write({"op": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def log_text(self, text: str, artifact_file: str) -> None:
        record = {"op": "text", "text": text, "artifact_file": artifact_file}
        self._write_artifact(record, artifact_file)

    def log_json(self, data: Any, artifact_file: str) -> None:
        self.log_text(json.dumps(data, indent=1, default=str), artifact_file)

    def log_artifact(self, local_file: str | Path, artifact_path: str | None = None) -> None:
        record = {"op": "file", "path": str(local_file), "artifact_path": artifact_path}
        name = Path(local_file).name
        self._write_artifact(record, f"{artifact_path}/{name}" if artifact_path else name)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        self._write({"op": "dir", "path": str(local_dir), "artifact_path": artifact_path})

    def log_figure(self, figure, artifact_file: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(artifact_file).name
            figure.savefig(path, dpi=110, bbox_inches="tight")
            parent = Path(artifact_file).parent
            self.log_artifact(path, str(parent) if parent != Path(".") else None)

    def finish(self, status: str = "FINISHED") -> bool:
        """Set the run's final status once every write before it has landed: waits up to
        ``tracking.drain_timeout_s`` for a spool to drain, else leaves the status in the
        spool and says how it is replayed. True when the server has it all."""
        self._write({"op": "terminate", "status": status})
        if not self.flush():
            self.notify(
                f"tracking: {self.uri} still unreachable after "
                f"{self.settings.drain_timeout_s:g} s; {self.spool.pending} writes of run "
                f"{self.run_id} (with its final status {status}) are kept in "
                f"{self.spool.directory}: `tether sync-tracking {self.spool.directory}` "
                f"replays them (as does `tether run --resume`)"
            )
            return False
        return True

    def flush(self) -> bool:
        """Wait (up to ``tracking.drain_timeout_s``) for a spool to drain; True when empty."""
        if self.spool is None or not self.spool.pending:
            return True
        return wait_for(lambda: self._try_drain(now=True), self.settings.drain_timeout_s)

    def ui_command(self) -> str:
        return ui_command(self.uri, self.experiment_id, self.run_id)

    # -- retention ----------------------------------------------------------------------
    def _write_artifact(self, record: dict, artifact_file: str) -> None:
        """Write an artifact; a per-iteration one joins the thinning, which may skip it
        (a store that cannot delete) and deletes the older ones the rule lets go."""
        iteration = thinned_iteration(artifact_file) if self.thinning is not None else None
        if iteration is None:
            return self._write(record)
        if not self.thinning.admit(artifact_file, iteration):
            return None
        self._write(record)
        for old in self.thinning.expired(iteration):
            if self.thinning.can_delete:  # refused once: stays refused (not asked again)
                self._write({"op": "delete", "artifact_path": old})
        return None

    def _adopt_artifacts(self) -> None:
        """A reopened run: thin what its earlier processes wrote too."""
        if self.thinning is None:
            return
        try:
            self.thinning.adopt(
                lambda where: [f.path for f in self.client.list_artifacts(self.run_id, where)]
            )
        except Exception as exc:  # gone again since the replay: those stay
            if not transient(exc):
                raise

    def _delete(self, artifact_path: str) -> None:
        try:
            delete_artifact(self.client, self.run_id, self.uri, artifact_path)
        except Exception as exc:
            if transient(exc) and not deletion_refused(exc):
                raise  # the server is away: spooled, replayed later
            if self.thinning is not None and (said := self.thinning.refused(exc, artifact_path)):
                self.notify(f"tracking: run {self.run_id}: {said}")

    # -- direct or spooled ------------------------------------------------------------
    def _write(self, record: dict) -> None:
        """Apply ``record`` now, or spool it: while the spool holds anything (order), or
        when the server does not take it."""
        if self.spool is None:
            return self._apply(record)
        if self.spool.pending and not self._try_drain():
            return self.spool.append(record)
        try:
            self._apply(record)
        except Exception as exc:
            if not transient(exc):
                raise
            self.notify(
                f"tracking: {self.uri} did not take a write "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); training "
                f"goes on, spooling to {self.spool.directory} until the server is back"
            )
            self._next_probe = time.monotonic() + self.settings.probe_every_s
            self.spool.append(record)

    def _try_drain(self, now: bool = False) -> bool:
        """At most every ``probe_every_s`` (or ``now``): probe the server, replay the spool
        if it is up."""
        if not now and time.monotonic() < self._next_probe:
            return False
        self._next_probe = time.monotonic() + self.settings.probe_every_s
        if not server_healthy(self.uri, min(self.settings.http_timeout_s, 5)):
            return False
        return self._drain()

    def _drain(self) -> bool:
        """Replay the spool in order; True when it is empty (and removed)."""
        started, count = time.monotonic(), self.spool.pending
        while self.spool.pending:
            record = self.spool.records[self.spool.replayed]
            try:
                self._apply(self.spool.resolve(record))
            except Exception as exc:
                if not transient(exc):
                    raise
                return False
            self.spool.replayed += 1
        self.spool.clear()
        self.notify(
            f"tracking: {self.uri} is back; replayed {count} spooled writes in "
            f"{time.monotonic() - started:.1f} s"
        )
        return True

    def _apply(self, record: dict) -> None:
        op, client, run_id = record["op"], self.client, self.run_id
        if op == "metrics":
            items = [Metric(k, v, ts, step) for k, v, ts, step in record["metrics"]]
            for start in range(0, len(items), 1000):
                client.log_batch(run_id, metrics=items[start : start + 1000])
        elif op == "params":
            items = [Param(k, v) for k, v in record["params"].items()]
            for start in range(0, len(items), 100):
                client.log_batch(run_id, params=items[start : start + 100])
        elif op == "tags":
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in record["tags"].items()])
        elif op == "text":
            client.log_text(run_id, record["text"], record["artifact_file"])
        elif op == "file":
            client.log_artifact(run_id, record["path"], record["artifact_path"])
        elif op == "dir":
            client.log_artifacts(run_id, record["path"], record["artifact_path"])
        elif op == "delete":
            self._delete(record["artifact_path"])
        elif op == "reopen":
            client.update_run(run_id, status="RUNNING")
        elif op == "terminate":
            client.set_terminated(run_id, status=record["status"])
        else:
            raise ValueError(f"unknown tracking record {op!r}")


def sync_spool(
    directory: Path,
    settings: TrackingConfig | None = None,
    notify: Callable[[str], None] | None = None,
) -> tuple[str, int]:
    """Replay a spool left by a run that ended before its server came back: (run id,
    number of writes replayed). Raises TrackingError while the server is unreachable."""
    directory = Path(directory)
    meta_file = directory / "meta.json"
    if not meta_file.is_file():
        raise TrackingError(f"{directory} is not a tracking spool (no meta.json)")
    meta = json.loads(meta_file.read_text())
    pending = len(Spool(directory, meta["tracking_uri"], meta["run_id"]).records)
    check_tracking_reachable(meta["tracking_uri"])
    client = MlflowClient(tracking_uri=meta["tracking_uri"])
    experiment = client.get_experiment(client.get_run(meta["run_id"]).info.experiment_id)
    tracker = Tracker(
        meta["tracking_uri"],
        experiment.name,
        run_id=meta["run_id"],
        spool_root=directory.parent,
        settings=settings,
        notify=notify,
        reopen=False,
    )
    if tracker.spool.pending:
        raise TrackingError(
            f"{tracker.spool.pending} writes of {directory} could not be "
            f"replayed yet; try again when {meta['tracking_uri']} answers"
        )
    return meta["run_id"], pending


def ui_command(uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """How to look at a run (or an experiment) in the MLflow UI.  MLflow 3's UI opens in
    its GenAI mode unless the page says ``workflowType=machine_learning``; the link does."""
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    page += "?workflowType=machine_learning"
    if uri.startswith("sqlite:"):
        return (
            f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1, then open "
            f"http://127.0.0.1:5000/{page}"
        )
    return f"open {uri.rstrip('/')}/{page}"
