"""Is the quickstart's update signal or noise?  One batch of 8 x 8 FrozenLake
trajectories from the warm start, three updates (4 AdamW steps each, lr 3e-4) with the
batch's real GRPO advantages and with the same advantages shuffled across rows (no
signal), then token entropy and mean log-prob on a second, held-out batch of the warm
start's own samples.  (benchmarks/history/2026-11-25.md, issue 32.)

    python benchmarks/update_noise_probe.py ~/.cache/tether/models/tiny-<key>
"""

import copy
import sys

import torch

from tether.agent.chat import ChatFormatter
from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
from tether.algos.advantages import AdvantageInputs, compute_advantages
from tether.algos.batch import collate, token_logprobs
from tether.algos.update import policy_update
from tether.policy.load import load_model_and_tokenizer
from tether.rollout.base import SamplingParams
from tether.rollout.hf import HFRolloutEngine
from tether.testing.settings import update_settings

torch.manual_seed(0)
path = sys.argv[1]
model, tok = load_model_and_tokenizer(path)
model.eval()
fmt = ChatFormatter(tok)
eng = HFRolloutEngine(model, pad_token_id=tok.pad_token_id)
sp = SamplingParams(max_new_tokens=48, temperature=1.0, stop_token_ids=fmt.stop_token_ids())
envs = LocalEnvBatch("tether/FrozenLake-v0", {"size": 4, "frozen_fraction": 0.8})


def batch_for(seed0):
    specs = [EpisodeSpec(g, seed0 + g, k) for g in range(8) for k in range(8)]
    with torch.no_grad():
        trajs = run_episodes(eng, fmt, envs, specs, sp, seed=seed0)
    b = collate(trajs, tok.pad_token_id)
    b.old_logprobs = b.sampling_logprobs.clone()
    b.advantages, b.returns = compute_advantages(
        "grpo", AdvantageInputs(b.scores, b.group_index, b.response_mask)
    )
    return b


train = batch_for(500)
held = batch_for(900)


def entropy(m, b):
    with torch.no_grad():
        lp, ent = token_logprobs(m, b.input_ids, b.attention_mask, 1.0, True)
    mask = b.response_mask
    return float((ent * mask).sum() / mask.sum()), float((lp * mask).sum() / mask.sum())


print("start  held entropy/logp", entropy(model, held))
s = update_settings(loss_agg="seq-mean-token-mean", minibatches=4, micro_batch_size=16)
variants = {
    "adam_real": (dict(lr=3e-4), False),
    "adam_shuffled": (dict(lr=3e-4), True),
    "adam_eps1e-4_real": (dict(lr=3e-4, eps=1e-4), False),
    "adam_eps1e-4_shuf": (dict(lr=3e-4, eps=1e-4), True),
}
for name, (kw, shuffle) in variants.items():
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), weight_decay=0.0, **kw)
    b = copy.copy(train)
    if shuffle:
        perm = torch.randperm(b.size)
        per_row = (b.advantages.sum(-1) / b.response_mask.sum(-1).clamp_min(1))[perm]
        b.advantages = per_row[:, None] * b.response_mask
    for k in range(3):
        out = policy_update(m, opt, b, s, seed=k)
    print(
        f"{name:20s} held entropy/logp after 3 updates",
        entropy(m, held),
        "update_ratio(last)",
        round(out["actor/update_ratio"], 4),
        flush=True,
    )
