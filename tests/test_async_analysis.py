"""The asynchronous-rollout benchmark's pure parts: the GPU projection's model
(benchmarks/async_projection.py) and the staleness-against-I(X;Z) table
(benchmarks/async_rollouts.py --learning), on hand-worked numbers."""

import importlib.util
import sys
from pathlib import Path

import pytest

from tether.analysis.runs import VAL_SUCCESS, RunData
from tether.analysis.verdicts import PROBE_MI

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_without_a_tail_the_best_split_gains_nothing():
    one_step_off = load("async_projection").one_step_off
    # C = U, 8 devices: 4 + 4 each take 2C; T1 = 2C + S = T0.
    speedup, n_r = one_step_off(10.0, 10.0, 1.0, devices=8, tau=0.0)
    assert (speedup, n_r) == (pytest.approx(1.0), 4)


def test_an_all_tail_generation_overlaps_the_whole_update():
    one_step_off = load("async_projection").one_step_off
    # tau = 1: generation takes C on any number of devices, so 1 generates and 7 train:
    # T1 = max(10, 10 * 8 / 7) + 1 = 12.43; T0 = 21.
    speedup, n_r = one_step_off(10.0, 10.0, 1.0, devices=8, tau=1.0)
    assert n_r == 1
    assert speedup == pytest.approx(21.0 / (10.0 * 8 / 7 + 1.0))


def test_a_tail_outside_zero_one_is_refused():
    with pytest.raises(ValueError):
        load("async_projection").one_step_off(1.0, 1.0, 0.0, devices=8, tau=1.5)


def _run(k: int, seed: int, success: float, mi: float) -> RunData:
    return RunData(
        run_id=f"run{k}{seed}",
        name=f"k{k}-s{seed}",
        params={"rollout.max_staleness": str(k), "experiment.seed": str(seed)},
        tags={},
        metrics={
            VAL_SUCCESS: {0: 0.4, 24: success},
            f"{VAL_SUCCESS}_ci_low": {24: success - 0.05},
            f"{VAL_SUCCESS}_ci_high": {24: success + 0.05},
            PROBE_MI: {1: 0.3, 24: mi},
        },
    )


def test_staleness_table_pairs_each_k_with_k0_by_seed():
    table = load("async_rollouts").learning_table
    runs = [
        *(_run(0, s, 0.6 + 0.1 * i, 0.40) for i, s in enumerate((1, 2, 3))),
        # k = 2: success exactly 0.1 lower on every seed, I(X;Z) 0.05 lower.
        *(_run(2, s, 0.5 + 0.1 * i, 0.35) for i, s in enumerate((1, 2, 3))),
    ]
    text = table(runs)
    k2 = next(line for line in text.splitlines() if line.startswith("| 2 |"))
    # identical differences: a zero-width interval around the shift
    assert "-0.100 [-0.100, -0.100]" in k2
    assert "-0.050 [-0.050, -0.050]" in k2
    assert "0.600 [" in k2  # the k = 2 arm's own mean success
    assert "| 0.700 [0.650, 0.750] |" in text  # a run's Wilson interval, as logged


def test_the_report_draws_the_async_curves_only_for_async_runs():
    from tether.analysis.views import ASYNC_CURVES, async_figure

    sync = _run(0, 1, 0.6, 0.4)
    assert async_figure([sync]) is None
    stale = _run(2, 1, 0.6, 0.4)
    for key, _ in ASYNC_CURVES:
        stale.metrics[key] = {1: 0.0, 2: 1.0, 3: 2.0}
    figure = async_figure([sync, stale])
    assert figure is not None and len(figure.panels) == len(ASYNC_CURVES)
    (series,) = figure.panels[0].series  # only the async run has the curve
    assert (list(series.x), list(series.y)) == ([1, 2, 3], [0.0, 1.0, 2.0])
