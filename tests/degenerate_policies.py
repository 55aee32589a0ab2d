"""Pathological policies, as real models: the micro model fine-tuned to always write one
broken reply (or left untrained), saved as a Hugging Face directory for ``model.path``.

Each reply is the text generated after the forced ``<think>``; ``None`` (babble) has no
end-of-sequence, so the policy writes until the reply-length limit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tether.agent.chat import ChatFormatter
from tether.agent.format import format_reply, system_prompt, user_prompt
from tether.envs import make as make_env

#: name -> reply text after ``<think>`` (end-of-sequence appended unless ``babble``).
REPLIES = {
    "empty_reasoning": format_reply("", "Left"),  # </think><answer>Left</answer>
    "no_action": format_reply("I will go left now", ""),  # ...</think><answer></answer>
    "unterminated": "I will go left and then down and",  # never closes <think>
    "immediate_eos": "",  # ends at once
    "babble": " ".join(["left down right up"] * 40),  # no tags, no end: max length
    "constant": format_reply("the same plan for every grid", "Left"),  # ignores the input
}


def first_prompts(env_id: str, n: int, max_reply_tokens: int) -> list[tuple[str, str]]:
    env = make_env(env_id)
    prompts = []
    for seed in range(n):
        state, _ = env.reset(seed=seed)
        actions_left = env.actions_left() if hasattr(env, "actions_left") else None
        prompts.append(
            (
                system_prompt(env.rules()),
                user_prompt(1, state, actions_left, max_reply_tokens, None),
            )
        )
    return prompts


def build_degenerate_policy(
    name: str,
    base: Path,
    out: Path,
    env_id: str = "tether/FrozenLake-v0",
    max_reply_tokens: int = 48,
    steps: int = 200,
) -> Path:
    """``base`` (a micro policy directory) fine-tuned to reply ``REPLIES[name]`` to every
    first-turn prompt, or ``untrained``: the same architecture, randomly initialised."""
    import torch

    from tether.policy.load import load_model_and_tokenizer
    from tether.policy.tiny import build_tiny_model
    from tether.policy.warmstart import supervised_finetune

    if (out / "config.json").exists():
        return out
    model, tokenizer = load_model_and_tokenizer(base)
    if name == "untrained":
        model = build_tiny_model(model.config, seed=123)
    else:
        formatter = ChatFormatter(tokenizer)
        reply = formatter.encode(REPLIES[name]) if REPLIES[name] else []
        if name != "babble":
            reply = reply + [tokenizer.eos_token_id]
        sequences = []
        for system, user in first_prompts(env_id, 32, max_reply_tokens):
            prompt = formatter.first_prompt_ids(system, user)
            sequences.append((prompt + reply, [0] * len(prompt) + [1] * len(reply)))
        torch.manual_seed(0)
        supervised_finetune(
            model,
            sequences,
            tokenizer.pad_token_id,
            epochs=max(1, steps // 4),
            batch_size=8,
            lr=1e-2,
            seed=0,
        )
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return out
