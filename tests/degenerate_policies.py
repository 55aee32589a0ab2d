"""Pathological policies, as real models: the micro model fine-tuned to always write one
broken reply (or left untrained), saved as a Hugging Face directory for ``model.path``;
and one that RL drives into template collapse (``build_template_prone_policy``).

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


def first_prompts(
    env_id: str, n: int, max_reply_tokens: int, env_kwargs: dict | None = None
) -> list[tuple[str, str]]:
    env = make_env(env_id, **(env_kwargs or {}))
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
    prompts = first_prompts(env_id, 32, max_reply_tokens)
    if name == "untrained":
        return _save_policy(base, out, None, 0)
    eos = name != "babble"
    return _save_policy(base, out, [(p, [REPLIES[name]]) for p in prompts], steps, eos)


#: Template collapse on Choice (8 colours): reasoning that names the asked colour, or one of
#: these input-blind plans.  Each plan answers with a colour (a valid answer); the grounded
#: reasoning answers in words Choice does not parse (an invalid answer).
TEMPLATE_PLANS = tuple(f"plan {w}." for w in "ABCDEFGH")
TEMPLATE_ENV = {"id": "tether/Choice-v0", "kwargs": {"n_options": 8}}
#: the fine-tune's length (epochs = steps // 4 over 32 prompts x 16 replies)
TEMPLATE_STEPS = 120


def build_template_prone_policy(
    base: Path, out: Path, max_reply_tokens: int = 48, steps: int = TEMPLATE_STEPS
) -> Path:
    """``base`` fine-tuned so that, on each Choice prompt, half its replies are grounded
    (``Asked for <colour>.``, answered ``the <colour> one``: not a valid answer) and half
    one of ``TEMPLATE_PLANS`` chosen uniformly, whatever the prompt (answered with a valid
    colour).  Its reasoning depends on the input (I(X;Z) about half of log 8), and a reward
    that ignores the input but charges the format penalty for an invalid answer (Choice
    with stochasticity 1: a valid answer earns a coin flip) moves it onto the plans: the
    reasoning stays varied (8 plans) while it stops depending on the input."""
    from tether.envs.known_answer import COLOURS

    env_id, kwargs = TEMPLATE_ENV["id"], TEMPLATE_ENV["kwargs"]
    colours = COLOURS[: kwargs["n_options"]]
    examples = []
    for seed, prompt in enumerate(first_prompts(env_id, 32, max_reply_tokens, kwargs)):
        asked = make_env(env_id, **kwargs)
        asked.reset(seed=seed)
        grounded = format_reply(f"Asked for {asked.target}.", f"the {asked.target} one")
        plans = [format_reply(plan, colour) for plan, colour in zip(TEMPLATE_PLANS, colours)]
        examples.append((prompt, [grounded] * len(plans) + plans))
    return _save_policy(base, out, examples, steps)


def _save_policy(
    base: Path,
    out: Path,
    examples: list[tuple[tuple[str, str], list[str]]] | None,
    steps: int,
    eos: bool = True,
) -> Path:
    """``base`` fine-tuned on every (prompt, reply) of ``examples`` (each prompt with its
    list of replies, end-of-sequence appended when ``eos``), saved at ``out``; ``None``: the
    same architecture, randomly initialised.  Built once: an existing ``out`` is reused."""
    import torch

    from tether.policy.load import load_model_and_tokenizer
    from tether.policy.tiny import build_tiny_model
    from tether.policy.warmstart import supervised_finetune

    if (out / "config.json").exists():
        return out
    model, tokenizer = load_model_and_tokenizer(base)
    if examples is None:
        model = build_tiny_model(model.config, seed=123)
    else:
        formatter = ChatFormatter(tokenizer)
        sequences = []
        for (system, user), replies in examples:
            prompt = formatter.first_prompt_ids(system, user)
            for text in replies:
                reply = formatter.encode(text) if text else []
                reply = reply + [tokenizer.eos_token_id] if eos else reply
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
