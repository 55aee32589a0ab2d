"""The online diagnostics stage: what the learner computes on a collected batch.

Pure (no Ray): given the current policy and the batch's trajectories, run the
in-batch cross-scoring for each sampling (``first_turn``, ``trajectory``) and
return ``collapse/<sampling>/<proxy>`` metrics (I(X;Z), plus ``za``/``xa`` links of
the information chain), the carried EMA state, and the first sampling's per-token
score matrix for the heatmap artifact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..agent.pairs import SpanExtractor
from ..algos.vocab import DEFAULT_CHUNK_TOKENS
from .crossscore import ScoringPair, information_chain, sample_pairs
from .mi import mi_by_column
from .uncertainty import Uncertainty


@dataclass
class DiagnosticsResult:
    metrics: dict[str, float]
    ema_state: dict
    #: sampling -> (L matrix [M, N], column of each row)
    matrices: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: first_turn sampling: group id -> {"mi": its prompt's pointwise MI (nats/token),
    #: "pairs": its scored pairs}; groups with no scored pair are absent
    prompt_mi: dict[int, dict[str, float]] = field(default_factory=dict)


def prompt_mi_by_group(
    trajectories, spans, contexts: list[tuple[int, ...]], L: np.ndarray, column: np.ndarray
) -> dict[int, dict[str, float]]:
    """First-turn sampling: each group's first-turn prompt is one column of the matrix
    (its trajectories share the level), so each group gets its column's pointwise MI
    (``mi_by_column``).  Groups with identical first prompts share a column."""
    mi, pairs = mi_by_column(L, column)
    index = {prompt: j for j, prompt in enumerate(contexts)}
    out: dict[int, dict[str, float]] = {}
    for trajectory, turns in zip(trajectories, spans):
        if not turns:
            continue
        j = index.get(ScoringPair.from_turn(turns[0]).prompt_ids)
        if j is not None and pairs[j] > 0:
            out[int(trajectory.group_id)] = {"mi": float(mi[j]), "pairs": float(pairs[j])}
    return out


def collapse_diagnostics(
    model,
    trajectories,
    extractor: SpanExtractor,
    samplings,
    max_pairs: int,
    temperature: float,
    ema_state: dict | None,
    seed: int,
    information_chain_links: bool = True,
    method: str = "auto",
    keep_matrices: bool = False,
    max_cells: int | None = None,
    uncertainty: Uncertainty | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> DiagnosticsResult:
    """Degenerate batches are reported, never fatal: a sampling with no turn to score
    logs ``num_pairs`` 0, a link whose pairs have no reasoning (or no action) logs its
    counts and valid rates without proxies."""
    rng = np.random.default_rng(seed)
    spans = [extractor.turns(t) for t in trajectories]
    ema_state = dict(ema_state or {})
    metrics: dict[str, float] = {}
    matrices = {}
    prompt_mi: dict[int, dict[str, float]] = {}
    for sampling in samplings:
        pairs = sample_pairs(spans, sampling, max_pairs, rng, max_cells=max_cells)
        if not pairs:
            metrics[f"collapse/{sampling}/num_pairs"] = 0.0
            continue
        result = information_chain(
            model,
            pairs,
            temperature,
            answer_prefix_ids=extractor.answer_prefix_ids if information_chain_links else None,
            ema_state=ema_state.get(sampling),
            method=method,
            uncertainty=uncertainty,
            rng=rng,
            chunk_tokens=chunk_tokens,
        )
        ema_state[sampling] = result.ema_state
        metrics.update(result.flat(f"collapse/{sampling}"))
        metrics.update(
            {
                f"timing/diagnose/{sampling}/{link}": float(info["seconds"])
                for link, info in result.info.items()
            }
        )
        proxies = sum(float(info.get("proxy_seconds", 0.0)) for info in result.info.values())
        metrics["timing/diagnose/proxies"] = metrics.get("timing/diagnose/proxies", 0.0) + proxies
        scored = "xz" in result.scores and result.scores["xz"][0].L.size
        if scored:
            scores, column = result.scores["xz"]
            if keep_matrices:
                matrices[sampling] = (scores.L, column)
            if sampling == "first_turn":
                prompt_mi = prompt_mi_by_group(
                    trajectories, spans, result.contexts["xz"], scores.L, column
                )
    return DiagnosticsResult(metrics, ema_state, matrices, prompt_mi)


def probe_diagnostics(
    model,
    trajectories,
    extractor: SpanExtractor,
    temperature: float,
    ema_state: dict | None,
    seed: int,
    method: str = "auto",
    uncertainty: Uncertainty | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> DiagnosticsResult:
    """The probe set's I(X;Z) (docs/methods.md, section 2): the first turn of each probe
    episode (one per level) against every probe prompt, all of them (no pair or cell
    cap), so the bound is log(distinct prompts).  Logged as ``collapse/probe/<proxy>``;
    ``ema_state`` is the probe's own (``DiagnosticsResult.ema_state["probe"]``)."""
    result = collapse_diagnostics(
        model,
        trajectories,
        extractor,
        ["first_turn"],
        max(2, len(trajectories)),
        temperature,
        {"first_turn": ema_state} if ema_state else None,
        seed,
        information_chain_links=False,
        method=method,
        uncertainty=uncertainty,
        chunk_tokens=chunk_tokens,
    )
    return DiagnosticsResult(
        {_probe_key(k): v for k, v in result.metrics.items()},
        {"probe": result.ema_state.get("first_turn")},
        prompt_mi=result.prompt_mi,  # per probe level (its group id): its pointwise MI
    )


def _probe_key(key: str) -> str:
    """``collapse/first_turn/…`` -> ``collapse/probe/…``, and its timings likewise."""
    for old, new in (
        ("collapse/first_turn/", "collapse/probe/"),
        ("timing/diagnose/first_turn/", "timing/diagnose/probe/"),
        ("timing/diagnose/proxies", "timing/diagnose/probe/proxies"),
    ):
        if key.startswith(old):
            return new + key[len(old) :]
    return key


def gradient_snr(
    model, batch, settings, n_buckets: int, micro_batched: bool = True
) -> dict[str, float]:
    """Gradient SNR (docs/methods.md, section 10): per reward-variance bucket of groups, the
    task-loss and regulariser-loss gradient norms measured separately (two backward passes of one shared forward),
    their ratio and mean RV.

    ``batch`` holds every collected group (before filtering) with advantages set;
    the losses are those of the update (same clip, coefficients and aggregation).
    ``micro_batched`` (the fast path) runs a bucket the way the update runs a minibatch:
    its rows cut into micro-batches of at most ``settings.micro_batch_size`` as the
    update cuts a minibatch (`micro_batches.plan_micro_batches`: whole groups, each
    group's common prompt computed once, or rows of similar length, whichever computes
    fewer positions), each trimmed of its all-padding columns, with the bucket's
    aggregation denominator, and the per-part gradients summed
    (`bucket_grad_norms_accumulated`).  A part whose advantages are all zero (a group
    whose rewards are all equal) has an exactly zero task gradient, so its task backward
    pass is skipped.  Same losses and norms as one forward over the bucket padded to the
    batch's longest row (``micro_batched=False``, the reference).
    """
    import torch

    from ..algos.batch import token_logprobs
    from ..algos.micro_batches import plan_micro_batches
    from ..algos.update import (
        aggregation_denominator,
        micro_batch_logprobs,
        objective,
        trimmed_rows,
    )
    from .grad_snr import (
        bucket_grad_norms,
        bucket_grad_norms_accumulated,
        grad_snr_metrics,
        rv_buckets,
    )

    device = next(model.parameters()).device
    n_groups = int(batch.group_index.max()) + 1
    group_std = np.array(
        [
            float(batch.scores[batch.group_index == g].std(unbiased=True))
            if int((batch.group_index == g).sum()) > 1
            else 0.0
            for g in range(n_groups)
        ]
    )
    buckets = rv_buckets(group_std, n_buckets)

    def bucket_rows(groups: list[int]):
        return torch.nonzero(torch.isin(batch.group_index, torch.tensor(groups))).squeeze(-1)

    def losses_of(sub, logprobs, entropy, denominator=None):
        # the update's objective at the current policy (old log-probs = these log-probs)
        task, reg, _ = objective(settings, logprobs, logprobs.detach(), sub, entropy, denominator)
        return task, reg

    if micro_batched:

        def parts(groups: list[int]):
            rows = bucket_rows(groups)
            denominator = aggregation_denominator(batch.response_mask[rows], settings.loss_agg)
            for chunk in plan_micro_batches(
                batch, rows, max(1, settings.micro_batch_size), settings.shared_prefix
            ):
                sub = trimmed_rows(batch, chunk, device)
                logprobs, entropy = micro_batch_logprobs(
                    model,
                    sub,
                    settings.temperature,
                    True,
                    settings.shared_prefix,
                    settings.logprob_chunk_tokens,
                )
                task, reg = losses_of(sub, logprobs, entropy, denominator)
                if not bool((sub.advantages * sub.response_mask).any()):
                    task = task.detach()  # zero advantages: exactly zero task gradient
                yield task, reg

        rows = bucket_grad_norms_accumulated(model, parts, buckets, group_std)
    else:
        cache: dict[tuple, tuple] = {}

        def losses(groups: list[int]):
            key = tuple(groups)
            if key not in cache:
                cache.clear()
                sub = batch.select(bucket_rows(groups)).to(device)
                logprobs, entropy = token_logprobs(
                    model,
                    sub.input_ids,
                    sub.attention_mask,
                    settings.temperature,
                    with_entropy=True,
                    chunk_tokens=settings.logprob_chunk_tokens,
                )
                cache[key] = losses_of(sub, logprobs, entropy)
            return cache[key]

        rows = bucket_grad_norms(
            model, lambda g: losses(g)[0], lambda g: losses(g)[1], buckets, group_std
        )
    return grad_snr_metrics(rows)
