"""Verdicts that decide: a paired effect over seeds, tested both ways, with its power.

A finding of the paper is a direction ("top-p minus no filter > 0") and, where the paper
or the protocol gives one, an effect size the paper would call a finding (the *smallest
effect of interest*, ``sesoi``).  From one difference per seed (the two arms of a seed
share its warm start and RL seed):

- **reproduced**: the effect lies in the paper's direction; one-sided t-test against 0,
  its p-value Holm-corrected over the family of findings tested together;
- **not reproduced**: the effect is smaller than ``sesoi`` in the paper's direction; the
  one-sided t-test against ``sesoi`` (an equivalence-style bound), Holm-corrected over
  the same family;
- otherwise **undecided at this power**, with the power the design had: the chance that
  the first test decides when the true effect is ``sesoi`` and the differences' standard
  deviation is the one observed.

Every verdict carries the mean, its two-sided t-interval, both p-values (raw and
Holm-adjusted) and the power, so a reader sees how close it came.  Pure numpy/scipy.

    >>> t = paired_effect([0.12, 0.08, 0.15, 0.11, 0.09, 0.14], direction=1, sesoi=0.05)
    >>> decide({"gain": t})["gain"]["verdict"]
    'reproduced'
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from .stats import t_interval

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
UNDECIDED = "undecided at this power"


def paired_power(n: int, effect: float, sd: float, alpha: float = 0.05) -> float:
    """Power of the one-sided paired t-test at level ``alpha`` with ``n`` pairs when the
    mean difference is ``effect`` (> 0, in the tested direction) and the differences'
    standard deviation is ``sd``: P(T > t_{1-alpha, n-1}) under the noncentral t with
    n - 1 degrees of freedom and noncentrality effect / sd * sqrt(n)."""
    if n < 2 or sd <= 0 or not math.isfinite(sd):
        return math.nan
    critical = stats.t.ppf(1.0 - alpha, n - 1)
    return float(stats.nct.sf(critical, n - 1, effect / sd * math.sqrt(n)))


def seeds_needed(
    effect: float, sd: float, power: float = 0.8, alpha: float = 0.05, most: int = 200
) -> int | None:
    """The fewest pairs whose one-sided paired t-test reaches ``power`` at ``effect``
    (None when not within ``most``)."""
    for n in range(2, most + 1):
        if paired_power(n, effect, sd, alpha) >= power:
            return n
    return None


def paired_effect(
    differences,
    direction: int,
    sesoi: float,
    confidence: float = 0.95,
    alpha: float = 0.05,
) -> dict:
    """The tests of one finding from its per-seed differences (NaN and None dropped).

    ``direction`` is +1 when the paper says the difference is positive, -1 negative;
    ``sesoi`` (> 0) the smallest effect, in that direction, that the paper would call its
    finding.  ``p_paper`` tests "no effect or the other way" (H0: direction x mean <= 0),
    ``p_short`` tests "at least the paper's effect" (H0: direction x mean >= sesoi);
    ``power`` is that of the first test at ``sesoi`` with the observed spread."""
    if direction not in (1, -1) or not sesoi > 0:
        raise ValueError("direction must be +1 or -1 and sesoi > 0")
    v = np.asarray([x for x in differences if x is not None and not math.isnan(x)], float)
    n = len(v)
    out = {"direction": direction, "sesoi": sesoi, **t_interval(v, confidence), "sd": math.nan}
    out.update(p_paper=math.nan, p_short=math.nan, power=math.nan)
    if n < 2:
        return out
    sd = float(v.std(ddof=1))
    se = sd / math.sqrt(n)
    out["sd"] = sd
    toward = direction * out["mean"]  # the effect measured in the paper's direction
    if se > 0:
        out["p_paper"] = float(stats.t.sf(toward / se, n - 1))
        out["p_short"] = float(stats.t.cdf((toward - sesoi) / se, n - 1))
    else:  # every seed gave the same difference: the tests are decided by its sign
        out["p_paper"] = 0.0 if toward > 0 else 1.0
        out["p_short"] = 0.0 if toward < sesoi else 1.0
    out["power"] = paired_power(n, sesoi, sd, alpha) if sd > 0 else 1.0
    return out


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count in the
    family): sorted ascending, p_(i) x (m - i + 1), made monotone, capped at 1."""
    named = sorted(((p, k) for k, p in pvalues.items() if not math.isnan(p)), key=lambda x: x[0])
    m = len(named)
    out = {k: math.nan for k in pvalues}
    running = 0.0
    for i, (p, k) in enumerate(named):
        running = max(running, min(1.0, p * (m - i)))
        out[k] = running
    return out


def decide(tests: dict[str, dict], alpha: float = 0.05) -> dict[str, dict]:
    """The verdict of each test of a family (``paired_effect`` results by name): Holm over
    the family for each of the two tests, then reproduced / not reproduced / undecided.

    A test without p-values yet (its runs still to come) counts in the family as p = 1:
    Holm's adjusted p-values never fall when any one p-value rises, so the others' are
    then bounds that hold whatever it gives later. A verdict read while tests are pending
    stands; only "undecided" can still change, and its reason names the pending tests."""
    pending = sorted(k for k, t in tests.items() if math.isnan(t["p_paper"]))

    def adjusted(key: str) -> dict[str, float]:
        out = holm({k: 1.0 if k in pending else t[key] for k, t in tests.items()})
        return {k: math.nan if k in pending else p for k, p in out.items()}

    paper, short = adjusted("p_paper"), adjusted("p_short")
    waiting = f"; {', '.join(pending)} pending, counted as p = 1" if pending else ""
    out = {}
    for name, t in tests.items():
        row = {**t, "p_paper_holm": paper[name], "p_short_holm": short[name]}
        # The power the first step of Holm had (level alpha / family): the least a test
        # of the family had.
        row["power_holm"] = (
            paired_power(t["n"], t["sesoi"], t["sd"], alpha / len(tests))
            if t["n"] >= 2 and t["sd"] > 0
            else t["power"]
        )
        if name in pending:
            row.update(verdict=None, because=f"no p-value yet: {t['n']} paired seeds")
        elif paper[name] < alpha:
            row.update(
                verdict=REPRODUCED,
                because=f"in the paper's direction, Holm-adjusted p {paper[name]:.3g} < {alpha}",
            )
        elif short[name] < alpha:
            row.update(
                verdict=NOT_REPRODUCED,
                because=f"smaller than the paper's effect {t['sesoi']:g}, "
                f"Holm-adjusted p {short[name]:.3g} < {alpha}",
            )
        else:
            row.update(
                verdict=UNDECIDED,
                because=f"neither test decides over {t['n']} seeds; power at the paper's "
                f"effect {t['sesoi']:g} was {t['power']:.2f} "
                f"({row['power_holm']:.2f} at Holm's first step){waiting}",
            )
        out[name] = row
    return out
