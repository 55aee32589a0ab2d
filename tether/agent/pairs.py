"""(prompt, reasoning, action) token spans of each turn, for cross-scoring (docs/methods.md,
section 2).

Prompt x = the trajectory's tokens up to and including the turn's forced
``<think>``; reasoning z = the reply's tokens strictly before ``</think>``;
action a = the tokens strictly between ``<answer>`` and ``</answer>``.  Tags are
located by token id when the tokenizer has them as single tokens (the tiny model),
and otherwise by re-encoding the parsed text.
"""

from __future__ import annotations

from dataclasses import dataclass

from .chat import ChatFormatter
from .format import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE
from .types import Trajectory


@dataclass(frozen=True)
class TurnSpans:
    prompt_ids: tuple[int, ...]
    reasoning_ids: tuple[int, ...]
    action_ids: tuple[int, ...]


class SpanExtractor:
    def __init__(self, formatter: ChatFormatter) -> None:
        self.formatter = formatter
        ids = [formatter.encode(tag) for tag in (THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)]
        self.single = all(len(i) == 1 for i in ids)
        self.think_close, self.answer_open, self.answer_close = (
            i[0] if len(i) == 1 else None for i in ids
        )
        #: Tokens between reasoning and action, for I(Z;A) and I(X;A) contexts.
        self.answer_prefix_ids = tuple(formatter.encode(THINK_CLOSE + ANSWER_OPEN))

    def _by_id(self, reply: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self.think_close not in reply:
            return (), ()
        end = reply.index(self.think_close)
        reasoning = tuple(reply[:end])
        rest = reply[end + 1 :]
        if self.answer_open in rest and self.answer_close in rest:
            start = rest.index(self.answer_open) + 1
            stop = rest.index(self.answer_close)
            return reasoning, tuple(rest[start:stop]) if stop > start else ()
        return reasoning, ()

    def reasoning_mask(self, trajectory: Trajectory) -> list[int]:
        """1 on the trajectory's reasoning tokens (each reply's tokens before ``</think>``).

        A reply without ``</think>`` has no reasoning (as in `turns`).  When the tags are
        not single tokens, the reasoning is taken to be the first ``len(encode(reasoning))``
        reply tokens (generation starts right after the forced ``<think>``).
        """
        mask = [0] * len(trajectory.token_ids)
        for turn in trajectory.turns:
            reply = trajectory.token_ids[turn.reply_start : turn.reply_end]
            if self.single:
                n = reply.index(self.think_close) if self.think_close in reply else 0
            else:
                n = min(
                    len(self.formatter.encode(turn.reasoning)) if turn.reasoning else 0, len(reply)
                )
            mask[turn.reply_start : turn.reply_start + n] = [1] * n
        return mask

    def turns(self, trajectory: Trajectory) -> list[TurnSpans]:
        out = []
        for turn in trajectory.turns:
            prompt = tuple(trajectory.token_ids[: turn.reply_start])
            reply = trajectory.token_ids[turn.reply_start : turn.reply_end]
            if self.single:
                reasoning, action = self._by_id(reply)
            else:
                reasoning = tuple(self.formatter.encode(turn.reasoning)) if turn.reasoning else ()
                action = tuple(self.formatter.encode(turn.answer)) if turn.answer else ()
            out.append(TurnSpans(prompt, reasoning, action))
        return out
