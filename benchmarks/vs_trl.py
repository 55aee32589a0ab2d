"""Tether vs TRL's ``GRPOTrainer``: the same GRPO step, side by side, in one process.

One step = sample ``--prompts`` Countdown prompts x ``--group`` completions (at most
``--max-new`` new tokens, temperature 1, full distribution, stop at EOS), score them
with Countdown's reward, GRPO advantages, one AdamW update (lr 1e-6, grad-norm clip
1, micro-batches of 16 rows, no gradient checkpointing).

- Same weights: a tiny Qwen2 (Tether's recipe: byte-level BPE trained on Countdown
  demonstrations, random init, seed 0) is saved once in HF format and loaded by both.
- Same prompts: Tether's chat format (system rules + first user turn + forced
  ``<think>``); TRL gets the rendered text, which tokenizes to the same ids.
- Same reward: the reply is parsed with Tether's parser and scored by the Countdown
  env (``LocalEnvBatch``, the class the env-pool actor wraps); format errors get the
  format penalty.
- Same number of optimiser updates: TRL with ``per_device_train_batch_size`` 16,
  ``gradient_accumulation_steps`` = ``steps_per_generation`` = prompts x group / 16 and
  ``num_iterations`` 1 makes one generation batch and one optimiser step per step;
  Tether runs ``policy_update`` with ``ppo_epochs`` 1, ``minibatches`` 1 (one
  optimiser step), ``micro_batch_size`` 16.  No filter in Tether (TRL trains on
  zero-advantage groups too).
- KL: ``--kl 0`` (no reference model) and ``--kl 0.04`` (TRL ``beta``; Tether
  ``kl_coef`` with a frozen reference, k3 estimator like TRL's).

Tether's step runs in this process without Ray, through the functions its actors
call: ``run_episodes`` on an ``HFRolloutEngine`` (the rollout worker's ``collect``),
``collate`` + ``prepare_batch`` (the learner's ``prepare``: sampler log-probs reused
as the old policy's, reference log-probs), ``compute_advantages("grpo")`` (the
driver), ``policy_update`` (the learner's ``update``), and a weight copy learner ->
engine (``load_state_dict``, the worker's ``set_weights``).

TRL's step is timed from the end of Tether's previous step to TRL's ``on_step_end``;
Tether's step runs inside that callback, so the two alternate A B A B.  The first
``--warmup`` pairs are discarded; medians of the rest are printed with the ratio.

    pip install -e '.[bench]'          # TRL and its dependencies (separate venv advised)
    python benchmarks/vs_trl.py                                  # tiny and small, KL 0 and 0.04
    python benchmarks/vs_trl.py --model tiny --kl 0 --steps 6
    python benchmarks/vs_trl.py --no-shared-prefix --no-grouped-prompts   # Tether before issue 8
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

ENV_ID = "tether/Countdown-v0"


# --------------------------------------------------------------------------- shared inputs


def build_policy(size: str, out: Path, seed: int = 0) -> Path:
    """Tether's tiny-model recipe without the warm start: tokenizer + random init, saved."""
    from tether.policy.tiny import build_tiny_model, tiny_config
    from tether.policy.warmstart import build_tokenizer, demonstration_episodes

    episodes = demonstration_episodes(ENV_ID, {}, 1000, 0.0, seed=10_000_000, max_reply_tokens=64)
    tokenizer = build_tokenizer(episodes, 512)
    config = tiny_config(
        size,
        vocab_size=max(512, len(tokenizer)),
        max_context=1024,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = build_tiny_model(config, seed=seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def prompt_ids(formatter, env_seed: int, max_new: int, env_id: str = ENV_ID) -> list[int]:
    from tether.agent.episode import LocalEnvBatch, first_prompt_ids

    obs = LocalEnvBatch(env_id).reset([env_seed])[0]
    return first_prompt_ids(formatter, obs.rules, obs.state, obs.actions_left, max_new)


def env_rewards(completions: list[str], env_seeds: list[int], env_id: str = ENV_ID) -> list[float]:
    """The reward run_episodes gives a single-turn reply: parse, then env.step (or penalty)."""
    from tether.agent.episode import LocalEnvBatch
    from tether.agent.format import THINK_OPEN, parse_reply

    envs = LocalEnvBatch(env_id)
    envs.reset(list(env_seeds))
    answers = []
    for i, text in enumerate(completions):
        parsed = parse_reply(THINK_OPEN + text)
        answers.append((i, parsed.answer if parsed.format_ok else None))
    return [o.reward for o in envs.step(answers)]


# --------------------------------------------------------------------------- Tether


class TetherStep:
    """One Tether GRPO step on in-process learner + rollout engine (no Ray).

    ``env_seeds(k)`` gives step k's levels (default: 1000 k + g for prompt g),
    ``sampling_seed`` offsets the sampler's seeds, ``settings`` overrides fields of the
    update settings below (clip, loss aggregation, ...)."""

    def __init__(
        self,
        path: Path,
        args,
        kl: float,
        env_id: str = ENV_ID,
        env_seeds=None,
        sampling_seed: int = 0,
        settings: dict | None = None,
    ):
        from tether.agent.chat import ChatFormatter
        from tether.agent.episode import LocalEnvBatch
        from tether.policy.load import load_model_and_tokenizer
        from tether.rollout import make_engine
        from tether.rollout.base import SamplingParams
        from tether.testing.settings import update_settings

        self.args = args
        self.model, self.tokenizer = load_model_and_tokenizer(path)
        rollout_model = load_model_and_tokenizer(path)[0]
        self.reference = load_model_and_tokenizer(path)[0].requires_grad_(False) if kl else None
        self.engine = make_engine(
            "hf",
            rollout_model,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_ids=[self.tokenizer.eos_token_id],
            tokenizer=self.tokenizer,
            grouped_prompts=args.grouped_prompts,
        )
        self.formatter = ChatFormatter(self.tokenizer)
        self.envs = LocalEnvBatch(env_id)
        self.env_seeds = env_seeds or (lambda k: [1_000 * k + g for g in range(args.prompts)])
        self.sampling_seed = sampling_seed
        self.sampling = SamplingParams(
            max_new_tokens=args.max_new,
            temperature=1.0,
            stop_token_ids=(self.tokenizer.eos_token_id,),
        )
        self.settings = update_settings(
            kl_coef=kl,
            kl_estimator="k3",
            loss_agg="token-mean",
            ppo_epochs=1,
            minibatches=1,
            micro_batch_size=16,
            max_grad_norm=1.0,
            shared_prefix=args.shared_prefix,
        )
        self.settings = dataclasses.replace(self.settings, **(settings or {}))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.0)
        self.step_index = 0

    def __call__(self) -> dict[str, float]:
        from tether.agent.episode import EpisodeSpec, run_episodes
        from tether.algos.advantages import AdvantageInputs, compute_advantages
        from tether.algos.batch import collate
        from tether.algos.update import policy_update, prepare_batch

        a, k = self.args, self.step_index
        self.step_index += 1
        levels = self.env_seeds(k)
        specs = [EpisodeSpec(g, levels[g], i) for g in range(a.prompts) for i in range(a.group)]
        t0, c0 = time.perf_counter(), time.process_time()
        trajectories = run_episodes(
            self.engine,
            self.formatter,
            self.envs,
            specs,
            self.sampling,
            seed=self.sampling_seed + k,
        )
        t1 = time.perf_counter()
        batch = collate(trajectories, self.tokenizer.pad_token_id)
        batch = prepare_batch(
            batch, self.model, self.settings, recompute_old_logprobs=False, reference=self.reference
        )
        inputs = AdvantageInputs(
            scores=batch.scores,
            group_index=batch.group_index,
            response_mask=batch.response_mask,
            token_rewards=batch.token_rewards,
        )
        batch.advantages, batch.returns = compute_advantages("grpo", inputs)
        t2 = time.perf_counter()
        self.last_metrics = policy_update(self.model, self.optimizer, batch, self.settings, seed=k)
        t3 = time.perf_counter()
        self.engine.load_state_dict(
            {n: p.detach().clone() for n, p in self.model.state_dict().items()}
        )
        t4 = time.perf_counter()
        return {
            "step": t4 - t0,
            "cpu": time.process_time() - c0,
            "rollout": t1 - t0,
            "prepare": t2 - t1,
            "update": t3 - t2,
            "sync": t4 - t3,
            "completion_tokens": float(batch.response_mask.sum()),
            "prompt_tokens": float(batch.attention_mask.sum() - batch.response_mask.sum()),
            "success": sum(t.success for t in trajectories) / len(trajectories),
            "reward": float(batch.scores.mean()),
        }


# --------------------------------------------------------------------------- TRL


def trl_trainer(
    path: Path,
    args,
    kl: float,
    out_dir: str,
    prompts: list[str],
    seeds: list[int],
    on_step_end,
    env_id: str = ENV_ID,
    overrides: dict | None = None,
    on_rewards=None,
    stop_token_ids: list[int] | None = None,
):
    """TRL's ``GRPOTrainer`` on the saved policy; ``overrides`` replace ``GRPOConfig``
    fields of the matched setup below, ``on_rewards(rewards)`` sees each generation
    batch's rewards, ``stop_token_ids`` (default: EOS) end a completion and its mask."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tether.policy.load import load_tokenizer

    def reward_env(prompts, completions, env_seed, **kwargs):
        rewards = env_rewards(list(completions), list(env_seed), env_id)
        if on_rewards is not None:
            on_rewards(rewards)
        return rewards

    batch = args.prompts * args.group
    wanted = dict(
        output_dir=out_dir,
        per_device_train_batch_size=16,
        gradient_accumulation_steps=batch // 16,
        steps_per_generation=batch // 16,
        num_iterations=1,
        num_generations=args.group,
        max_completion_length=args.max_new,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=kl,
        learning_rate=args.lr,
        max_grad_norm=1.0,
        weight_decay=0.0,
        use_vllm=False,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        logging_steps=10**6,
        report_to="none",
        save_strategy="no",
        max_steps=args.warmup + args.steps,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
        shuffle_dataset=True,
        max_prompt_length=None,
    )
    wanted.update(overrides or {})
    fields = set(GRPOConfig.__dataclass_fields__)
    config = GRPOConfig(**{k: v for k, v in wanted.items() if k in fields})
    ignored = sorted(set(wanted) - fields)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    if stop_token_ids is not None:  # TRL stops and masks at every id the model declares
        model.generation_config.eos_token_id = list(stop_token_ids)
    tokenizer = load_tokenizer(path)  # Tether's own tokenizer as saved (not Qwen2's)

    class Alternate(TrainerCallback):
        def on_step_end(self, *cb_args, **cb_kwargs):
            on_step_end()

    dataset = Dataset.from_dict({"prompt": prompts, "env_seed": seeds})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_env,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Alternate()],
    )
    return trainer, config, ignored


def instrument_trl(trainer, phases: dict[str, float]) -> None:
    """Accumulate TRL's time in generation and in its log-prob forwards (no-grad: old /
    reference log-probs; with grad: the training forward).  The caller resets it per step."""
    phases.update({"generate": 0.0, "logprob_nograd": 0.0, "logprob_train_forward": 0.0})

    def timed(name_of, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[name_of()] += time.perf_counter() - t0

        return wrapper

    trainer._generate_single_turn = timed(lambda: "generate", trainer._generate_single_turn)
    trainer._get_per_token_logps_and_entropies = timed(
        lambda: "logprob_train_forward" if torch.is_grad_enabled() else "logprob_nograd",
        trainer._get_per_token_logps_and_entropies,
    )


# --------------------------------------------------------------------------- the comparison


def compare(size: str, kl: float, args, work: Path) -> dict:
    from tether.agent.chat import ChatFormatter
    from tether.policy.load import load_tokenizer

    path = work / f"{size}-policy"
    if not (path / "config.json").exists():
        build_policy(size, path)
    tokenizer = load_tokenizer(path)
    formatter = ChatFormatter(tokenizer)
    n_prompts = args.prompts * (args.warmup + args.steps + 2)
    seeds = [50_000 + i for i in range(n_prompts)]
    ids = [prompt_ids(formatter, s, args.max_new) for s in seeds]
    texts = [formatter.decode(p) for p in ids]
    same = all(formatter.encode(t) == p for t, p in zip(texts, ids))

    tether = TetherStep(path, args, kl)
    trl_times, trl_cpu, trl_phases, tether_runs = [], [], [], []
    mark = {"t": time.perf_counter(), "c": time.process_time()}
    phases: dict[str, float] = {}

    def on_trl_step_end():
        trl_times.append(time.perf_counter() - mark["t"])
        trl_cpu.append(time.process_time() - mark["c"])
        trl_phases.append(dict(phases))
        tether_runs.append(tether())
        for key in phases:
            phases[key] = 0.0
        mark["t"], mark["c"] = time.perf_counter(), time.process_time()

    trainer, config, ignored = trl_trainer(
        path, args, kl, str(work / f"trl-{size}-{kl}"), texts, seeds, on_trl_step_end
    )
    instrument_trl(trainer, phases)
    torch.set_num_threads(args.threads)
    mark["t"], mark["c"] = time.perf_counter(), time.process_time()
    trainer.train()
    keep = slice(args.warmup, None)
    trl_s, tether_s = trl_times[keep], [r["step"] for r in tether_runs[keep]]
    med = statistics.median
    result = {
        "size": size,
        "kl": kl,
        "params": sum(p.numel() for p in tether.model.parameters()),
        "trl_median": med(trl_s),
        "tether_median": med(tether_s),
        "ratio": med(trl_s) / med(tether_s),
        "pair_ratios": [t / e for t, e in zip(trl_s, tether_s)],
        "trl_runs": trl_s,
        "tether_runs": tether_s,
        "trl_cpu": med(trl_cpu[keep]),
        "tether_cpu": med(r["cpu"] for r in tether_runs[keep]),
        "trl_phases": {k: med(p[k] for p in trl_phases[keep]) for k in trl_phases[0]},
        "tether_stages": {
            k: med(r[k] for r in tether_runs[keep])
            for k in ("rollout", "prepare", "update", "sync", "completion_tokens", "prompt_tokens")
        },
        "prompt_len": statistics.mean(map(len, ids)),
        "same_ids": same,
        "optimizer_steps_trl": trainer.state.global_step,
        "updates_tether": tether.step_index,
        "ignored_trl_fields": ignored,
        "threads": torch.get_num_threads(),
    }
    return result


def profile_tether(size: str, kl: float, args, work: Path) -> None:
    """Where Tether's step goes: stage times of warm-up + timed steps, then the torch
    profiler's top operators (self CPU time) over one more step.  No TRL needed."""
    path = work / f"{size}-policy"
    if not (path / "config.json").exists():
        build_policy(size, path)
    tether = TetherStep(path, args, kl)
    for _ in range(args.warmup):
        tether()
    runs = [tether() for _ in range(args.steps)]
    med = statistics.median
    print(
        f"\n{size}, KL {kl}: Tether step median {med(r['step'] for r in runs):.2f} s (cpu "
        f"{med(r['cpu'] for r in runs):.1f} s): "
        + ", ".join(
            f"{k} {med(r[k] for r in runs):.2f}" for k in ("rollout", "prepare", "update", "sync")
        )
    )
    with torch.profiler.profile() as prof:
        tether()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", nargs="+", default=["tiny", "small"], choices=["tiny", "small", "micro"]
    )
    ap.add_argument("--kl", nargs="+", type=float, default=[0.0, 0.04])
    ap.add_argument("--steps", type=int, default=5, help="timed step pairs per configuration")
    ap.add_argument("--warmup", type=int, default=2, help="untimed step pairs first")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--no-shared-prefix",
        dest="shared_prefix",
        action="store_false",
        help="Tether's learner without the shared-prefix forward (each row's prompt run again)",
    )
    ap.add_argument(
        "--no-grouped-prompts",
        dest="grouped_prompts",
        action="store_false",
        default=None,
        help="Tether's rollout engine with a per-row prompt cache (no grouped-prompt attention)",
    )
    ap.add_argument("--work", default=None, help="where the models are saved (default: a temp dir)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="Tether only: stage times and the torch profiler's top operators (no TRL)",
    )
    args = ap.parse_args()
    if (args.prompts * args.group) % 16:
        ap.error("prompts x group must be a multiple of 16 (the micro-batch)")
    torch.set_num_threads(args.threads)
    import transformers

    if args.profile:
        print(
            f"torch {torch.__version__}, transformers {transformers.__version__}, threads "
            f"{args.threads}, shared_prefix {args.shared_prefix}, grouped_prompts {args.grouped_prompts}"
        )
        work = Path(args.work or tempfile.mkdtemp(prefix="vs_trl."))
        for size in args.model:
            for kl in args.kl:
                profile_tether(size, kl, args, work)
        return
    import trl

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
        f"python {platform.python_version()}, threads {args.threads}, cpus {os.cpu_count()}, "
        f"shared_prefix {args.shared_prefix}, grouped_prompts {args.grouped_prompts} (None = auto)",
        flush=True,
    )
    work = Path(args.work or tempfile.mkdtemp(prefix="vs_trl."))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.model:
        for kl in args.kl:
            r = compare(size, kl, args, work)
            rows.append(r)
            st = r["tether_stages"]
            print(
                f"\n{size} ({r['params'] / 1e6:.2f} M params), KL {kl}: prompts ~{r['prompt_len']:.0f} "
                f"tokens (same ids in both: {r['same_ids']}), completion tokens/step "
                f"{st['completion_tokens']:.0f}, optimiser steps TRL {r['optimizer_steps_trl']} / "
                f"Tether {r['updates_tether']}, threads {r['threads']}, TRL fields not in this "
                f"version: {r['ignored_trl_fields']}"
            )
            print(
                f"  TRL    median {r['trl_median']:.2f} s/step (cpu {r['trl_cpu']:.1f} s)  runs "
                + " ".join(f"{x:.2f}" for x in r["trl_runs"])
            )
            print(
                f"  Tether median {r['tether_median']:.2f} s/step (cpu {r['tether_cpu']:.1f} s)  runs "
                + " ".join(f"{x:.2f}" for x in r["tether_runs"])
            )
            tp = r["trl_phases"]
            rest = r["trl_median"] - sum(tp.values())
            print(
                f"  TRL phases (median s): generate {tp['generate']:.2f}, no-grad log-prob forwards "
                f"{tp['logprob_nograd']:.2f}, training forward {tp['logprob_train_forward']:.2f}, "
                f"backward + optimiser + rest {rest:.2f}"
            )
            print(
                f"  Tether stages (median s): rollout {st['rollout']:.2f}, prepare {st['prepare']:.2f}, "
                f"update {st['update']:.2f}, sync {st['sync']:.3f}"
            )
            print(
                f"  ratio TRL/Tether {r['ratio']:.2f}x  (pairs: "
                + " ".join(f"{x:.2f}" for x in r["pair_ratios"])
                + ")",
                flush=True,
            )
    print("\n| model | KL | TRL s/step | Tether s/step | TRL / Tether |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['size']} ({r['params'] / 1e6:.2f} M) | {r['kl']} | {r['trl_median']:.2f} | "
            f"{r['tether_median']:.2f} | {r['ratio']:.2f}x |"
        )


if __name__ == "__main__":
    main()
