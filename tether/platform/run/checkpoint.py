"""Atomic checkpoints: write to a temporary file, then rename over the target."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def checkpoint_path(directory: Path, iteration: int) -> Path:
    return Path(directory) / f"iter_{iteration:06d}.pt"


class CheckpointError(OSError):
    """A checkpoint could not be written; the message names the error and the last good
    checkpoint, which is intact (the partial file was removed)."""


def save_checkpoint(
    directory: Path, iteration: int, state: dict, keep: int = 2, protect: tuple[Path, ...] = ()
) -> Path:
    """Save ``state`` as ``iter_<iteration>.pt``; keep the newest ``keep`` and the
    ``protect``ed ones (a rollback's targets), delete older ones.

    The state is written to ``iter_<iteration>.pt.tmp``, flushed to disk, and renamed
    over the target, so a checkpoint is complete or absent; older ones are pruned only
    after that. A write that fails (a full disk: ENOSPC, any OS error) removes the
    temporary file and raises CheckpointError naming the last good checkpoint."""
    path = checkpoint_path(directory, iteration)
    tmp = path.with_suffix(".pt.tmp")
    out = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            out = _ErrorKeepingWriter(handle)
            torch.save(state, out)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as raised:
        # torch's zip writer swallows the OSError of a failed write (ENOSPC) and raises
        # "unexpected pos ..." instead: name the OS error the write really hit.
        exc = out.error if out is not None and out.error is not None else raised
        tmp.unlink(missing_ok=True)
        last = latest_checkpoint(directory) if directory.is_dir() else None
        error = CheckpointError(
            f"checkpoint of iteration {iteration} not written to {path} "
            f"({type(exc).__name__}: {exc}); last good checkpoint: "
            f"{last or 'none yet'}"
        )
        error.errno, error.last_good = getattr(exc, "errno", None), last
        raise error from raised
    kept = {Path(p).resolve() for p in protect}
    for old in sorted(directory.glob("iter_*.pt"))[:-keep]:
        if old.resolve() not in kept:
            old.unlink(missing_ok=True)
    return path


class _ErrorKeepingWriter:
    """A file's ``write`` for ``torch.save`` that keeps the first OSError it raised."""

    def __init__(self, handle) -> None:
        self.handle, self.error = handle, None

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.handle.flush()


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(Path(directory).glob("iter_*.pt"))
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


class ResumeError(ValueError):
    """The resume target names no checkpoint (the message says what was looked for), or
    the resumed config cannot load it."""


def check_same_parameters(saved: dict, model_cfg) -> None:
    """Refuse, in one line, a resume whose overrides change the policy's parameters
    (``model.path``, ``model.size``, adding or dropping ``model.lora``, or its rank or
    target layers): the checkpoint's weights and optimiser state would not load."""
    before, after = saved.get("model", {}), model_cfg.model_dump(mode="json")
    for key in ("path", "size"):
        if before.get(key) != after.get(key):
            raise ResumeError(
                f"model.{key} was {before.get(key)!r} in the checkpoint's run and is "
                f"{after.get(key)!r} now; a resumed run keeps its model (start a new run instead)"
            )
    lora_before, lora_after = before.get("lora"), after.get("lora")
    if (lora_before is None) != (lora_after is None):
        written = "without" if lora_before is None else "with"
        raise ResumeError(
            f"the checkpoint was written {written} model.lora, and this resume "
            f"{'adds' if lora_before is None else 'drops'} it; a resumed run cannot change "
            "what it trains (start a new run from the saved model with model.path instead)"
        )
    if lora_before is not None:
        for key in ("r", "target_modules"):
            if lora_before.get(key) != lora_after.get(key):
                raise ResumeError(
                    f"model.lora.{key} was {lora_before.get(key)!r} in the checkpoint's run "
                    f"and is {lora_after.get(key)!r} now; the adapters would not load"
                )


def resolve_resume(target: str, tracking_uri: str) -> tuple[Path, str, dict]:
    """A checkpoint file, a directory of checkpoints, or an MLflow run id ->
    (checkpoint path, MLflow run id, the run's config as a dict)."""
    path = Path(target).expanduser()
    if path.is_dir():
        # The run's own checkpoint directory, the output directory's ``checkpoints/``
        # (one subdirectory per run) or the output directory itself: the newest there.
        found = latest_checkpoint(path)
        if found is None:
            nested = [*path.glob("*/iter_*.pt"), *path.glob("checkpoints/*/iter_*.pt")]
            found = max(nested, key=lambda p: p.stat().st_mtime) if nested else None
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
