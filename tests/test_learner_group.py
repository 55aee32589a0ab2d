"""The FSDP learner group: two Ray actors (gloo, FSDP2) train to the same parameters as
one learner, its gathered state loads at any world size, and a config the cluster can
never hold fails at start."""

import pytest
import ray
import torch

from tests.conftest import micro_config_dict
from tests.test_episode import _setup
from tether.actors.learner_group import LearnerGroup
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
from tether.algos.batch import collate
from tether.algos.update import rank_micro_batches
from tether.policy.load import load_model_and_tokenizer
from tether.policy.lora import LoraConfig
from tether.testing.settings import update_settings


def test_rank_micro_batches_cover_rows_once_with_equal_pass_counts():
    rows = torch.arange(10)
    split = [
        rank_micro_batches(list(torch.split(rows, 3)), r, 3) for r in range(3)
    ]  # 4 micro-batches, 3 ranks
    assert [len(s) for s in split] == [2, 2, 2]
    real = torch.cat([r for s in split for r, w in s if w == 1.0])
    assert sorted(real.tolist()) == list(range(10))
    assert [w for s in split for _, w in s].count(0.0) == 2
    assert [r.tolist() for r, _ in rank_micro_batches(list(torch.split(rows, 4)))] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9],
    ]


@pytest.fixture(scope="module")
def batches(micro_policy):
    """Three batches of sampled trajectories with advantages of both signs."""
    model, tok, formatter, engine, sampling = _setup(micro_policy)
    out = []
    for i in range(3):
        specs = [EpisodeSpec(g, 60 + 3 * i + g, k) for g in range(3) for k in range(3)]
        trajs = run_episodes(
            engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 11 + i
        )
        batch = collate(trajs, tok.pad_token_id)
        sign = torch.tensor([(-1.0) ** (t.group_id + t.sample_index) for t in trajs])
        batch.advantages = sign[:, None] * (
            1 + torch.rand(batch.input_ids.shape, generator=torch.Generator().manual_seed(i))
        )
        batch.returns = batch.advantages.clone()
        out.append(batch)
    return out


#: LoRA for the world-size comparison: no dropout (each rank would draw its own masks).
LORA = LoraConfig(r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"])


def _train(policy, batches, world_size, use_critic, lora=None):
    # 9 rows, 2 minibatches of 5 and 4 rows, micro-batches of 2: odd counts, so a rank pads.
    # World size > 1 runs the plain forward (ranks must run equal numbers of forwards), so
    # world size 1 does too: this compares sharding, not the shared-prefix regrouping of
    # rows into micro-batches (equal to 1e-5 per step, tests/test_shared_prefix.py), whose
    # other summation order Adam at lr 5e-3 grows past 1e-5 over the updates.
    settings = update_settings(
        kl_coef=0.05,
        entropy_coef=0.01,
        minibatches=2,
        micro_batch_size=2,
        loss_agg="token-mean",
        max_grad_norm=0.5,
        shared_prefix=False,
    )
    group = LearnerGroup.start(
        str(policy),
        settings,
        lr=5e-3,
        critic_lr=5e-3,
        use_critic=use_critic,
        use_reference=True,
        threads=1,
        seed=0,
        world_size=world_size,
        num_cpus=0.5,
        lora=lora,
    )
    try:
        metrics = []
        for batch in batches:
            prepared = group.prepare(batch, recompute_old_logprobs=True)
            metrics.append(group.update(prepared))
        weights = ray.get(group.state_dict())
        return weights, group.full_state(), metrics, prepared, group
    except BaseException:
        group.shutdown()
        raise


@pytest.mark.parametrize(
    "use_critic, lora",
    [
        pytest.param(False, None, id="grpo"),
        # The critic's and LoRA's gradients across ranks: nightly (-m slow); CONTRIBUTING.md,
        # "Tests", Nightly.
        pytest.param(True, None, id="ppo-critic", marks=pytest.mark.slow),
        pytest.param(False, LORA, id="grpo-lora", marks=pytest.mark.slow),
    ],
)
def test_world_size_2_matches_world_size_1(
    micro_policy, batches, ray_local, tmp_path, use_critic, lora
):
    """The gathered (with LoRA: merged) weights, the module state, Adam moments and the
    update metrics; with LoRA the reference log-probs come through disabled adapters on
    each rank's shards."""
    one = _train(micro_policy, batches, 1, use_critic, lora)
    two = _train(micro_policy, batches, 2, use_critic, lora)
    try:
        assert two[4].backend == "gloo" and one[4].backend == "none"
        (w1, state1, m1, prep1, _), (w2, state2, m2, prep2, _) = one, two
        # Old, reference log-probs and values computed on split rows, joined whole.
        # float32 on row blocks of different sizes: an AMD EPYC (no AVX-512) CPU gave up to
        # 8e-5 on 11 of 7,452 log-probs (the rest within 1e-5), 2026-11-27; 2e-4 holds that
        # with room and is far below any real misalignment (a shifted row moves nats).
        for name in ("old_logprobs", "ref_logprobs") + (("values",) if use_critic else ()):
            assert torch.allclose(getattr(prep1, name), getattr(prep2, name), atol=2e-4), name
            assert getattr(prep2, name).abs().sum() > 0
        assert w1.keys() == w2.keys()
        initial = load_model_and_tokenizer(micro_policy)[0].state_dict()
        moved = max(float((w1[k] - initial[k]).abs().max()) for k in w1)
        assert moved > 1e-3  # the updates changed the weights, so equality means something
        for k in w1:
            assert torch.allclose(w1[k], w2[k], atol=1e-5, rtol=0), (k, (w1[k] - w2[k]).abs().max())
        assert state1["model"].keys() == state2["model"].keys()
        for k, v in state1["model"].items():  # with LoRA: base weights and adapters
            assert torch.allclose(v, state2["model"][k], atol=1e-5, rtol=0), k
        if lora is not None:
            adapters = [k for k in state1["model"] if ".lora_" in k]
            assert len(adapters) == 2 * 4 * 2  # A and B x 4 targets x 2 layers
            assert sorted(state2["optimizer"]["state"]) == sorted(adapters)
            for k, v in state2["model"].items():  # the base weights never move
                if ".lora_" not in k:
                    assert torch.equal(v, initial[k.replace(".base_layer.", ".")]), k
            # rank 0's unsharded copy saves the merged model and the adapters
            saved = two[4].save(str(tmp_path / "w2"))
            plain = load_model_and_tokenizer(saved)[0].state_dict()
            assert all(torch.equal(plain[k], w2[k]) for k in w2)
            assert (tmp_path / "w2" / "adapter" / "adapter_model.safetensors").is_file()
        if use_critic:
            for k in state1["critic"]:
                assert torch.allclose(state1["critic"][k], state2["critic"][k], atol=1e-5), k
        # Adam moments, keyed by parameter name at both world sizes.
        for name, s1 in state1["optimizer"]["state"].items():
            assert torch.allclose(
                s1["exp_avg"], state2["optimizer"]["state"][name]["exp_avg"], atol=1e-6
            ), name
        for a, b in zip(m1, m2):
            assert a.keys() == b.keys()
            for k in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/approx_kl"):
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
        # A world-size-2 checkpoint resumes a world-size-1 learner (and vice versa: one format).
        one[4].load_full_state(state2)
        assert all(torch.equal(w2[k], v) for k, v in ray.get(one[4].state_dict()).items())
        assert one[4].full_state()["updates"] == len(batches)
    finally:
        one[4].shutdown()
        two[4].shutdown()


def test_resources_the_cluster_can_never_provide_fail_at_start(tmp_path, ray_local):
    """No GPU on this machine, 4 CPUs in the test Ray: one clear line naming the field,
    before the warm start builds anything or an MLflow run exists."""
    from tether.platform.config import build_config
    from tether.platform.run.trainer import Trainer
    from tether.platform.session import ClusterError, check_resources

    gpus = build_config(micro_config_dict(tmp_path, algo={"num_gpus": 1}))
    with pytest.raises(ClusterError, match=r"^algo.num_gpus = 1: each learner rank asks for 1 GPU"):
        check_resources(gpus.resource_demands())
    cpus = build_config(micro_config_dict(tmp_path, algo={"learner_world_size": 8}))
    with pytest.raises(ClusterError) as err:
        check_resources(cpus.resource_demands())
    message = str(err.value)
    assert "\n" not in message and "asks for 10 CPU" in message
    assert "algo.learner_world_size 8 x algo.num_cpus 1" in message
    check_resources(build_config(micro_config_dict(tmp_path)).resource_demands())  # fits
    trainer = Trainer(gpus)
    with pytest.raises(ClusterError):
        trainer.run()
    assert trainer.tracker is None and not (tmp_path / "models").exists()


@pytest.mark.slow
def test_trainer_with_learner_world_size_2(micro_policy, models_dir, ray_local, tmp_path):
    """End to end through the Trainer: the FSDP group (gloo) trains, checkpoints and
    syncs weights each iteration; iteration 1 (same initial weights, same seeded batch)
    gives the world-size-1 run's update metrics."""
    from mlflow.tracking import MlflowClient

    from tether.platform.config import build_config
    from tether.platform.run.trainer import Trainer

    runs = {}
    for world_size in (1, 2):
        cfg = build_config(
            micro_config_dict(
                tmp_path / f"w{world_size}",
                algo={"learner_world_size": world_size, "num_cpus": 0.5, "threads": 1},
                rollout={"num_cpus_per_worker": 0.5},
                trainer={"iterations": 2, "val_every": 2},
                filter={"strategy": "none"},
                diagnostics={"every": 2, "grad_snr_every": 2, "grad_snr_buckets": 2},
            )
        )
        cfg.model.cache_dir = models_dir
        runs[world_size] = Trainer(cfg).run()
    client = MlflowClient(runs[2].tracking_uri)
    for world_size, summary in runs.items():
        assert summary.status == "FINISHED" and summary.iterations == 2
    two = runs[2].run_id
    history = {
        k: {m.step: m.value for m in MlflowClient(runs[2].tracking_uri).get_metric_history(two, k)}
        for k in ("timing/sync", "timing/log", "actor/pg_loss", "actor/grad_norm")
    }
    assert set(history["timing/sync"]) == {1, 2} and min(history["timing/sync"].values()) > 0
    assert set(history["timing/log"]) == {1, 2}
    one = {
        k: MlflowClient(runs[1].tracking_uri).get_metric_history(runs[1].run_id, k)
        for k in ("actor/pg_loss", "actor/grad_norm")
    }
    for k, values in one.items():
        first = next(m.value for m in values if m.step == 1)
        assert history[k][1] == pytest.approx(first, rel=1e-4, abs=1e-6), k
    run = client.get_run(two)
    assert run.data.params["algo.learner_world_size"] == "2"
    assert "grad_snr/q1/task_grad_norm" in run.data.metrics  # the analyses on rank 0's copy
    assert "collapse/first_turn/num_pairs" in run.data.metrics
    assert {"model"} <= {a.path for a in client.list_artifacts(two)}


def test_every_forwarded_method_is_a_learner_method_of_the_same_name():
    """The group forwards through one mechanism (``_Collective``); each name it forwards
    is one of ``Learner``'s methods, so a rename there cannot leave a dangling call."""
    import inspect

    from tether.actors.learner import Learner
    from tether.actors.learner_group import LearnerGroup, _Collective

    learner = Learner.__ray_metadata__.modified_class
    forwarded = [n for n, v in vars(LearnerGroup).items() if isinstance(v, _Collective)]
    assert {"prepare", "update", "diagnose", "probe", "save"} <= set(forwarded)
    for name in forwarded:
        assert inspect.isfunction(getattr(learner, name, None)), name
        assert getattr(LearnerGroup, name).name == name
