"""Grounded warm starts: demonstrations that restate the state, tokens that make copying it cheap."""

import re
from pathlib import Path

import numpy as np
import pytest

from tether.envs.frozenlake import FrozenLakeEnv
from tether.policy.warmstart import build_tokenizer, demonstration_episodes

FROZENLAKE = ("tether/FrozenLake-v0", {"size": 4, "frozen_fraction": 0.8})


def test_coordinate_numerals_make_each_position_one_token():
    demos = demonstration_episodes(*FROZENLAKE, 200, 0.3, seed=0, max_reply_tokens=48)
    opaque = build_tokenizer(demos, 512, numerals="coordinates")
    digits = build_tokenizer(demos, 512, numerals="digits")
    for r in range(4):
        for c in range(4):
            assert len(opaque.encode(f"At ({r},{c}).", add_special_tokens=False)) == 3
            assert len(digits.encode(f"At ({r},{c}).", add_special_tokens=False)) > 3
    # a list of positions keeps each one whole; text round-trips
    text = "Boxes (1,2),(3,0). Target 24 from 3, 15."
    assert opaque.decode(opaque.encode(text, add_special_tokens=False)) == text
    numbers = build_tokenizer(
        demonstration_episodes("tether/Countdown-v0", {}, 300, 0.3, 0, 48), 512, numerals="numbers"
    )
    assert len(numbers.encode(" 14", add_special_tokens=False)) == 1
    with pytest.raises(ValueError, match="numerals"):
        build_tokenizer(demos[:4], 512, numerals="roman")


@pytest.mark.parametrize("numerals", ["digits", "coordinates", "numbers"])
def test_a_map_row_is_one_token_per_cell_and_other_text_is_cut_as_before(numerals):
    """A line made only of map symbols is cut into one token per cell (so the cell at
    column c is the row's c-th token), whatever BPE merged; prose, coordinates and
    numbers on other lines are cut as before, and every text round-trips."""
    from tether.policy.tokenizer import pre_tokenizer

    demos = demonstration_episodes(*FROZENLAKE, 200, 0.3, seed=0, max_reply_tokens=48)
    tokenizer = build_tokenizer(demos, 512, numerals=numerals)
    for row in ["_HHH", "____", "P__G", "#_PX#", "H"]:
        ids = tokenizer.encode(f"{row}\n", add_special_tokens=False)
        assert [tokenizer.decode([i]) for i in ids] == [*row, "\n"]
    cut = [p for p, _ in pre_tokenizer(numerals).pre_tokenize_str("Say RED. Goal (2,2).\nAB1")]
    assert "ĠRED" in cut and "A" not in cut  # a capital word, a line with a digit: not a row
    # punctuation alone (the prompt's "<think>...</think>" placeholder) is not a map row
    assert [p for p, _ in pre_tokenizer(numerals).pre_tokenize_str("...")] == ["..."]
    text = "_HH_\nP__G\nPlayer (0,0). Goal (1,3). Holes (0,1) (0,2).\n"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_restating_demonstrations_open_with_the_observed_map():
    demos = demonstration_episodes(*FROZENLAKE, 40, 0.3, seed=5, max_reply_tokens=48, restate=True)
    for demo in demos:
        for user, reply in zip(demo.users, demo.replies):
            state = user.split("State:\n", 1)[1]
            rows = state.split("\nPlayer", 1)[0]
            player = re.search(r"Player (\(\d,\d\))", state).group(1)
            assert reply.startswith(rows + f"\nAt {player}, ")
    env = FrozenLakeEnv()
    env.reset(seed=3)
    plain = env.demonstration(np.random.default_rng(0))
    restated = env.demonstration(np.random.default_rng(0), restate=True)
    assert restated[1] == plain[1] and restated[0].endswith(plain[0])
    with pytest.raises(ValueError, match="cannot restate"):
        demonstration_episodes("tether/Countdown-v0", {}, 2, 0.0, 0, 48, restate=True)


@pytest.mark.parametrize("option", ["restate", "weigh"])
def test_a_demonstration_option_the_env_lacks_fails_at_config_time(option, tmp_path):
    """Before Ray starts or a warm start runs: one line naming the setting.  With a model
    path (no warm start) the option is moot and accepted."""
    from tether.envs import demonstration_options
    from tether.platform.config import ConfigError, load_config

    quickstart = Path(__file__).parent.parent / "experiments" / "quickstart.yaml"
    assert {"restate", "weigh"} <= demonstration_options("tether/FrozenLake-v0")
    assert option not in demonstration_options("tether/Countdown-v0")
    assert load_config(quickstart, [f"model.warm_start.{option}=true"])
    countdown = ["env.id=tether/Countdown-v0", "env.kwargs={}"]  # FrozenLake's kwargs off
    with pytest.raises(ConfigError, match=f"model.warm_start.{option}: .* cannot {option}"):
        load_config(quickstart, [f"model.warm_start.{option}=true", *countdown])
    moot = [f"model.warm_start.{option}=true", *countdown]
    assert load_config(quickstart, [*moot, f"model.path={tmp_path}"]).model.path == str(tmp_path)


def test_state_turns_hold_each_observed_state_and_its_reply_in_a_short_sequence():
    """The curriculum's first stage: every turn as the state it observed, the opening
    ``<think>`` and the reply, with the loss on the reply only; a few dozen tokens where
    the episode has hundreds before the same reply."""
    from tether.agent.chat import ChatFormatter
    from tether.agent.format import THINK_OPEN
    from tether.policy.warmstart import encode_episode, state_turn_sequences

    demos = demonstration_episodes(*FROZENLAKE, 30, 0.3, seed=1, max_reply_tokens=48, restate=True)
    formatter = ChatFormatter(build_tokenizer(demos, 512, numerals="coordinates"))
    turns = state_turn_sequences(formatter, demos)
    assert len(turns) == sum(len(d.replies) for d in demos)
    think = formatter.encode(THINK_OPEN)
    k = 0
    for demo in demos:
        episode_length = len(encode_episode(formatter, demo)[0])
        for user, reply in zip(demo.users, demo.replies):
            ids, mask = turns[k]
            k += 1
            reply_ids = formatter.encode(reply)
            prompt = ids[: len(ids) - len(reply_ids)]
            assert ids[len(prompt) :] == reply_ids and mask == [0] * len(prompt) + [1] * len(
                reply_ids
            )
            assert prompt[-len(think) :] == think
            state = formatter.tokenizer.decode(prompt[: -len(think)])
            assert state.startswith("State:\n") and state[len("State:\n") :] in user
            assert len(ids) < 90 < episode_length


def test_user_state_turns_are_the_episode_tokens_between_a_later_state_and_its_reply():
    """``state_turn_prompt: user``: each short sequence is a slice of the encoded
    episode, from the end of the previous reply (its ``<|im_end|>``) through the turn's
    reply, so the tokens between the state and the reply are exactly the run's; the
    loss covers the reply only.  An unknown prompt name is refused."""
    from tether.agent.chat import ChatFormatter
    from tether.policy.warmstart import encode_episode, state_turn_sequences

    demos = demonstration_episodes(*FROZENLAKE, 20, 0.3, seed=2, max_reply_tokens=48, weigh=True)
    formatter = ChatFormatter(build_tokenizer(demos, 512, numerals="coordinates"))
    turns = state_turn_sequences(formatter, demos, "user")
    short = state_turn_sequences(formatter, demos)
    assert len(turns) == len(short) == sum(len(d.replies) for d in demos)
    k = 0
    for demo in demos:
        episode = encode_episode(formatter, demo)[0]
        for turn, (state, reply) in enumerate(zip(demo.states, demo.replies)):
            ids, mask = turns[k]
            reply_ids = formatter.encode(reply)
            assert ids[-len(reply_ids) :] == reply_ids
            assert mask == [0] * (len(ids) - len(reply_ids)) + [1] * len(reply_ids)
            head = formatter.tokenizer.decode(ids[: -len(reply_ids)])
            assert state.strip() in head and head.rstrip().endswith("<think>")
            if turn > 0:  # a later turn: the very tokens of the episode
                assert any(episode[i : i + len(ids)] == ids for i in range(len(episode)))
            assert len(short[k][0]) < len(ids) < len(episode)
            k += 1
    with pytest.raises(ValueError, match="state-turn prompt"):
        state_turn_sequences(formatter, demos, "episode")


@pytest.mark.parametrize("weigh", [None, False])
def test_quickstart_grounded_demonstrations_fit_the_reply_cap(weigh):
    """experiments/quickstart.yaml's demonstrations (as shipped, with the moves weighed
    first, and without weighing): the replies fit the reply cap, every position in them
    is one token, and the noise keeps success moderate (RL has random moves to unlearn)."""
    from tether.agent.chat import ChatFormatter
    from tether.platform.config import load_config

    cfg = load_config(Path(__file__).parent.parent / "experiments" / "quickstart.yaml")
    ws = cfg.model.warm_start
    assert ws.numerals == "coordinates" and ws.state_turn_epochs > 0
    demos = demonstration_episodes(
        cfg.env.id,
        cfg.env.kwargs,
        300,
        ws.noise,
        seed=10_000_000,
        max_reply_tokens=cfg.rollout.max_reply_tokens,
        restate=ws.restate,
        weigh=ws.weigh if weigh is None else weigh,
    )
    weighed = ws.weigh if weigh is None else weigh
    assert all((". So " in r) == weighed for d in demos for r in d.replies)
    tokenizer = build_tokenizer(demos, ws.vocab_size, ws.numerals)
    formatter = ChatFormatter(tokenizer)
    assert (
        max(len(formatter.encode(r)) for d in demos for r in d.replies)
        <= cfg.rollout.max_reply_tokens
    )
    positions = {p for d in demos for r in d.replies for p in re.findall(r" \(\d,\d\)", r)}
    assert len(positions) == 16 and all(len(formatter.encode(p)) == 1 for p in positions)
    assert 0.5 <= np.mean([d.success for d in demos]) < 0.95


def test_a_cached_warm_start_is_loaded_with_the_tokenizer_it_was_trained_with(tmp_path):
    """The rollout workers, learner and driver load the cached model's tokenizer with
    `load_tokenizer`; it must cut text exactly as the saved tokenizer (and so the warm
    start's demonstrations) did.  ``AutoTokenizer`` picked ``Qwen2Tokenizer`` for the tiny
    Qwen2 model and rebuilt Qwen2's pre-tokenizer: every coordinate of a prompt came out
    as five tokens where the model had learned one."""
    from tokenizers import Tokenizer

    from tether.platform.config import load_config
    from tether.policy.load import load_tokenizer, resolve_policy

    cfg = load_config(
        Path(__file__).parent.parent / "experiments" / "micro.yaml",
        [
            f"model.cache_dir={tmp_path}",
            "model.warm_start.numerals=coordinates",
            "model.warm_start.restate=true",
            "model.warm_start.state_turn_epochs=1",
        ],
    )
    path = resolve_policy(cfg.model, cfg.env, 0, cfg.rollout.max_reply_tokens)
    saved = Tokenizer.from_file(str(path / "tokenizer.json"))
    loaded = load_tokenizer(path)
    text = (
        "<|im_start|>user\nTurn 1:\nState:\n_P__\nH___\n__HG\n____\nPlayer (0,1). "
        "Goal (2,3).<|im_end|>\n<|im_start|>assistant\n<think>At (0,1), goal (2,3)."
        "</think><answer>Down</answer><|im_end|>"
    )
    assert (
        loaded.encode(text, add_special_tokens=False)
        == saved.encode(text, add_special_tokens=False).ids
    )
    assert len(loaded.encode(" (2,3)", add_special_tokens=False)) == 1
    assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize(
    "name, pattern",
    [
        ("quickstart", r" \(\d,\d\)"),  # FrozenLake: positions
        ("sokoban", r" \(\d,\d\)"),  # positions of the player, boxes and targets
        ("countdown", r"(?<=Target) \d+| \d+(?=[,:])"),  # the target and the given numbers
    ],
)
def test_grounded_specs_make_what_the_reasoning_restates_one_token(name, pattern):
    """Each env's grounded recipe (experiments/<name>.yaml): the short-sequence stage is
    on, the replies fit the reply cap, and what the reasoning restates from the state
    (positions; the target and the numbers) is one token each in nearly every case, so
    restating it is copying."""
    from tether.agent.chat import ChatFormatter
    from tether.platform.config import load_config

    cfg = load_config(Path(__file__).parent.parent / "experiments" / f"{name}.yaml")
    ws = cfg.model.warm_start
    assert ws.state_turn_epochs > 0 and ws.numerals != "digits"
    demos = demonstration_episodes(
        cfg.env.id,
        cfg.env.kwargs,
        300,
        ws.noise,
        seed=10_000_000,
        max_reply_tokens=cfg.rollout.max_reply_tokens,
        restate=ws.restate,
        weigh=ws.weigh,
    )
    formatter = ChatFormatter(build_tokenizer(demos, ws.vocab_size, ws.numerals))
    replies = [r for d in demos for r in d.replies]
    assert max(len(formatter.encode(r)) for r in replies) <= cfg.rollout.max_reply_tokens
    restated = [m for r in replies for m in re.findall(pattern, r.split("</think>")[0])]
    assert len(restated) >= len(replies)
    assert np.mean([len(formatter.encode(m)) == 1 for m in restated]) >= 0.95
    assert 0.5 <= np.mean([d.success for d in demos]) < 0.95


@pytest.mark.parametrize(
    ("setting", "value"),
    [("autocast", "bfloat16"), ("state_turn_prompt", "user"), ("weight_decay", 1.0)],
)
def test_a_later_warm_start_setting_enters_the_cache_key_only_when_set(setting, value):
    """A recipe without the setting keeps the key it had before the setting existed
    (caches stay valid); one with it is another model."""
    from tether.envs.settings import EnvConfig
    from tether.policy.load import recipe, recipe_key
    from tether.policy.settings import ModelConfig

    env = EnvConfig(id="tether/FrozenLake-v0")
    plain = recipe(ModelConfig(), env, 0, 48)
    assert setting not in plain["warm_start"]
    changed = recipe(ModelConfig(warm_start={setting: value}), env, 0, 48)
    assert changed["warm_start"][setting] == value
    assert recipe_key(plain) != recipe_key(changed)


def test_the_warm_start_weight_decay_reaches_both_stages(monkeypatch):
    """``weight_decay`` is AdamW's in the first stage and in the episode stage: the same
    steps with it end with smaller weights than without, in either stage alone."""
    import torch

    from tether.policy import load
    from tether.policy.tiny import build_tiny_model, tiny_config

    rng = np.random.default_rng(0)
    sequences = [([int(t) for t in rng.integers(1, 200, 12)], [0] * 6 + [1] * 6) for _ in range(8)]
    formatter = type("F", (), {"tokenizer": type("T", (), {"pad_token_id": 0})()})()

    def norm_after(stage, weight_decay):
        first = stage == "first"
        monkeypatch.setattr(load, "state_turn_sequences", lambda *a: sequences)
        model = build_tiny_model(tiny_config("micro", max_context=64), seed=0)
        ws = {"epochs": 1, "batch_size": 4, "lr": 0.05, "weight_decay": weight_decay}
        ws |= {"state_turn_epochs": int(first), "state_turn_batch_size": 4}
        load.warm_start_stages(model, formatter, [], [] if first else sequences, ws, 0)
        return float(torch.cat([p.detach().flatten() for p in model.parameters()]).norm())

    for stage in ("first", "episodes"):
        assert norm_after(stage, 1.0) < norm_after(stage, 0.0) - 1e-3, stage


def test_input_free_phrasings_replace_a_share_of_the_reasoning_only():
    """``warm_start.input_free_fraction``: about that share of turns reason in one of the
    input-free phrasings; the answers, the episodes and the other turns are those of the
    grounded demonstrations (the draws come from a generator of their own)."""
    from tether.policy.warmstart import INPUT_FREE

    kwargs = {"seed": 3, "max_reply_tokens": 48, "weigh": True}
    grounded = demonstration_episodes(*FROZENLAKE, 200, 0.3, **kwargs)
    assert demonstration_episodes(*FROZENLAKE, 200, 0.3, input_free=0.0, **kwargs) == grounded
    mixed = demonstration_episodes(*FROZENLAKE, 200, 0.3, input_free=0.4, **kwargs)
    pairs = [(g, m) for a, b in zip(grounded, mixed) for g, m in zip(a.replies, b.replies)]
    assert [a.users for a in grounded] == [b.users for b in mixed]
    generic = [m for g, m in pairs if m != g]
    n = len(pairs)
    share = len(generic) / n
    assert abs(share - 0.4) < 3 * (0.4 * 0.6 / n) ** 0.5, share  # within 3 standard errors
    assert {m.split("</think>")[0].split("<think>")[-1] for m in generic} <= set(INPUT_FREE)
    assert len({m for m in generic}) >= 3  # several phrasings, not one
    answer = lambda reply: reply.split("</think>")[-1]  # noqa: E731
    assert all(answer(g) == answer(m) for g, m in pairs)
    everything = demonstration_episodes(*FROZENLAKE, 20, 0.3, input_free=1.0, **kwargs)
    assert all(". So " not in r for d in everything for r in d.replies)
