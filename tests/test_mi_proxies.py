"""MI proxies on hand-built cross-score matrices (docs/methods.md, section 2)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.diagnostics.mi import (
    MULTI_COLUMN_KEYS,
    mi_by_column,
    mi_proxies,
    prefixed,
    prompt_columns,
    valid_reasoning_rate,
)
from tether.diagnostics.proxies import ONE_PROMPT_KEYS


def identity_like(column, n, off=-50.0):
    """Each reasoning scores 0 under its own prompt and `off` under every other."""
    L = np.full((len(column), n), off)
    L[np.arange(len(column)), column] = 0.0
    return L


def assert_finite(metrics):
    assert all(math.isfinite(v) for v in metrics.values()), metrics


def test_two_by_two_by_hand():
    L = np.log(np.array([[0.9, 0.1], [0.2, 0.8]]))
    S = 10 * L
    m, _ = mi_proxies(L, S, np.array([0, 1]))
    matched = np.log([0.9, 0.8])
    marginal = np.log([1.0, 1.0]) - np.log(2)
    assert m["mi_estimate"] == pytest.approx(matched.mean() - marginal.mean())
    assert m["mi_estimate"] == pytest.approx(0.5 * (np.log(1.8) + np.log(1.6)))
    assert m["conditional_entropy_est"] == pytest.approx(-matched.mean())
    assert m["reasoning_entropy_est"] == pytest.approx(np.log(2))
    # S = 10 L: matched 10 log p, marginal logsumexp(10 log p) - log 2.
    seq_marg = np.log([0.9**10 + 0.1**10, 0.2**10 + 0.8**10]) - np.log(2)
    assert m["mi_seq_estimate"] == pytest.approx((10 * matched - seq_marg).mean())
    assert m["conditional_entropy_seq_est"] == pytest.approx(-10 * matched.mean())
    assert m["reasoning_entropy_seq_est"] == pytest.approx(-seq_marg.mean())
    gap = matched - marginal
    assert m["mi_zscore"] == pytest.approx((gap / (marginal.std() + 1e-3)).mean())
    assert m["retrieval_acc"] == 1.0 and m["retrieval_chance"] == 0.5
    assert m["mi_upper_bound"] == pytest.approx(np.log(2))


def test_mi_seq_zscore_by_hand():
    """MI-ZScore (Seq): mi_zscore's formula on the sequence scores S, with S's own
    std(marginal).  S = log p with p = [[.6, .2], [.3, .1], [.1, .5]], pairs 0, 1 of prompt 0:
    marginal_i = log(mean_j p_ij) = log .4, log .2, log .3 (population std 0.284335);
    matched − marginal = log(.6/.4), log(.3/.2), log(.5/.3) = 0.405465, 0.405465, 0.510826;
    z = mean(gap / (0.284335 + 0.001)) = 1.544100.  The per-token z-score is left as it was."""
    S = np.log(np.array([[0.6, 0.2], [0.3, 0.1], [0.1, 0.5]]))
    L = S / np.array([[4.0], [2.0], [5.0]])  # any lengths: L does not enter the Seq z-score
    m, _ = mi_proxies(L, S, np.array([0, 0, 1]))
    assert m["marginal_seq_std"] == pytest.approx(0.28433469, abs=1e-8)
    assert m["mi_seq_zscore"] == pytest.approx(1.54409995, abs=1e-7)
    marginal_l = np.log(np.exp(L).mean(axis=1))
    gap_l = L[np.arange(3), [0, 0, 1]] - marginal_l
    assert m["mi_zscore"] == pytest.approx((gap_l / (marginal_l.std() + 1e-3)).mean())
    assert m["mi_seq_estimate"] == pytest.approx(np.mean([0.405465, 0.405465, 0.510826]), abs=1e-6)


def test_mi_by_column_splits_mi_estimate_by_prompt():
    """Per prompt, the mean of matched − marginal over its pairs (finding d's prompt-level
    MI).  L = log p, p = [[.6, .2], [.3, .1], [.1, .5]], pairs 0, 1 of prompt 0:
    prompt 0: (log(.6/.4) + log(.3/.2)) / 2 = log 1.5 = 0.405465; prompt 1: log(.5/.3) =
    0.510826; pair-weighted mean (2·0.405465 + 0.510826) / 3 = mi_estimate."""
    L = np.log(np.array([[0.6, 0.2], [0.3, 0.1], [0.1, 0.5]]))
    column = np.array([0, 0, 1])
    mi, pairs = mi_by_column(L, column)
    np.testing.assert_allclose(mi, [np.log(1.5), np.log(5 / 3)])
    np.testing.assert_array_equal(pairs, [2, 1])
    m, _ = mi_proxies(L, L, column)
    assert (pairs * mi).sum() / 3 == pytest.approx(m["mi_estimate"])
    # A column no pair belongs to has no value (NaN), not 0.
    mi, pairs = mi_by_column(np.hstack([L, np.full((3, 1), -9.0)]), column)
    assert math.isnan(mi[2]) and pairs[2] == 0


def test_identity_like_gives_perfect_retrieval_and_mi_log_n():
    column = np.repeat(np.arange(8), 4)  # 8 prompts x 4 samples
    L = identity_like(column, 8)
    m, _ = mi_proxies(L, L, column)
    assert m["retrieval_acc"] == 1.0
    assert m["retrieval_chance"] == pytest.approx(1 / 8)
    assert m["retrieval_above_chance"] == pytest.approx(7 / 8)
    assert m["mi_estimate"] == pytest.approx(np.log(8), abs=1e-6)
    assert m["mi_seq_estimate"] == pytest.approx(np.log(8), abs=1e-6)
    assert m["num_pairs"] == 32 and m["num_prompts"] == 8
    for k in (2, 4, 8):
        assert m[f"retrieval_acc@{k}"] == 1.0
        assert m[f"retrieval_chance@{k}"] == pytest.approx(min(1.0, k / 8))


def test_constant_matrix_is_at_chance_with_zero_mi():
    column = np.repeat(np.arange(4), 3)
    L = np.full((12, 4), -2.5)
    m, _ = mi_proxies(L, 40 * L, column)
    assert m["mi_estimate"] == pytest.approx(0.0, abs=1e-12)
    assert m["mi_seq_estimate"] == pytest.approx(0.0, abs=1e-12)
    assert m["mi_zscore"] == pytest.approx(0.0, abs=1e-12)
    assert m["retrieval_acc"] == pytest.approx(0.25)  # ties broken uniformly, not to column 0
    assert m["retrieval_chance"] == pytest.approx(0.25)
    assert m["retrieval_above_chance"] == pytest.approx(0.0, abs=1e-12)
    assert m["retrieval_acc@2"] == pytest.approx(0.5)
    assert m["retrieval_acc@8"] == 1.0 and m["retrieval_chance@8"] == 1.0
    assert m["conditional_entropy_est"] == pytest.approx(2.5)
    assert m["reasoning_entropy_est"] == pytest.approx(2.5)


def test_top_k_uses_the_rank_of_the_own_column():
    column = np.arange(8)
    L = np.array([np.roll(-np.arange(8.0), j) for j in range(8)])  # row j: own column j is the best
    L[0] = [-2.0, 0.0, -1.0, -3.0, -4.0, -5.0, -6.0, -7.0]  # row 0: own column is third
    m, _ = mi_proxies(L, L, column)
    assert m["retrieval_acc"] == pytest.approx(7 / 8)
    assert m["retrieval_acc@2"] == pytest.approx(7 / 8)
    assert m["retrieval_acc@4"] == 1.0 and m["retrieval_acc@8"] == 1.0


def test_ties_give_fractional_credit():
    L = np.array([[0.0, 0.0, -1.0], [-1.0, 0.0, -5.0], [-3.0, -3.0, -3.0]])
    m, _ = mi_proxies(L, L, np.array([0, 1, 2]))
    assert m["retrieval_acc"] == pytest.approx((0.5 + 1.0 + 1 / 3) / 3)
    assert m["retrieval_acc@2"] == pytest.approx((1.0 + 1.0 + 2 / 3) / 3)


def test_duplicated_prompts_share_a_column():
    prompts = [(1, 2, 3), (4, 5), (1, 2, 3), (4, 5), (1, 2, 3)]
    column, distinct = prompt_columns(prompts)
    assert column.tolist() == [0, 1, 0, 1, 0]
    assert distinct == [(1, 2, 3), (4, 5)]
    L = identity_like(column, 2)
    m, _ = mi_proxies(L, L, column)
    assert m["num_prompts"] == 2
    assert m["retrieval_chance"] == pytest.approx((3 * 3 / 5 + 2 * 2 / 5) / 5)
    assert m["retrieval_acc"] == 1.0
    assert m["mi_estimate"] == pytest.approx(np.log(2), abs=1e-6)


def test_ema_recurrence_step_by_step():
    rng = np.random.default_rng(3)
    column = np.repeat(np.arange(3), 4)
    state = None
    sigma_ema = None
    for step in range(4):
        L = rng.normal(-3, 1 + step, size=(12, 3))
        m, state = mi_proxies(L, L, column, state)
        marginal = np.log(np.exp(L).sum(1)) - np.log(3)
        matched = L[np.arange(12), column]
        std = marginal.std()
        sigma_ema = std if sigma_ema is None else 0.9 * sigma_ema + 0.1 * std
        assert state["sigma"] == pytest.approx(sigma_ema)
        assert state["updates"] == step + 1
        assert m["marginal_std"] == pytest.approx(std)
        assert m["marginal_std_ema"] == pytest.approx(sigma_ema)
        assert m["mi_zscore_ema"] == pytest.approx(
            ((matched - marginal) / (sigma_ema + 1e-3)).mean()
        )
        if step == 0:
            assert m["mi_zscore_ema"] == pytest.approx(m["mi_zscore"])
        else:
            assert m["mi_zscore_ema"] != pytest.approx(m["mi_zscore"])


def test_single_prompt_has_no_mi_keys_and_no_nan():
    L = np.array([[-1.0], [-2.0], [-4.0]])
    state = {"sigma": 0.7, "updates": 3}
    m, new_state = mi_proxies(L, 5 * L, np.zeros(3, dtype=int), state)
    assert not set(MULTI_COLUMN_KEYS) & set(m)
    assert set(ONE_PROMPT_KEYS) <= set(m)
    assert m["conditional_entropy_est"] == pytest.approx(7 / 3)
    assert new_state == state  # EMA does not advance without MI
    assert_finite(m)


def test_no_pairs_gives_only_counts():
    m, state = mi_proxies(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0, dtype=int))
    assert m == {"num_pairs": 0.0, "num_prompts": 3.0}
    assert state is None
    m, _ = mi_proxies(np.zeros((0, 0)), np.zeros((0, 0)), np.zeros(0, dtype=int))
    assert m == {"num_pairs": 0.0, "num_prompts": 0.0}


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="equal shape"):
        mi_proxies(np.zeros((2, 2)), np.zeros((2, 3)), np.array([0, 1]))
    with pytest.raises(ValueError, match="column"):
        mi_proxies(np.zeros((2, 2)), np.zeros((2, 2)), np.array([0, 2]))
    with pytest.raises(ValueError, match="non-finite"):
        mi_proxies(np.array([[0.0, np.nan]]), np.zeros((1, 2)), np.array([0]))


def test_valid_reasoning_rate_and_prefix():
    assert valid_reasoning_rate([[1], [], [2, 3], []]) == 0.5
    assert valid_reasoning_rate([]) is None
    assert prefixed({"mi_estimate": 1.0}, "collapse/first_turn") == {
        "collapse/first_turn/mi_estimate": 1.0
    }


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_bounds_and_row_shift_invariance(m, n, seed):
    rng = np.random.default_rng(seed)
    column = rng.integers(0, n, size=m)
    L = rng.normal(-4, 3, size=(m, n))
    metrics, _ = mi_proxies(L, L * 7, column)
    assert_finite(metrics)
    if n >= 2:
        assert metrics["mi_estimate"] <= np.log(n) + 1e-9  # per-pair gap <= log N
        assert 0.0 <= metrics["retrieval_acc"] <= 1.0
        assert (
            metrics["retrieval_acc"]
            <= metrics["retrieval_acc@2"]
            <= metrics["retrieval_acc@4"] + 1e-12
        )
        # A per-reasoning constant (e.g. its length normalisation) changes neither MI nor retrieval.
        shifted, _ = mi_proxies(L + rng.normal(size=(m, 1)), L * 7, column)
        assert shifted["mi_estimate"] == pytest.approx(metrics["mi_estimate"], abs=1e-9)
        assert shifted["retrieval_acc"] == pytest.approx(metrics["retrieval_acc"])


def test_prompt_mi_goes_to_the_groups_whose_first_turn_is_the_column():
    """The first-turn matrix has one column per level; each group gets its column's
    pointwise MI and pair count (runner.prompt_mi_by_group), a group whose first prompt
    was not scored gets nothing, and groups with identical first prompts share one."""
    from types import SimpleNamespace

    from tether.diagnostics.runner import prompt_mi_by_group

    def turn(prompt):
        return SimpleNamespace(prompt_ids=prompt, reasoning_ids=(9,), action_ids=())

    trajectories = [SimpleNamespace(group_id=g) for g in (0, 0, 1, 2, 3)]
    spans = [[turn((1, 2))], [turn((1, 2))], [turn((3,))], [turn((4,))], [turn((1, 2))]]
    L = np.log(np.array([[0.6, 0.2], [0.3, 0.1], [0.1, 0.5]]))  # pairs: (1, 2) twice, (3,)
    out = prompt_mi_by_group(trajectories, spans, [(1, 2), (3,)], L, np.array([0, 0, 1]))
    assert out == {
        0: {"mi": pytest.approx(np.log(1.5)), "pairs": 2.0},
        1: {"mi": pytest.approx(np.log(5 / 3)), "pairs": 1.0},
        3: {"mi": pytest.approx(np.log(1.5)), "pairs": 2.0},
    }
