"""What a long run keeps on disk: its last checkpoints (and the protected ones), and its
per-iteration artifacts thinned with age.

Per-iteration artifacts are the sample transcripts (``samples/iter_N.txt``, every
``trainer.samples_every``) and the cross-score heatmaps
(``diagnostics/cross_scores_<sampling>_N.png``, every ``diagnostics.heatmap_every``).
The rule, applied when the run writes iteration ``now``'s artifact: the artifact of
iteration ``i`` is kept while

    i == 1  or  now - i < artifacts_recent  or  i % artifacts_every == 0

so a run of n iterations holds, per artifact series logged every c iterations, at most
ceil(artifacts_recent / c) + 1 + floor(n / artifacts_every) files (``artifacts_every``
0: the older ones go, a bound that does not grow with n).  The per-prompt rewards
(``prompts/``) and prompt-level MI (``prompt_mi/``) JSON files are the analysis's
inputs (report heatmaps, finding d) and are not thinned: a few kB per diagnostic point.

Deletion goes through MLflow's artifact repository of the run (``delete_artifacts``):
local directories, ``mlflow server``'s proxied artifacts (``mlflow-artifacts:``; an HTTP
DELETE), S3, GCS, Azure, HDFS, SFTP and FTP implement it.  Where the store does not
(DBFS and Databricks' model registries raise "not implemented"), the first refused
delete is said once and thinning turns to not writing: from then on only artifacts the
rule keeps for good (iteration 1 and multiples of ``artifacts_every``) are written.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import Field

from ...sections import StrictSection


class RetentionConfig(StrictSection):
    checkpoints: int = Field(
        2,
        ge=1,
        description="Checkpoints kept on disk: the newest N (iter_N.pt, about the "
        "learner's full state each: weights, optimiser, critic), plus those an alarm's "
        "rollback may return to (grounded checkpoints) while they are its targets; older "
        "ones are deleted after each new checkpoint is written.",
    )
    artifacts_recent: int = Field(
        50,
        ge=1,
        description="Per-iteration artifacts (sample transcripts samples/iter_N.txt, "
        "cross-score heatmaps diagnostics/cross_scores_*_N.png) of the last N iterations "
        "are all kept; older ones only where retention.artifacts_every says.",
    )
    artifacts_every: int = Field(
        50,
        ge=0,
        description="Of per-iteration artifacts older than retention.artifacts_recent "
        "iterations, keep those of iteration 1 and of multiples of N, delete the rest "
        "(files per series <= artifacts_recent/cadence + 1 + iterations/N; 1 = keep all; "
        "0 = keep none older, a bound that does not grow with the run).",
    )


#: the thinned artifacts: (directory, file name pattern whose group is the iteration)
THINNED = (
    ("samples", re.compile(r"iter_(\d+)\.txt")),
    ("diagnostics", re.compile(r"cross_scores_\w+_(\d+)\.png")),
)


def thinned_iteration(artifact_file: str) -> int | None:
    """The iteration of a per-iteration artifact the retention thins, else None."""
    directory, _, name = artifact_file.rpartition("/")
    for thinned_dir, pattern in THINNED:
        match = pattern.fullmatch(name) if directory == thinned_dir else None
        if match:
            return int(match.group(1))
    return None


def artifact_kept(iteration: int, now: int, recent: int, every: int) -> bool:
    """Whether iteration ``iteration``'s artifact stays once the run has written
    iteration ``now``'s (the rule in the module docstring)."""
    return iteration == 1 or now - iteration < recent or (every > 0 and iteration % every == 0)


def kept_for_good(iteration: int, every: int) -> bool:
    """Whether the rule keeps iteration ``iteration``'s artifact however long the run."""
    return iteration == 1 or (every > 0 and iteration % every == 0)


class ArtifactThinning:
    """The per-iteration artifacts one run (this process) has written, and which of them
    the rule lets go as the run goes on."""

    def __init__(self, cfg: RetentionConfig) -> None:
        self.cfg = cfg
        self.written: dict[str, int] = {}  # artifact path -> its iteration
        #: False once the store refused a delete: thin by not writing from then on
        self.can_delete = True

    def admit(self, artifact_file: str, iteration: int) -> bool:
        """Whether to write iteration ``iteration``'s ``artifact_file`` (always, unless
        the store cannot delete and the rule would delete it later); a written one is
        remembered."""
        if not self.can_delete and not kept_for_good(iteration, self.cfg.artifacts_every):
            return False
        self.written[artifact_file] = iteration
        return True

    def refused(self, exc: BaseException, artifact_path: str) -> str | None:
        """The store did not delete ``artifact_path``: from now on thin by not writing.
        The line to say, the first time only."""
        if not self.can_delete:
            return None
        self.can_delete = False
        return (
            f"the artifact store did not delete {artifact_path} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160]}); older per-iteration artifacts stay, and "
            "from now on only those retention.artifacts_every keeps for good are written"
        )

    def adopt(self, list_artifacts: Callable[[str], list[str]]) -> None:
        """Take on the thinned artifacts a run's earlier processes wrote (a resumed run):
        ``list_artifacts(directory)`` lists a directory of the run's artifacts."""
        for directory, _ in THINNED:
            for path in list_artifacts(directory):
                iteration = thinned_iteration(path)
                if iteration is not None:
                    self.written.setdefault(path, iteration)

    def expired(self, now: int) -> list[str]:
        """The artifacts written so far that the rule drops once iteration ``now``'s
        are written; forgotten here (the caller deletes them)."""
        c = self.cfg
        drop = [
            path
            for path, iteration in self.written.items()
            if not artifact_kept(iteration, now, c.artifacts_recent, c.artifacts_every)
        ]
        for path in drop:
            del self.written[path]
        return sorted(drop)


def delete_artifact(client, run_id: str, tracking_uri: str, artifact_path: str) -> None:
    """Delete one artifact (a file or a directory) of a run through MLflow's artifact
    repository of the run's artifact URI (``ArtifactRepository.delete_artifacts``)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    uri = client.get_run(run_id).info.artifact_uri
    get_artifact_repository(uri, tracking_uri=tracking_uri).delete_artifacts(artifact_path)


def deletion_refused(exc: BaseException) -> bool:
    """A store that does not implement deleting artifacts (MLflow raises
    NotImplementedError or an MlflowException "Not implemented yet")."""
    return isinstance(exc, NotImplementedError) or "not implemented" in str(exc).lower()
