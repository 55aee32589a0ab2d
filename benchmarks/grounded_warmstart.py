"""Does a warm start's reasoning depend on its input?  Iteration-1 diagnostics, no Ray.

Builds (or reuses, from ``model.cache_dir``) the warm-started tiny model of a run spec,
collects one training batch the way iteration 1 does (the same level seeds, the HF
engine, multi-turn episodes at the rollout temperature), runs the learner's collapse
diagnostics on it (``collapse_diagnostics``, ``first_turn`` sampling, the spec's
``diagnostics.max_pairs``/``max_cells`` and its bootstrap intervals and permutation
test) and validates on the held-out levels, then
prints retrieval accuracy vs chance, I(X;Z) (per token and per sequence), the pairs
and prompts scored, the starting success and the warm start's time with the load.

    python benchmarks/grounded_warmstart.py experiments/quickstart.yaml \\
        model.cache_dir=/tmp/gw_cache [more dotted overrides] [--val-episodes 128]

Run it under ``flock /tmp/tether-cpu.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument(
        "--val-episodes",
        type=int,
        default=None,
        help="held-out episodes (default: trainer.val_episodes)",
    )
    parser.add_argument("--samples", type=int, default=4, help="first-turn replies to print")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from tether import seeds
    from tether.agent.chat import ChatFormatter
    from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
    from tether.agent.pairs import SpanExtractor
    from tether.diagnostics.runner import collapse_diagnostics
    from tether.platform.config import load_config
    from tether.platform.run.stages import LevelSampler
    from tether.policy.load import load_model_and_tokenizer, resolve_policy
    from tether.rollout import make_engine_for
    from tether.rollout.base import SamplingParams

    cfg = load_config(args.spec, args.overrides)
    load_before, started, cpu_started = loadavg(), time.perf_counter(), time.process_time()

    def progress(step, total, loss):
        if step % 50 == 0 or step == total:
            print(
                f"warm start {step}/{total} loss {loss:.3f} {time.perf_counter() - started:.0f} s "
                f"load {loadavg()}",
                flush=True,
            )

    path = resolve_policy(
        cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens, progress
    )
    resolve_seconds, load_after = time.perf_counter() - started, loadavg()
    resolve_cpu_seconds = time.process_time() - cpu_started  # ~2x wall on an idle 2-core box
    stats = json.loads((path / "recipe.json").read_text()).get("stats", {})

    model, tokenizer = load_model_and_tokenizer(path, cfg.model.dtype)
    formatter = ChatFormatter(tokenizer)
    engine = make_engine_for("hf", model, tokenizer)
    env_kwargs = {
        "stochasticity": cfg.env.stochasticity,
        "format_penalty": cfg.env.format_penalty,
        **cfg.env.kwargs,
    }
    envs = LocalEnvBatch(cfg.env.id, env_kwargs)
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.max_reply_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        stop_token_ids=formatter.stop_token_ids(),
    )

    # Iteration 1's batch: the driver's level seeds and collection seed.
    levels = LevelSampler(cfg.experiment.seed, cfg.env.val_seed_offset).take(cfg.rollout.groups)
    specs = [
        EpisodeSpec(g, seed, k)
        for g, seed in enumerate(levels)
        for k in range(cfg.rollout.group_size)
    ]
    t0 = time.perf_counter()
    batch = run_episodes(
        engine, formatter, envs, specs, sampling, seed=seeds.collection(cfg.experiment.seed, 1)
    )
    collect_seconds = time.perf_counter() - t0
    d = cfg.diagnostics
    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
    t0 = time.perf_counter()
    result = collapse_diagnostics(
        model,
        batch,
        SpanExtractor(formatter),
        ["first_turn"],
        d.max_pairs,
        temperature,
        None,
        seed=seeds.diagnostics(cfg.experiment.seed, 1),
        information_chain_links=False,
        method=d.method,
        keep_matrices=True,
        max_cells=d.max_cells,
        uncertainty=d.uncertainty(),
    )
    diagnose_seconds = time.perf_counter() - t0
    m = result.metrics
    scores, column = result.matrices.get("first_turn", (None, None))

    n_val = args.val_episodes or cfg.trainer.val_episodes
    val_temperature = cfg.trainer.val_temperature
    val_sampling = SamplingParams(
        **{
            **sampling.__dict__,
            "temperature": cfg.rollout.temperature if val_temperature is None else val_temperature,
        }
    )
    val_specs = [EpisodeSpec(k, cfg.env.val_seed_offset + k, 0) for k in range(n_val)]
    val = run_episodes(
        engine, formatter, envs, val_specs, val_sampling, seed=seeds.validation(cfg.experiment.seed)
    )

    for traj in batch[:: max(1, len(batch) // args.samples)][: args.samples]:
        turn = traj.turns[0]
        print(f"--- level {traj.env_seed}\n{turn.state}\n>>> {turn.reply_text!r}")
    report = {
        "spec": args.spec,
        "overrides": args.overrides,
        "model": str(path),
        "retrieval_acc": m.get("collapse/first_turn/retrieval_acc"),
        "retrieval_chance": m.get("collapse/first_turn/retrieval_chance"),
        "mi_estimate": m.get("collapse/first_turn/mi_estimate"),
        "mi_seq_estimate": m.get("collapse/first_turn/mi_seq_estimate"),
        **{
            f"{k}_ci": [
                m.get(f"collapse/first_turn/{k}_ci_low"),
                m.get(f"collapse/first_turn/{k}_ci_high"),
            ]
            for k in ("retrieval_acc", "mi_estimate", "mi_seq_estimate")
        },
        "p_grounded": m.get("collapse/first_turn/p_grounded"),
        "mi_seq_estimate_p_grounded": m.get("collapse/first_turn/mi_seq_estimate_p_grounded"),
        "retrieval_acc_p_grounded": m.get("collapse/first_turn/retrieval_acc_p_grounded"),
        "valid_reasoning_rate": m.get("collapse/first_turn/valid_reasoning_rate"),
        "pairs": None if scores is None else int(scores.shape[0]),
        "prompts": None if scores is None else int(scores.shape[1]),
        "train_success": sum(t.success for t in batch) / len(batch),
        "format_ok": sum(turn.format_ok for traj in batch for turn in traj.turns)
        / max(1, sum(len(traj.turns) for traj in batch)),
        "val_success": sum(t.success for t in val) / len(val),
        "val_episodes": len(val),
        "warm_start_s": stats.get("sft_seconds"),
        "sft_steps": stats.get("sft_steps"),
        "sft_loss": stats.get("sft_loss"),
        "demo_success": stats.get("demo_success"),
        "resolve_s": round(resolve_seconds, 1),
        "resolve_cpu_s": round(resolve_cpu_seconds, 1),
        "load_before": load_before,
        "load_after_warm_start": load_after,
        "collect_s": round(collect_seconds, 1),
        "diagnose_s": round(diagnose_seconds, 1),
        "load_end": loadavg(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
