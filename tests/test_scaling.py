"""The scaling benchmark's model sizes and its power-law fit (benchmarks/scaling.py)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen2ForCausalLM

from tether.policy.tiny import tiny_config

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "scaling.py"


def load_scaling():
    spec = importlib.util.spec_from_file_location("scaling_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "size, parameters",
    [("small", 591_232), ("tiny", 4_330_752), ("medium", 29_640_704), ("large", 113_686_272)],
)
def test_model_sizes_have_the_stated_parameter_counts(size, parameters):
    with torch.device("meta"):  # shapes only: no memory, no init
        model = Qwen2ForCausalLM(tiny_config(size, vocab_size=512))
    assert sum(p.numel() for p in model.parameters()) == parameters


def test_power_law_fit_recovers_the_exponent_and_its_interval():
    fit_power_law = load_scaling().fit_power_law
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    exact = fit_power_law(x, 3.0 * x**1.5)
    assert exact.exponent == pytest.approx(1.5, abs=1e-12)
    assert exact.stderr == pytest.approx(0.0, abs=1e-12)
    assert exact.n == 5
    # log y = 0.5 log x + noise (+0.1, -0.1, +0.1, -0.1, +0.1): slope from least squares by hand
    noise = np.array([0.1, -0.1, 0.1, -0.1, 0.1])
    noisy = fit_power_law(x, x**0.5 * np.exp(noise))
    lx = np.log(x)
    slope = 0.5 + np.sum((lx - lx.mean()) * noise) / np.sum((lx - lx.mean()) ** 2)
    assert noisy.exponent == pytest.approx(slope, rel=1e-9)
    residuals = np.log(x**0.5 * np.exp(noise)) - (
        noisy.exponent * lx + (np.log(x**0.5 * np.exp(noise)) - noisy.exponent * lx).mean()
    )
    stderr = np.sqrt(np.sum(residuals**2) / 3 / np.sum((lx - lx.mean()) ** 2))
    assert noisy.stderr == pytest.approx(stderr, rel=1e-9)
    half = 3.182446305284263 * stderr  # t quantile 0.975 on 3 degrees of freedom
    assert (noisy.ci_low, noisy.ci_high) == pytest.approx((slope - half, slope + half), rel=1e-9)


def test_power_law_fit_on_two_points_has_no_interval():
    fit = load_scaling().fit_power_law([1.0, 10.0], [2.0, 200.0])
    assert fit.exponent == pytest.approx(2.0)
    assert fit.ci_low is None and fit.ci_high is None
