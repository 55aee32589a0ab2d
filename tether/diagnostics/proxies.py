"""The MI proxies, each declared once (docs/methods.md, sections 2 and 3).

A proxy is a statistic of the rows of an [M, N] cross-score matrix: per pair i, its
``matched`` score (under its own prompt), its ``marginal`` (the log of the mean of its
scores over the N prompts), the same two on the sequence scores (``matched_seq``,
``marginal_seq``) and its retrieval ``hit`` (the probability that its own prompt ranks
first, ties split).  Each `Proxy` says, in one place:

- its **statistic**, written once against `RowMeans`: under per-row weights [B, M] (a
  bootstrap resample or a jackknife replicate per row of weights, `tether.diagnostics.uncertainty`)
  or, with no weights, the plain mean over the rows, which is the **point estimate**
  `tether.diagnostics.mi` logs;
- whether it needs two or more distinct prompts (``multi_prompt``);
- its **interval** kind under ``diagnostics.interval: log_jackknife`` (``LOG_CEILING``,
  ``LOG_FLOOR``, ``QUOTIENT``, ``BOOTSTRAP``; None: no interval), and its **ceiling**;
- its **null**: ``PERMUTATION`` (the column labels permuted across rows), or None;
- its **label** for people, and where it is drawn: the report's collapse figure
  (``report``) and the live monitor's curve name (``monitor``).

The key lists (`CI_KEYS`, `NULL_KEYS`, ...), the interval code, the report's curves and the
monitor's are derived from `PROXIES`; adding a proxy is adding a declaration.  Numpy only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Denominator guard of the z-scores: std(marginal) + ZSCORE_EPS (the paper's 1e-3).
ZSCORE_EPS = 1e-3

#: Interval kinds.  Under ``log_jackknife`` the delete-one replicates are put on a log scale
#: anchored at the bound the proxy has: ``LOG_CEILING`` on log(ceiling(N) - value) (each
#: row's pointwise MI is at most log N; a replicate, with one prompt fewer, against
#: ceiling(N - 1)); ``LOG_FLOOR`` on log(value) (>= 0); ``QUOTIENT`` the range of the
#: quotients of its numerator's interval and its denominator's (a spread, >= 0, on its log
#: scale, plus ZSCORE_EPS; or the fixed moving average).  Under ``jackknife`` these three
#: get the linear jackknife interval.  ``BOOTSTRAP`` proxies (an argmax, whose delete-one
#: variance is unreliable) keep the bootstrap's percentile interval under every method.
LOG_CEILING, LOG_FLOOR, QUOTIENT, BOOTSTRAP = "log_ceiling", "log_floor", "quotient", "bootstrap"
#: The null of a proxy's permutation test: the column labels permuted across rows (keeping
#: each prompt's count of pairs), so that only the matched scores and the hits move.
PERMUTATION = "permutation"


class RowMeans:
    """Means of the rows' quantities (``rows``: name -> [M], or [B, M] per resample) under
    row weights [B, M], or, with ``weights`` None, the plain mean over the rows (unit
    weights: the point estimate, and the permutation null's statistic).  ``sigma_ema`` is
    the moving average of std(marginal) that ``mi_zscore_ema`` divides by."""

    def __init__(self, rows: dict, weights: np.ndarray | None, sigma_ema: float | None):
        self.rows, self.weights, self.sigma_ema = rows, weights, sigma_ema
        self.total = None if weights is None else weights.sum(axis=1)
        self._means: dict[str, np.ndarray] = {}
        self._values: dict[str, np.ndarray] = {}

    def _weighted(self, values: np.ndarray) -> np.ndarray:
        if self.weights is None:
            return values.mean(axis=-1)
        if values.ndim == 2:  # rows of weight 0 may hold -inf marginals: never multiplied
            return (self.weights * np.where(self.weights > 0, values, 0.0)).sum(axis=1) / self.total
        return self.weights @ values / self.total

    def mean(self, row: str) -> np.ndarray:
        if row not in self._means:
            self._means[row] = self._weighted(self.rows[row])
        return self._means[row]

    def std(self, row: str) -> np.ndarray:
        """Population std (ddof 0) of a row quantity."""
        if self.weights is None:
            return self.rows[row].std(axis=-1)
        return np.sqrt(np.maximum(self._weighted(self.rows[row] ** 2) - self.mean(row) ** 2, 0.0))

    def value(self, name: str) -> np.ndarray:
        """Proxy ``name`` under these weights (each computed once)."""
        if name not in self._values:
            self._values[name] = BY_NAME[name].statistic(self)
        return self._values[name]


@dataclass(frozen=True)
class Proxy:
    name: str
    #: what people read: the report's panel titles
    label: str
    statistic: Callable[[RowMeans], np.ndarray]
    #: needs two or more distinct prompts (mutual information is undefined with one)
    multi_prompt: bool = True
    interval: str | None = None
    #: the bound of a ``LOG_CEILING`` proxy, given the number of prompts
    ceiling: Callable[[int], float] | None = None
    null: str | None = None
    #: the key of its permutation test's p-value (a quotient's is its numerator's)
    p_value: str | None = None
    #: ``QUOTIENT``: the proxies it divides (``denominator`` None: the moving average)
    numerator: str | None = None
    denominator: str | None = None
    #: drawn in the report's collapse figure
    report: bool = False
    #: the name of its curve on the live monitor's page (None: not drawn there)
    monitor: str | None = None

    def __post_init__(self) -> None:
        quotient = self.interval == QUOTIENT
        wrong = [
            (self.interval not in (None, LOG_CEILING, LOG_FLOOR, QUOTIENT, BOOTSTRAP), "interval"),
            ((self.interval == LOG_CEILING) != (self.ceiling is not None), "ceiling"),
            (self.null not in (None, PERMUTATION), "null"),
            (self.p_value is not None and (self.null is None or quotient), "p_value"),
            (quotient != (self.numerator is not None), "numerator"),
            (self.denominator is not None and not quotient, "denominator"),
        ]
        for bad, field in wrong:
            if bad:
                raise ValueError(f"proxy {self.name}: {field} does not fit its declaration")

    def defined(self, n_prompts: int, sigma_ema: float | None) -> bool:
        """Whether it has a value with ``n_prompts`` distinct prompts and this moving average."""
        moving = self.interval == QUOTIENT and self.denominator is None
        return (n_prompts >= 2 or not self.multi_prompt) and (sigma_ema is not None or not moving)


def _gap(matched: str, marginal: str) -> Callable[[RowMeans], np.ndarray]:
    return lambda r: r.mean(matched) - r.mean(marginal)


def _quotient(name: str, label: str, numerator: str, denominator: str | None, **rest) -> Proxy:
    """A z-score: ``numerator / (denominator + ZSCORE_EPS)``, over the moving average when
    ``denominator`` is None; its interval is the quotient of theirs."""
    if denominator is None:
        statistic = lambda r: r.value(numerator) / (r.sigma_ema + ZSCORE_EPS)
    else:
        statistic = lambda r: r.value(numerator) / (r.value(denominator) + ZSCORE_EPS)
    return Proxy(
        name,
        label,
        statistic,
        interval=QUOTIENT,
        numerator=numerator,
        denominator=denominator,
        **rest,
    )


def _mi(name: str, label: str, matched: str, marginal: str, p_value: str, **rest) -> Proxy:
    """An MI estimate: mean(matched) - mean(marginal), at most log N."""
    return Proxy(
        name,
        label,
        _gap(matched, marginal),
        interval=LOG_CEILING,
        ceiling=np.log,
        null=PERMUTATION,
        p_value=p_value,
        **rest,
    )


def _entropy(name: str, label: str, row: str, **rest) -> Proxy:
    """An entropy estimate: -mean(row), >= 0, defined with one prompt."""
    return Proxy(
        name, label, lambda r: -r.mean(row), multi_prompt=False, interval=LOG_FLOOR, **rest
    )


#: The MI proxies, in the order they are reported (the Spearman table's, `CI_KEYS`'s).
PROXIES: tuple[Proxy, ...] = (
    _quotient(
        "mi_zscore",
        "MI z-score",
        numerator="mi_estimate",
        denominator="marginal_std",
        null=PERMUTATION,
    ),
    _quotient(
        "mi_zscore_ema",
        "MI z-score (EMA)",
        numerator="mi_estimate",
        denominator=None,
        null=PERMUTATION,
        report=True,
        monitor="mi_zscore_ema",
    ),
    _mi(
        "mi_estimate",
        "I(X;Z) estimate",
        matched="matched",
        marginal="marginal",
        p_value="p_grounded",
        report=True,
        monitor="mi",
    ),
    _mi(
        "mi_seq_estimate",
        "I(X;Z) estimate, sequence scores",
        matched="matched_seq",
        marginal="marginal_seq",
        p_value="mi_seq_estimate_p_grounded",
    ),
    _quotient(
        "mi_seq_zscore",
        "MI z-score, sequence scores",
        numerator="mi_seq_estimate",
        denominator="marginal_seq_std",
    ),
    Proxy(
        "retrieval_acc",
        "retrieval accuracy",
        lambda r: r.mean("hit"),
        interval=BOOTSTRAP,
        null=PERMUTATION,
        p_value="retrieval_acc_p_grounded",
        report=True,
    ),
    _entropy(
        "conditional_entropy_est", "H(Z|X) estimate", "matched", report=True, monitor="entropy"
    ),
    _entropy("reasoning_entropy_est", "H(Z) estimate", "marginal", report=True),
    _entropy("conditional_entropy_seq_est", "H(Z|X) estimate, sequence scores", "matched_seq"),
    _entropy("reasoning_entropy_seq_est", "H(Z) estimate, sequence scores", "marginal_seq"),
    # The z-scores' denominators, logged beside them (no interval of their own).
    Proxy("marginal_std", "std(marginal)", lambda r: r.std("marginal")),
    Proxy("marginal_seq_std", "std(marginal), sequence scores", lambda r: r.std("marginal_seq")),
)
BY_NAME = {proxy.name: proxy for proxy in PROXIES}

#: Proxies that get an interval (``K_ci_low`` / ``K_ci_high``).
CI_KEYS = tuple(p.name for p in PROXIES if p.interval)
#: Proxies that get a permutation null (``K_null_q95``).
NULL_KEYS = tuple(p.name for p in PROXIES if p.null == PERMUTATION)
#: Proxies defined with a single distinct prompt, and those that need two or more.
ONE_PROMPT_KEYS = tuple(p.name for p in PROXIES if not p.multi_prompt)
MULTI_PROMPT_KEYS = tuple(p.name for p in PROXIES if p.multi_prompt)


def p_value_key(name: str) -> str | None:
    """The key of the permutation test's p-value that speaks for proxy ``name``: its own,
    or for a quotient its numerator's (a permutation moves only the matched scores, not the
    spread of the marginals, so the z-score's test is its numerator's); None without a null."""
    proxy = BY_NAME.get(name)
    if proxy is None or proxy.null != PERMUTATION:
        return None
    return BY_NAME[proxy.numerator].p_value if proxy.interval == QUOTIENT else proxy.p_value


def evaluate(
    rows: dict, weights: np.ndarray | None, n_prompts: int, sigma_ema: float | None
) -> dict[str, np.ndarray]:
    """Every proxy defined at ``n_prompts`` under row ``weights`` [B, M] (None: unit weights)."""
    means = RowMeans(rows, weights, sigma_ema)
    return {p.name: means.value(p.name) for p in PROXIES if p.defined(n_prompts, sigma_ema)}


def point_estimates(rows: dict, n_prompts: int, sigma_ema: float | None) -> dict[str, float]:
    """Each proxy's point estimate: its statistic at unit weights."""
    return {name: float(v) for name, v in evaluate(rows, None, n_prompts, sigma_ema).items()}
