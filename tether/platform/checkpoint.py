"""Atomic checkpoints: write to a temporary file, then rename over the target."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def save_checkpoint(directory: Path, iteration: int, state: dict, keep: int = 2) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"iter_{iteration:06d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in sorted(directory.glob("iter_*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(Path(directory).glob("iter_*.pt"))
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)
