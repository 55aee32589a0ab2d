"""Which rows of a minibatch share a forward pass.

A micro-batch is right-padded to its longest row, and every padded position costs as
much as a real one.  Multi-turn episodes of one group end after 1 to 10 turns, so a
micro-batch of 16 rows cut in row order can run half its positions on padding.  The
update's loss carries the minibatch's denominator, so any partition of the minibatch's
rows gives the same summed gradient: the plan changes time, never the math.

Two plans, and the one that computes fewer token positions is used:

- **by group** (`group_ordered` rows cut every ``max_rows``): whole GRPO groups per
  micro-batch, each group's common prompt run once (`shared_prefix.py`); best when the
  groups' rows are about as long as each other (single-turn tasks);
- **by length** (`length_chunks`): rows sorted by length and cut where
  Σ (rows x longest + a call's overhead) is least; best for multi-turn episodes.

`forward_positions` counts what `update.micro_batch_logprobs` will run for a
micro-batch (its shared-prefix forward when that pays, else the plain one), so the
estimate and the forward use one rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .batch import TrajectoryBatch
from .shared_prefix import group_prefix_lengths, shared_prefix_saving

#: Use the shared-prefix forward when it runs at most this fraction of the plain
#: forward's token positions (below it, the two-forward overhead is not worth it).
SHARED_PREFIX_MAX_FRACTION = 0.8
#: Fixed cost of one model call, in padded-token equivalents.
CALL_OVERHEAD_TOKENS = 256


def length_chunks(
    lengths: Sequence[int], max_rows: int, overhead: int = CALL_OVERHEAD_TOKENS
) -> list[np.ndarray]:
    """Split rows (by index) into chunks of similar length.

    Sorted by length, the cut points minimise Σ_chunks (rows x longest + overhead)
    (dynamic programming), with at most ``max_rows`` per chunk: one long outlier no
    longer pads every short row to its length.
    """
    order = np.argsort(np.asarray(lengths), kind="stable")
    sorted_len = np.asarray(lengths)[order]
    m = len(order)
    best = np.full(m + 1, np.inf)
    best[0] = 0.0
    cut = np.zeros(m + 1, dtype=np.int64)
    for end in range(1, m + 1):  # chunk = sorted[start:end]
        for start in range(max(0, end - max_rows), end):
            cost = best[start] + (end - start) * int(sorted_len[end - 1]) + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    chunks, end = [], m
    while end > 0:
        chunks.append(order[cut[end] : end])
        end = cut[end]
    return chunks[::-1]


def group_ordered(rows: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """``rows`` reordered so each group's rows are adjacent (stable within a group)."""
    return rows[torch.argsort(group_index[rows], stable=True)]


def shared_prefix_plan(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, group_index: torch.Tensor
):
    """(the groups' prefixes (`group_prefix_lengths`), the fraction of the plain forward's
    positions the shared-prefix forward runs) of right-padded rows if that forward pays
    for them, else None."""
    if input_ids.shape[0] < 2:
        return None
    mask = attention_mask.cpu()
    prefixes = group_prefix_lengths(input_ids.cpu(), mask, group_index.cpu())
    if int(prefixes[2].min()) < 1:
        return None
    fraction = shared_prefix_saving(mask, prefixes[0], prefixes[2])
    return (prefixes, fraction) if fraction <= SHARED_PREFIX_MAX_FRACTION else None


def forward_positions(batch: TrajectoryBatch, rows: torch.Tensor, shared_prefix: bool) -> int:
    """Token positions the forward of ``rows`` computes, trimmed to their longest row,
    plus a call's overhead for each forward (the shared-prefix one makes two)."""
    mask = batch.attention_mask[rows]
    width = int(mask.sum(-1).max())
    plain = len(rows) * width
    if shared_prefix:
        plan = shared_prefix_plan(
            batch.input_ids[rows, :width], mask[:, :width], batch.group_index[rows]
        )
        if plan is not None:
            return int(plan[1] * plain) + 2 * CALL_OVERHEAD_TOKENS
    return plain + CALL_OVERHEAD_TOKENS


def plan_micro_batches(
    batch: TrajectoryBatch, rows: torch.Tensor, max_rows: int, shared_prefix: bool
) -> list[torch.Tensor]:
    """``rows`` cut into micro-batches of at most ``max_rows``: by group or by length,
    whichever computes fewer token positions (ties: by group)."""
    by_group = list(
        torch.split(group_ordered(rows, batch.group_index) if shared_prefix else rows, max_rows)
    )
    lengths = batch.attention_mask[rows].sum(-1).tolist()
    by_length = [rows[torch.as_tensor(c)] for c in length_chunks(lengths, max_rows)]

    def cost(plan: list[torch.Tensor]) -> int:
        return sum(forward_positions(batch, chunk, shared_prefix) for chunk in plan)

    return by_length if cost(by_length) < cost(by_group) else by_group
