"""Cross-scoring for the MI proxies: naive re-encoding vs prefix KV reuse, side by side.

Workload (the paper's batch at Sokoban-like lengths): 8 distinct prompts x 16
samples = M = 128 (prompt, reasoning) pairs, N = 8 columns, so M x N = 1024 scored
sequences. Prompts are 240-260 random token ids sharing a 150-token "system"
prefix, each ending with a fixed <think> id; reasonings are 30-50 tokens.
Model: the 4.3 M-parameter ``tiny`` Qwen2 (random init, seed 0), fp32, 2 threads,
its default attention implementation unless ``--attn`` says otherwise.

Methods (tether.diagnostics.crossscore):
- ``naive``: every (prompt, reasoning) pair encoded as one sequence, 128 per forward;
- ``prefix``: each prompt encoded once, its DynamicCache expanded to the 128
  reasonings, which are scored in one right-padded, masked forward;
- ``shared_prefix``: same, but the reasonings attend to the batch-1 prefix cache
  through a custom attention function: the prefix K/V are never copied per row.

Timing alternates naive / prefix / shared_prefix, after one untimed warm-up each,
and reports medians of wall time and of process CPU time (the latter is the
steadier ratio on a shared, oversubscribed machine); the matrices must agree with
naive to 1e-4.

    python benchmarks/crossscore.py                  # 3 repeats (~5 min on 2 busy cores)
    python benchmarks/crossscore.py --repeats 1 --attn sdpa
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tether.diagnostics.crossscore import cross_score_pairs  # noqa: E402
from tether.policy.tiny import build_tiny_model, tiny_config  # noqa: E402

THINK = 7
METHODS = ("naive", "prefix", "shared_prefix")


def make_workload(
    n_prompts: int, samples: int, seed: int
) -> tuple[list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(seed)
    system = rng.integers(10, 512, size=150).tolist()
    prompts = [
        system + rng.integers(10, 512, size=int(rng.integers(89, 110))).tolist() + [THINK]
        for _ in range(n_prompts)
    ]
    reasonings = [
        rng.integers(10, 512, size=int(rng.integers(30, 51))).tolist()
        for _ in range(n_prompts * samples)
    ]
    return prompts, reasonings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per method (median reported)"
    )
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts N")
    parser.add_argument(
        "--samples", type=int, default=16, help="samples per prompt (M = prompts x samples)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=128, help="sequences / continuations per forward"
    )
    parser.add_argument(
        "--attn", default=None, help="attention implementation (default: the model's)"
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = build_tiny_model(tiny_config("tiny"), seed=0)
    if args.attn:
        model.set_attn_implementation(args.attn)
    prompts, reasonings = make_workload(args.prompts, args.samples, seed=0)
    print(
        f"tiny model ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params, "
        f"attn={model.config._attn_implementation}), torch {torch.__version__}, "
        f"transformers {transformers.__version__}, {args.threads} threads, {platform.machine()}"
    )
    print(
        f"M={len(reasonings)} pairs x N={len(prompts)} prompts; prompt tokens "
        f"{min(map(len, prompts))}-{max(map(len, prompts))}, reasoning tokens "
        f"{min(map(len, reasonings))}-{max(map(len, reasonings))}"
    )

    def score(method):
        return cross_score_pairs(
            model, prompts, reasonings, 1.0, method=method, batch_size=args.batch_size
        )

    reference = {m: score(m) for m in METHODS}  # warm-up, and the agreement check
    for method in METHODS[1:]:
        diff_s = float(np.abs(reference[method].S - reference["naive"].S).max())
        diff_l = float(np.abs(reference[method].L - reference["naive"].L).max())
        print(f"max |{method} - naive|: S {diff_s:.2e}, L {diff_l:.2e}")
        assert diff_s <= 1e-4 and diff_l <= 1e-4, f"{method} disagrees with naive"

    wall: dict[str, list[float]] = {m: [] for m in METHODS}
    cpu: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(args.repeats):
        for method in METHODS:  # alternating
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            score(method)
            wall[method].append(time.perf_counter() - start_wall)
            cpu[method].append(time.process_time() - start_cpu)
    med_wall = {m: statistics.median(t) for m, t in wall.items()}
    med_cpu = {m: statistics.median(t) for m, t in cpu.items()}
    print(
        f"\nmedians of {args.repeats} alternating runs; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print("| method | wall s (runs) | speed-up (wall) | process CPU s | speed-up (CPU) |")
    print("|---|---|---|---|---|")
    for m in METHODS:
        runs = ", ".join(f"{t:.1f}" for t in wall[m])
        print(
            f"| {m} | {med_wall[m]:.1f} ({runs}) | {med_wall['naive'] / med_wall[m]:.1f}x "
            f"| {med_cpu[m]:.1f} | {med_cpu['naive'] / med_cpu[m]:.1f}x |"
        )


if __name__ == "__main__":
    main()
