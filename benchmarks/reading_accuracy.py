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
Every rate comes with its 95 % Wilson interval.

``--hole-check`` adds the hole check by teacher forcing: the model reads the
demonstration of each level (in the warm start's own format, noise 0.5, so some chosen
moves lead into holes) in the run's prompt layout, and at every "… to (r,c) is" it is
asked for " a" (hole) against " safe".  A model that reads the hole list gives " a" a
higher probability on cells that are holes than on safe ones; the difference comes with
its 95 % Welch interval (benchmarks/history/2026-11-26.md: the shipped and weighed warm
starts give the base rate on both).  The checks are the core's
(``tether/envs/reading.py``); a run logs them online on its probe set as ``grounding/…``.

    python benchmarks/reading_accuracy.py ~/.cache/tether/models/tiny-0d40348768dbae05 \\
        --levels 128 --temperatures 1.0 0.5 0
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import torch
import yaml
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
    parser.add_argument(
        "--env-kwargs",
        default=None,
        help="key=value,... (default: the model's recipe.json, else size=4,frozen_fraction=0.8)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--hole-check",
        action="store_true",
        help="P(hole) on hole and safe cells, by teacher forcing",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from tether.agent.chat import ChatFormatter
    from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
    from tether.envs import make
    from tether.policy.load import load_model_and_tokenizer
    from tether.rollout import make_engine_for
    from tether.rollout.base import SamplingParams

    made_by = recipe(args.model)
    env_kwargs = (
        {k: yaml.safe_load(v) for k, v in (kv.split("=") for kv in args.env_kwargs.split(","))}
        if args.env_kwargs
        else made_by.get("env_kwargs", {"size": 4, "frozen_fraction": 0.8})
    )
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
    if args.hole_check:
        hole_check(
            model,
            formatter,
            env_kwargs,
            seeds,
            args.max_reply_tokens,
            bool(made_by.get("warm_start", {}).get("weigh")),
        )


def recipe(model_dir: str) -> dict:
    """The recipe a warm start in the cache was built from ({} for another model)."""
    path = Path(model_dir) / "recipe.json"
    return json.loads(path.read_text()) if path.exists() else {}


def hole_check(model, formatter, env_kwargs, seeds, max_reply_tokens, weigh) -> None:
    """P(" a") / (P(" a") + P(" safe")) after every "… to (r,c) is" of each level's
    demonstration, split by whether the cell is a hole (module docstring)."""
    import numpy as np

    from tether.agent.episode import first_prompt_ids
    from tether.envs import make

    hole_id, safe_id = formatter.encode(" a")[0], formatter.encode(" safe")[0]
    clause = re.compile(r"to \((\d+),(\d+)\) is(?= safe| a hole)")
    p_hole: dict[bool, list[float]] = {True: [], False: []}
    for seed in seeds:
        env = make("tether/FrozenLake-v0", **env_kwargs)
        state, _ = env.reset(seed=seed)
        reasoning, _ = env.demonstration(np.random.default_rng(seed), 0.5, weigh=weigh)
        prompt = first_prompt_ids(
            formatter, env.rules(), state, env.actions_left(), max_reply_tokens
        )
        for found in clause.finditer(reasoning):
            ids = prompt + formatter.encode(reasoning[: found.end()])
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            p = torch.softmax(logits[[hole_id, safe_id]], -1)[0].item()
            p_hole[(int(found[1]), int(found[2])) in env.holes].append(p)
    holes, safe = np.array(p_hole[True]), np.array(p_hole[False])
    print(f"hole check ({'weighed' if weigh else 'plain'} reasoning, noise 0.5):")
    for name, v in (("cells that are holes", holes), ("safe cells", safe)):
        if len(v):
            print(f"  P(' a hole') on {name:20} {v.mean():.3f} (n {len(v)})")
    if len(holes) > 1 and len(safe) > 1:
        test = stats.ttest_ind(holes, safe, equal_var=False)
        ci = test.confidence_interval(0.95)
        print(
            f"  difference {holes.mean() - safe.mean():+.3f} [{ci.low:+.3f}, {ci.high:+.3f}] "
            f"(Welch, p {test.pvalue:.2g}): "
            + (
                "P(hole) depends on whether the cell is a hole"
                if ci.low > 0
                else "no evidence that P(hole) depends on the cell"
            )
        )


if __name__ == "__main__":
    main()
