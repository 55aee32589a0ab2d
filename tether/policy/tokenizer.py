"""The BPE tokenizer Tether trains on environment text for its tiny model.

Byte-level, so every string (and every byte) has an encoding; digits are split
one per token so coordinates and numbers stay compositional; the reasoning and
answer tags are single tokens so the prompt ends on exactly one ``<think>`` id.
Saved and loaded as a ``PreTrainedTokenizerFast`` with a ChatML chat template,
like any Hugging Face chat tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ..agent.format import TAGS

PAD, BOS_CHAT, EOS_CHAT = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS_CHAT, EOS_CHAT]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and wrap it as a HF fast tokenizer."""
    bpe = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + list(TAGS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token=PAD,
        eos_token=EOS_CHAT,
        bos_token=None,
        additional_special_tokens=[BOS_CHAT],
    )
    # The tags are ordinary (decoded) tokens, not special ones that decoding would drop.
    tokenizer.add_tokens(list(TAGS))
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.model_max_length = 1 << 20
    return tokenizer
