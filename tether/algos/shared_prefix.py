"""Per-token log-probs (and entropy) of a batch whose rows share prompts, computing
each shared prefix once.

A GRPO group is G samples of one prompt: in a batch of 8 prompts x 16 samples,
the 16 rows of a group start with the same ~100-token prompt, and a plain forward
runs that prompt 16 times.  Here the rows of a micro-batch are split by
``group_index``; each group's longest common prefix P_g (at least one token shorter
than its shortest row) is run once, its keys/values are expanded to the group's
rows (``index_select``, differentiable), and only each row's remaining tokens run
on top of them.  The backward pass sums the rows' gradients into the one prefix
activation, which is exactly the gradient of the plain forward: the same math on
fewer token positions.

Layout (B rows, right-padded to T, lengths L_b, group g(b), prefix lengths P_g,
Pmax = max P_g):
- prefix forward: [G, Pmax], each group's prefix right-aligned (left-padded,
  masked, positions counted from its first real token, as the rollout engine's
  prefill does);
- suffix forward: [B, S] with S = max_b (L_b - P_g(b)), row b holding tokens
  P_g(b) .. L_b - 1, right-padded, positions P_g(b) + 0..S-1, attending to its
  group's prefix columns and to its own earlier suffix columns;
- the distribution that predicts token t of row b is prefix column
  t - 1 + Pmax - P_g(b) (t <= P_g(b)) or suffix column t - 1 - P_g(b) (t > P_g(b)).

Outputs match ``batch.token_logprobs`` at every position t < L_b; padding
positions (t >= L_b, which every loss masks out) hold 0.
"""

from __future__ import annotations

import torch

from .vocab import DEFAULT_CHUNK_TOKENS, chunked_logprobs, model_states, with_cache

Tensor = torch.Tensor


def group_prefix_lengths(
    input_ids: Tensor, attention_mask: Tensor, group_index: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(inverse [B]: each row's group 0..G-1, first_row [G], prefix_len [G]).

    A group's prefix is the longest run of leading tokens every row of the group
    shares, capped one token below the group's shortest row (so each row keeps at
    least one token for the suffix forward)."""
    _, inverse = torch.unique(group_index, return_inverse=True)  # [B]
    n_groups = int(inverse.max()) + 1
    rows = torch.arange(len(inverse))
    # First row of each group: the smallest row index with that inverse label.
    first_row = torch.full((n_groups,), len(inverse), dtype=torch.long).scatter_reduce(
        0, inverse, rows, reduce="amin"
    )  # [G]
    lengths = attention_mask.sum(-1)  # [B]
    same = (input_ids == input_ids[first_row[inverse]]) & attention_mask.bool()  # [B, T]
    common = same.long().cumprod(-1).sum(-1)  # [B] leading matches
    cap = torch.minimum(common, lengths - 1)  # [B]
    prefix_len = torch.full((n_groups,), input_ids.shape[1], dtype=torch.long).scatter_reduce(
        0, inverse, cap, reduce="amin"
    )  # [G]
    return inverse, first_row, prefix_len


def shared_prefix_saving(attention_mask: Tensor, inverse: Tensor, prefix_len: Tensor) -> float:
    """Token positions of the two forwards as a fraction of the plain [B, T] forward."""
    lengths = attention_mask.sum(-1)
    suffix = int((lengths - prefix_len[inverse]).max())
    shared = len(prefix_len) * int(prefix_len.max()) + len(lengths) * suffix
    return shared / float(attention_mask.shape[0] * attention_mask.shape[1])


def _left_aligned_prefixes(
    input_ids: Tensor, first_row: Tensor, prefix_len: Tensor, pad_id: int
) -> tuple[Tensor, Tensor]:
    """[G, Pmax] ids and mask: group g's first P_g tokens right-aligned, left-padded."""
    width = int(prefix_len.max())
    cols = torch.arange(width, device=input_ids.device)  # [Pmax]
    src = cols[None, :] - (width - prefix_len)[:, None]  # [G, Pmax]
    valid = src >= 0
    ids = input_ids[first_row].gather(1, src.clamp(min=0))
    return ids.masked_fill(~valid, pad_id), valid.long()


def shared_prefix_token_logprobs(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    group_index: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    pad_id: int = 0,
    prefixes: tuple[Tensor, Tensor, Tensor] | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    where: Tensor | None = None,
):
    """``token_logprobs`` of right-padded rows [B, T], each group's common prefix run once;
    the vocabulary computations ``chunk_tokens`` positions at a time (`vocab.chunked_logprobs`),
    with ``where`` [B, T] (bool) only at the positions it marks (a prefix column where
    any of its group's rows does).

    Returns (log-probs [B, T], entropy [B, T] or None), 0 at position 0, at padding and
    (``where``) at the positions not read."""
    # Imported here: transformers' cache module pulls in DTensor (~0.5 s), which processes
    # that only import the update code (a sweep's trial loop) never need.
    from transformers.cache_utils import DynamicCache

    device = input_ids.device
    inverse, first_row, prefix_len = prefixes or group_prefix_lengths(
        input_ids.cpu(), attention_mask.cpu(), group_index.cpu()
    )
    inverse, first_row, prefix_len = inverse.to(device), first_row.to(device), prefix_len.to(device)
    batch, width = input_ids.shape
    lengths = attention_mask.sum(-1)  # [B]
    row_prefix = prefix_len[inverse]  # [B]
    p_max = int(prefix_len.max())

    # 1. Each group's prefix once.
    prefix_ids, prefix_mask = _left_aligned_prefixes(input_ids, first_row, prefix_len, pad_id)
    prefix_pos = (prefix_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    prefix_states, head = model_states(
        model,
        input_ids=prefix_ids,
        attention_mask=prefix_mask,
        position_ids=prefix_pos,
        **with_cache(model, cache),
        use_cache=True,
    )  # [G, Pmax, H] (or logits [G, Pmax, V], head None)
    for layer in cache.layers:  # expand K/V to the rows; gradients flow back into the prefix
        layer.keys = layer.keys.index_select(0, inverse)
        layer.values = layer.values.index_select(0, inverse)

    # 2. Every row's remaining tokens on top of its group's prefix.
    suffix_width = int((lengths - row_prefix).max())
    cols = row_prefix[:, None] + torch.arange(suffix_width, device=device)  # [B, S]
    suffix_valid = cols < lengths[:, None]
    suffix_ids = input_ids.gather(1, cols.clamp(max=width - 1)).masked_fill(~suffix_valid, pad_id)
    mask = torch.cat([prefix_mask.index_select(0, inverse), suffix_valid.long()], dim=1)
    suffix_states, _ = model_states(
        model,
        input_ids=suffix_ids,
        attention_mask=mask,
        position_ids=cols,
        **with_cache(model, cache),
        use_cache=True,
    )  # [B, S, H]

    # 3. Each token's log-prob from the column whose distribution predicts it: prefix
    # columns < Pmax-1 predict the prefix's next token, its last column each row's first
    # suffix token, suffix column s (< S-1) the row's suffix token s+1.
    def scored(states, targets, read=None):
        return chunked_logprobs(
            states, targets, head, temperature, with_entropy, chunk_tokens, where=read
        )

    read_prefix = read_suffix = None
    if where is not None:  # each column's predicted token, in its rows' positions
        src = torch.arange(1, p_max, device=device)[None, :] - (p_max - row_prefix)[:, None]
        rows_read = where.gather(1, src.clamp(0, width - 1)) & (src >= 1)  # [B, Pmax-1]
        read_prefix = torch.zeros(len(prefix_len), p_max - 1, dtype=torch.long, device=device)
        read_prefix = read_prefix.index_add_(0, inverse, rows_read.long()) > 0  # [G, Pmax-1]
        read_suffix = where.gather(1, cols[:, 1:].clamp(max=width - 1)) & suffix_valid[:, 1:]
    picked_prefix, prefix_ent = scored(
        prefix_states[:, :-1], prefix_ids[:, 1:], read_prefix
    )  # [G, Pmax-1]
    first_suffix, first_ent = scored(
        prefix_states[:, -1].index_select(0, inverse), suffix_ids[:, 0]
    )  # [B]
    picked_suffix, suffix_ent = scored(
        suffix_states[:, :-1], suffix_ids[:, 1:], read_suffix
    )  # [B, S-1]
    first_suffix = first_suffix[:, None]  # [B, 1]
    per_row = torch.cat([picked_prefix.index_select(0, inverse), first_suffix, picked_suffix], 1)
    # Position t of row b <- column t - 1 + Pmax - P_b of per_row; t = 0 and padding get 0.
    t = torch.arange(width, device=device)
    source = t[None, :] - 1 + p_max - row_prefix[:, None]  # [B, T]
    real = (t[None, :] >= 1) & (t[None, :] < lengths[:, None])
    if where is not None:  # a prefix column read for one row of its group, not for all
        real = real & where
    source = source.clamp(0, per_row.shape[1] - 1)
    logprobs = torch.where(real, per_row.gather(1, source), 0.0)
    if not with_entropy:
        return logprobs, None
    ent_row = torch.cat(
        [prefix_ent.index_select(0, inverse), first_ent[:, None], suffix_ent], 1
    )  # [B, Pmax+S-1]
    return logprobs, torch.where(real, ent_row.gather(1, source), 0.0)
