"""Multi-turn episodes with a real (micro, warm-started) model, engine and environments."""

import pytest
import torch

from tether.agent.chat import ChatFormatter
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, first_prompt_ids, run_episodes
from tether.agent.format import ANSWER_CLOSE, THINK_OPEN
from tether.algos.batch import collate, token_logprobs
from tether.policy.load import load_model_and_tokenizer
from tether.rollout import make_engine
from tether.rollout.base import SamplingParams


def _setup(path, tokenizer=None):
    """The model, its tokenizer (or ``tokenizer``), formatter, HF engine and sampling."""
    model, tok = load_model_and_tokenizer(path)
    tok = tokenizer or tok
    formatter = ChatFormatter(tok)
    engine = make_engine(
        "hf", model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id], tokenizer=tok
    )
    [answer_close] = formatter.encode(ANSWER_CLOSE)
    sampling = SamplingParams(
        max_new_tokens=48, temperature=1.0, stop_token_ids=(answer_close, tok.eos_token_id)
    )
    return model, tok, formatter, engine, sampling


def test_the_loop_starts_from_the_one_first_prompt(micro_policy):
    """Every episode's first prompt is ``first_prompt_ids`` of its level, the prompt the
    benchmarks that score first turns build (a benchmark that assembled its own once
    scored a different layout than the runs sample from)."""
    _, tok, formatter, engine, sampling = _setup(micro_policy)
    envs = LocalEnvBatch("tether/FrozenLake-v0")
    trajs = run_episodes(engine, formatter, envs, [EpisodeSpec(0, 7, 0)], sampling, seed=1)
    obs = LocalEnvBatch("tether/FrozenLake-v0").reset([7])[0]
    prompt = first_prompt_ids(
        formatter, obs.rules, obs.state, obs.actions_left, sampling.max_new_tokens
    )
    assert trajs[0].token_ids[: trajs[0].turns[0].prompt_end][: len(prompt)] == prompt
    assert "Turn 1:" in tok.decode(prompt) and obs.state.strip() in tok.decode(prompt)


def test_episode_layout_masks_and_logprobs(micro_policy):
    model, tok, formatter, engine, sampling = _setup(micro_policy)
    specs = [EpisodeSpec(g, 100 + g, k) for g in range(2) for k in range(3)]
    trajs = run_episodes(
        engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, seed=3
    )
    assert len(trajs) == 6
    think_id = formatter.encode(THINK_OPEN)[0]
    for traj in trajs:
        assert 1 <= len(traj.turns) <= 5
        assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.sampling_logprobs)
        # Agent tokens are exactly the replies; every reply follows a forced <think>.
        assert sum(traj.loss_mask) == sum(t.reply_end - t.reply_start for t in traj.turns)
        for turn in traj.turns:
            assert traj.token_ids[turn.reply_start - 1] == think_id
            assert all(traj.loss_mask[turn.reply_start : turn.reply_end])
            assert not traj.loss_mask[turn.reply_start - 1]
        rewards = traj.token_rewards()
        assert sum(rewards) == sum(t.reward for t in traj.turns) == traj.reward
    # The sampler's log-probs are the model's own log-probs of those tokens (temperature 1).
    batch = collate(trajs, tok.pad_token_id)
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    mask = batch.response_mask.bool()
    assert torch.allclose(lp[mask], batch.sampling_logprobs[mask], atol=2e-4)


def test_same_seed_same_episodes(micro_policy):
    _, _, formatter, engine, sampling = _setup(micro_policy)
    specs = [EpisodeSpec(0, 5, k) for k in range(4)]
    a = run_episodes(engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 11)
    b = run_episodes(engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 11)
    c = run_episodes(engine, formatter, LocalEnvBatch("tether/FrozenLake-v0"), specs, sampling, 12)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert [t.token_ids for t in a] != [t.token_ids for t in c]


def test_warm_start_cache_is_reused(micro_policy, models_dir):
    from tests.conftest import micro_config_dict
    from tether.platform.config import build_config
    from tether.policy.load import resolve_policy

    cfg = build_config(micro_config_dict(models_dir.parent))
    cfg.model.cache_dir = models_dir
    stamp = (micro_policy / "recipe.json").stat().st_mtime_ns
    again = resolve_policy(cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens)
    assert again == micro_policy and (again / "recipe.json").stat().st_mtime_ns == stamp


def test_episode_end_says_how_each_episode_ended():
    from tether.agent.metrics import EPISODE_ENDS, episode_end, episode_ends
    from tether.agent.types import Trajectory, Turn

    def traj(success=False, **last):
        turn = dict(format_ok=True, action_valid=True, ended_episode=False)
        turn.update(last)
        return Trajectory(
            0, 0, 0, success=success, turns=[Turn(0, 0, 1, "s", "r", "z", "a", reward=0.0, **turn)]
        )

    cases = {
        "success": traj(success=True, ended_episode=True),
        "format": traj(format_ok=False, action_valid=False),
        "invalid_action": traj(action_valid=False),
        "failed": traj(ended_episode=True),
        "unfinished": traj(),
    }
    assert {kind: episode_end(t) for kind, t in cases.items()} == {k: k for k in cases}
    assert episode_end(Trajectory(0, 0, 0)) == "unfinished"  # no turn at all
    shares = episode_ends([*cases.values(), cases["failed"], cases["failed"]])
    assert set(shares) == {f"end/{k}" for k in EPISODE_ENDS}
    assert shares["end/failed"] == pytest.approx(3 / 7) and sum(shares.values()) == pytest.approx(1)
