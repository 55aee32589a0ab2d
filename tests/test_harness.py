"""Known-answer harness: three fine-tuned micro policies whose input dependence is known,
run through the real cross-scoring (issue 3, item 7).  ~15 s of CPU for all three."""

import math

import numpy as np
import pytest

from tether.testing.harness import (
    ANSWER_CLOSE,
    ANSWER_PREFIX,
    BEHAVIOURS,
    Behaviour,
    HarnessConfig,
    parse_reply,
    run_harness,
)

CFG = HarnessConfig()
LOG_N = math.log(CFG.n_prompts)


@pytest.fixture(scope="module")
def results():
    return run_harness(CFG)


def xz(results, name, key):
    return results[name].chain["xz"][key]


def test_policies_learned_their_behaviour(results):
    for name, r in results.items():
        assert r.format_ok_rate >= 0.9, name
        assert r.chain["xz"]["num_pairs"] == r.format_ok_rate * CFG.n_prompts * CFG.samples
        assert r.chain["xz"]["num_prompts"] == CFG.n_prompts
    # Template choice is the only randomness of random_template: its SFT loss is the
    # entropy of that choice spread over the reply tokens, the others go to ~0.
    reply_len = CFG.template_len + len(ANSWER_PREFIX) + 2
    assert results["random_template"].sft_loss == pytest.approx(
        math.log(CFG.templates) / reply_len, abs=0.05
    )
    assert results["grounded"].sft_loss < 0.05 and results["template"].sft_loss < 0.05


def test_mi_ranks_grounded_above_both_templates(results):
    grounded, fixed, random = (xz(results, n, "mi_estimate") for n in BEHAVIOURS)
    assert grounded > 0.9 * LOG_N  # copies its input: I(X;Z) = log N
    assert abs(fixed) < 0.05 * LOG_N and abs(random) < 0.05 * LOG_N
    assert abs(random - fixed) < 0.05 * LOG_N  # (c) ≈ (b)
    assert xz(results, "grounded", "mi_seq_estimate") > 0.9 * LOG_N
    assert xz(results, "grounded", "mi_zscore") > 2.0
    for name in ("template", "random_template"):
        assert abs(xz(results, name, "mi_zscore")) < 0.5, name


def test_retrieval_is_perfect_when_grounded_and_at_chance_for_templates(results):
    assert xz(results, "grounded", "retrieval_acc") >= 0.95
    assert xz(results, "grounded", "retrieval_above_chance") > 0.8
    for name in ("template", "random_template"):
        assert xz(results, name, "retrieval_chance") == pytest.approx(1 / CFG.n_prompts)
        assert abs(xz(results, name, "retrieval_above_chance")) < 0.15, name


def test_entropy_ranks_random_templates_highest(results):
    """Within-input entropy sees diversity, not grounding: the input-agnostic random
    templates look the most 'diverse' (template collapse, invisible to entropy)."""
    h = {n: xz(results, n, "conditional_entropy_est") for n in BEHAVIOURS}
    tok = {n: results[n].reasoning_token_entropy for n in BEHAVIOURS}
    for measure in (h, tok):
        assert measure["random_template"] > measure["grounded"] + 0.2
        assert measure["random_template"] > measure["template"] + 0.3
    # Known answer: log T nats of choice in the first token, spread over the template's tokens.
    assert h["random_template"] == pytest.approx(
        math.log(CFG.templates) / CFG.template_len, abs=0.1
    )
    assert h["template"] < 0.02 and tok["template"] < 0.02
    # H(Z) = I(X;Z) + H(Z|X): the marginal entropy is highest for the grounded policy.
    assert (
        xz(results, "grounded", "reasoning_entropy_est")
        > xz(results, "random_template", "reasoning_entropy_est") + 1.0
    )


def test_information_chain_known_answers(results):
    za = {n: results[n].chain["za"]["mi_estimate"] for n in BEHAVIOURS}
    xa = {n: results[n].chain["xa"]["mi_estimate"] for n in BEHAVIOURS}
    # random_template: the action is a function of the template -> I(Z;A) = log T.
    assert za["random_template"] == pytest.approx(math.log(CFG.templates), abs=0.3)
    assert za["grounded"] > 0.8 * LOG_N
    assert abs(za["template"]) < 0.05
    for name in ("template", "random_template"):
        assert abs(xa[name]) < 0.05, name  # actions ignore the input


def test_behaviours_and_parser():
    rng = np.random.default_rng(0)
    keys = (8, 9, 10, 11)
    grounded = Behaviour("grounded", CFG, rng)
    assert grounded.reply(keys, rng) == (keys, (8,))
    fixed = Behaviour("template", CFG, rng)
    assert len({fixed.reply(k, rng) for k in (keys, (20, 21, 22, 23))}) == 1
    random = Behaviour("random_template", CFG, rng)
    drawn = {random.reply(keys, rng) for _ in range(200)}
    assert len(drawn) == CFG.templates
    with pytest.raises(ValueError, match="unknown behaviour"):
        Behaviour("copy", CFG, rng)
    assert parse_reply((40, 41, *ANSWER_PREFIX, 42, ANSWER_CLOSE)) == ((40, 41), (42,))
    assert parse_reply((40, 41)) == ((), ())  # no </think>: no reasoning
    assert parse_reply((40, ANSWER_PREFIX[0], 42)) == ((40,), ())  # no <answer>: no action
