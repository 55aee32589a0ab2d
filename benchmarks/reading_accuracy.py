"""Does a FrozenLake policy read its map correctly?  First-turn reading accuracy, no Ray.

The MI proxies say whether reasoning *depends* on the input (cross-scoring); this says
whether it is *right*.  For held-out levels it samples each level's first turn with the
HF engine, the way a run does, and checks the reasoning against the true state:
- ``map_exact``: the restated map rows equal the observed grid (warm starts with
  ``restate: true`` are taught to copy it);
- ``player_right`` / ``goal_right``: "At (r,c), goal (r,c)." names the true positions;
- ``first_move_optimal``: the answer's first move is the first move of a shortest path;
- ``answer_follows_reasoning``: the answer's moves are the moves the reasoning names;
- ``first_clause_true``: the first clause ("Right to (1,2) is safe") names the cell the
  move leads to and says truly whether it is a hole, the goal or safe;
- ``first_move_into_hole``: the answer's first move steps into a hole;
then plays whole episodes on the same levels for ``success`` (as validation does).
Every rate comes with its 95 % Wilson interval.  The checks are the core's
(``tether/envs/reading.py``); a run logs them online on its probe set as ``grounding/…``.

    python benchmarks/reading_accuracy.py ~/.cache/tether/models/tiny-0d40348768dbae05 \\
        --levels 128 --temperatures 1.0 0.5 0
"""

from __future__ import annotations

import argparse
import os

import torch
from scipy import stats

from tether.envs.reading import frozenlake_checks


def rate(hits: int, n: int) -> str:
    if n == 0:
        return "n/a"
    ci = stats.binomtest(hits, n).proportion_ci(0.95, method="wilson")
    return f"{hits / n:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def check_first_turn(env, reasoning: str | None, answer: str | None) -> dict[str, bool]:
    """The reading checks of one first turn against the env's true state (reset, not
    stepped): the core's (``tether.envs.reading.frozenlake_checks``), which the online
    ``grounding/…`` metrics use too."""
    return frozenlake_checks(env, reasoning or "", answer or "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model directory (e.g. a warm start in the cache)")
    parser.add_argument("--levels", type=int, default=128)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.0])
    parser.add_argument("--first-level", type=int, default=1_000_000, help="validation seeds")
    parser.add_argument("--max-reply-tokens", type=int, default=48)
    parser.add_argument("--env-kwargs", default="size=4,frozen_fraction=0.8")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from tether.agent.chat import ChatFormatter
    from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
    from tether.envs import make
    from tether.policy.load import load_model_and_tokenizer
    from tether.rollout import make_engine_for
    from tether.rollout.base import SamplingParams

    env_kwargs = {
        k: float(v) if "." in v else int(v)
        for k, v in (kv.split("=") for kv in args.env_kwargs.split(","))
    }
    model, tokenizer = load_model_and_tokenizer(args.model, "float32")
    formatter = ChatFormatter(tokenizer)
    engine = make_engine_for("hf", model, tokenizer)
    envs = LocalEnvBatch("tether/FrozenLake-v0", env_kwargs)
    seeds = [args.first_level + k for k in range(args.levels)]
    specs = [EpisodeSpec(k, s, 0) for k, s in enumerate(seeds)]
    print(
        f"model {args.model}\n{args.levels} levels from seed {args.first_level}; "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for temperature in args.temperatures:
        sampling = SamplingParams(
            max_new_tokens=args.max_reply_tokens,
            temperature=temperature,
            top_p=1.0,
            stop_token_ids=formatter.stop_token_ids(),
        )
        first = run_episodes(engine, formatter, envs, specs, sampling, seed=7, max_turns=1)
        counts: dict[str, int] = {}
        for traj, seed in zip(first, seeds):
            env = make("tether/FrozenLake-v0", **env_kwargs)
            env.reset(seed=seed)
            turn = traj.turns[0]
            for key, ok in check_first_turn(env, turn.reasoning, turn.answer).items():
                counts[key] = counts.get(key, 0) + int(ok)
        episodes = run_episodes(engine, formatter, envs, specs, sampling, seed=11)
        counts["success"] = sum(t.success for t in episodes)
        print(f"temperature {temperature}:")
        for key, hits in counts.items():
            print(f"  {key:26} {rate(hits, args.levels)}")


if __name__ == "__main__":
    main()
