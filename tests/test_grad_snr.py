"""Gradient SNR by reward-variance bucket (docs/methods.md, section 10) on a toy model with known gradients."""

import numpy as np
import pytest
import torch

from tether.diagnostics.grad_snr import bucket_grad_norms, grad_snr_metrics, rv_buckets


def test_rv_buckets_are_equal_count_quantiles_lowest_first():
    rv = np.array([0.9, 0.0, 0.5, 0.1, 0.0, 0.7, 0.3, 0.2, 0.0, 0.6, 0.4, 0.8])
    buckets = rv_buckets(rv, n_buckets=6)
    assert buckets == [[1, 4], [8, 3], [7, 6], [10, 2], [9, 5], [11, 0]]  # ties keep batch order
    means = [rv[b].mean() for b in buckets]
    assert means == sorted(means)
    assert sorted(i for b in buckets for i in b) == list(range(12))
    uneven = rv_buckets(np.arange(8.0), n_buckets=3)
    assert [len(b) for b in uneven] == [3, 3, 2]
    assert rv_buckets(np.array([0.2, 0.1]), n_buckets=6) == [[1], [0]]
    assert rv_buckets(np.array([]), n_buckets=6) == []
    with pytest.raises(ValueError):
        rv_buckets(rv, n_buckets=0)


class Toy(torch.nn.Module):
    def __init__(self, dim=5):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, dim))
        self.frozen = torch.nn.Parameter(torch.ones(dim), requires_grad=False)


def test_task_gradient_grows_with_rv_while_the_regulariser_stays_flat():
    torch.manual_seed(0)
    dim = 5
    model = Toy(dim)
    rv = np.linspace(0.0, 1.0, 12)
    features = torch.randn(12, dim)
    reference = torch.zeros(dim)
    sign = torch.ones(dim)

    def task_loss(groups):
        # Policy-gradient-like: each group's pull scales with its reward spread.
        scale = torch.as_tensor(rv[groups], dtype=torch.float32)
        return (scale[:, None] * sign * model.w).sum(1).mean()  # grad = mean(rv) * sign

    def reg_loss(groups):
        # KL-like pull to a reference, identical for every group.
        return 0.5 * ((model.w - reference) ** 2).sum() + 0.0 * features[groups].sum()

    model.w.grad = torch.full((dim,), 7.0)  # an accumulation in progress
    buckets = rv_buckets(rv, n_buckets=6)
    rows = bucket_grad_norms(model, task_loss, reg_loss, buckets, group_reward_std=rv)
    assert [r["bucket"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for row, bucket in zip(rows, buckets):
        assert row["mean_rv"] == pytest.approx(rv[bucket].mean())
        assert row["task_grad_norm"] == pytest.approx(rv[bucket].mean() * np.sqrt(dim), rel=1e-6)
        assert row["reg_grad_norm"] == pytest.approx(float(model.w.detach().norm()), rel=1e-6)
        assert row["num_groups"] == 2
    task = [r["task_grad_norm"] for r in rows]
    assert all(a < b for a, b in zip(task, task[1:]))
    reg = [r["reg_grad_norm"] for r in rows]
    assert max(reg) - min(reg) < 1e-9
    snr = [r["snr"] for r in rows]
    assert all(a < b for a, b in zip(snr, snr[1:]))
    assert torch.equal(model.w.grad, torch.full((dim,), 7.0))  # untouched, nothing added
    assert model.frozen.grad is None


def test_grads_are_not_left_on_the_model_and_zero_regulariser_has_no_snr():
    model = Toy()
    rows = bucket_grad_norms(
        model, lambda g: model.w.sum() * len(g), lambda g: torch.tensor(0.0), [[0], [1, 2]]
    )
    assert model.w.grad is None
    assert [r["task_grad_norm"] for r in rows] == pytest.approx([np.sqrt(5), 2 * np.sqrt(5)])
    assert all(r["reg_grad_norm"] == 0.0 and "snr" not in r and "mean_rv" not in r for r in rows)


def test_metric_names():
    rows = [
        {
            "bucket": 1.0,
            "num_groups": 2.0,
            "task_grad_norm": 0.1,
            "reg_grad_norm": 0.2,
            "snr": 0.5,
            "mean_rv": 0.0,
        },
        {"bucket": 2.0, "num_groups": 2.0, "task_grad_norm": 0.3, "reg_grad_norm": 0.0},
    ]
    assert grad_snr_metrics(rows) == {
        "grad_snr/q1/task_grad_norm": 0.1,
        "grad_snr/q1/reg_grad_norm": 0.2,
        "grad_snr/q1/snr": 0.5,
        "grad_snr/q1/mean_rv": 0.0,
        "grad_snr/q1/num_groups": 2.0,
        "grad_snr/q2/task_grad_norm": 0.3,
        "grad_snr/q2/reg_grad_norm": 0.0,
        "grad_snr/q2/num_groups": 2.0,
    }


def test_task_and_regulariser_may_share_one_forward():
    model = Toy()
    rv = np.array([0.0, 1.0, 2.0])
    forwards = []

    def shared(groups):
        # One forward yields both losses, as a learner computing the PPO objective does.
        if not forwards or forwards[-1][0] != groups:
            hidden = model.w * 2.0
            task = float(rv[groups].mean()) * hidden.sum()
            reg = 0.5 * (hidden**2).sum()
            forwards.append((groups, task, reg))
        return forwards[-1]

    rows = bucket_grad_norms(
        model, lambda g: shared(g)[1], lambda g: shared(g)[2], [[0], [1], [2]], rv
    )
    assert len(forwards) == 3  # one forward per bucket
    assert [r["task_grad_norm"] for r in rows] == pytest.approx(
        [0.0, 2 * np.sqrt(5), 4 * np.sqrt(5)]
    )
    reg_norm = float((4 * model.w.detach()).norm())  # d/dw 0.5 (2w)^2 = 4w
    assert [r["reg_grad_norm"] for r in rows] == pytest.approx([reg_norm] * 3)
    assert model.w.grad is None


def test_micro_batched_grad_snr_equals_one_forward_per_bucket(micro_policy, monkeypatch):
    """The learner's gradient SNR on a real micro-model batch: the fast path (group-ordered
    micro-batches, trimmed, each group's prompt run once by the shared-prefix forward,
    zero-advantage task passes skipped, gradients summed) gives the reference's norms (one
    plain forward per bucket padded to the batch) for every loss aggregation, with
    micro-batches inside a group and across groups, with and without shared prefixes."""
    import tether.algos.update as update
    from tests.test_episode import _setup
    from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
    from tether.algos.batch import collate
    from tether.algos.update import trimmed_rows
    from tether.diagnostics.runner import gradient_snr
    from tether.testing.settings import update_settings

    shared_calls = []
    real_shared = update.shared_prefix_token_logprobs
    monkeypatch.setattr(
        update,
        "shared_prefix_token_logprobs",
        lambda *a, **k: shared_calls.append(1) or real_shared(*a, **k),
    )
    model, tok, formatter, engine, sampling = _setup(micro_policy)
    specs = [EpisodeSpec(g, 70 + g, k) for g in range(4) for k in range(3)]
    trajs = run_episodes(
        engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 3
    )
    batch = collate(trajs, tok.pad_token_id)
    batch.scores = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.5, 1.0, 0.0, 0.2, 0.3, 0.9, 0.1])
    batch.old_logprobs = batch.sampling_logprobs.clone()
    batch.ref_logprobs = batch.sampling_logprobs - 0.05 * batch.response_mask
    mean = torch.stack([batch.scores[batch.group_index == g].mean() for g in batch.group_index])
    batch.advantages = (batch.scores - mean)[:, None] * batch.response_mask
    lengths = batch.attention_mask.sum(dim=1)
    assert int(lengths.min()) < batch.input_ids.shape[1]  # something to trim
    short = trimmed_rows(batch, torch.nonzero(lengths < lengths.max()).squeeze(-1))
    assert short.input_ids.shape[1] < batch.input_ids.shape[1]
    assert short.advantages.shape == short.input_ids.shape and short.scores.shape == (short.size,)
    for agg in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum"):
        for micro, shared in ((2, True), (4, True), (2, False)):
            settings = update_settings(
                kl_coef=0.05,
                entropy_coef=0.01,
                loss_agg=agg,
                micro_batch_size=micro,
                shared_prefix=shared,
            )
            calls = len(shared_calls)
            fast = gradient_snr(model, batch, settings, n_buckets=4, micro_batched=True)
            assert (len(shared_calls) > calls) == shared  # the shared-prefix forward ran
            slow = gradient_snr(model, batch, settings, n_buckets=4, micro_batched=False)
            assert set(fast) == set(slow) and "grad_snr/q4/task_grad_norm" in fast
            for key, value in slow.items():
                assert fast[key] == pytest.approx(value, rel=1e-5, abs=1e-9), (
                    agg,
                    micro,
                    shared,
                    key,
                )
    assert slow["grad_snr/q1/task_grad_norm"] == pytest.approx(
        0.0, abs=1e-12
    )  # all-zero group: no task signal
    assert slow["grad_snr/q4/task_grad_norm"] > 0 and slow["grad_snr/q4/reg_grad_norm"] > 0
    assert all(p.grad is None for p in model.parameters())


def test_grad_snr_with_all_rewards_equal_reports_zero_task_gradient(micro_policy):
    """A degenerate batch (every group's rewards equal: no task signal anywhere) gives
    finite metrics, a zero task gradient in every bucket, and no exception."""
    from tests.test_episode import _setup
    from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
    from tether.algos.batch import collate
    from tether.diagnostics.runner import gradient_snr
    from tether.testing.settings import update_settings

    model, tok, formatter, engine, sampling = _setup(micro_policy)
    specs = [EpisodeSpec(g, 90 + g, k) for g in range(3) for k in range(2)]
    batch = collate(
        run_episodes(engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 2),
        tok.pad_token_id,
    )
    batch.scores = torch.zeros(batch.size)
    batch.old_logprobs = batch.sampling_logprobs.clone()
    batch.ref_logprobs = batch.sampling_logprobs - 0.05 * batch.response_mask
    batch.advantages = torch.zeros_like(batch.response_mask, dtype=torch.float32)
    metrics = gradient_snr(model, batch, update_settings(kl_coef=0.05), n_buckets=6)
    assert metrics and all(np.isfinite(v) for v in metrics.values() if v is not None)
    assert all(v == 0.0 for k, v in metrics.items() if k.endswith("task_grad_norm"))
    assert any(v > 0 for k, v in metrics.items() if k.endswith("reg_grad_norm"))
