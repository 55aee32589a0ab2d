"""The environment quickstarts' warm-start demonstrations (experiments/<env>.yaml)."""

from pathlib import Path

import numpy as np
import pytest

EXPERIMENTS = Path(__file__).parent.parent / "experiments"


@pytest.mark.parametrize(
    "name, episodes, min_fitting",
    [
        ("deepcoder", 96, 1.0),  # all kept by the warm start
        ("searchqa", 200, 0.95),  # nearly all kept
        ("webshop", 200, 0.95),
    ],
)
def test_quickstart_warm_start_demonstrations_fit_and_mostly_succeed(name, episodes, min_fitting):
    """experiments/<name>.yaml: its demonstrations fit the model window (so the warm start
    keeps them) and the reply cap, and its noise leaves most of them successful but not all."""
    from tether.agent.chat import ChatFormatter
    from tether.platform.config import load_config
    from tether.policy.warmstart import build_tokenizer, demonstration_episodes, encode_episode

    cfg = load_config(EXPERIMENTS / f"{name}.yaml")
    ws = cfg.model.warm_start
    demos = demonstration_episodes(
        cfg.env.id,
        cfg.env.kwargs,
        episodes,
        ws.noise,
        seed=10_000_000,
        max_reply_tokens=cfg.rollout.max_reply_tokens,
        restate=ws.restate,
        weigh=ws.weigh,
    )
    formatter = ChatFormatter(build_tokenizer(demos, ws.vocab_size, ws.numerals))
    lengths = [len(encode_episode(formatter, e)[0]) for e in demos]
    assert np.mean([n <= cfg.model.max_context for n in lengths]) >= min_fitting
    assert (
        max(len(formatter.encode(r)) for e in demos for r in e.replies)
        <= cfg.rollout.max_reply_tokens
    )
    assert 0.8 <= np.mean([e.success for e in demos]) < 1.0
