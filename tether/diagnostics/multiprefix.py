"""Cross-scoring with many prefixes per forward (``method="multi_prefix"``, the default).

`crossscore` (method ``prefix``) encodes one context at a time (a batch-1 forward) and then
scores the continuations against it, one model call per context and chunk. With
many short contexts and short continuations (the information chain: I(Z;A) has one
context per pair and actions of a few tokens) those small calls dominate. Here:

- contexts are encoded in batches (right-padded, sorted by length), and the KV cache
  of the batch is kept as is: [C, Hkv, P_max, D] per layer plus a validity mask;
- one forward scores a chunk of continuations under C contexts at once: row
  (c, i) = continuation i after context c, at positions P_c .. P_c+W-2, attending to
  its own context's (masked) prefix through `_multi_prefix_attention` — the prefix is
  never copied per row;
- continuations are cut into length-homogeneous chunks (`length_chunks`) so short
  continuations are not padded to the longest one.

The scores are the same quantity as every other method's (tested against ``naive``
to 1e-4): S[i, j] = Σ_t log softmax(logits/τ)[y_i,t] given c_j and y_i,<t.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..algos.attention import prefix_and_causal_weights, register_attention
from ..algos.micro_batches import length_chunks
from ..algos.vocab import (
    DEFAULT_CHUNK_TOKENS,
    head_logits,
    model_states,
    returned_cache,
    split_head,
)
from .scoring import right_pad, target_logprobs

MULTI_PREFIX_ATTENTION = "tether_multi_prefix"


@register_attention(MULTI_PREFIX_ATTENTION, "multi_prefix")
def _multi_prefix_attention(module, query, key, value, scale: float, multi_prefix):
    """Attention of C x R rows (R continuations under each of C contexts) over their
    own context's cached prefix plus their own tokens.

    query [C*R, Hq, T, D] (row c*R + r is continuation r under context c); key/value
    [C*R, Hkv, T, D] (own tokens, rotated at positions P_c..); ``multi_prefix`` =
    (per-layer [(keys [C, Hkv, P, D], values)], valid [C, P] bool). Returns
    [C*R, T, Hq, D].
    """
    layers, valid = multi_prefix
    prefix_k, prefix_v = layers[module.layer_idx]  # [C, Hkv, P, D]
    c, hkv, p, d = prefix_k.shape
    bt, hq, t, _ = query.shape
    r, g = bt // c, hq // hkv
    q = (
        (query.float() * scale).reshape(c, r, hkv, g, t, d).permute(0, 2, 1, 3, 4, 5)
    )  # [C, Hkv, R, g, T, D]
    s_pre = torch.bmm(
        q.reshape(c * hkv, r * g * t, d), prefix_k.float().reshape(c * hkv, p, d).transpose(1, 2)
    )
    s_pre = s_pre.view(c, hkv, r, g, t, p).masked_fill(
        ~valid[:, None, None, None, None, :], float("-inf")
    )
    k_own = (
        key.float().reshape(c, r, hkv, t, d).permute(0, 2, 1, 3, 4).unsqueeze(3)
    )  # [C, Hkv, R, 1, T, D]
    v_own = value.float().reshape(c, r, hkv, t, d).permute(0, 2, 1, 3, 4).unsqueeze(3)
    s_own = torch.matmul(q, k_own.transpose(-1, -2))  # [C, Hkv, R, g, T, T]
    e_pre, e_own, denom = prefix_and_causal_weights(s_pre, s_own)
    out = torch.bmm(e_pre.reshape(c * hkv, r * g * t, p), prefix_v.float().reshape(c * hkv, p, d))
    out = (
        out.view(c, hkv, r, g, t, d) + torch.matmul(e_own, v_own)
    ) / denom  # [C, Hkv, R, g, T, D]
    return out.permute(0, 2, 4, 1, 3, 5).reshape(bt, t, hq, d)  # head = kv * g + group


def _encode_contexts(model, contexts: Sequence[Sequence[int]], device):
    """One right-padded forward over contexts: per-layer KV [C, Hkv, P, D], valid [C, P],
    each context's length [C] and the logits at its last token [C, V].

    The last tokens sit at different positions, so their hidden states are gathered and
    only those C rows go through the head.  (A per-row 2-D ``logits_to_keep`` would do
    the same inside the model, but transformers accepts one only from 5.21.)"""
    ids, mask = right_pad(contexts, device)
    lengths = mask.sum(dim=1)  # [C]
    rows = torch.arange(len(contexts), device=device)
    split = split_head(model)
    if split is None:  # a head that is not a plain linear map: all [C, P, V] logits
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        last_logits = out.logits[rows, lengths - 1]  # [C, V]
    else:
        backbone, head = split
        out = backbone(input_ids=ids, attention_mask=mask, use_cache=True)
        last_logits = head_logits(out.last_hidden_state[rows, lengths - 1], head)  # [C, V]
    kv = [(layer.keys, layer.values) for layer in returned_cache(out).layers]
    return kv, mask.bool(), lengths, last_logits


def score_multi_prefix(
    model,
    contexts,
    continuations,
    temperature: float,
    batch_size: int,
    context_batch: int = 16,
    max_tokens: int = 8192,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> np.ndarray:
    """S [M, N]: every continuation under every context, many contexts per forward.

    ``batch_size`` caps the continuations per chunk; ``context_batch`` the contexts
    encoded per forward; ``max_tokens`` the rows x width of one scoring forward.
    """
    from ..algos.attention import attention_implementation

    device = next(model.parameters()).device
    m, n = len(continuations), len(contexts)
    chunks = [
        (rows, *right_pad([continuations[i] for i in rows], device))
        for rows in length_chunks([len(y) for y in continuations], batch_size)
    ]
    scores = np.zeros((m, n), dtype=np.float64)
    ctx_order = np.argsort(
        [len(x) for x in contexts], kind="stable"
    )  # similar lengths: less padding
    for start in range(0, n, context_batch):
        block = ctx_order[start : start + context_batch]
        kv, valid, ctx_len, last_logits = _encode_contexts(
            model, [contexts[j] for j in block], device
        )
        for rows, ids, mask in chunks:
            r, width = ids.shape
            c_all = len(block)
            # The first continuation token is predicted by each context's last position.
            total = target_logprobs(
                last_logits[:, None, :].expand(c_all, r, -1),
                ids[None, :, 0].expand(c_all, r),
                temperature,
            ).double()  # [C, R]
            if width > 1:
                step = max(1, max_tokens // (r * (width - 1)))  # contexts per forward
                for c0 in range(0, c_all, step):
                    c1 = min(c_all, c0 + step)
                    c = c1 - c0
                    p = int(ctx_len[c0:c1].max())
                    sub_kv = [(k[c0:c1, :, :p], v[c0:c1, :, :p]) for k, v in kv]
                    inputs = ids[:, :-1].repeat(c, 1)  # [C*R, W-1]
                    positions = (
                        (ctx_len[c0:c1, None, None] + torch.arange(width - 1, device=device))
                        .expand(c, r, -1)
                        .reshape(c * r, -1)
                    )
                    with attention_implementation(model, MULTI_PREFIX_ATTENTION):
                        states, head = model_states(
                            model,
                            input_ids=inputs,
                            position_ids=positions,
                            use_cache=False,
                            multi_prefix=(sub_kv, valid[c0:c1, :p]),
                        )  # [C*R, W-1, H]
                    logp = target_logprobs(
                        states, ids[:, 1:].repeat(c, 1), temperature, head, chunk_tokens
                    )
                    total[c0:c1] += (logp.double() * mask[:, 1:].repeat(c, 1)).sum(dim=1).view(c, r)
            scores[np.ix_(rows, block)] = total.T.cpu().numpy()
    return scores
