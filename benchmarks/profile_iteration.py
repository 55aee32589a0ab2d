"""Where a recipe's iteration goes: stage by stage, operator by operator (issue 73, item 1).

Runs ``--iterations`` iterations of a recipe (default: the quickstart) in this process,
without Ray, through the functions the actors call, with the actors' thread counts:

- **collect**: ``run_episodes`` on the recipe's rollout engine, one worker's contiguous
  share of the episodes at a time at ``rollout.num_cpus_per_worker`` threads (the
  workers run side by side, so the stage's wall is the slowest share's);
- **prepare**: ``collate`` + ``prepare_batch`` (the reference log-probs for the KL term;
  the sampler's log-probs are the old policy's) at ``algo.threads``;
- **update**: advantages, the recipe's filter, ``policy_update``, then the weight copy
  into the engine (the sync).

Iteration 1 warms up; the later ones are timed plainly, and the last is then run again
under ``torch.profiler`` (shapes and FLOPs recorded) from the same weights, state and
seeds.  Per stage it prints: the wall time (timed iterations, median), the share of the
profiled stage's time spent inside torch operators by kind (matrix products of the
linear layers, the vocabulary head, attention, log-softmax and other vocabulary-sized
work, the rest of the operators) and outside them (Python, the framework's dispatch),
the achieved matmul FLOP/s as a fraction of the fp32 peak at that stage's thread count,
and for prepare and update the padded share of the positions the forward computes.

    PYTHONPATH=. flock /tmp/tether-cpu.lock python benchmarks/profile_iteration.py
    PYTHONPATH=. python benchmarks/profile_iteration.py --iterations 3 --json /tmp/p.json
    PYTHONPATH=. python benchmarks/profile_iteration.py --attention sdpa   # the learner's kernel

What it leaves out: Ray's own cost (object transfer, scheduling; compare the stage walls
with a real run's ``timing/*`` metrics) and the diagnostics' stages (probe, gradient
SNR), which ``benchmarks/diagnostics_overhead.py`` measures.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.rollout_engine import matmul_peak  # noqa: E402

KINDS = ("linear matmul", "vocab head matmul", "attention", "vocab-sized other", "other ops")


def kind(name: str, shapes, vocab: int) -> str:
    """The operator's kind: by name, by a dimension of the vocabulary's size, and by the
    4-D tensors ([rows, heads, positions, ·]) that only attention makes: its scores, their
    mask and softmax, and the rotary embedding of the queries and keys."""
    dims = [shape for shape in shapes if isinstance(shape, list)]
    touches_vocab = any(vocab in shape for shape in dims)
    if name in ("aten::mm", "aten::addmm"):
        return "vocab head matmul" if touches_vocab else "linear matmul"
    if touches_vocab:
        return "vocab-sized other"
    if name in ("aten::bmm", "aten::baddbmm") or "attention" in name:
        return "attention"
    if any(len(shape) == 4 for shape in dims):
        return "attention"
    return "other ops"


def breakdown(prof, wall: float, vocab: int) -> dict:
    """Self CPU time by kind (seconds), FLOPs of the matrix products, and the time outside
    every operator (the profiled wall minus the operators' self time)."""
    seconds: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    flops = 0.0
    for event in prof.key_averages(group_by_input_shape=True):
        if not event.key.startswith("aten::"):
            continue
        k = kind(event.key, event.input_shapes or [], vocab)
        seconds[k] += event.self_cpu_time_total / 1e6
        by_op[f"{event.key} ({k})"] += event.self_cpu_time_total / 1e6
        flops += event.flops or 0.0
    inside = sum(seconds.values())
    return {
        "profiled_wall": wall,
        "seconds": {k: seconds.get(k, 0.0) for k in KINDS},
        "outside_ops": max(wall - inside, 0.0),
        "matmul_flops": flops,
        "top_ops": dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:8]),
    }


class Iteration:
    """The recipe's state in this process: the policy, its reference, the engine, the
    optimiser, the environments and the level sampler."""

    def __init__(self, cfg, attention: str | None = None) -> None:
        from tether.agent.chat import ChatFormatter
        from tether.agent.episode import LocalEnvBatch
        from tether.agent.pairs import SpanExtractor
        from tether.algos.update import UpdateSettings
        from tether.platform.run.stages import LevelSampler
        from tether.policy.load import load_model, load_model_and_tokenizer, resolve_policy
        from tether.policy.precision import resolve_autocast
        from tether.rollout import make_engine_for
        from tether.rollout.base import SamplingParams

        self.cfg = cfg
        path = resolve_policy(cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens)
        self.model, self.tokenizer = load_model_and_tokenizer(path)
        self.reference = load_model(path).requires_grad_(False) if cfg.algo.kl_coef > 0 else None
        for module in (self.model, self.reference):  # the learner's forwards (not the engine's)
            if attention and module is not None:
                module.set_attn_implementation(attention)
        r = cfg.rollout
        self.engine = make_engine_for(
            r.engine,
            load_model(path),
            self.tokenizer,
            autocast=resolve_autocast(r.autocast, "cpu"),
            **(r.engine_kwargs or {}),
        )
        self.formatter = ChatFormatter(self.tokenizer)
        self.spans = SpanExtractor(self.formatter)
        self.envs = LocalEnvBatch(cfg.env.id, cfg.env_kwargs())
        self.sampler = LevelSampler(cfg.experiment.seed, cfg.env.val_seed_offset)
        self.sampling = SamplingParams(
            max_new_tokens=r.max_reply_tokens, temperature=r.temperature, top_p=r.top_p
        )
        settings = UpdateSettings.from_config(
            cfg.algo, r.temperature, iterations=cfg.trainer.iterations
        )
        self.settings = dataclasses.replace(
            settings, autocast=resolve_autocast(settings.autocast, "cpu")
        )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.algo.lr, eps=cfg.algo.adam_eps, weight_decay=0.0
        )
        self.worker_threads = max(1, math.ceil(r.num_cpus_per_worker))
        self.learner_threads = max(1, math.ceil(cfg.algo.threads))
        self.it = 0

    def snapshot(self) -> dict:
        return copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "sampler": self.sampler.position,
                "it": self.it,
            }
        )

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.engine.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.position, self.it = state["sampler"], state["it"]

    def collect(self):
        from tether import seeds
        from tether.agent.episode import run_episodes

        r = self.cfg.rollout
        specs = self.sampler.specs(r.groups, r.group_size, 0)
        share = math.ceil(len(specs) / r.num_workers)
        torch.set_num_threads(self.worker_threads)
        trajectories, walls = [], []
        for k in range(0, len(specs), share):
            t0 = time.perf_counter()
            trajectories += run_episodes(
                self.engine,
                self.formatter,
                self.envs,
                specs[k : k + share],
                self.sampling,
                seeds.collection(self.cfg.experiment.seed, self.it) + k,
            )
            walls.append(time.perf_counter() - t0)
        return trajectories, max(walls)

    def prepare(self, trajectories):
        from tether.algos.batch import collate
        from tether.algos.update import prepare_batch

        torch.set_num_threads(self.learner_threads)
        batch = collate(
            trajectories,
            self.tokenizer.pad_token_id,
            reasoning_masks=[self.spans.reasoning_mask(t) for t in trajectories],
        )
        return prepare_batch(batch, self.model, self.settings, False, reference=self.reference)

    def update(self, trajectories, batch) -> dict:
        from tether.algos.update import policy_update
        from tether.platform.run.stages import advantages, filter_groups

        torch.set_num_threads(self.learner_threads)
        filtered, kept = filter_groups(trajectories, self.cfg.filter)
        batch = advantages(batch, self.cfg.algo)
        if not kept:  # the filter kept no group: no update, as in the run
            return {"train_rows": 0.0}
        train = batch.select([i for i, t in enumerate(trajectories) if t.group_id in kept])
        train.advantages = train.advantages * filtered.loss_scale
        metrics = policy_update(self.model, self.optimizer, train, self.settings, seed=self.it)
        self.engine.load_state_dict({n: p.detach() for n, p in self.model.state_dict().items()})
        return {"train_rows": float(len(train.advantages)), **metrics}

    def step(self, profile: bool = False) -> dict:
        """One iteration; with ``profile`` each stage under its own profiler."""
        self.it += 1
        out: dict = {}
        vocab = self.model.config.vocab_size

        def stage(name, fn):
            if not profile:
                t0 = time.perf_counter()
                value = fn()
                out[name] = time.perf_counter() - t0
                return value
            with torch.profiler.profile(record_shapes=True, with_flops=True) as prof:
                t0 = time.perf_counter()
                value = fn()
                wall = time.perf_counter() - t0
            out[name] = breakdown(prof, wall, vocab)
            return value

        trajectories, share_wall = stage("collect", self.collect)
        out["collect_share_wall"] = share_wall
        batch = stage("prepare", lambda: self.prepare(trajectories))
        stage("update", lambda: self.update(trajectories, batch))
        mask = batch.attention_mask
        out["positions"] = float(mask.numel())
        out["real_tokens"] = float(mask.sum())
        out["agent_tokens"] = float(batch.response_mask.sum())
        out["generated_tokens"] = float(sum(len(t.token_ids) for t in trajectories))
        return out


def report(timed: list[dict], profiled: dict, peaks: dict) -> dict:
    med = statistics.median
    rows = {}
    for name in ("collect", "prepare", "update"):
        p = profiled[name]
        wall = med(t[name] for t in timed)
        threads = "worker" if name == "collect" else "learner"
        # collect: the shares ran one after the other here; side by side in the run
        share = med(t["collect_share_wall"] for t in timed) if name == "collect" else wall
        flops_per_s = p["matmul_flops"] / wall  # collect: its shares' sum, one worker's rate
        rows[name] = {
            "wall_s": wall,
            "wall_in_run_s": share,
            "shares": {k: v / p["profiled_wall"] for k, v in p["seconds"].items()},
            "outside_ops": p["outside_ops"] / p["profiled_wall"],
            "peak_fraction": flops_per_s / peaks[threads],
            "top_ops": {k: v / p["profiled_wall"] for k, v in p["top_ops"].items()},
        }
    t = timed[-1]
    padding = 1.0 - t["real_tokens"] / t["positions"]
    print(
        f"\nmatmul peak: worker threads {peaks['worker'] / 1e9:.1f} GFLOP/s, learner threads "
        f"{peaks['learner'] / 1e9:.1f} GFLOP/s"
    )
    print(
        f"batch: {t['positions']:.0f} padded positions, {t['real_tokens']:.0f} real tokens "
        f"(padding {100 * padding:.1f} %), {t['agent_tokens']:.0f} agent tokens "
        f"({100 * t['agent_tokens'] / t['real_tokens']:.1f} % of the real ones)"
    )
    header = f"{'stage':8} {'wall s':>7} {'in run':>7} " + " ".join(f"{k[:12]:>12}" for k in KINDS)
    print(header + f" {'outside':>8} {'% peak':>7}")
    for name, row in rows.items():
        shares = " ".join(f"{100 * row['shares'][k]:11.1f}%" for k in KINDS)
        print(
            f"{name:8} {row['wall_s']:7.2f} {row['wall_in_run_s']:7.2f} {shares} "
            f"{100 * row['outside_ops']:7.1f}% {100 * row['peak_fraction']:6.1f}%"
        )
    return {
        "stages": rows,
        "padding": padding,
        "batch": {
            k: t[k] for k in ("positions", "real_tokens", "agent_tokens", "generated_tokens")
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("config", nargs="?", default="experiments/quickstart.yaml")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, as `tether run` takes")
    ap.add_argument("--iterations", type=int, default=4, help="1 warm-up, the rest timed")
    ap.add_argument("--json", type=Path, help="write the table here too")
    ap.add_argument(
        "--attention",
        choices=("eager", "sdpa"),
        help="the learner's attention kernel (default: the model's own)",
    )
    args = ap.parse_args()
    from tether.platform.config import load_config

    cfg = load_config(args.config, args.overrides)
    run = Iteration(cfg, args.attention)
    torch.manual_seed(cfg.experiment.seed)
    run.step()  # warm-up
    timed = []
    for _ in range(args.iterations - 1):
        before = run.snapshot()
        timed.append(run.step())
    run.restore(before)  # the last iteration again, under the profiler
    profiled = run.step(profile=True)
    peaks = {}
    for name, threads in (("worker", run.worker_threads), ("learner", run.learner_threads)):
        torch.set_num_threads(threads)
        peaks[name] = matmul_peak()
    result = report(timed, profiled, peaks)
    if args.json:
        out = {"config": args.config, "overrides": args.overrides, "attention": args.attention}
        args.json.write_text(json.dumps({**out, **result}, indent=1))


if __name__ == "__main__":
    main()
