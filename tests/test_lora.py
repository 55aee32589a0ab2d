"""LoRA (``model.lora``, peft): only the adapters train, the KL reference is the policy
module with its adapters disabled (the base weights, no second copy), the rollout
engine loads the merged weights under the base names and then samples with the
learner's log-probs, checkpoints resume exactly, and a wrong setting is one line
naming the field.  (World size 2 == world size 1 with LoRA: tests/test_learner_group.py.)"""

from __future__ import annotations

import copy

import pytest
import ray
import torch

from tests.conftest import micro_config_dict
from tests.test_episode import _setup
from tether.actors.learner_group import LearnerGroup
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
from tether.algos.batch import collate
from tether.algos.update import batch_logprobs
from tether.platform.config import ConfigError, build_config
from tether.policy.load import load_model
from tether.policy.lora import (
    LoraConfig,
    add_lora,
    check_targets_for_path,
    merged_state_dict,
)
from tether.policy.tiny import build_tiny_model, tiny_config
from tether.testing.settings import update_settings

LORA = LoraConfig(r=4, alpha=8.0, dropout=0.1, target_modules=["q_proj", "v_proj", "down_proj"])


def _base_name(key: str) -> str:
    return key.replace(".base_layer.", ".")


# -- the pure parts -------------------------------------------------------------------


def test_merged_weights_equal_peft_merge_and_keep_the_adapters():
    """``merged_state_dict`` = peft's own ``merge_and_unload`` (same keys as the base
    model), its model gives the adapted model's logits, and disabling the adapters
    gives the base model's logits bit for bit."""
    torch.manual_seed(0)
    base = build_tiny_model(tiny_config("micro", vocab_size=300), seed=0)
    wrapper = add_lora(copy.deepcopy(base), LORA)
    adapted = wrapper.get_base_model()
    with torch.no_grad():  # B starts at 0 (adapted == base): give it a value
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    merged = merged_state_dict(adapted.state_dict(), LORA.scaling)
    by_peft = copy.deepcopy(wrapper).merge_and_unload().state_dict()
    assert merged.keys() == by_peft.keys() == base.state_dict().keys()
    for key, value in by_peft.items():
        assert torch.allclose(merged[key], value, atol=1e-7, rtol=0), key
    q = "model.layers.0.self_attn.q_proj.weight"
    assert float((merged[q] - base.state_dict()[q]).abs().max()) > 1e-3  # really merged
    k = "model.layers.0.self_attn.k_proj.weight"  # not targeted: the base weight as it was
    assert torch.equal(merged[k], base.state_dict()[k])
    assert not any(m.training for m in adapted.modules())  # eval as built: no dropout
    # the live module still has its adapters (nothing was folded in)
    assert any("lora_A" in key for key in adapted.state_dict())

    ids = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(1))
    plain = copy.deepcopy(base)
    plain.load_state_dict(merged)
    with torch.no_grad():
        lora_logits = adapted(ids).logits
        with wrapper.disable_adapter():
            disabled_logits = adapted(ids).logits
        assert torch.allclose(plain(ids).logits, lora_logits, atol=1e-5, rtol=0)
        assert torch.equal(disabled_logits, base(ids).logits)
        assert float((lora_logits - disabled_logits).abs().max()) > 1e-3
    # the context restored training: only the adapters require gradients, all of them
    trainable = {n for n, p in adapted.named_parameters() if p.requires_grad}
    assert trainable == {n for n in adapted.state_dict() if ".lora_" in n}
    assert len(trainable) == 2 * 3 * 2  # A and B x 3 targets x 2 layers


def test_wrong_lora_settings_are_one_line_naming_the_field(micro_policy, tmp_path, ray_local):
    def refused(lora: dict) -> str:
        with pytest.raises(ConfigError) as err:
            build_config(micro_config_dict(tmp_path, model={"lora": lora}))
        assert "\n" not in str(err.value)
        return str(err.value)

    assert refused({"r": 0}).startswith("model.lora.r: Input should be greater than or equal to 1")
    assert refused({"alpha": -1}).startswith("model.lora.alpha: Input should be greater than 0")
    assert refused({"dropout": 1.0}).startswith("model.lora.dropout: Input should be less than 1")
    assert refused({"rank": 8}) == "model.lora.rank: Extra inputs are not permitted (unknown key)"
    assert refused({"target_modules": []}).startswith("model.lora.target_modules: List should")
    # off by default; one override turns it on with the defaults
    assert build_config(micro_config_dict(tmp_path)).model.lora is None
    on = build_config(micro_config_dict(tmp_path), ["model.lora.r=16"]).model.lora
    assert (on.r, on.alpha, on.scaling, on.dropout) == (16, 16.0, 1.0, 0.0)
    assert "down_proj" in on.target_modules
    from tether.platform.config import describe_fields  # the help lists the off section's fields

    rows = {path: (default, text) for path, default, text in describe_fields()}
    assert rows["model.lora"][0] is None
    assert rows["model.lora.r"] == (
        8,
        "Adapter rank r (A is r x in, B is out x r). (when model.lora is set)",
    )

    # A name the model does not have: refused from its config alone, the valid ones listed.
    with pytest.raises(ValueError) as err:
        check_targets_for_path(LoraConfig(target_modules=["q_proj", "qkv"]), str(micro_policy))
    assert str(err.value) == (
        "model.lora.target_modules: 'qkv' is not a linear layer of the model's transformer "
        "blocks; choose from ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', "
        "'up_proj', 'v_proj']"
    )
    with pytest.raises(ValueError, match=r"'lm_head' is not a linear layer"):  # the tied head
        check_targets_for_path(LoraConfig(target_modules=["lm_head"]), str(micro_policy))
    # ... and by a run, after the (cached) warm start and before any actor; the MLflow
    # run, opened before the warm start (so that a server away during it spools), ends
    # FAILED.
    from tether.platform.run.trainer import Trainer

    cfg = build_config(micro_config_dict(tmp_path), ["model.lora.target_modules=[attn]"])
    cfg.model.cache_dir = micro_policy.parent
    trainer = Trainer(cfg)
    with pytest.raises(ConfigError, match=r"^model.lora.target_modules: 'attn' is not"):
        trainer.run()
    assert trainer.learner is None and not trainer.fleet.workers
    assert trainer.tracker.client.get_run(trainer.tracker.run_id).info.status == "FAILED"


# -- the learner ----------------------------------------------------------------------


def _batches(policy, n: int) -> list:
    """``n`` batches of 9 sampled FrozenLake trajectories with advantages of both signs."""
    _, tok, formatter, engine, sampling = _setup(policy)
    out = []
    for i in range(n):
        specs = [EpisodeSpec(g, 80 + 3 * i + g, k) for g in range(3) for k in range(3)]
        trajs = run_episodes(
            engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 21 + i
        )
        batch = collate(trajs, tok.pad_token_id)
        sign = torch.tensor([(-1.0) ** (t.group_id + t.sample_index) for t in trajs])
        batch.advantages = sign[:, None] * torch.ones(batch.input_ids.shape)
        out.append(batch)
    return out


def _max_response_gap(batch) -> float:
    """Largest |learner - sampler| log-prob over the sampled tokens."""
    gap = (batch.old_logprobs - batch.sampling_logprobs).abs() * batch.response_mask
    return float(gap.max())


SETTINGS = update_settings(kl_coef=0.05, micro_batch_size=4, minibatches=2, max_grad_norm=1.0)


@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_lora_learner_reference_sync_and_resume(micro_policy, ray_local, tmp_path):
    """One LoRA learner through three updates: (1) base weights untouched, adapters and
    merged weights moved, AdamW over adapters only; (2) reference log-probs = the base
    model's, before and after; (3) the engine, synced, samples with the learner's
    log-probs (1e-5), unsynced it does not; (4) a checkpoint resumes the same update;
    (5) the saved model is the merged one, its adapter directory loads with peft."""
    batches = _batches(micro_policy, 3)
    base = load_model(micro_policy)
    initial = {k: v.clone() for k, v in base.state_dict().items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the learner's thread count: the same float sums
    try:
        with torch.no_grad():
            base_lp = [
                batch_logprobs(
                    base,
                    b,
                    SETTINGS.temperature,
                    SETTINGS.micro_batch_size,
                    shared_prefix=SETTINGS.shared_prefix,
                    chunk_tokens=SETTINGS.logprob_chunk_tokens,
                )
                for b in batches
            ]
    finally:
        torch.set_num_threads(threads)

    group = LearnerGroup.start(
        str(micro_policy),
        SETTINGS,
        lr=2e-2,
        critic_lr=0.0,
        use_critic=False,
        use_reference=True,  # asked for; LoRA loads no copy: the base weights are it
        threads=1,
        seed=0,
        num_cpus=0.5,
        lora=LORA,
    )
    try:
        # (2) before any update B = 0: policy, reference and base model agree exactly
        first = group.prepare(copy.deepcopy(batches[0]), recompute_old_logprobs=True)
        assert torch.equal(first.ref_logprobs, base_lp[0])
        assert torch.equal(first.old_logprobs, first.ref_logprobs)
        metrics = []
        for k, batch in enumerate(batches):
            metrics.append(group.update(group.prepare(batch, recompute_old_logprobs=True)))
            if k == 1:
                after_two = group.full_state()
        assert metrics[-1]["actor/kl_loss"] > 0  # the KL term saw a policy off the reference
        # (1) the module's own state: base weights as loaded, adapters trained
        state = group.full_state()
        own = state["model"]
        adapters = sorted(k for k in own if ".lora_" in k)
        assert len(adapters) == 12 and all(".lora_A." in k or ".lora_B." in k for k in adapters)
        for key, value in own.items():
            if ".lora_" not in key:
                assert torch.equal(value, initial[_base_name(key)]), key
        assert min(float(own[k].abs().max()) for k in adapters if ".lora_B." in k) > 1e-3
        assert sorted(state["optimizer"]["state"]) == adapters  # AdamW: adapters only
        merged = ray.get(group.state_dict())
        assert merged.keys() == initial.keys()
        for key, value in merged.items():
            targeted = any(f".{t}." in key for t in LORA.target_modules) and "weight" in key
            moved = float((value - initial[key]).abs().max())
            assert moved > 1e-4 if targeted else moved == 0.0, (key, moved)
        # (2) after the updates: the reference is still the base model, the policy is not
        again = group.prepare(copy.deepcopy(batches[0]), recompute_old_logprobs=True)
        assert torch.equal(again.ref_logprobs, base_lp[0])
        assert (
            float(((again.old_logprobs - again.ref_logprobs).abs() * again.response_mask).max())
            > 1e-2
        )

        # (3) weight sync: the engine samples, the learner scores the same tokens
        _, tok, formatter, engine, sampling = _setup(micro_policy)
        specs = [EpisodeSpec(g, 500 + g, k) for g in range(2) for k in range(2)]

        def sampled_and_scored(seed: int):
            trajs = run_episodes(
                engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, seed
            )
            return group.prepare(collate(trajs, tok.pad_token_id), recompute_old_logprobs=True)

        unsynced = sampled_and_scored(7)
        assert _max_response_gap(unsynced) > 1e-2  # negative control: the check can fail
        engine.load_state_dict(merged)  # what a rollout worker's set_weights does
        synced = sampled_and_scored(7)
        assert synced.response_mask.sum() > 20
        assert _max_response_gap(synced) < 1e-5

        # (4) resume: a fresh run loaded from the checkpoint after two updates repeats
        # the third update (dropout masks included: the torch RNG is in the checkpoint)
        group.start_run(SETTINGS, lr=2e-2, critic_lr=0.0, seed=123)
        assert not torch.equal(  # fresh adapters (A random, B zero) ...
            group.full_state()["model"][adapters[0]], own[adapters[0]]
        )
        group.load_full_state(after_two)
        redo = group.update(group.prepare(batches[2], recompute_old_logprobs=True))
        assert redo["actor/pg_loss"] == metrics[2]["actor/pg_loss"]
        for key, value in ray.get(group.state_dict()).items():
            assert torch.equal(value, merged[key]), key

        # (5) the final model: merged weights as a plain HF model, adapters beside it
        saved = tmp_path / "final"
        group.save(str(saved))
    finally:
        group.shutdown()
    plain = load_model(saved)
    for key, value in plain.state_dict().items():
        assert torch.equal(value, merged[key]), key
    from peft import PeftModel

    reloaded = PeftModel.from_pretrained(load_model(micro_policy), str(saved / "adapter"))
    weights = reloaded.get_base_model().state_dict()  # the trained adapters, as they were
    assert weights.keys() == own.keys()
    for key in adapters:
        assert torch.equal(weights[key], own[key]), key


def test_lora_learner_holds_no_reference_copy(micro_policy, ray_local):
    """In process: a learner asked for a reference (KL on) loads a second model without
    LoRA and none with it, also when an act-mode response turns the KL on mid-run; the
    reference log-probs are computed only while the KL coefficient is above 0."""
    import dataclasses

    from tether.actors.learner import Learner

    batch = _batches(micro_policy, 1)[0]
    threads = torch.get_num_threads()
    try:
        full = Learner.__ray_actor_class__(str(micro_policy), False, 1, use_reference=True)
        full.start_run(SETTINGS, lr=1e-3, critic_lr=0.0, seed=0)
        assert full.reference is not None  # the control: full fine-tuning keeps a copy
        lora = Learner.__ray_actor_class__(
            str(micro_policy), False, 1, use_reference=True, lora=LORA
        )
        lora.start_run(dataclasses.replace(SETTINGS, kl_coef=0.0), lr=1e-3, critic_lr=0.0, seed=0)
        assert lora.reference is None
        assert lora.prepare(copy.deepcopy(batch), True).ref_logprobs is None  # KL off: no pass
        lora.adjust(SETTINGS, lr=1e-3)  # KL raised mid-run: still nothing loaded
        assert lora.reference is None
        lora.update(lora.prepare(copy.deepcopy(batch), True))
        expected = full.prepare(copy.deepcopy(batch), True).ref_logprobs
        assert torch.equal(lora.prepare(copy.deepcopy(batch), True).ref_logprobs, expected)

        def weights_held(learner) -> set[int]:  # storages of every module it holds
            modules = [v for v in vars(learner).values() if isinstance(v, torch.nn.Module)]
            return {p.data_ptr() for m in modules for p in m.parameters()}

        # the policy's weights and nothing else (peft's wrapper holds that same module)
        assert weights_held(lora) == {p.data_ptr() for p in lora.model.parameters()}
        assert len(weights_held(full)) == 2 * len(list(full.model.parameters()))
    finally:
        torch.set_num_threads(threads)


# -- through the driver ---------------------------------------------------------------


def test_run_with_lora_end_to_end(micro_policy, ray_local, tmp_path):
    """Two iterations through the Trainer with ``model.lora``: KL against the adapters-off
    reference, merged weights synced to the workers, diagnostics and gradient SNR on the
    adapted model, checkpoints, and the final model saved merged with its adapters."""
    from mlflow.tracking import MlflowClient

    from tether.platform.run.trainer import Trainer

    cfg = build_config(
        micro_config_dict(
            tmp_path,
            model={"lora": {"r": 4, "alpha": 8.0}},
            rollout={"num_workers": 1, "num_cpus_per_worker": 0.5},
            algo={"kl_coef": 0.05, "lr": 2e-2, "num_cpus": 0.5, "threads": 1},
            diagnostics={"every": 2, "max_pairs": 8, "grad_snr_every": 2, "grad_snr_buckets": 2},
            filter={"strategy": "none"},
        )
    )
    cfg.model.cache_dir = micro_policy.parent
    summary = Trainer(cfg).run()
    assert summary.status == "FINISHED" and summary.iterations == 2
    client = MlflowClient(summary.tracking_uri)
    run = client.get_run(summary.run_id)
    assert run.data.params["model.lora.r"] == "4"
    kl = {m.step: m.value for m in client.get_metric_history(summary.run_id, "actor/kl_loss")}
    assert kl[1] == pytest.approx(0.0, abs=1e-6)  # first update: policy = reference (B = 0)
    assert kl[2] > 1e-6  # then the adapted policy has left the base model
    assert "grad_snr/q1/task_grad_norm" in run.data.metrics
    assert "collapse/first_turn/num_pairs" in run.data.metrics
    assert len(list((tmp_path / "runs" / "checkpoints" / summary.run_id).glob("iter_*.pt"))) > 0
    final = tmp_path / "runs" / "models" / summary.run_id
    assert (final / "adapter" / "adapter_config.json").is_file()
    trained, base = load_model(final).state_dict(), load_model(micro_policy).state_dict()
    assert trained.keys() == base.keys()
    q = "model.layers.0.self_attn.q_proj.weight"  # adapted: moved; the embedding: not
    assert float((trained[q] - base[q]).abs().max()) > 1e-4
    assert torch.equal(trained["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
