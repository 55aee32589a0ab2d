"""MLflow tracking: one MLflow run per training run, SQLite by default.

All writes go through ``MlflowClient`` with an explicit run id, so nothing depends
on MLflow's process-global "active run" (Ray Tune trials share a process).
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

_INVALID_KEY_CHARS = re.compile(r"[^/\w.\- :]")
_MAX_PARAM_VALUE = 6000


class TrackingError(RuntimeError):
    """The tracking server cannot be used (the message says which and what to do)."""


def metric_key(name: str) -> str:
    """An MLflow-safe metric name (``retrieval_acc@2`` -> ``retrieval_acc_at_2``)."""
    return _INVALID_KEY_CHARS.sub("_", name.replace("@", "_at_"))


def default_tracking_uri(output_dir: Path) -> str:
    return f"sqlite:///{(Path(output_dir).expanduser().resolve() / 'mlflow.db').as_posix()}"


def metric_history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    """{step: value}, the last value logged at each step (a resumed run may log a step
    twice; the later write wins, by timestamp)."""
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
    return {int(m.step): float(m.value) for m in history}


def check_tracking_reachable(uri: str, timeout: float = 5.0) -> None:
    """Fail fast with one clear line when an HTTP tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise TrackingError(
            f"MLflow tracking server {uri} is unreachable ({exc}); start it "
            f"with `mlflow server` or drop tracking.uri to use local SQLite"
        ) from None


#: MLflow 3's UI opens an experiment by its kind; untagged ones may open on the GenAI
#: "Overview" (traces, token usage).  Tether's are model training: open on the runs.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def ensure_experiment(client: MlflowClient, name: str, artifact_root: Path | None) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        location = artifact_root.resolve().as_uri() if artifact_root is not None else None
        try:
            experiment_id = client.create_experiment(
                name, artifact_location=location, tags=EXPERIMENT_KIND
            )
        except mlflow.exceptions.MlflowException:
            # Created concurrently by another process (sweep trials).
            experiment_id = client.get_experiment_by_name(name).experiment_id
    else:
        experiment_id = experiment.experiment_id
        if not any(experiment.tags.get(k) for k in EXPERIMENT_KIND):  # an older Tether's
            for key, value in EXPERIMENT_KIND.items():
                client.set_experiment_tag(experiment_id, key, value)
    return experiment_id


class Tracker:
    """Writes one run: params, per-iteration metrics, tags, text and file artifacts."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        artifact_root: Path | None = None,
        run_name: str | None = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        check_tracking_reachable(uri)
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = ensure_experiment(self.client, experiment, artifact_root)
        if run_id is not None:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            all_tags = dict(tags or {})
            if run_name:
                all_tags["mlflow.runName"] = run_name
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=run_name)
            self.run_id = run.info.run_id

    def log_params(self, params: dict[str, Any]) -> None:
        items = [Param(k, str(v)[:_MAX_PARAM_VALUE]) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        items = [
            Metric(metric_key(k), float(v), now, int(step))
            for k, v in metrics.items()
            if v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))
        ]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def set_tags(self, tags: dict[str, Any]) -> None:
        items = [RunTag(k, str(v)) for k, v in tags.items()]
        if items:
            self.client.log_batch(self.run_id, tags=items)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_json(self, data: Any, artifact_file: str) -> None:
        self.log_text(json.dumps(data, indent=1, default=str), artifact_file)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def log_figure(self, figure, artifact_file: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(artifact_file).name
            figure.savefig(path, dpi=110, bbox_inches="tight")
            self.client.log_artifact(
                self.run_id,
                str(path),
                str(Path(artifact_file).parent)
                if Path(artifact_file).parent != Path(".")
                else None,
            )

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)

    def ui_command(self) -> str:
        return ui_command(self.uri, self.experiment_id, self.run_id)


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
