"""Prompt building and reply parsing (docs/methods.md, section 12).

A reply is read with a non-greedy match of
``<think>(.*?)</think>\\s*<answer>(.*?)</answer>`` anchored at the start of the
reply (generation starts after a forced ``<think>``, which the parser is given
back).  Anything else -- no tags, nested or unterminated tags, replacement
characters from undecodable bytes, text beyond ``max_chars`` -- is a format error:
the caller applies the format penalty and does not step the environment.
Parsing never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
REPLY_PATTERN = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
#: Replies longer than this are refused before any regex runs (bounded work).
MAX_REPLY_CHARS = 20_000

SYSTEM_PREAMBLE = "You are a helpful assistant that solves the task step by step."


@dataclass(frozen=True)
class ParsedReply:
    """The outcome of parsing one reply."""

    format_ok: bool
    reasoning: str | None = None
    answer: str | None = None
    error: str | None = None


def parse_reply(reply: str | bytes, max_chars: int = MAX_REPLY_CHARS) -> ParsedReply:
    """Parse ``<think>…</think><answer>…</answer>``; never raises."""
    try:
        if isinstance(reply, (bytes, bytearray)):
            try:
                reply = bytes(reply).decode("utf-8")
            except UnicodeDecodeError:
                return ParsedReply(False, error="reply is not valid UTF-8")
        if not isinstance(reply, str):
            return ParsedReply(False, error="reply is not text")
        if len(reply) > max_chars:
            return ParsedReply(False, error=f"reply longer than {max_chars} characters")
        if "\ufffd" in reply:
            return ParsedReply(False, error="reply contains undecodable bytes")
        match = REPLY_PATTERN.match(reply)
        if match is None:
            return ParsedReply(False, error="no <think>…</think><answer>…</answer>")
        reasoning, answer = match.group(1), match.group(2)
        if any(tag in reasoning or tag in answer for tag in TAGS):
            return ParsedReply(False, error="nested tags")
        answer = answer.strip()
        if not answer:
            return ParsedReply(False, error="empty answer")
        return ParsedReply(True, reasoning=reasoning.strip(), answer=answer)
    except Exception as exc:  # defensive: parsing must never take the trainer down
        return ParsedReply(False, error=f"parser error: {type(exc).__name__}")


def system_prompt(env_rules: str) -> str:
    return f"{SYSTEM_PREAMBLE}\n{env_rules.strip()}"


def user_prompt(
    turn: int,
    state: str,
    actions_left: int | None,
    max_reply_tokens: int,
    previous_reward: float | None = None,
) -> str:
    """One user turn: reward of the last turn, turn number, state, actions left, format."""
    lines = []
    if previous_reward is not None:
        lines.append(f"Reward: {previous_reward:g}")
    lines.append(f"Turn {turn}:")
    lines.append(f"State:\n{state.strip()}")
    if actions_left is not None:
        lines.append(f"Actions left: {actions_left}")
    lines.append(
        f"Answer as <think>...</think><answer>...</answer> in at most {max_reply_tokens} tokens."
    )
    return "\n".join(lines)


def format_reply(reasoning: str, answer: str) -> str:
    """A reply as the policy should write it, *without* the forced opening tag."""
    return f"{reasoning}{THINK_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
