"""Chunked vocabulary computations (``tether.algos.vocab``) against the unchunked ones.

The reference is computed here from the model's own full logits ([B, T, V] at once):
log-probs, entropies and their gradients must agree to 1e-5 for several chunk sizes,
on the plain forward, the shared-prefix forward and the cross-scoring."""

import copy

import pytest
import torch

from tether.algos.batch import token_logprobs
from tether.algos.shared_prefix import shared_prefix_token_logprobs
from tether.algos.vocab import chunked_logprobs, model_states, split_head
from tether.diagnostics.crossscore import cross_score_pairs
from tether.diagnostics.scoring import target_logprobs
from tether.policy.tiny import build_tiny_model, tiny_config

VOCAB = 1000
CHUNKS = (1, 7, 64, 0)  # 0 = all positions at once


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = tiny_config("micro", vocab_size=VOCAB, eos_token_id=1, pad_token_id=0)
    return build_tiny_model(config, seed=5)


@pytest.fixture(scope="module")
def rows():
    """Two groups of three right-padded rows; each group's rows share a 6-token prompt."""
    gen = torch.Generator().manual_seed(1)
    lengths = [14, 11, 17, 9, 16, 12]
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    prompts = [torch.randint(2, VOCAB, (6,), generator=gen) for _ in range(2)]
    for row, length in enumerate(lengths):
        ids[row, :6] = prompts[row // 3]
        ids[row, 6:length] = torch.randint(2, VOCAB, (length - 6,), generator=gen)
        mask[row, :length] = 1
    return ids, mask, torch.tensor([0, 0, 0, 1, 1, 1])


def reference(model, ids, mask, temperature):
    """The unchunked computation: the full logits, one log-softmax over all of them."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)  # [B, T-1, V]
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    pad = torch.nn.functional.pad
    return pad(picked, (1, 0)), pad(entropy, (1, 0))


def grads_of(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def loss_of(logprobs, entropy, mask):
    """A loss that weighs every real position differently, so a misplaced value shows."""
    weights = torch.linspace(0.5, 1.5, logprobs.numel()).view_as(logprobs) * mask
    return (weights * logprobs).sum() + 0.3 * (weights * entropy).sum()


def test_the_micro_model_splits_into_backbone_and_head(model, rows):
    ids, mask, _ = rows
    backbone, head = split_head(model)
    states, got_head = model_states(model, input_ids=ids, attention_mask=mask)
    assert got_head is head and states.shape == (*ids.shape, model.config.hidden_size)
    torch.testing.assert_close(
        head(states), model(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_chunked_token_logprobs_equal_unchunked_values_and_gradients(
    model, rows, chunk, temperature
):
    ids, mask, _ = rows
    model = copy.deepcopy(model).train()
    ref_lp, ref_ent = reference(model, ids, mask, temperature)
    ref_grads = grads_of(model, loss_of(ref_lp, ref_ent, mask))
    lp, ent = token_logprobs(model, ids, mask, temperature, with_entropy=True, chunk_tokens=chunk)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    grads = grads_of(model, loss_of(lp, ent, mask))
    assert grads.keys() == ref_grads.keys() and "model.embed_tokens.weight" in grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_chunked_shared_prefix_equals_unchunked_values_and_gradients(model, rows, chunk):
    ids, mask, groups = rows
    model = copy.deepcopy(model).train()
    ref_lp, ref_ent = reference(model, ids, mask, 1.0)
    ref_lp, ref_ent = ref_lp * mask, ref_ent * mask  # the shared path holds 0 at padding
    ref_grads = grads_of(model, loss_of(ref_lp, ref_ent, mask))
    lp, ent = shared_prefix_token_logprobs(
        model, ids, mask, groups, with_entropy=True, chunk_tokens=chunk
    )
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    grads = grads_of(model, loss_of(lp, ent, mask))
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-5, msg=name)


def test_chunking_keeps_a_chunks_logits_only_until_its_backward(model, rows):
    """With gradients, each chunk runs checkpointed: autograd keeps no [n, V] tensor
    between the forward and the backward (unchunked, it keeps [B*T, V] ones)."""
    ids, mask, _ = rows
    kept = []

    def pack(tensor):
        kept.append(tensor.numel() if tensor.dim() and tensor.shape[-1] == VOCAB else 0)
        return tensor

    backbone, head = split_head(model)
    states = backbone(input_ids=ids, attention_mask=mask).last_hidden_state.detach()
    states.requires_grad_(True)
    for chunk in (0, 16):
        kept.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, ent = chunked_logprobs(states, ids, head, with_entropy=True, chunk_tokens=chunk)
        if chunk == 0:
            assert max(kept) >= ids.numel() * VOCAB
        else:
            assert max(kept) == 0  # vocabulary-wide tensors are recomputed in the backward
        states.grad = None
        (lp.sum() + ent.sum()).backward()
        assert states.grad is not None and torch.isfinite(states.grad).all()


@pytest.mark.parametrize("chunk", CHUNKS)
def test_chunked_target_logprobs_equal_the_full_logsumexp(model, rows, chunk):
    ids, mask, _ = rows
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        states, head = model_states(model, input_ids=ids, attention_mask=mask)
        expected = target_logprobs(logits, ids, 0.8, chunk_tokens=0)
        scaled = logits.float() / 0.8
        direct = scaled.gather(-1, ids[..., None]).squeeze(-1) - torch.logsumexp(scaled, -1)
        torch.testing.assert_close(expected, direct, rtol=0, atol=1e-6)
        got = target_logprobs(states, ids, 0.8, head, chunk_tokens=chunk)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ["naive", "prefix", "shared_prefix", "multi_prefix"])
def test_cross_scores_do_not_depend_on_the_chunk_size(model, rows, method):
    ids, mask, _ = rows
    seqs = [ids[r, : int(mask[r].sum())].tolist() for r in range(ids.shape[0])]
    contexts = [tuple(s[:6]) for s in seqs[::3]]
    continuations = [tuple(s[6:]) for s in seqs]
    whole = cross_score_pairs(model, contexts, continuations, method=method, chunk_tokens=0)
    for chunk in (1, 5):
        chunked = cross_score_pairs(
            model, contexts, continuations, method=method, chunk_tokens=chunk
        )
        assert abs(chunked.S - whole.S).max() < 1e-5


def read_mask(mask):
    """Positions read: every third real position from 3 on (some inside the shared 6-token
    prompts, so the prefix columns are read for some groups' rows), never position 0."""
    t = torch.arange(mask.shape[1])
    rows = torch.arange(mask.shape[0])[:, None]
    return ((t[None, :] + rows) % 3 == 0) & (t[None, :] >= 3) & (mask > 0)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_head_on_the_read_positions_alone_gives_their_values_and_gradients(
    model, rows, chunk, shared
):
    """``where``: the read positions' log-probs, entropies and gradients are the full
    computation's; every other position is 0."""
    ids, mask, groups = rows
    model = copy.deepcopy(model).train()
    where = read_mask(mask)
    ref_lp, ref_ent = reference(model, ids, mask, 1.0)
    ref_lp, ref_ent = ref_lp * where, ref_ent * where
    ref_grads = grads_of(model, loss_of(ref_lp, ref_ent, where))
    if shared:
        lp, ent = shared_prefix_token_logprobs(
            model, ids, mask, groups, with_entropy=True, chunk_tokens=chunk, where=where
        )
    else:
        lp, ent = token_logprobs(model, ids, mask, 1.0, True, chunk, where=where)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    assert bool((lp[~where] == 0).all()) and bool((ent[~where] == 0).all())
    grads = grads_of(model, loss_of(lp, ent, where))
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=1e-5, msg=name)
