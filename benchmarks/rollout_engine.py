"""HFRolloutEngine vs ``model.generate`` on the same batch and model, side by side.

Model: the 4.3 M-parameter ``tiny`` Qwen2 (random init, seed 0), fp32, 2 threads.
Prompts: random token ids, lengths uniform in [100, 300], batches of 64 and 128.
Each scenario samples up to 64 new tokens at temperature 1 (full distribution:
``top_k=0`` for ``generate``, whose default would be 50):

- ``no-stop``: no stop tokens, so both sides produce exactly batch x 64 tokens;
- ``stop``: stop tokens ending rows at different lengths.  The random model's most
  frequent tokens (from one calibration run on other prompts) are used, as few as
  needed for a ~3% stop chance per step; on the benchmark prompts replies end at
  varied lengths, ~45 tokens on average, capped at 64.

Timing alternates A B A B A B after one untimed warm-up each; medians are reported
(wall seconds, and process CPU seconds, which show when other processes compete).
Tokens/s counts generated tokens (not padding): up to and including the stop token,
per row.  Our engine also returns per-token log-probs; ``generate`` does not.

    python benchmarks/rollout_engine.py            # full table (~4 min on a quiet 2-core box)
    python benchmarks/rollout_engine.py --quick    # batch 64 only, 1 rep
    python benchmarks/rollout_engine.py --threads 1 --attn sdpa
    python benchmarks/rollout_engine.py --flops    # issue 8: fraction of the matmul peak, batch 128

``--flops`` measures the machine's fp32 matmul peak once (median of 5 square
``torch.mm`` of size 2048, 2 x n^3 FLOP each), then the no-stop scenario at batch
128 (every row makes 64 tokens) on two prompt sets -- ``distinct`` (128 different
prompts, as above) and ``grpo`` (8 prompts x 16 samples, lengths 100-300, the
shape of a GRPO batch) -- and reports each side's achieved FLOP/s as
2 x parameters x generated tokens/s (the matmul FLOP of a decode token; attention
over the cache is not counted) and its fraction of the peak.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tether.policy.tiny import build_tiny_model, tiny_config  # noqa: E402
from tether.rollout import HFRolloutEngine, SamplingParams  # noqa: E402

PAD = 0
MAX_NEW = 64


def make_prompts(batch: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(100, 301, (batch,), generator=g).tolist()
    return [torch.randint(1, 512, (n,), generator=g).tolist() for n in lengths]


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def count_until_stop(rows: list[list[int]], stop_ids: tuple[int, ...]) -> int:
    """Generated tokens per row, up to and including the first stop token."""
    total = 0
    for row in rows:
        n = len(row)
        for j, t in enumerate(row):
            if t in stop_ids:
                n = j + 1
                break
        total += n
    return total


def run_ours(engine, prompts, stop_ids, seed) -> int:
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0, stop_token_ids=stop_ids)
    return sum(len(g.token_ids) for g in engine.generate(prompts, params, seed=seed))


def run_hf(model, ids, mask, stop_ids, seed) -> int:
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=MAX_NEW,
            pad_token_id=PAD,
            eos_token_id=list(stop_ids) or None,
        )
    return count_until_stop(out[:, ids.shape[1] :].tolist(), stop_ids)


def calibrate_stop_ids(engine, prompts, target: float = 0.03) -> tuple[int, ...]:
    """The model's most frequent sampled tokens, as few as give >= target stop chance per step."""
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=MAX_NEW), seed=12345)
    counts = torch.bincount(torch.tensor([t for g in gens for t in g.token_ids]), minlength=512)
    freq = counts.float() / counts.sum()
    ranked = freq.argsort(descending=True).tolist()
    chosen, mass = [], 0.0
    for t in ranked:
        chosen.append(t)
        mass += float(freq[t])
        if mass >= target:
            break
    return tuple(chosen)


def timed(fn) -> tuple[float, int, float]:
    """(wall seconds, tokens, process CPU seconds): CPU time shows contention from other processes."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = fn()
    return time.perf_counter() - t0, n, time.process_time() - c0


def make_group_prompts(batch: int, group: int, seed: int) -> list[list[int]]:
    """batch / group distinct prompts, each repeated ``group`` times (adjacent)."""
    return [p for p in make_prompts(batch // group, seed) for _ in range(group)]


def bench(
    model,
    engine,
    batch: int,
    stop_ids: tuple[int, ...],
    reps: int,
    prompts: list[list[int]] | None = None,
) -> dict:
    prompts = prompts or make_prompts(batch, seed=batch)
    ids, mask = left_pad(prompts)
    run_a = lambda rep: run_ours(engine, prompts, stop_ids, seed=rep)  # noqa: E731
    run_b = lambda rep: run_hf(model, ids, mask, stop_ids, seed=rep)  # noqa: E731
    run_a(-1), run_b(-1)  # warm-up
    a, b = [], []
    for rep in range(reps):
        a.append(timed(lambda rep=rep: run_a(rep)))
        b.append(timed(lambda rep=rep: run_b(rep)))
    med = lambda runs, i: statistics.median(r[i] for r in runs)  # noqa: E731
    tps = lambda runs: statistics.median(n / t for t, n, _ in runs)  # noqa: E731
    return {
        "ours_s": med(a, 0),
        "hf_s": med(b, 0),
        "ours_tok": med(a, 1),
        "hf_tok": med(b, 1),
        "ours_cpu": med(a, 2),
        "hf_cpu": med(b, 2),
        "ours_tps": tps(a),
        "hf_tps": tps(b),
    }


def matmul_peak(n: int = 2048, reps: int = 5) -> float:
    """fp32 FLOP/s of a large square ``torch.mm`` (median of ``reps`` after a warm-up)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def flops_report(model, engine, reps: int) -> None:
    params = sum(p.numel() for p in model.parameters())
    peak = matmul_peak()
    print(f"fp32 matmul peak (2048^3 torch.mm, median of 5): {peak / 1e9:.1f} GFLOP/s", flush=True)
    for name, prompts in (
        ("distinct", make_prompts(128, seed=128)),
        ("grpo", make_group_prompts(128, 16, seed=816)),
    ):
        r = bench(model, engine, 128, (), reps, prompts)
        for side, key in (("HFRolloutEngine", "ours"), ("model.generate", "hf")):
            tps = r[f"{key}_tps"]
            achieved = 2 * params * tps
            print(
                f"{side:16} batch 128 no-stop {name:8}: {tps:7.0f} tokens/s  {achieved / 1e9:6.1f} GFLOP/s  "
                f"{100 * achieved / peak:5.1f} % of peak  (wall {r[f'{key}_s']:.2f} s, "
                f"cpu {r[f'{key}_cpu']:.1f} s)",
                flush=True,
            )
    print(f"matmul peak again after the runs: {matmul_peak() / 1e9:.1f} GFLOP/s")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument(
        "--attn",
        choices=["eager", "sdpa"],
        default=None,
        help="attention implementation for both sides (default: the model's, eager)",
    )
    ap.add_argument("--quick", action="store_true", help="batch 64, 1 rep")
    ap.add_argument(
        "--flops",
        action="store_true",
        help="only the matmul peak and the FLOP fraction at batch 128, no-stop",
    )
    args = ap.parse_args()
    if args.quick:
        args.batches, args.reps = [64], 1
    torch.set_num_threads(args.threads)

    model = build_tiny_model(tiny_config("tiny"), seed=0)
    if args.attn:
        model.set_attn_implementation(args.attn)
    engine = HFRolloutEngine(model, pad_token_id=PAD)
    stop_ids = calibrate_stop_ids(engine, make_prompts(32, seed=7))
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, python "
        f"{platform.python_version()}, threads {torch.get_num_threads()}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params, "
        f"attention {model.config._attn_implementation}, stop ids {stop_ids}"
    )
    if args.flops:
        flops_report(model, engine, args.reps)
        return
    print(
        f"{'scenario':8} {'batch':>5} | {'ours tok':>8} {'ours s':>7} {'cpu s':>6} {'ours tok/s':>10} | "
        f"{'hf tok':>7} {'hf s':>7} {'cpu s':>6} {'hf tok/s':>9} | {'ratio':>5}"
    )
    for scenario, stops in (("no-stop", ()), ("stop", stop_ids)):
        for batch in args.batches:
            r = bench(model, engine, batch, stops, args.reps)
            print(
                f"{scenario:8} {batch:>5} | {r['ours_tok']:>8} {r['ours_s']:>7.2f} {r['ours_cpu']:>6.1f} "
                f"{r['ours_tps']:>10.0f} | {r['hf_tok']:>7} {r['hf_s']:>7.2f} {r['hf_cpu']:>6.1f} "
                f"{r['hf_tps']:>9.0f} | "
                f"{r['ours_tps'] / r['hf_tps']:>4.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
