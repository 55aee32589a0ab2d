"""Reading and addressing an MLflow store, below both the run's tracker
(``platform/tracking/tracker.py``, which writes) and the analyses (``analysis/``, which
read): the experiment a run goes to, a metric's history, whether a server answers."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient


class TrackingError(RuntimeError):
    """The tracking server cannot be used (the message says which and what to do)."""


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def metric_history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    """{step: value}, the last value logged at each step (a resumed run may log a step
    twice; the later write wins, by timestamp)."""
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
    return {int(m.step): float(m.value) for m in history}


def check_tracking_reachable(uri: str, timeout: float = 5.0) -> None:
    """Fail fast with one clear line when an HTTP tracking server does not answer."""
    if not is_http(uri):
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise TrackingError(
            f"MLflow tracking server {uri} is unreachable ({exc}); start it "
            f"with `mlflow server` or drop tracking.uri to use local SQLite"
        ) from None


def server_healthy(uri: str, timeout: float) -> bool:
    """One cheap ``GET /health`` (a SQLite or file URI has no server: always True)."""
    if not is_http(uri):
        return True
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


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
