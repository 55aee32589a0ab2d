"""Gradient signal-to-noise by reward-variance bucket (docs/methods.md, section 10).

The task (policy-gradient) gradient of a prompt scales with the spread of its
group's rewards; the regularisers' (KL, entropy) does not. Bucketing groups by
reward variance (RV) and measuring both gradient norms separately per bucket
reproduces the paper's finding: task-gradient norm grows with RV, the
regulariser's stays flat, so low-RV prompts carry mostly input-agnostic signal.

    buckets = rv_buckets(group_reward_std, n_buckets=6)
    rows = bucket_grad_norms(model, task_loss_fn, reg_loss_fn, buckets, group_reward_std)
    metrics = grad_snr_metrics(rows)      # grad_snr/q1/task_grad_norm, ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

LossFn = Callable[[list[int]], torch.Tensor]


def rv_buckets(group_reward_std: np.ndarray, n_buckets: int = 6) -> list[list[int]]:
    """Split group indices into ``n_buckets`` equal-count quantile buckets by reward variance.

    Groups are ranked by RV (ties keep batch order) and the ranking is cut into
    contiguous, near-equal parts, lowest RV first. Buckets are never empty: with fewer
    groups than buckets there are as many buckets as groups (none for no groups).
    """
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1, got {n_buckets}")
    rv = np.asarray(group_reward_std, dtype=np.float64).reshape(-1)
    if len(rv) == 0:
        return []
    order = np.argsort(rv, kind="stable")
    parts = np.array_split(order, min(n_buckets, len(order)))
    return [[int(i) for i in part] for part in parts if len(part)]


def _grad_norm(loss: torch.Tensor, params: list[torch.nn.Parameter]) -> float:
    """L2 norm of d loss / d params from its own backward pass; never touches ``.grad``.

    The graph is retained so the task and regulariser losses may share one forward
    (it is freed with the loss tensors when the caller drops them).
    """
    if not loss.requires_grad:
        return 0.0
    grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
    squares = [g.detach().double().pow(2).sum() for g in grads if g is not None]
    return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


def bucket_grad_norms(
    model: torch.nn.Module,
    task_loss_fn: LossFn,
    reg_loss_fn: LossFn,
    buckets: Sequence[Sequence[int]],
    group_reward_std: np.ndarray | None = None,
) -> list[dict[str, float]]:
    """Per bucket, the task-loss and regulariser-loss gradient norms, measured separately.

    ``task_loss_fn(group_indices)`` / ``reg_loss_fn(group_indices)`` return the scalar
    losses of those groups (separate forwards, or two outputs of one cached forward:
    the graph is retained between the two passes). Each gradient comes from its
    own backward pass via ``torch.autograd.grad``, so nothing accumulates in, or is
    left on, the parameters' ``.grad`` (an in-progress accumulation is untouched).

    Returns one dict per bucket: ``bucket`` (1-based, lowest RV first), ``num_groups``,
    ``task_grad_norm``, ``reg_grad_norm``, ``snr`` = task / reg (absent when the
    regulariser gradient is zero, e.g. kl_coef = entropy_coef = 0) and, given
    ``group_reward_std``, ``mean_rv``.
    """
    params, rv = _trainable_and_rv(model, group_reward_std)
    rows = []
    for k, bucket in enumerate(buckets, start=1):
        groups = [int(g) for g in bucket]
        row: dict[str, float] = {"bucket": float(k), "num_groups": float(len(groups))}
        row["task_grad_norm"] = _grad_norm(task_loss_fn(groups), params)
        row["reg_grad_norm"] = _grad_norm(reg_loss_fn(groups), params)
        rows.append(_with_ratio_and_rv(row, rv, groups))
    return rows


def _trainable_and_rv(
    model: torch.nn.Module, group_reward_std: np.ndarray | None
) -> tuple[list[torch.Tensor], np.ndarray | None]:
    """The parameters that get gradients, and the groups' reward std as a flat array."""
    params = [p for p in model.parameters() if p.requires_grad]
    rv = (
        None
        if group_reward_std is None
        else np.asarray(group_reward_std, dtype=np.float64).reshape(-1)
    )
    return params, rv


def _with_ratio_and_rv(
    row: dict[str, float], rv: np.ndarray | None, groups: list[int]
) -> dict[str, float]:
    """A bucket's row completed with its SNR (task / regulariser norm) and mean RV."""
    if row["reg_grad_norm"] > 0:
        row["snr"] = row["task_grad_norm"] / row["reg_grad_norm"]
    if rv is not None and groups:
        row["mean_rv"] = float(rv[groups].mean())
    return row


def bucket_grad_norms_accumulated(
    model: torch.nn.Module,
    parts_fn: Callable[[list[int]], Iterable[tuple[torch.Tensor, torch.Tensor]]],
    buckets: Sequence[Sequence[int]],
    group_reward_std: np.ndarray | None = None,
) -> list[dict[str, float]]:
    """As `bucket_grad_norms`, for buckets whose losses come in parts (micro-batches).

    ``parts_fn(group_indices)`` yields ``(task_part, reg_part)`` per micro-batch, each pair
    from one forward, with the parts summing to the bucket's task and regulariser losses
    (e.g. a shared aggregation denominator). Per part, each gradient comes from its own
    ``torch.autograd.grad`` pass; the task and regulariser gradients are summed over the
    parts separately, so the norms are those of the whole bucket's two losses.
    """
    params, rv = _trainable_and_rv(model, group_reward_std)
    rows = []
    for k, bucket in enumerate(buckets, start=1):
        groups = [int(g) for g in bucket]
        sums: dict[str, list[torch.Tensor | None]] = {
            "task": [None] * len(params),
            "reg": [None] * len(params),
        }
        for task, reg in parts_fn(groups):
            for name, loss in (("task", task), ("reg", reg)):
                if not loss.requires_grad:
                    continue
                grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
                acc = sums[name]
                for i, g in enumerate(grads):
                    if g is not None:
                        acc[i] = (
                            g.detach().double() if acc[i] is None else acc[i] + g.detach().double()
                        )
        row: dict[str, float] = {"bucket": float(k), "num_groups": float(len(groups))}
        for name in ("task", "reg"):
            squares = [g.pow(2).sum() for g in sums[name] if g is not None]
            row[f"{name}_grad_norm"] = float(torch.stack(squares).sum().sqrt()) if squares else 0.0
        rows.append(_with_ratio_and_rv(row, rv, groups))
    return rows


def grad_snr_metrics(
    rows: Sequence[dict[str, float]], prefix: str = "grad_snr"
) -> dict[str, float]:
    """Flatten `bucket_grad_norms` rows to ``{prefix}/q{k}/{task_grad_norm|reg_grad_norm|snr|mean_rv}``."""
    metrics = {}
    for row in rows:
        k = int(row["bucket"])
        for key in ("task_grad_norm", "reg_grad_norm", "snr", "mean_rv", "num_groups"):
            if key in row:
                metrics[f"{prefix}/q{k}/{key}"] = row[key]
    return metrics
