"""Read Tether runs from MLflow into ``RunData`` (the only MLflow-aware analysis code).

A target is a run id (a training run, or a sweep's parent: its children), an
experiment name (its Tether runs), or a record file (``records``: runs exported from a
store, read without one). A Tether training run carries the ``tether.env`` tag
the driver sets; sweep parents carry ``tether.kind = sweep``.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ..store import metric_history
from .runs import DIAGNOSTICS, RunData

#: Metric keys the analyses and the monitor read (everything else is left in MLflow).
WANTED = re.compile(
    r"^(rollout/|filter/|val/|grad_snr/|async/|mechanism/|actor/entropy$|collapse/reasoning_token_entropy$"
    r"|collapse/[^/]+/(("
    + "|".join(DIAGNOSTICS)
    + r")(_ci_low|_ci_high|_null_q95)?|p_grounded|grounded"
    r"|num_pairs|valid_reasoning_rate)$|collapse/[^/]+/(za|xa)/mi_estimate$|grounding/)"
)


class ReportError(RuntimeError):
    """The target cannot be analysed (one line: what, where, what to do)."""


@dataclass
class Target:
    kind: str  # run | sweep | experiment | records
    label: str
    experiment_id: str
    runs: list  # mlflow Run objects of the training runs
    log_to: str | None  # the run that receives the report's artifacts
    #: a sweep's swept fields -> their base values (what one-at-a-time trials vary from)
    sweep_base: dict | None = None


def is_tether_run(run) -> bool:
    return "tether.env" in run.data.tags


def _search(client: MlflowClient, experiment_ids: list[str], filter_string: str = ""):
    runs, token = [], None
    while True:
        page = client.search_runs(
            experiment_ids,
            filter_string,
            max_results=1000,
            page_token=token,
            order_by=["attributes.start_time ASC"],
        )
        runs += list(page)
        token = page.token
        if not token:
            return runs


def resolve(client: MlflowClient, target: str) -> Target:
    """A run id, a sweep parent's run id, or an experiment name -> its training runs."""
    run = None
    if re.fullmatch(r"[0-9a-f]{32}", target):
        try:
            run = client.get_run(target)
        except MlflowException:
            run = None
    if run is not None:
        if is_tether_run(run):
            return Target(
                "run", run.info.run_name or target, run.info.experiment_id, [run], run.info.run_id
            )
        children = [
            r
            for r in _search(
                client, [run.info.experiment_id], f"tags.mlflow.parentRunId = '{target}'"
            )
            if is_tether_run(r)
        ]
        if not children:
            raise ReportError(
                f"run {target} is neither a Tether training run nor a sweep "
                f"parent with Tether trials"
            )
        return Target(
            "sweep",
            run.info.run_name or target,
            run.info.experiment_id,
            children,
            run.info.run_id,
            sweep_base(client, target),
        )
    experiment = client.get_experiment_by_name(target)
    if experiment is None:
        raise ReportError(
            f"{target!r} is not a run id or an experiment name in "
            f"{client.tracking_uri} (list them with `mlflow ui` or "
            f"`mlflow experiments search`)"
        )
    runs = [r for r in _search(client, [experiment.experiment_id]) if is_tether_run(r)]
    if not runs:
        raise ReportError(
            f"experiment {target!r} has no Tether runs (runs tagged tether.env by "
            f"`tether run` or `tether sweep`)"
        )
    return Target("experiment", target, experiment.experiment_id, runs, None)


def sweep_base(client: MlflowClient, parent_run_id: str) -> dict | None:
    """A one-at-a-time sweep's base value of every swept field, as the sweep logged it on
    its parent (``sweep_base.json``); None for other designs, whose trials vary every
    field at once, and for a sweep that did not log it (the runs' values are used)."""
    data = _download_json(client, parent_run_id, "sweep_base.json")
    return data if isinstance(data, dict) else None


def _download_json(client: MlflowClient, run_id: str, path: str):
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = client.download_artifacts(run_id, path, tmp)
        except (MlflowException, OSError):
            return None
        return json.loads(Path(local).read_text())


def _artifact_iterations(client: MlflowClient, run_id: str, folder: str) -> dict[int, str]:
    """iteration -> path of each ``<folder>/iter_N.json`` artifact of a run."""
    try:
        return {
            int(m.group(1)): f.path
            for f in client.list_artifacts(run_id, folder)
            if (m := re.search(r"iter_(\d+)\.json$", f.path))
        }
    except (MlflowException, OSError):
        return {}


def load_run(
    client: MlflowClient,
    run,
    with_prompts: bool = True,
    wanted: re.Pattern = WANTED,
    with_prompt_mi: bool = True,
) -> RunData:
    """A run's params, tags, wanted metric histories, alarms, (optionally) the
    prompt-level rewards of the early / mid / late iterations the heatmaps show, and
    (optionally) the prompt-level MI of every diagnosed iteration (finding d's quartiles)."""
    from .views import stage_iterations

    run_id = run.info.run_id
    metrics = {
        key: metric_history(client, run_id, key) for key in run.data.metrics if wanted.match(key)
    }
    alarms = []
    if any(k.startswith("alarm.") for k in run.data.tags):
        alarms = _download_json(client, run_id, "alarms.json") or []
    prompts = {}
    if with_prompts:
        try:
            files = {
                int(m.group(1)): f.path
                for f in client.list_artifacts(run_id, "prompts")
                if (m := re.search(r"iter_(\d+)\.json$", f.path))
            }
        except (MlflowException, OSError):
            files = {}
        if files:
            for it in set(stage_iterations(list(files)).values()):
                data = _download_json(client, run_id, files[it])
                if data:
                    prompts[it] = data["groups"]
    prompt_mi = {}
    if with_prompt_mi:
        for it, path in sorted(_artifact_iterations(client, run_id, "prompt_mi").items()):
            data = _download_json(client, run_id, path)
            if data:
                prompt_mi[it] = data["groups"]
    return RunData(
        run_id=run_id,
        name=run.info.run_name or run_id[:8],
        status=run.info.status,
        params=dict(run.data.params),
        tags=dict(run.data.tags),
        metrics=metrics,
        alarms=alarms,
        prompts=prompts,
        prompt_mi=prompt_mi,
    )


def load_target(
    tracking_uri: str | None, target: str, with_prompts: bool = True
) -> tuple[Target, list[RunData]]:
    from ..store import TrackingError, check_tracking_reachable
    from . import records

    if records.is_record_file(target):
        try:
            runs = records.load(target)
        except ValueError as exc:
            raise ReportError(str(exc)) from None
        if not runs:
            raise ReportError(f"record file {target} holds no runs")
        return Target("records", Path(target).name, "", [], None), runs
    if tracking_uri is None:
        raise ReportError(f"{target!r} is not a record file; name the store (--tracking-uri)")

    try:
        check_tracking_reachable(tracking_uri)
    except TrackingError as exc:
        raise ReportError(str(exc)) from None
    client = MlflowClient(tracking_uri=tracking_uri)
    resolved = resolve(client, target)
    return resolved, [load_run(client, r, with_prompts) for r in resolved.runs]
