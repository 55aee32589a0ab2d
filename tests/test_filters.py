"""SNR filter (docs/methods.md, section 5): known kept sets, loss scaling, drop breakdown,
properties.

Most cases use groups [−a, a] with ddof=0 so the group score (std) is exactly a.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.algos.filters import FILTER_STRATEGIES, FilterConfig, group_scores, snr_filter


def spread(*stds):
    """Groups whose population std (ddof=0) is exactly each given value."""
    return [np.array([-s, s]) for s in stds]


def kept(groups, **cfg):
    return snr_filter(groups, FilterConfig(ddof=0, **cfg)).kept_groups


def test_group_scores_std_var_ddof():
    groups = [np.array([1.0, 0.0, 1.0, 0.0]), np.array([3.0]), np.array([])]
    # {1,0,1,0}: mean .5, Σ(dev²) = 1; ddof 1 -> var 1/3, std 0.5773503; ddof 0 -> std 0.5
    np.testing.assert_allclose(group_scores(groups), [1 / math.sqrt(3), 0.0, 0.0])
    np.testing.assert_allclose(group_scores(groups, "reward_variance"), [1 / 3, 0.0, 0.0])
    np.testing.assert_allclose(group_scores(groups, ddof=0), [0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="non-finite"):
        group_scores([np.array([1.0, np.nan])])
    with pytest.raises(ValueError, match="unknown filter metric"):
        group_scores(groups, "std")


def test_top_p_on_std_and_on_variance_keep_different_groups():
    """The paper's text ranks by reward variance, RAGEN's code by std.  Same ranking, so
    top_k keeps the same groups; top_p keeps a share of the cumulative mass, which squaring
    concentrates on the top group.  stds [2, 3, 1, 2] (ddof 0), ρ = 0.5:
    std mass 8, threshold 3.99: g1 (3; 0 < 3.99), g0 (2; 3 < 3.99), stop (5) -> {0, 1};
    variance [4, 9, 1, 4], mass 18, threshold 8.99: g1 (9), stop (9 ≥ 8.99) -> {1}."""
    groups = spread(2, 3, 1, 2)
    assert kept(groups, strategy="top_p", value=0.5, metric="reward_std") == [0, 1]
    assert kept(groups, strategy="top_p", value=0.5, metric="reward_variance") == [1]
    for metric in ("reward_std", "reward_variance"):
        assert kept(groups, strategy="top_k", value=0.5, metric=metric) == [0, 1]
        assert kept(groups, strategy="top_k_abs", value=3, metric=metric) == [0, 1, 3]
    # min_p compares to the best score: std ≥ 0.5·3 keeps 2, 3, 2; variance ≥ 0.5·9 = 4.5
    # keeps only 9.
    assert kept(groups, strategy="min_p", value=0.5, metric="reward_std") == [0, 1, 3]
    assert kept(groups, strategy="min_p", value=0.5, metric="reward_variance") == [1]
    result = snr_filter(groups, FilterConfig(ddof=0, metric="reward_variance"))
    np.testing.assert_allclose(result.scores, [4.0, 9.0, 1.0, 4.0])


def test_default_metric_is_std_and_old_score_key_still_reads():
    assert FilterConfig().metric == "reward_std"
    assert FilterConfig.model_validate({"score": "var"}).metric == "reward_variance"
    assert FilterConfig.model_validate({"score": "std"}).metric == "reward_std"
    # an old checkpoint's config (score) with a resume's override (metric): the override wins
    both = FilterConfig.model_validate({"score": "std", "metric": "reward_variance"})
    assert both.metric == "reward_variance"
    with pytest.raises(ValueError, match="score must be std or var"):
        FilterConfig.model_validate({"score": "mad"})


def test_linear_top_p_keeps_the_group_that_crosses_the_threshold():
    # scores by group: [2, 4, 1, 3]; Σ = 10; ρ = 0.7 -> threshold 7 − 0.01 = 6.99
    # ranking g1(4), g3(3), g0(2), g2(1); cumulative before adding: 0 < 6.99 keep g1;
    # 4 < 6.99 keep g3; 7 ≥ 6.99 stop -> {1, 3} (mass 7, the shortest prefix reaching 6.99)
    assert kept(spread(2, 4, 1, 3), strategy="top_p", value=0.7) == [1, 3]


def test_linear_top_p_selection_eps():
    # scores [5, 3, 2], Σ = 10, ρ = 0.8005 -> ρΣ = 8.005
    # eps 0.01: threshold 7.995; before g2: 8 ≥ 7.995 stop -> {0, 1}
    assert kept(spread(5, 3, 2), strategy="top_p", value=0.8005) == [0, 1]
    # eps 0: threshold 8.005; before g2: 8 < 8.005 -> keep it too
    assert kept(spread(5, 3, 2), strategy="top_p", value=0.8005, selection_eps=0.0) == [0, 1, 2]
    # ρ = 0.5: threshold 4.99; before g1: 5 ≥ 4.99 -> only the top group
    assert kept(spread(5, 3, 2), strategy="top_p", value=0.5) == [0]


def test_linear_top_p_zero_groups():
    groups = spread(0, 1, 0, 2)  # groups 0 and 2 have zero variance
    # include_zero False: candidates g3(2), g1(1), Σ = 3, ρ = .9 -> 2.69: keep g3 (0<2.69), g1 (2<2.69)
    result = snr_filter(groups, FilterConfig(strategy="top_p", value=0.9, ddof=0))
    assert result.kept_groups == [1, 3]
    assert result.metrics["filter/zero_variance_groups"] == 2.0
    # ρ < 1 with include_zero: the walk stops at the first s ≤ 0, zeros are still dropped
    assert kept(groups, strategy="top_p", value=0.99, include_zero=True) == [1, 3]
    # ρ = 1 keeps every candidate: all groups with include_zero, the nonzero ones without
    assert kept(groups, strategy="top_p", value=1.0, include_zero=True) == [0, 1, 2, 3]
    assert kept(groups, strategy="top_p", value=1.0, include_zero=False) == [1, 3]


def test_all_zero_variance_is_empty_and_counted():
    result = snr_filter(
        [np.ones(4), np.zeros(4)], FilterConfig(strategy="top_p", value=0.9, loss_scaling="linear")
    )
    assert result.kept_groups == []
    assert result.metrics["filter/empty"] == 1.0
    assert result.metrics["filter/kept_ratio"] == 0.0
    assert result.loss_scale == 0.0


def test_softmax_top_p():
    # s = [2, 1, 0.5]: e² = 7.389056, e = 2.718282, e^.5 = 1.648721, Σ = 11.756059
    # p = 0.628532, 0.231224, 0.140244; cumulative 0.628532, 0.859756, 1.0
    groups = spread(1, 2, 0.5)  # group order: s=1 is g0, s=2 is g1, s=0.5 is g2
    assert kept(groups, strategy="top_p", mode="softmax", value=0.6) == [1]  # 0.6285 ≥ 0.6
    assert kept(groups, strategy="top_p", mode="softmax", value=0.8) == [0, 1]  # 0.8598 ≥ 0.8
    assert kept(groups, strategy="top_p", mode="softmax", value=0.9) == [0, 1, 2]


FIVE = spread(0.5, 3, 1, 2, 0)  # scores by group: 0.5, 3, 1, 2, 0 (g4 zero variance)


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (dict(strategy="none"), [0, 1, 2, 3, 4]),  # keeps everything, zeros too
        (dict(strategy="top_k", value=0.5), [1, 3]),  # int(0.5·5) = 2 -> s=3, s=2
        (dict(strategy="top_k", value=0.1), [1]),  # max(1, int(0.5)) = 1
        (dict(strategy="top_k", value=1.0), [0, 1, 2, 3]),  # 5 asked, 4 nonzero candidates
        (dict(strategy="top_k", value=1.0, include_zero=True), [0, 1, 2, 3, 4]),
        (dict(strategy="top_k_abs", value=2), [1, 3]),
        (dict(strategy="top_k_abs", value=2.7), [1, 3]),  # int(2.7) = 2
        (dict(strategy="min_p", value=0.5), [1, 3]),  # s ≥ 0.5·3 = 1.5
        (dict(strategy="min_p", value=0.3), [1, 2, 3]),  # s ≥ 0.9
        (dict(strategy="min_p", value=0.0, include_zero=True), [0, 1, 2, 3, 4]),
    ],
)
def test_strategies_known_kept_sets(cfg, expected):
    assert kept(FIVE, **cfg) == expected


def test_ties_are_broken_by_original_index():
    groups = spread(1, 1, 1, 1)
    assert kept(groups, strategy="top_k_abs", value=2) == [0, 1]
    assert kept(groups, strategy="top_p", value=0.5) == [
        0,
        1,
    ]  # threshold 1.99: keep g0 (0), g1 (1), stop at 2


def test_top_k_fraction_is_not_lost_to_float_rounding():
    groups = spread(*range(1, 101))  # 0.29·100 = 28.999999999999996 in floating point
    assert len(kept(groups, strategy="top_k", value=0.29)) == 29


@pytest.mark.parametrize(
    "scaling, expected", [("none", 1.0), ("linear", 0.4), ("sqrt", math.sqrt(0.4))]
)
def test_loss_scaling(scaling, expected):
    result = snr_filter(
        FIVE, FilterConfig(strategy="top_k", value=0.5, ddof=0, loss_scaling=scaling)
    )
    assert result.kept_groups == [1, 3]  # 2 of 5 groups -> kept ratio 0.4
    assert result.loss_scale == pytest.approx(expected)
    assert result.metrics["filter/loss_scale"] == pytest.approx(expected)
    assert result.metrics["filter/kept_ratio"] == pytest.approx(0.4)
    assert result.metrics["filter/kept_trajectories"] == 4.0


BREAKDOWN = [
    np.array([0.0, 0.0, 0.0]),  # g0 all failed (too hard)
    np.array([1.0, 1.0, 1.0]),  # g1 all succeeded (too easy)
    np.array([0.5, 0.5, 0.5]),  # g2 equal, non-extreme (uninformative)
    np.array([0.0, 1.0, 1.0]),  # g3 high variance: kept
    np.array([0.0, 0.0, 0.1]),  # g4 low but nonzero variance: dropped by the cut
]


def test_breakdown_from_reward_range():
    result = snr_filter(
        BREAKDOWN, FilterConfig(strategy="top_k_abs", value=1), reward_range=(0.0, 1.0)
    )
    m = result.metrics
    assert result.kept_groups == [3]
    assert (
        m["filter/dropped_all_failed"],
        m["filter/dropped_all_succeeded"],
        m["filter/dropped_uninformative"],
        m["filter/dropped_nonzero_variance"],
        m["filter/dropped_unclassified"],
    ) == (1.0, 1.0, 1.0, 1.0, 0.0)
    assert m["filter/zero_variance_groups"] == 3.0


def test_breakdown_from_success_flags_takes_precedence():
    success = [
        np.zeros(3, bool),
        np.ones(3, bool),
        np.ones(3, bool),
        np.array([0, 1, 1], bool),
        np.array([0, 0, 1], bool),
    ]
    # g2 reward 0.5 everywhere but every trajectory flagged successful -> "all succeeded"
    m = snr_filter(
        BREAKDOWN,
        FilterConfig(strategy="top_k_abs", value=1),
        success=success,
        reward_range=(0.0, 1.0),
    ).metrics
    assert (
        m["filter/dropped_all_failed"],
        m["filter/dropped_all_succeeded"],
        m["filter/dropped_uninformative"],
    ) == (1.0, 2.0, 0.0)
    success[2] = np.array([1, 0, 0], bool)  # mixed flags under equal rewards -> uninformative
    m = snr_filter(BREAKDOWN, FilterConfig(strategy="top_k_abs", value=1), success=success).metrics
    assert m["filter/dropped_uninformative"] == 1.0


def test_breakdown_without_success_information_is_unclassified():
    m = snr_filter(BREAKDOWN, FilterConfig(strategy="top_k_abs", value=1)).metrics
    assert m["filter/dropped_unclassified"] == 3.0
    assert m["filter/dropped_all_failed"] == m["filter/dropped_all_succeeded"] == 0.0


def test_config_errors_name_the_field_and_valid_values():
    with pytest.raises(ValueError, match="top_k_abs"):
        FilterConfig(strategy="top_q")
    with pytest.raises(ValueError, match="softmax"):
        FilterConfig(mode="cosine")
    with pytest.raises(ValueError, match="group count"):
        FilterConfig(strategy="top_k_abs", value=0.5)
    with pytest.raises(ValueError, match="stratgy"):
        snr_filter(FIVE, stratgy="none")  # typo in an override
    assert snr_filter(FIVE, strategy="none").kept_groups == [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------- properties

rewards_st = st.lists(
    st.lists(
        st.sampled_from([0.0, 0.1, 0.5, 1.0]) | st.floats(-100, 100, allow_nan=False), max_size=6
    ),
    max_size=12,
)


def _config(strategy, value, **rest):
    # top_k_abs takes a group count ≥ 1; the others a fraction/ratio in [0, 1] (value > 1
    # is refused since the run config and the filter share one schema; 1 keeps all)
    return FilterConfig(
        strategy=strategy,
        value=1 + 4 * value if strategy == "top_k_abs" else min(value, 1.0),
        **rest,
    )


config_st = st.builds(
    _config,
    strategy=st.sampled_from(sorted(FILTER_STRATEGIES)),
    value=st.floats(0.0, 1.5),
    mode=st.sampled_from(["linear", "softmax"]),
    metric=st.sampled_from(["reward_std", "reward_variance"]),
    ddof=st.integers(0, 2),
    include_zero=st.booleans(),
    loss_scaling=st.sampled_from(["none", "linear", "sqrt"]),
)


@settings(max_examples=200, deadline=None)
@given(rewards_st, config_st, st.booleans())
def test_filter_invariants(rewards, cfg, with_range):
    groups = [np.array(r) for r in rewards]
    result = snr_filter(groups, cfg, reward_range=(0.0, 1.0) if with_range else None)
    n = len(groups)
    m = result.metrics
    assert result.kept_groups == sorted(set(result.kept_groups))
    assert all(0 <= g < n for g in result.kept_groups)
    assert m["filter/kept_groups"] == len(result.kept_groups)
    assert m["filter/empty"] == float(not result.kept_groups)
    assert 0.0 <= result.loss_scale <= 1.0
    dropped = sum(
        m[k]
        for k in (
            "filter/dropped_all_failed",
            "filter/dropped_all_succeeded",
            "filter/dropped_uninformative",
            "filter/dropped_unclassified",
            "filter/dropped_nonzero_variance",
        )
    )
    assert dropped + len(result.kept_groups) == n
    # ranking strategies keep a prefix: no dropped candidate outscores a kept group
    candidates = [g for g in range(n) if cfg.include_zero or result.scores[g] > cfg.zero_tol]
    if cfg.strategy != "none" and result.kept_groups:
        lowest_kept = min(result.scores[g] for g in result.kept_groups)
        assert all(
            result.scores[g] <= lowest_kept for g in candidates if g not in result.kept_groups
        )
    if not cfg.include_zero and cfg.strategy != "none":
        assert all(result.scores[g] > cfg.zero_tol for g in result.kept_groups)


@settings(max_examples=100, deadline=None)
@given(rewards_st, st.sampled_from(["linear", "softmax"]), st.booleans())
def test_top_p_rho_one_keeps_all_nonzero_groups(rewards, mode, include_zero):
    groups = [np.array(r) for r in rewards]
    result = snr_filter(
        groups, FilterConfig(strategy="top_p", value=1.0, mode=mode, include_zero=include_zero)
    )
    nonzero = [g for g in range(len(groups)) if result.scores[g] > 1e-10]
    assert result.kept_groups == (list(range(len(groups))) if include_zero else nonzero)


@settings(max_examples=100, deadline=None)
@given(rewards_st, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_linear_top_p_is_monotone_and_reaches_its_mass(rewards, rho_a, rho_b):
    groups = [np.array(r) for r in rewards]
    low, high = sorted((rho_a, rho_b))
    small = snr_filter(groups, FilterConfig(strategy="top_p", value=low))
    large = snr_filter(groups, FilterConfig(strategy="top_p", value=high))
    assert set(small.kept_groups) <= set(large.kept_groups)
    total = small.scores.sum()
    if large.kept_groups and high < 1.0:
        assert large.scores[large.kept_groups].sum() >= high * total - 0.01 - 1e-9


def test_paper_loss_rescaling_scales_the_task_loss_by_the_kept_ratio():
    """The paper shrinks the minibatch by the keep rate and scales the per-step loss by it
    (``loss_scaling: linear``).  8 groups, top_k_abs keeps 2 -> kept ratio 0.25, scale 0.25.
    The update multiplies the kept advantages by it (platform/run/trainer.py); the PPO loss is
    positively homogeneous in A (clipped or not), so the task loss and its gradient are
    exactly 0.25 x the unscaled ones while the regulariser is untouched.  By hand, token-mean
    over 4 tokens, A = [1, 1 | 0.5, 0.5] x 0.25, ratios [1.5, 1 | 1, 1] (1.5 clipped at
    1 + 0.28): task = −0.25·(1.28 + 1 + 0.5 + 0.5)/4 = −0.205; entropy bonus 0.01 on
    entropy 2 per token: reg = −0.02."""
    import torch

    from tether.algos.losses import ppo_objective

    groups = spread(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    result = snr_filter(
        groups, FilterConfig(strategy="top_k_abs", value=2, ddof=0, loss_scaling="linear")
    )
    assert result.kept_groups == [6, 7] and result.loss_scale == 0.25
    old = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    advantages = torch.tensor([[1.0, 1.0], [0.5, 0.5]], dtype=torch.float64)
    entropy = torch.full((2, 2), 2.0, dtype=torch.float64)

    def losses(scale):
        logprobs = torch.tensor(
            [[math.log(1.5), 0.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True
        )
        task, reg, _ = ppo_objective(
            logprobs, old, advantages * scale, mask, entropy=entropy, entropy_coef=0.01
        )
        task.backward()
        return float(task), float(reg), logprobs.grad.clone()

    task, reg, grad = losses(result.loss_scale)
    task_1, reg_1, grad_1 = losses(1.0)
    assert task == pytest.approx(-0.25 * (1.28 + 1 + 0.5 + 0.5) / 4) == pytest.approx(-0.205)
    assert task == pytest.approx(0.25 * task_1)
    assert reg == reg_1 == pytest.approx(-0.02)
    torch.testing.assert_close(grad, 0.25 * grad_1)
    # unclipped tokens: d task / d logprob = −A·ratio / 4 tokens
    assert float(grad[1, 0]) == pytest.approx(-0.25 * 0.5 / 4)


def test_zero_variance_causes_count_every_group_kept_or_not():
    """The mechanism's count (issue 70): with strategy none nothing is dropped, yet the
    zero-variance groups are still counted by cause; with a cut, kept and dropped alike."""
    success = [
        np.zeros(3, bool),
        np.ones(3, bool),
        np.array([0, 1, 0], bool),
        np.array([0, 1, 1], bool),
        np.array([0, 0, 1], bool),
    ]
    for cfg in (FilterConfig(strategy="none"), FilterConfig(strategy="top_k_abs", value=1)):
        m = snr_filter(BREAKDOWN, cfg, success=success).metrics
        assert (
            m["filter/zero_variance_all_failed"],
            m["filter/zero_variance_all_succeeded"],
            m["filter/zero_variance_uninformative"],
            m["filter/zero_variance_unclassified"],
        ) == (1.0, 1.0, 1.0, 0.0)
    m = snr_filter(BREAKDOWN, FilterConfig(strategy="none"), success=success).metrics
    assert m["filter/dropped_all_failed"] == m["filter/dropped_uninformative"] == 0.0
    kept_zero = FilterConfig(strategy="top_k_abs", value=5, include_zero=True)
    m = snr_filter(BREAKDOWN, kept_zero, reward_range=(0.0, 1.0)).metrics
    assert m["filter/zero_variance_all_failed"] == 1.0 and m["filter/dropped_all_failed"] == 0.0


# --------------------------------------------------------------------------- reward: outcome

#: Four groups of four in FrozenLake's shape (+1 at the goal, −0.1 per format penalty).
#: g0 and g2: every episode failed, their format penalties differ (shaped spread, no
#: outcome spread); g1: two of four succeeded; g3: every episode succeeded.
PENALISED = [
    np.array([-0.1, 0.0, -0.2, 0.0]),  # g0 all failed; shaped std 0.0957
    np.array([1.0, 0.0, 1.0, -0.1]),  # g1 half succeeded; shaped std 0.6076
    np.array([0.0, -0.3, 0.0, 0.0]),  # g2 all failed; shaped std 0.15
    np.array([1.0, 1.0, 1.0, 1.0]),  # g3 all succeeded; no spread on either
]
PENALISED_SUCCESS = [
    np.zeros(4, bool),
    np.array([1, 0, 1, 0], bool),
    np.zeros(4, bool),
    np.ones(4, bool),
]


def test_all_failed_groups_with_differing_penalties_are_kept_on_shaped_dropped_on_outcome():
    """Issue 71: on the shaped reward an all-failed group whose format penalties differ
    has spread and trains; on the outcome it scores 0 and is dropped.  top_p ρ = 1 keeps
    every candidate, i.e. every group scoring above zero_tol.  By hand (ddof 1): shaped
    g0 [−.1, 0, −.2, 0]: mean −.075, Σdev² = .0275, std √(.0275/3) = 0.09574; g1
    [1, 0, 1, −.1]: mean .475, Σdev² = 1.1075, std 0.60759; g2 [0, −.3, 0, 0]: Σdev² =
    .0675, std 0.15; g3 0.  Outcome g1 [1, 0, 1, 0]: Σdev² = 1, std 1/√3; the rest 0."""
    keep_all = {"strategy": "top_p", "value": 1.0}
    shaped = snr_filter(PENALISED, FilterConfig(**keep_all), success=PENALISED_SUCCESS)
    outcome = snr_filter(
        PENALISED, FilterConfig(reward="outcome", **keep_all), success=PENALISED_SUCCESS
    )
    np.testing.assert_allclose(
        shaped.scores, [math.sqrt(0.0275 / 3), math.sqrt(1.1075 / 3), 0.15, 0.0]
    )
    np.testing.assert_allclose(outcome.scores, [0.0, 1 / math.sqrt(3), 0.0, 0.0])
    assert shaped.kept_groups == [0, 1, 2]
    assert outcome.kept_groups == [1]
    assert shaped.metrics["filter/kept_all_failed_outcome"] == 2.0
    assert outcome.metrics["filter/kept_all_failed_outcome"] == 0.0
    # the breakdown follows the score ranked: on the outcome g0 and g2 are zero-variance,
    # all failed, and dropped as such (on the shaped reward only g3 is zero-variance)
    assert shaped.metrics["filter/zero_variance_groups"] == 1.0
    assert shaped.metrics["filter/dropped_all_succeeded"] == 1.0
    assert shaped.metrics["filter/dropped_all_failed"] == 0.0
    assert outcome.metrics["filter/zero_variance_groups"] == 3.0
    assert outcome.metrics["filter/dropped_all_failed"] == 2.0
    assert outcome.metrics["filter/zero_variance_all_failed"] == 2.0
    assert outcome.metrics["filter/dropped_all_succeeded"] == 1.0
    assert outcome.metrics["filter/kept_score_mean"] == pytest.approx(1 / math.sqrt(3))
    # the same cut on variance: the outcome's scores are the squares
    var = snr_filter(
        PENALISED,
        FilterConfig(reward="outcome", metric="reward_variance", **keep_all),
        success=PENALISED_SUCCESS,
    )
    np.testing.assert_allclose(var.scores, [0.0, 1 / 3, 0.0, 0.0])
    assert var.kept_groups == [1]


def test_default_top_p_on_outcome_drops_the_all_failed_groups():
    """The quickstart's filter (top_p 0.9 on std): shaped threshold 0.9·0.85334 − 0.01 =
    0.75800; g1 (0 before it), g2 (0.60759 < 0.758), g0 (0.75759 < 0.758) are all kept;
    on the outcome only g1 has a score."""
    shaped = snr_filter(PENALISED, success=PENALISED_SUCCESS)
    outcome = snr_filter(PENALISED, reward="outcome", success=PENALISED_SUCCESS)
    assert shaped.kept_groups == [0, 1, 2]
    assert shaped.metrics["filter/kept_all_failed_outcome"] == 2.0
    assert outcome.kept_groups == [1]
    assert outcome.metrics["filter/kept_all_failed_outcome"] == 0.0


def test_default_reward_is_shaped_and_changes_nothing():
    assert FilterConfig().reward == "shaped"
    for cfg in (FilterConfig(), FilterConfig(strategy="top_k_abs", value=1)):
        implicit = snr_filter(PENALISED, cfg, success=PENALISED_SUCCESS)
        explicit = snr_filter(
            PENALISED, cfg.model_copy(update={"reward": "shaped"}), success=PENALISED_SUCCESS
        )
        assert implicit.kept_groups == explicit.kept_groups
        assert implicit.metrics == explicit.metrics
        np.testing.assert_array_equal(implicit.scores, group_scores(PENALISED))
    # the shaped score does not read the success flags
    without_flags = snr_filter(PENALISED)
    np.testing.assert_array_equal(without_flags.scores, group_scores(PENALISED))
    assert without_flags.kept_groups == [0, 1, 2]


def test_kept_all_failed_outcome_counts_only_kept_all_failed_groups():
    # BREAKDOWN's flags: g0 all failed (zero variance), g4 all failed with reward spread
    success = [
        np.zeros(3, bool),
        np.ones(3, bool),
        np.array([1, 0, 0], bool),
        np.array([0, 1, 1], bool),
        np.zeros(3, bool),
    ]
    count = "filter/kept_all_failed_outcome"
    m = snr_filter(BREAKDOWN, FilterConfig(strategy="none"), success=success).metrics
    assert m[count] == 2.0  # g0 and g4, both kept
    m = snr_filter(BREAKDOWN, FilterConfig(strategy="top_k_abs", value=1), success=success).metrics
    assert m[count] == 0.0  # only g3 kept
    m = snr_filter(BREAKDOWN, FilterConfig(strategy="top_k_abs", value=2), success=success).metrics
    assert m[count] == 1.0  # g3 and g4 kept
    # on the outcome an all-failed group scores 0: kept only with zero-score groups eligible
    outcome = FilterConfig(reward="outcome", strategy="top_k_abs", value=5, include_zero=True)
    m = snr_filter(BREAKDOWN, outcome, success=success).metrics
    assert m[count] == 2.0
    r = snr_filter(BREAKDOWN, outcome.model_copy(update={"include_zero": False}), success=success)
    assert r.kept_groups == [2, 3] and r.metrics[count] == 0.0
    # without flags, from the env's reward range (all rewards at its minimum), else unknown
    kept_zero = FilterConfig(strategy="top_k_abs", value=5, include_zero=True)
    assert snr_filter(BREAKDOWN, kept_zero, reward_range=(0.0, 1.0)).metrics[count] == 1.0
    assert snr_filter(BREAKDOWN, kept_zero).metrics[count] == 0.0


def test_outcome_needs_one_success_flag_per_trajectory():
    with pytest.raises(ValueError, match="needs the success flags"):
        snr_filter(PENALISED, reward="outcome")
    short = [*PENALISED_SUCCESS[:3], np.ones(3, bool)]
    with pytest.raises(ValueError, match="group 3 has 3 success flags for 4 trajectories"):
        snr_filter(PENALISED, reward="outcome", success=short)
    with pytest.raises(ValueError, match="outcome"):
        FilterConfig(reward="task")


@settings(max_examples=100, deadline=None)
@given(rewards_st, config_st, st.randoms(use_true_random=False))
def test_outcome_scores_are_the_spread_of_the_success_flags(rewards, cfg, rng):
    groups = [np.array(r) for r in rewards]
    success = [np.array([rng.random() < 0.5 for _ in r], bool) for r in rewards]
    outcome_cfg = cfg.model_copy(update={"reward": "outcome"})
    result = snr_filter(groups, outcome_cfg, success=success)
    flags = [s.astype(np.float64) for s in success]
    np.testing.assert_array_equal(result.scores, group_scores(flags, cfg.metric, cfg.ddof))
    # the same selection as the shaped filter run on the flags themselves as rewards
    on_flags = snr_filter(flags, cfg, success=success)
    assert result.kept_groups == on_flags.kept_groups
    assert result.metrics["filter/kept_groups"] == on_flags.metrics["filter/kept_groups"]
    if cfg.strategy != "none" and not cfg.include_zero:
        assert result.metrics["filter/kept_all_failed_outcome"] == 0.0


def test_the_iteration_stage_scores_on_the_trajectories_success_flags():
    """``platform.stages.filter_groups`` (what the trainer calls) hands each trajectory's
    success flag to the filter: the outcome setting ranks on it, the reward is untouched."""
    from tether.agent.types import Trajectory, Turn
    from tether.platform.run.stages import filter_groups

    def episode(group, k, reward, success):
        turn = Turn(0, 0, 0, "", "", None, None, True, True, reward)
        return Trajectory(group, group, k, turns=[turn], success=success)

    trajectories = [
        episode(g, k, float(r), bool(s))
        for g, (rewards, flags) in enumerate(zip(PENALISED, PENALISED_SUCCESS, strict=True))
        for k, (r, s) in enumerate(zip(rewards, flags, strict=True))
    ]
    shaped, shaped_ids = filter_groups(trajectories, FilterConfig())
    outcome, outcome_ids = filter_groups(trajectories, FilterConfig(reward="outcome"))
    assert shaped_ids == {0, 1, 2} and outcome_ids == {1}
    assert shaped.metrics["filter/kept_all_failed_outcome"] == 2.0
    assert outcome.metrics["filter/kept_all_failed_outcome"] == 0.0
    assert [t.reward for t in trajectories[4:8]] == [1.0, 0.0, 1.0, -0.1]
