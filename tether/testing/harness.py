"""Known-answer harness: policies whose input dependence is known, through the real diagnostics.

Three behaviours on one synthetic prompt set (N prompts, each ``<bos> k1..kK <think>`` with
random key tokens), each with a known place in the (H(Z|X), I(X;Z)) plane (docs/methods.md,
section 1):

- ``grounded``: the reasoning copies the prompt's keys, the action is the first key
  -> I(X;Z) = log N, H(Z|X) = 0, I(Z;A) = I(X;A) = log N: diverse and grounded;
- ``template``: one fixed reasoning and one fixed action for every input
  -> every MI 0 and H(Z|X) = 0: low-entropy collapse;
- ``random_template``: one of T templates drawn uniformly regardless of the input, the
  action a function of the template -> I(X;Z) = I(X;A) = 0 but H(Z|X) = log T and
  I(Z;A) > 0: template collapse (varied reasoning that ignores the input).

A real micro model (`tether.policy.tiny`) is fine-tuned on each behaviour with the warm
start's `supervised_finetune`; replies are then *sampled from the fine-tuned model* and
scored by the same code the trainer uses (`information_chain`: prefix-reuse cross-scoring
and `mi_proxies`), plus the policy's token entropy on the reasoning tokens. The proxies
must rank grounded > random_template ≈ template on MI while the entropies rank
random_template highest: entropy alone cannot see template collapse, MI can.

    tether analyze known-answer           # prints the table of the three policies
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from ..algos.batch import token_logprobs
from ..diagnostics.crossscore import ScoringPair, information_chain
from ..policy.tiny import build_tiny_model, tiny_config
from ..policy.warmstart import supervised_finetune

BEHAVIOURS = ("grounded", "template", "random_template")

# Token ids of the synthetic language (no tokenizer: the harness works on ids).
PAD, BOS, THINK, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = range(6)
KEY_IDS = range(8, 40)  # prompt keys (and grounded reasoning / actions)
TEMPLATE_IDS = range(40, 64)  # template reasoning tokens and template actions
VOCAB = 64
ANSWER_PREFIX = (THINK_CLOSE, ANSWER_OPEN)


@dataclass(frozen=True)
class HarnessConfig:
    n_prompts: int = 8  # N distinct prompts (columns)
    samples: int = 8  # replies sampled per prompt (M = n_prompts * samples)
    keys: int = 4  # key tokens per prompt = grounded reasoning length
    templates: int = 8  # T templates of random_template
    template_len: int = 4  # tokens of each template
    train_steps: int = 160  # SFT steps per behaviour (batch 32, fresh samples)
    lr: float = 1e-2
    temperature: float = 1.0  # sampling and scoring temperature
    seed: int = 0


@dataclass
class HarnessResult:
    behaviour: str
    #: information_chain metrics per link: "xz" (I(X;Z)), "za" (I(Z;A)), "xa" (I(X;A))
    chain: dict[str, dict[str, float]]
    #: mean policy token entropy over the sampled reasoning tokens (nats)
    reasoning_token_entropy: float
    #: share of sampled replies that were well formed (reasoning, </think><answer>, action)
    format_ok_rate: float
    sft_loss: float


class Behaviour:
    """Samples (reasoning, action) for a prompt's keys: the data a policy is fine-tuned on."""

    def __init__(self, name: str, cfg: HarnessConfig, rng: np.random.Generator) -> None:
        if name not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {name!r}; choose one of {list(BEHAVIOURS)}")
        self.name, self.cfg = name, cfg
        # Templates: distinct token strings, each with its own action token.
        picks = rng.choice(len(TEMPLATE_IDS), size=(cfg.templates, cfg.template_len))
        self.templates = [tuple(TEMPLATE_IDS[p] for p in row) for row in picks]
        self.template_actions = [
            TEMPLATE_IDS[a]
            for a in rng.choice(len(TEMPLATE_IDS), size=cfg.templates, replace=False)
        ]

    def reply(
        self, keys: tuple[int, ...], rng: np.random.Generator
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self.name == "grounded":
            return keys, (keys[0],)
        k = 0 if self.name == "template" else int(rng.integers(self.cfg.templates))
        return self.templates[k], (self.template_actions[k],)


def prompt_ids(keys: tuple[int, ...]) -> tuple[int, ...]:
    """``<bos> keys <think>``: the context a reasoning is scored under."""
    return (BOS, *keys, THINK)


def reply_ids(reasoning, action) -> tuple[int, ...]:
    return (*reasoning, *ANSWER_PREFIX, *action, ANSWER_CLOSE)


def random_keys(cfg: HarnessConfig, rng: np.random.Generator) -> tuple[int, ...]:
    return tuple(int(KEY_IDS[k]) for k in rng.choice(len(KEY_IDS), size=cfg.keys, replace=False))


def train_policy(behaviour: Behaviour, cfg: HarnessConfig, rng: np.random.Generator):
    """A micro model fine-tuned on fresh prompts answered by ``behaviour`` (loss on replies)."""
    model = build_tiny_model(
        tiny_config("micro", vocab_size=VOCAB, max_context=64, pad_token_id=PAD), seed=cfg.seed
    )
    sequences = []
    for _ in range(cfg.train_steps * 32):
        prompt = prompt_ids(random_keys(cfg, rng))
        reply = reply_ids(*behaviour.reply(prompt[1:-1], rng))
        sequences.append((list(prompt + reply), [0] * len(prompt) + [1] * len(reply)))
    stats = supervised_finetune(
        model, sequences, PAD, epochs=1, batch_size=32, lr=cfg.lr, seed=cfg.seed
    )
    return model, stats["sft_loss"]


@torch.no_grad()
def sample_replies(
    model,
    prompts: list[tuple[int, ...]],
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator,
) -> list[tuple[int, ...]]:
    """Ancestral sampling from softmax(logits / τ), all prompts of equal length, until
    ``</answer>`` or ``max_new_tokens``; returns each reply's tokens (``</answer>`` included)."""
    ids = torch.tensor(prompts)  # [B, P]
    done = torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model(input_ids=ids).logits[:, -1].float() / temperature  # [B, V]
        token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)
        token = torch.where(done, torch.full_like(token, PAD), token)
        ids = torch.cat([ids, token[:, None]], dim=1)
        done |= token == ANSWER_CLOSE
        if bool(done.all()):
            break
    width = len(prompts[0])
    replies = []
    for row in ids[:, width:].tolist():
        replies.append(tuple(row[: row.index(ANSWER_CLOSE) + 1] if ANSWER_CLOSE in row else row))
    return replies


def parse_reply(reply: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(reasoning before ``</think>``, action between ``<answer>`` and ``</answer>``);
    empty parts when the reply is malformed (dropped by the cross-scoring)."""
    if THINK_CLOSE not in reply:
        return (), ()
    end = reply.index(THINK_CLOSE)
    rest = reply[end:]
    if rest[:2] != ANSWER_PREFIX or ANSWER_CLOSE not in rest:
        return reply[:end], ()
    return reply[:end], rest[2 : rest.index(ANSWER_CLOSE)]


@torch.no_grad()
def reasoning_token_entropy(model, prompts, replies, temperature: float) -> float:
    """The policy's mean token entropy at the positions that sampled reasoning tokens."""
    rows = [list(p + r) for p, r in zip(prompts, replies)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros(len(rows), width)
    for b, (p, r) in enumerate(zip(prompts, replies)):
        ids[b, : len(rows[b])] = torch.tensor(rows[b])
        attention[b, : len(rows[b])] = 1
        mask[b, len(p) : len(p) + len(parse_reply(r)[0])] = 1.0
    _, entropy = token_logprobs(model, ids, attention, temperature, with_entropy=True)  # [B, T]
    return float((entropy * mask).sum() / mask.sum().clamp_min(1.0))


def run_behaviour(name: str, cfg: HarnessConfig = HarnessConfig()) -> HarnessResult:
    """Fine-tune, sample N x samples replies, and run the diagnostics on them (one thread)."""
    with torch_threads(1):
        return _run_behaviour(name, cfg)


def _run_behaviour(name: str, cfg: HarnessConfig) -> HarnessResult:
    rng = np.random.default_rng(cfg.seed)
    behaviour = Behaviour(name, cfg, rng)
    model, sft_loss = train_policy(behaviour, cfg, rng)
    eval_rng = np.random.default_rng(cfg.seed + 1)
    distinct = [prompt_ids(random_keys(cfg, eval_rng)) for _ in range(cfg.n_prompts)]
    prompts = [p for p in distinct for _ in range(cfg.samples)]  # groups, like first_turn
    generator = torch.Generator().manual_seed(cfg.seed)
    max_new = max(cfg.keys, cfg.template_len) + 6
    replies = sample_replies(model, prompts, cfg.temperature, max_new, generator)
    parsed = [parse_reply(r) for r in replies]
    pairs = [ScoringPair(p, z, a) for p, (z, a) in zip(prompts, parsed)]
    chain = information_chain(
        model, pairs, cfg.temperature, answer_prefix_ids=ANSWER_PREFIX, method="auto"
    )
    return HarnessResult(
        behaviour=name,
        chain=chain.metrics,
        reasoning_token_entropy=reasoning_token_entropy(model, prompts, replies, cfg.temperature),
        format_ok_rate=sum(1 for z, a in parsed if z and a) / len(parsed),
        sft_loss=sft_loss,
    )


def run_harness(cfg: HarnessConfig = HarnessConfig()) -> dict[str, HarnessResult]:
    return {name: run_behaviour(name, cfg) for name in BEHAVIOURS}


@contextmanager
def torch_threads(n: int):
    """Run with ``n`` torch threads and restore the previous count.  The micro model's
    matrices are so small that a second thread only adds synchronisation: on a busy
    2-core box a step measured ~8x slower in wall time with 2 threads than with 1."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def main() -> None:
    import time

    from rich.console import Console
    from rich.table import Table

    started = time.perf_counter()
    results = run_harness()
    table = Table(title=f"known-answer harness ({time.perf_counter() - started:.1f} s)")
    columns = [
        ("I(X;Z) mi_estimate", "xz", "mi_estimate"),
        ("retrieval - chance", "xz", "retrieval_above_chance"),
        ("mi_zscore", "xz", "mi_zscore"),
        ("H(Z|X) est", "xz", "conditional_entropy_est"),
        ("H(Z) est", "xz", "reasoning_entropy_est"),
        ("I(Z;A)", "za", "mi_estimate"),
        ("I(X;A)", "xa", "mi_estimate"),
    ]
    for header in [
        "policy",
        *(c[0] for c in columns),
        "token H(reasoning)",
        "format ok",
        "sft loss",
    ]:
        table.add_column(header)
    for name, r in results.items():
        table.add_row(
            name,
            *(f"{r.chain[link].get(key, float('nan')):.3f}" for _, link, key in columns),
            f"{r.reasoning_token_entropy:.3f}",
            f"{r.format_ok_rate:.2f}",
            f"{r.sft_loss:.3f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
