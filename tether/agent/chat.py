"""Token-level chat formatting for multi-turn episodes.

An episode is one growing token sequence: the first prompt (system + user turn 1,
the generation prompt and a forced ``<think>``), then each reply exactly as it was
sampled, then the next user turn as a continuation segment.  Building the
sequence from token ids (never re-tokenising past text) keeps what the learner
trains on identical to what the sampler saw.

The segments come from the tokenizer's own chat template, so the same code serves
the tiny model (ChatML) and any Hugging Face chat model.
"""

from __future__ import annotations

import logging

from .format import THINK_OPEN

log = logging.getLogger(__name__)

_PLACEHOLDER = "\u2063TETHER_REPLY\u2063"


class ChatFormatter:
    """Turns messages into token-id segments with a tokenizer's chat template."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        name = getattr(tokenizer, "name_or_path", "") or "the model"
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"{name} has no chat template: Tether needs a chat model (set "
                f"model.path to an instruct/chat checkpoint, or add a "
                f"chat_template to its tokenizer_config.json)"
            )
        #: False when the template refuses the system role (Gemma-family templates raise
        #: 'System role not supported'): the system text then opens the first user turn.
        self.system_role = self._accepts_system()
        if not self.system_role:
            log.warning(
                "the chat template of %s refuses the system role; the system prompt "
                "goes into the first user turn",
                name,
            )
        probe = [{"role": "user", "content": "u"}]
        if self._render(probe, generation_prompt=True) == self._render(
            probe, generation_prompt=False
        ):
            raise ValueError(
                f"the chat template of {name} adds no generation prompt "
                f"(add_generation_prompt changes nothing), so replies cannot be "
                f"sampled as the assistant: use a chat/instruct checkpoint or a "
                f"template that supports add_generation_prompt"
            )
        self._continuation_prefix = self._find_continuation_prefix()
        self.eos_token_id = tokenizer.eos_token_id

    def _accepts_system(self) -> bool:
        try:
            self.tokenizer.apply_chat_template(
                [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                tokenize=False,
                add_generation_prompt=True,
            )
        except Exception:  # jinja2 TemplateError from the template's raise_exception, or others
            return False
        return True

    def _messages(self, messages: list[dict]) -> list[dict]:
        """The messages as this template takes them: a refused system turn is merged into
        the first user turn."""
        if self.system_role or not messages or messages[0]["role"] != "system":
            return messages
        system, first, *rest = messages
        return [
            {"role": first["role"], "content": f"{system['content']}\n\n{first['content']}"},
            *rest,
        ]

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            self._messages(messages), tokenize=False, add_generation_prompt=generation_prompt
        )

    def _find_continuation_prefix(self) -> tuple[str, str]:
        """What the template puts between an assistant reply and the next user text,
        and between the user text and the generation prompt."""
        marker = "\u2063TETHER_USER\u2063"
        messages = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _PLACEHOLDER},
            {"role": "user", "content": marker},
        ]
        text = self._render(messages, generation_prompt=True)
        after_reply = text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER) :]
        before_user, after_user = after_reply.split(marker, 1)
        return before_user, after_user

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def stop_token_ids(self) -> tuple[int, ...]:
        """Token ids that end a reply: EOS, and ``</answer>`` where it is one token (else
        the engine stops on the string)."""
        from .format import ANSWER_CLOSE

        close = self.encode(ANSWER_CLOSE)
        stops = [self.tokenizer.eos_token_id] + (close if len(close) == 1 else [])
        return tuple(i for i in stops if i is not None)

    def first_prompt_ids(self, system: str, user: str) -> list[int]:
        """System + first user turn + generation prompt + forced ``<think>``."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return self.encode(self._render(messages, generation_prompt=True) + THINK_OPEN)

    def continuation_ids(self, user: str, reply_ids: list[int]) -> list[int]:
        """The segment after a sampled reply: end of the assistant turn, the next
        user turn, the generation prompt and a forced ``<think>``."""
        before_user, after_user = self._continuation_prefix
        text = before_user + user + after_user + THINK_OPEN
        ids = self.encode(text)
        # A reply that ended on EOS already closed the assistant turn.
        if (
            reply_ids
            and self.eos_token_id is not None
            and reply_ids[-1] == self.eos_token_id
            and ids
            and ids[0] == self.eos_token_id
        ):
            ids = ids[1:]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)
