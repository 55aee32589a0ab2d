"""CPU rollout engine: batched sampling from any HF causal LM with a KV cache.

One ``generate`` call runs:

1. **prefill** — prompts are sorted by length and cut into buckets of similar
   length, so little compute goes to padding; identical prompts (GRPO groups)
   are prefilled once.  Each bucket is left-padded and run in one forward with
   an attention mask and per-row ``position_ids``; its keys/values are copied,
   right-aligned, into one preallocated cache for the whole batch.
2. **decode** — one token per step for every live row.  The cache is
   preallocated (``_PreallocatedLayer``): a step writes one column in place
   instead of re-concatenating the whole cache as ``DynamicCache`` does.  Once
   finished rows make up ``compact_fraction`` of the batch they are dropped from
   it and from the cache (one copy), and padding columns that no remaining row
   needs are cut off the left (a view).

Log-probs: ``Generation.logprobs[i]`` is ``log_softmax(logits / T)`` at the
sampled token, i.e. under the temperature-scaled *full* distribution, before
top-k / top-p filtering — the quantity the learner recomputes.  With
``temperature == 0`` (greedy) it is ``log_softmax(logits)`` (temperature 1).

Models whose cache is not plain full attention (sliding-window, linear or
shared-KV layers) fall back to a standard ``DynamicCache`` and one padded
prefill; the decode loop and its results are the same, only slower.

Try it::

    python -c "from tether.policy.tiny import *; from tether.rollout import *; \
e = HFRolloutEngine(build_tiny_model(tiny_config('micro')), pad_token_id=0); \
print(e.generate([[1, 2, 3]], SamplingParams(max_new_tokens=5), seed=0))"
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import nullcontext

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from tether.algos.attention import (
    attention_implementation,
    register_attention,
    supports_custom_attention,
)
from tether.algos.vocab import head_logits, split_head, with_cache
from tether.rollout.base import Generation, RolloutEngine, SamplingParams

logger = logging.getLogger(__name__)


class _PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer over a preallocated [batch, heads, capacity, head_dim] buffer.

    ``keys``/``values`` are views of the filled columns, so HF code that reads
    them sees an ordinary cache; ``update`` writes new columns in place.
    """

    def __init__(
        self,
        batch: int,
        heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        super().__init__()
        # Columns are written before they are read; the left padding is zeroed in write_prefill.
        self._k = torch.empty(batch, heads, capacity, head_dim, dtype=dtype, device=device)
        self._v = torch.empty_like(self._k)
        self.length = 0
        self.dtype, self.device = dtype, device
        self.is_initialized = True
        self._sync_views()

    def _sync_views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        q_len = key_states.shape[-2]
        end = self.length + q_len
        if end > self._k.shape[2]:
            raise RuntimeError(f"KV cache overflow: {end} columns > capacity {self._k.shape[2]}")
        self._k[:, :, self.length : end].copy_(key_states)
        self._v[:, :, self.length : end].copy_(value_states)
        self.length = end
        self._sync_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def write_prefill(
        self, rows: slice, cols: slice, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Copy a prefilled bucket's keys/values into rows x cols of the buffer; zero the columns left of it.

        Those columns are masked out, but uninitialised memory could hold NaN, and 0 * NaN poisons p @ V.
        """
        for buf, filled in ((self._k, keys), (self._v, values)):
            buf[rows, :, cols].copy_(filled)
            buf[rows, :, : cols.start].zero_()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        # Copy only the filled columns; the new buffer keeps the spare capacity.
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty(len(indices), *old.shape[1:])
            torch.index_select(old[:, :, : self.length], 0, indices, out=new[:, :, : self.length])
            setattr(self, name, new)
        self._sync_views()

    def drop_left(self, n_cols: int) -> None:
        """Forget the first ``n_cols`` columns (padding no live row attends to); a view, no copy."""
        self._k, self._v = self._k[:, :, n_cols:], self._v[:, :, n_cols:]
        self.length -= n_cols
        self._sync_views()


def _full_attention_only(model) -> bool:
    """True if every cache layer this model builds is a plain full-attention ``DynamicLayer``."""
    probe = DynamicCache(config=model.config)
    return len(probe.layers) > 0 and all(type(layer) is DynamicLayer for layer in probe.layers)


GROUPED_PROMPT_ATTENTION = "tether_grouped_prompt"


class _GroupedPrompts:
    """The distinct prompts' keys/values, stored once, and which live row reads which.

    ``keys[layer]``/``values[layer]``: [U, Hkv, P, D], prompt u right-aligned (its left
    padding gets ``bias`` -inf-like); ``row_prompt``: [b] prompt of each live row, rows of
    one prompt adjacent.  ``slot`` places row i at (row_prompt[i], rank within its prompt).
    """

    def __init__(self, cache: DynamicCache, lengths: torch.Tensor, row_prompt: torch.Tensor):
        self.keys = [layer.keys for layer in cache.layers]
        self.values = [layer.values for layer in cache.layers]
        width = self.keys[0].shape[2]
        cols = torch.arange(width, device=lengths.device)
        pad = cols[None, :] < (width - lengths)[:, None]  # [U, P]
        dtype = self.keys[0].dtype
        self.bias = torch.zeros(pad.shape, dtype=dtype, device=lengths.device).masked_fill(
            pad, torch.finfo(dtype).min
        )[:, None, None, :]  # [U, 1, 1, P]
        self.select(row_prompt)

    def select(self, row_prompt: torch.Tensor) -> None:
        """Live rows changed (compaction): recompute each row's slot."""
        self.row_prompt = row_prompt
        first = torch.searchsorted(row_prompt, row_prompt)  # first row of its prompt
        self.rank = torch.arange(len(row_prompt), device=row_prompt.device) - first
        self.rows_per_prompt = int(self.rank.max()) + 1


@register_attention(GROUPED_PROMPT_ATTENTION, "grouped_prompts")
def _grouped_prompt_attention(module, query, key, value, scale: float, grouped_prompts):
    """Decode attention of b rows over their shared prompt (stored once per distinct
    prompt) plus their own decoded tokens, softmax merged exactly across the two parts.

    query [b, Hq, 1, D]; key/value [b, Hkv, s, D]: each row's own decoded tokens (all
    valid).  The prompt part runs as one batched matmul per distinct prompt (its rows
    folded into the query rows), so the prompt's keys/values are read once per prompt
    instead of once per row.  Returns [b, 1, Hq, D].
    """
    gp: _GroupedPrompts = grouped_prompts
    pk, pv = gp.keys[module.layer_idx], gp.values[module.layer_idx]  # [U, Hkv, P, D]
    b, hq, t, d = query.shape
    if t != 1:
        raise ValueError("grouped-prompt attention is for one-token decode steps")
    hkv, n_prompts, r = key.shape[1], pk.shape[0], gp.rows_per_prompt
    g = hq // hkv
    q = query[:, :, 0] * scale  # [b, Hq, D]
    # Prompt part, in a padded [U, Hkv, r*g, .] layout: one matmul per distinct prompt.
    q_pad = q.new_zeros(n_prompts, r, hq, d)
    q_pad[gp.row_prompt, gp.rank] = q
    q_pad = (
        q_pad.view(n_prompts, r, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(n_prompts, hkv, r * g, d)
    )
    s_pre = torch.matmul(q_pad, pk.transpose(-1, -2)) + gp.bias  # [U, Hkv, r*g, P]
    m_pre = s_pre.amax(-1, keepdim=True)
    e_pre = torch.exp(s_pre - m_pre)
    o_pre = torch.matmul(e_pre, pv)  # [U, Hkv, r*g, D]
    l_pre = e_pre.sum(-1, keepdim=True)

    def to_rows(x):  # [U, Hkv, r*g, k] -> [b, Hkv, g, k]
        return x.view(n_prompts, hkv, r, g, -1)[gp.row_prompt, :, gp.rank]

    o_pre, l_pre, m_pre = to_rows(o_pre), to_rows(l_pre), to_rows(m_pre)
    # Own part: each row's decoded tokens.
    q_own = q.view(b, hkv, g, d)
    s_own = torch.matmul(q_own, key.transpose(-1, -2))  # [b, Hkv, g, s]
    m_own = s_own.amax(-1, keepdim=True)
    e_own = torch.exp(s_own - m_own)
    o_own, l_own = torch.matmul(e_own, value), e_own.sum(-1, keepdim=True)  # [b, Hkv, g, D]
    m = torch.maximum(m_pre, m_own)
    a, c = torch.exp(m_pre - m), torch.exp(m_own - m)
    out = (o_pre * a + o_own * c) / (l_pre * a + l_own * c)  # [b, Hkv, g, D]
    return out.reshape(b, 1, hq, d)


def _sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of logits [b, V]; return (tokens [b], logprobs [b]).

    The log-prob is under log_softmax(logits / T) of the unfiltered distribution
    (T = 1 for greedy); top-k / top-p only restrict which tokens can be drawn.
    """
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits / params.temperature
    logp = torch.log_softmax(scaled, dim=-1)  # [b, V]
    allowed = logp
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]  # [b, 1]
        allowed = allowed.masked_fill(scaled < kth, -math.inf)
    if params.top_p < 1.0:
        sorted_logp, order = allowed.sort(dim=-1, descending=True)
        sorted_p = sorted_logp.softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (the first always stays).
        drop_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        allowed = allowed.masked_fill(drop, -math.inf)
    # Exponential race: argmax p_i / E_i with E_i ~ Exp(1) draws i with probability p_i.
    probs = (allowed - allowed.amax(dim=-1, keepdim=True)).exp()
    race = torch.empty_like(probs).exponential_(generator=generator)
    tokens = (probs / race).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _buckets(lengths: Sequence[int], pad_tolerance: float) -> list[tuple[int, int]]:
    """Split rows sorted by descending length into [start, end) runs whose padding stays within tolerance."""
    spans, start = [], 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or lengths[i] < (1.0 - pad_tolerance) * lengths[start]:
            spans.append((start, i))
            start = i
    return spans


class HFRolloutEngine(RolloutEngine):
    """Batched KV-cache sampling from a HF causal LM on CPU (or any torch device).

    Args:
        model: a ``transformers`` causal LM (``forward`` takes ``input_ids``,
            ``attention_mask``, ``position_ids``, its KV cache (``vocab.with_cache``), ``logits_to_keep``).
        pad_token_id: id used to left-pad prompts (never attended to).
        eos_token_ids: ids that always end a reply, in addition to ``SamplingParams.stop_token_ids``.
        device: where the model and batch tensors live.
        prefill_chunk: most prompt tokens (rows x padded length) per prefill forward,
            to bound activation memory; ``None`` means no limit.
        tokenizer: needed only for ``SamplingParams.stop_strings``.
        max_context: model window; defaults to ``config.max_position_embeddings``.
        pad_tolerance: a prefill bucket admits a prompt while its padding is at most
            this fraction of the bucket length (0 = only equal lengths share a forward).
        compact_fraction: finished rows are dropped from the batch and KV cache once they
            are at least this fraction of it (0 = as soon as any row finishes); each drop
            copies the cache, so waiting for a few trades a little wasted compute for fewer copies.
        grouped_prompts: keep each distinct prompt's keys/values once and let its rows
            attend to them through ``_grouped_prompt_attention`` (GRPO groups: 16 rows read
            one prompt cache instead of 16 copies).  ``None`` (auto) uses it when at most
            ``grouped_max_distinct`` of the rows have distinct prompts and the model
            dispatches full attention through HF's ``AttentionInterface``.
        reuse_turns: keep each reply's keys/values until the next call, and prefill only
            what a new prompt adds to a kept one (a multi-turn episode's next prompt is its
            last prompt, the reply and the environment's answer: without this every turn
            prefills the whole conversation again, most of a FrozenLake collection's
            time).  Same tokens and log-probs up to floating-point order
            (``tests/test_rollout_hf.py``); the kept keys/values are dropped when the
            weights change.  Full-attention models only.
    """

    def __init__(
        self,
        model,
        pad_token_id: int,
        eos_token_ids: Sequence[int] = (),
        device: str | torch.device = "cpu",
        prefill_chunk: int | None = None,
        tokenizer=None,
        max_context: int | None = None,
        pad_tolerance: float = 0.1,
        compact_fraction: float = 0.1,
        grouped_prompts: bool | None = None,
        grouped_max_distinct: float = 0.5,
        autocast: str = "none",
        reuse_turns: bool = True,
    ):
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(
                f"prefill_chunk must be a positive token count or None, got {prefill_chunk}"
            )
        if not 0.0 <= pad_tolerance < 1.0:
            raise ValueError(f"pad_tolerance must be in [0, 1), got {pad_tolerance}")
        if not 0.0 <= compact_fraction <= 1.0:
            raise ValueError(f"compact_fraction must be in [0, 1], got {compact_fraction}")
        if autocast not in ("none", "bfloat16"):
            raise ValueError(f"autocast must be none or bfloat16, got {autocast!r}")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        #: Mixed precision of the forwards (``rollout.autocast``): the body in bfloat16
        #: autocast, the head in float32 on float32 states (`vocab.head_logits`).
        self.autocast = autocast
        self._split = split_head(self.model) if autocast != "none" else None
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.prefill_chunk = prefill_chunk
        self.tokenizer = tokenizer
        self.pad_tolerance = pad_tolerance
        self.compact_fraction = compact_fraction
        window = max_context or getattr(
            model.config.get_text_config(), "max_position_embeddings", None
        )
        if not window or window < 2:
            raise ValueError(
                f"need a model window of at least 2 tokens, got {window}: check the config's "
                "max_position_embeddings or pass max_context="
            )
        self._max_context = int(window)
        self._preallocate = _full_attention_only(model)
        supported = self._preallocate and supports_custom_attention(model)
        if grouped_prompts and not supported:
            raise ValueError(
                "grouped_prompts needs a full-attention model that dispatches attention "
                "through transformers' AttentionInterface"
            )
        self.grouped_prompts = supported if grouped_prompts is None else bool(grouped_prompts)
        self.grouped_max_distinct = grouped_max_distinct
        self._force_grouped = bool(grouped_prompts)
        self.reuse_turns = bool(reuse_turns) and self._preallocate
        #: The previous call's rows: {length: {token ids: per-layer (keys, values) [H, L, D]}}.
        self._kept: dict[int, dict[tuple, list]] = {}
        self._keeping: dict[int, dict[tuple, list]] = {}
        #: Prompt tokens whose keys/values came from a kept reply (since construction).
        self.reused_tokens = 0

    @property
    def max_context(self) -> int:
        return self._max_context

    def load_state_dict(self, state_dict: dict) -> None:
        """Copy weights into the model's existing tensors (no re-allocation)."""
        own = self.model.state_dict()
        unknown = sorted(set(state_dict) - set(own))
        missing = sorted(set(own) - set(state_dict) - self._tied_names())
        reshaped = sorted(
            k for k in set(state_dict) & set(own) if state_dict[k].shape != own[k].shape
        )
        if unknown or missing or reshaped:
            raise KeyError(
                f"state_dict does not match the rollout model: unknown keys {unknown[:5]}, "
                f"missing keys {missing[:5]}, wrong shapes {reshaped[:5]}"
            )
        with torch.no_grad():
            for name, tensor in state_dict.items():
                own[name].copy_(tensor)
        self._kept = {}  # keys/values of the old weights

    def _tied_names(self) -> set[str]:
        tied = getattr(self.model, "_tied_weights_keys", None) or {}
        return set(tied) if self.model.config.get_text_config().tie_word_embeddings else set()

    # ---------------------------------------------------------------- generate

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[Generation]:
        """Sample one reply per prompt (order kept).  The same seed, prompts and engine
        settings give the same replies; a row's sample also depends on the rest of the batch."""
        self._check(prompts, params)
        if not prompts:
            return []
        window = self._max_context
        kept = [list(p[-(window - 1) :]) if len(p) > window - 1 else list(p) for p in prompts]
        truncated = [len(p) - len(k) for p, k in zip(prompts, kept)]
        if any(truncated):
            logger.warning(
                "%d of %d prompts were longer than the model window (%d) minus one and were "
                "truncated from the left",
                sum(t > 0 for t in truncated),
                len(prompts),
                window,
            )
        if params.max_new_tokens == 0:
            return [self._wrap([], [], "length", len(k), t) for k, t in zip(kept, truncated)]

        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()  # fresh, non-reproducible
        else:
            generator.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                tokens, logprobs, n_out, stopped, order = self._run(kept, params, generator)
            self._kept = self._keeping  # this call's replies, for the next call
        finally:
            self._keeping = {}
            self.model.train(was_training)

        out: list[Generation | None] = [None] * len(prompts)
        tok_rows, lp_rows = tokens.tolist(), logprobs.tolist()
        for i, src in enumerate(order):
            n = n_out[i]
            reason = (
                "stop" if stopped[i] else ("length" if n == params.max_new_tokens else "context")
            )
            out[src] = self._wrap(
                tok_rows[i][:n], lp_rows[i][:n], reason, len(kept[src]), truncated[src]
            )
        return out

    def _check(self, prompts, params: SamplingParams) -> None:
        if params.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
        if params.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {params.temperature}")
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
        if params.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {params.top_k}")
        if params.stop_strings and self.tokenizer is None:
            raise ValueError(
                "SamplingParams.stop_strings needs a tokenizer: pass tokenizer= to HFRolloutEngine"
            )
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(
                    f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)"
                )

    @staticmethod
    def _wrap(token_ids, logprobs, reason, prompt_len, n_truncated) -> Generation:
        meta = {"prompt_tokens": prompt_len, "truncated_prompt_tokens": n_truncated}
        if n_truncated:
            meta["warning"] = (
                f"prompt truncated from the left by {n_truncated} tokens to fit the model window"
            )
        return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=reason, meta=meta)

    def _run(self, prompts: list[list[int]], params: SamplingParams, generator: torch.Generator):
        """Prefill + decode. Rows are processed sorted by descending length; returns that order."""
        dev = self.device
        # Sort by length (desc), then content, so buckets are contiguous and duplicates adjacent.
        order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), prompts[i]))
        prompts = [prompts[i] for i in order]
        lengths = torch.tensor([len(p) for p in prompts], device=dev)  # [B]
        batch, longest = len(prompts), len(prompts[0])
        # Per-row token budget: the reply limit, or the model window if that comes first.
        budget = (self._max_context - lengths).clamp(max=params.max_new_tokens)  # [B]
        steps = int(budget.max())

        distinct = sum(1 for i, p in enumerate(prompts) if i == 0 or p != prompts[i - 1])
        grouped = self.grouped_prompts and (
            self._force_grouped or distinct <= self.grouped_max_distinct * batch
        )
        if grouped:
            # Distinct prompts once; rows keep only their decoded tokens' keys/values.
            unique = [p for i, p in enumerate(prompts) if i == 0 or p != prompts[i - 1]]
            row_prompt = torch.tensor(
                [0] + [int(prompts[i] != prompts[i - 1]) for i in range(1, batch)], device=dev
            ).cumsum(0)  # [B]
            prompt_cache, prompt_logits = self._prefill(unique, longest)
            shared = _GroupedPrompts(
                prompt_cache, torch.tensor([len(p) for p in unique], device=dev), row_prompt
            )
            logits = prompt_logits.index_select(0, row_prompt)
            # The rows' decoded tokens only: every column is written before it is read.
            cache = self._allocate(prompt_cache, batch, steps)
            attention = attention_implementation(self.model, GROUPED_PROMPT_ATTENTION)
        else:
            cache, logits = self._prefill(prompts, longest + steps)  # logits [B, V]
            attention, shared = nullcontext(), None
        # Columns: [0, longest) prompts right-aligned, then one column per decode step.
        attn = torch.ones(batch, longest + steps, dtype=torch.long, device=dev)
        attn[:, :longest] = torch.arange(longest, device=dev) >= (longest - lengths)[:, None]

        with attention:
            tokens, logprobs, n_out, stopped = self._decode(
                params, generator, steps, prompts, budget, cache, logits, attn, shared
            )
        return tokens, logprobs, n_out.tolist(), stopped.tolist(), order

    def _decode(self, params, generator, steps, prompts, budget, cache, logits, attn, shared):
        """The decode loop: sample, record, drop finished rows, one forward per step.
        ``shared`` (grouped prompts): the cache holds decoded tokens only, no mask is built.
        Returns the sampled tokens and their log-probs [B, steps], each row's count of
        tokens [B] and whether a stop token or string ended it [B]."""
        dev, batch = self.device, len(prompts)
        longest = len(prompts[0])  # sorted by descending length
        lengths = torch.tensor([len(p) for p in prompts], device=dev)  # [B]
        stop_ids = torch.tensor(
            sorted(set(params.stop_token_ids) | set(self.eos_token_ids)),
            dtype=torch.long,
            device=dev,
        )
        tokens = torch.full((batch, steps), self.pad_token_id, dtype=torch.long, device=dev)
        logprobs = torch.zeros(batch, steps, device=dev)
        n_out = torch.zeros(batch, dtype=torch.long, device=dev)
        stopped = torch.zeros(batch, dtype=torch.bool, device=dev)
        live = torch.arange(batch, device=dev)  # sorted-order row of each batch row
        active = torch.ones(batch, dtype=torch.bool, device=dev)  # batch rows still generating
        first_col = 0  # columns already cut off the left of the cache / mask
        for step in range(steps):
            tok, lp = _sample(logits, params, generator)  # [b], [b]
            # Finished rows not yet dropped write past their end; the final slice ignores it.
            tokens[live, step], logprobs[live, step] = tok, lp.float()
            hit_stop = torch.isin(tok, stop_ids) if len(stop_ids) else torch.zeros_like(active)
            if params.stop_strings:
                rows = active.nonzero().squeeze(-1)
                hit_stop[rows] |= self._stop_string_hits(
                    tokens[live[rows], : step + 1], params.stop_strings
                )
            done = active & (hit_stop | (budget[live] <= step + 1))
            if bool(done.any()):
                n_out[live[done]], stopped[live[done]] = step + 1, hit_stop[done]
                if self.reuse_turns:
                    where = (longest, lengths, first_col, cache, shared)
                    for position in done.nonzero().squeeze(-1).tolist():
                        row = int(live[position])
                        self._keep(prompts[row], tokens[row, :step].tolist(), position, where)
                active &= ~done
                n_active = int(active.sum())
                if n_active == 0:
                    break
                if len(live) - n_active >= self.compact_fraction * len(live):
                    keep = active.nonzero().squeeze(-1)
                    live, tok, attn, active = live[keep], tok[keep], attn[keep], active[keep]
                    cache.batch_select_indices(keep)
                    if shared is not None:
                        shared.select(shared.row_prompt[keep])
                    # Left columns that are padding for every remaining row: cut from cache and mask.
                    cut = int(longest - lengths[live].max()) - first_col
                    if cut > 0 and self._preallocate and shared is None:
                        for layer in cache.layers:
                            layer.drop_left(cut)
                        attn, first_col = attn[:, cut:], first_col + cut
            kv_len = longest + step + 1 - first_col
            # Clamped so finished rows still in the batch never index past the window.
            positions = (lengths[live] + step).clamp(max=self._max_context - 1)[:, None]
            if shared is None:
                logits = self._last_logits(
                    input_ids=tok[:, None],
                    attention_mask=attn[:, :kv_len],
                    position_ids=positions,
                    **with_cache(self.model, cache),
                    use_cache=True,
                )
            else:
                logits = self._last_logits(
                    input_ids=tok[:, None],
                    position_ids=positions,
                    **with_cache(self.model, cache),
                    use_cache=True,
                    grouped_prompts=shared,
                )
        return tokens, logprobs, n_out, stopped

    def _stop_string_hits(
        self, generated: torch.Tensor, stop_strings: Sequence[str]
    ) -> torch.Tensor:
        """[b] bool: does the decoded tail of each live row contain a stop string?

        A stop string of c characters spans at most c tokens when every token decodes
        to at least one character, so the last (longest + 1) tokens are decoded.
        """
        tail = max(len(s) for s in stop_strings) + 1
        texts = self.tokenizer.batch_decode(
            generated[:, -tail:].tolist(), skip_special_tokens=False
        )
        return torch.tensor(
            [any(s in t for s in stop_strings) for t in texts],
            dtype=torch.bool,
            device=generated.device,
        )

    # ----------------------------------------------------------------- prefill

    def _prefill(self, prompts: list[list[int]], capacity: int):
        """Run the prompts (sorted by descending length) through the model.

        Returns (cache holding every row's prompt right-aligned in columns [0, longest),
        next-token logits [B, V]).
        """
        longest = len(prompts[0])
        if not self._preallocate:
            ids, mask = self._left_pad(prompts, longest)
            cache = DynamicCache(config=self.model.config)
            return cache, self._forward_chunked(ids, mask, cache)

        cache, logits = None, None
        lengths = [len(p) for p in prompts]
        for start, end in _buckets(lengths, self.pad_tolerance):
            # Identical prompts in a bucket are prefilled once and their KV copied.
            unique, inverse = [], []
            for p in prompts[start:end]:
                if not unique or p != unique[-1]:
                    unique.append(p)
                inverse.append(len(unique) - 1)
            inverse_t = torch.tensor(inverse, device=self.device)
            width = lengths[start]
            recalled = [self._recalled(p) for p in unique]
            # Columns every row of the bucket must run: those past its kept prefix.
            window = (
                max(len(p) - n for p, (n, _) in zip(unique, recalled))
                if all(kv is not None for _, kv in recalled)
                else width
            )
            rows_per_forward = max(1, (self.prefill_chunk or width * len(unique)) // width)
            for u0 in range(0, len(unique), rows_per_forward):
                u1 = min(u0 + rows_per_forward, len(unique))
                ids, mask = self._left_pad(unique[u0:u1], width)
                part = DynamicCache(config=self.model.config)
                if window < width:
                    self._fill_kept(part, unique[u0:u1], recalled[u0:u1], width, window)
                part_logits = self._forward_chunked(ids, mask, part, width - window)  # [u, V]
                sel = ((inverse_t >= u0) & (inverse_t < u1)).nonzero().squeeze(-1)
                rows = slice(start + int(sel[0]), start + int(sel[-1]) + 1)
                src = inverse_t[sel] - u0
                if cache is None:
                    cache = self._allocate(part, len(prompts), capacity)
                    logits = part_logits.new_empty(len(prompts), part_logits.shape[-1])
                for layer, filled in zip(cache.layers, part.layers):
                    layer.write_prefill(
                        rows,
                        slice(longest - width, longest),
                        filled.keys.index_select(0, src),
                        filled.values.index_select(0, src),
                    )
                logits[rows] = part_logits.index_select(0, src)
        for layer in cache.layers:
            layer.length = longest
            layer._sync_views()
        return cache, logits

    # ------------------------------------------------------ turn-to-turn reuse

    def _keep(self, prompt, generated, position: int, where) -> None:
        """Keep a finished row's keys/values: its prompt and every sampled token but the
        last (the last was never fed), i.e. the start of its next turn's prompt."""
        longest, lengths, first_col, cache, shared = where
        row_len, n = len(prompt), len(generated)
        kv = []
        for index, layer in enumerate(cache.layers):
            if shared is None:  # the prompt right-aligned at `longest`, then the decoded columns
                start = longest - row_len - first_col
                cols = slice(start, start + row_len + n)
                kv.append(
                    (layer.keys[position, :, cols].clone(), layer.values[position, :, cols].clone())
                )
            else:  # the prompt's keys/values are its group's; the cache holds decoded ones
                u, width = int(shared.row_prompt[position]), shared.keys[index].shape[2]
                kv.append(
                    tuple(
                        torch.cat([part[u, :, width - row_len :], own[position, :, :n]], dim=1)
                        for part, own in (
                            (shared.keys[index], layer.keys),
                            (shared.values[index], layer.values),
                        )
                    )
                )
        key = tuple(prompt) + tuple(generated)
        self._keeping.setdefault(len(key), {})[key] = kv

    def _recalled(self, prompt: list[int]) -> tuple[int, list | None]:
        """(n, keys/values) of the longest kept row that is a proper prefix of ``prompt``,
        or (0, None)."""
        for n in sorted(self._kept, reverse=True):
            if n < len(prompt):
                kv = self._kept[n].get(tuple(prompt[:n]))
                if kv is not None:
                    return n, kv
        return 0, None

    def _fill_kept(self, part: DynamicCache, prompts, recalled, width: int, window: int) -> None:
        """Columns [0, width - window) of a bucket's cache from the kept rows: prompt p's
        first len(p) - window tokens right-aligned there, zeros (masked) left of them."""
        for index in range(len(recalled[0][1])):
            keys, values = [], []
            for p, (_, kv) in zip(prompts, recalled):
                reused = max(0, len(p) - window)  # a shorter row lies wholly in the window
                k, v = kv[index]
                pad = width - window - reused
                keys.append(torch.nn.functional.pad(k[:, :reused], (0, 0, pad, 0)))
                values.append(torch.nn.functional.pad(v[:, :reused], (0, 0, pad, 0)))
                if index == 0:
                    self.reused_tokens += reused
            part.update(torch.stack(keys), torch.stack(values), index)

    def _allocate(self, like: DynamicCache, batch: int, capacity: int) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        cache.layers = [
            _PreallocatedLayer(
                batch,
                layer.keys.shape[1],
                capacity,
                layer.keys.shape[3],
                layer.keys.dtype,
                layer.keys.device,
            )
            for layer in like.layers
        ]
        return cache

    def _left_pad(self, prompts: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _forward_chunked(
        self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache, start: int = 0
    ) -> torch.Tensor:
        """Prefill columns [start, L) of [b, L] into ``cache`` (which holds columns [0,
        start)), at most ``prefill_chunk`` tokens per forward; last logits [b, V]."""
        width = ids.shape[1]
        cols = width if self.prefill_chunk is None else max(1, self.prefill_chunk // ids.shape[0])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [b, L]
        for c0 in range(start, width, cols):
            c1 = min(c0 + cols, width)
            logits = self._last_logits(
                input_ids=ids[:, c0:c1],
                attention_mask=mask[:, :c1],
                position_ids=positions[:, c0:c1],
                **with_cache(self.model, cache),
                use_cache=True,
            )
        return logits

    def _last_logits(self, **inputs) -> torch.Tensor:
        """float32 next-token logits [b, V] of a forward.  Under ``autocast`` the body runs
        in bfloat16 and the head in float32, as in the learner, so the sampled tokens'
        log-probs are what the learner's update computes for them."""
        if self.autocast == "none":
            return self.model(**inputs, logits_to_keep=1).logits[:, -1].float()
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            if self._split is None:
                return self.model(**inputs, logits_to_keep=1).logits[:, -1].float()
            backbone, head = self._split
            return head_logits(backbone(**inputs).last_hidden_state[:, -1], head)
