"""The MI proxies are declared once (tether/diagnostics/proxies.py): a new declaration
reaches the key lists, the point estimates, the intervals and nulls, the report's collapse
curves and the live monitor's curves without any of them being edited."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tether.diagnostics.proxies import (
    BY_NAME,
    CI_KEYS,
    LOG_CEILING,
    LOG_FLOOR,
    NULL_KEYS,
    ONE_PROMPT_KEYS,
    PERMUTATION,
    PROXIES,
    QUOTIENT,
    Proxy,
    p_value_key,
)

ROOT = Path(__file__).resolve().parents[1]

#: Two proxies a developer might add, put first in the tuple so that every other
#: declaration moves: one defined with one prompt, on the log scale of a value >= 0, drawn
#: by the report and the monitor; one that needs two prompts, with a permutation null and a
#: p-value of its own, and the bootstrap's interval.
NEW_DECLARATIONS = """\
    Proxy(
        "matched_spread",
        "std of the matched scores",
        lambda r: r.std("matched"),
        multi_prompt=False,
        interval=LOG_FLOOR,
        report=True,
        monitor="matched_spread",
    ),
    Proxy(
        "mi_token_seq_mean",
        "mean of the token and sequence MI",
        lambda r: (r.value("mi_estimate") + r.value("mi_seq_estimate")) / 2,
        interval=BOOTSTRAP,
        null=PERMUTATION,
        p_value="mi_token_seq_mean_p_grounded",
    ),
"""

#: Run in a fresh interpreter: proxies.py's source with NEW_DECLARATIONS inserted into
#: PROXIES (nothing else changed), loaded as tether.diagnostics.proxies before anything
#: that reads it; then what each reader derives.
PROBE = """
import importlib.util, json, sys, types
import numpy as np

spec = importlib.util.find_spec("tether.diagnostics.proxies")
source = open(spec.origin).read()
marker = "PROXIES: tuple[Proxy, ...] = (\\n"
assert source.count(marker) == 1
module = types.ModuleType(spec.name)
module.__file__ = spec.origin
sys.modules[spec.name] = module
exec(compile(source.replace(marker, marker + sys.argv[1]), spec.origin, "exec"), module.__dict__)

from tether.analysis import runs, source as store, views
from tether.analysis.runs import RunData
from tether.dashboards import monitor_data
from tether.diagnostics import mi, uncertainty
from tests.test_proxy_values_pinned import PINNED, pinned_case, tied_batch

L, S, column = tied_batch()
settings = uncertainty.Uncertainty(bootstrap=200, permutations=200)
batch, _ = mi.mi_proxies(L, S, column, None, settings, np.random.default_rng(1))
single, _ = mi.mi_proxies(L[:, :1], S[:, :1], np.zeros(len(L), dtype=np.int64), None, settings)
key = "collapse/first_turn/matched_spread"
run = RunData("r1", "run one", metrics={key: {1: 0.5, 2: 0.4}, key + "_ci_low": {1: 0.3, 2: 0.2}})
notes = []
figure = views.collapse_figure([run], "first_turn", notes)
payload = monitor_data.monitor_payload([run])
pinned = pinned_case("log_jackknife")
print(json.dumps({
    "ci_keys": module.CI_KEYS,
    "null_keys": module.NULL_KEYS,
    "one_prompt_keys": module.ONE_PROMPT_KEYS,
    "multi_column_keys": mi.MULTI_COLUMN_KEYS,
    "diagnostics": runs.DIAGNOSTICS,
    "store_reads": [bool(store.WANTED.match(key + e)) for e in ("", "_ci_low", "_ci_high")],
    "monitor_reads": [bool(monitor_data.WANTED.match(key + e)) for e in ("", "_ci_high")],
    "monitor_curve": payload["runs"][0]["curves"].get("matched_spread"),
    "report_panels": [p.title for p in figure.panels] if figure else [],
    "batch": {k: v for k, v in batch.items() if "matched_spread" in k or "token_seq" in k},
    "single": sorted(k for k in single if "matched_spread" in k or "token_seq" in k),
    "pinned_off": [k for k, v in PINNED["log_jackknife"].items() if abs(pinned[k] - v) > 1e-12],
    "spread": float(np.std(L[np.arange(len(L)), column])),
}))
"""


@pytest.fixture(scope="module")
def derived():
    result = subprocess.run(
        [sys.executable, "-c", PROBE, NEW_DECLARATIONS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_new_declaration_reaches_the_key_lists(derived):
    assert "matched_spread" in derived["ci_keys"] and "mi_token_seq_mean" in derived["ci_keys"]
    assert "matched_spread" in derived["diagnostics"]  # the report's Spearman table
    assert (
        "mi_token_seq_mean" in derived["null_keys"] and "matched_spread" not in derived["null_keys"]
    )
    assert "matched_spread" in derived["one_prompt_keys"]
    assert "mi_token_seq_mean" in derived["multi_column_keys"]
    assert "matched_spread" not in derived["multi_column_keys"]
    # inserted first, the entropies are still the entropies and nothing else
    assert derived["one_prompt_keys"][1:] == list(ONE_PROMPT_KEYS)


def test_a_new_declaration_is_computed_with_its_interval_null_and_p_value(derived):
    batch = derived["batch"]
    assert batch["matched_spread"] == pytest.approx(derived["spread"], rel=1e-12)
    assert (
        batch["matched_spread_ci_low"] <= batch["matched_spread"] <= batch["matched_spread_ci_high"]
    )
    assert batch["matched_spread_ci_low"] > 0  # on the log scale of a value >= 0
    for key in ("mi_token_seq_mean", "_ci_low", "_ci_high", "_null_q95", "_p_grounded"):
        assert (key if key.startswith("mi") else f"mi_token_seq_mean{key}") in batch
    assert 0 < batch["mi_token_seq_mean_p_grounded"] <= 1
    # one prompt: the one-prompt proxy and its interval, nothing of the other
    assert derived["single"] == [
        "matched_spread",
        "matched_spread_ci_high",
        "matched_spread_ci_low",
    ]
    # and every proxy declared before keeps its pinned value, interval and p-value
    assert derived["pinned_off"] == []


def test_a_new_declaration_reaches_the_report_and_the_monitor(derived):
    assert derived["store_reads"] == [True, True, True]  # what the report reads
    assert derived["monitor_reads"] == [True, True]
    assert derived["report_panels"] == ["std of the matched scores"]
    curve = derived["monitor_curve"]
    assert curve["x"] == [1, 2] and curve["y"] == [0.5, 0.4] and curve["ci_low"] == [0.3, 0.2]


def test_the_declarations_as_shipped():
    assert CI_KEYS[:6] == (
        "mi_zscore",
        "mi_zscore_ema",
        "mi_estimate",
        "mi_seq_estimate",
        "mi_seq_zscore",
        "retrieval_acc",
    )
    assert ONE_PROMPT_KEYS == tuple(k for k in CI_KEYS if "entropy" in k)
    assert {k for k in CI_KEYS if BY_NAME[k].interval == LOG_FLOOR} == set(ONE_PROMPT_KEYS)
    assert {k for k in CI_KEYS if BY_NAME[k].interval == LOG_CEILING} == {
        "mi_estimate",
        "mi_seq_estimate",
    }
    assert NULL_KEYS == (
        "mi_zscore",
        "mi_zscore_ema",
        "mi_estimate",
        "mi_seq_estimate",
        "retrieval_acc",
    )
    # the z-scores' test is their numerator's: a permutation moves only the matched scores
    assert [p_value_key(k) for k in ("mi_zscore", "mi_zscore_ema", "mi_estimate")] == [
        "p_grounded"
    ] * 3
    assert p_value_key("mi_seq_zscore") is None and p_value_key("marginal_std") is None
    assert all(BY_NAME[p.numerator] for p in PROXIES if p.interval == QUOTIENT)


@pytest.mark.parametrize(
    "fields",
    [
        {"interval": LOG_CEILING},  # no ceiling to anchor its log scale at
        {"interval": LOG_FLOOR, "ceiling": np.log},
        {"interval": QUOTIENT},  # no numerator
        {"p_value": "x_p_grounded"},  # a p-value without a null
        {"interval": "log", "null": PERMUTATION},
        {"null": "bootstrap"},
        {"denominator": "marginal_std"},
    ],
)
def test_a_declaration_that_does_not_fit_is_refused(fields):
    with pytest.raises(ValueError, match="proxy x: "):
        Proxy("x", "x", lambda r: r.mean("hit"), **fields)
