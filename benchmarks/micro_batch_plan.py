"""The learner update with micro-batches planned by length against whole groups in row order.

    python benchmarks/micro_batch_plan.py <warm-started model dir> [--reps 5]

Collects one quickstart-shaped batch (16 FrozenLake levels x 8 episodes, up to 48 reply
tokens, the warm-started policy at temperature 1), keeps the groups with reward spread
(as the top-p filter keeps most of them), and times `policy_update` on it (GRPO, 4
minibatches, micro-batches of at most 16 rows: the quickstart's settings) two ways,
alternating, medians of ``reps`` after one warm-up round:

- ``by_group``: the plan before 2026-11-26, rows in group order cut every 16 (each
  micro-batch's groups' prompt run once where that pays);
- ``planned``: `micro_batches.plan_micro_batches`, by group or by length, whichever
  computes fewer token positions.

Also the token positions each plan computes, and how far the two gradients are apart
(they are the same sum cut differently).  One JSON line; benchmarks/RESULTS.md,
"Micro-batch plan"."""

import argparse
import copy
import json
import os
import time

import numpy as np
import torch

from tether.agent.chat import ChatFormatter
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
from tether.algos import update as update_module
from tether.algos.advantages import AdvantageInputs, compute_advantages
from tether.algos.batch import collate
from tether.algos.micro_batches import forward_positions, group_ordered, plan_micro_batches
from tether.algos.update import policy_update, prepare_batch
from tether.policy.load import load_model_and_tokenizer
from tether.rollout import make_engine_for
from tether.rollout.base import SamplingParams
from tether.testing.settings import update_settings

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("model_dir")
parser.add_argument("--reps", type=int, default=5)
parser.add_argument("--seed", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(args.seed)
model, tokenizer = load_model_and_tokenizer(args.model_dir)
formatter = ChatFormatter(tokenizer)
specs = [EpisodeSpec(g, 1000 + g, k) for g in range(16) for k in range(8)]
sampling = SamplingParams(
    max_new_tokens=48, temperature=1.0, stop_token_ids=formatter.stop_token_ids()
)
trajectories = run_episodes(
    make_engine_for("hf", copy.deepcopy(model), tokenizer),
    formatter,
    LocalEnvBatch("tether/FrozenLake-v0", {"size": 4, "frozen_fraction": 0.8}),
    specs,
    sampling,
    seed=args.seed,
)
groups: dict[int, list] = {}
for t in trajectories:
    groups.setdefault(t.group_id, []).append(t)
kept = [t for ts in groups.values() if len({t.reward for t in ts}) > 1 for t in ts]
settings = update_settings(preset="grpo", minibatches=4, micro_batch_size=16, kl_coef=0.0)
batch = prepare_batch(collate(kept, tokenizer.pad_token_id), model, settings, False)
batch.advantages, batch.returns = compute_advantages(
    "grpo",
    AdvantageInputs(
        scores=batch.scores,
        group_index=batch.group_index,
        response_mask=batch.response_mask,
        token_rewards=batch.token_rewards,
    ),
)


def by_group(batch, rows, max_rows, shared_prefix):
    return list(
        torch.split(group_ordered(rows, batch.group_index) if shared_prefix else rows, max_rows)
    )


PLANS = {"by_group": by_group, "planned": plan_micro_batches}


def positions(plan) -> int:
    order = torch.as_tensor(np.random.default_rng(0).permutation(batch.size))
    return sum(
        forward_positions(batch, chunk, True)
        for rows in torch.tensor_split(order, 4)
        for chunk in plan(batch, rows, 16, True)
    )


def step(name: str) -> tuple[float, torch.Tensor]:
    update_module.plan_micro_batches = PLANS[name]
    m = copy.deepcopy(model)
    optimizer = torch.optim.SGD(m.parameters(), lr=0.0)
    settings_one = update_settings(
        preset="grpo", minibatches=1, micro_batch_size=16, kl_coef=0.0, max_grad_norm=1e9
    )
    policy_update(m, optimizer, copy.deepcopy(batch), settings_one, seed=0)
    grad = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
    m = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(m.parameters(), lr=3e-4)
    started = time.perf_counter()
    policy_update(m, optimizer, copy.deepcopy(batch), settings, seed=0)
    return time.perf_counter() - started, grad


seconds: dict[str, list[float]] = {name: [] for name in PLANS}
grads = {}
for _ in range(args.reps + 1):  # the first round warms up and is dropped
    for name in PLANS:
        elapsed, grads[name] = step(name)
        seconds[name].append(elapsed)
median = {name: float(np.median(v[1:])) for name, v in seconds.items()}
lengths = batch.attention_mask.sum(-1).float()
print(
    json.dumps(
        {
            "model_dir": args.model_dir,
            "rows": batch.size,
            "mean_length": round(float(lengths.mean()), 1),
            "longest": int(lengths.max()),
            "token_positions": {name: positions(plan) for name, plan in PLANS.items()},
            "median_update_s": {k: round(v, 3) for k, v in median.items()},
            "all_update_s": {k: [round(x, 3) for x in v[1:]] for k, v in seconds.items()},
            "speedup": round(median["by_group"] / median["planned"], 2),
            "grad_max_abs_diff": float((grads["planned"] - grads["by_group"]).abs().max()),
            "grad_max_abs": float(grads["by_group"].abs().max()),
            "threads": torch.get_num_threads(),
            "load_after": os.getloadavg(),
        }
    ),
    flush=True,
)
