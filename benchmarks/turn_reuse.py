"""Collecting multi-turn episodes with the reply's keys and values kept for the next turn
(``HFRolloutEngine(reuse_turns=True)``, the default) against prefilling every turn's whole
conversation again.

    python benchmarks/turn_reuse.py <warm-started model dir> [--reps 3] [--threads 1]

A quickstart-shaped collection: 8 FrozenLake levels x 8 episodes (one rollout worker's
half of 16 x 8), up to 48 reply tokens, temperature 1, as many turns as the episodes
take, on one engine per arm, alternating, medians of ``reps`` after a warm-up round; the
prompt tokens each arm prefilled; and whether the two arms sampled the same episodes
(same seed: the same tokens, unless a floating-point difference flips a near-tie).
One JSON line; benchmarks/RESULTS.md, "Turn reuse"."""

import argparse
import json
import os
import time

import numpy as np
import torch

from tether.agent.chat import ChatFormatter
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
from tether.policy.load import load_model_and_tokenizer
from tether.rollout import make_engine_for
from tether.rollout.base import SamplingParams

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("model_dir")
parser.add_argument("--reps", type=int, default=3)
parser.add_argument("--threads", type=int, default=1, help="torch threads (a worker has 1)")
args = parser.parse_args()

torch.set_num_threads(args.threads)
model, tokenizer = load_model_and_tokenizer(args.model_dir)
formatter = ChatFormatter(tokenizer)
engines = {
    arm: make_engine_for("hf", model, tokenizer, reuse_turns=arm == "reuse")
    for arm in ("reuse", "prefill_all")
}
envs = LocalEnvBatch("tether/FrozenLake-v0", {"size": 4, "frozen_fraction": 0.8})
specs = [EpisodeSpec(g, 3000 + g, k) for g in range(8) for k in range(8)]
sampling = SamplingParams(
    max_new_tokens=48, temperature=1.0, stop_token_ids=formatter.stop_token_ids()
)

seconds: dict[str, list[float]] = {arm: [] for arm in engines}
episodes: dict[str, list] = {}
reused: dict[str, int] = {}
for rep in range(args.reps + 1):  # the first round warms up and is dropped
    for arm, engine in engines.items():
        before = engine.reused_tokens
        started = time.perf_counter()
        episodes[arm] = run_episodes(engine, formatter, envs, specs, sampling, seed=rep)
        seconds[arm].append(time.perf_counter() - started)
        reused[arm] = engine.reused_tokens - before
median = {arm: float(np.median(v[1:])) for arm, v in seconds.items()}
same = sum(a.token_ids == b.token_ids for a, b in zip(episodes["reuse"], episodes["prefill_all"]))
print(
    json.dumps(
        {
            "model_dir": args.model_dir,
            "episodes": len(specs),
            "turns_mean": float(np.mean([len(t.turns) for t in episodes["reuse"]])),
            "median_s": {k: round(v, 3) for k, v in median.items()},
            "all_s": {k: [round(x, 3) for x in v[1:]] for k, v in seconds.items()},
            "speedup": round(median["prefill_all"] / median["reuse"], 2),
            "reused_prompt_tokens_last_round": reused,
            "same_episodes_last_round": f"{same}/{len(specs)}",
            "threads": args.threads,
            "load_after": os.getloadavg(),
        }
    ),
    flush=True,
)
