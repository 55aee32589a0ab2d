"""The learner update on a real (micro) model: direction of the step, and micro-batching
that changes memory but never the math."""

import copy

import pytest
import torch

from tests.test_episode import _setup
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
from tether.algos.batch import collate, token_logprobs
from tether.algos.update import autocast, lr_factor, policy_update
from tether.algos.vocab import head_logits
from tether.testing.settings import update_settings


@pytest.fixture(scope="module")
def sampled(micro_policy):
    model, tok, formatter, engine, sampling = _setup(micro_policy)
    specs = [EpisodeSpec(g, 40 + g, k) for g in range(2) for k in range(3)]
    trajs = run_episodes(
        engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 5
    )
    batch = collate(trajs, tok.pad_token_id)
    batch.old_logprobs = batch.sampling_logprobs.clone()
    sign = torch.tensor([1.0 if t.group_id == 0 else -1.0 for t in trajs])
    batch.advantages = sign[:, None] * batch.response_mask  # [B, T]
    return model, batch, sign


def _mean_logprob(model, batch, rows):
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    mask = batch.response_mask[rows]
    return float((lp[rows] * mask).sum() / mask.sum())


def test_update_raises_positive_and_lowers_negative_advantage_tokens(sampled):
    model, batch, sign = sampled
    model = copy.deepcopy(model)
    pos, neg = torch.nonzero(sign > 0).squeeze(-1), torch.nonzero(sign < 0).squeeze(-1)
    before = _mean_logprob(model, batch, pos), _mean_logprob(model, batch, neg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = policy_update(
        model, optimizer, batch, update_settings(micro_batch_size=4, minibatches=1)
    )
    after = _mean_logprob(model, batch, pos), _mean_logprob(model, batch, neg)
    assert after[0] > before[0] and after[1] < before[1]
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/pg_clipfrac"] == 0.0


@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "turn-mean-token-mean"]
)
def test_micro_batching_does_not_change_the_gradient(sampled, agg):
    model, batch, _ = sampled
    grads = []
    for micro in (1, 2, 6):
        m = copy.deepcopy(model)
        optimizer = torch.optim.SGD(m.parameters(), lr=0.0)  # keep the weights, read the grads
        policy_update(
            m,
            optimizer,
            batch,
            update_settings(
                micro_batch_size=micro, loss_agg=agg, entropy_coef=0.01, max_grad_norm=1e9
            ),
        )
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4)
    assert torch.allclose(grads[0], grads[2], atol=1e-5, rtol=1e-4)


def test_reasoning_token_entropy_is_the_policy_entropy_on_reasoning_tokens(sampled, micro_policy):
    from tether.agent.chat import ChatFormatter
    from tether.agent.pairs import SpanExtractor

    model, batch, _ = sampled
    _, tok, formatter, engine, sampling = _setup(micro_policy)
    specs = [EpisodeSpec(g, 40 + g, k) for g in range(2) for k in range(3)]
    trajs = run_episodes(
        engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 5
    )
    spans = SpanExtractor(ChatFormatter(tok))
    masks = [spans.reasoning_mask(t) for t in trajs]
    # The mask covers exactly each turn's reasoning span, inside the agent's tokens.
    for traj, mask in zip(trajs, masks):
        expected = [tok_id for turn in spans.turns(traj) for tok_id in turn.reasoning_ids]
        assert [t for t, m in zip(traj.token_ids, mask) if m] == expected
        assert all(traj.loss_mask[i] for i, m in enumerate(mask) if m)
    with_mask = collate(trajs, tok.pad_token_id, reasoning_masks=masks)
    assert torch.equal(with_mask.input_ids, batch.input_ids)  # same episodes as the fixture
    assert 0 < with_mask.reasoning_mask.sum() < with_mask.response_mask.sum()
    with_mask.old_logprobs, with_mask.advantages = batch.old_logprobs, batch.advantages
    m = copy.deepcopy(model)
    optimizer = torch.optim.SGD(m.parameters(), lr=0.0)  # weights stay: pre-update entropy
    metrics = policy_update(m, optimizer, with_mask, update_settings(micro_batch_size=4))
    with torch.no_grad():
        _, entropy = token_logprobs(model, batch.input_ids, batch.attention_mask, with_entropy=True)
    reasoning = with_mask.reasoning_mask
    expected = float((entropy * reasoning).sum() / reasoning.sum())
    assert metrics["collapse/reasoning_token_entropy"] == pytest.approx(expected, rel=1e-5)
    response = float((entropy * batch.response_mask).sum() / batch.response_mask.sum())
    assert expected != pytest.approx(response, rel=1e-3)  # not the all-response entropy
    plain = copy.deepcopy(model)  # no reasoning mask: no metric
    assert "collapse/reasoning_token_entropy" not in policy_update(
        plain, torch.optim.SGD(plain.parameters(), lr=0.0), batch, update_settings()
    )


def test_update_reports_its_size_and_the_advantages_it_learned_from(sampled):
    """actor/update_ratio = ||θ_after − θ_before|| / ||θ_before|| over the trained weights,
    0 when the learning rate is 0; the advantage statistics are those of the trained tokens."""
    model, batch, sign = sampled
    for lr in (0.0, 1e-3):
        m = copy.deepcopy(model)
        before = torch.cat([p.detach().flatten() for p in m.parameters()])
        metrics = policy_update(
            m, torch.optim.AdamW(m.parameters(), lr=lr), batch, update_settings(micro_batch_size=6)
        )
        after = torch.cat([p.detach().flatten() for p in m.parameters()])
        expected = float((after - before).norm() / before.norm())
        assert metrics["actor/update_ratio"] == pytest.approx(expected, rel=1e-4, abs=1e-12)
        assert (metrics["actor/update_ratio"] > 0) == (lr > 0)
    tokens = batch.response_mask.sum(-1)  # [B] trained tokens per row
    assert metrics["actor/trained_tokens"] == float(tokens.sum())
    assert metrics["actor/advantage_abs_mean"] == pytest.approx(1.0)
    assert metrics["actor/advantage_pos_frac"] == pytest.approx(
        float(tokens[sign > 0].sum() / tokens.sum())
    )
    assert metrics["actor/advantage_zero_frac"] == 0.0


def test_adam_eps_reaches_the_policy_optimiser(micro_policy):
    """``algo.adam_eps`` is the epsilon of the optimiser the learner builds (default
    torch's 1e-8), not only a field of the settings."""
    from tether.actors.learner import Learner
    from tether.algos.settings import AlgoConfig

    assert AlgoConfig().adam_eps == 1e-8
    threads = torch.get_num_threads()
    try:
        learner = Learner.__ray_actor_class__(str(micro_policy), False, 1, use_reference=False)
        for eps in (1e-8, 1e-4):
            learner.start_run(update_settings(adam_eps=eps), lr=1e-3, critic_lr=0.0, seed=0)
            assert [g["eps"] for g in learner.optimizer.param_groups] == [eps]
    finally:
        torch.set_num_threads(threads)


def test_lr_factor_decays_from_one_toward_zero():
    """The schedules as a scheduler stepped once per update: linear 1, 3/4, 1/2, 1/4 over
    four updates (TRL's linear decay), the half cosine through 1/2 at the midpoint; the
    constant schedule stays at 1; a decaying one without a horizon is an error (it would
    be constant without a word); past the horizon (a resumed run given more iterations)
    the rate holds at the last update's."""
    assert [lr_factor("linear", u, 4) for u in range(4)] == [1.0, 0.75, 0.5, 0.25]
    cosine = [lr_factor("cosine", u, 4) for u in range(4)]
    assert cosine[0] == 1.0 and cosine[2] == pytest.approx(0.5)
    assert all(a > b > 0 for a, b in zip(cosine, cosine[1:]))
    assert lr_factor("constant", 3, 4) == 1.0 and lr_factor("constant", 3, 0) == 1.0
    assert lr_factor("linear", 9, 4) == 0.25
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_factor("step", 1, 4)
    with pytest.raises(ValueError, match="horizon"):
        lr_factor("linear", 3, 0)


def test_a_decaying_rate_needs_the_runs_iterations():
    """No silent horizon of 0 (issue 72): ``from_config`` takes the iterations by name,
    refuses fewer than one under a decaying schedule, and the tests' helper asks for them."""
    from tether.algos.settings import AlgoConfig
    from tether.algos.update import UpdateSettings

    algo = AlgoConfig(lr_schedule="cosine")
    with pytest.raises(TypeError):
        UpdateSettings.from_config(algo, 1.0)  # the missing iterations are the test
    with pytest.raises(ValueError, match="iterations=0"):
        UpdateSettings.from_config(algo, 1.0, iterations=0)
    assert UpdateSettings.from_config(algo, 1.0, iterations=30).lr_horizon == 30
    with pytest.raises(TypeError, match="iterations"):
        update_settings(lr_schedule="linear")
    assert update_settings().lr_horizon == 1


def test_the_learner_steps_at_the_scheduled_rate(sampled, micro_policy):
    """``algo.lr_schedule`` reaches the optimiser: each update steps at the base rate
    times its factor and logs it as ``actor/lr``; an act-mode response's new rate
    (``adjust``) is a new base the schedule goes on scaling.  A run's settings span its
    iterations."""
    from tether.actors.learner import Learner
    from tether.platform.config import build_config
    from tether.platform.run.alarm_responder import LiveSettings

    _, batch, _ = sampled
    threads = torch.get_num_threads()
    try:
        learner = Learner.__ray_actor_class__(str(micro_policy), False, 1, use_reference=False)
        settings = update_settings(lr_schedule="linear", iterations=4)
        learner.start_run(settings, lr=1e-3, critic_lr=0.0, seed=0)
        rates = []
        for u in range(4):
            if u == 2:
                learner.adjust(settings, lr=4e-3)
            rates.append(learner.update(copy.deepcopy(batch))["actor/lr"])
            assert [g["lr"] for g in learner.optimizer.param_groups] == [rates[-1]]
        assert rates == pytest.approx([1e-3, 0.75e-3, 2e-3, 1e-3])
        learner.start_run(update_settings(), lr=1e-3, critic_lr=0.0, seed=0)
        assert learner.update(copy.deepcopy(batch))["actor/lr"] == 1e-3
    finally:
        torch.set_num_threads(threads)
    cfg = build_config(None, ["trainer.iterations=7", "algo.lr_schedule=cosine"])
    update = LiveSettings.from_config(cfg).update
    assert (update.lr_schedule, update.lr_horizon) == ("cosine", 7)


def _gradient(model, batch, **algo):
    m = copy.deepcopy(model)
    optimizer = torch.optim.SGD(m.parameters(), lr=0.0)  # keep the weights, read the grads
    policy_update(m, optimizer, batch, update_settings(max_grad_norm=1e9, **algo))
    return torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])


def test_bfloat16_autocast_keeps_the_gradient_and_float32_log_probs(sampled):
    """``algo.autocast: bfloat16`` runs the body in bfloat16: the update's gradient points
    where float32's does, the log-probs it is taken from are float32 and near float32's."""
    model, batch, _ = sampled
    full, mixed = _gradient(model, batch), _gradient(model, batch, autocast="bfloat16")
    assert not torch.equal(full, mixed)  # autocast did run
    assert torch.nn.functional.cosine_similarity(full, mixed, dim=0) > 0.99
    assert abs(float(mixed.norm() / full.norm()) - 1.0) < 0.05
    with torch.no_grad(), autocast(model, "bfloat16"):
        lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    with torch.no_grad():
        ref, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    assert lp.dtype == torch.float32
    error = (lp - ref).abs()[batch.response_mask.bool()]
    assert 0 < float(error.mean()) < 0.01 and float(error.max()) < 0.2


def test_the_head_leaves_autocast():
    """Under autocast the vocabulary head runs on float32 states in float32: its logits
    are those of the float32 head, not bfloat16-rounded ones."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 32, bias=False)
    states = torch.randn(5, 16) * 4
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = head_logits(states.bfloat16(), head)
        plain = head(states)  # what autocast alone would give
    assert inside.dtype == torch.float32 and plain.dtype == torch.bfloat16
    assert torch.equal(inside, head(states.bfloat16().float()))
    # A head stored in bfloat16 (a model loaded so) takes bfloat16 states, as without
    # autocast (the diagnostics score such models under diagnostics.autocast: auto).
    stored = torch.nn.Linear(16, 32, bias=False).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head_logits(states, stored)
    assert logits.dtype == torch.float32
    assert torch.equal(logits, stored(states.bfloat16()).float())


def test_auto_autocast_follows_the_hardware(monkeypatch):
    from tether.policy import precision

    assert precision.resolve_autocast("none", "cpu") == "none"
    assert precision.resolve_autocast("bfloat16", "cpu") == "bfloat16"
    for native, expected in ((True, "bfloat16"), (False, "none")):
        monkeypatch.setattr(precision, "cpu_has_bf16", lambda native=native: native)
        assert precision.resolve_autocast("auto", "cpu") == expected
    assert precision.resolve_autocast("auto", "mps") == "none"
