"""How often the collapse alarms fire on noise, and how fast they catch a real collapse.

Protocol (fixed before the runs; `benchmarks/RESULTS.md` records the outcome):

Policies.  The known-answer harness's micro model (`tether.diagnostics.harness`) is
fine-tuned on a *mixture* behaviour: for every prompt, with probability ``q`` the reply is
one of T input-independent templates (the harness's ``random_template``: template
collapse, H(Z|X) = log T), otherwise it copies the prompt's keys (``grounded``).  One real
model per share q in {0, 0.25, 0.5, 0.75, 1}.  Each model samples a pool of replies
(``--pool-prompts`` prompts x ``--pool-replies`` replies) and scores every reply under
every pool prompt with the trainer's cross-scoring (`cross_score_pairs`): the pool's L and
S matrices.

Diagnostic points.  A point of a history at share q draws 8 distinct prompts and 4 of each
prompt's replies from q's pool (32 pairs, 8 columns: the quickstart's first-turn shape,
``max_pairs`` 32 over 8 groups) and runs `mi_proxies` with the default uncertainty
(1000 bootstrap resamples, 1000 permutations) and the EMA state carried along the
history, exactly as a run logs ``collapse/first_turn/…``.  The alarms (`AlarmMonitor`,
default config: ``mi_zscore_ema``, window 10, alpha 0.05, patience 2) read the stream.

Histories (``--points`` diagnostic points each, 30 by default = 150 iterations at the
default cadence):
- null: ``grounded`` (q = 0 throughout), ``mixed`` (q = 0.5), ``template`` (q = 1: input-
  blind at noise level, as the quickstart's policy was);
- collapse, onset at point ``--onset`` (12): ``abrupt`` (q 0 -> 1), ``gradual`` (q steps
  0 -> 0.25 -> 0.5 -> 0.75 -> 1, two points per step); reported beside them and not part
  of the target, ``partial`` (q 0 -> 0.5 abruptly).

Measured.  False alarms: ``template_collapse`` events per 1,000 diagnostic points over
the null histories, and over the pre-onset points of collapse histories (target <= 1).
Detection: share of collapse histories whose ``template_collapse`` fired after the onset
(target >= 95 %), and the delay from the point where the intervals first separate (the
first post-onset point whose MI interval lies wholly below that of an earlier point the
alarm counts as significant, p < alpha / window; target <= 2 points).  ``low_entropy_collapse`` events are counted too.

    python benchmarks/alarm_quality.py                  # default: 200 null + 100 collapse histories per kind
    python benchmarks/alarm_quality.py --histories 20   # quick look
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch

from tether.diagnostics.alarms import AlarmMonitor, AlarmsConfig
from tether.diagnostics.crossscore import cross_score_pairs
from tether.diagnostics.harness import (Behaviour, HarnessConfig, parse_reply, prompt_ids,
                                        random_keys, sample_replies, torch_threads, train_policy)
from tether.diagnostics.mi import mi_proxies, prefixed
from tether.diagnostics.uncertainty import Uncertainty

SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
PREFIX = "collapse/first_turn"


class Mixture(Behaviour):
    """``random_template`` with probability ``share``, else ``grounded``."""

    def __init__(self, share: float, cfg: HarnessConfig, rng: np.random.Generator) -> None:
        super().__init__("random_template", cfg, rng)
        self.share = share

    def reply(self, keys, rng):
        if rng.random() < self.share:
            return super().reply(keys, rng)
        return keys, (keys[0],)


@dataclass
class Pool:
    """Replies of one policy to ``prompts`` (row r answers prompt ``owner[r]``), scored
    under every prompt: L, S [rows, prompts]."""
    L: np.ndarray
    S: np.ndarray
    owner: np.ndarray


def build_pool(share: float, cfg: HarnessConfig, n_prompts: int, n_replies: int, seed: int) -> Pool:
    rng = np.random.default_rng([seed, int(share * 100)])
    model, _ = train_policy(Mixture(share, cfg, rng), cfg, rng)
    prompts = [prompt_ids(random_keys(cfg, rng)) for _ in range(n_prompts)]
    generator = torch.Generator().manual_seed(seed)
    asked = [p for p in prompts for _ in range(n_replies)]
    replies = sample_replies(model, asked, cfg.temperature, max(cfg.keys, cfg.template_len) + 6, generator)
    reasonings = [parse_reply(r)[0] for r in replies]
    owner = np.repeat(np.arange(n_prompts), n_replies)
    keep = np.array([len(z) > 0 for z in reasonings])
    scores = cross_score_pairs(model, prompts, [z for z, k in zip(reasonings, keep) if k],
                               cfg.temperature)
    return Pool(scores.L, scores.S, owner[keep])


def draw_point(pool: Pool, rng: np.random.Generator, prompts: int = 8, per_prompt: int = 4):
    """A first-turn-shaped batch from the pool: sub-matrices and each row's column."""
    columns = rng.choice(pool.L.shape[1], size=prompts, replace=False)
    rows, column = [], []
    for j, c in enumerate(columns):
        mine = np.flatnonzero(pool.owner == c)
        picked = rng.choice(mine, size=min(per_prompt, len(mine)), replace=False)
        rows += picked.tolist()
        column += [j] * len(picked)
    rows = np.array(rows)
    return pool.L[np.ix_(rows, columns)], pool.S[np.ix_(rows, columns)], np.array(column)


def schedule(kind: str, points: int, onset: int) -> list[float]:
    if kind in ("grounded", "mixed", "template"):
        return [{"grounded": 0.0, "mixed": 0.5, "template": 1.0}[kind]] * points
    after = {"abrupt": lambda k: 1.0, "partial": lambda k: 0.5,
             "gradual": lambda k: SHARES[min(len(SHARES) - 1, 1 + k // 2)]}[kind]
    return [0.0 if t < onset else after(t - onset) for t in range(points)]


def run_history(pools: dict[float, Pool], shares: list[float], rng: np.random.Generator,
                uncertainty: Uncertainty, config: AlarmsConfig):
    monitor = AlarmMonitor(config, clock=lambda: 0.0)
    ema, stream = None, []
    for t, share in enumerate(shares, start=1):
        L, S, column = draw_point(pools[share], rng)
        metrics, ema = mi_proxies(L, S, column, ema, uncertainty, rng)
        flat = prefixed(metrics, PREFIX)
        stream.append(flat)
        monitor.update(t, flat)
    return monitor.events, stream


def first_separation(stream: list[dict], onset: int, alpha: float, key: str) -> int | None:
    """The first post-onset point (1-based) whose MI interval lies wholly below the
    interval of an earlier significant point."""
    for t in range(onset + 1, len(stream) + 1):
        now = stream[t - 1]
        for earlier in stream[:t - 1]:
            if earlier[f"{PREFIX}/p_grounded"] < alpha and now[f"{key}_ci_high"] < earlier[f"{key}_ci_low"]:
                return t
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--histories", type=int, default=None,
                        help="histories per kind (default: 200 null, 100 collapse)")
    parser.add_argument("--points", type=int, default=30)
    parser.add_argument("--onset", type=int, default=12)
    parser.add_argument("--pool-prompts", type=int, default=96)
    parser.add_argument("--pool-replies", type=int, default=12)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--mi-metric", default=None,
                        help="the alarms' MI proxy (default: the alarms' config default)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="another setting of both MI alarms, e.g. patience=3")
    args = parser.parse_args()
    started = time.perf_counter()
    overrides = {} if args.mi_metric is None else {"mi_metric": f"{PREFIX}/{args.mi_metric}"}
    for item in args.set:
        name, value = item.split("=", 1)
        overrides[name] = float(value) if "." in value else int(value)
    config = AlarmsConfig.model_validate({"template_collapse": overrides, "low_entropy_collapse": overrides})
    cfg, uncertainty = HarnessConfig(seed=args.seed), Uncertainty()
    key = f"{config.template_collapse.mi_metric}"
    with torch_threads(1):
        pools = {q: build_pool(q, cfg, args.pool_prompts, args.pool_replies, args.seed) for q in SHARES}
    print(f"pools built in {time.perf_counter() - started:.0f} s")
    rng = np.random.default_rng(args.seed)
    rows = []
    for kind in ("grounded", "mixed", "template", "abrupt", "gradual", "partial"):
        collapse = kind in ("abrupt", "gradual", "partial")
        n = args.histories or (100 if collapse else 200)
        false_alarms = low_entropy = null_points = detected = 0
        delays, mi_first, mi_last = [], [], []
        for _ in range(n):
            events, stream = run_history(pools, schedule(kind, args.points, args.onset), rng,
                                         uncertainty, config)
            template = [e.iteration for e in events if e.name == "template_collapse"]
            low_entropy += sum(e.name == "low_entropy_collapse" for e in events)
            clean_until = args.onset if collapse else args.points
            null_points += clean_until
            false_alarms += sum(t <= clean_until for t in template)
            mi_first.append(stream[0][key]), mi_last.append(stream[-1][key])
            if collapse:
                fired = [t for t in template if t > args.onset]
                detected += bool(fired)
                separated = first_separation(stream, args.onset, config.template_collapse.alpha
                                             / config.template_collapse.window, key)
                if fired and separated is not None:
                    delays.append(fired[0] - separated)
        rows.append((kind, n, null_points, false_alarms, 1000 * false_alarms / max(null_points, 1),
                     detected / n if collapse else float("nan"), delays, low_entropy,
                     float(np.mean(mi_first)), float(np.mean(mi_last))))
    print(f"\n{'history':9} {'n':>4} {'clean pts':>9} {'false':>5} {'per 1k':>7} {'detected':>8} "
          f"{'delay (points after separation)':>32} {'low-H':>5} {'MI z first':>10} {'MI z last':>9}")
    for kind, n, pts, fa, rate, det, delays, low, first, last in rows:
        delay = (f"median {np.median(delays):.0f}, max {max(delays)}, <=2: {np.mean(np.array(delays) <= 2):.0%}"
                 if delays else "-")
        print(f"{kind:9} {n:>4} {pts:>9} {fa:>5} {rate:>7.2f} {det:>8.0%} {delay:>32} {low:>5} "
              f"{first:>10.3f} {last:>9.3f}")
    null_rows = [r for r in rows if r[0] in ("grounded", "mixed", "template")]
    total_fa, total_pts = sum(r[3] for r in rows), sum(r[2] for r in rows)
    print(f"\nall clean points: {total_fa} false template_collapse in {total_pts} points = "
          f"{1000 * total_fa / total_pts:.2f} per 1,000 (null histories alone: "
          f"{1000 * sum(r[3] for r in null_rows) / sum(r[2] for r in null_rows):.2f})")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
