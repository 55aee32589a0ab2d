"""Run records: the analyses' input (``RunData``) kept in a file, outside any MLflow store.

A sweep too long for one sitting of a machine runs in parts, each part on a fresh machine
with its own MLflow store; what the analyses need from each part's finished trials
(params, tags, the metric histories ``source.WANTED`` keeps, alarms, prompt-level rewards
and MI) is exported to a record file, and the parts are pooled by naming the files as
targets::

    tether analyze paper <parent> --tracking-uri sqlite:///.../mlflow.db \\
        --export part1.json.gz
    tether analyze paper part1.json.gz part2.json.gz --table
    tether report part1.json.gz

A record is the analyses' view of a run, not a copy of the run: figures, checkpoints and
the metrics the analyses do not read stay in the store it came from.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, fields
from pathlib import Path

from .runs import RunData

FORMAT = "tether.run-records/1"
SUFFIXES = (".json", ".json.gz")


def is_record_file(target: str) -> bool:
    """A target that names a record file (an existing ``*.json`` or ``*.json.gz``)."""
    return target.endswith(SUFFIXES) and Path(target).is_file()


def _encode(run: RunData) -> dict:
    data = asdict(run)
    # JSON keys are strings: steps and iterations are written as such and read back as int
    data["metrics"] = {k: {str(s): v for s, v in pts.items()} for k, pts in run.metrics.items()}
    return data


def _decode(data: dict) -> RunData:
    known = {f.name for f in fields(RunData)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)} (a newer record format?)")
    data = dict(data)
    data["metrics"] = {
        k: {int(s): float(v) for s, v in pts.items()} for k, pts in data.get("metrics", {}).items()
    }
    for name in ("prompts", "prompt_mi"):
        data[name] = {int(it): groups for it, groups in data.get(name, {}).items()}
    return RunData(**data)


def dump(runs: list[RunData], path: str | Path, source: dict | None = None) -> Path:
    """Write ``runs`` to ``path`` (gzip-compressed when it ends in ``.gz``); ``source``
    says where they came from (tracking URI, target), kept beside them."""
    path = Path(path)
    if not path.name.endswith(SUFFIXES):
        raise ValueError(f"{path}: a record file's name ends in {' or '.join(SUFFIXES)}")
    text = json.dumps(
        {"format": FORMAT, "source": source or {}, "runs": [_encode(r) for r in runs]},
        sort_keys=True,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        # no name or time in the header: the same runs give the same bytes (a part
        # committed twice is no change)
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)
    return path


def load(path: str | Path) -> list[RunData]:
    """The runs of a record file; ValueError (one line: what, where) when it is not one."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        data = json.loads(raw)
    except (OSError, EOFError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable record file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: not a Tether run record (format {found!r}, want {FORMAT!r})")
    try:
        return [_decode(r) for r in data["runs"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: a malformed run record ({exc})") from None


def warm_starts(targets: list[str]) -> dict[str, list[str] | None]:
    """Each record target's warm starts by content: the sha256 lines of the
    ``<record>.warmstart.sha256`` file written beside it when its part ended
    (experiments/verdicts/run_part.sh), or None where there is none.  The same seed's warm
    start rebuilt on another machine need not have the same weights, so runs pooled as if
    they began from one policy are checked by these, not by the cache key."""
    out: dict[str, list[str] | None] = {}
    for target in filter(is_record_file, targets):
        path = Path(target)
        stem = path.name.removesuffix(".gz").removesuffix(".json")
        sidecar = path.with_name(stem + ".warmstart.sha256")
        out[path.name] = sidecar.read_text().splitlines() if sidecar.is_file() else None
    return out


def one_warm_start(hashes: dict[str, list[str] | None]) -> str | None:
    """Why records that must share one warm start (a sweep's parts over one seed) do not,
    or None when every one of them names the same single warm start."""
    unknown = [name for name, lines in hashes.items() if lines is None]
    if unknown:
        return f"no warm-start hash beside {', '.join(unknown)}"
    distinct = {line.split()[0] for lines in hashes.values() for line in lines}
    if len(distinct) > 1:
        return f"{len(distinct)} different warm starts across {', '.join(hashes)}"
    return None


def seeds_share_warm_starts(
    hashes: dict[str, list[str] | None], seeds_of: dict[str, set[str]]
) -> str | None:
    """Why records that hold runs of one seed do not all begin from one warm start, or None.

    A seed's arms are paired: a_d's 0 % arms with c's noisy arms of the same seed, which run
    in parts of their own.  The pairs hold only when both parts began from the same weights
    (``hashes``, as ``warm_starts`` gives them; ``seeds_of``: each record's seeds)."""
    by_seed: dict[str, list[str]] = {}
    for name, seeds in seeds_of.items():
        for seed in seeds:
            by_seed.setdefault(seed, []).append(name)
    for seed, names in sorted(by_seed.items()):
        if len(names) > 1 and (why := one_warm_start({n: hashes.get(n) for n in names})):
            return f"seed {seed}: {why}"
    return None


def repeated(runs: list[RunData]) -> list[list[str]]:
    """Groups of runs with the same params: one trial counted twice (a part exported
    twice, or a seed rerun after its first runs were exported). Paired analyses would
    keep one of them silently."""
    by_params: dict[tuple, list[str]] = {}
    for run in runs:
        by_params.setdefault(tuple(sorted(run.params.items())), []).append(run.name)
    return [names for names in by_params.values() if len(names) > 1]


def complete_seeds(runs: list[RunData]) -> tuple[list[RunData], list[str]]:
    """The finished runs of the seeds that finished every arm, and the seeds left out.

    An arm is a combination of the params that vary between the runs other than
    ``experiment.seed``; the arms are those any run has, finished or not. A part of a
    sweep cut short leaves a seed with some arms only: exported, its rerun in a later part
    would count those twice (``repeated``), and its pairs would span two machines. A trial
    that never started left no run to name its arm: a part's sweep must have ended
    cleanly (``run_part.sh`` exports only then)."""
    varying = sorted(
        k
        for k in {k for r in runs for k in r.params}
        if k != "experiment.seed" and len({r.params.get(k) for r in runs}) > 1
    )

    def arm(run: RunData) -> tuple:
        return tuple(run.params.get(k) for k in varying)

    def seed(run: RunData) -> str:
        return str(run.params.get("experiment.seed"))

    every = {arm(r) for r in runs}  # a trial killed or failed still names its arm
    done: dict[str, set] = {}
    for run in runs:
        if run.status == "FINISHED":
            done.setdefault(seed(run), set()).add(arm(run))
    left_out = sorted({seed(r) for r in runs if done.get(seed(r)) != every})
    return [r for r in runs if r.status == "FINISHED" and seed(r) not in left_out], left_out


def export(runs: list[RunData], path: str | Path, source: dict) -> str:
    """Write the finished runs of the seeds whose every arm finished (``complete_seeds``)
    to ``path``; what was written and left out, in words. ValueError when no seed did."""
    kept, cut = complete_seeds(runs)
    if not kept:
        raise ValueError(f"no seed finished every arm (seeds left out: {cut}); nothing written")
    return f"{len(kept)} runs -> {dump(kept, path, source)}; seeds left out: {cut or 'none'}"


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start : start + size]


def restore(runs: list[RunData], tracking_uri: str, experiment: str, parent_name: str) -> str:
    """Log ``runs`` to an MLflow store as the children of one new parent run (params,
    tags, metric histories, alarms, prompt records in the layout training writes), so
    MLflow's UI compares runs whose stores are gone, e.g. the parts of a sweep pooled from
    their records. Returns the parent's run id. The store's runs read back as the records
    did, apart from their new run ids and MLflow's own tags. A new experiment in a SQLite
    store keeps its artifacts beside the database (``artifacts/``), not in the working
    directory's ``mlruns``; a server's store decides for itself."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from ..store import ensure_experiment

    client = MlflowClient(tracking_uri)
    sqlite = "sqlite:///"
    root = (
        Path(tracking_uri[len(sqlite) :]).parent / "artifacts"
        if tracking_uri.startswith(sqlite)
        else None
    )
    experiment_id = ensure_experiment(client, experiment, root)
    parent = client.create_run(
        experiment_id, run_name=parent_name, tags={"tether.restored_runs": str(len(runs))}
    ).info.run_id
    for run in runs:
        tags = {k: v for k, v in run.tags.items() if not k.startswith("mlflow.")}
        tags.update({"mlflow.parentRunId": parent, "tether.restored_from_run": run.run_id})
        run_id = client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
        metrics = [
            Metric(key, value, 0, step)
            for key, points in run.metrics.items()
            for step, value in sorted(points.items())
        ]
        for chunk in _chunks(metrics, 1000):  # MLflow's limits per log_batch call
            client.log_batch(run_id, metrics=chunk)
        for chunk in _chunks([Param(k, v) for k, v in run.params.items()], 100):
            client.log_batch(run_id, params=chunk)
        if run.alarms:
            client.log_dict(run_id, run.alarms, "alarms.json")
        for folder, by_iteration in (("prompts", run.prompts), ("prompt_mi", run.prompt_mi)):
            for it, groups in by_iteration.items():
                data = {"iteration": it, "groups": groups}
                client.log_dict(run_id, data, f"{folder}/iter_{it:04d}.json")
        client.set_terminated(run_id, run.status)
    client.set_terminated(parent, "FINISHED")
    return parent
