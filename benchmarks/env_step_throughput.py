"""Env step throughput (steps/s) of WebShop, MetaMathQA, SearchQA and DeepCoder, beside baselines.

Every row times ``env.step`` only (reset and the choice of answer are outside the
timer), over episodes whose answers come from the env's own demonstrator with
noise 0.3 -- the mix a warm-started policy produces -- or from a fixed answer kind:

- ``webshop``, ``metamathqa``, ``searchqa``: demonstrator actions on the default
  generated catalogue / problems / knowledge base (SearchQA: BM25 over the corpus on
  every ``search[...]``); baseline ``frozenlake`` (4x4) with its demonstrator, in the
  same run;
- ``deepcoder``: the reference solution (every test runs in the sandbox), with
  tests judged in parallel over all cores and, as the baseline, one at a time
  (``max_workers=1``); and an answer that does not compile (format penalty, no
  process), which is what most of an untrained policy's answers cost.

With ``--isolation`` it measures the sandbox's OS isolation instead (issue 16): the
wall time of one sandboxed program (a one-line function, judged as a test is) under
``sandbox.isolation: none`` and ``bwrap``, interleaved run by run, medians; the bare
cost of bubblewrap (``bwrap ... true`` against ``true``); and DeepCoder's steps/s on
reference solutions with each setting, in alternating chunks.

    python benchmarks/env_step_throughput.py            # ~1 min on 2 cores
    python benchmarks/env_step_throughput.py --quick    # fewer steps
    python benchmarks/env_step_throughput.py --isolation
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

import numpy as np

from tether.envs import make
from tether.envs.sandbox import SandboxLimits, run_python
from tether.envs.sandbox.isolation import bwrap_command, close_fds


def demonstrator_rate(env_id: str, steps: int, noise: float = 0.3, **kwargs) -> float:
    """Steps/s of ``env.step`` on demonstrator answers."""
    env = make(env_id, **kwargs)
    rng = np.random.default_rng(0)
    seed, done, elapsed = 0, 0, 0.0
    while done < steps:
        env.reset(seed=seed)
        seed += 1
        for _ in range(env.max_turns):
            _, answer = env.demonstration(rng, noise)
            started = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(answer)
            elapsed += time.perf_counter() - started
            done += 1
            if terminated or truncated or done >= steps:
                break
    return done / elapsed


def fixed_answer_rate(steps: int, kind: str, **kwargs) -> float:
    """Steps/s of DeepCoder on the reference solution or on non-compiling text."""
    env = make("deepcoder", **kwargs)
    elapsed = 0.0
    for seed in range(steps):
        env.reset(seed=seed)
        answer = env.solve() if kind == "reference" else "def broken(:"
        started = time.perf_counter()
        env.step(answer)
        elapsed += time.perf_counter() - started
    return steps / elapsed


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _bare_bwrap() -> None:
    command, fds = bwrap_command([])
    command[command.index("--") + 1 :] = ["/usr/bin/true"]
    try:
        subprocess.run(command, pass_fds=fds, check=True)
    finally:
        close_fds(fds)


def isolation_rows(runs: int, steps: int) -> None:
    """Per-program wall time and DeepCoder steps/s, isolation none vs bwrap."""
    settings = {
        "none (default: as root, nobody's interpreter if any)": SandboxLimits(isolation="none"),
        "none (this interpreter, no privilege drop)": SandboxLimits(
            isolation="none", drop_privileges=False
        ),
        "bwrap": SandboxLimits(isolation="bwrap"),
    }
    samples: dict[str, list[float]] = {name: [] for name in settings}
    samples["true (no sandbox)"], samples["bwrap ... true"] = [], []
    program = "def f(x):\n    return x"
    for limits in settings.values():  # warm the probe and the page cache
        run_python(program, fn_name="f", args=[1], limits=limits)
    for _ in range(runs):
        for name, limits in settings.items():
            samples[name].append(
                _timed(
                    lambda limits=limits: run_python(program, fn_name="f", args=[1], limits=limits)
                )
            )
        samples["true (no sandbox)"].append(_timed(lambda: subprocess.run(["/usr/bin/true"])))
        samples["bwrap ... true"].append(_timed(_bare_bwrap))
    base = statistics.median(samples["none (this interpreter, no privilege drop)"])
    print(
        f"\none sandboxed program, {runs} runs each, interleaved (median ms, p90 ms, / none same interpreter):"
    )
    print(f"| {'setting':55s} | median ms | p90 ms | ratio |")
    print(f"|{'-' * 57}|-----------|--------|-------|")
    for name, values in samples.items():
        median, p90 = statistics.median(values), statistics.quantiles(values, n=10)[-1]
        print(f"| {name:55s} | {median * 1e3:9.1f} | {p90 * 1e3:6.1f} | {median / base:5.2f} |")
    rates: dict[str, list[float]] = {"none": [], "bwrap": []}
    for _ in range(4):  # alternating chunks: both settings see the same load drift
        for isolation in ("none", "bwrap"):
            rates[isolation].append(fixed_answer_rate(steps // 4, "reference", isolation=isolation))
    none, bwrap = (sum(rates[k]) / len(rates[k]) for k in ("none", "bwrap"))
    print(
        f"\ndeepcoder, reference solution, {os.cpu_count()} workers, {steps} steps per setting "
        f"in 4 alternating chunks: none {none:.1f} steps/s, bwrap {bwrap:.1f} steps/s, "
        f"ratio {bwrap / none:.2f} (chunks: none {[round(r, 1) for r in rates['none']]}, "
        f"bwrap {[round(r, 1) for r in rates['bwrap']]})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument(
        "--isolation", action="store_true", help="only the sandbox's isolation: none vs bwrap"
    )
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    cores = os.cpu_count() or 1
    print(
        f"python {platform.python_version()}, {cores} cores, {platform.machine()}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if args.isolation:
        isolation_rows(int(200 * scale), int(120 * scale))
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
    rows = []
    webshop = demonstrator_rate("webshop", int(4000 * scale))
    frozenlake = demonstrator_rate("frozenlake", int(4000 * scale))
    rows.append(("webshop, demonstrator (noise 0.3)", webshop, "frozenlake 4x4", frozenlake))
    for env_id in ("metamathqa", "searchqa"):
        rows.append(
            (
                f"{env_id}, demonstrator (noise 0.3)",
                demonstrator_rate(env_id, int(4000 * scale)),
                "frozenlake 4x4",
                frozenlake,
            )
        )
    parallel = fixed_answer_rate(int(120 * scale), "reference")
    serial = fixed_answer_rate(int(120 * scale), "reference", max_workers=1)
    rows.append((f"deepcoder, reference solution, {cores} workers", parallel, "1 worker", serial))
    noisy = demonstrator_rate("deepcoder", int(120 * scale))
    rows.append(("deepcoder, demonstrator (noise 0.3)", noisy, "-", float("nan")))
    broken = fixed_answer_rate(int(2000 * scale), "broken")
    rows.append(("deepcoder, non-compiling answer", broken, "-", float("nan")))
    print(f"| {'scenario':44s} | steps/s | {'baseline':16s} | steps/s | ratio |")
    print(f"|{'-' * 46}|---------|{'-' * 18}|---------|-------|")
    for name, rate, base_name, base in rows:
        ratio = f"{rate / base:5.2f}" if base == base else "    -"
        base_text = f"{base:7.1f}" if base == base else "      -"
        print(f"| {name:44s} | {rate:7.1f} | {base_name:16s} | {base_text} | {ratio} |")


if __name__ == "__main__":
    main()
