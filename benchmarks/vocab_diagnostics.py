"""The collapse diagnostics' cross-scoring at their default sizes on a real-size vocabulary:
time and peak resident memory, chunked against unchunked (``algo.logprob_chunk_tokens``).

A randomly initialised policy never closes ``</think>`` (one id among 151,936), so the
driver's diagnostics find no reasoning to score (``collapse/*/num_pairs`` 0).  This
script collects 4 groups x 4 FrozenLake episodes with the real HF engine and the given
model (as the driver's collect does), cuts every reply into a reasoning (its first
``--reasoning-tokens`` tokens) and an action (the rest), and scores them as
``collapse_diagnostics`` does at the default sizes: both samplings, ``max_pairs`` 32,
``max_cells`` 256, the information chain (I(X;Z), I(Z;A), I(X;A)), ``method=auto``.

``--memory-limit-gb`` caps the process's data segment (RLIMIT_DATA), so a variant that
needs more memory than that fails to allocate instead of pressing a shared machine into
its OOM killer.

    python benchmarks/vocab_diagnostics.py --model /tmp/q05/models/qwen05b-shape-... \\
        --chunk-tokens 1024 --memory-limit-gb 12
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np
import torch

from tether import seeds
from tether.actors.memory import peak_rss_gb
from tether.agent.chat import ChatFormatter
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
from tether.agent.pairs import SpanExtractor, TurnSpans
from tether.diagnostics.crossscore import information_chain, sample_pairs
from tether.platform.config import DiagnosticsConfig
from tether.policy.load import load_model_and_tokenizer
from tether.rollout import make_engine_for
from tether.rollout.base import SamplingParams


def collect_and_score(
    model,
    tokenizer,
    chunk_tokens: int = 1024,
    reasoning_tokens: int = 40,
    max_reply_tokens: int = 48,
    groups: int = 4,
    group_size: int = 4,
    max_turns: int = 2,
) -> dict:
    """Collect ``groups`` x ``group_size`` episodes, cut each reply after its first
    ``reasoning_tokens`` tokens, and cross-score them as the driver's diagnostics do:
    the seconds and peak resident memory of each part (also used by benchmarks/scaling.py)."""
    formatter = ChatFormatter(tokenizer)
    engine = make_engine_for("hf", model, tokenizer)
    specs = [EpisodeSpec(g, 100 + g, k) for g in range(groups) for k in range(group_size)]
    sampling = SamplingParams(
        max_new_tokens=max_reply_tokens, stop_token_ids=(tokenizer.eos_token_id,)
    )
    started = time.perf_counter()
    trajectories = run_episodes(
        engine,
        formatter,
        LocalEnvBatch("tether/FrozenLake-v0", {"size": 4, "frozen_fraction": 0.8}),
        specs,
        sampling,
        seed=seeds.collection(0, 1),
        max_turns=max_turns,
    )
    collect_s = time.perf_counter() - started
    cut = reasoning_tokens
    spans = [
        [
            TurnSpans(
                tuple(t.token_ids[: turn.reply_start]),
                tuple(t.token_ids[turn.reply_start : turn.reply_start + cut]),
                tuple(t.token_ids[turn.reply_start + cut : turn.reply_end]),
            )
            for turn in t.turns
        ]
        for t in trajectories
    ]
    d = DiagnosticsConfig()
    answer_prefix = SpanExtractor(formatter).answer_prefix_ids
    rng = np.random.default_rng(seeds.diagnostics(0, 1))
    result = {
        "chunk_tokens": chunk_tokens,
        "collect_s": round(collect_s, 1),
        "peak_rss_gb_load_and_collect": round(peak_rss_gb(), 2),
        "samplings": {},
    }
    peak_rss_gb(reset=True)
    started = time.perf_counter()
    try:
        with torch.no_grad():
            for sampling_name in d.samplings:
                pairs = sample_pairs(spans, sampling_name, d.max_pairs, rng, max_cells=d.max_cells)
                chain = information_chain(
                    model,
                    pairs,
                    1.0,
                    answer_prefix_ids=answer_prefix,
                    method=d.method,
                    uncertainty=d.uncertainty(),
                    rng=rng,
                    chunk_tokens=chunk_tokens,
                )
                result["samplings"][sampling_name] = {
                    "pairs": len(pairs),
                    "prompts": len({p.prompt_ids for p in pairs}),
                    "seconds": {k: round(v["seconds"], 1) for k, v in chain.info.items()},
                    "mi_estimate": chain.metrics["xz"].get("mi_estimate"),
                }
        result["status"] = "ok"
    except (RuntimeError, MemoryError) as exc:  # the memory limit: allocation refused
        result["status"] = f"failed: {str(exc).splitlines()[0][:200]}"
    result["diagnose_s"] = round(time.perf_counter() - started, 1)
    result["peak_rss_gb_during_diagnostics"] = round(peak_rss_gb(), 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model directory (e.g. qwen05b-shape)")
    parser.add_argument("--chunk-tokens", type=int, default=1024, help="0 = unchunked")
    parser.add_argument("--memory-limit-gb", type=float, default=0.0, help="RLIMIT_DATA; 0 = none")
    parser.add_argument("--reasoning-tokens", type=int, default=40)
    parser.add_argument("--max-reply-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_limit_gb > 0:
        limit = int(args.memory_limit_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    model, tokenizer = load_model_and_tokenizer(args.model, args.dtype)
    result = collect_and_score(
        model,
        tokenizer,
        chunk_tokens=args.chunk_tokens,
        reasoning_tokens=args.reasoning_tokens,
        max_reply_tokens=args.max_reply_tokens,
    )
    result["dtype"] = args.dtype
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
