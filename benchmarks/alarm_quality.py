"""How often the collapse alarms fire on noise, and how fast they catch a real collapse.

Protocol (fixed before the runs; `benchmarks/RESULTS.md` records the outcome):

Policies.  The known-answer harness's micro model (`tether.testing.harness`) is
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
(``--interval``, 1000 bootstrap resamples, 1000 permutations) and the EMA state carried along the
history, exactly as a run logs ``collapse/first_turn/…``.  The alarms (`AlarmMonitor`,
default config: ``mi_estimate``, window 10, alpha 0.05, patience 2 of ``within``) read the stream.

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
alarm counts as significant, p < alpha / window; target <= 2 points), and beside it the
delay from the onset (what a user waits; unlike separation, the same for every interval
method), with the share of collapse histories caught within ``--within-onset`` points of
the onset (2026-11-28; ``--delays-out`` writes each history's delay, and ``--paired-draws``
keeps the drawn points independent of the interval method, so two methods can be compared
history by history).  ``low_entropy_collapse`` events are counted too.

Truth check (added on 2026-11-23, commit 6cd7cf1, before run 3).  Which MI alarm a collapse history should
raise depends on the real policies, not on the labels: each pool's within-input entropy
H(Z|X) (per token, over all its replies under their own prompts) is printed, and a
collapse history counts as detected by ``template_collapse`` when the collapsed share's
pool has H(Z|X) at least that of the grounded pool, by ``low_entropy_collapse`` otherwise.
False alarms are counted for both MI alarms on clean points.

Run 3 (2026-11-23, commit 6cd7cf1; protocol fixed before the run).  Exploratory, seed 11, 100 histories
per kind: variants of the rule compared on the same histories (`--variant`).  The rule
chosen from it becomes the default; the confirmatory run is a fresh seed (12) at the
default counts, the new default against the old rule (``old:within=2,min_references=1``),
judged by the targets above; it is reported whatever it shows.

Run 4 (2026-11-28; protocol fixed before the run in benchmarks/history/2026-11-28.md, "The
alarms' delay from the detectable point").  The delay is also counted from the *detectable
point* (``--within-detectable``): the first post-onset point whose share's expected MI
(the mean over ``--truth-draws`` points from its pool) lies ``min_drop_fraction`` plus
``--clock-margin`` below the grounded pool's: a clock from the truth, the same for every
interval method.  Confirmatory seed 18, both batch intervals on the same draws
(``--paired-draws``; ``--against`` tests the pair).

    python benchmarks/alarm_quality.py                  # default: 200 null + 100 collapse histories per kind
    python benchmarks/alarm_quality.py --histories 20   # quick look
    python benchmarks/alarm_quality.py --variant shipped: --variant consecutive:within=2
                                                        # settings compared on the same histories
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from tether.diagnostics.alarms import AlarmMonitor, AlarmsConfig
from tether.diagnostics.crossscore import cross_score_pairs
from tether.diagnostics.mi import mi_proxies, prefixed
from tether.diagnostics.uncertainty import Uncertainty
from tether.testing.harness import (
    Behaviour,
    HarnessConfig,
    parse_reply,
    prompt_ids,
    random_keys,
    sample_replies,
    torch_threads,
    train_policy,
)

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
    replies = sample_replies(
        model, asked, cfg.temperature, max(cfg.keys, cfg.template_len) + 6, generator
    )
    reasonings = [parse_reply(r)[0] for r in replies]
    owner = np.repeat(np.arange(n_prompts), n_replies)
    keep = np.array([len(z) > 0 for z in reasonings])
    scores = cross_score_pairs(
        model, prompts, [z for z, k in zip(reasonings, keep) if k], cfg.temperature
    )
    return Pool(scores.L, scores.S, owner[keep])


def conditional_entropy(pool: Pool) -> float:
    """H(Z|X) per token over the pool: every reply scored under its own prompt."""
    return float(-pool.L[np.arange(len(pool.owner)), pool.owner].mean())


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
    after = {
        "abrupt": lambda k: 1.0,
        "partial": lambda k: 0.5,
        "gradual": lambda k: SHARES[min(len(SHARES) - 1, 1 + k // 2)],
    }[kind]
    return [0.0 if t < onset else after(t - onset) for t in range(points)]


def run_history(
    pools: dict[float, Pool],
    shares: list[float],
    rng: np.random.Generator,
    uncertainty: Uncertainty,
    interval_rng: np.random.Generator | None = None,
) -> list[dict]:
    """The diagnostics' stream of one history (what a run logs as ``collapse/first_turn/…``).
    ``interval_rng``: the proxies' resampling draws from it instead of ``rng``, so the
    points drawn do not depend on the interval method."""
    ema, stream = None, []
    for share in shares:
        L, S, column = draw_point(pools[share], rng)
        metrics, ema = mi_proxies(L, S, column, ema, uncertainty, interval_rng or rng)
        stream.append(prefixed(metrics, PREFIX))
    return stream


def alarm_events(stream: list[dict], config: AlarmsConfig):
    monitor = AlarmMonitor(config, clock=lambda: 0.0)
    for t, flat in enumerate(stream, start=1):
        monitor.update(t, flat)
    return monitor.events


def rate_interval(events: int, points: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact Poisson interval of a rate per 1,000 points."""
    a = 1 - confidence
    low = 0.0 if events == 0 else stats.chi2.ppf(a / 2, 2 * events) / 2
    high = stats.chi2.ppf(1 - a / 2, 2 * events + 2) / 2
    return 1000 * low / points, 1000 * high / points


def share_interval(k: int, n: int) -> str:
    ci = stats.binomtest(k, n).proportion_ci(method="wilson")
    return f"{k / n:.0%} [{ci.low:.0%}, {ci.high:.0%}]"


def expected_proxies(
    pools: dict[float, Pool], name: str, draws: int, rng: np.random.Generator
) -> dict[float, float]:
    """Each pool's expectation of proxy ``name`` over points of the histories' shape (the
    mean over ``draws`` points, no intervals): the truth the detectable point reads."""
    return {
        q: float(np.mean([mi_proxies(*draw_point(pool, rng))[0][name] for _ in range(draws)]))
        for q, pool in pools.items()
    }


def detectable_point(
    shares: list[float], onset: int, expected: dict, drop: float, margin: float
) -> int | None:
    """The first post-onset point (1-based, as the alarms count) whose share's expected MI
    lies at least ``drop + margin`` below the pre-onset share's (``drop`` the alarm's
    ``min_drop_fraction``): the earliest point the alarm's rule can be expected to call a
    collapse, read from the truth alone, so the same for every interval method.  The
    margin keeps a step whose expected fall sits at the threshold (where the rule fires on
    a coin toss) from being the clock."""
    reference = expected[shares[onset - 1]]
    for t in range(onset, len(shares)):
        if reference - expected[shares[t]] >= (drop + margin) * abs(reference):
            return t + 1
    return None


def caught(delays: list, k: int) -> list[bool]:
    """Per history, whether its alarm fired within ``k`` points (a missed one did not)."""
    return [d is not None and d <= k for d in delays]


def shifted(delays: list, shift: int | None) -> list:
    """Delays counted from ``shift`` points later (None stays None; no clock: all None)."""
    return [None if d is None or shift is None else d - shift for d in delays]


def paired_within(a: list[bool], b: list[bool]) -> str:
    """Exact McNemar test on the histories caught by one method and not the other (two
    runs of the same seed with --paired-draws read the same histories)."""
    only_mine = sum(x and not y for x, y in zip(a, b))
    only_theirs = sum(y and not x for x, y in zip(a, b))
    discordant = only_mine + only_theirs
    p = stats.binomtest(only_mine, discordant).pvalue if discordant else 1.0
    return f"only this run {only_mine}, only the other {only_theirs}, exact McNemar p = {p:.3g}"


def first_separation(stream: list[dict], onset: int, alpha: float, key: str) -> int | None:
    """The first post-onset point (1-based) whose MI interval lies wholly below the
    interval of an earlier significant point."""
    for t in range(onset + 1, len(stream) + 1):
        now = stream[t - 1]
        for earlier in stream[: t - 1]:
            if (
                earlier[f"{PREFIX}/p_grounded"] < alpha
                and now[f"{key}_ci_high"] < earlier[f"{key}_ci_low"]
            ):
                return t
    return None


def parse_variant(text: str) -> tuple[str, dict]:
    """``name:field=value,field=value`` (settings of both MI alarms)."""
    name, _, settings = text.partition(":")
    overrides = {}
    for item in filter(None, settings.split(",")):
        field, value = item.split("=", 1)
        overrides[field] = (
            f"{PREFIX}/{value}"
            if field == "mi_metric"
            else float(value)
            if "." in value
            else int(value)
        )
    return name, overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--histories",
        type=int,
        default=None,
        help="histories per kind (default: 200 null, 100 collapse)",
    )
    parser.add_argument("--points", type=int, default=30)
    parser.add_argument("--onset", type=int, default=12)
    parser.add_argument("--pool-prompts", type=int, default=96)
    parser.add_argument("--pool-replies", type=int, default=12)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--interval",
        choices=("bootstrap", "jackknife", "log_jackknife"),
        default=Uncertainty().interval,
        help="the proxies' interval (diagnostics.interval; default the shipped one, "
        "log_jackknife since 2026-11-28: the seeds recorded in RESULTS before it ran the "
        "bootstrap)",
    )
    parser.add_argument(
        "--within-onset",
        type=int,
        default=5,
        metavar="K",
        help="also print the share of collapse histories whose alarm fired within K points "
        "of the onset (a missed collapse counts as not within), with its Wilson interval",
    )
    parser.add_argument(
        "--delays-out",
        type=Path,
        default=None,
        metavar="PATH",
        help="write each collapse history's delay from the onset (null: never fired) as "
        "JSON {variant: {kind: [...]}}, in history order (with --paired-draws, two "
        "--interval runs at one seed read the same drawn histories: compare them pairwise)",
    )
    parser.add_argument(
        "--within-detectable",
        type=int,
        default=2,
        metavar="K",
        help="the share of collapse histories whose alarm fired within K points of the "
        "detectable point (the first post-onset point whose expected MI lies the alarm's "
        "min_drop_fraction below the grounded pool's), with its Wilson interval",
    )
    parser.add_argument(
        "--clock-margin",
        type=float,
        default=0.05,
        help="how far past the alarm's min_drop_fraction the expected fall must be at the "
        "detectable point (a fraction of the grounded MI)",
    )
    parser.add_argument(
        "--truth-draws",
        type=int,
        default=2000,
        metavar="N",
        help="points drawn from each pool to estimate its expected MI (the detectable point)",
    )
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="PATH",
        help="a --delays-out file of another run at the same seed with --paired-draws: "
        "print the exact McNemar test of the within-detectable shares, history by history",
    )
    parser.add_argument(
        "--paired-draws",
        action="store_true",
        help="draw the histories' points from a stream of their own, apart from the "
        "intervals' resampling, so that every --interval reads the same points (off by "
        "default: the seeds recorded in RESULTS were drawn from one stream)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:FIELD=VALUE,...",
        help="alarm settings to evaluate on the same histories, e.g. "
        "'consecutive:within=2' (default: one variant, the shipped config)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    variants = [parse_variant(v) for v in args.variant] or [("shipped", {})]
    per_history: dict[str, dict[str, list[int | None]]] = {}
    cfg, uncertainty = HarnessConfig(seed=args.seed), Uncertainty(interval=args.interval)
    with torch_threads(1):
        pools = {
            q: build_pool(q, cfg, args.pool_prompts, args.pool_replies, args.seed) for q in SHARES
        }
    print(f"pools built in {time.perf_counter() - started:.0f} s")
    entropy = {q: conditional_entropy(pool) for q, pool in pools.items()}
    print("pool H(Z|X) per token: " + ", ".join(f"q={q:g}: {h:.3f}" for q, h in entropy.items()))
    final_share = {"abrupt": 1.0, "gradual": 1.0, "partial": 0.5}
    truth = {
        kind: "template_collapse" if entropy[q] >= entropy[0.0] else "low_entropy_collapse"
        for kind, q in final_share.items()
    }
    print(
        "the alarm each collapse history should raise: "
        + ", ".join(f"{kind}: {name}" for kind, name in truth.items())
    )

    expected: dict[str, dict[float, float]] = {}  # per proxy a variant watches

    rng = np.random.default_rng(args.seed)
    interval_rng = np.random.default_rng([args.seed, 1]) if args.paired_draws else None
    kinds = ("grounded", "mixed", "template", "abrupt", "gradual", "partial")
    streams = {
        kind: [
            run_history(
                pools, schedule(kind, args.points, args.onset), rng, uncertainty, interval_rng
            )
            for _ in range(args.histories or (100 if kind in final_share else 200))
        ]
        for kind in kinds
    }
    print(f"histories drawn in {time.perf_counter() - started:.0f} s")

    against = None if args.against is None else json.loads(args.against.read_text())
    for name, overrides in variants:
        config = AlarmsConfig.model_validate(
            {"template_collapse": overrides, "low_entropy_collapse": overrides}
        )
        c = config.template_collapse
        key = c.mi_metric
        proxy = key.removeprefix(f"{PREFIX}/")
        if proxy not in expected:
            expected[proxy] = expected_proxies(
                pools, proxy, args.truth_draws, np.random.default_rng([args.seed, 2])
            )
            print(
                f"pool expected {proxy} ({args.truth_draws} points each): "
                + ", ".join(f"q={q:g}: {v:.3f}" for q, v in expected[proxy].items())
            )
        clock = {
            kind: detectable_point(
                schedule(kind, args.points, args.onset),
                args.onset,
                expected[proxy],
                c.min_drop_fraction,
                args.clock_margin,
            )
            for kind in final_share
        }
        print(f"\nvariant {name}: {c.model_dump(exclude={'mode', 'actions'})}")
        print(f"detectable point (1-based; onset at {args.onset + 1}): {clock}")
        print(
            f"{'history':9} {'n':>4} {'clean pts':>9} {'false':>5} {'per 1k':>7} {'detected':>16} "
            f"{'delay (points after separation)':>32} {'<=2 points':>16} {'low-H':>5} "
            f"{'MI first':>8} {'MI last':>8} {'from onset':>18} "
            f"{f'<={args.within_onset} from onset':>18} "
            f"{f'<={args.within_detectable} from detectable':>22}"
        )
        false_total = points_total = false_low = 0
        paired: dict[str, str] = {}
        for kind in kinds:
            collapse = kind in final_share
            false_alarms = low_entropy = null_points = detected = 0
            delays, from_onset, history_delays = [], [], []
            for stream in streams[kind]:
                events = alarm_events(stream, config)
                clean_until = args.onset if collapse else args.points
                null_points += clean_until
                false_alarms += sum(
                    e.iteration <= clean_until for e in events if e.name == "template_collapse"
                )
                false_low += sum(
                    e.iteration <= clean_until for e in events if e.name == "low_entropy_collapse"
                )
                low_entropy += sum(e.name == "low_entropy_collapse" for e in events)
                if collapse:
                    fired = [
                        e.iteration
                        for e in events
                        if e.name == truth[kind] and e.iteration > args.onset
                    ]
                    detected += bool(fired)
                    from_onset += fired[:1]
                    history_delays.append(fired[0] - args.onset if fired else None)
                    separated = first_separation(stream, args.onset, c.alpha / c.window, key)
                    if fired and separated is not None:
                        delays.append(fired[0] - separated)
            false_total, points_total = false_total + false_alarms, points_total + null_points
            n = len(streams[kind])
            delay = f"median {np.median(delays):.0f}, max {max(delays)}" if delays else "-"
            within2 = (
                share_interval(int(np.sum(np.array(delays) <= 2)), len(delays)) if delays else "-"
            )
            mi_first = np.mean([s[0][key] for s in streams[kind]])
            mi_last = np.mean([s[-1][key] for s in streams[kind]])
            # Separation depends on the interval method; the onset does not: the delay a
            # user waits, comparable across --interval choices.
            onset_delay = (
                f"median {np.median(from_onset) - args.onset:.0f}, "
                f"max {max(from_onset) - args.onset}"
                if from_onset
                else ""
            )
            within_onset = (
                share_interval(sum(caught(history_delays, args.within_onset)), n)
                if collapse
                else ""
            )
            within_detectable = ""
            if collapse:
                per_history.setdefault(name, {})[kind] = history_delays
                shift = None if clock[kind] is None else clock[kind] - args.onset
                mine = caught(shifted(history_delays, shift), args.within_detectable)
                within_detectable = share_interval(sum(mine), n)
                if against is not None:
                    theirs = shifted(against[name][kind], shift)
                    paired[kind] = paired_within(mine, caught(theirs, args.within_detectable))
            print(
                f"{kind:9} {n:>4} {null_points:>9} {false_alarms:>5} "
                f"{1000 * false_alarms / null_points:>7.2f} "
                f"{share_interval(detected, n) if collapse else '':>16} {delay:>32} {within2:>16} "
                f"{low_entropy:>5} {mi_first:>8.3f} {mi_last:>8.3f} {onset_delay:>18} "
                f"{within_onset:>18} {within_detectable:>22}"
            )
        for kind, line in paired.items():
            print(
                f"{kind}, within {args.within_detectable} of detectable, against {args.against}: {line}"
            )
        low, high = rate_interval(false_total, points_total)
        print(
            f"all clean points: {false_total} false template_collapse in {points_total} points = "
            f"{1000 * false_total / points_total:.2f} per 1,000 [{low:.2f}, {high:.2f}]; "
            f"false low_entropy_collapse: {false_low}"
        )
    if args.delays_out is not None:
        args.delays_out.write_text(json.dumps(per_history, indent=1))
        print(f"delays from the onset -> {args.delays_out}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
