"""In-batch cross-scoring with a causal LM: the matrices behind the MI proxies (docs/methods.md,
section 2).

For contexts c_j (distinct prompts, each ending with the opening ``<think>``) and
continuations y_i (reasonings, tags excluded) the policy scores every y_i under
every c_j at the rollout temperature τ:

    S[i, j] = Σ_t log softmax(logits / τ)[y_i,t]   given c_j and y_i,<t
    L[i, j] = S[i, j] / len(y_i)

Four implementations that agree to 1e-4 (``method=``):
- ``naive``: every (c_j, y_i) re-encoded as one sequence — M·N full forwards;
- ``prefix``: each context encoded once, its KV cache (a transformers DynamicCache)
  expanded along the batch dimension, and all continuations (right-padded, masked)
  scored against it in one forward per chunk — works for any HF causal LM;
- ``shared_prefix``: as ``prefix``, but the continuations attend to the batch-1
  cache through a registered attention function, so the prefix keys/values are
  never copied per row (memory O(P) instead of O(B·P) per layer) — for models that
  dispatch attention through ``AttentionInterface`` with full attention (Qwen2,
  Llama, ...);
- ``multi_prefix`` (`tether.diagnostics.multiprefix`): as ``shared_prefix``, but the
  contexts are encoded in batches and one forward scores a length-homogeneous chunk
  of continuations under many contexts at once — far fewer, larger model calls.
``auto`` (default) picks ``multi_prefix`` when the attention hook applies, else ``prefix``.

The same machinery gives the information chain beyond the paper: I(Z;A) (actions
under each prompt+reasoning) and I(X;A) (actions under each prompt with the
reasoning removed); see `information_chain`.

    python benchmarks/crossscore.py      # naive vs prefix reuse, side by side
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
from transformers import DynamicCache

from tether.algos.attention import (
    attention_implementation,
    prefix_and_causal_weights,
    register_attention,
    supports_custom_attention,
)
from tether.algos.vocab import DEFAULT_CHUNK_TOKENS, model_states, returned_cache, with_cache
from tether.diagnostics.mi import mi_proxies, prompt_columns, valid_reasoning_rate
from tether.diagnostics.multiprefix import score_multi_prefix
from tether.diagnostics.scoring import right_pad, target_logprobs
from tether.diagnostics.uncertainty import Uncertainty

log = logging.getLogger(__name__)

ScoringMethod = Literal["auto", "multi_prefix", "shared_prefix", "prefix", "naive"]
SCORING_METHODS: tuple[str, ...] = ("auto", "multi_prefix", "shared_prefix", "prefix", "naive")
Sampling = Literal["first_turn", "trajectory"]
SAMPLINGS: tuple[str, ...] = ("first_turn", "trajectory")


@dataclass(frozen=True)
class ScoringPair:
    """One (prompt, reasoning, action) turn, as token ids.

    prompt_ids: the chat-formatted prompt up to and including the opening ``<think>``;
    reasoning_ids: the tokens strictly between ``<think>`` and ``</think>``;
    action_ids: the tokens strictly between ``<answer>`` and ``</answer>``.
    """

    prompt_ids: tuple[int, ...]
    reasoning_ids: tuple[int, ...]
    action_ids: tuple[int, ...] = ()

    @classmethod
    def from_turn(cls, turn: Any) -> ScoringPair:
        """Any object with ``prompt_ids``/``reasoning_ids``/``action_ids`` attributes."""
        return cls(
            tuple(int(t) for t in turn.prompt_ids),
            tuple(int(t) for t in turn.reasoning_ids),
            tuple(int(t) for t in getattr(turn, "action_ids", ()) or ()),
        )


@dataclass
class CrossScores:
    """Cross-score matrices: ``S`` and ``L`` are [M continuations, N contexts] float64."""

    S: np.ndarray
    L: np.ndarray
    lengths: np.ndarray  # [M] scored tokens per continuation (after truncation)
    info: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- sampling


def sample_pairs(
    trajectories: Sequence[Sequence[Any]],
    sampling: Sampling,
    max_pairs: int,
    rng: np.random.Generator,
    max_cells: int | None = None,
) -> list[ScoringPair]:
    """Pick the pairs to cross-score from a batch of trajectories (lists of turns).

    - ``first_turn``: turn 1 of each trajectory (prompts repeat within a group);
    - ``trajectory``: one uniformly random turn of each trajectory.
    When there are more than ``max_pairs`` (non-empty) trajectories a uniform random
    subset of them is used, kept in batch order. Turns are converted with
    `ScoringPair.from_turn`. With ``max_cells``, uniformly random pairs are then dropped
    until M pairs x N distinct prompts <= max_cells: the scoring cost is ~M·N, and
    ``trajectory`` sampling has N ≈ M (its multi-turn prompts are nearly all distinct).
    """
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; choose one of {list(SAMPLINGS)}")
    if max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
    candidates = [k for k, traj in enumerate(trajectories) if len(traj) > 0]
    if len(candidates) > max_pairs:
        chosen = rng.choice(len(candidates), size=max_pairs, replace=False)
        candidates = [candidates[c] for c in np.sort(chosen)]
    pairs = []
    for k in candidates:
        turns = trajectories[k]
        turn = turns[0] if sampling == "first_turn" else turns[int(rng.integers(len(turns)))]
        pairs.append(ScoringPair.from_turn(turn))
    if max_cells is not None:
        while len(pairs) > 1 and len(pairs) * len({p.prompt_ids for p in pairs}) > max_cells:
            del pairs[int(rng.integers(len(pairs)))]
    return pairs


# ---------------------------------------------------------------- scoring core


def _score_naive(
    model,
    contexts,
    continuations,
    temperature: float,
    batch_size: int,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> np.ndarray:
    """Every (context j, continuation i) as its own sequence; returns S [M, N]."""
    device = next(model.parameters()).device
    jobs = [(i, j) for j in range(len(contexts)) for i in range(len(continuations))]
    scores = np.zeros((len(continuations), len(contexts)), dtype=np.float64)
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start : start + batch_size]
        ids, mask = right_pad(
            [list(contexts[j]) + list(continuations[i]) for i, j in chunk], device
        )
        states, head = model_states(model, input_ids=ids, attention_mask=mask, use_cache=False)
        logp = target_logprobs(
            states[:, :-1], ids[:, 1:], temperature, head, chunk_tokens
        )  # [B, T-1]
        # Position t predicts token t+1; count it when token t+1 is in the continuation.
        token_pos = torch.arange(1, ids.shape[1], device=device)[None, :]  # [1, T-1]
        starts = torch.tensor([len(contexts[j]) for _, j in chunk], device=device)[:, None]
        ends = (
            starts + torch.tensor([len(continuations[i]) for i, _ in chunk], device=device)[:, None]
        )
        keep = (token_pos >= starts) & (token_pos < ends)
        sums = (logp.double() * keep).sum(dim=1).cpu().numpy()
        for (i, j), value in zip(chunk, sums):
            scores[i, j] = value
    return scores


def _expanded_cache(
    prefix_kv: list[tuple[torch.Tensor, torch.Tensor]], batch: int, config
) -> DynamicCache:
    """A fresh cache holding the (batch-1) prefix keys/values broadcast to ``batch`` rows."""
    return DynamicCache(
        ddp_cache_data=[
            (k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in prefix_kv
        ],
        config=config,
    )


# ------------------------------------------------ shared-prefix attention (zero copy)

SHARED_PREFIX_ATTENTION = "tether_shared_prefix"


@register_attention(SHARED_PREFIX_ATTENTION, "shared_prefix_kv")
def _shared_prefix_attention(module, query, key, value, scale: float, shared_prefix_kv):
    """Attention of B continuations over one shared, cached prefix plus their own tokens.

    query [B, Hq, T, D]; key/value [B, Hkv, T, D] (the continuation's own tokens, already
    rotated at positions P..P+T-1); ``shared_prefix_kv[layer]`` = ([1, Hkv, P, D], same).
    The prefix is never copied per row: its scores come from one matmul with the batch
    folded into the query rows. Softmax over [prefix | own causal] is merged by hand.
    Returns [B, T, Hq, D].
    """
    prefix_k, prefix_v = shared_prefix_kv[module.layer_idx]  # [1, Hkv, P, D]
    b, hq, t, d = query.shape
    hkv, p = key.shape[1], prefix_k.shape[2]
    g = hq // hkv  # query heads per kv head
    q = (query.float() * scale).reshape(b, hkv, g, t, d).permute(1, 0, 2, 3, 4)  # [Hkv, B, g, T, D]
    pk, pv = prefix_k[0].float(), prefix_v[0].float()  # [Hkv, P, D]
    s_pre = torch.bmm(q.reshape(hkv, b * g * t, d), pk.transpose(1, 2))  # [Hkv, B*g*T, P]
    s_pre = s_pre.view(hkv, b, g, t, p)
    k_own = key.float().permute(1, 0, 2, 3).unsqueeze(2)  # [Hkv, B, 1, T, D]
    v_own = value.float().permute(1, 0, 2, 3).unsqueeze(2)
    s_own = torch.matmul(q, k_own.transpose(-1, -2))  # [Hkv, B, g, T, T]
    e_pre, e_own, denom = prefix_and_causal_weights(s_pre, s_own)  # denom [Hkv, B, g, T, 1]
    out = torch.bmm(e_pre.reshape(hkv, b * g * t, p), pv).view(hkv, b, g, t, d)
    out = (out + torch.matmul(e_own, v_own)) / denom  # [Hkv, B, g, T, D]
    return out.permute(1, 3, 0, 2, 4).reshape(b, t, hq, d)  # head = kv * g + group


def supports_shared_prefix(model) -> bool:
    """Whether `_score_shared_prefix` (and `multi_prefix`) apply: HF attention dispatch,
    full attention only."""
    return supports_custom_attention(model)


def _score_prefix(
    model,
    contexts,
    continuations,
    temperature: float,
    batch_size: int,
    shared: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> np.ndarray:
    """Encode each context once and score all continuations against its KV cache; S [M, N].

    ``shared=False``: the batch-1 cache is expanded to the chunk's rows (a standard
    DynamicCache, any HF causal LM); continuations are right-padded and masked.
    ``shared=True``: continuations attend to the batch-1 cache through
    `_shared_prefix_attention`, so the prefix keys/values are never copied per row.
    """
    device = next(model.parameters()).device
    m = len(continuations)
    order = np.argsort(
        [len(c) for c in continuations], kind="stable"
    )  # similar lengths: less padding
    chunks = [order[s : s + batch_size] for s in range(0, m, batch_size)]
    padded = [right_pad([continuations[i] for i in rows], device) for rows in chunks]
    scores = np.zeros((m, len(contexts)), dtype=np.float64)
    for j, context in enumerate(contexts):
        ctx = torch.as_tensor([list(context)], dtype=torch.long, device=device)  # [1, P]
        out = model(input_ids=ctx, use_cache=True, logits_to_keep=1)
        last_logits = out.logits[:, -1]  # [1, V]
        prefix_kv = [(layer.keys, layer.values) for layer in returned_cache(out).layers]
        p = ctx.shape[1]
        for rows, (ids, valid) in zip(chunks, padded):
            b, width = ids.shape
            # The first continuation token is predicted by the context's last position.
            total = target_logprobs(
                last_logits.expand(b, -1), ids[:, 0], temperature
            ).double()  # [B]
            if width > 1:
                # Feed tokens 0..W-2; position t predicts token t+1.
                positions = torch.arange(p, p + width - 1, device=device)[None, :].expand(b, -1)
                if shared:
                    # Right padding needs no mask: real tokens attend causally to real tokens only.
                    with attention_implementation(model, SHARED_PREFIX_ATTENTION):
                        states, head = model_states(
                            model,
                            input_ids=ids[:, :-1],
                            position_ids=positions,
                            use_cache=False,
                            shared_prefix_kv=prefix_kv,
                        )  # [B, W-1, H]
                else:
                    attn = torch.cat(
                        [torch.ones(b, p, dtype=torch.long, device=device), valid[:, :-1]], 1
                    )
                    states, head = model_states(
                        model,
                        input_ids=ids[:, :-1],
                        attention_mask=attn,
                        position_ids=positions,
                        **with_cache(model, _expanded_cache(prefix_kv, b, model.config)),
                        use_cache=True,
                    )  # [B, W-1, H]
                logp = target_logprobs(
                    states, ids[:, 1:], temperature, head, chunk_tokens
                )  # [B, W-1]
                total = total + (logp.double() * valid[:, 1:]).sum(dim=1)
            scores[rows, j] = total.cpu().numpy()
    return scores


def cross_score_pairs(
    model,
    contexts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    temperature: float = 1.0,
    *,
    method: ScoringMethod = "auto",
    batch_size: int = 128,
    max_continuation_tokens: int | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> CrossScores:
    """Score every continuation under every context with a HF causal LM.

    Continuations longer than the room the model's window leaves after the longest
    context (``config.max_position_embeddings``), or than ``max_continuation_tokens``,
    are truncated to the same cap under every context (so a row stays comparable)
    and counted in ``info["truncated_reasoning"]``. ``L`` divides by the scored length.
    ``batch_size`` = sequences (naive) or continuations (prefix paths) per forward;
    ``chunk_tokens`` = token positions whose vocabulary logits exist at once.
    Runs under ``torch.inference_mode``; the model's train/eval mode is left alone
    (``shared_prefix`` swaps its attention implementation for the call and restores it).
    ``info`` records the resolved method, sizes, ``truncated_reasoning``,
    ``continuation_cap`` and ``seconds``.
    """
    if method not in SCORING_METHODS:
        raise ValueError(
            f"unknown cross-scoring method {method!r}; choose one of {list(SCORING_METHODS)}"
        )
    if method == "auto":
        method = "multi_prefix" if supports_shared_prefix(model) else "prefix"
    if method in ("shared_prefix", "multi_prefix") and not supports_shared_prefix(model):
        raise ValueError(
            f"method {method!r} needs full attention dispatched through the HF "
            "AttentionInterface; use method='prefix' for this model"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if any(len(c) == 0 for c in contexts):
        raise ValueError("every context needs at least one token")
    if any(len(y) == 0 for y in continuations):
        raise ValueError(
            "empty continuation: drop pairs with empty reasoning/action before scoring"
        )
    m, n = len(continuations), len(contexts)
    info: dict[str, Any] = {
        "method": method,
        "num_contexts": n,
        "num_continuations": m,
        "truncated_reasoning": 0,
        "continuation_cap": None,
        "seconds": 0.0,
    }
    if m == 0 or n == 0:
        empty = np.zeros((m, n))
        return CrossScores(
            empty, empty.copy(), np.array([len(y) for y in continuations], dtype=np.int64), info
        )

    window = getattr(model.config, "max_position_embeddings", None)
    cap = None if window is None else window - max(len(c) for c in contexts)
    if max_continuation_tokens is not None:
        cap = max_continuation_tokens if cap is None else min(cap, max_continuation_tokens)
    if cap is not None and cap < 1:
        raise ValueError(
            f"the longest context ({max(len(c) for c in contexts)} tokens) leaves no room "
            f"in the model window ({window} tokens); shorten the prompt or raise the window"
        )
    if cap is not None:
        info["truncated_reasoning"] = sum(1 for y in continuations if len(y) > cap)
        if info["truncated_reasoning"]:
            log.warning(
                "cross-scoring: %d of %d continuations longer than %d tokens were truncated "
                "(model window %s, longest context %d tokens)",
                info["truncated_reasoning"],
                m,
                cap,
                window,
                max(len(c) for c in contexts),
            )
        continuations = [list(y[:cap]) for y in continuations]
    info["continuation_cap"] = cap

    start = time.perf_counter()
    if method == "multi_prefix":
        score = score_multi_prefix
    else:
        score = (
            _score_naive
            if method == "naive"
            else partial(_score_prefix, shared=method == "shared_prefix")
        )
    with torch.inference_mode():
        S = score(
            model, contexts, continuations, temperature, batch_size, chunk_tokens=chunk_tokens
        )
    info["seconds"] = time.perf_counter() - start
    lengths = np.array([len(y) for y in continuations], dtype=np.int64)
    return CrossScores(S=S, L=S / lengths[:, None], lengths=lengths, info=info)


# ---------------------------------------------------------------- information chain


@dataclass
class ChainResult:
    """MI metric dicts per link (``xz`` always; ``za``/``xa`` when actions were scored)."""

    metrics: dict[str, dict[str, float]]
    ema_state: dict[str, dict | None]
    info: dict[str, dict[str, Any]]
    #: link -> (its cross-scores, column of each row), e.g. for a heatmap of ``L``
    scores: dict[str, tuple[CrossScores, np.ndarray]] = field(default_factory=dict)
    #: link -> the distinct contexts (token ids), one per column of its matrices
    contexts: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)

    def flat(self, prefix: str) -> dict[str, float]:
        """``{prefix}/{key}`` for I(X;Z), ``{prefix}/{link}/{key}`` for za and xa."""
        flat = {f"{prefix}/{k}": v for k, v in self.metrics.get("xz", {}).items()}
        for link in ("za", "xa"):
            flat.update({f"{prefix}/{link}/{k}": v for k, v in self.metrics.get(link, {}).items()})
        return flat


def chain_inputs(
    pairs: Sequence[ScoringPair], answer_prefix_ids: Sequence[int] | None = None
) -> dict[str, tuple[list[tuple[int, ...]], list[tuple[int, ...]], np.ndarray]]:
    """Contexts, continuations and columns for each link of input -> reasoning -> action.

    ``xz``: reasonings under the distinct prompts. With ``answer_prefix_ids`` (the
    tokens between the reasoning and the action, e.g. ids of ``</think><answer>``):
    ``za``: actions under the distinct prompt+reasoning+answer-prefix contexts;
    ``xa``: actions under the distinct prompt+answer-prefix contexts (empty think block).
    Pairs must already have non-empty reasonings (and actions for ``za``/``xa``).
    """
    out = {}
    col, distinct = prompt_columns([p.prompt_ids for p in pairs])
    out["xz"] = (distinct, [p.reasoning_ids for p in pairs], col)
    if answer_prefix_ids is not None:
        sep = tuple(int(t) for t in answer_prefix_ids)
        col, distinct = prompt_columns([p.prompt_ids + p.reasoning_ids + sep for p in pairs])
        out["za"] = (distinct, [p.action_ids for p in pairs], col)
        col, distinct = prompt_columns([p.prompt_ids + sep for p in pairs])
        out["xa"] = (distinct, [p.action_ids for p in pairs], col)
    return out


def _longest_context(pair: ScoringPair, answer_prefix_ids: Sequence[int] | None) -> int:
    """Tokens of the longest context the pair is scored under (prompt + reasoning +
    answer prefix for I(Z;A)); a pair whose context fills the model window is left out."""
    if answer_prefix_ids is None:
        return len(pair.prompt_ids)
    return len(pair.prompt_ids) + len(pair.reasoning_ids) + len(answer_prefix_ids)


def information_chain(
    model,
    pairs: Sequence[ScoringPair],
    temperature: float = 1.0,
    *,
    answer_prefix_ids: Sequence[int] | None = None,
    ema_state: dict[str, dict | None] | None = None,
    method: ScoringMethod = "auto",
    batch_size: int = 128,
    max_continuation_tokens: int | None = None,
    uncertainty: Uncertainty | None = None,
    rng: np.random.Generator | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> ChainResult:
    """I(X;Z) proxies for ``pairs`` and, given ``answer_prefix_ids``, I(Z;A) and I(X;A).

    Pairs with empty reasoning are dropped from every link (``valid_reasoning_rate``);
    pairs with an empty action are also dropped from za/xa (``valid_action_rate``).
    A link left with no pair is not scored: its metrics are the counts (``num_pairs``
    0) and the valid rates, so a policy that writes no reasoning is reported, not fatal.
    ``ema_state`` is the previous call's ``ChainResult.ema_state`` (one per link).
    ``uncertainty`` adds intervals and the permutation test to every link's proxies.
    """
    ema_state = dict(ema_state or {})
    metrics: dict[str, dict[str, float]] = {}
    info: dict[str, dict[str, Any]] = {}
    matrices: dict[str, tuple[CrossScores, np.ndarray]] = {}
    reasoning_rate = valid_reasoning_rate([p.reasoning_ids for p in pairs])
    window = getattr(model.config, "max_position_embeddings", None)
    fits = [p for p in pairs if window is None or _longest_context(p, answer_prefix_ids) < window]
    with_reasoning = [p for p in fits if len(p.reasoning_ids) > 0]
    with_action = [p for p in with_reasoning if len(p.action_ids) > 0]
    links = chain_inputs(with_reasoning, answer_prefix_ids)
    if answer_prefix_ids is not None:
        action_links = chain_inputs(with_action, answer_prefix_ids)
        links["za"], links["xa"] = action_links["za"], action_links["xa"]
    for link, (contexts, continuations, column) in links.items():
        scores = cross_score_pairs(
            model,
            contexts,
            continuations,
            temperature,
            method=method,
            batch_size=batch_size,
            max_continuation_tokens=max_continuation_tokens,
            chunk_tokens=chunk_tokens,
        )
        started = time.perf_counter()
        link_metrics, ema_state[link] = mi_proxies(
            scores.L, scores.S, column, ema_state.get(link), uncertainty, rng
        )
        scores.info["proxy_seconds"] = time.perf_counter() - started  # intervals and test included
        if link == "xz":
            if reasoning_rate is not None:
                link_metrics["valid_reasoning_rate"] = reasoning_rate
            link_metrics["context_too_long"] = float(len(pairs) - len(fits))
            link_metrics["truncated_reasoning"] = float(scores.info["truncated_reasoning"])
        else:
            if with_reasoning:
                link_metrics["valid_action_rate"] = len(with_action) / len(with_reasoning)
            link_metrics["truncated_action"] = float(scores.info["truncated_reasoning"])
        metrics[link], info[link], matrices[link] = link_metrics, scores.info, (scores, column)
    return ChainResult(
        metrics=metrics,
        ema_state=ema_state,
        info=info,
        scores=matrices,
        contexts={link: list(links[link][0]) for link in matrices},
    )
