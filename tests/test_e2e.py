"""End to end: a micro model trained for a few iterations through real local Ray and
real MLflow (SQLite); the logged metrics are read back from MLflow and checked."""

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import micro_config_dict
from tether.platform.config import build_config
from tether.platform.driver import Trainer


def _history(client, run_id, key):
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


@pytest.fixture(scope="module")
def finished_run(micro_policy, models_dir, ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    cfg = build_config(micro_config_dict(out, trainer={"iterations": 3, "val_every": 3}))
    cfg.model.cache_dir = models_dir
    summary = Trainer(cfg).run()
    return cfg, summary


def test_run_finishes_and_logs_to_mlflow(finished_run):
    cfg, summary = finished_run
    assert summary.status == "FINISHED" and summary.iterations == 3
    client = MlflowClient(summary.tracking_uri)
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.group_size"] == "4"
    assert run.data.params["algo.kl_coef"] == "0.01"
    batch = cfg.rollout.groups * cfg.rollout.group_size
    assert _history(client, summary.run_id, "rollout/trajectories") == {1: batch, 2: batch, 3: batch}
    for key in ("rollout/success", "rollout/reward_mean", "rollout/in_group_reward_std",
                "filter/kept_ratio", "filter/zero_variance_groups", "rollout/response_length",
                "timing/collect", "rollout/tokens_per_s"):
        assert set(_history(client, summary.run_id, key)) == {1, 2, 3}, key
    for it, kept in _history(client, summary.run_id, "filter/kept_groups").items():
        assert 0 <= kept <= cfg.rollout.groups
    success = _history(client, summary.run_id, "rollout/success")
    assert all(0.0 <= v <= 1.0 for v in success.values())
    val = _history(client, summary.run_id, "val/success")
    assert set(val) == {0, 3} and val[0] == summary.val_history[0]
    artifacts = {a.path for a in client.list_artifacts(summary.run_id)}
    assert {"model", "samples"} <= artifacts
    samples = [a.path for a in client.list_artifacts(summary.run_id, "samples")]
    assert "samples/iter_0001.txt" in samples


def test_updates_happen_when_groups_are_kept(finished_run):
    cfg, summary = finished_run
    client = MlflowClient(summary.tracking_uri)
    kept = _history(client, summary.run_id, "filter/kept_groups")
    skipped = _history(client, summary.run_id, "filter/update_skipped")
    for it in kept:
        assert skipped[it] == float(kept[it] == 0)
    kl = _history(client, summary.run_id, "actor/kl_loss")
    # The KL to the reference is logged exactly on iterations that updated.
    assert set(kl) == {it for it in kept if kept[it] > 0}
    assert all(v >= -1e-6 for v in kl.values())


def test_same_seed_same_first_iteration(finished_run, micro_policy, models_dir, ray_local,
                                        tmp_path):
    cfg, summary = finished_run
    again = build_config(micro_config_dict(tmp_path, trainer={"iterations": 1, "val_every": 1}))
    again.model.cache_dir = models_dir
    second = Trainer(again).run()
    client = MlflowClient(summary.tracking_uri)
    client2 = MlflowClient(second.tracking_uri)
    for key in ("rollout/reward_mean", "rollout/success", "rollout/response_length",
                "filter/kept_groups", "rollout/in_group_reward_std"):
        assert _history(client, summary.run_id, key)[1] == _history(client2, second.run_id, key)[1]
