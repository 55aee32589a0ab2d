"""The verdict rules of docs/reproduction.md's protocol: power, Holm, the two tests."""

import math

import numpy as np
import pytest
from scipy import stats

from tether.analysis.decide import (
    NOT_REPRODUCED,
    REPRODUCED,
    UNDECIDED,
    decide,
    holm,
    paired_effect,
    paired_power,
    seeds_needed,
)


@pytest.mark.parametrize("n,effect,sd", [(6, 0.1, 0.12), (10, 0.05, 0.05), (12, 0.2, 0.5)])
def test_paired_power_matches_simulated_t_tests(n, effect, sd):
    """Known answer by simulation: 20,000 sets of n normal differences, the share whose
    one-sided t-test rejects at 0.05 (its standard error <= 0.0036)."""
    rng = np.random.default_rng(n)
    d = rng.normal(effect, sd, (20_000, n))
    p = stats.ttest_1samp(d, 0.0, axis=1, alternative="greater").pvalue
    assert paired_power(n, effect, sd) == pytest.approx(float((p < 0.05).mean()), abs=0.012)


def test_seeds_needed_is_the_first_n_that_reaches_the_power():
    n = seeds_needed(0.1, 0.12, power=0.8)
    assert paired_power(n, 0.1, 0.12) >= 0.8 > paired_power(n - 1, 0.1, 0.12)
    assert seeds_needed(0.001, 1.0, most=50) is None


def test_holm_adjusts_step_down_and_keeps_order():
    out = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": math.nan})
    assert out["a"] == pytest.approx(0.03)
    assert out["c"] == pytest.approx(0.06)  # 0.03 x 2
    assert out["b"] == pytest.approx(0.06)  # 0.04 x 1, raised to keep the order
    assert math.isnan(out["d"])


def test_paired_effect_p_values_are_the_one_sided_t_tests():
    diffs = [0.3, -0.1, 0.2, 0.25, 0.05, 0.15]
    t = paired_effect(diffs, direction=1, sesoi=0.2)
    assert t["p_paper"] == pytest.approx(
        stats.ttest_1samp(diffs, 0.0, alternative="greater").pvalue
    )
    assert t["p_short"] == pytest.approx(stats.ttest_1samp(diffs, 0.2, alternative="less").pvalue)
    low, high = stats.t.interval(0.95, 5, loc=np.mean(diffs), scale=stats.sem(diffs))
    assert (t["ci_low"], t["ci_high"]) == pytest.approx((low, high))
    # The paper's direction negative: the same numbers, mirrored.
    m = paired_effect([-x for x in diffs], direction=-1, sesoi=0.2)
    assert m["p_paper"] == pytest.approx(t["p_paper"]) and m["p_short"] == pytest.approx(
        t["p_short"]
    )


def test_each_verdict_on_a_known_answer():
    rng = np.random.default_rng(3)
    tests = {
        "large": paired_effect(rng.normal(0.3, 0.05, 10), 1, 0.1),
        "none": paired_effect(rng.normal(0.0, 0.02, 10), 1, 0.1),
        "noisy": paired_effect(rng.normal(0.05, 0.5, 4), 1, 0.1),
        "wrong_way": paired_effect(rng.normal(0.3, 0.05, 10), -1, 0.1),
    }
    out = decide(tests)
    assert out["large"]["verdict"] == REPRODUCED
    assert out["none"]["verdict"] == NOT_REPRODUCED
    assert out["wrong_way"]["verdict"] == NOT_REPRODUCED
    assert out["noisy"]["verdict"] == UNDECIDED
    assert "power" in out["noisy"]["because"] and out["noisy"]["power_holm"] < out["noisy"]["power"]
    assert decide({"one": paired_effect([0.5], 1, 0.1)})["one"]["verdict"] is None


def test_holm_can_turn_a_single_test_verdict_undecided():
    """p 0.03 alone reproduces; beside three tests with p ~ 1 Holm multiplies it by 4."""
    diffs = [0.12, 0.02, 0.15, -0.03, 0.11, 0.09]
    alone = decide({"x": paired_effect(diffs, 1, 0.3)})["x"]
    assert alone["p_paper"] < 0.05 and alone["verdict"] == REPRODUCED
    flat = [0.0, 0.01, -0.01, 0.02, -0.02, 0.0]
    family = {"x": paired_effect(diffs, 1, 0.3), **{k: paired_effect(flat, 1, 0.01) for k in "abc"}}
    assert alone["p_paper"] * 4 > 0.05
    assert decide(family)["x"]["verdict"] != REPRODUCED


def test_a_pending_test_counts_as_p_one_so_verdicts_read_before_it_stand():
    """A family of four with one test still to run: it counts as p = 1, so the others'
    Holm p-values are the largest that any later result of it could give."""
    rng = np.random.default_rng(5)
    done = {
        k: paired_effect(rng.normal(mu, 0.1, 8), 1, 0.1)
        for k, mu in (("x", 0.15), ("y", 0.0), ("z", 0.06))
    }
    early = decide({**done, "w": paired_effect([0.3], 1, 0.1)})
    assert early["w"]["verdict"] is None and math.isnan(early["w"]["p_paper_holm"])
    # Not a family of three: leaving w out would make the others' p-values smaller.
    assert early["x"]["p_paper_holm"] > decide(done)["x"]["p_paper_holm"]
    assert any(early[k]["verdict"] == UNDECIDED for k in done)
    for k in done:
        if early[k]["verdict"] == UNDECIDED:
            assert "w pending, counted as p = 1" in early[k]["because"]
    for mu_w in (-0.2, 0.0, 0.1, 0.5):  # whatever w gives later
        late = decide({**done, "w": paired_effect(rng.normal(mu_w, 0.1, 8), 1, 0.1)})
        for k in done:
            assert late[k]["p_paper_holm"] <= early[k]["p_paper_holm"] + 1e-12
            assert late[k]["p_short_holm"] <= early[k]["p_short_holm"] + 1e-12
            if early[k]["verdict"] != UNDECIDED:
                assert late[k]["verdict"] == early[k]["verdict"], (k, mu_w)


def test_the_protocols_power_table_is_what_the_code_computes():
    """docs/reproduction.md, "Power, worked out before the runs" (16 seeds, family of 7)."""
    assert paired_power(16, 0.10, 0.12) == pytest.approx(0.94, abs=0.005)
    assert paired_power(16, 0.10, 0.12, 0.05 / 7) == pytest.approx(0.71, abs=0.005)
    assert paired_power(16, 0.05, 0.05) == pytest.approx(0.98, abs=0.005)
    assert paired_power(16, 0.05, 0.05, 0.05 / 7) == pytest.approx(0.87, abs=0.005)
    assert paired_power(12, 0.10, 0.12, 0.05 / 7) == pytest.approx(0.52, abs=0.005)
    assert paired_power(10, 0.10, 0.12, 0.05 / 7) == pytest.approx(0.40, abs=0.005)
    assert seeds_needed(0.10, 0.12, power=0.70, alpha=0.05 / 7) == 16
