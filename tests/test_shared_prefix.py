"""The shared-prefix forward (each GRPO group's prompt run once) against the plain
forward: same log-probs and entropy, and one optimiser step with the same loss and
gradients to 1e-5 (issue 8's equivalence test)."""

import copy

import pytest
import torch

from tether.agent.chat import ChatFormatter
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
from tether.algos import update as update_module
from tether.algos.advantages import AdvantageInputs, compute_advantages
from tether.algos.batch import collate, token_logprobs
from tether.algos.shared_prefix import (
    group_prefix_lengths,
    shared_prefix_saving,
    shared_prefix_token_logprobs,
)
from tether.algos.update import policy_update, prepare_batch
from tether.policy.tiny import build_tiny_model, tiny_config
from tether.policy.warmstart import build_tokenizer, demonstration_episodes
from tether.rollout import make_engine
from tether.rollout.base import SamplingParams
from tether.testing.settings import update_settings


@pytest.fixture(scope="module")
def policy():
    episodes = demonstration_episodes(
        "tether/Countdown-v0", {}, 64, 0.0, seed=7, max_reply_tokens=32
    )
    tok = build_tokenizer(episodes, 256)
    config = tiny_config(
        "micro",
        vocab_size=max(256, len(tok)),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return build_tiny_model(config, seed=3), tok


def _sampled_batch(policy, env_id, groups, group_size, max_new, seed):
    model, tok = policy
    engine = make_engine(
        "hf",
        copy.deepcopy(model),
        pad_token_id=tok.pad_token_id,
        eos_token_ids=[tok.eos_token_id],
        tokenizer=tok,
    )
    specs = [EpisodeSpec(g, 11 + g, k) for g in range(groups) for k in range(group_size)]
    sampling = SamplingParams(
        max_new_tokens=max_new, temperature=1.0, stop_token_ids=(tok.eos_token_id,)
    )
    trajs = run_episodes(
        engine, ChatFormatter(tok), LocalEnvBatch(env_id), specs, sampling, seed=seed, max_turns=2
    )
    batch = collate(trajs, tok.pad_token_id)
    # Rows of a group ending at different lengths: cut row i's last i % 5 tokens.
    for row in range(batch.size):
        end = int(batch.attention_mask[row].sum()) - row % 5
        for name in ("attention_mask", "response_mask", "token_rewards", "sampling_logprobs"):
            getattr(batch, name)[row, end:] = 0
        batch.input_ids[row, end:] = tok.pad_token_id
    return batch


@pytest.fixture(scope="module")
def countdown_batch(policy):
    return _sampled_batch(policy, "tether/Countdown-v0", groups=3, group_size=4, max_new=24, seed=1)


@pytest.fixture(scope="module")
def frozenlake_batch(policy):
    """Two turns: rows of a group share only the first prompt."""
    return _sampled_batch(
        policy, "tether/FrozenLake-v0", groups=2, group_size=3, max_new=12, seed=2
    )


@pytest.mark.parametrize("which", ["countdown_batch", "frozenlake_batch"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_entropy_match_the_plain_forward(policy, request, which, temperature):
    model, _ = policy
    batch = request.getfixturevalue(which)
    inverse, _, prefix_len = group_prefix_lengths(
        batch.input_ids, batch.attention_mask, batch.group_index
    )
    assert shared_prefix_saving(batch.attention_mask, inverse, prefix_len) < 0.8
    with torch.no_grad():
        plain, plain_ent = token_logprobs(
            model, batch.input_ids, batch.attention_mask, temperature, with_entropy=True
        )
        shared, shared_ent = shared_prefix_token_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.group_index,
            temperature,
            with_entropy=True,
        )
    real = batch.attention_mask.bool()
    real[:, 0] = False
    assert torch.allclose(shared[real], plain[real], atol=1e-5, rtol=0)
    assert torch.allclose(shared_ent[real], plain_ent[real], atol=1e-5, rtol=0)
    assert torch.all(shared[~real] == 0) and torch.all(shared_ent[~real] == 0)


def test_prefix_lengths_are_the_groups_common_prompt(countdown_batch):
    b = countdown_batch
    inverse, first_row, prefix_len = group_prefix_lengths(
        b.input_ids, b.attention_mask, b.group_index
    )
    for g in range(len(prefix_len)):
        rows = (inverse == g).nonzero().squeeze(-1)
        prompt_end = int(b.response_mask[rows[0]].nonzero()[0])  # first sampled token
        # At least the whole prompt is shared (replies may also agree on first tokens).
        assert int(prefix_len[g]) >= prompt_end
        p = int(prefix_len[g])
        assert all(torch.equal(b.input_ids[r, :p], b.input_ids[first_row[g], :p]) for r in rows)


def _one_step(model, reference, batch, settings):
    """Loss metrics and the gradient of one policy_update (SGD lr 0: weights unchanged)."""
    m = copy.deepcopy(model)
    b = copy.deepcopy(batch)
    b = prepare_batch(b, m, settings, recompute_old_logprobs=False, reference=reference)
    inputs = AdvantageInputs(
        scores=b.scores,
        group_index=b.group_index,
        response_mask=b.response_mask,
        token_rewards=b.token_rewards,
    )
    b.advantages, b.returns = compute_advantages("grpo", inputs)
    optimizer = torch.optim.SGD(m.parameters(), lr=0.0)
    metrics = policy_update(m, optimizer, b, settings, seed=0)
    grad = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
    return metrics, grad, b


@pytest.mark.parametrize("micro_batch_size", [4, 8, 12])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_one_step_loss_and_gradients_match_the_unoptimised_path(
    policy, countdown_batch, monkeypatch, micro_batch_size, agg
):
    model, _ = policy
    torch.manual_seed(0)
    reference = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():  # a reference that differs from the policy, so the KL term is live
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = copy.deepcopy(countdown_batch)
    # Non-zero advantages in every group and old log-probs away from the current ones,
    # so the clipped surrogate, the KL and the entropy terms all carry gradient.
    batch.scores = torch.arange(batch.size, dtype=torch.float32) % 3
    batch.sampling_logprobs = (
        batch.sampling_logprobs
        + 0.1 * torch.randn_like(batch.sampling_logprobs) * batch.response_mask
    )
    common = dict(
        kl_coef=0.04,
        kl_estimator="k3",
        entropy_coef=0.01,
        loss_agg=agg,
        micro_batch_size=micro_batch_size,
        max_grad_norm=1e9,
    )

    calls = {"shared": 0}
    real_shared = update_module.shared_prefix_token_logprobs

    def counting(*args, **kwargs):
        calls["shared"] += 1
        return real_shared(*args, **kwargs)

    monkeypatch.setattr(update_module, "shared_prefix_token_logprobs", counting)
    plain_metrics, plain_grad, plain_batch = _one_step(
        model, reference, batch, update_settings(shared_prefix=False, **common)
    )
    assert calls["shared"] == 0
    fast_metrics, fast_grad, fast_batch = _one_step(
        model, reference, batch, update_settings(shared_prefix=True, **common)
    )
    assert calls["shared"] > 0  # the optimised path really ran

    real = batch.response_mask.bool()
    assert torch.allclose(fast_batch.ref_logprobs[real], plain_batch.ref_logprobs[real], atol=1e-5)
    # Per-micro-batch partial losses sum to the step's loss; both paths have the same
    # number of micro-batches, so equal means are equal losses.
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/reg_loss"):
        assert fast_metrics[key] == pytest.approx(plain_metrics[key], abs=1e-5), key
    assert plain_metrics["actor/kl_loss"] > 1e-4 and abs(plain_metrics["actor/pg_loss"]) > 1e-4
    assert plain_grad.abs().max() > 1e-3
    assert torch.allclose(fast_grad, plain_grad, atol=1e-5, rtol=1e-4)


def _cut_rows(batch, keep, pad_id):
    """A copy of ``batch`` whose row r keeps its first ``keep[r]`` tokens."""
    batch = copy.deepcopy(batch)
    for row, end in enumerate(keep):
        for name in ("attention_mask", "response_mask", "token_rewards", "sampling_logprobs"):
            getattr(batch, name)[row, end:] = 0
        batch.input_ids[row, end:] = pad_id
    return batch


@pytest.fixture(scope="module")
def ragged_batch(policy, frozenlake_batch):
    """Rows of every group alternately short (first turn only) and long: a multi-turn
    batch whose episodes end after different numbers of turns."""
    _, tok = policy
    batch = _sampled_batch(
        policy, "tether/FrozenLake-v0", groups=4, group_size=4, max_new=12, seed=3
    )
    lengths = batch.attention_mask.sum(-1)
    first_reply = [int(batch.response_mask[r].nonzero()[0]) for r in range(batch.size)]
    keep = [int(lengths[r]) if r % 2 else first_reply[r] + 4 for r in range(batch.size)]
    return _cut_rows(batch, keep, tok.pad_token_id)


def test_ragged_rows_are_cut_by_length_and_equal_groups_by_group(ragged_batch, countdown_batch):
    from tether.algos.micro_batches import forward_positions, plan_micro_batches

    def positions(batch, plan):
        return sum(forward_positions(batch, chunk, True) for chunk in plan)

    # Rows of distinct prompts (as in a minibatch cut from many groups): no prefix to
    # share, so short and long rows go to separate micro-batches.
    batch = copy.deepcopy(ragged_batch)
    batch.group_index = torch.arange(batch.size)
    rows = torch.arange(batch.size)
    plan = plan_micro_batches(batch, rows, 4, shared_prefix=True)
    assert sorted(torch.cat(plan).tolist()) == rows.tolist()  # every row once
    assert all(len(chunk) <= 4 for chunk in plan)
    long = batch.attention_mask.sum(-1) > batch.attention_mask.sum(-1).median()
    assert all(len(set(long[chunk].tolist())) == 1 for chunk in plan)
    assert positions(batch, plan) < positions(batch, list(torch.split(rows, 4)))

    # One turn, rows of a group about equally long: whole groups, each prompt run once.
    rows = torch.arange(countdown_batch.size)
    plan = plan_micro_batches(countdown_batch, rows, 4, shared_prefix=True)
    assert [len(set(countdown_batch.group_index[c].tolist())) for c in plan] == [1, 1, 1]


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_the_update_is_the_same_however_its_rows_are_cut(policy, ragged_batch, shared_prefix):
    """Micro-batches planned by length (3 rows at most) against one plain forward per
    minibatch: the same gradient, and the same logged losses and fractions."""
    model, _ = policy
    batch = copy.deepcopy(ragged_batch)
    batch.scores = torch.arange(batch.size, dtype=torch.float32) % 3
    batch.sampling_logprobs = (
        batch.sampling_logprobs
        + 0.1
        * torch.randn(batch.sampling_logprobs.shape, generator=torch.Generator().manual_seed(0))
        * batch.response_mask
    )
    reference = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    common = dict(kl_coef=0.04, entropy_coef=0.01, minibatches=2, max_grad_norm=1e9)
    whole, whole_grad, _ = _one_step(
        model,
        reference,
        batch,
        update_settings(micro_batch_size=batch.size, shared_prefix=False, **common),
    )
    planned, planned_grad, _ = _one_step(
        model,
        reference,
        batch,
        update_settings(micro_batch_size=3, shared_prefix=shared_prefix, **common),
    )
    assert torch.allclose(planned_grad, whole_grad, atol=1e-5, rtol=1e-4)
    assert whole_grad.abs().max() > 1e-3
    for key in (
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/entropy_loss",
        "actor/pg_clipfrac",
        "actor/approx_kl",
        "actor/entropy",
    ):
        assert planned[key] == pytest.approx(whole[key], abs=1e-5), key
    assert whole["actor/pg_clipfrac"] > 0 and abs(whole["actor/pg_loss"]) > 1e-4
