"""Checkpoints that cannot be half-written: a disk that fills during a checkpoint.

First on a real full filesystem (a 1 MiB tmpfs mounted in an unprivileged user and
mount namespace, ``unshare -Urm``), then in training runs where the checkpoint's file
hits ENOSPC after part of it is written (an injected ``OSError(errno.ENOSPC)`` at the
write: the partial file is really on disk), with ``trainer.checkpoint_errors`` warn and
stop. Either way the previous checkpoint loads and no temporary file is left.
"""

from __future__ import annotations

import errno
import io
import shutil
import subprocess
import sys
import textwrap

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import checkpointed_run_config
from tether.platform.run import checkpoint as checkpoint_module
from tether.platform.run.checkpoint import CheckpointError, load_checkpoint

FULL_DISK = textwrap.dedent("""
    import errno, subprocess, sys, torch
    from pathlib import Path
    from tether.platform.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    root = Path(sys.argv[1])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], check=True)
    state = {"weights": torch.zeros(100_000)}  # ~400 KB: two fit in 1 MiB, a third does not
    save_checkpoint(root, 1, state)
    save_checkpoint(root, 2, state)
    try:
        save_checkpoint(root, 3, state)
    except CheckpointError as exc:
        assert exc.errno == errno.ENOSPC, exc
        assert str(root / "iter_000002.pt") in str(exc), exc
        assert sorted(p.name for p in root.iterdir()) == ["iter_000001.pt", "iter_000002.pt"]
        assert torch.equal(load_checkpoint(root / "iter_000002.pt")["weights"], state["weights"])
        print("ok:", exc)
    else:
        raise AssertionError("the third checkpoint fit on a 1 MiB filesystem")
""")


def test_full_tmpfs_keeps_the_last_good_checkpoint(tmp_path):
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-Urm", "true"], capture_output=True).returncode != 0
    ):
        pytest.skip("no unprivileged user namespaces here (unshare -Urm)")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(
        ["unshare", "-Urm", sys.executable, "-c", FULL_DISK, str(mount_point)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No space left on device" in done.stdout


class DiskFullAt:
    """``open`` for the checkpoint module whose n-th write-open gives a file that takes
    ``room`` bytes, then raises ENOSPC as a full disk does."""

    def __init__(self, nth: int, room: int = 64 * 1024):
        self.nth, self.room, self.opened = nth, room, 0

    def __call__(self, path, mode="r", *args, **kwargs):
        handle = open(path, mode, *args, **kwargs)
        if "w" in mode:
            self.opened += 1
            if self.opened == self.nth:
                return _FullFile(handle, self.room)
        return handle


class _FullFile(io.RawIOBase):
    def __init__(self, handle, room):
        self.handle, self.room = handle, room

    def writable(self):
        return True

    def write(self, data):
        if len(data) > self.room:
            self.handle.write(bytes(data[: self.room]))
            self.handle.flush()
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.handle.write(data)

    def fileno(self):
        return self.handle.fileno()

    def flush(self):
        self.handle.flush()

    def close(self):
        super().close()  # (flushes)
        self.handle.close()


ITERATIONS = 3


def _trainer(tmp_path, models_dir, policy, on_event=None):
    from tether.platform.run.trainer import Trainer

    cfg = checkpointed_run_config(
        tmp_path,
        models_dir,
        ITERATIONS,
        trainer={"samples_per_log": 0, "checkpoint_errors": policy},
    )
    return Trainer(cfg, on_event)


def test_disk_full_with_warn_keeps_training(
    micro_policy, models_dir, ray_local, tmp_path, monkeypatch
):
    monkeypatch.setattr(checkpoint_module, "open", DiskFullAt(2), raising=False)
    events = []
    trainer = _trainer(tmp_path, models_dir, "warn", lambda kind, data: events.append((kind, data)))
    summary = trainer.run()
    assert summary.status == "FINISHED" and summary.iterations == ITERATIONS
    directory = tmp_path / "runs" / "checkpoints" / summary.run_id
    warned = [d["message"] for kind, d in events if kind == "checkpoint_failed"]
    assert len(warned) == 1 and "iteration 2" in warned[0]
    assert str(directory / "iter_000001.pt") in warned[0] and "No space left" in warned[0]
    # iteration 2's partial file is gone; 1 stayed the last good one until 3 was written
    assert sorted(p.name for p in directory.iterdir()) == ["iter_000001.pt", "iter_000003.pt"]
    assert load_checkpoint(directory / "iter_000001.pt")["driver"]["iteration"] == 1
    run = MlflowClient(summary.tracking_uri).get_run(summary.run_id)
    assert "No space left" in run.data.tags["tether.checkpoint_error"]
    assert run.data.tags["tether.last_checkpoint"] == str(directory / "iter_000003.pt")


@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_disk_full_with_stop_ends_the_run_cleanly(
    micro_policy, models_dir, ray_local, tmp_path, monkeypatch
):
    monkeypatch.setattr(checkpoint_module, "open", DiskFullAt(2), raising=False)
    trainer = _trainer(tmp_path, models_dir, "stop")
    with pytest.raises(CheckpointError) as failed:
        trainer.run()
    directory = tmp_path / "runs" / "checkpoints" / trainer.tracker.run_id
    assert str(directory / "iter_000001.pt") in str(failed.value)
    assert sorted(p.name for p in directory.iterdir()) == ["iter_000001.pt"]
    assert load_checkpoint(directory / "iter_000001.pt")["driver"]["iteration"] == 1
    run = MlflowClient(trainer.tracker.uri).get_run(trainer.tracker.run_id)
    assert run.info.status == "FAILED" and run.data.tags["tether.iterations_done"] == "2"
    assert run.data.tags["tether.last_checkpoint"] == str(directory / "iter_000001.pt")
