"""Atomic checkpoints: write to a temporary file, then rename over the target."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def checkpoint_path(directory: Path, iteration: int) -> Path:
    return Path(directory) / f"iter_{iteration:06d}.pt"


def save_checkpoint(
    directory: Path, iteration: int, state: dict, keep: int = 2, protect: tuple[Path, ...] = ()
) -> Path:
    """Save ``state`` as ``iter_<iteration>.pt``; keep the newest ``keep`` and the
    ``protect``ed ones (a rollback's targets), delete older ones."""
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, iteration)
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    kept = {Path(p).resolve() for p in protect}
    for old in sorted(directory.glob("iter_*.pt"))[:-keep]:
        if old.resolve() not in kept:
            old.unlink(missing_ok=True)
    return path


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(Path(directory).glob("iter_*.pt"))
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


class ResumeError(ValueError):
    """The resume target names no checkpoint (the message says what was looked for)."""


def resolve_resume(target: str, tracking_uri: str) -> tuple[Path, str, dict]:
    """A checkpoint file, a directory of checkpoints, or an MLflow run id ->
    (checkpoint path, MLflow run id, the run's config as a dict)."""
    path = Path(target).expanduser()
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            nested = sorted(path.glob("checkpoints/*/iter_*.pt"), key=lambda p: p.stat().st_mtime)
            found = nested[-1] if nested else None
        if found is None:
            raise ResumeError(f"no checkpoint (iter_*.pt) under {path}")
        path = found
    elif not path.is_file():
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        try:
            run = MlflowClient(tracking_uri).get_run(target)
        except MlflowException:
            raise ResumeError(
                f"{target!r} is neither a checkpoint path nor a run id in {tracking_uri}"
            ) from None
        last = run.data.tags.get("tether.last_checkpoint")
        if not last or not Path(last).is_file():
            raise ResumeError(
                f"MLflow run {target} has no checkpoint on this machine "
                f"(tag tether.last_checkpoint = {last!r})"
            )
        path = Path(last)
    driver = load_checkpoint(path)["driver"]
    return path, driver["run_id"], driver["config"]
