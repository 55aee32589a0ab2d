"""Do the MI proxies' 95 % intervals cover what they estimate? Coverage on known answers.

Policies: the alarm benchmark's pools (`benchmarks/alarm_quality.py`): the known-answer
harness's micro model fine-tuned on a mixture in which a share q of the replies are
input-independent templates and the rest copy the prompt, q in {0, 0.25, 0.5, 0.75, 1}
(grounded, mixed, input-blind).  Each pool is the population: ``--pool-prompts`` prompts
with ``--pool-replies`` sampled replies each, every reply scored under every prompt.

Estimands.  A proxy of a batch estimates a property of its distribution over batches of
the same shape (8 prompts, 4 replies each: the quickstart's first-turn shape) drawn from
the policy; the in-batch MI of N prompts is bounded by log N, so that distribution, not the
pool's MI, is what one batch can know.  Two properties, both computed from the same
``--truth-draws`` batches: the **median** (the estimand since 2026-11-28: the jackknife's
intervals are symmetric on a scale that is a monotone map of the proxy, and a monotone map
carries a median across and a mean not; history/2026-11-28.md, "The intervals against the
median") and the **mean** (the estimand before; its standard error is printed, far below
the intervals' widths except where the mean is carried by rare batches, like the grounded
policy's z-score whose batches without a misread divide by a near-zero spread).

Measured, per share and interval method (``jackknife``: delete one prompt, a Student-t
interval around the estimate; ``bootstrap``: the percentile interval by prompt, widened
to hold the estimate): the share of ``--batches`` independent batches whose interval
holds each estimand (Wilson 95 % interval of that share), the mean and median width, and where the
estimate sits in its interval (0 = lower edge, 1 = upper edge).

    python benchmarks/interval_coverage.py                      # 200 batches per share
    python benchmarks/interval_coverage.py --batches 50 --truth-draws 2000   # quick look
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from alarm_quality import SHARES, build_pool, draw_point
from scipy import stats

from tether.diagnostics.mi import mi_proxies
from tether.diagnostics.uncertainty import Uncertainty
from tether.testing.harness import HarnessConfig, torch_threads

KEYS = ("mi_estimate", "mi_zscore", "mi_seq_estimate", "retrieval_acc", "conditional_entropy_est")
METHODS = ("jackknife", "bootstrap", "log_jackknife")
CENTRES = {"median": np.median, "mean": np.mean}


def estimands(pool, draws: int, rng: np.random.Generator, shape) -> tuple[dict, dict]:
    """Median and mean of each proxy over ``draws`` batches of the pool (``{"median":
    {key: value}, "mean": {...}}``), and the mean's standard error."""
    values = {key: [] for key in KEYS}
    for _ in range(draws):
        L, S, column = draw_point(pool, rng, *shape)
        metrics, _ = mi_proxies(L, S, column)
        for key in KEYS:
            values[key].append(metrics[key])
    return (
        {name: {k: float(f(v)) for k, v in values.items()} for name, f in CENTRES.items()},
        {k: float(np.std(v) / np.sqrt(len(v))) for k, v in values.items()},
    )


def coverage(pool, truths: dict, batches: int, method: str, rng: np.random.Generator, shape):
    """Per estimand and proxy: batches whose interval holds it; per proxy: the intervals'
    widths and where the estimate sits in its interval (its mean)."""
    settings = Uncertainty(permutations=0, interval=method)
    hits = {(name, key): 0 for name in truths for key in KEYS}
    widths = {key: [] for key in KEYS}
    place = {key: [] for key in KEYS}
    for _ in range(batches):
        L, S, column = draw_point(pool, rng, *shape)
        metrics, _ = mi_proxies(L, S, column, None, settings, rng)
        for key in KEYS:
            low, high = metrics[f"{key}_ci_low"], metrics[f"{key}_ci_high"]
            for name, truth in truths.items():
                hits[name, key] += low <= truth[key] <= high
            widths[key].append(high - low)
            if high > low:
                place[key].append((metrics[key] - low) / (high - low))
    return hits, {key: (widths[key], np.mean(place[key]) if place[key] else np.nan) for key in KEYS}


def wilson(k: int, n: int) -> str:
    ci = stats.binomtest(k, n).proportion_ci(method="wilson")
    return f"{k / n:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--truth-draws", type=int, default=20000)
    parser.add_argument("--pool-prompts", type=int, default=96)
    parser.add_argument("--pool-replies", type=int, default=12)
    parser.add_argument(
        "--shape",
        type=int,
        nargs=2,
        default=(8, 4),
        metavar=("PROMPTS", "REPLIES"),
        help="a batch: distinct prompts x replies each (8 4: the quickstart's first turn; "
        "64 1: the probe set's)",
    )
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    started = time.perf_counter()
    cfg = HarnessConfig(seed=args.seed)
    with torch_threads(1):
        torch.manual_seed(args.seed)
        pools = {
            q: build_pool(q, cfg, args.pool_prompts, args.pool_replies, args.seed) for q in SHARES
        }
    print(f"pools built in {time.perf_counter() - started:.0f} s (seed {args.seed})")
    rng = np.random.default_rng(args.seed)
    totals = {(e, m, k): [0, 0] for e in CENTRES for m in args.methods for k in KEYS}
    for q in SHARES:
        truths, se = estimands(pools[q], args.truth_draws, rng, args.shape)
        print(f"\nshare q={q:g}:")
        for name, truth in truths.items():
            print(f"  {name:6} " + ", ".join(f"{k} {truth[k]:.4f}" for k in KEYS))
        print("  se of the mean " + ", ".join(f"{k} {se[k]:.4f}" for k in KEYS))
        for method in args.methods:
            hits, spread = coverage(pools[q], truths, args.batches, method, rng, args.shape)
            for key, (width, place) in spread.items():
                held = []
                for name in CENTRES:
                    totals[name, method, key][0] += hits[name, key]
                    totals[name, method, key][1] += args.batches
                    held.append(f"{name} {wilson(hits[name, key], args.batches)}")
                print(
                    f"  {method:13} {key:24} coverage: {'; '.join(held)}  "
                    f"width mean {np.mean(width):.4g} median {np.median(width):.4g}  "
                    f"estimate at {place:.2f} of its interval"
                )
    for name in CENTRES:
        print(f"\nall shares, against the {name}:")
        for (estimand, method, key), (hits, n) in totals.items():
            if estimand == name:
                print(f"  {method:13} {key:24} coverage {wilson(hits, n)}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
