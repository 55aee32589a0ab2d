"""Any chat template: one that refuses the system role (Gemma-style) gets the system text
in its first user turn, unusual role markers work, and a missing template or one without
a generation prompt is refused in one line naming the model and the fix.  One run trains
end to end through ``model.path`` on a model whose template refuses the system role."""

from __future__ import annotations

import logging
import shutil

import pytest

from tests.conftest import micro_config_dict
from tests.test_episode import _setup
from tether.agent.chat import ChatFormatter
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
from tether.platform.config import build_config
from tether.platform.run.trainer import Trainer
from tether.policy.load import load_tokenizer

# The shape of Gemma's template: no system role, assistant turns rendered as "model".
NO_SYSTEM = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<|im_start|>{{ role }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>model\n{% endif %}"
)
# Unusual role names in the rendered text (Human / Bot).
ODD_ROLES = (
    "{% for m in messages %}{% set role = {'system': 'Setting', 'user': 'Human', "
    "'assistant': 'Bot'}[m['role']] %}<|im_start|>{{ role }}: {{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>Bot: {% endif %}"
)
NO_GENERATION_PROMPT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def _tokenizer(path, template):
    tokenizer = load_tokenizer(path)
    tokenizer.chat_template = template
    return tokenizer


def test_a_template_that_refuses_the_system_role_gets_it_in_the_first_user_turn(
    micro_policy, caplog
):
    with caplog.at_level(logging.WARNING, logger="tether.agent.chat"):
        formatter = ChatFormatter(_tokenizer(micro_policy, NO_SYSTEM))
    assert not formatter.system_role
    assert [r.message for r in caplog.records if "refuses the system role" in r.message]
    text = formatter.decode(formatter.first_prompt_ids("You are a grid agent.", "Map: S.G"))
    assert "<|im_start|>user\nYou are a grid agent.\n\nMap: S.G<|im_end|>" in text
    assert text.rstrip().endswith("<|im_start|>model\n<think>")
    follow = formatter.decode(formatter.continuation_ids("next map", [5, 6]))
    assert (
        "<|im_start|>user\nnext map<|im_end|>" in follow and "<|im_start|>model\n<think>" in follow
    )


def test_unusual_role_names(micro_policy):
    formatter = ChatFormatter(_tokenizer(micro_policy, ODD_ROLES))
    assert formatter.system_role
    text = formatter.decode(formatter.first_prompt_ids("sys", "hello"))
    assert (
        text
        == "<|im_start|>Setting: sys<|im_end|>\n<|im_start|>Human: hello<|im_end|>\n<|im_start|>Bot: <think>"
    )
    follow = formatter.decode(formatter.continuation_ids("again", [5]))
    assert follow.startswith("<|im_end|>\n<|im_start|>Human: again<|im_end|>\n<|im_start|>Bot: ")


@pytest.mark.parametrize(
    "template, message",
    [(None, "has no chat template"), (NO_GENERATION_PROMPT, "adds no generation prompt")],
)
def test_unusable_templates_are_refused_in_one_line(micro_policy, template, message):
    with pytest.raises(ValueError) as error:
        ChatFormatter(_tokenizer(micro_policy, template))
    text = str(error.value)
    assert message in text and "\n" not in text
    assert str(micro_policy) in text and "model.path" in text or "checkpoint" in text


def test_episodes_run_with_a_template_that_refuses_the_system_role(micro_policy):
    _, _, formatter, engine, sampling = _setup(micro_policy, _tokenizer(micro_policy, NO_SYSTEM))
    trajectories = run_episodes(
        engine,
        formatter,
        LocalEnvBatch("tether/FrozenLake-v0"),
        [EpisodeSpec(0, 7, k) for k in range(2)],
        sampling,
        seed=1,
    )
    assert len(trajectories) == 2 and all(t.turns for t in trajectories)


def test_a_run_trains_a_model_whose_template_refuses_the_system_role(
    micro_policy, models_dir, ray_local, tmp_path
):
    path = tmp_path / "no-system-model"
    shutil.copytree(micro_policy, path)
    tokenizer = _tokenizer(path, NO_SYSTEM)
    tokenizer.save_pretrained(path)
    cfg = build_config(
        micro_config_dict(
            tmp_path,
            model={"path": str(path)},
            rollout={"num_workers": 1},
            trainer={"iterations": 1, "val_every": 1, "val_episodes": 2, "samples_per_log": 0},
            diagnostics={
                "every": 1,
                "max_pairs": 8,
                "information_chain": False,
                "grad_snr_every": 0,
            },
        )
    )
    summary = Trainer(cfg).run()
    assert summary.status == "FINISHED" and summary.iterations == 1
    assert "collapse/first_turn/num_pairs" in summary.last_metrics
