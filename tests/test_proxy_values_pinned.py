"""Every MI proxy's point value, interval and permutation p-value on fixed matrices, pinned.

The numbers in ``PINNED`` were produced by the code before the proxies were declared once
(``tether/diagnostics/mi.py`` and ``uncertainty.py`` at commit e5f24a6, each formula written
in both files), by running ``pinned_case`` below; the declarations must reproduce them to
1e-12.  Six cases: a 24 x 6 batch with unequal groups and tied scores under each interval
method, one prompt (entropies only; some replicates below 0, so log_jackknife falls back to
the linear interval), and constant scores (zero spreads, a three-way tie in every row).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tether.diagnostics.mi import mi_proxies
from tether.diagnostics.uncertainty import Uncertainty


def tied_batch():
    """24 pairs over 6 prompts (groups of 4, 3, 5, 2, 3, 7), rounded to 0.1 so rows tie."""
    rng = np.random.default_rng(20261201)
    column = np.array([0] * 4 + [1] * 3 + [2] * 5 + [3] * 2 + [4] * 3 + [5] * 7)
    m, n = len(column), 6
    L = rng.normal(-2.0, 0.6, (m, n)) + rng.normal(0, 0.4, (m, 1))
    L[np.arange(m), column] += 0.3
    L = np.round(L, 1)
    S = np.round(9 * L + rng.normal(0, 1.0, (m, n)), 1)
    return L, S, column


def one_prompt():
    """7 pairs of one prompt, per-token scores near 0 so some entropy replicates are < 0."""
    rng = np.random.default_rng(20261202)
    L = rng.normal(-0.02, 0.05, (7, 1))
    return L, 5 * L + rng.normal(0, 0.1, (7, 1)), np.zeros(7, dtype=np.int64)


def pinned_case(name: str) -> dict[str, float]:
    small = {"bootstrap": 300, "permutations": 300}
    if name == "constant":
        L = np.zeros((6, 3))
        column = np.array([0, 0, 1, 1, 2, 2])
        state = {"sigma": 0.0, "updates": 1}
        return mi_proxies(L, L, column, state, Uncertainty(**small), np.random.default_rng(11))[0]
    if name.startswith("one_prompt_"):
        L, S, column = one_prompt()
        settings = Uncertainty(**small, interval=name.removeprefix("one_prompt_"))
        return mi_proxies(L, S, column, None, settings, np.random.default_rng(12))[0]
    L, S, column = tied_batch()
    state = {"sigma": 0.3, "updates": 2}
    settings = Uncertainty(**small, interval=name)
    return mi_proxies(L, S, column, state, settings, np.random.default_rng(13))[0]


PINNED = {
    "log_jackknife": {
        "conditional_entropy_est": 1.7166666666666666,
        "conditional_entropy_est_ci_high": 1.9684779535130312,
        "conditional_entropy_est_ci_low": 1.4970675384934835,
        "conditional_entropy_seq_est": 15.512499999999998,
        "conditional_entropy_seq_est_ci_high": 17.49607433319957,
        "conditional_entropy_seq_est_ci_low": 13.753808521113758,
        "grounded": 1.0,
        "marginal_seq_std": 6.4049390687410295,
        "marginal_std": 0.5763115239862995,
        "marginal_std_ema": 0.32763115239862994,
        "mi_estimate": 0.03916610312246238,
        "mi_estimate_ci_high": 0.3046014951512075,
        "mi_estimate_ci_low": -0.2736455250355947,
        "mi_estimate_null_q95": 0.026874436455795594,
        "mi_seq_estimate": -3.991885970765665,
        "mi_seq_estimate_ci_high": -1.3162509559436542,
        "mi_seq_estimate_ci_low": -8.970931126866743,
        "mi_seq_estimate_null_q95": -4.114594304099001,
        "mi_seq_estimate_p_grounded": 0.03986710963455149,
        "mi_seq_zscore": -0.6231539088850868,
        "mi_seq_zscore_ci_high": -0.14013218492500704,
        "mi_seq_zscore_ci_low": -2.053348512297165,
        "mi_upper_bound": 1.791759469228055,
        "mi_zscore": 0.0678422333440058,
        "mi_zscore_ci_high": 0.7121145914603674,
        "mi_zscore_ci_low": -0.6397439748906885,
        "mi_zscore_ema": 0.11917952037289999,
        "mi_zscore_ema_ci_high": 0.9268795515214138,
        "mi_zscore_ema_ci_low": -0.8326828513921966,
        "mi_zscore_ema_null_q95": 0.08177689868913242,
        "mi_zscore_null_q95": 0.04655101334237937,
        "num_pairs": 24.0,
        "num_prompts": 6.0,
        "p_grounded": 0.04983388704318937,
        "reasoning_entropy_est": 1.755832769789129,
        "reasoning_entropy_est_ci_high": 1.9976736895513807,
        "reasoning_entropy_est_ci_low": 1.5432694196206314,
        "reasoning_entropy_seq_est": 11.520614029234332,
        "reasoning_entropy_seq_est_ci_high": 14.136356109445256,
        "reasoning_entropy_seq_est_ci_low": 9.38887974970513,
        "retrieval_above_chance": 0.05555555555555555,
        "retrieval_acc": 0.25,
        "retrieval_acc@2": 0.47222222222222215,
        "retrieval_acc@4": 0.8333333333333334,
        "retrieval_acc@8": 1.0,
        "retrieval_acc_ci_high": 0.5882352941176471,
        "retrieval_acc_ci_low": 0.2424242424242424,
        "retrieval_acc_null_q95": 0.3125,
        "retrieval_acc_p_grounded": 0.19269102990033224,
        "retrieval_chance": 0.19444444444444445,
        "retrieval_chance@2": 0.3888888888888889,
        "retrieval_chance@4": 0.7777777777777778,
        "retrieval_chance@8": 1.0,
    },
    "jackknife": {
        "conditional_entropy_est": 1.7166666666666666,
        "conditional_entropy_est_ci_high": 1.953796104369095,
        "conditional_entropy_est_ci_low": 1.4795372289642381,
        "conditional_entropy_seq_est": 15.512499999999998,
        "conditional_entropy_seq_est_ci_high": 17.388680836324276,
        "conditional_entropy_seq_est_ci_low": 13.63631916367572,
        "grounded": 1.0,
        "marginal_seq_std": 6.4049390687410295,
        "marginal_std": 0.5763115239862995,
        "marginal_std_ema": 0.32763115239862994,
        "mi_estimate": 0.03916610312246238,
        "mi_estimate_ci_high": 0.2922605875030082,
        "mi_estimate_ci_low": -0.21392838125808344,
        "mi_estimate_null_q95": 0.026874436455795594,
        "mi_seq_estimate": -3.991885970765665,
        "mi_seq_estimate_ci_high": -0.9728171491413931,
        "mi_seq_estimate_ci_low": -7.010954792389937,
        "mi_seq_estimate_null_q95": -4.114594304099001,
        "mi_seq_estimate_p_grounded": 0.03986710963455149,
        "mi_seq_zscore": -0.6231539088850868,
        "mi_seq_zscore_ci_high": -0.16208753174163798,
        "mi_seq_zscore_ci_low": -1.0842202860285357,
        "mi_upper_bound": 1.791759469228055,
        "mi_zscore": 0.0678422333440058,
        "mi_zscore_ci_high": 0.5237175349086493,
        "mi_zscore_ci_low": -0.38803306822063766,
        "mi_zscore_ema": 0.11917952037289999,
        "mi_zscore_ema_ci_high": 0.889327093216335,
        "mi_zscore_ema_ci_low": -0.6509680524705349,
        "mi_zscore_ema_null_q95": 0.08177689868913242,
        "mi_zscore_null_q95": 0.04655101334237937,
        "num_pairs": 24.0,
        "num_prompts": 6.0,
        "p_grounded": 0.04983388704318937,
        "reasoning_entropy_est": 1.755832769789129,
        "reasoning_entropy_est_ci_high": 1.984178058544998,
        "reasoning_entropy_est_ci_low": 1.52748748103326,
        "reasoning_entropy_seq_est": 11.520614029234332,
        "reasoning_entropy_seq_est_ci_high": 13.993938617431649,
        "reasoning_entropy_seq_est_ci_low": 9.047289441037016,
        "retrieval_above_chance": 0.05555555555555555,
        "retrieval_acc": 0.25,
        "retrieval_acc@2": 0.47222222222222215,
        "retrieval_acc@4": 0.8333333333333334,
        "retrieval_acc@8": 1.0,
        "retrieval_acc_ci_high": 0.5882352941176471,
        "retrieval_acc_ci_low": 0.2424242424242424,
        "retrieval_acc_null_q95": 0.3125,
        "retrieval_acc_p_grounded": 0.19269102990033224,
        "retrieval_chance": 0.19444444444444445,
        "retrieval_chance@2": 0.3888888888888889,
        "retrieval_chance@4": 0.7777777777777778,
        "retrieval_chance@8": 1.0,
    },
    "bootstrap": {
        "conditional_entropy_est": 1.7166666666666666,
        "conditional_entropy_est_ci_high": 1.8566,
        "conditional_entropy_est_ci_low": 1.5250000000000001,
        "conditional_entropy_seq_est": 15.512499999999998,
        "conditional_entropy_seq_est_ci_high": 16.61553977272727,
        "conditional_entropy_seq_est_ci_low": 13.961538461538462,
        "grounded": 1.0,
        "marginal_seq_std": 6.4049390687410295,
        "marginal_std": 0.5763115239862995,
        "marginal_std_ema": 0.32763115239862994,
        "mi_estimate": 0.03916610312246238,
        "mi_estimate_ci_high": 0.2370176131092443,
        "mi_estimate_ci_low": -0.13407436915303161,
        "mi_estimate_null_q95": 0.026874436455795594,
        "mi_seq_estimate": -3.991885970765665,
        "mi_seq_estimate_ci_high": -0.42310483361742734,
        "mi_seq_estimate_ci_low": -4.890086738915805,
        "mi_seq_estimate_null_q95": -4.114594304099001,
        "mi_seq_estimate_p_grounded": 0.03986710963455149,
        "mi_seq_zscore": -0.6231539088850868,
        "mi_seq_zscore_ci_high": -0.06946950871446599,
        "mi_seq_zscore_ci_low": -0.7191942577603052,
        "mi_upper_bound": 1.791759469228055,
        "mi_zscore": 0.0678422333440058,
        "mi_zscore_ci_high": 0.43610911129243096,
        "mi_zscore_ci_low": -0.18951428492440944,
        "mi_zscore_ema": 0.11917952037289999,
        "mi_zscore_ema_ci_high": 0.721226856855438,
        "mi_zscore_ema_ci_low": -0.4079782703935483,
        "mi_zscore_ema_null_q95": 0.08177689868913242,
        "mi_zscore_null_q95": 0.04655101334237937,
        "num_pairs": 24.0,
        "num_prompts": 6.0,
        "p_grounded": 0.04983388704318937,
        "reasoning_entropy_est": 1.755832769789129,
        "reasoning_entropy_est_ci_high": 1.9238697188193146,
        "reasoning_entropy_est_ci_low": 1.583089830355387,
        "reasoning_entropy_seq_est": 11.520614029234332,
        "reasoning_entropy_seq_est_ci_high": 14.637510009296154,
        "reasoning_entropy_seq_est_ci_low": 10.968858884578669,
        "retrieval_above_chance": 0.05555555555555555,
        "retrieval_acc": 0.25,
        "retrieval_acc@2": 0.47222222222222215,
        "retrieval_acc@4": 0.8333333333333334,
        "retrieval_acc@8": 1.0,
        "retrieval_acc_ci_high": 0.5882352941176471,
        "retrieval_acc_ci_low": 0.2424242424242424,
        "retrieval_acc_null_q95": 0.3125,
        "retrieval_acc_p_grounded": 0.19269102990033224,
        "retrieval_chance": 0.19444444444444445,
        "retrieval_chance@2": 0.3888888888888889,
        "retrieval_chance@4": 0.7777777777777778,
        "retrieval_chance@8": 1.0,
    },
    "one_prompt_log_jackknife": {
        "conditional_entropy_est": 0.0036154338868645405,
        "conditional_entropy_est_ci_high": 0.05620323248711459,
        "conditional_entropy_est_ci_low": -0.04897236471338551,
        "conditional_entropy_seq_est": 0.08410418639675739,
        "conditional_entropy_seq_est_ci_high": 0.3796775987051972,
        "conditional_entropy_seq_est_ci_low": -0.21146922591168243,
        "num_pairs": 7.0,
        "num_prompts": 1.0,
        "reasoning_entropy_est": 0.0036154338868645405,
        "reasoning_entropy_est_ci_high": 0.05620323248711459,
        "reasoning_entropy_est_ci_low": -0.04897236471338551,
        "reasoning_entropy_seq_est": 0.08410418639675739,
        "reasoning_entropy_seq_est_ci_high": 0.3796775987051972,
        "reasoning_entropy_seq_est_ci_low": -0.21146922591168243,
    },
    "one_prompt_bootstrap": {
        "conditional_entropy_est": 0.0036154338868645405,
        "conditional_entropy_est_ci_high": 0.04480385430932672,
        "conditional_entropy_est_ci_low": -0.03574479818731541,
        "conditional_entropy_seq_est": 0.08410418639675739,
        "conditional_entropy_seq_est_ci_high": 0.3148249067258323,
        "conditional_entropy_seq_est_ci_low": -0.13028808406280298,
        "num_pairs": 7.0,
        "num_prompts": 1.0,
        "reasoning_entropy_est": 0.0036154338868645405,
        "reasoning_entropy_est_ci_high": 0.04480385430932672,
        "reasoning_entropy_est_ci_low": -0.03574479818731541,
        "reasoning_entropy_seq_est": 0.08410418639675739,
        "reasoning_entropy_seq_est_ci_high": 0.3148249067258323,
        "reasoning_entropy_seq_est_ci_low": -0.13028808406280298,
    },
    "constant": {
        "conditional_entropy_est": -0.0,
        "conditional_entropy_est_ci_high": 1e-09,
        "conditional_entropy_est_ci_low": -1e-09,
        "conditional_entropy_seq_est": -0.0,
        "conditional_entropy_seq_est_ci_high": 1e-09,
        "conditional_entropy_seq_est_ci_low": -1e-09,
        "grounded": 0.0,
        "marginal_seq_std": 0.0,
        "marginal_std": 0.0,
        "marginal_std_ema": 0.0,
        "mi_estimate": 0.0,
        "mi_estimate_ci_high": 1e-09,
        "mi_estimate_ci_low": -1e-09,
        "mi_estimate_null_q95": 0.0,
        "mi_seq_estimate": 0.0,
        "mi_seq_estimate_ci_high": 1e-09,
        "mi_seq_estimate_ci_low": -1e-09,
        "mi_seq_estimate_null_q95": 0.0,
        "mi_seq_estimate_p_grounded": 1.0,
        "mi_seq_zscore": 0.0,
        "mi_seq_zscore_ci_high": 1e-09,
        "mi_seq_zscore_ci_low": -1e-09,
        "mi_upper_bound": 1.0986122886681098,
        "mi_zscore": 0.0,
        "mi_zscore_ci_high": 1e-09,
        "mi_zscore_ci_low": -1e-09,
        "mi_zscore_ema": 0.0,
        "mi_zscore_ema_ci_high": 1e-09,
        "mi_zscore_ema_ci_low": -1e-09,
        "mi_zscore_ema_null_q95": 0.0,
        "mi_zscore_null_q95": 0.0,
        "num_pairs": 6.0,
        "num_prompts": 3.0,
        "p_grounded": 1.0,
        "reasoning_entropy_est": -0.0,
        "reasoning_entropy_est_ci_high": 1e-09,
        "reasoning_entropy_est_ci_low": -1e-09,
        "reasoning_entropy_seq_est": -0.0,
        "reasoning_entropy_seq_est_ci_high": 1e-09,
        "reasoning_entropy_seq_est_ci_low": -1e-09,
        "retrieval_above_chance": 0.0,
        "retrieval_acc": 0.3333333333333333,
        "retrieval_acc@2": 0.6666666666666666,
        "retrieval_acc@4": 1.0,
        "retrieval_acc@8": 1.0,
        "retrieval_acc_ci_high": 1.0,
        "retrieval_acc_ci_low": 0.3333333333333333,
        "retrieval_acc_null_q95": 0.3333333333333333,
        "retrieval_acc_p_grounded": 1.0,
        "retrieval_chance": 0.3333333333333333,
        "retrieval_chance@2": 0.6666666666666666,
        "retrieval_chance@4": 1.0,
        "retrieval_chance@8": 1.0,
    },
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_proxy_value_interval_and_p_value_is_as_pinned(name):
    got, want = pinned_case(name), PINNED[name]
    assert sorted(got) == sorted(want)
    off = {
        key: (got[key], value)
        for key, value in want.items()
        if not math.isclose(got[key], value, rel_tol=1e-12, abs_tol=1e-12)
    }
    assert not off, off
