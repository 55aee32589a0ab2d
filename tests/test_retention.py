"""Retention: a long run's disk stays bounded.

Checkpoints keep the newest ``retention.checkpoints`` (and the protected ones); sample
transcripts and cross-score heatmaps are thinned with age by the stated rule (all of the
last ``artifacts_recent`` iterations, then iteration 1 and multiples of
``artifacts_every``), on a local store, through a real ``mlflow server`` (proxied
artifacts: an HTTP DELETE) and across a resume; a store that cannot delete is thinned
by not writing. Expected sets are written out by hand from the rule.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from mlflow.exceptions import MlflowException
from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
from mlflow.tracking import MlflowClient

from tether.platform.config import build_config
from tether.platform.run.diagnosis import Diagnosis
from tether.platform.run.launch import open_tracker
from tether.platform.run.stages import log_samples

ITERATIONS = 120


def _artifacts(client, run_id, path=None):
    out = []
    for item in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def _trajectories():
    return [
        SimpleNamespace(
            group_id=g,
            sample_index=k,
            env_seed=100 + g,
            reward=float(k % 2),
            success=bool(k % 2),
            token_ids=[1, 2, 3],
            turns=[],
        )
        for g in range(2)
        for k in range(2)
    ]


class HeatmapLearner:
    """``learner.diagnose`` as the diagnosis stage sees it: a 4 x 2 cross-score matrix
    per sampling when heatmaps are due."""

    def diagnose(self, collected, cfg, ema_state, seed, heatmaps_due, chain_due):
        scores = np.arange(8.0).reshape(4, 2)
        matrices = {s: (scores, np.array([0, 0, 1, 1])) for s in cfg.samplings}
        return SimpleNamespace(
            ema_state={},
            prompt_mi={},
            matrices=matrices if heatmaps_due else {},
            metrics={"collapse/mi_estimate": 0.1},
        )


def _write_iterations(tracker, cfg, iterations):
    """Iterations' sample transcripts, per-prompt rewards and heatmaps, as the driver
    writes them (``stages.log_samples``, ``Diagnosis.run``) at the config's cadences."""
    diagnosis, learner = Diagnosis(cfg.diagnostics, cfg.experiment.seed), HeatmapLearner()
    for it in iterations:
        diagnosis.run(it, _trajectories(), learner, tracker)
        log_samples(tracker, cfg.trainer, it, _trajectories(), lambda ids: "text")


def _config(tmp_path, *overrides):
    # Heatmaps every 10th iteration (diagnostics every 5): the cadence the sets kept below
    # are worked out for, whatever the defaults are.
    return build_config(
        {"experiment": {"output_dir": str(tmp_path / "out"), "name": "retention"}},
        [
            f"trainer.iterations={ITERATIONS}",
            "diagnostics.samplings=[first_turn]",
            "diagnostics.every=5",
            "diagnostics.heatmap_every=10",
            *overrides,
        ],
    )


def _open(cfg, tmp_path, resume_run_id=None):
    return open_tracker(cfg, tmp_path / "out", lambda kind, data: None, None, {}, resume_run_id)


def _thinned(files):
    samples = {f for f in files if f.startswith("samples/")}
    heatmaps = {f for f in files if f.startswith("diagnostics/")}
    return samples, heatmaps


# By hand, defaults (artifacts_recent 50, artifacts_every 50), 120 iterations: the last
# 50 iterations are 71..120; older ones stay at iteration 1 and at 50.
SAMPLES_KEPT = {f"samples/iter_{i:04d}.txt" for i in (1, 50, *range(75, 121, 5))}
HEATMAPS_KEPT = {
    f"diagnostics/cross_scores_first_turn_{i:04d}.png" for i in (1, 50, 80, 90, 100, 110, 120)
}
PROMPTS_ALL = {f"prompts/iter_{i:04d}.json" for i in (1, *range(5, 121, 5))}


def test_a_local_store_keeps_the_recent_artifacts_and_one_in_fifty(tmp_path):
    cfg = _config(tmp_path)
    tracker = _open(cfg, tmp_path)
    _write_iterations(tracker, cfg, range(1, ITERATIONS + 1))
    files = _artifacts(MlflowClient(cfg.tracking_uri()), tracker.run_id)
    samples, heatmaps = _thinned(files)
    assert samples == SAMPLES_KEPT  # 12 of the 25 written
    assert heatmaps == HEATMAPS_KEPT  # 7 of the 13 written
    # the analysis' inputs are not thinned
    assert {f for f in files if f.startswith("prompts/")} == PROMPTS_ALL
    # the files are gone from disk, not only from a listing
    on_disk = {p.name for p in (tmp_path / "out" / "artifacts").rglob("iter_*.txt")}
    assert on_disk == {f.split("/")[-1] for f in SAMPLES_KEPT}


def test_the_rule_by_hand():
    from tether.platform.tracking.retention import ArtifactThinning, RetentionConfig, artifact_kept

    # now 200, recent 20, every 50: kept 1, 181..200, 50, 100, 150
    kept = [i for i in range(1, 201) if artifact_kept(i, 200, 20, 50)]
    assert kept == [1, 50, 100, 150, *range(181, 201)]
    assert [i for i in range(1, 201) if artifact_kept(i, 200, 20, 0)] == [1, *range(181, 201)]
    thinning = ArtifactThinning(RetentionConfig(artifacts_recent=20, artifacts_every=50))
    dropped = []
    for it in (1, *range(5, 201, 5)):
        assert thinning.admit(f"samples/iter_{it:04d}.txt", it)
        dropped += thinning.expired(it)
    assert sorted(thinning.written.values()) == [1, 50, 100, 150, 185, 190, 195, 200]
    assert len(dropped) == 41 - 8 and "samples/iter_0005.txt" in dropped


def test_a_resumed_run_thins_what_its_first_process_wrote(tmp_path):
    cfg = _config(tmp_path)
    first = _open(cfg, tmp_path)
    _write_iterations(first, cfg, range(1, 61))
    first.finish("KILLED")
    resumed = _open(cfg, tmp_path, resume_run_id=first.run_id)
    _write_iterations(resumed, cfg, range(61, ITERATIONS + 1))
    samples, heatmaps = _thinned(_artifacts(MlflowClient(cfg.tracking_uri()), first.run_id))
    assert samples == SAMPLES_KEPT
    assert heatmaps == HEATMAPS_KEPT


def test_a_store_that_cannot_delete_is_thinned_by_not_writing(tmp_path, monkeypatch):
    refused = []

    def not_implemented(self, artifact_path=None):
        refused.append(artifact_path)
        raise MlflowException("Not implemented yet")

    monkeypatch.setattr(LocalArtifactRepository, "delete_artifacts", not_implemented)
    cfg = _config(tmp_path, "diagnostics.enabled=false")
    messages = []
    tracker = open_tracker(
        cfg, tmp_path / "out", lambda kind, data: messages.append(data["message"]), None, {}, None
    )
    _write_iterations(tracker, cfg, range(1, ITERATIONS + 1))
    samples, _ = _thinned(_artifacts(MlflowClient(cfg.tracking_uri()), tracker.run_id))
    # Iteration 55's write is the first after which a delete is due (iteration 5's,
    # refused); from then on only iterations the rule keeps for good are written (100).
    assert samples == {f"samples/iter_{i:04d}.txt" for i in (1, *range(5, 56, 5), 100)}
    assert refused == ["samples/iter_0005.txt"]  # said once, not tried again
    assert len(messages) == 1 and "did not delete samples/iter_0005.txt" in messages[0]


def test_checkpoints_keep_the_newest_k_and_the_protected(tmp_path):
    from tether.platform.run.trainer import Trainer

    cfg = _config(tmp_path, "retention.checkpoints=3", "trainer.checkpoint_every=1")
    trainer = Trainer(cfg)
    trainer.tracker = SimpleNamespace(run_id="run0", set_tags=lambda tags: None)
    trainer.learner = SimpleNamespace(full_state=lambda: {"weights": [0.0]})
    protected = trainer.checkpoint_dir() / "iter_000002.pt"
    trainer.responder.protected = lambda: (protected,)  # a rollback's target
    for it in range(1, 9):
        trainer.checkpoint(it)
    names = sorted(p.name for p in trainer.checkpoint_dir().iterdir())
    assert names == ["iter_000002.pt", "iter_000006.pt", "iter_000007.pt", "iter_000008.pt"]


def test_the_settings_are_in_the_fields_help():
    from tether.platform.config import describe_fields

    rows = {path: (default, text) for path, default, text in describe_fields()}
    assert rows["retention.checkpoints"][0] == 2
    assert rows["retention.artifacts_recent"][0] == 50
    assert rows["retention.artifacts_every"][0] == 50
    assert "cross_scores" in rows["retention.artifacts_recent"][1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.mlflow_server import MlflowServer

    with MlflowServer(tmp_path_factory.mktemp("mlflow_server")) as running:
        yield running


def test_a_tracking_server_deletes_its_proxied_artifacts(server, tmp_path):
    from tether.platform.tracking.tracker import Tracker

    cfg = _config(tmp_path, f"tracking.uri={server.uri}")
    # An experiment made without an artifact root: its artifacts live on the server
    # (``tether run`` makes its experiments with the output directory as their root).
    tracker = Tracker(server.uri, "retention-proxied", retention=cfg.retention)
    _write_iterations(tracker, cfg, range(1, ITERATIONS + 1))
    client = MlflowClient(server.uri)
    assert client.get_run(tracker.run_id).info.artifact_uri.startswith("mlflow-artifacts:")
    samples, heatmaps = _thinned(_artifacts(client, tracker.run_id))
    assert samples == SAMPLES_KEPT
    assert heatmaps == HEATMAPS_KEPT
    on_server = {p.name for p in server.root.rglob("iter_*.txt")}
    assert on_server == {f.split("/")[-1] for f in SAMPLES_KEPT}


def test_metrics_every_logs_the_cadence_and_every_diagnostic_point(tmp_path):
    """``trainer.metrics_every``: iterations 1, N, 2N, ..., the last, and any iteration
    whose metrics hold a diagnostic or validation point reach MLflow; the others do not."""
    from mlflow.tracking import MlflowClient

    from tether.platform.config import TrainerConfig
    from tether.platform.run.stages import log_iteration
    from tether.platform.tracking.tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "metrics-every", artifact_root=tmp_path / "a", run_name="r")
    t = TrainerConfig(iterations=12, metrics_every=5, samples_per_log=0)
    for it in range(1, 13):
        metrics = {"rollout/success": it / 12}
        if it == 7:
            metrics["collapse/probe/mi_estimate"] = 0.3
        log_iteration(tracker, t, it, metrics, [], str)
        assert "timing/log" in metrics  # the run's own record keeps every iteration
    tracker.finish("FINISHED")
    history = MlflowClient(uri).get_metric_history(tracker.run_id, "rollout/success")
    assert sorted(m.step for m in history) == [1, 5, 7, 10, 12]
