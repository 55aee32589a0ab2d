"""End to end: a micro model trained for a few iterations through real local Ray and
real MLflow (SQLite); the logged metrics are read back from MLflow and checked."""

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import micro_config_dict
from tether.diagnostics.settings import ProbeConfig
from tether.platform.config import build_config
from tether.platform.run.trainer import Trainer


def _history(client, run_id, key):
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


@pytest.fixture(scope="module")
def finished_run(micro_policy, models_dir, ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    cfg = build_config(
        micro_config_dict(
            out,
            trainer={"iterations": 3, "val_every": 3},
            # Gradient SNR on every iteration that updates (which ones do is the data's).
            # and the shipped probe set (64 levels; the other tests' runs probe 16).
            diagnostics={
                "grad_snr_every": 1,
                "grad_snr_buckets": 2,
                # ... each probe level also played to the end twice (issue 70's mechanism)
                "probe": {"levels": ProbeConfig().levels, "outcome_samples": 2},
            },
        )
    )
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
    assert _history(client, summary.run_id, "rollout/trajectories") == {
        1: batch,
        2: batch,
        3: batch,
    }
    for key in (
        "rollout/success",
        "rollout/reward_mean",
        "rollout/in_group_reward_std",
        "filter/kept_ratio",
        "filter/kept_groups",
        "filter/zero_variance_groups",
        "rollout/response_length",
        "timing/collect",
        "rollout/tokens_per_s",
    ):
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
    # Per-prompt rewards for the report's heatmaps, matching the logged success.
    from tether.analysis.source import load_run

    loaded = load_run(client, run)
    assert set(loaded.prompts) == {1, 2, 3} and len(loaded.prompts[1]) == cfg.rollout.groups
    for it, groups in loaded.prompts.items():
        assert all(len(g["rewards"]) == cfg.rollout.group_size for g in groups)
        flat = [s for g in groups for s in g["success"]]
        assert sum(flat) / len(flat) == pytest.approx(success[it])


def test_run_records_what_it_ran_on(finished_run):
    cfg, summary = finished_run
    tags = MlflowClient(summary.tracking_uri).get_run(summary.run_id).data.tags
    for key in (
        "env.python",
        "env.torch",
        "env.transformers",
        "env.ray",
        "env.mlflow",
        "env.cpu",
        "env.torch_threads",
        "env.torch_deterministic_algorithms",
        "env.tether_commit",
    ):
        assert tags.get(key) not in (None, ""), key
    import torch

    assert tags["env.torch"] == torch.__version__
    assert tags["model.dtype_effective"] == "float32"  # every process loaded float32
    from tether.policy.precision import resolve_autocast

    # diagnostics.autocast: auto, as the learner decided it on this CPU
    assert tags["diagnostics.autocast_effective"] == resolve_autocast("auto", "cpu")
    metrics = MlflowClient(summary.tracking_uri).get_run(summary.run_id).data.metrics
    assert metrics["system/peak_rss_gb/learner"] > 0.1
    # The MLflow UI opens the experiment on its runs (a training experiment), and the run
    # name is not a param (sweep trials would each offer a different one to compare on).
    client = MlflowClient(summary.tracking_uri)
    run = client.get_run(summary.run_id)
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "experiment.run_name" not in run.data.params and "experiment.seed" in run.data.params


def test_collapse_diagnostics_are_logged(finished_run):
    cfg, summary = finished_run
    client = MlflowClient(summary.tracking_uri)
    metrics = client.get_run(summary.run_id).data.metrics
    for sampling in ("first_turn", "trajectory"):
        assert f"collapse/{sampling}/num_pairs" in metrics
        assert f"collapse/{sampling}/conditional_entropy_est" in metrics
        # Iteration 1 always runs the diagnostics (default cadence 10 + iteration 1).
        steps = set(_history(client, summary.run_id, f"collapse/{sampling}/num_pairs"))
        assert 1 in steps and 2 not in steps
    # Two groups -> two distinct first-turn prompts (two FrozenLake maps): the MI proxies
    # (which need two prompts) are logged, and bounded.
    prompts = _history(client, summary.run_id, "collapse/first_turn/num_prompts")
    assert prompts[1] == 2.0
    mi = _history(client, summary.run_id, "collapse/first_turn/mi_estimate")
    assert set(mi) == {1} and abs(mi[1]) <= 10.0
    chance = _history(client, summary.run_id, "collapse/first_turn/retrieval_chance")
    assert set(chance) == {1} and 0.0 < chance[1] <= 1.0
    for sampling in ("first_turn", "trajectory"):
        # The information chain is scored at iteration 1 (then every chain_every = 20).
        assert set(_history(client, summary.run_id, f"collapse/{sampling}/za/num_pairs")) == {1}
    images = [a.path for a in client.list_artifacts(summary.run_id, "diagnostics")]
    assert any(p.endswith("cross_scores_first_turn_0001.png") for p in images)
    assert set(_history(client, summary.run_id, "collapse/first_turn/mi_seq_zscore")) == {1}
    # Prompt-level MI (finding d's quartiles): one record per group of iteration 1's batch;
    # the pair-weighted mean of the prompts' pointwise MI is the logged mi_estimate.
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        local = client.download_artifacts(summary.run_id, "prompt_mi/iter_0001.json", tmp)
        record = json.loads(open(local).read())
    groups = record["groups"]
    assert len(groups) == cfg.rollout.groups and all(len(g["rewards"]) == 4 for g in groups)
    scored = [g for g in groups if g["pairs"] > 0]
    assert scored and all(g["mi"] is not None for g in scored)
    weighted = sum(g["pairs"] * g["mi"] for g in scored) / sum(g["pairs"] for g in scored)
    assert weighted == pytest.approx(mi[1], abs=1e-9)


def test_probe_set_is_logged_at_diagnostic_points(finished_run):
    """The probe set (default 64 held-out levels, one first turn each, sampled through the
    rollout workers) is cross-scored in full at iteration 1: its MI bound is log of its
    distinct prompts, beyond the batch's log 2, with intervals and the permutation test."""
    import math

    cfg, summary = finished_run
    client = MlflowClient(summary.tracking_uri)
    levels = cfg.diagnostics.probe.levels
    pairs = _history(client, summary.run_id, "collapse/probe/num_pairs")
    assert set(pairs) == {1} and 0 < pairs[1] <= levels
    prompts = _history(client, summary.run_id, "collapse/probe/num_prompts")[1]
    assert 32 < prompts <= levels  # distinct FrozenLake maps among the 64 levels
    bound = _history(client, summary.run_id, "collapse/probe/mi_upper_bound")[1]
    assert bound == pytest.approx(math.log(prompts))
    for key in ("mi_estimate", "mi_estimate_ci_low", "mi_estimate_ci_high", "p_grounded"):
        value = _history(client, summary.run_id, f"collapse/probe/{key}")
        assert set(value) == {1} and math.isfinite(value[1]), key
    assert _history(client, summary.run_id, "timing/diagnose/probe/collect")[1] > 0
    # Reading accuracy on the same probe turns (FrozenLake: the state is known).
    assert _history(client, summary.run_id, "grounding/defined") == {1: 1.0}
    assert _history(client, summary.run_id, "grounding/levels") == {1: float(levels)}
    for key in ("reading_acc", "player_right", "goal_right", "first_move_optimal"):
        rate = _history(client, summary.run_id, f"grounding/{key}")
        low = _history(client, summary.run_id, f"grounding/{key}_ci_low")
        high = _history(client, summary.run_id, f"grounding/{key}_ci_high")
        assert set(rate) == {1} and 0.0 <= low[1] <= rate[1] <= high[1] <= 1.0, key


def test_gradient_snr_by_reward_variance_bucket(finished_run):
    cfg, summary = finished_run
    client = MlflowClient(summary.tracking_uri)
    kept = _history(client, summary.run_id, "filter/kept_groups")
    updated = {it for it in kept if kept[it] > 0}
    # The SNR is measured on every iteration that updates (grad_snr_every 1), and some do:
    # a run that never keeps a group fails here instead of checking nothing.
    assert updated, f"no iteration kept a group: {kept}"
    logged = {
        (k, name): _history(client, summary.run_id, f"grad_snr/q{k}/{name}")
        for k in (1, 2)
        for name in ("task_grad_norm", "reg_grad_norm", "mean_rv")
    }
    for (k, name), history in logged.items():
        assert set(history) == updated, (k, name, history)
    for it in updated:
        rv = {k: logged[k, "mean_rv"][it] for k in (1, 2)}
        assert rv[1] <= rv[2], (it, rv)  # buckets in order of reward spread
        for k in (1, 2):
            # A bucket whose groups have no reward spread has zero advantages, so no task
            # gradient; one with spread has some.  Every bucket is one of the two, so each
            # is checked whatever the data (zeroed advantages fail it).  At seed 0 every
            # bucket has spread; the zero-spread case on a real batch is test_grad_snr's.
            task = logged[k, "task_grad_norm"][it]
            assert (task == 0.0) == (rv[k] == 0.0), (it, k, rv[k], task)
            assert logged[k, "reg_grad_norm"][it] > 0.0  # KL + entropy act everywhere


def test_alarm_in_stop_mode_ends_the_run_cleanly(micro_policy, models_dir, ray_local, tmp_path):
    # top_p with rho = 0 keeps no group, so empty_after_filter trips after 2 iterations.
    cfg = build_config(
        micro_config_dict(
            tmp_path,
            trainer={"iterations": 4, "val_every": 4},
            filter={"strategy": "top_p", "value": 0.0},
            alarms={"empty_after_filter": {"mode": "stop", "patience": 2}},
            diagnostics={"enabled": False},
        )
    )
    cfg.model.cache_dir = models_dir
    summary = Trainer(cfg).run()
    assert summary.status == "FINISHED" and summary.iterations == 2
    assert summary.stop_reason == "alarm empty_after_filter at iteration 2"
    run = MlflowClient(summary.tracking_uri).get_run(summary.run_id)
    assert run.data.tags["alarm.empty_after_filter"] == "2"
    assert run.data.tags["tether.stop_reason"] == summary.stop_reason
    assert run.info.status == "FINISHED"
    skipped = _history(MlflowClient(summary.tracking_uri), summary.run_id, "filter/update_skipped")
    assert skipped == {1: 1.0, 2: 1.0}


def test_updates_happen_when_groups_are_kept(finished_run):
    cfg, summary = finished_run
    client = MlflowClient(summary.tracking_uri)
    kept = _history(client, summary.run_id, "filter/kept_groups")
    skipped = _history(client, summary.run_id, "filter/update_skipped")
    assert set(kept) == set(skipped) == {1, 2, 3}
    for it in kept:
        assert skipped[it] == float(kept[it] == 0)
    kl = _history(client, summary.run_id, "actor/kl_loss")
    # The KL to the reference is logged exactly on iterations that updated, and there are
    # some: a run that never keeps a group (so never updates) fails this test.
    updated = {it for it in kept if kept[it] > 0}
    assert updated, f"no iteration kept a group, so none updated: {kept}"
    assert set(kl) == updated
    assert all(v >= -1e-6 for v in kl.values())
    # Reasoning-token entropy sits beside actor/entropy on every update.
    entropy = _history(client, summary.run_id, "collapse/reasoning_token_entropy")
    assert set(entropy) == set(kl) and all(v > 0 for v in entropy.values())


def test_same_seed_same_first_iteration(
    finished_run, micro_policy, models_dir, ray_local, tmp_path
):
    cfg, summary = finished_run
    again = build_config(micro_config_dict(tmp_path, trainer={"iterations": 1, "val_every": 1}))
    again.model.cache_dir = models_dir
    second = Trainer(again).run()
    client = MlflowClient(summary.tracking_uri)
    client2 = MlflowClient(second.tracking_uri)
    for key in (
        "rollout/reward_mean",
        "rollout/success",
        "rollout/response_length",
        "filter/kept_groups",
        "rollout/in_group_reward_std",
    ):
        assert _history(client, summary.run_id, key)[1] == _history(client2, second.run_id, key)[1]


def test_the_probe_plays_its_levels_to_the_end_and_logs_the_mechanism(finished_run):
    """``outcome_samples`` 2 through the real fleet: 64 levels x 2 full episodes at the
    probe point (iteration 1), the held-out success on them, the zero-variance split and
    the per-level artifact whose outcomes give that success."""
    import json

    cfg, summary = finished_run
    client = MlflowClient(summary.tracking_uri)
    levels = ProbeConfig().levels

    def at_1(key):
        return _history(client, summary.run_id, key)[1]

    assert at_1("mechanism/probe_levels") == levels
    path = client.download_artifacts(summary.run_id, "probe_levels/iter_0001.json")
    record = json.loads(open(path).read())["levels"]
    assert len(record) == levels and all(len(r["rewards"]) == 2 for r in record)
    wins = sum(sum(r["success"]) for r in record)
    assert at_1("mechanism/probe_success") == wins / (2 * levels)
    zero = sum(r["rewards"][0] == r["rewards"][1] for r in record)
    assert at_1("mechanism/probe_zero_rv_share") == zero / levels
    causes = ("all_failed", "all_succeeded", "uninformative")
    assert sum(at_1(f"mechanism/probe_zero_rv_{c}") for c in causes) == zero / levels
    scored = [r for r in record if r["mi"] is not None]
    assert len(scored) == at_1("collapse/probe/num_pairs")
