"""The rollout-engine interface: batched sampling with per-token log-probs.

Engines (``hf`` on CPU, ``vllm`` on GPU) take token-id prompts and return token-id
continuations with the log-prob of each sampled token under the *sampling*
distribution (logits / temperature).  They never see text, so the agent loop and
the learner agree exactly on tokens.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one reply."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    #: Token ids that end a reply (included in the output), e.g. ``</answer>`` and EOS.
    stop_token_ids: tuple[int, ...] = ()
    #: Strings that end a reply when they appear in the decoded continuation
    #: (for tokenizers where ``</answer>`` is several tokens).
    stop_strings: tuple[str, ...] = ()


@dataclass
class Generation:
    """One sampled continuation."""

    token_ids: list[int]
    #: log p(token) under the sampling distribution, one per token.
    logprobs: list[float]
    #: "stop" (a stop token/string), "length" (max_new_tokens) or "context" (model window).
    finish_reason: str = "stop"
    meta: dict = field(default_factory=dict)


class RolloutEngine(abc.ABC):
    """Batched sampler over token ids."""

    @abc.abstractmethod
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[Generation]:
        """Sample one continuation per prompt, all prompts in one batch."""

    @abc.abstractmethod
    def load_state_dict(self, state_dict: dict) -> None:
        """Replace the policy weights (weight sync from the learner)."""

    @property
    @abc.abstractmethod
    def max_context(self) -> int:
        """Longest prompt + continuation the model accepts."""
