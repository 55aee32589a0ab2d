"""Probe: does the warm start's SFT teach the model to read the state?

Tracks teacher-forced accuracy on the reply's first four coordinate digits (the player's
and the goal's position, which the user turn states verbatim) on 64 held-out first turns
of FrozenLake 4x4.  A model that ignores its input can reach about 0.5 here (start in the
top-left quarter, goal in the bottom-right one), so copying shows as accuracy near 1.

    python benchmarks/warmstart_copy_probe.py MODE SIZE EPISODES BATCH LR EPOCHS [EVAL_EVERY]
    MODE: episodes (multi-turn, as the warm start trains) | first (first turns only) |
          turns (every turn alone); ECHO=1 rewrites the reply to open with the prompt's own
          words ("Player (r,c). Goal (r,c).") so that copying is a plain induction pattern.
    e.g. ECHO=1 python benchmarks/warmstart_copy_probe.py first small 800 16 3e-3 10 25
"""

import sys
import time

import numpy as np
import torch

torch.set_num_threads(2)
from tether.agent.chat import ChatFormatter
from tether.policy.tiny import build_tiny_model, tiny_config
from tether.policy.warmstart import (
    DemoEpisode,
    build_tokenizer,
    demonstration_episodes,
    encode_episode,
    supervised_finetune,
)

mode, size, n, bs, lr, epochs = (
    sys.argv[1],
    sys.argv[2],
    int(sys.argv[3]),
    int(sys.argv[4]),
    float(sys.argv[5]),
    int(sys.argv[6]),
)
eps = demonstration_episodes(
    "frozenlake", {"size": 4, "frozen_fraction": 0.8}, n, 0.3, 10_000_000, 48
)
held = demonstration_episodes("frozenlake", {"size": 4, "frozen_fraction": 0.8}, 64, 0.0, 555, 48)
import os
import re

if os.environ.get("ECHO"):
    fix = lambda r: re.sub(
        r"^At \((\d),(\d)\), goal \((\d),(\d)\)\.", r"Player (\1,\2). Goal (\3,\4).", r
    )
    for e in eps + held:
        e.replies = [fix(r) for r in e.replies]
    print(eps[0].replies[0], flush=True)
tok = build_tokenizer(eps, 512)
f = ChatFormatter(tok)
if mode == "first":
    train_eps = [DemoEpisode(e.system, e.users[:1], e.replies[:1], e.success) for e in eps]
elif mode == "turns":  # every turn as its own short episode (prompt = that turn only)
    train_eps = [
        DemoEpisode(e.system, [u], [r], e.success) for e in eps for u, r in zip(e.users, e.replies)
    ]
else:
    train_eps = eps
seqs = [encode_episode(f, e) for e in train_eps]
print(mode, "sequences", len(seqs), "mean len", np.mean([len(s[0]) for s in seqs]), flush=True)
# held-out: first turn, digits in the reply's first 12 tokens
probe = []
for e in held:
    p = f.first_prompt_ids(e.system, e.users[0])
    r = f.encode(e.replies[0])
    digit_pos = [i for i, t in enumerate(r[:12]) if tok.decode([t]).strip().isdigit()]
    probe.append((p, r, digit_pos))


def copy_acc(model):
    model.eval()
    hits = tot = 0
    with torch.no_grad():
        for p, r, pos in probe:
            ids = torch.tensor([p + r])
            lg = model(input_ids=ids).logits[0]
            for i in pos:
                hits += int(lg[len(p) + i - 1].argmax() == r[i])
                tot += 1
    model.train()
    return hits / tot


model = build_tiny_model(
    tiny_config(
        size,
        vocab_size=max(512, len(tok)),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
)
t0 = time.time()
every = int(sys.argv[7]) if len(sys.argv) > 7 else 25


def progress(step, total, loss):
    if step % every == 0 or step == total:
        print(
            f"step {step}/{total} loss {loss:.3f} copy_acc {copy_acc(model):.3f} t {time.time() - t0:.0f}s",
            flush=True,
        )


print("copy_acc init", copy_acc(model), flush=True)
st = supervised_finetune(model, seqs, tok.pad_token_id, epochs, bs, lr, 0, progress)
print(st, flush=True)
