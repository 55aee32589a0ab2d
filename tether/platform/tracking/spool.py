"""The tracking spool's storage: the writes of one run that await the server, in order
and on disk (``tracking.Tracker`` decides when to spool and replays)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


class Spool:
    """The writes of one run that await the server: ``spool.jsonl`` (one JSON record a
    line, appended and fsynced in order) and ``files/<n>/`` (copies of artifact files,
    so the originals may change or go). ``meta.json`` names the tracking URI and run."""

    def __init__(self, directory: Path, uri: str, run_id: str) -> None:
        self.directory, self.file = Path(directory), Path(directory) / "spool.jsonl"
        self.meta = {"tracking_uri": uri, "run_id": run_id}
        self.records: list[dict] = []
        if self.file.is_file():  # left by an earlier process of this run
            self.records = [
                json.loads(line) for line in self.file.read_text().splitlines() if line.strip()
            ]
        self.replayed = 0  # records already replayed by this process

    @property
    def pending(self) -> int:
        return len(self.records) - self.replayed

    def append(self, record: dict) -> None:
        """Store ``record`` durably; a file or directory it names (``path``) is copied in."""
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = self.directory / "meta.json"
        if not meta.exists():
            meta.write_text(json.dumps(self.meta, indent=1))
        if "path" in record:
            source = Path(record["path"])
            target = self.directory / "files" / str(len(self.records)) / source.name
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)
            record = {**record, "path": str(target.relative_to(self.directory))}
        with self.file.open("a") as out:
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())
        self.records.append(record)

    def resolve(self, record: dict) -> dict:
        """The record with its ``path`` made absolute again."""
        return (
            {**record, "path": str(self.directory / record["path"])} if "path" in record else record
        )

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        self.records, self.replayed = [], 0
