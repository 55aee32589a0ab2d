"""Warm start of the tiny model: a tokenizer and supervised training on solver demonstrations.

The envs' solvers write grounded demonstrations (reasoning that names the actual
positions or numbers, then the action).  A share ``noise`` of turns is imperfect
(random actions), so the warm policy succeeds sometimes but not always: RL then
has something to improve, and the filter has reward variance to select on.

Each demonstration episode is laid out exactly like a sampled episode (same
prompts, same chat segments), and the loss covers only the assistant replies.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..agent.chat import ChatFormatter
from ..agent.format import THINK_OPEN, format_reply, system_prompt, user_prompt
from ..envs import make as make_env
from ..envs import require_demonstration_options
from .tokenizer import train_tokenizer


@dataclass
class DemoEpisode:
    system: str
    users: list[str]
    replies: list[str]
    success: bool
    states: list[str] = field(default_factory=list)

    def text(self) -> str:
        """ChatML text of the episode (the tokenizer's training corpus)."""
        parts = [f"<|im_start|>system\n{self.system}<|im_end|>\n"]
        for user, reply in zip(self.users, self.replies):
            parts.append(
                f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>"
                f"{reply}<|im_end|>\n"
            )
        return "".join(parts)


#: Fluent reasoning that names nothing of the input (``warm_start.input_free_fraction``):
#: the generic phrasings a pretrained model's language prior offers and a model trained on
#: grounded text alone never sees, so that an input-agnostic template exists to collapse to.
INPUT_FREE = (
    "Let me think about the best move from here.",
    "I will pick the safest move toward the goal.",
    "Thinking it over, one choice looks best.",
    "Step by step, the right move is clear now.",
    "I should move carefully and keep to the plan.",
)


def demonstration_episodes(
    env_id: str,
    env_kwargs: dict,
    n: int,
    noise: float,
    seed: int,
    max_reply_tokens: int,
    restate: bool = False,
    weigh: bool = False,
    input_free: float = 0.0,
) -> list[DemoEpisode]:
    """Play ``n`` episodes with the env's demonstrator (seeds ``seed .. seed+n-1``);
    ``restate`` asks it to open each reasoning with the observed state, ``weigh`` to
    say where each move toward the goal leads before it chooses.  With ``input_free``
    = f, each turn's reasoning is, with probability f, one of `INPUT_FREE` instead (the
    answer, and every other turn, as without it: the draws come from a generator of
    their own)."""
    env = make_env(env_id, **env_kwargs)
    options = {k: True for k, on in (("restate", restate), ("weigh", weigh)) if on}
    require_demonstration_options(env_id, options)
    rng = np.random.default_rng([seed, 0xDE70])
    template_rng = np.random.default_rng([seed, 0x7E3F])
    episodes = []
    for k in range(n):
        state, _ = env.reset(seed=seed + k)
        actions_left = env.actions_left() if hasattr(env, "actions_left") else None
        episode = DemoEpisode(system_prompt(env.rules()), [], [], False)
        reward = None
        for turn in range(1, env.max_turns + 1):
            episode.users.append(user_prompt(turn, state, actions_left, max_reply_tokens, reward))
            episode.states.append(state)
            reasoning, answer = env.demonstration(rng, noise, **options)
            if input_free > 0 and template_rng.random() < input_free:
                reasoning = INPUT_FREE[template_rng.integers(len(INPUT_FREE))]
            episode.replies.append(format_reply(reasoning, answer))
            state, reward, terminated, truncated, info = env.step(answer)
            actions_left = env.actions_left() if hasattr(env, "actions_left") else None
            episode.success = episode.success or bool(info.get("success"))
            if terminated or truncated:
                break
        episodes.append(episode)
    return episodes


def encode_episode(formatter: ChatFormatter, episode: DemoEpisode) -> tuple[list[int], list[int]]:
    """Token ids and loss mask, laid out as ``run_episodes`` lays out a sampled episode."""
    ids = formatter.first_prompt_ids(episode.system, episode.users[0])
    mask = [0] * len(ids)
    for turn, reply in enumerate(episode.replies):
        reply_ids = formatter.encode(reply)
        ids += reply_ids
        mask += [1] * len(reply_ids)
        if turn + 1 < len(episode.users):
            segment = formatter.continuation_ids(episode.users[turn + 1], reply_ids)
            ids += segment
            mask += [0] * len(segment)
    return ids, mask


def state_turn_sequences(
    formatter: ChatFormatter, episodes: list[DemoEpisode], prompt: str = "state"
) -> list[tuple[list[int], list[int]]]:
    """Every demonstration turn as a short sequence, the reply after its prompt (the loss
    covers the reply): the curriculum's first stage.  With a few dozen tokens instead of
    a few hundred before the reply, the attention that copies the state into the
    reasoning starts far less diluted.

    ``prompt`` is what precedes the reply: ``state`` = ``State:``, the observed state and
    the opening ``<think>`` (shortest); ``user`` = the turn's whole user message in the
    chat markup with the generation prompt and ``<think>``, exactly the tokens between a
    later turn's state and its reply in an episode.  On FrozenLake a copy learned after
    ``state`` reads the goal at the state's place in that short sequence and does not
    carry over to the episode's layout on every seed (goal copied right 0.25-0.39 after
    this stage on seed 30, against 0.99-1.00 with ``user``):
    benchmarks/history/2026-11-27.md."""
    if prompt not in ("state", "user"):
        raise ValueError(f"state-turn prompt must be 'state' or 'user', not {prompt!r}")
    think = formatter.encode(THINK_OPEN)
    sequences = []
    for episode in episodes:
        for state, user, reply in zip(episode.states, episode.users, episode.replies):
            if prompt == "user":
                head = formatter.continuation_ids(user, [])
            else:
                head = formatter.encode(f"State:\n{state.strip()}") + think
            reply_ids = formatter.encode(reply)
            sequences.append((head + reply_ids, [0] * len(head) + [1] * len(reply_ids)))
    return sequences


def build_tokenizer(episodes: list[DemoEpisode], vocab_size: int, numerals: str = "digits"):
    return train_tokenizer((e.text() for e in episodes), vocab_size=vocab_size, numerals=numerals)


def _logits(model, input_ids, attention, autocast: str) -> torch.Tensor:
    """float32 logits; with ``autocast`` bfloat16 the body runs in bfloat16 autocast and
    the head in float32 on float32 states, as in the learner (`algos/vocab.head_logits`)."""
    if autocast != "bfloat16":
        return model(input_ids=input_ids, attention_mask=attention).logits.float()
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16):
        states = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
    return model.lm_head(states.float())


def supervised_finetune(
    model,
    sequences: list[tuple[list[int], list[int]]],
    pad_id: int,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    progress=None,
    autocast: str = "none",
    weight_decay: float = 0.0,
) -> dict:
    """Next-token cross-entropy on the masked (assistant) tokens; returns final stats.
    ``autocast`` bfloat16 runs the forward in bfloat16 autocast (the loss in float32);
    ``weight_decay`` is AdamW's (decoupled) decay."""
    model.train()
    generator = np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(sequences) / batch_size)
    total_steps = max(1, epochs * steps_per_epoch)
    warmup = max(1, total_steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / total_steps)),
    )
    losses, tokens, started = [], 0, time.perf_counter()
    for _ in range(epochs):
        # Batches of similar length waste little on padding; their order is shuffled.
        order = np.argsort([len(s[0]) for s in sequences], kind="stable")
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        for b in generator.permutation(len(batches)):
            batch = [sequences[i] for i in batches[b]]
            width = max(len(ids) for ids, _ in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [B, T]
            labels = torch.full((len(batch), width), -100, dtype=torch.long)  # [B, T]
            attention = torch.zeros((len(batch), width), dtype=torch.long)  # [B, T]
            for row, (ids, mask) in enumerate(batch):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention[row, : len(ids)] = 1
                target = torch.tensor(ids)
                target[torch.tensor(mask) == 0] = -100
                labels[row, : len(ids)] = target
            logits = _logits(model, input_ids, attention, autocast)  # [B, T, V] float32
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            tokens += int(attention.sum())
            if progress is not None:
                progress(len(losses), total_steps, losses[-1])
    model.eval()
    elapsed = time.perf_counter() - started
    return {
        "sft_loss": float(np.mean(losses[-20:])) if losses else float("nan"),
        "sft_steps": len(losses),
        "sft_tokens_per_s": tokens / max(elapsed, 1e-9),
        "sft_seconds": elapsed,
    }
