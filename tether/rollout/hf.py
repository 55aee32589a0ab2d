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

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from tether.rollout.base import Generation, RolloutEngine, SamplingParams

logger = logging.getLogger(__name__)


class _PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer over a preallocated [batch, heads, capacity, head_dim] buffer.

    ``keys``/``values`` are views of the filled columns, so HF code that reads
    them sees an ordinary cache; ``update`` writes new columns in place.
    """

    def __init__(self, batch: int, heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
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
        self._k[:, :, self.length:end].copy_(key_states)
        self._v[:, :, self.length:end].copy_(value_states)
        self.length = end
        self._sync_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def write_prefill(self, rows: slice, cols: slice, keys: torch.Tensor, values: torch.Tensor) -> None:
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


def _sample(logits: torch.Tensor, params: SamplingParams,
            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
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
            ``attention_mask``, ``position_ids``, ``past_key_values``, ``logits_to_keep``).
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
    """

    def __init__(self, model, pad_token_id: int, eos_token_ids: Sequence[int] = (),
                 device: str | torch.device = "cpu", prefill_chunk: int | None = None,
                 tokenizer=None, max_context: int | None = None, pad_tolerance: float = 0.1,
                 compact_fraction: float = 0.1):
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be a positive token count or None, got {prefill_chunk}")
        if not 0.0 <= pad_tolerance < 1.0:
            raise ValueError(f"pad_tolerance must be in [0, 1), got {pad_tolerance}")
        if not 0.0 <= compact_fraction <= 1.0:
            raise ValueError(f"compact_fraction must be in [0, 1], got {compact_fraction}")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.prefill_chunk = prefill_chunk
        self.tokenizer = tokenizer
        self.pad_tolerance = pad_tolerance
        self.compact_fraction = compact_fraction
        window = max_context or getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if not window or window < 2:
            raise ValueError(f"need a model window of at least 2 tokens, got {window}: check the config's "
                             "max_position_embeddings or pass max_context=")
        self._max_context = int(window)
        self._preallocate = _full_attention_only(model)

    @property
    def max_context(self) -> int:
        return self._max_context

    def load_state_dict(self, state_dict: dict) -> None:
        """Copy weights into the model's existing tensors (no re-allocation)."""
        own = self.model.state_dict()
        unknown = sorted(set(state_dict) - set(own))
        missing = sorted(set(own) - set(state_dict) - self._tied_names())
        reshaped = sorted(k for k in set(state_dict) & set(own) if state_dict[k].shape != own[k].shape)
        if unknown or missing or reshaped:
            raise KeyError(f"state_dict does not match the rollout model: unknown keys {unknown[:5]}, "
                           f"missing keys {missing[:5]}, wrong shapes {reshaped[:5]}")
        with torch.no_grad():
            for name, tensor in state_dict.items():
                own[name].copy_(tensor)

    def _tied_names(self) -> set[str]:
        tied = getattr(self.model, "_tied_weights_keys", None) or {}
        return set(tied) if self.model.config.get_text_config().tie_word_embeddings else set()

    # ---------------------------------------------------------------- generate

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seed: int | None = None) -> list[Generation]:
        """Sample one reply per prompt (order kept).  The same seed, prompts and engine
        settings give the same replies; a row's sample also depends on the rest of the batch."""
        self._check(prompts, params)
        if not prompts:
            return []
        window = self._max_context
        kept = [list(p[-(window - 1):]) if len(p) > window - 1 else list(p) for p in prompts]
        truncated = [len(p) - len(k) for p, k in zip(prompts, kept)]
        if any(truncated):
            logger.warning("%d of %d prompts were longer than the model window (%d) minus one and were "
                           "truncated from the left", sum(t > 0 for t in truncated), len(prompts), window)
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
        finally:
            self.model.train(was_training)

        out: list[Generation | None] = [None] * len(prompts)
        tok_rows, lp_rows = tokens.tolist(), logprobs.tolist()
        for i, src in enumerate(order):
            n = n_out[i]
            reason = "stop" if stopped[i] else (
                "length" if n == params.max_new_tokens else "context")
            out[src] = self._wrap(tok_rows[i][:n], lp_rows[i][:n], reason, len(kept[src]), truncated[src])
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
            raise ValueError("SamplingParams.stop_strings needs a tokenizer: pass tokenizer= to HFRolloutEngine")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)")

    @staticmethod
    def _wrap(token_ids, logprobs, reason, prompt_len, n_truncated) -> Generation:
        meta = {"prompt_tokens": prompt_len, "truncated_prompt_tokens": n_truncated}
        if n_truncated:
            meta["warning"] = f"prompt truncated from the left by {n_truncated} tokens to fit the model window"
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

        cache, logits = self._prefill(prompts, longest + steps)  # logits [B, V]
        # Columns: [0, longest) prompts right-aligned, then one column per decode step.
        attn = torch.ones(batch, longest + steps, dtype=torch.long, device=dev)
        attn[:, :longest] = torch.arange(longest, device=dev) >= (longest - lengths)[:, None]

        stop_ids = torch.tensor(sorted(set(params.stop_token_ids) | set(self.eos_token_ids)),
                                dtype=torch.long, device=dev)
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
                hit_stop[rows] |= self._stop_string_hits(tokens[live[rows], : step + 1], params.stop_strings)
            done = active & (hit_stop | (budget[live] <= step + 1))
            if bool(done.any()):
                n_out[live[done]], stopped[live[done]] = step + 1, hit_stop[done]
                active &= ~done
                n_active = int(active.sum())
                if n_active == 0:
                    break
                if len(live) - n_active >= self.compact_fraction * len(live):
                    keep = active.nonzero().squeeze(-1)
                    live, tok, attn, active = live[keep], tok[keep], attn[keep], active[keep]
                    cache.batch_select_indices(keep)
                    # Left columns that are padding for every remaining row: cut from cache and mask.
                    cut = int(longest - lengths[live].max()) - first_col
                    if cut > 0 and self._preallocate:
                        for layer in cache.layers:
                            layer.drop_left(cut)
                        attn, first_col = attn[:, cut:], first_col + cut
            kv_len = longest + step + 1 - first_col
            # Clamped so finished rows still in the batch never index past the window.
            positions = (lengths[live] + step).clamp(max=self._max_context - 1)[:, None]
            out = self.model(input_ids=tok[:, None], attention_mask=attn[:, :kv_len], position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1].float()
        return tokens, logprobs, n_out.tolist(), stopped.tolist(), order

    def _stop_string_hits(self, generated: torch.Tensor, stop_strings: Sequence[str]) -> torch.Tensor:
        """[b] bool: does the decoded tail of each live row contain a stop string?

        A stop string of c characters spans at most c tokens when every token decodes
        to at least one character, so the last (longest + 1) tokens are decoded.
        """
        tail = max(len(s) for s in stop_strings) + 1
        texts = self.tokenizer.batch_decode(generated[:, -tail:].tolist(), skip_special_tokens=False)
        return torch.tensor([any(s in t for s in stop_strings) for t in texts],
                            dtype=torch.bool, device=generated.device)

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
            rows_per_forward = max(1, (self.prefill_chunk or width * len(unique)) // width)
            for u0 in range(0, len(unique), rows_per_forward):
                u1 = min(u0 + rows_per_forward, len(unique))
                ids, mask = self._left_pad(unique[u0:u1], width)
                part = DynamicCache(config=self.model.config)
                part_logits = self._forward_chunked(ids, mask, part)  # [u, V]
                sel = ((inverse_t >= u0) & (inverse_t < u1)).nonzero().squeeze(-1)
                rows = slice(start + int(sel[0]), start + int(sel[-1]) + 1)
                src = inverse_t[sel] - u0
                if cache is None:
                    cache = self._allocate(part, len(prompts), capacity)
                    logits = part_logits.new_empty(len(prompts), part_logits.shape[-1])
                for layer, filled in zip(cache.layers, part.layers):
                    layer.write_prefill(rows, slice(longest - width, longest),
                                        filled.keys.index_select(0, src), filled.values.index_select(0, src))
                logits[rows] = part_logits.index_select(0, src)
        for layer in cache.layers:
            layer.length = longest
            layer._sync_views()
        return cache, logits

    def _allocate(self, like: DynamicCache, batch: int, capacity: int) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        cache.layers = [
            _PreallocatedLayer(batch, layer.keys.shape[1], capacity, layer.keys.shape[3],
                               layer.keys.dtype, layer.keys.device)
            for layer in like.layers
        ]
        return cache

    def _left_pad(self, prompts: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    def _forward_chunked(self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Prefill [b, L] into ``cache``, at most ``prefill_chunk`` tokens per forward; last logits [b, V]."""
        width = ids.shape[1]
        cols = width if self.prefill_chunk is None else max(1, self.prefill_chunk // ids.shape[0])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [b, L]
        for c0 in range(0, width, cols):
            c1 = min(c0 + cols, width)
            out = self.model(input_ids=ids[:, c0:c1], attention_mask=mask[:, :c1],
                             position_ids=positions[:, c0:c1], past_key_values=cache,
                             use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float()
