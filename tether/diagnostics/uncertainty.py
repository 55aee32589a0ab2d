"""Uncertainty of the MI proxies, from the cross-score matrix already computed.

Two things are reported beside every proxy of `tether.diagnostics.mi` at every
diagnostic point, and neither calls the model again:

- **a bootstrap interval** (percentile, ``confidence``, 95 % by default; widened where
  needed so it holds the estimate).  Pairs are
  resampled *by prompt* (a cluster bootstrap: draw the N distinct prompts with
  replacement and take all of each drawn prompt's pairs), because the pairs of one
  prompt are correlated (in ``first_turn`` sampling a whole group shares its prompt).
  A resample re-weights the pairs, and a pair's marginal and retrieval are
  recomputed over the *drawn* prompts (a prompt drawn twice weighs twice in the
  mixture), so the interval carries the variation from which prompts a batch holds as
  well as from which replies.  With a single distinct prompt the pairs are resampled
  one by one.
- **a permutation test of "reasoning depends on the input"**.  Under the null
  hypothesis the reasoning is exchangeable across prompts, so which column a row
  belongs to carries no information: the column labels are permuted across rows
  (keeping how many pairs each prompt has), the statistic recomputed, and
  ``p = (1 + #{null >= observed}) / (1 + permutations)``.  The marginal of a row does
  not depend on its label, so under a permutation only the matched scores move:
  the tests of ``mi_estimate``, ``mi_zscore`` and ``mi_zscore_ema`` are one test
  (``p_grounded``); ``mi_seq_estimate`` (sequence scores) and ``retrieval_acc`` have
  their own.  ``{K}_null_q95`` is the null's 95th percentile: the level a curve has
  to clear to count as grounded.

Keys added to the proxies (``K`` a proxy name):
``K_ci_low``/``K_ci_high`` for `CI_KEYS`, ``K_null_q95`` for `NULL_KEYS`,
``p_grounded``, ``mi_seq_estimate_p_grounded``, ``retrieval_acc_p_grounded`` and
``grounded`` (1.0 when ``p_grounded < alpha``).

    >>> import numpy as np
    >>> column = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    >>> L = np.where(np.eye(2)[column] > 0, np.log(0.9), np.log(0.1))   # each reads its prompt
    >>> out = mi_uncertainty(L, 3 * L, column, None, Uncertainty(permutations=500))
    >>> bool(out["p_grounded"] < 0.05), out["retrieval_acc_ci_low"]
    (True, 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

# Denominator guard of the z-scores: std(marginal) + ZSCORE_EPS (the paper's 1e-3).
ZSCORE_EPS = 1e-3

#: Proxies that get a bootstrap interval (need >= 2 distinct prompts unless an entropy).
CI_KEYS = (
    "mi_estimate",
    "mi_seq_estimate",
    "mi_zscore",
    "mi_zscore_ema",
    "retrieval_acc",
    "conditional_entropy_est",
    "reasoning_entropy_est",
    "conditional_entropy_seq_est",
    "reasoning_entropy_seq_est",
)
#: Proxies that get a permutation null (``K_null_q95``).
NULL_KEYS = ("mi_estimate", "mi_seq_estimate", "mi_zscore", "mi_zscore_ema", "retrieval_acc")
_ENTROPY_KEYS = CI_KEYS[5:]


@dataclass(frozen=True)
class Uncertainty:
    """How many resamples, at what confidence, and the significance level of the test."""

    bootstrap: int = 1000
    permutations: int = 1000
    confidence: float = 0.95
    alpha: float = 0.05


def _row_quantities(L: np.ndarray, S: np.ndarray, column: np.ndarray) -> dict[str, np.ndarray]:
    m, n = L.shape
    rows = np.arange(m)
    marginal = logsumexp(L, axis=1) - np.log(n)
    marginal_seq = logsumexp(S, axis=1) - np.log(n)
    return {
        "matched": L[rows, column],
        "marginal": marginal,
        "matched_seq": S[rows, column],
        "marginal_seq": marginal_seq,
        "hit": hit_rate(L, L[rows, column]),
    }


def tie_split_hit(greater, equal, k: int = 1):
    """P(a score ranks in the top k) given how many scores beat it and how many tie with
    it (itself included), ties broken uniformly at random."""
    return np.clip((k - greater) / np.maximum(equal, 1), 0.0, 1.0)


def hit_rate(L: np.ndarray, own: np.ndarray, k: int = 1) -> np.ndarray:
    """P(own score ranks in the top k among the row's N scores), ties split evenly.
    ``own`` is [M] or [B, M] (L broadcast against it); the result has its shape."""
    return tie_split_hit((L > own[..., None]).sum(axis=-1), (L == own[..., None]).sum(axis=-1), k)


def _mixture_marginal(X: np.ndarray, draws: np.ndarray, needed: np.ndarray) -> np.ndarray:
    """log( sum_j draws[b, j] exp(X[i, j]) / N ) for every resample b and row i: [B, M].

    One matmul against exp(X - row max).  Where that underflows (every drawn prompt more
    than ~745 nats below the row's best) and the row counts (``needed`` [B, M]), the
    cell is recomputed exactly in log space."""
    n = X.shape[1]
    top = X.max(axis=1)  # [M]
    with np.errstate(divide="ignore"):
        out = np.log(draws @ np.exp(X - top[:, None]).T) + top[None, :] - np.log(n)
    b, i = np.nonzero(~np.isfinite(out) & needed)
    if len(b):
        log_w = np.where(draws[b] > 0, np.log(np.maximum(draws[b], 1)), -np.inf)  # [K, N]
        out[b, i] = logsumexp(X[i] + log_w, axis=1) - np.log(n)
    return out


def _resampled_columns(
    L: np.ndarray, S: np.ndarray, column: np.ndarray, draws: np.ndarray, weights: np.ndarray
) -> dict[str, np.ndarray]:
    """Row quantities under resampled prompts ``draws`` [B, N] (how often each prompt was
    drawn; ``weights`` [B, M] the rows' resulting weights): a row's marginal is the
    mixture over the drawn prompts, and its retrieval asks whether its own prompt beats
    every *drawn* other.  So the interval also carries the variation that comes from
    which prompts a batch happens to hold."""
    rows = np.arange(L.shape[0])
    own = L[rows, column]  # [M]
    present = (draws > 0).astype(np.float64)  # [B, N]
    greater = present @ (L > own[:, None]).T.astype(np.float64)  # [B, M]
    equal = present @ (L == own[:, None]).T.astype(np.float64)
    needed = weights > 0
    return {
        "matched": own,
        "matched_seq": S[rows, column],
        "marginal": _mixture_marginal(L, draws, needed),
        "marginal_seq": _mixture_marginal(S, draws, needed),
        "hit": tie_split_hit(greater, equal),
    }


def _statistics(
    q: dict[str, np.ndarray], weights: np.ndarray, sigma_ema: float | None
) -> dict[str, np.ndarray]:
    """Every proxy under row weights [B, M] (a bootstrap resample per row of weights)."""
    total = weights.sum(axis=1)

    def mean(values: np.ndarray) -> np.ndarray:  # values [M], or [B, M] per resample
        if values.ndim == 2:  # rows of weight 0 may hold -inf marginals: never multiplied
            return (weights * np.where(weights > 0, values, 0.0)).sum(axis=1) / total
        return weights @ values / total

    marginal_mean = mean(q["marginal"])
    sigma = np.sqrt(np.maximum(mean(q["marginal"] ** 2) - marginal_mean**2, 0.0))
    gap = mean(q["matched"]) - marginal_mean
    out = {
        "mi_estimate": gap,
        "mi_seq_estimate": mean(q["matched_seq"]) - mean(q["marginal_seq"]),
        "mi_zscore": gap / (sigma + ZSCORE_EPS),
        "retrieval_acc": mean(q["hit"]),
        "conditional_entropy_est": -mean(q["matched"]),
        "reasoning_entropy_est": -marginal_mean,
        "conditional_entropy_seq_est": -mean(q["matched_seq"]),
        "reasoning_entropy_seq_est": -mean(q["marginal_seq"]),
    }
    if sigma_ema is not None:
        out["mi_zscore_ema"] = gap / (sigma_ema + ZSCORE_EPS)
    return out


def _p_value(null: np.ndarray, observed: float) -> float:
    # A tolerance, so a null statistic equal to the observed one up to rounding counts.
    reached = int((null >= observed - 1e-9 * max(1.0, abs(observed))).sum())
    return (1 + reached) / (1 + len(null))


def mi_uncertainty(
    L: np.ndarray,
    S: np.ndarray,
    column: np.ndarray,
    sigma_ema: float | None,
    settings: Uncertainty,
    rng: np.random.Generator | None = None,
    estimates: dict[str, float] | None = None,
) -> dict[str, float]:
    """Intervals and the permutation test for the proxies of one [M, N] cross-score matrix.

    ``sigma_ema`` is the moving average of std(marginal) that ``mi_zscore_ema`` divides
    by at this point (held fixed: the interval is that of the numerator).  Keys that
    need two distinct prompts are absent with one; nothing is returned for M = 0.
    ``estimates`` are the point estimates the caller logs (``mi_proxies``): each interval
    is widened to hold exactly those; without them they are computed here.
    """
    rng = rng or np.random.default_rng(0)
    L, S = np.asarray(L, np.float64), np.asarray(S, np.float64)
    column = np.asarray(column, np.int64)
    m, n = L.shape
    if m == 0 or n == 0:
        return {}
    q = _row_quantities(L, S, column)
    multi = n >= 2
    out: dict[str, float] = {}

    if settings.bootstrap > 0:
        clusters, n_clusters = (column, n) if multi else (np.arange(m), m)
        draws = rng.multinomial(
            n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=settings.bootstrap
        )  # [B, clusters]
        weights = draws[:, clusters].astype(np.float64)  # [B, M]
        resampled = (
            _resampled_columns(L, S, column, draws.astype(np.float64), weights) if multi else q
        )
        stats = _statistics(resampled, weights, sigma_ema if multi else None)
        point = estimates or {
            key: float(values[0])
            for key, values in _statistics(q, np.ones((1, m)), sigma_ema if multi else None).items()
        }
        tail = (1.0 - settings.confidence) / 2.0
        for key in CI_KEYS if multi else _ENTROPY_KEYS:
            if key in stats:
                # The percentile interval, widened where needed to hold the estimate: a
                # resample holds fewer distinct prompts than the batch (a drawn prompt
                # repeats), which shifts retrieval up and MI down.  (Re-centring it on the
                # estimate instead made the alarms fire on noise: benchmarks/history/2026-11-23.md.)
                low, high = np.quantile(stats[key], [tail, 1.0 - tail])
                estimate = float(point[key])
                out[f"{key}_ci_low"] = float(min(low, estimate))
                out[f"{key}_ci_high"] = float(max(high, estimate))

    if multi and settings.permutations > 0:
        order = rng.random((settings.permutations, m)).argsort(axis=1)
        labels = column[order]  # [P, M] permuted
        rows = np.arange(m)
        matched = L[rows, labels]  # [P, M]
        sigma = float(q["marginal"].std())
        null = {
            "mi_estimate": matched.mean(1) - q["marginal"].mean(),
            "mi_seq_estimate": S[rows, labels].mean(1) - q["marginal_seq"].mean(),
            "retrieval_acc": hit_rate(L[None], matched).mean(1),
        }
        null["mi_zscore"] = null["mi_estimate"] / (sigma + ZSCORE_EPS)
        if sigma_ema is not None:
            null["mi_zscore_ema"] = null["mi_estimate"] / (sigma_ema + ZSCORE_EPS)
        for key in NULL_KEYS:
            if key in null:
                out[f"{key}_null_q95"] = float(np.quantile(null[key], 0.95))
        observed_mi = float(q["matched"].mean() - q["marginal"].mean())
        out["p_grounded"] = _p_value(null["mi_estimate"], observed_mi)
        out["mi_seq_estimate_p_grounded"] = _p_value(
            null["mi_seq_estimate"], float(q["matched_seq"].mean() - q["marginal_seq"].mean())
        )
        out["retrieval_acc_p_grounded"] = _p_value(null["retrieval_acc"], float(q["hit"].mean()))
        out["grounded"] = float(out["p_grounded"] < settings.alpha)
    return out
