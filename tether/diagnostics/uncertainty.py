"""Uncertainty of the MI proxies, from the cross-score matrix already computed.

Two things are reported beside every proxy of `tether.diagnostics.mi` at every
diagnostic point, and neither calls the model again:

- **an interval** (``confidence``, 95 % by default) of what the proxy estimates: the
  median of its distribution over batches of this shape from the same policy (the
  jackknife intervals are symmetric on a monotone map of the proxy, which carries a
  median across and not a mean; before 2026-11-28 the target was the mean, which rare
  batches carry for the z-score and sequence MI).  Three methods
  (``interval``), their coverage measured on known answers in
  benchmarks/interval_coverage.py (benchmarks/RESULTS.md, "Interval coverage"):

  - ``bootstrap``: pairs are resampled *by prompt* (a cluster bootstrap:
    draw the N distinct prompts with replacement and take all of each drawn prompt's
    pairs), because the pairs of one prompt are correlated (in ``first_turn`` sampling
    a whole group shares its prompt).  A resample re-weights the pairs, and a pair's
    marginal and retrieval are recomputed over the *drawn* prompts (a prompt drawn
    twice weighs twice in the mixture).  With a single distinct prompt the pairs are
    resampled one by one.  A resample holds fewer distinct prompts than the batch, so
    a resample's MI is biased low: the percentile interval is widened to hold the
    estimate, which then sits on its upper edge, and on the known answers it held
    MI's mean in 50-94 % of batches by policy, its median in 66-77 % over all of them.
  - ``jackknife``: leave out one prompt at a time (its pairs and its column: the
    marginals become mixtures over the other N - 1 prompts), the jackknife standard
    error, estimate ± t(N - 1) x SE, centred on the estimate.  It held MI's mean in
    90-98 % of batches on mixed and input-blind policies, 59 % on a grounded one at the
    ceiling log N, and H(Z|X)'s in 41-96 %: rare replies (a misread under the grounded
    policy, an off-template reply under the input-blind one: 1 % of the rows carry most
    of the mean, the batch estimates are skewed 1.3-5.0) that most batches lack, and
    which no resampling of one batch can see.  Their medians it held in 93-97 % (seed
    19), except sequence MI's at the probe's shape (88 %).
    Retrieval accuracy, an argmax whose delete-one variance is unreliable, keeps the
    bootstrap's interval.  With one distinct prompt the pairs are left out one by one
    (entropies only).
  - ``log_jackknife``: the same delete-one replicates, the Student-t interval taken on
    a log scale anchored at the bound each proxy has, and mapped back.  Each row's
    pointwise MI is at most log N (its own prompt is one of the N in its marginal), so
    MI and sequence MI go on log(log N - MI) (a replicate, with one prompt fewer,
    against log(N - 1)); the entropies, >= 0, on log H; a z-score's interval is the
    range of the quotients of its numerator's (MI's) interval and its denominator's
    (std(marginal), on its log scale, plus the 1e-3 guard).  Why it should cover where
    the linear interval does not: next to a bound the estimate's distance to it is a
    mean of small non-negative terms whose spread grows with their size (a few rows far
    from the ceiling carry it), so its sampling distribution is skewed and roughly
    log-normal; on the log scale it is near symmetric, and the interval mapped back is
    asymmetric the right way (at the ceiling it reaches further below the estimate, where
    the expectation lies, and never above log N; an entropy's never below 0).  Far from
    a bound the log scale is nearly linear and the interval the jackknife's.  Its cost:
    where one left-out prompt brings a replicate close to the bound, the log scale's
    spread is large and the side away from the bound very wide.  What it cannot see is
    the same as the jackknife's: rare replies that a batch does not hold.  A proxy whose
    estimate or a replicate lies outside its scale's domain keeps the linear interval.
    On the known answers (seed 19) it held the median of MI, the z-score, sequence MI
    and H(Z|X) in 93-98 % of batches at both the batch's and the probe's shape (their
    means in 82-98 %); with it the alarms met every target of their benchmark (seed 18):
    **the default** of the batch and of the probe since 2026-11-28.

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

Which proxy gets which interval, null and p-value is its declaration's
(`tether.diagnostics.proxies`); the statistics recomputed under resampling weights and
permutations are the declared ones.  Keys added to the proxies (``K`` a proxy name):
``K_ci_low``/``K_ci_high`` for `CI_KEYS`, ``K_null_q95`` for `NULL_KEYS`, each declared
``p_value`` key (``p_grounded``, ``mi_seq_estimate_p_grounded``,
``retrieval_acc_p_grounded``) and ``grounded`` (1.0 when ``p_grounded < alpha``).

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
from scipy.stats import t as student_t

from tether.diagnostics.proxies import (
    BOOTSTRAP,
    BY_NAME,
    LOG_CEILING,
    LOG_FLOOR,
    NULL_KEYS,
    PERMUTATION,
    PROXIES,
    QUOTIENT,
    ZSCORE_EPS,
    evaluate,
    point_estimates,
)

#: Relative rounding of a proxy's float64 sums over a batch (the p-value's tie tolerance and
#: the least half-width of a jackknife interval).
_RESOLUTION = 1e-9


@dataclass(frozen=True)
class Uncertainty:
    """How many resamples, at what confidence, and the significance level of the test."""

    bootstrap: int = 1000
    permutations: int = 1000
    confidence: float = 0.95
    alpha: float = 0.05
    #: ``log_jackknife`` (the jackknife on the log of each proxy's distance to its bound;
    #: the default), ``jackknife`` (delete one prompt, Student-t interval around the
    #: estimate) or ``bootstrap`` (the percentile interval by prompt, widened to hold the
    #: estimate)
    interval: str = "log_jackknife"


def row_quantities(L: np.ndarray, S: np.ndarray, column: np.ndarray) -> dict[str, np.ndarray]:
    """The rows the proxies are statistics of (`tether.diagnostics.proxies`): per pair, its
    matched score, its marginal (log mean over the N prompts), both on the sequence scores,
    and its retrieval hit (P(own prompt ranks first), ties split)."""
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


def _jackknife(
    L: np.ndarray, S: np.ndarray, column: np.ndarray, q: dict, sigma_ema: float | None
) -> dict[str, np.ndarray]:
    """Every proxy with one cluster left out: [K] values per key, K the clusters (the N
    distinct prompts; the M pairs when there is one prompt).  A prompt left out takes its
    pairs and its column with it: the marginals become mixtures over the N - 1 others."""
    m, n = L.shape
    if n < 2:  # one prompt: leave out one pair at a time (the entropies only)
        return evaluate(q, 1.0 - np.eye(m), n, None)
    kept = 1.0 - np.eye(n)  # [N, N]: the prompts each replicate keeps
    weights = kept[:, column]  # [N, M]
    replicate = _resampled_columns(L, S, column, kept, weights)
    shift = np.log(n) - np.log(n - 1)  # the mixture is over N - 1 prompts, not N
    replicate["marginal"] = replicate["marginal"] + shift
    replicate["marginal_seq"] = replicate["marginal_seq"] + shift
    return evaluate(replicate, weights, n, sigma_ema)


def _jackknife_intervals(
    values: dict[str, np.ndarray], point: dict, keys, confidence: float
) -> dict[str, float]:
    """Estimate ± t(K - 1) x the jackknife standard error,
    sqrt((K - 1) / K x sum_k (value_k - mean)^2), at least the rounding of the estimate
    (``_RESOLUTION``): where every replicate equals the estimate, as a grounded policy's
    sequence MI at its ceiling log N does, the interval is that point to rounding, not a
    zero-width interval that misses an expectation differing in the twelfth digit."""
    out: dict[str, float] = {}
    for key in keys:
        if key not in values or key not in point:
            continue
        v = values[key]
        k = len(v)
        if k < 2:
            continue
        se = float(np.sqrt((k - 1) / k * ((v - v.mean()) ** 2).sum()))
        half = float(student_t.ppf(0.5 + confidence / 2.0, k - 1)) * se
        half = max(half, _RESOLUTION * max(1.0, abs(float(point[key]))))
        low, high = float(point[key]) - half, float(point[key]) + half
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = low, high
    return out


def _log_scale(value: float, replicates: np.ndarray, bound: float | None, bound_replicate):
    """(the log-scale estimate and replicates, and the map back) for a proxy bounded above by
    ``bound`` (replicates by ``bound_replicate``: a replicate has one prompt fewer), or below
    by 0 when ``bound`` is None; None where a value lies outside that domain."""
    if bound is None:
        distance, distances = value, replicates
        back = np.exp
    else:
        distance, distances = bound - value, bound_replicate - replicates
        back = lambda phi: bound - np.exp(phi)  # noqa: E731
    if distance <= 0 or not np.all(distances > 0):
        return None
    return float(np.log(distance)), np.log(distances), back


def _log_interval(
    value: float, replicates: np.ndarray, bound, bound_replicate, t_quantile: float
) -> list[float] | None:
    """The jackknife's Student-t interval on the log scale of `_log_scale`, mapped back."""
    scaled = _log_scale(value, replicates, bound, bound_replicate)
    if scaled is None:
        return None
    phi, phis, back = scaled
    k = len(phis)
    se = float(np.sqrt((k - 1) / k * ((phis - phis.mean()) ** 2).sum()))
    return sorted((float(back(phi - t_quantile * se)), float(back(phi + t_quantile * se))))


def _log_jackknife_intervals(
    values: dict[str, np.ndarray],
    point: dict,
    keys,
    confidence: float,
    n_columns: int,
    sigma_ema: float | None,
) -> dict[str, float]:
    """The jackknife interval on a log scale anchored at each proxy's bound, mapped back, by
    its declared kind (`tether.diagnostics.proxies`): ``LOG_CEILING`` (MI: each row's
    pointwise MI is at most log N) on log(ceiling - value), ``LOG_FLOOR`` (entropies, >= 0) on
    log(value), ``QUOTIENT`` (the z-scores) from their numerator's and denominator's
    intervals.  A proxy whose estimate or a replicate lies outside its scale's domain gets
    the linear jackknife's."""
    out = _jackknife_intervals(values, point, keys, confidence)  # the fallback
    k = len(next(iter(values.values())))
    if k < 2:
        return out
    t_quantile = float(student_t.ppf(0.5 + confidence / 2.0, k - 1))

    def ends(name: str) -> list[float] | None:
        proxy = BY_NAME[name]
        if proxy.interval == LOG_CEILING:
            if n_columns < 2:
                return None
            bounds = proxy.ceiling(n_columns), proxy.ceiling(n_columns - 1)
            return _log_interval(float(point[name]), values[name], *bounds, t_quantile)
        if proxy.interval == LOG_FLOOR:
            return _log_interval(float(point[name]), values[name], None, None, t_quantile)
        if proxy.interval != QUOTIENT:
            return None
        numerator = ends(proxy.numerator)
        if proxy.denominator is None:  # the moving average, held fixed
            denominator = None if sigma_ema is None else [sigma_ema + ZSCORE_EPS] * 2
        else:  # a spread, >= 0: on its log scale
            spread = proxy.denominator
            spreads = _log_interval(float(point[spread]), values[spread], None, None, t_quantile)
            denominator = None if spreads is None else [e + ZSCORE_EPS for e in spreads]
        if numerator is None or denominator is None:
            return None
        quotients = [a / b for a in numerator for b in denominator]
        return [min(quotients), max(quotients)]

    for key in keys:
        if key not in values or key not in point:
            continue
        interval = ends(key)
        if interval is None:
            continue
        estimate = float(point[key])
        half = _RESOLUTION * max(1.0, abs(estimate))
        out[f"{key}_ci_low"] = min(interval[0], estimate - half)
        out[f"{key}_ci_high"] = max(interval[1], estimate + half)
    return out


def _p_value(null: np.ndarray, observed: float) -> float:
    # A tolerance, so a null statistic equal to the observed one up to rounding counts.
    reached = int((null >= observed - _RESOLUTION * max(1.0, abs(observed))).sum())
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
    q = row_quantities(L, S, column)
    multi = n >= 2
    sigma_ema = sigma_ema if multi else None
    out: dict[str, float] = {}

    point = estimates or point_estimates(q, n, sigma_ema)
    keys = [p.name for p in PROXIES if p.interval and p.defined(n, sigma_ema)]
    if settings.interval in ("jackknife", "log_jackknife") and (multi or m >= 2):
        # Retrieval is an argmax, not a smooth statistic: leaving out one prompt can flip
        # many rows at once, and the delete-one variance is then unreliable (far too
        # wide), so it (``BOOTSTRAP``) keeps the bootstrap interval.
        replicates = _jackknife(L, S, column, q, sigma_ema)
        smooth = [key for key in keys if BY_NAME[key].interval != BOOTSTRAP]
        if settings.interval == "log_jackknife":
            out.update(
                _log_jackknife_intervals(
                    replicates, point, smooth, settings.confidence, n, sigma_ema
                )
            )
        else:
            out.update(_jackknife_intervals(replicates, point, smooth, settings.confidence))
        keys = [key for key in keys if BY_NAME[key].interval == BOOTSTRAP]
    if keys and settings.bootstrap > 0:
        out.update(_bootstrap_intervals(L, S, column, q, sigma_ema, point, keys, settings, rng))
    if multi and settings.permutations > 0:
        out.update(_permutation_test(L, S, column, q, sigma_ema, settings, rng))
    return out


def _bootstrap_intervals(L, S, column, q, sigma_ema, point, keys, settings, rng) -> dict:
    """The percentile interval of each of ``keys`` over ``settings.bootstrap`` resamples by
    prompt (by pair with one prompt), widened where needed to hold the estimate: a resample
    holds fewer distinct prompts than the batch (a drawn prompt repeats), which shifts
    retrieval up and MI down.  (Re-centring it on the estimate instead made the alarms fire
    on noise: benchmarks/history/2026-11-23.md.)"""
    m, n = L.shape
    multi = n >= 2
    clusters, n_clusters = (column, n) if multi else (np.arange(m), m)
    draws = rng.multinomial(
        n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=settings.bootstrap
    )  # [B, clusters]
    weights = draws[:, clusters].astype(np.float64)  # [B, M]
    resampled = _resampled_columns(L, S, column, draws.astype(np.float64), weights) if multi else q
    stats = evaluate(resampled, weights, n, sigma_ema)
    tail = (1.0 - settings.confidence) / 2.0
    out = {}
    for key in keys:
        if key in stats:
            low, high = np.quantile(stats[key], [tail, 1.0 - tail])
            estimate = float(point[key])
            out[f"{key}_ci_low"] = float(min(low, estimate))
            out[f"{key}_ci_high"] = float(max(high, estimate))
    return out


def _permutation_test(L, S, column, q, sigma_ema, settings, rng) -> dict:
    """Each ``PERMUTATION`` proxy's statistic with the column labels permuted across rows
    (only the matched scores and the hits move): its null's 95th percentile, and for each
    proxy that declares a ``p_value`` key, its p-value; ``grounded`` from ``p_grounded``."""
    m, n = L.shape
    order = rng.random((settings.permutations, m)).argsort(axis=1)
    labels = column[order]  # [P, M] permuted
    rows = np.arange(m)
    matched = L[rows, labels]  # [P, M]
    permuted = {**q, "matched": matched, "matched_seq": S[rows, labels]}
    permuted["hit"] = hit_rate(L[None], matched)
    null = evaluate(permuted, None, n, sigma_ema)
    observed = point_estimates(q, n, sigma_ema)
    out = {}
    for key in NULL_KEYS:
        if key in null:
            out[f"{key}_null_q95"] = float(np.quantile(null[key], 0.95))
    for proxy in PROXIES:
        if proxy.null == PERMUTATION and proxy.p_value:
            out[proxy.p_value] = _p_value(null[proxy.name], observed[proxy.name])
    out["grounded"] = float(out["p_grounded"] < settings.alpha)
    return out
