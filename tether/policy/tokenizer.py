"""The BPE tokenizer Tether trains on environment text for its tiny model.

Byte-level, so every string (and every byte) has an encoding; the reasoning and
answer tags are single tokens so the prompt ends on exactly one ``<think>`` id.

How numerals are cut (``numerals``) decides what copying a position or a number
costs the model:
- ``digits``: one digit per token, so coordinates and numbers stay compositional;
  copying ``(2,3)`` is five tokens, two of which must be found in the prompt;
- ``coordinates``: a coordinate ``(r,c)`` (with its leading space) is one
  pre-token, which BPE merges into one opaque token when it is frequent: copying
  it is one token whose identity the attention reads off the prompt (with tied
  embeddings, an identity map), and every such token is specific to the state;
- ``numbers``: as ``coordinates``, and a run of digits is one pre-token too.
Saved and loaded as a ``PreTrainedTokenizerFast`` with a ChatML chat template,
like any Hugging Face chat tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ..agent.format import TAGS

PAD, BOS_CHAT, EOS_CHAT = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
RESERVED_TOKENS = [PAD, BOS_CHAT, EOS_CHAT]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

Numerals = Literal["digits", "coordinates", "numbers"]
NUMERALS: tuple[str, ...] = ("digits", "coordinates", "numbers")
# GPT-2's split, with a coordinate (and optionally a digit run) kept whole; an opening
# parenthesis never glues onto the punctuation before it, so "),(1,2)" keeps "(1,2)".
_SPLIT = r" ?\(\d+,\d+\)| ?\p{{L}}+| ?\p{{N}}{digits}| ?[^\s\p{{L}}\p{{N}}(]+| ?\(|\s+(?!\S)|\s+"
#: One symbol of a map row: an upper-case letter or one of ``_ # * +`` (the grid envs'
#: symbols), on a line whose rest holds only such symbols ("_HHH", "#_PX#").  Each is its
#: own pre-token, so a row is as many tokens as cells and never one of BPE's merges
#: ("_", "HHH"): the cell at column c is the row's c-th token, which copying a row, or
#: finding what is at (r,c), needs (benchmarks/history/2026-11-25.md).  Punctuation is
#: not a symbol, so a prompt's "<think>...</think>" is cut as before.
GRID_CELL = r"(?:^|\G)[\p{Lu}_#*+](?=[\p{Lu}_#*+]*$)"


def pre_tokenizer(numerals: Numerals = "digits"):
    cells = pre_tokenizers.Split(Regex(GRID_CELL), behavior="isolated")
    if numerals == "digits":
        return pre_tokenizers.Sequence(
            [
                cells,
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if numerals not in NUMERALS:
        raise ValueError(f"unknown numerals {numerals!r}; choose one of {list(NUMERALS)}")
    pattern = _SPLIT.format(digits="+" if numerals == "numbers" else "")
    return pre_tokenizers.Sequence(
        [
            cells,
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 512, numerals: Numerals = "digits"
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and wrap it as a HF fast tokenizer."""
    bpe = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    bpe.pre_tokenizer = pre_tokenizer(numerals)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=RESERVED_TOKENS + list(TAGS),
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


#: The text of filler token k (`pad_vocabulary`): visible, and never produced by encoding.
FILLER = "<|filler_{}|>"


def pad_vocabulary(tokenizer: PreTrainedTokenizerFast, size: int) -> PreTrainedTokenizerFast:
    """The same tokenizer with its BPE vocabulary padded to ``size`` ids by filler tokens.

    A model with a real-size vocabulary (Qwen2.5's 151,936) built from the project's own
    tokenizer: encoding is unchanged (no merge produces a filler, so every text is cut
    exactly as before), and every id the model can sample decodes (filler k reads
    ``<|filler_k|>``), as the padded ids of a real checkpoint's embedding do not."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    taken = set(vocab) | {t["content"] for t in state.get("added_tokens", [])}
    next_id = len(tokenizer)
    if next_id > size:
        raise ValueError(f"the tokenizer has {next_id} tokens, more than {size}")
    k = 0
    while next_id < size:
        text = FILLER.format(k)
        k += 1
        if text not in taken:
            vocab[text] = next_id
            next_id += 1
    padded = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)),
        pad_token=tokenizer.pad_token,
        eos_token=tokenizer.eos_token,
        bos_token=tokenizer.bos_token,
        additional_special_tokens=[BOS_CHAT],
    )
    padded.chat_template = tokenizer.chat_template
    padded.model_max_length = tokenizer.model_max_length
    return padded
