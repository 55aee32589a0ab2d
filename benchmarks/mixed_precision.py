"""bfloat16 autocast against float32 on a warm-started policy: speed and log-prob error.

    python benchmarks/mixed_precision.py <warm-started model dir> [--episodes 16] [--reps 6]

On FrozenLake demonstration episodes laid out as the learner sees them, it times (float32
and autocast alternating, medians of ``reps``) the warm start's SFT step (forward, loss,
backward, AdamW) and the learner's forward+backward (`token_logprobs` with entropy, the
update's call), and measures how far autocast moves the reply tokens' log-probs (the PPO
ratio's numerator).  One JSON line; benchmarks/RESULTS.md, "Mixed precision"."""

import argparse
import json
import os
import time

import numpy as np
import torch

from tether.agent.chat import ChatFormatter
from tether.algos.batch import token_logprobs
from tether.algos.update import autocast
from tether.policy.load import load_model_and_tokenizer
from tether.policy.precision import cpu_has_bf16
from tether.policy.warmstart import demonstration_episodes, encode_episode

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("model_dir")
parser.add_argument("--episodes", type=int, default=16)
parser.add_argument("--reps", type=int, default=6)
parser.add_argument("--seed", type=int, default=5)
args = parser.parse_args()

model, tokenizer = load_model_and_tokenizer(args.model_dir)
formatter = ChatFormatter(tokenizer)
episodes = demonstration_episodes(
    "tether/FrozenLake-v0", {"size": 4, "frozen_fraction": 0.8}, args.episodes, 0.3, args.seed, 48
)
sequences = [encode_episode(formatter, e) for e in episodes]
width = max(len(ids) for ids, _ in sequences)
input_ids = torch.full((len(sequences), width), tokenizer.pad_token_id)  # [B, T]
attention = torch.zeros((len(sequences), width), dtype=torch.long)  # [B, T]
reply = torch.zeros((len(sequences), width), dtype=torch.bool)  # [B, T]
for row, (ids, mask) in enumerate(sequences):
    input_ids[row, : len(ids)] = torch.tensor(ids)
    attention[row, : len(ids)] = 1
    reply[row, : len(ids)] = torch.tensor(mask, dtype=torch.bool)

with torch.no_grad():
    full, _ = token_logprobs(model, input_ids, attention)
    with autocast(model, "bfloat16"):
        mixed, _ = token_logprobs(model, input_ids, attention)
error = (full - mixed).abs()[reply]
ratio = torch.exp(mixed - full)[reply]

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
labels = input_ids.masked_fill(~reply, -100)


def sft_step(precision: str) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
        logits = model(input_ids=input_ids[:8], attention_mask=attention[:8]).logits
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:8, 1:].reshape(-1)
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def update_pass(precision: str) -> None:
    with autocast(model, "none" if precision == "float32" else precision):
        logprobs, entropy = token_logprobs(model, input_ids, attention, with_entropy=True)
    ((logprobs + 0.001 * entropy) * reply).sum().backward()
    model.zero_grad(set_to_none=True)


model.train()
seconds: dict[str, list[float]] = {}
for _ in range(args.reps + 1):  # the first round warms up and is dropped
    for name, step in (("sft", sft_step), ("update", update_pass)):
        for precision in ("float32", "bfloat16"):
            started = time.perf_counter()
            step(precision)
            seconds.setdefault(f"{name}_{precision}", []).append(time.perf_counter() - started)
median = {k: float(np.median(v[1:])) for k, v in seconds.items()}
print(
    json.dumps(
        {
            "model_dir": args.model_dir,
            "cpu_has_bf16": cpu_has_bf16(),
            "threads": torch.get_num_threads(),
            "reply_tokens": int(reply.sum()),
            "tokens": int(attention.sum()),
            "logprob_abs_error": {
                "mean": float(error.mean()),
                "p99": float(error.quantile(0.99)),
                "max": float(error.max()),
            },
            "ratio_outside_0.8_1.2": float(((ratio < 0.8) | (ratio > 1.2)).float().mean()),
            "median_s": {k: round(v, 3) for k, v in median.items()},
            "speedup": {
                name: round(median[f"{name}_float32"] / median[f"{name}_bfloat16"], 2)
                for name in ("sft", "update")
            },
            "load_after": os.getloadavg(),
        }
    ),
    flush=True,
)
