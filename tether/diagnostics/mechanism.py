"""Where the probe set's I(X;Z) is lost, by each probe level's reward variance under the
current policy (docs/methods.md, "The mechanism, measured").

The paper's mechanism: a prompt whose group rewards do not vary gets no task gradient
(none at all under Dr.GRPO; a full-size one under GRPO's division by the group std only
when the spread is not exactly zero), while the regularisers still pull on it, so the
input dependence its reasoning loses should sit in the low-variance prompts.  With
``diagnostics.probe.outcome_samples`` k > 0, each probe level is played to the end k
times by the current policy at every probe point; this module turns those outcomes and
the probe's per-level pointwise MI (``mi.mi_by_column``) into:

    mechanism/probe_success (+ _ci_low/_ci_high)   held-out success on the probe levels
    mechanism/probe_levels                          levels with outcomes
    mechanism/probe_zero_rv_{all_failed,all_succeeded,uninformative}
                                                   levels whose k rewards are all equal
    mechanism/probe_mi/{zero_rv,nonzero_rv}        mean pointwise MI of each class (+ CI)
    mechanism/probe_mi_change/{zero_rv,nonzero_rv} mean change since the first probe point
                                                   of the levels in that class now (+ CI)
    mechanism/probe_mi_change/gap                  zero-RV minus nonzero-RV change (Welch)

A negative ``gap`` with its interval below 0 is the mechanism's signature: the MI lost
sits in the prompts without reward spread.  Pure: numpy and scipy only.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

from ..agent.metrics import _proportion_interval
from ..algos.filters import snr_filter
from ..algos.settings import FilterConfig

PREFIX = "mechanism/"
CLASSES = ("zero_rv", "nonzero_rv")


def level_outcomes(trajectories) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per group id (a probe level): its episodes' rewards and success flags."""
    rewards: dict[int, list[float]] = {}
    success: dict[int, list[bool]] = {}
    for t in trajectories:
        rewards.setdefault(int(t.group_id), []).append(float(t.reward))
        success.setdefault(int(t.group_id), []).append(bool(t.success))
    return {g: (np.array(rewards[g]), np.array(success[g], dtype=bool)) for g in rewards}


def _mean_interval(name: str, values: np.ndarray) -> dict[str, float]:
    """Mean with its 95 % t interval (NaN bounds below two values)."""
    values = values[np.isfinite(values)]
    out = {f"{name}_levels": float(values.size)}
    if values.size == 0:
        return out
    out[name] = float(values.mean())
    if values.size >= 2:
        with warnings.catch_warnings():  # equal values: a zero-width interval, said as such
            warnings.simplefilter("ignore", RuntimeWarning)
            low, high = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = float(low), float(high)
    return out


def _gap_interval(name: str, zero: np.ndarray, nonzero: np.ndarray) -> dict[str, float]:
    """Difference of means (zero minus nonzero) with Welch's 95 % interval."""
    zero, nonzero = zero[np.isfinite(zero)], nonzero[np.isfinite(nonzero)]
    if zero.size < 2 or nonzero.size < 2:
        return {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        test = stats.ttest_ind(zero, nonzero, equal_var=False)
        low, high = test.confidence_interval(0.95)
    return {
        name: float(zero.mean() - nonzero.mean()),
        f"{name}_ci_low": float(low),
        f"{name}_ci_high": float(high),
        f"{name}_p": float(test.pvalue),
    }


def probe_mechanism(
    outcomes: Mapping[int, tuple[np.ndarray, np.ndarray]],
    level_mi: Mapping[int, float],
    first_mi: Mapping[int, float] | None = None,
) -> dict[str, float]:
    """The ``mechanism/probe…`` metrics of one probe point.

    ``outcomes[g]`` = (rewards, success flags) of level g's episodes; ``level_mi[g]`` its
    pointwise MI now; ``first_mi[g]`` the same at the run's first probe point (no
    ``…mi_change…`` metrics without it).  A level with fewer than two episodes has no
    reward variance and is left out of the classes."""
    levels = sorted(g for g in outcomes if outcomes[g][0].size >= 2)
    if not levels:
        return {}
    flags = np.concatenate([outcomes[g][1] for g in levels])
    out = {
        f"{PREFIX}probe_levels": float(len(levels)),
        f"{PREFIX}probe_success": float(flags.mean()),
        **_proportion_interval(f"{PREFIX}probe_success", int(flags.sum()), int(flags.size)),
    }
    # zero variance by cause: the filter's own classification (strategy none keeps all)
    none = FilterConfig(strategy="none")
    spread = snr_filter(
        [outcomes[g][0] for g in levels], none, success=[outcomes[g][1] for g in levels]
    )
    zero = spread.scores <= none.zero_tol
    for cause in ("all_failed", "all_succeeded", "uninformative"):
        count = spread.metrics[f"filter/zero_variance_{cause}"]
        out[f"{PREFIX}probe_zero_rv_{cause}"] = count / len(levels)
    out[f"{PREFIX}probe_zero_rv_share"] = float(zero.mean())
    mi = np.array([level_mi.get(g, np.nan) for g in levels], dtype=np.float64)
    by_class = {"zero_rv": zero, "nonzero_rv": ~zero}
    for name, mask in by_class.items():
        out.update(_mean_interval(f"{PREFIX}probe_mi/{name}", mi[mask]))
    if first_mi:
        change = mi - np.array([first_mi.get(g, np.nan) for g in levels], dtype=np.float64)
        for name, mask in by_class.items():
            out.update(_mean_interval(f"{PREFIX}probe_mi_change/{name}", change[mask]))
        out.update(_gap_interval(f"{PREFIX}probe_mi_change/gap", change[zero], change[~zero]))
    return out


def level_record(
    it: int,
    level_seeds: Sequence[int],
    outcomes: Mapping[int, tuple[np.ndarray, np.ndarray]],
    level_mi: Mapping[int, float],
) -> dict:
    """The per-level artifact of a probe point: seed, rewards, successes, pointwise MI."""
    return {
        "iteration": it,
        "levels": [
            {
                "level": int(seed),
                "rewards": [float(r) for r in outcomes.get(k, (np.array([]), None))[0]],
                "success": [bool(s) for s in outcomes.get(k, (None, np.array([])))[1]],
                "mi": None if not np.isfinite(level_mi.get(k, np.nan)) else float(level_mi[k]),
            }
            for k, seed in enumerate(level_seeds)
        ],
    }
