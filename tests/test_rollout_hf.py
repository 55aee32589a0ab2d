"""HFRolloutEngine against HF's own generate and a full no-cache forward (micro/small models)."""

from __future__ import annotations

import math

import pytest
import torch

from tether.policy.tiny import build_tiny_model, tiny_config
from tether.rollout import HFRolloutEngine, SamplingParams, make_engine
from tether.rollout.hf import _sample

PAD = 0
LENGTHS = (5, 17, 9, 17, 30, 3, 12)  # rows 1 and 3 get identical prompts (a GRPO group)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: a second intra-op thread only adds sync overhead (10x on a busy box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=["eager", "sdpa"])
def model(request):
    config = tiny_config("small", max_context=64)
    config.initializer_range = (
        0.2  # sharper than the default 0.02: varied, non-repeating greedy replies
    )
    m = build_tiny_model(config, seed=0)
    m.set_attn_implementation(request.param)
    return m


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, 512, (n,), generator=g).tolist() for n in LENGTHS]
    rows[3] = list(rows[1])
    return rows


def left_pad(prompts):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def reference_logprobs(model, prompt, tokens, temperature):
    """log_softmax(logits / T) at each generated token, from one no-cache forward of prompt + tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens]), use_cache=False).logits[0]
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_greedy_matches_hf_generate(model, prompts):
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0), seed=0)
    ids, mask = left_pad(prompts)
    with torch.no_grad():
        ref = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=PAD
        )[:, ids.shape[1] :]
    assert [g.token_ids for g in gens] == ref.tolist()
    assert all(g.finish_reason == "length" for g in gens)
    assert gens[1].token_ids == gens[3].token_ids  # identical prompts, greedy
    # Greedy log-probs are reported under temperature 1.
    for p, g in zip(prompts, gens):
        assert torch.allclose(
            torch.tensor(g.logprobs), reference_logprobs(model, p, g.token_ids, 1.0), atol=1e-4
        )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_full_forward(model, prompts, temperature):
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    gens = engine.generate(
        prompts, SamplingParams(max_new_tokens=20, temperature=temperature), seed=3
    )
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) == len(g.logprobs) == 20
        ref = reference_logprobs(model, p, g.token_ids, temperature)
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4), (p, g)


def test_logprobs_ignore_top_k_top_p_filtering(model, prompts):
    """top_k / top_p restrict sampling; the reported log-prob stays under the full T-scaled distribution."""
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    greedy = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0), seed=0)
    for params in (
        SamplingParams(max_new_tokens=8, temperature=0.7, top_k=1),
        SamplingParams(max_new_tokens=8, temperature=0.7, top_p=1e-6),
    ):
        gens = engine.generate(prompts, params, seed=5)
        assert [g.token_ids for g in gens] == [g.token_ids for g in greedy]
        for p, g in zip(prompts, gens):
            ref = reference_logprobs(model, p, g.token_ids, 0.7)
            assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)
            assert max(g.logprobs) < 0  # not renormalised over the single kept token


def test_seed_reproducible(model, prompts):
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    params = SamplingParams(max_new_tokens=16)
    a = engine.generate(prompts, params, seed=11)
    b = engine.generate(prompts, params, seed=11)
    c = engine.generate(prompts, params, seed=12)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    assert a[1].token_ids != a[3].token_ids  # identical prompts still sample independently


def test_stop_token_ends_row_others_continue(model, prompts):
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=0), seed=0)
    # A token row 0 emits at step k that does not appear in some other row.
    stop = next(t for t in free[0].token_ids[2:] if any(t not in g.token_ids for g in free[1:]))
    gens = engine.generate(
        prompts, SamplingParams(max_new_tokens=16, temperature=0, stop_token_ids=(stop,)), seed=0
    )
    for g_free, g in zip(free, gens):
        if stop in g_free.token_ids:
            k = g_free.token_ids.index(stop)
            assert g.token_ids == g_free.token_ids[: k + 1]  # stop token included
            assert g.logprobs == pytest.approx(g_free.logprobs[: k + 1], abs=1e-5)
            assert g.finish_reason == "stop"
        else:  # continued to the end after other rows were dropped from the batch and cache
            assert g.token_ids == g_free.token_ids
            assert g.finish_reason == "length"
    assert any(g.finish_reason == "stop" for g in gens) and any(
        g.finish_reason == "length" for g in gens
    )


def test_eos_token_ids_stop_like_stop_tokens(model, prompts):
    free = HFRolloutEngine(model, pad_token_id=PAD).generate(
        prompts, SamplingParams(max_new_tokens=10, temperature=0), seed=0
    )
    stop = free[0].token_ids[4]
    gens = HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=[stop]).generate(
        prompts, SamplingParams(max_new_tokens=10, temperature=0), seed=0
    )
    assert gens[0].token_ids == free[0].token_ids[: free[0].token_ids.index(stop) + 1]
    assert gens[0].finish_reason == "stop"


class CharTokenizer:
    """Token t decodes to one letter; enough for stop-string matching."""

    def batch_decode(self, rows, skip_special_tokens=False):
        return ["".join(chr(ord("a") + t % 26) for t in row) for row in rows]


def test_stop_strings(model, prompts):
    tok = CharTokenizer()
    engine = HFRolloutEngine(model, pad_token_id=PAD, tokenizer=tok)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=0), seed=0)
    text = tok.batch_decode([free[2].token_ids])[0]
    stop = text[5:8]
    gens = engine.generate(
        prompts, SamplingParams(max_new_tokens=16, temperature=0, stop_strings=(stop,)), seed=0
    )
    for g_free, g in zip(free, gens):
        full = tok.batch_decode([g_free.token_ids])[0]
        if stop in full:
            end = full.index(stop) + len(
                stop
            )  # one char per token: the token completing the string
            assert g.token_ids == g_free.token_ids[:end] and g.finish_reason == "stop"
        else:
            assert g.token_ids == g_free.token_ids and g.finish_reason == "length"
    with pytest.raises(ValueError, match="tokenizer"):
        HFRolloutEngine(model, pad_token_id=PAD).generate(
            prompts, SamplingParams(stop_strings=("x",))
        )


def test_max_new_tokens_and_empty_batch(model, prompts):
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    for n in (1, 7):
        gens = engine.generate(prompts, SamplingParams(max_new_tokens=n), seed=0)
        assert [len(g.token_ids) for g in gens] == [n] * len(prompts)
        assert all(g.finish_reason == "length" and len(g.logprobs) == n for g in gens)
    zero = engine.generate(prompts, SamplingParams(max_new_tokens=0), seed=0)
    assert [g.token_ids for g in zero] == [[]] * len(prompts)
    assert engine.generate([], SamplingParams(), seed=0) == []


def test_context_window_and_truncation(model, prompts):
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    assert engine.max_context == 64
    g = torch.Generator().manual_seed(2)
    long_prompt = torch.randint(1, 512, (80,), generator=g).tolist()
    near_full = torch.randint(1, 512, (60,), generator=g).tolist()
    gens = engine.generate(
        [long_prompt, near_full, prompts[0]],
        SamplingParams(max_new_tokens=10, temperature=0),
        seed=0,
    )
    assert gens[0].meta["truncated_prompt_tokens"] == 80 - 63
    assert gens[0].meta["prompt_tokens"] == 63 and "warning" in gens[0].meta
    assert len(gens[0].token_ids) == 1 and gens[0].finish_reason == "context"
    assert len(gens[1].token_ids) == 4 and gens[1].finish_reason == "context"  # 60 + 4 = window
    assert gens[1].meta["truncated_prompt_tokens"] == 0
    assert len(gens[2].token_ids) == 10 and gens[2].finish_reason == "length"
    # Truncation keeps the last tokens: same output as the pre-truncated prompt.
    alone = engine.generate(
        [long_prompt[-63:]], SamplingParams(max_new_tokens=10, temperature=0), seed=0
    )
    assert alone[0].token_ids == gens[0].token_ids


VARIANTS = {
    "prefill_chunk": {"prefill_chunk": 7},
    "no_buckets": {"pad_tolerance": 0.99},
    "lazy_compaction": {"compact_fraction": 0.5},
    "no_compaction": {"compact_fraction": 1.0},
    "dynamic_cache": {},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_and_cache_variants_agree(model, prompts, variant):
    """Chunked prefill, one-bucket prefill, lazy or no row dropping and the DynamicCache
    fallback give the same samples."""
    base = HFRolloutEngine(model, pad_token_id=PAD)
    kwargs = VARIANTS[variant]
    other = HFRolloutEngine(model, pad_token_id=PAD, **kwargs)
    if variant == "dynamic_cache":
        other._preallocate = False
    stop = base.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0), seed=0)[
        0
    ].token_ids[3]
    params = SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(stop,))
    a, b = base.generate(prompts, params, seed=0), other.generate(prompts, params, seed=0)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.finish_reason for g in a] == [g.finish_reason for g in b]
    for ga, gb in zip(a, b):
        assert ga.logprobs == pytest.approx(gb.logprobs, abs=1e-4)


def test_load_state_dict_in_place(prompts):
    config = tiny_config("micro")
    config.initializer_range = 0.2
    model, donor = build_tiny_model(config, seed=0), build_tiny_model(config, seed=1)
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    ptrs = {k: v.data_ptr() for k, v in model.state_dict().items()}
    params = SamplingParams(max_new_tokens=6, temperature=0)
    before = engine.generate(prompts, params, seed=0)
    engine.load_state_dict(donor.state_dict())
    after = engine.generate(prompts, params, seed=0)
    expected = HFRolloutEngine(donor, pad_token_id=PAD).generate(prompts, params, seed=0)
    assert (
        [g.token_ids for g in after]
        == [g.token_ids for g in expected]
        != [g.token_ids for g in before]
    )
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == ptrs
    with pytest.raises(KeyError, match="unknown keys"):
        engine.load_state_dict({**donor.state_dict(), "bogus.weight": torch.zeros(1)})
    with pytest.raises(KeyError, match="wrong shapes"):
        engine.load_state_dict({**donor.state_dict(), "model.norm.weight": torch.zeros(1)})


def test_sampler_draws_from_the_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])).repeat(40000, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logp = _sample(logits, SamplingParams(temperature=1.0), gen)
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.01)
    assert torch.allclose(logp, logits[0, tokens])
    tokens, _ = _sample(logits, SamplingParams(temperature=1.0, top_k=2), gen)
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    assert torch.allclose(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.01)
    tokens, _ = _sample(logits, SamplingParams(temperature=1.0, top_p=0.7), gen)  # keeps {0, 1}
    assert set(tokens.tolist()) == {0, 1}


def test_make_engine_and_errors():
    model = build_tiny_model(tiny_config("micro"), seed=0)
    assert isinstance(make_engine("hf", model, pad_token_id=PAD), HFRolloutEngine)
    from tether.rollout import vllm_available

    if vllm_available():  # the vLLM venv: the engine exists but loads a path, not a model
        with pytest.raises(TypeError, match="vllm engine loads the model itself"):
            make_engine("vllm", model, pad_token_id=PAD)
    else:
        with pytest.raises(ValueError, match="vllm"):
            make_engine("vllm", model, pad_token_id=PAD)
    with pytest.raises(ValueError, match="'hf'"):
        make_engine("nope", model, pad_token_id=PAD)
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[1, 2], []], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        engine.generate([[1, 2]], SamplingParams(temperature=-1))


def test_unwritten_cache_memory_is_never_read(model, prompts, monkeypatch):
    """Fill freshly allocated cache buffers with NaN: masked padding must still not leak into outputs."""
    params = SamplingParams(max_new_tokens=10, temperature=0)
    expected = HFRolloutEngine(model, pad_token_id=PAD).generate(prompts, params, seed=0)
    real_empty, real_empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    monkeypatch.setattr(
        torch, "empty_like", lambda *a, **k: real_empty_like(*a, **k).fill_(float("nan"))
    )
    gens = HFRolloutEngine(model, pad_token_id=PAD).generate(prompts, params, seed=0)
    assert [g.token_ids for g in gens] == [g.token_ids for g in expected]
    assert all(math.isfinite(x) for g in gens for x in g.logprobs)


@pytest.fixture(scope="module")
def group_prompts():
    """GRPO-shaped: 4 distinct prompts of different lengths, 4 rows each, interleaved."""
    g = torch.Generator().manual_seed(2)
    base = [torch.randint(1, 512, (n,), generator=g).tolist() for n in (6, 19, 11, 27)]
    return [base[i % 4] for i in range(16)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_grouped_prompts_agree_with_per_row_cache(model, group_prompts, temperature):
    """Prompts stored once per distinct prompt (grouped attention) vs copied per row: same
    samples and log-probs, including rows that stop early and are compacted away."""
    plain = HFRolloutEngine(model, pad_token_id=PAD, grouped_prompts=False)
    grouped = HFRolloutEngine(model, pad_token_id=PAD, grouped_prompts=True)
    # Stop tokens taken from the same seeded run, so rows 0 and 5 stop early for sure.
    probe = plain.generate(
        group_prompts, SamplingParams(max_new_tokens=16, temperature=temperature), seed=4
    )
    stops = (probe[0].token_ids[3], probe[5].token_ids[8])
    params = SamplingParams(max_new_tokens=16, temperature=temperature, stop_token_ids=stops)
    a, b = (
        plain.generate(group_prompts, params, seed=4),
        grouped.generate(group_prompts, params, seed=4),
    )
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert len({len(g.token_ids) for g in b}) > 1  # some rows stopped early: compaction ran
    for ga, gb, prompt in zip(a, b, group_prompts):
        assert gb.logprobs == pytest.approx(ga.logprobs, abs=1e-4)
        ref = reference_logprobs(model, prompt, gb.token_ids, temperature or 1.0)
        assert gb.logprobs == pytest.approx(ref.tolist(), abs=1e-4)
    assert model.config._attn_implementation in ("eager", "sdpa")  # restored after decoding


def test_grouped_prompts_auto_choice(model, group_prompts, prompts, monkeypatch):
    """Auto mode groups when at most half the rows have distinct prompts, not otherwise."""
    from transformers import AttentionInterface

    from tether.rollout import hf

    calls = []
    real = hf._grouped_prompt_attention
    monkeypatch.setitem(
        AttentionInterface._global_mapping,
        hf.GROUPED_PROMPT_ATTENTION,
        lambda *a, **k: calls.append(1) or real(*a, **k),
    )
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    assert engine.grouped_prompts
    engine.generate(prompts, SamplingParams(max_new_tokens=3), seed=0)  # 6 of 7 distinct
    assert calls == []
    engine.generate(group_prompts, SamplingParams(max_new_tokens=3), seed=0)  # 4 of 16 distinct
    assert len(calls) > 0


@pytest.mark.parametrize("grouped", [False, True])
def test_autocast_logprobs_are_the_learners(model, group_prompts, grouped):
    """``autocast="bfloat16"``: the body runs in bfloat16 and the head in float32, in the
    engine as in the learner, so a sampled token's log-prob is the one the update's
    autocast forward computes for it (the PPO ratio starts at 1), near float32's."""
    from tether.algos.batch import token_logprobs
    from tether.algos.update import autocast

    engine = HFRolloutEngine(model, pad_token_id=PAD, grouped_prompts=grouped, autocast="bfloat16")
    gens = engine.generate(group_prompts, SamplingParams(max_new_tokens=12, temperature=1.0), 7)
    to_learner, to_full = [], []
    for prompt, gen in zip(group_prompts, gens):
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad(), autocast(model, "bfloat16"):
            learner, _ = token_logprobs(model, ids, torch.ones_like(ids))
        sampled = torch.tensor(gen.logprobs)
        to_learner += (sampled - learner[0, len(prompt) :]).abs().tolist()
        to_full += (sampled - reference_logprobs(model, prompt, gen.token_ids, 1.0)).abs().tolist()
    # This random model's logits are far sharper than a trained one's (initializer 0.2):
    # here 0.01-0.03 and 0.04 on average; on the quickstart's warm start 0.0002 and 0.0007
    # (benchmarks/RESULTS.md, "Mixed precision").  The cached decode's bfloat16 keys and
    # values differ a little from the learner's one full forward.
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(to_learner) < 0.05 and 0 < mean(to_full) < 0.1
    with pytest.raises(ValueError, match="autocast"):
        HFRolloutEngine(model, pad_token_id=PAD, autocast="float16")


@pytest.mark.parametrize("grouped", [False, True])
def test_a_next_turn_reuses_the_replies_keys_and_values(model, group_prompts, grouped):
    """Turn 2 of a multi-turn batch (each prompt = turn 1's prompt, its reply and an
    observation) on the engine that sampled turn 1 prefills only the observation, and
    samples what an engine that prefills everything samples, with the same log-probs;
    rows that stopped early in turn 1 (compacted away) are kept too."""
    first = HFRolloutEngine(model, pad_token_id=PAD, grouped_prompts=grouped)
    probe = first.generate(group_prompts, SamplingParams(max_new_tokens=10), seed=4)
    stops = (probe[0].token_ids[2], probe[5].token_ids[6])
    turn1_params = SamplingParams(max_new_tokens=10, stop_token_ids=stops)
    first = HFRolloutEngine(model, pad_token_id=PAD, grouped_prompts=grouped)
    turn1 = first.generate(group_prompts, turn1_params, seed=4)
    assert len({len(g.token_ids) for g in turn1}) > 1  # rows stopped early
    g = torch.Generator().manual_seed(3)
    turn2 = [
        p + t.token_ids + torch.randint(1, 512, (3 + i % 4,), generator=g).tolist()
        for i, (p, t) in enumerate(zip(group_prompts, turn1))
    ]
    fresh = HFRolloutEngine(model, pad_token_id=PAD, reuse_turns=False)
    for temperature in (0.0, 1.0):
        params = SamplingParams(max_new_tokens=10, temperature=temperature, stop_token_ids=stops)
        before = first.reused_tokens
        reused = first.generate(turn2, params, seed=7)
        # Every row's turn-1 prompt and reply but the reply's last token came from the cache.
        assert first.reused_tokens - before == sum(
            len(p) + len(t.token_ids) - 1 for p, t in zip(group_prompts, turn1)
        )
        again = fresh.generate(turn2, params, seed=7)
        assert [r.token_ids for r in reused] == [a.token_ids for a in again]
        for r, a in zip(reused, again):
            assert r.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        first.load_state_dict(model.state_dict())  # new weights: the kept rows are dropped
        before = first.reused_tokens
        first.generate(turn2, params, seed=7)
        assert first.reused_tokens == before
        first.generate(group_prompts, turn1_params, seed=4)  # turn 1 again, for the next pass
    assert fresh.reused_tokens == 0
