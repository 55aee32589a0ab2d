"""Mutual-information proxies from an in-batch cross-score matrix (docs/methods.md,
section 2).

Given M (prompt, reasoning) pairs whose distinct prompts are the columns
j = 1..N, and the cross-scores

    S[i, j] = sum of token log-probs of reasoning z_i given prompt x_j
    L[i, j] = S[i, j] / len(z_i)

`mi_proxies` returns the paper's estimators of I(X;Z), H(Z|X), H(Z) and the
retrieval accuracies: each proxy's point estimate is its declared statistic
(`tether.diagnostics.proxies`) at unit weights, and the top-k retrieval and chance levels
are logged beside them. Everything here is numpy; the scores come from
`tether.diagnostics.crossscore`.

    >>> import numpy as np
    >>> L = np.log(np.array([[0.9, 0.1], [0.1, 0.9]]))
    >>> metrics, ema = mi_proxies(L, L, np.array([0, 1]))
    >>> round(metrics["retrieval_acc"], 3)
    1.0
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from tether.diagnostics.proxies import BY_NAME, MULTI_PROMPT_KEYS, point_estimates
from tether.diagnostics.uncertainty import Uncertainty, hit_rate, mi_uncertainty, row_quantities

# Decay of the exponential moving average of std(marginal) used by `mi_zscore_ema`.
SIGMA_EMA_DECAY = 0.9
# The k of `retrieval_acc@k`.
RETRIEVAL_KS = (2, 4, 8)

#: What `mi_proxies` logs beside the proxies (`tether.diagnostics.proxies`) when there are
#: two distinct prompts: MI's ceiling log N, retrieval's chance and the top-k retrieval, and
#: the moving average of std(marginal).
COMPANION_KEYS = (
    "mi_upper_bound",
    "retrieval_chance",
    "retrieval_above_chance",
    *(f"retrieval_acc@{k}" for k in RETRIEVAL_KS),
    *(f"retrieval_chance@{k}" for k in RETRIEVAL_KS),
    "marginal_std_ema",
)
# Metric keys that need at least two columns (distinct prompts). With one column
# mutual information is undefined, so these are absent rather than NaN.
MULTI_COLUMN_KEYS = (*MULTI_PROMPT_KEYS, *COMPANION_KEYS)


def prompt_columns(prompts: Sequence[Sequence[Hashable]]) -> tuple[np.ndarray, list[tuple]]:
    """Map each pair's prompt (token ids) to a column; identical prompts share one.

    Returns ``(column[M], distinct)`` where ``distinct[column[i]] == tuple(prompts[i])``
    and the columns are numbered in order of first appearance.
    """
    index: dict[tuple, int] = {}
    column = np.empty(len(prompts), dtype=np.int64)
    for i, prompt in enumerate(prompts):
        column[i] = index.setdefault(tuple(prompt), len(index))
    return column, list(index)


def valid_reasoning_rate(reasonings: Sequence[Sequence[Any]]) -> float | None:
    """Share of pairs whose reasoning is non-empty (``None`` when there are no pairs)."""
    if len(reasonings) == 0:
        return None
    return sum(1 for z in reasonings if len(z) > 0) / len(reasonings)


def _topk_hit_rate(scores: np.ndarray, column: np.ndarray, k: int) -> np.ndarray:
    """Per pair, the probability that its own column is in the top k, ties broken
    uniformly at random (so a constant row scores k/N, not a column-0 bias)."""
    return hit_rate(scores, scores[np.arange(len(column)), column], k)


def mi_proxies(
    L: np.ndarray,
    S: np.ndarray,
    column: np.ndarray,
    ema_state: dict | None = None,
    uncertainty: Uncertainty | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[dict[str, float], dict | None]:
    """The MI proxies (docs/methods.md, section 2) from per-token (`L`) and sequence (`S`)
    cross-scores.

    Args:
        L: [M, N] per-token log-prob of reasoning i under prompt j.
        S: [M, N] summed log-prob of reasoning i under prompt j.
        column: [M] index of pair i's own prompt among the N columns.
        ema_state: the state returned by the previous call (``None`` on the first),
            carrying the moving average of std(marginal) for ``mi_zscore_ema``.
        uncertainty: with it, each proxy also gets an interval (jackknife or bootstrap) and the
            permutation test of input dependence (`tether.diagnostics.uncertainty`),
            drawn from ``rng``; the matrices are reused, no model is called.

    Returns:
        ``(metrics, new_ema_state)``. ``metrics`` always holds ``num_pairs`` and
        ``num_prompts``; the proxies declared for one prompt (``ONE_PROMPT_KEYS`` of
        `tether.diagnostics.proxies`, the entropies) need one pair; the keys in
        ``MULTI_COLUMN_KEYS`` need two distinct prompts and are absent otherwise
        (never NaN). The EMA state advances only when ``mi_zscore_ema`` is computed.
    """
    L = np.asarray(L, dtype=np.float64)
    S = np.asarray(S, dtype=np.float64)
    column = np.asarray(column, dtype=np.int64)
    if L.ndim != 2 or L.shape != S.shape:
        raise ValueError(f"L and S must be 2-D of equal shape, got {L.shape} and {S.shape}")
    m, n = L.shape
    if column.shape != (m,):
        raise ValueError(f"column must have shape ({m},), got {column.shape}")
    if m and (column.min() < 0 or column.max() >= n):
        raise ValueError(
            f"column indices must lie in [0, {n}), got range [{column.min()}, {column.max()}]"
        )
    if not (np.isfinite(L).all() and np.isfinite(S).all()):
        raise ValueError("cross-score matrices contain non-finite values")

    metrics: dict[str, float] = {"num_pairs": float(m), "num_prompts": float(n)}
    if m == 0 or n == 0:
        return metrics, ema_state

    rows = row_quantities(L, S, column)
    metrics.update(point_estimates(rows, n, None))
    if n < 2:
        if uncertainty is not None:
            metrics.update(mi_uncertainty(L, S, column, None, uncertainty, rng, metrics))
        return metrics, ema_state

    sigma = metrics["marginal_std"]
    if ema_state is None or "sigma" not in ema_state:
        sigma_ema, updates = sigma, 1
    else:
        sigma_ema = SIGMA_EMA_DECAY * float(ema_state["sigma"]) + (1.0 - SIGMA_EMA_DECAY) * sigma
        updates = int(ema_state.get("updates", 0)) + 1
    metrics["marginal_std_ema"] = sigma_ema
    metrics.update(point_estimates(rows, n, sigma_ema))  # with the proxies over the average
    metrics["mi_upper_bound"] = float(BY_NAME["mi_estimate"].ceiling(n))

    # Chance of retrieval: a guesser drawing columns by their frequency in the batch.
    counts = np.bincount(column, minlength=n)  # [N]
    chance = float((counts[column] / m).mean())
    metrics["retrieval_chance"] = chance
    metrics["retrieval_above_chance"] = metrics["retrieval_acc"] - chance
    for k in RETRIEVAL_KS:
        metrics[f"retrieval_acc@{k}"] = float(_topk_hit_rate(L, column, k).mean())
        metrics[f"retrieval_chance@{k}"] = min(1.0, k * chance)
    if uncertainty is not None:
        metrics.update(mi_uncertainty(L, S, column, sigma_ema, uncertainty, rng, metrics))
    return metrics, {"sigma": sigma_ema, "updates": updates}


def mi_by_column(L: np.ndarray, column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt's share of ``mi_estimate``: per column j, the mean over the pairs of
    prompt j of matched_i − marginal_i (the pointwise MI of its reasoning, nats/token),
    and the number of those pairs -> ``(mi [N], pairs [N])``.  ``mi_estimate`` is their
    pair-weighted mean, Σ_j pairs_j · mi_j / M.  A column without pairs gets NaN.  The
    prompt-level reward-variance quartiles of finding d read these (docs/methods.md,
    section 13)."""
    L = np.asarray(L, dtype=np.float64)
    column = np.asarray(column, dtype=np.int64)
    n = L.shape[1]
    rows = row_quantities(L, L, column)
    pairs = np.bincount(column, minlength=n).astype(np.float64)  # [N]
    total = np.bincount(column, weights=rows["matched"] - rows["marginal"], minlength=n)  # [N]
    with np.errstate(invalid="ignore", divide="ignore"):
        mi = np.where(pairs > 0, total / np.maximum(pairs, 1.0), np.nan)
    return mi, pairs


def prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """``{f"{prefix}/{key}": value}`` — e.g. prefix ``collapse/first_turn``."""
    return {f"{prefix}/{key}": value for key, value in metrics.items()}
