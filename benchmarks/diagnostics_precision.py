"""The probe set's cross-scoring in float32 against bfloat16 autocast (``diagnostics.autocast``):
time per probe point and how far each MI proxy moves.

The first turns of the probe's levels (``seeds.probe_levels``: the same levels every run of
the env scores) are sampled once by a warm-started model, then scored by
`tether.diagnostics.runner.probe_diagnostics`, alternately in float32 and in bfloat16
autocast (the body in bfloat16, the vocabulary head and the log-softmax in float32, as the
learner runs it), ``--repeats`` times each after one untimed warm-up of each. Reports the
median wall time of each, their ratio, and each proxy (with its interval) under both.

    flock /tmp/tether-cpu.lock env PYTHONPATH=. python benchmarks/diagnostics_precision.py \\
        <warm-started model dir> --levels 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tether import seeds  # noqa: E402
from tether.agent.chat import ChatFormatter  # noqa: E402
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes  # noqa: E402
from tether.agent.format import ANSWER_CLOSE  # noqa: E402
from tether.agent.pairs import SpanExtractor  # noqa: E402
from tether.algos.update import autocast  # noqa: E402
from tether.diagnostics.runner import probe_diagnostics  # noqa: E402
from tether.diagnostics.settings import DiagnosticsConfig  # noqa: E402
from tether.envs.settings import EnvConfig  # noqa: E402
from tether.policy.load import load_model_and_tokenizer  # noqa: E402
from tether.policy.precision import cpu_has_bf16  # noqa: E402
from tether.rollout import SamplingParams, make_engine  # noqa: E402

PROXIES = (
    "mi_estimate",
    "mi_zscore",
    "mi_seq_estimate",
    "conditional_entropy_est",
    "retrieval_acc",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a warm-started model directory (with its recipe.json)")
    parser.add_argument("--levels", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=5, help="seed of the probe's sampling")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    recipe = json.loads((Path(args.model) / "recipe.json").read_text())
    model, tok = load_model_and_tokenizer(args.model)
    formatter = ChatFormatter(tok)
    engine = make_engine(
        "hf", model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id], tokenizer=tok
    )
    [answer_close] = formatter.encode(ANSWER_CLOSE)
    sampling = SamplingParams(
        max_new_tokens=recipe["max_reply_tokens"],
        temperature=1.0,
        stop_token_ids=(answer_close, tok.eos_token_id),
    )
    envs = LocalEnvBatch(recipe["env"], recipe["env_kwargs"])
    levels = seeds.probe_levels(EnvConfig().val_seed_offset, args.levels)
    specs = [EpisodeSpec(k, level, 0) for k, level in enumerate(levels)]
    trajectories = run_episodes(engine, formatter, envs, specs, sampling, args.seed, max_turns=1)
    extractor = SpanExtractor(formatter)
    uncertainty = DiagnosticsConfig().probe_uncertainty()
    print(
        f"{args.model}: {recipe['env']}, {args.levels} probe levels, {args.threads} threads, "
        f"CPU bfloat16 native: {cpu_has_bf16()}, load {os.getloadavg()}",
        flush=True,
    )

    times: dict[str, list[float]] = {"none": [], "bfloat16": []}
    metrics: dict[str, dict] = {}
    for rep in range(args.repeats + 1):
        for precision in ("none", "bfloat16") if rep % 2 == 0 else ("bfloat16", "none"):
            start = time.perf_counter()
            with torch.no_grad(), autocast(model, precision):
                result = probe_diagnostics(
                    model, trajectories, extractor, 1.0, None, 7, uncertainty=uncertainty
                )
            if rep > 0:  # the first of each is a warm-up
                times[precision].append(time.perf_counter() - start)
            metrics[precision] = result.metrics

    median = {p: statistics.median(t) for p, t in times.items()}
    print(
        f"\nprobe scoring, median of {args.repeats}: float32 {median['none']:.2f} s "
        f"({', '.join(f'{t:.2f}' for t in times['none'])}), bfloat16 autocast "
        f"{median['bfloat16']:.2f} s ({', '.join(f'{t:.2f}' for t in times['bfloat16'])}): "
        f"{median['none'] / median['bfloat16']:.2f}x"
    )
    print("\n| proxy | float32 [interval] | bfloat16 autocast [interval] | difference |")
    print("|---|---|---|---|")
    for key in PROXIES:
        cells = []
        for precision in ("none", "bfloat16"):
            m = metrics[precision]
            k = f"collapse/probe/{key}"
            low, high = m.get(f"{k}_ci_low"), m.get(f"{k}_ci_high")
            span = f" [{low:.4f}, {high:.4f}]" if low is not None else ""
            cells.append(f"{m[k]:.5f}{span}")
        diff = (
            metrics["bfloat16"][f"collapse/probe/{key}"] - metrics["none"][f"collapse/probe/{key}"]
        )
        print(f"| {key} | {cells[0]} | {cells[1]} | {diff:+.2e} |")
    print(f"\nload at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
