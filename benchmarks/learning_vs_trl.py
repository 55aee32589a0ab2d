"""Learning side by side with TRL: does Tether's GRPO learn as well as TRL's ``GRPOTrainer``?

Both frameworks start from the same warm-started model and train it on the same task
with the same reward and the same hyperparameters; we record success per step and the
final policy's success on held-out prompts.  (``benchmarks/vs_trl.py`` compares their
speed; its helpers are reused here: the rendered prompts, the reward, Tether's step
through the functions its actors call, TRL's trainer.)

Task: ``tether/Choice-v0`` (4 colours; the state says "Say <colour>."; reward 1 for that
colour, 0 for another colour, -0.1 for a malformed reply).  The optimum is 1, a policy
that ignores the prompt gets 0.25.

Warm start (one model for every run, seed 0): Tether's recipe (``build_warm_model``:
tokenizer trained on the demonstrations, random init, SFT on the replies) on
``--ws-episodes`` Choice demonstrations with ``--ws-noise`` (the share of answers
replaced by a random colour), so the start is partly competent.

Matched setup (one step = one generation batch = one optimiser step):

| | Tether | TRL 1.16 ``GRPOTrainer`` |
|---|---|---|
| prompts x group | ``--prompts`` x ``--group`` (`EpisodeSpec`) | ``num_generations`` = group, generation batch = prompts x group |
| levels of step k | seed s: 1e6 (s+1) + k P + g, g < P | the same, in the same order (``shuffle_dataset`` False) |
| sampling | T 1, top-p 1, top-k 0, ``--max-new`` tokens, stop at ``--stop`` | ``temperature`` 1, ``top_p`` 1, ``top_k`` 0, ``max_completion_length``, the same stop ids (``generation_config.eos_token_id``) |
| advantage | ``grpo``: (r - mean) / (std + 1e-6), std n-1 | ``scale_rewards`` group: (r - mean) / (std + 1e-4), std n-1 |
| loss | PPO clip, ``clip_low`` 0.2 / ``clip_high`` 0.28, ``loss_agg`` token-mean | ``epsilon`` 0.2 / ``epsilon_high`` 0.28, ``loss_type`` dapo (token mean over the batch) |
| old log-probs | the sampler's (ratio 1 up to numerics) | ``per_token_logps.detach()`` (ratio exactly 1) |
| KL | ``kl_coef`` ``--kl`` (k3, frozen reference) | ``beta`` ``--kl`` (k3) |
| optimiser | AdamW, ``--lr``, betas (0.9, 0.999), eps 1e-8, wd 0, constant | AdamW (``adamw_torch``), same, ``lr_scheduler_type`` constant, no warm-up |
| grad | clip norm 1, micro-batches of 16, 1 epoch, 1 minibatch, no filter | ``max_grad_norm`` 1, ``per_device_train_batch_size`` 16, accumulation = batch / 16, ``num_iterations`` 1 |

Seeds: seed s sets the levels (above), Tether's sampler seeds (10_000 s + k) and TRL's
``seed`` (its sampler).  The held-out evaluation is the same for both: ``--eval-prompts``
levels (900_000 + i) sampled once at T 1 with Tether's ``run_episodes`` on an HF engine
holding the final weights, the sampler seeded alike (common random numbers).

Final success is that held-out success; Tether minus TRL is paired by seed, with a
Student-t 95 % interval over seeds (``tether.analysis.paper.t_interval``).

    .venv-bench/bin/python benchmarks/learning_vs_trl.py                      # 5 seeds x 40 steps
    .venv-bench/bin/python benchmarks/learning_vs_trl.py --seeds 0 1 2 --steps 60
    .venv-bench/bin/python benchmarks/learning_vs_trl.py --frameworks trl --seeds 0 --steps 10
    .venv-bench/bin/python benchmarks/learning_vs_trl.py --stop answer --out benchmarks/learning_vs_trl/stop-answer
    .venv-bench/bin/python benchmarks/learning_vs_trl.py --stop answer --lr 3e-4 --out benchmarks/learning_vs_trl/stop-answer-lr3e-4   # headline
    .venv-bench/bin/python benchmarks/learning_vs_trl.py --gradient-check    # one batch, both losses' gradients

``--stop eos`` (default, ``vs_trl``'s setup): a reply ends at EOS only; the warm start
never trains EOS (the demonstrations' replies end at ``</answer>``), so every reply runs
to ``--max-new`` tokens and both frameworks train on the tokens after ``</answer>``.
``--stop answer``: ``</answer>`` ends a reply too, as in a Tether run (the driver samples
with ``ChatFormatter.stop_token_ids``); TRL stops and masks at the same ids.

Writes ``--out`` (default benchmarks/learning_vs_trl/): ``results.json`` (per-step success
per seed per framework, held-out success, both configs) and ``learning_vs_trl.png``.
Results and verdict: benchmarks/RESULTS.md, "Learning against TRL" (and history/2026-11-25.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vs_trl import TetherStep, prompt_ids, trl_trainer  # noqa: E402

ENV_ID = "tether/Choice-v0"
EVAL_LEVELS = 900_000
EVAL_SAMPLING_SEED = 4242


def levels(seed: int, step: int, prompts: int) -> list[int]:
    """Step ``step``'s levels (env seeds) for run seed ``seed``, the same in both frameworks."""
    return [1_000_000 * (seed + 1) + step * prompts + g for g in range(prompts)]


# --------------------------------------------------------------------------- shared inputs


def warm_start(args, work: Path) -> tuple[Path, dict]:
    """The warm-started policy every run starts from (built once, cached in ``work``)."""
    from tether.policy.load import build_warm_model, recipe_key

    spec = {
        "version": 1,
        "env": ENV_ID,
        "env_kwargs": {},
        "size": args.model,
        "max_context": 512,
        "max_reply_tokens": args.max_new,
        "seed": 0,
        "warm_start": {
            "episodes": args.ws_episodes,
            "noise": args.ws_noise,
            "epochs": args.ws_epochs,
            "batch_size": 8,
            "lr": args.ws_lr,
            "vocab_size": 512,
            "numerals": "digits",
            "state_turn_epochs": args.ws_turn_epochs,
            "state_turn_batch_size": 32,
            "restate": False,
        },
    }
    path = work / f"warm-{args.model}-{recipe_key(spec)}"
    if not (path / "recipe.json").exists():
        tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=work))
        stats = build_warm_model(spec, tmp)
        (tmp / "recipe.json").write_text(json.dumps({**spec, "stats": stats}, indent=1))
        os.replace(tmp, path)
    return path, json.loads((path / "recipe.json").read_text())


def stop_ids(tokenizer, args) -> tuple[int, ...]:
    """Token ids that end a reply: EOS (``--stop eos``, as ``vs_trl``), or also
    ``</answer>`` (``--stop answer``, as a Tether run: ``ChatFormatter.stop_token_ids``)."""
    from tether.agent.chat import ChatFormatter

    if args.stop == "answer":
        return ChatFormatter(tokenizer).stop_token_ids()
    return (tokenizer.eos_token_id,)


def held_out_success(path: Path, state_dict: dict | None, args) -> float:
    """Success of the policy at ``path`` (with ``state_dict`` loaded, if given) on the
    held-out levels, one reply each at T 1 through Tether's rollout code."""
    from tether.agent.chat import ChatFormatter
    from tether.agent.episode import EpisodeSpec, LocalEnvBatch, run_episodes
    from tether.policy.load import load_model_and_tokenizer
    from tether.rollout import make_engine_for
    from tether.rollout.base import SamplingParams

    model, tokenizer = load_model_and_tokenizer(path)
    engine = make_engine_for("hf", model, tokenizer)
    if state_dict is not None:
        engine.load_state_dict({k: v.detach().clone() for k, v in state_dict.items()})
    sampling = SamplingParams(
        max_new_tokens=args.max_new, temperature=1.0, stop_token_ids=stop_ids(tokenizer, args)
    )
    specs = [EpisodeSpec(i, EVAL_LEVELS + i, 0) for i in range(args.eval_prompts)]
    trajectories = run_episodes(
        engine,
        ChatFormatter(tokenizer),
        LocalEnvBatch(ENV_ID),
        specs,
        sampling,
        seed=EVAL_SAMPLING_SEED,
    )
    return sum(t.success for t in trajectories) / len(trajectories)


def step_args(args) -> argparse.Namespace:
    """The fields ``vs_trl``'s Tether step and TRL trainer read."""
    return argparse.Namespace(
        prompts=args.prompts,
        group=args.group,
        max_new=args.max_new,
        lr=args.lr,
        warmup=0,
        steps=args.steps,
        grouped_prompts=None,
        shared_prefix=True,
    )


# --------------------------------------------------------------------------- the two runs


def run_tether(path: Path, args, seed: int) -> dict:
    torch.manual_seed(seed)
    tether = TetherStep(
        path,
        step_args(args),
        args.kl,
        env_id=ENV_ID,
        env_seeds=lambda k: levels(seed, k, args.prompts),
        sampling_seed=10_000 * seed,
        settings={"clip_low": args.clip_low, "clip_high": args.clip_high, "loss_agg": "token-mean"},
    )
    stops = stop_ids(tether.tokenizer, args)
    tether.sampling = dataclasses.replace(tether.sampling, stop_token_ids=stops)
    success, metrics, started = [], [], time.perf_counter()
    rows = args.prompts * args.group
    for _ in range(args.steps):
        step = tether()
        success.append(step["success"])
        metrics.append(
            tether.last_metrics | {"completion_length": step["completion_tokens"] / rows}
        )
        log_step("tether", seed, len(success), success[-1], metrics[-1])
    elapsed = time.perf_counter() - started
    final_weights[0] = tether.model.state_dict()
    return {
        "success": success,
        "metrics": metrics,
        "seconds": elapsed,
        "held_out": held_out_success(path, tether.model.state_dict(), args),
        "config": dataclasses.asdict(tether.settings)
        | {"optimizer": repr(tether.optimizer.defaults), "temperature_sampling": 1.0},
    }


#: The last run's final weights (saved next to its cached results).
final_weights: list[dict | None] = [None]

TRL_LOGGED = (
    "reward",
    "clip_ratio/region_mean",
    "entropy",
    "grad_norm",
    "frac_reward_zero_std",
    "completions/mean_length",
)


def run_trl(path: Path, args, seed: int, work: Path) -> dict:
    from tether.agent.chat import ChatFormatter
    from tether.policy.load import load_tokenizer

    tokenizer = load_tokenizer(path)
    formatter = ChatFormatter(tokenizer)
    seeds = [s for k in range(args.steps + 1) for s in levels(seed, k, args.prompts)]
    ids = [prompt_ids(formatter, s, args.max_new, ENV_ID) for s in seeds]
    texts = [formatter.decode(p) for p in ids]
    # TRL tokenizes the rendered text again: it must give Tether's prompt ids.
    same_ids = all(tokenizer(t)["input_ids"] == p for t, p in zip(texts, ids))
    success: list[float] = []

    def on_rewards(rewards):
        success.append(float(np.mean([r == 1.0 for r in rewards])))

    overrides = {
        "seed": seed,
        "shuffle_dataset": False,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "epsilon": args.clip_low,
        "epsilon_high": args.clip_high,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "optim": "adamw_torch",
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "logging_steps": 1,
        "mask_truncated_completions": False,
        "importance_sampling_level": "token",
    }
    started = time.perf_counter()
    trainer, config, ignored = trl_trainer(
        path,
        step_args(args),
        args.kl,
        str(work / f"trl-{seed}"),
        texts,
        seeds,
        lambda: log_step("trl", seed, len(success), success[-1], None),
        env_id=ENV_ID,
        overrides=overrides,
        on_rewards=on_rewards,
        stop_token_ids=list(stop_ids(tokenizer, args)),
    )
    trainer.train()
    elapsed = time.perf_counter() - started
    logged = [h for h in trainer.state.log_history if "loss" in h or "reward" in h]
    keys = set(overrides) | {
        "learning_rate",
        "num_generations",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "steps_per_generation",
        "num_iterations",
        "max_completion_length",
        "temperature",
        "top_p",
        "top_k",
        "beta",
        "max_grad_norm",
        "weight_decay",
        "max_steps",
    }
    final_weights[0] = trainer.model.state_dict()
    return {
        "success": success,
        "metrics": [{k: h.get(k) for k in TRL_LOGGED if k in h} for h in logged],
        "seconds": elapsed,
        "held_out": held_out_success(path, trainer.model.state_dict(), args),
        "optimizer_steps": trainer.state.global_step,
        "same_prompt_ids": same_ids,
        "config": {k: getattr(config, k) for k in sorted(keys) if hasattr(config, k)}
        | {"ignored_fields": ignored},
    }


def gradient_check(path: Path, args, work: Path) -> dict:
    """One batch sampled by Tether from the warm start; its gradient under Tether's update
    (``policy_update``, no clipping of the norm, learning rate 0) and under TRL's
    ``compute_loss`` on the same prompts, completions and advantages.  Equal gradients
    mean the same log-probs, masks, ratio, clip and aggregation."""
    from tether.agent.episode import EpisodeSpec, run_episodes
    from tether.algos.advantages import AdvantageInputs, compute_advantages
    from tether.algos.batch import collate
    from tether.algos.update import policy_update, prepare_batch

    tether = TetherStep(
        path,
        step_args(args),
        0.0,
        env_id=ENV_ID,
        settings={"clip_low": args.clip_low, "clip_high": args.clip_high, "max_grad_norm": 1e9},
    )
    P, G = args.prompts, args.group
    specs = [EpisodeSpec(g, lv, i) for g, lv in enumerate(levels(0, 0, P)) for i in range(G)]
    trajectories = run_episodes(
        tether.engine, tether.formatter, tether.envs, specs, tether.sampling, seed=0
    )
    pad = tether.tokenizer.pad_token_id
    batch = prepare_batch(collate(trajectories, pad), tether.model, tether.settings, False)
    inputs = AdvantageInputs(batch.scores, batch.group_index, batch.response_mask)
    batch.advantages, batch.returns = compute_advantages("grpo", inputs)
    policy_update(
        tether.model, torch.optim.SGD(tether.model.parameters(), lr=0.0), batch, tether.settings
    )
    grads = {"tether": {n: p.grad.clone() for n, p in tether.model.named_parameters()}}

    trainer, _, _ = trl_trainer(
        path,
        step_args(args),
        0.0,
        str(work / "trl-check"),
        ["x"],
        [0],
        lambda: None,
        env_id=ENV_ID,
        overrides={"epsilon": args.clip_low, "epsilon_high": args.clip_high, "loss_type": "dapo"},
    )
    prompts = [t.token_ids[: t.turns[0].prompt_end] for t in trajectories]
    replies = [t.token_ids[t.turns[0].prompt_end :] for t in trajectories]
    wp, wc = max(map(len, prompts)), max(map(len, replies))
    prompt_ids = torch.tensor([[pad] * (wp - len(p)) + p for p in prompts])  # left-padded
    completion_ids = torch.tensor([c + [pad] * (wc - len(c)) for c in replies])  # right-padded
    completion_mask = torch.tensor([[1] * len(c) + [0] * (wc - len(c)) for c in replies])
    rows = batch.response_mask.argmax(1)  # each row's first reply token
    trl_inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": (
            torch.arange(wp) >= torch.tensor([wp - len(p) for p in prompts])[:, None]
        ).long(),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": batch.advantages[torch.arange(batch.size), rows].float(),
        "num_items_in_batch": completion_mask.sum(),
    }
    model = trainer.model.eval()  # eval: one call is the whole batch (no accumulation window)
    model.zero_grad()
    trainer.compute_loss(model, trl_inputs).backward()
    grads["trl"] = {n: p.grad.clone() for n, p in model.named_parameters()}
    flat = {k: torch.cat([g.flatten() for g in v.values()]) for k, v in grads.items()}
    rewards = batch.scores.view(P, G).double()
    trl_adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
    return {
        "grad_norm_tether": float(flat["tether"].norm()),
        "grad_norm_trl": float(flat["trl"].norm()),
        "cosine": float(torch.nn.functional.cosine_similarity(flat["tether"], flat["trl"], dim=0)),
        "relative_difference": float((flat["tether"] - flat["trl"]).norm() / flat["trl"].norm()),
        "advantage_max_abs_difference": float(
            (trl_adv.flatten() - trl_inputs["advantages"].double()).abs().max()
        ),
        "rows": batch.size,
        "success": float(np.mean([t.success for t in trajectories])),
    }


def log_step(name: str, seed: int, step: int, success: float, metrics: dict | None) -> None:
    extra = ""
    if metrics:
        extra = " ".join(
            f"{k.split('/')[-1]} {metrics[k]:.3g}"
            for k in ("actor/ratio_mean", "actor/pg_clipfrac", "actor/grad_norm", "actor/entropy")
            if k in metrics
        )
    print(f"{name} seed {seed} step {step}: success {success:.3f} {extra}", flush=True)


# --------------------------------------------------------------------------- report


def summarise(results: dict, frameworks: list[str]) -> dict:
    from tether.analysis.paper import t_interval

    seeds = sorted(set.intersection(*(set(results[f]) for f in frameworks)), key=int)
    out = {f: t_interval([results[f][s]["held_out"] for s in seeds]) for f in frameworks}
    if {"tether", "trl"} <= set(frameworks):
        out["tether_minus_trl"] = t_interval(
            [results["tether"][s]["held_out"] - results["trl"][s]["held_out"] for s in seeds]
        )
    out["seeds"] = seeds
    return out


def plot(results: dict, summary: dict, start: float, out: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    colours = {"tether": "tab:blue", "trl": "tab:orange"}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for offset, (name, runs) in enumerate(results.items()):
        curves = np.array([runs[s]["success"] for s in sorted(runs, key=int)])  # [seeds, steps]
        kernel = np.ones(window) / window
        smooth = np.array([np.convolve(c, kernel, mode="valid") for c in curves])
        x = np.arange(window, curves.shape[1] + 1)  # the window's last step (1-based)
        mean = smooth.mean(0)
        n = len(smooth)
        label = f"{name} ({n} seeds)"
        ax.plot(x, mean, color=colours.get(name), label=label, lw=2)
        for one in smooth:  # each seed, thin
            ax.plot(x, one, color=colours.get(name), lw=0.6, alpha=0.35)
        if n > 1:
            half = stats.t.ppf(0.975, n - 1) * smooth.std(0, ddof=1) / np.sqrt(n)
            ax.fill_between(x, mean - half, mean + half, color=colours.get(name), alpha=0.2)
        final = summary.get(name)
        if final:
            err = [[final["mean"] - final["ci_low"]], [final["ci_high"] - final["mean"]]]
            ax.errorbar(
                [curves.shape[1] + 1.5 + 1.5 * offset],
                [final["mean"]],
                yerr=err if n > 1 else None,
                fmt="s",
                color=colours.get(name),
                capsize=4,
            )
    ax.plot([0], [start], "k*", markersize=10, label="warm start (held-out)")
    ax.axhline(0.25, color="grey", lw=0.8, ls=":", label="chance (0.25)")
    ax.set_xlabel(
        "optimiser step\n(bands: 95 % t-interval over seeds; thin lines: each seed; "
        "squares: held-out success of the final policy)",
        fontsize=8,
    )
    ax.set_ylabel(f"success (training batch, {window}-step mean)")
    fig.suptitle("Choice-v0: Tether vs TRL GRPO, same start and hyperparameters", fontsize=11)
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower left", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def run_key(args) -> str:
    """What a run depends on (not the seeds, frameworks, plotting or paths)."""
    from tether.policy.load import recipe_key

    skip = {"seeds", "frameworks", "window", "out", "work", "threads"}
    return recipe_key({k: v for k, v in vars(args).items() if k not in skip})


def machine() -> dict:
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return None

    return {
        "nproc": os.cpu_count(),
        "uptime": run(["uptime"]),
        "commit": run(["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "HEAD"]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=40, help="optimiser steps per run")
    ap.add_argument("--frameworks", nargs="+", default=["trl", "tether"], choices=["trl", "tether"])
    ap.add_argument("--model", default="small", choices=["micro", "small", "tiny"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip-low", type=float, default=0.2)
    ap.add_argument("--clip-high", type=float, default=0.28)
    ap.add_argument("--kl", type=float, default=0.0)
    ap.add_argument(
        "--stop",
        default="eos",
        choices=["eos", "answer"],
        help="what ends a reply in both: EOS only (vs_trl's setup) or also </answer> (a Tether run's)",
    )
    ap.add_argument("--eval-prompts", type=int, default=128)
    ap.add_argument("--ws-episodes", type=int, default=512)
    ap.add_argument("--ws-noise", type=float, default=0.5)
    ap.add_argument("--ws-epochs", type=int, default=3)
    ap.add_argument("--ws-lr", type=float, default=3e-3)
    ap.add_argument("--ws-turn-epochs", type=int, default=2)
    ap.add_argument("--window", type=int, default=5, help="moving mean of the plotted curves")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/learning_vs_trl")
    ap.add_argument(
        "--gradient-check",
        action="store_true",
        help="only compare one batch's gradient under Tether's update and TRL's loss",
    )
    ap.add_argument("--work", default=None, help="models and TRL output (default: a temp dir)")
    args = ap.parse_args()
    if (args.prompts * args.group) % 16:
        ap.error("prompts x group must be a multiple of 16 (the micro-batch)")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="learning_vs_trl."))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    info = {"machine_start": machine(), "args": vars(args)}
    path, recipe = warm_start(args, work)
    info["warm_start"] = recipe
    if args.gradient_check:
        print(json.dumps(gradient_check(path, args, work), indent=1))
        return
    info["warm_start_held_out"] = held_out_success(path, None, args)
    print(
        f"warm start {path.name}: held-out success {info['warm_start_held_out']:.3f} "
        f"({time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    results: dict[str, dict[str, dict]] = {f: {} for f in args.frameworks}
    for seed in args.seeds:
        for name in args.frameworks:
            # A run already made with these arguments (in ``--work``) is read back.
            cached = work / f"run-{name}-{seed}-{run_key(args)}.json"
            if cached.exists():
                run = json.loads(cached.read_text())
            else:
                run = (
                    run_tether(path, args, seed)
                    if name == "tether"
                    else run_trl(path, args, seed, work)
                )
                cached.write_text(json.dumps(run, default=str))
                torch.save(final_weights[0], cached.with_suffix(".pt"))
            results[name][str(seed)] = run
            print(
                f"== {name} seed {seed}: held-out {run['held_out']:.3f}, last-5 training "
                f"{np.mean(run['success'][-5:]):.3f}, {run['seconds']:.0f} s",
                flush=True,
            )
    summary = summarise(results, args.frameworks)
    info.update(
        results=results,
        summary=summary,
        seconds=time.perf_counter() - started,
        machine_end=machine(),
        interval="Student-t 95 % over seeds (paired by seed for the difference)",
    )
    (out / "results.json").write_text(json.dumps(info, indent=1, default=str))
    plot(results, summary, info["warm_start_held_out"], out / "learning_vs_trl.png", args.window)
    print(f"\nheld-out success of the final policy ({args.eval_prompts} prompts, T 1):")
    for key, s in summary.items():
        if key != "seeds":
            print(
                f"  {key}: {s['mean']:+.3f} [{s['ci_low']:+.3f}, {s['ci_high']:+.3f}] (n {s['n']})"
            )
    print(f"warm start: {info['warm_start_held_out']:.3f}; total {info['seconds']:.0f} s; {out}")


if __name__ == "__main__":
    main()
