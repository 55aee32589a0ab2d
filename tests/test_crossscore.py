"""Cross-scoring with the micro model: naive vs prefix reuse, truncation, sampling, chain."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from tether.diagnostics.crossscore import (
    ScoringPair,
    chain_inputs,
    cross_score_pairs,
    information_chain,
    sample_pairs,
    supports_shared_prefix,
)
from tether.diagnostics.mi import mi_proxies
from tether.policy.tiny import build_tiny_model, tiny_config


@pytest.fixture(scope="module")
def micro():
    return build_tiny_model(tiny_config("micro", max_context=256), seed=0)


def random_ids(rng, n, low, high):
    return [[int(t) for t in rng.integers(0, 512, size=rng.integers(low, high))] for _ in range(n)]


def manual_score(model, context, continuation, temperature):
    """One pair, one forward, no batching or padding: the reference."""
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double() / temperature, dim=-1)
    p = len(context)
    return float(sum(logp[p - 1 + t, tok] for t, tok in enumerate(continuation)))


@pytest.mark.parametrize("kv_heads", [2, 1])  # 1: grouped-query attention
def test_all_methods_agree(kv_heads):
    config = tiny_config("micro", max_context=256)
    config.num_key_value_heads = kv_heads
    model = build_tiny_model(config, seed=1)
    attention_before = model.config._attn_implementation
    rng = np.random.default_rng(kv_heads)
    contexts = random_ids(rng, 5, 3, 40)
    continuations = random_ids(rng, 11, 1, 25) + [[7]]  # includes a one-token continuation
    results = {
        method: cross_score_pairs(model, contexts, continuations, 0.7, method=method, batch_size=bs)
        for method, bs in (("naive", 9), ("prefix", 4), ("shared_prefix", 5), ("multi_prefix", 3))
    }
    naive = results["naive"]
    assert naive.S.shape == (12, 5)
    for method in ("prefix", "shared_prefix", "multi_prefix"):
        np.testing.assert_allclose(results[method].S, naive.S, atol=1e-4, rtol=0)
        np.testing.assert_allclose(results[method].L, naive.L, atol=1e-4, rtol=0)
    lengths = np.array([len(c) for c in continuations])
    np.testing.assert_allclose(naive.L, naive.S / lengths[:, None])
    for i, j in ((0, 0), (3, 4), (11, 2)):
        assert naive.S[i, j] == pytest.approx(
            manual_score(model, contexts[j], continuations[i], 0.7), abs=1e-4
        )
    assert model.config._attn_implementation == attention_before  # restored after shared_prefix


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_multi_prefix_matches_naive_in_any_chunking(kv_heads):
    """Contexts of very different lengths, encoded 2 at a time and scored 1-3 per forward
    (padded prefixes masked, per-row positions), and continuations in length chunks."""
    from tether.diagnostics.multiprefix import score_multi_prefix

    config = tiny_config("micro", max_context=256)
    config.num_key_value_heads = kv_heads
    model = build_tiny_model(config, seed=2)
    rng = np.random.default_rng(10 + kv_heads)
    contexts = random_ids(rng, 7, 1, 60)
    continuations = random_ids(rng, 9, 1, 30) + [[3], [4, 5]]
    naive = cross_score_pairs(model, contexts, continuations, 1.3, method="naive").S
    for kwargs in (
        {"batch_size": 128},
        {"batch_size": 3, "context_batch": 2, "max_tokens": 40},
        {"batch_size": 1, "context_batch": 1, "max_tokens": 1},
    ):
        with torch.inference_mode():
            S = score_multi_prefix(model, contexts, continuations, 1.3, **kwargs)
        np.testing.assert_allclose(S, naive, atol=1e-4, rtol=0)
    assert cross_score_pairs(model, contexts, continuations, 1.3).info["method"] == "multi_prefix"


def test_multi_prefix_without_a_plain_head_matches_naive():
    """A model whose head `split_head` refuses (here: a soft-capping setting, which Qwen2
    itself ignores) runs whole: the contexts' last logits are gathered from all logits."""
    from tether.algos.vocab import split_head
    from tether.diagnostics.multiprefix import score_multi_prefix

    model = build_tiny_model(tiny_config("micro", max_context=256), seed=3)
    model.config.final_logit_softcapping = 30.0
    assert split_head(model) is None
    rng = np.random.default_rng(7)
    contexts = random_ids(rng, 5, 1, 40)
    continuations = random_ids(rng, 6, 1, 20)
    naive = cross_score_pairs(model, contexts, continuations, 0.8, method="naive").S
    with torch.inference_mode():
        S = score_multi_prefix(model, contexts, continuations, 0.8, batch_size=4, context_batch=3)
    np.testing.assert_allclose(S, naive, atol=1e-4, rtol=0)


def test_length_chunks_split_off_long_outliers():
    from tether.algos.micro_batches import length_chunks

    lengths = [3, 2, 40, 3, 2, 4, 3, 2]
    chunks = length_chunks(lengths, max_rows=128, overhead=4)
    assert sorted(i for c in chunks for i in c.tolist()) == list(range(8))  # a partition
    assert [c.tolist() for c in chunks][-1] == [2]  # the outlier alone
    assert all(len(c) <= 3 for c in length_chunks(lengths, max_rows=3, overhead=0))
    assert len(length_chunks(lengths, max_rows=128, overhead=10**6)) == 1  # calls dear: one chunk


def test_temperature_changes_the_scores(micro):
    rng = np.random.default_rng(5)
    contexts, continuations = random_ids(rng, 2, 5, 10), random_ids(rng, 3, 5, 10)
    hot = cross_score_pairs(micro, contexts, continuations, 2.0)
    assert hot.S[1, 1] == pytest.approx(
        manual_score(micro, contexts[1], continuations[1], 2.0), abs=1e-4
    )
    cold = cross_score_pairs(micro, contexts, continuations, 0.5)
    assert not np.allclose(hot.S, cold.S)


def test_long_reasoning_is_truncated_and_counted(caplog):
    model = build_tiny_model(tiny_config("micro", max_context=64), seed=0)
    rng = np.random.default_rng(2)
    contexts = [
        random_ids(rng, 1, 40, 41)[0],
        random_ids(rng, 1, 20, 21)[0],
    ]  # longest leaves 24 tokens
    continuations = [random_ids(rng, 1, 30, 31)[0], random_ids(rng, 1, 10, 11)[0]]
    for method in ("prefix", "naive", "shared_prefix"):
        res = cross_score_pairs(model, contexts, continuations, method=method)
        assert res.info["truncated_reasoning"] == 1
        assert res.lengths.tolist() == [24, 10]
        ref = cross_score_pairs(
            model, contexts, [continuations[0][:24], continuations[1]], method="naive"
        )
        np.testing.assert_allclose(res.S, ref.S, atol=1e-4)
        np.testing.assert_allclose(res.L[0], res.S[0] / 24)
    capped = cross_score_pairs(model, contexts, continuations, max_continuation_tokens=5)
    assert capped.info["truncated_reasoning"] == 2 and capped.lengths.tolist() == [5, 5]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 4  # one line per truncating call
    assert "1 of 2 continuations longer than 24 tokens were truncated" in warnings[0]
    assert "2 of 2 continuations longer than 5 tokens" in warnings[-1]
    # Through the information chain the count is a logged metric, never NaN.
    pairs = [ScoringPair(tuple(contexts[k]), tuple(continuations[k]), (3,)) for k in range(2)]
    xz = information_chain(model, pairs).metrics["xz"]
    assert xz["truncated_reasoning"] == 1.0 and np.isfinite(xz["mi_estimate"])


def test_bad_inputs_raise(micro):
    with pytest.raises(ValueError, match="empty continuation"):
        cross_score_pairs(micro, [[1, 2]], [[3], []])
    with pytest.raises(ValueError, match="no room"):
        cross_score_pairs(micro, [list(range(256))], [[3]])
    with pytest.raises(ValueError, match="unknown cross-scoring method"):
        cross_score_pairs(micro, [[1]], [[2]], method="fast")
    empty = cross_score_pairs(micro, [[1, 2]], [])
    assert empty.S.shape == (0, 1)
    assert supports_shared_prefix(micro)


@dataclass
class Turn:
    prompt_ids: list
    reasoning_ids: list
    action_ids: list


def make_batch(n_groups=3, group_size=4, turns=3):
    batch = []
    for g in range(n_groups):
        for s in range(group_size):
            batch.append([Turn([g, 100 + t], [g, s, t], [t]) for t in range(turns)])
    return batch


def test_first_turn_sampling_takes_turn_one_and_caps():
    batch = make_batch() + [[]]  # an empty trajectory is skipped
    pairs = sample_pairs(batch, "first_turn", max_pairs=100, rng=np.random.default_rng(0))
    assert len(pairs) == 12
    assert all(p.prompt_ids[1] == 100 for p in pairs)  # turn 1 only
    assert [p.prompt_ids[0] for p in pairs] == [0] * 4 + [1] * 4 + [2] * 4
    capped = sample_pairs(batch, "first_turn", max_pairs=5, rng=np.random.default_rng(0))
    assert len(capped) == 5 and len(set(capped)) == 5
    again = sample_pairs(batch, "first_turn", max_pairs=5, rng=np.random.default_rng(0))
    assert capped == again  # deterministic for a seed


def test_trajectory_sampling_takes_one_random_turn_per_trajectory():
    batch = make_batch(n_groups=4, group_size=8, turns=3)
    pairs = sample_pairs(batch, "trajectory", max_pairs=32, rng=np.random.default_rng(1))
    assert len(pairs) == 32
    assert [(p.prompt_ids[0], p.reasoning_ids[1]) for p in pairs] == [
        (g, s) for g in range(4) for s in range(8)
    ]
    turns = [p.reasoning_ids[2] for p in pairs]
    assert set(turns) == {0, 1, 2}  # not always the first turn
    assert all(p.prompt_ids[1] == 100 + p.reasoning_ids[2] for p in pairs)
    with pytest.raises(ValueError, match="unknown sampling"):
        sample_pairs(batch, "random", 4, np.random.default_rng(0))


def test_chain_inputs_columns():
    pairs = [
        ScoringPair((1, 2), (5,), (9,)),
        ScoringPair((1, 2), (6,), (9,)),
        ScoringPair((3,), (5,), (8,)),
    ]
    links = chain_inputs(pairs, answer_prefix_ids=[50, 51])
    contexts, continuations, column = links["xz"]
    assert (
        contexts == [(1, 2), (3,)]
        and continuations == [(5,), (6,), (5,)]
        and column.tolist() == [0, 0, 1]
    )
    contexts, continuations, column = links["za"]
    assert contexts == [
        (1, 2, 5, 50, 51),
        (1, 2, 6, 50, 51),
        (3, 5, 50, 51),
    ] and column.tolist() == [0, 1, 2]
    assert continuations == [(9,), (9,), (8,)]
    contexts, _, column = links["xa"]
    assert contexts == [(1, 2, 50, 51), (3, 50, 51)] and column.tolist() == [0, 0, 1]
    assert set(chain_inputs(pairs)) == {"xz"}


def test_information_chain_matches_direct_scoring(micro):
    rng = np.random.default_rng(4)
    prompts = random_ids(rng, 3, 8, 16)
    pairs = [
        ScoringPair(tuple(prompts[k % 3]), tuple(r), tuple(a))
        for k, (r, a) in enumerate(zip(random_ids(rng, 9, 3, 12), random_ids(rng, 9, 1, 4)))
    ]
    pairs.append(ScoringPair(tuple(prompts[0]), (), (4,)))  # empty reasoning: dropped everywhere
    pairs.append(ScoringPair(tuple(prompts[1]), (3, 3), ()))  # empty action: dropped from za/xa
    result = information_chain(micro, pairs, 0.9, answer_prefix_ids=[60, 61])
    assert set(result.metrics) == {"xz", "za", "xa"}
    xz, za, xa = result.metrics["xz"], result.metrics["za"], result.metrics["xa"]
    assert xz["valid_reasoning_rate"] == pytest.approx(10 / 11)
    assert za["valid_action_rate"] == pytest.approx(9 / 10)
    assert xz["num_pairs"] == 10 and xz["num_prompts"] == 3
    assert za["num_pairs"] == 9 and za["num_prompts"] == 9 and xa["num_prompts"] == 3
    # xz equals mi_proxies on a direct cross-scoring of the same pairs.
    kept = pairs[:9] + pairs[10:]
    direct = cross_score_pairs(micro, prompts, [p.reasoning_ids for p in kept], 0.9)
    column = np.array([0, 1, 2] * 3 + [1])
    expected, _ = mi_proxies(direct.L, direct.S, column)
    for key, value in expected.items():
        assert xz[key] == pytest.approx(value, abs=1e-6), key
    assert result.ema_state["xz"]["updates"] == 1
    scores, col = result.scores["xz"]
    np.testing.assert_allclose(scores.L, direct.L, atol=1e-9)
    assert col.tolist() == column.tolist()
    again = information_chain(
        micro, pairs, 0.9, answer_prefix_ids=[60, 61], ema_state=result.ema_state
    )
    assert again.ema_state["za"]["updates"] == 2
    flat = result.flat("collapse/first_turn")
    assert flat["collapse/first_turn/mi_zscore_ema"] == xz["mi_zscore_ema"]
    assert flat["collapse/first_turn/za/mi_estimate"] == za["mi_estimate"]
    assert flat["collapse/first_turn/xa/retrieval_acc"] == xa["retrieval_acc"]


def test_information_chain_without_valid_pairs_reports_no_mi(micro):
    pairs = [ScoringPair((1, 2), (), (3,)), ScoringPair((4,), (), ())]
    result = information_chain(micro, pairs, answer_prefix_ids=[9])
    assert result.metrics["xz"] == {
        "num_pairs": 0.0,
        "num_prompts": 0.0,
        "valid_reasoning_rate": 0.0,
        "truncated_reasoning": 0.0,
        "context_too_long": 0.0,
    }
    assert result.metrics["za"] == {"num_pairs": 0.0, "num_prompts": 0.0, "truncated_action": 0.0}
    assert result.ema_state["xz"] is None
    assert result.info["xz"]["seconds"] == 0.0  # the runner reads it for every link


def test_pairs_whose_context_fills_the_window_are_left_out_and_counted(micro):
    window = micro.config.max_position_embeddings
    rng = np.random.default_rng(8)
    long_prompt = tuple(int(t) for t in rng.integers(1, 50, size=window))
    short = [ScoringPair((1, 2, 3), (4, 5), (6,)), ScoringPair((7, 8), (9, 10), (11,))]
    result = information_chain(
        micro, [ScoringPair(long_prompt, (4, 5), (6,)), *short], answer_prefix_ids=[9]
    )
    assert result.metrics["xz"]["context_too_long"] == 1.0
    assert result.metrics["xz"]["num_pairs"] == 2.0 and "mi_estimate" in result.metrics["xz"]


def test_single_distinct_prompt_logs_mi_as_missing(micro):
    """One prompt for every pair (e.g. a one-level batch): MI is undefined, so its keys are
    absent (not NaN) while the entropies and counts are logged, and nothing raises."""
    rng = np.random.default_rng(6)
    prompt = tuple(random_ids(rng, 1, 6, 7)[0])
    pairs = [ScoringPair(prompt, tuple(r), (5,)) for r in random_ids(rng, 6, 2, 8)]
    result = information_chain(micro, pairs, answer_prefix_ids=[9])
    xz, xa = result.metrics["xz"], result.metrics["xa"]
    assert xz["num_prompts"] == 1 and xz["num_pairs"] == 6
    for metrics in (xz, xa):
        assert not {"mi_estimate", "mi_zscore", "mi_zscore_ema", "retrieval_acc"} & set(metrics)
        assert all(np.isfinite(v) for v in metrics.values())
    assert xz["conditional_entropy_est"] > 0
    assert result.ema_state["xz"] is None  # nothing to average yet
    assert result.metrics["za"]["num_prompts"] == 6  # distinct reasonings: defined
    flat = result.flat("collapse/first_turn")
    assert (
        "collapse/first_turn/mi_estimate" not in flat
        and "collapse/first_turn/za/mi_estimate" in flat
    )


def test_max_cells_caps_pairs_times_distinct_prompts():
    rng = np.random.default_rng(3)
    # first_turn: 8 groups x 4 samples share 8 prompts -> 32 x 8 = 256 cells, kept whole.
    grouped = make_batch(n_groups=8, group_size=4, turns=3)
    assert len(sample_pairs(grouped, "first_turn", 32, rng, max_cells=256)) == 32
    # Distinct prompts for every trajectory (as trajectory sampling of multi-turn episodes):
    # N grows with M, so M x N <= 256 keeps 16 pairs.
    distinct = [[Turn([k, 100 + t], [k, t], [t]) for t in range(3)] for k in range(32)]
    pairs = sample_pairs(distinct, "trajectory", 32, np.random.default_rng(4), max_cells=256)
    assert len(pairs) == 16 and len({p.prompt_ids for p in pairs}) == 16
    assert [p.prompt_ids[0] for p in pairs] == sorted(
        p.prompt_ids[0] for p in pairs
    )  # batch order kept
    assert len(sample_pairs(distinct, "trajectory", 32, np.random.default_rng(4))) == 32  # no cap
