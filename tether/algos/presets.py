"""Algorithm presets (docs/methods.md, section 9) as plain dicts of algorithm-config field values.

    PPO     = gae advantages (critic) + token-mean aggregation
    GRPO    = grpo advantages (group mean / std) + seq-mean-token-mean
    Dr.GRPO = drgrpo advantages (group mean only) + seq-mean-token-sum
    DAPO    = clip-higher (0.2 / 0.28) + token-mean + no KL + dynamic sampling
              (drop zero-variance groups, refill up to batch size)

Clip ranges: PPO, GRPO and Dr.GRPO use the symmetric 0.2 of their papers, so that
clip-higher is what distinguishes DAPO.  (RAGEN's own configs run every algorithm
with 0.2/0.28; a paper-reproduction experiment sets ``algo.clip_high=0.28``.)
KL: PPO and GRPO keep a small KL to the reference (0.001, the veRL/RAGEN default);
Dr.GRPO and DAPO drop it, as in their papers.
"""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    "ppo": {
        "advantage": "gae",
        "loss_agg": "token-mean",
        "clip_low": 0.2,
        "clip_high": 0.2,
        "kl_coef": 0.001,
        "dynamic_sampling": False,
        "use_critic": True,
    },
    "grpo": {
        "advantage": "grpo",
        "loss_agg": "seq-mean-token-mean",
        "clip_low": 0.2,
        "clip_high": 0.2,
        "kl_coef": 0.001,
        "dynamic_sampling": False,
        "use_critic": False,
    },
    "drgrpo": {
        "advantage": "drgrpo",
        "loss_agg": "seq-mean-token-sum",
        "clip_low": 0.2,
        "clip_high": 0.2,
        "kl_coef": 0.0,
        "dynamic_sampling": False,
        "use_critic": False,
    },
    "dapo": {
        "advantage": "grpo",
        "loss_agg": "token-mean",
        "clip_low": 0.2,
        "clip_high": 0.28,
        "kl_coef": 0.0,
        "dynamic_sampling": True,
        "use_critic": False,
    },
}
