"""The reproduction suite (experiments/paper/, docs/reproduction.md): the specs parse and
their trial grids are the ones the protocol states, and the verdict tests compute what
they say on runs with known histories."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from tether.analysis import paper, stats
from tether.analysis.runs import RunData
from tether.platform.sweep import decode, param_space, trial_bundles
from tether.platform.sweep_spec import load_sweep_spec

PAPER = Path(__file__).resolve().parents[1] / "experiments" / "paper"
MI, H = "collapse/first_turn/mi_estimate", "collapse/first_turn/conditional_entropy_est"


def trials(name: str) -> list[dict]:
    spec = load_sweep_spec(PAPER / f"{name}.yaml")
    space = param_space(spec)
    grids = {k: v["grid_search"] for k, v in space.items()}
    return spec, [
        decode(spec, dict(zip(grids, combo))) for combo in itertools.product(*grids.values())
    ]


def _filters(values: list[dict]) -> list[str]:
    return sorted(
        {
            f"{v['filter']['strategy']}"
            + (f":{v['filter']['value']}" if "value" in v["filter"] else "")
            for v in values
        }
    )


def test_protocol_grids():
    """docs/reproduction.md, 'Protocol': the arms, seeds and levels of each finding."""
    spec, a = trials("a_collapse")
    assert len(a) == 6 and {t["experiment.seed"] for t in a} == {0, 1, 2}
    assert _filters(a) == ["none", "top_p:0.9"]
    spec_c, c = trials("c_stochasticity")
    assert len(c) == 30 and {t["experiment.seed"] for t in c} == {0, 1, 2}
    assert sorted({t["env.stochasticity"] for t in c}) == [0.0, 0.1, 0.2, 0.5, 1.0]
    assert _filters(c) == ["none", "top_p:0.9"]
    spec_d, d = trials("d_filters")
    assert len(d) == 9 and {t["experiment.seed"] for t in d} == {0, 1, 2}
    assert _filters(d) == ["none", "top_k:0.5", "top_p:0.9"]
    pilot, p = trials("pilot_a")
    assert {t["algo.entropy_coef"] for t in p} == {0.001, 0.03}
    assert pilot.base.experiment.seed == 100 and pilot.base.experiment.name != "tether-paper"
    for s in (spec, spec_c, spec_d):
        cfg = s.base
        # One shared warm start (seeded apart from the RL seed), the suite's common base.
        assert cfg.model.warm_start.seed == 0 and cfg.experiment.name == "tether-paper"
        assert (cfg.rollout.groups, cfg.rollout.group_size) == (8, 4)
        assert cfg.diagnostics.every == 5 and cfg.diagnostics.samplings == ["first_turn"]
        assert cfg.trainer.val_every == cfg.trainer.iterations
        assert (cfg.algo.lr, cfg.algo.entropy_coef, cfg.algo.kl_coef) == (
            spec.base.algo.lr,
            spec.base.algo.entropy_coef,
            spec.base.algo.kl_coef,
        )
        assert Path(cfg.experiment.output_dir).is_absolute()
        cpus = sum(b.get("CPU", 0) for b in trial_bundles(cfg, s.sweep.resources))
        assert cpus == pytest.approx(1.0)
    assert spec.base.trainer.iterations == 30 and spec_d.base.trainer.iterations == 30
    assert spec_c.base.trainer.iterations == 20
    # Each trial is built from the spec: the warm start does not depend on the RL seed.
    from tether.policy.load import recipe, recipe_key

    keys = set()
    for t in a:
        cfg = spec.build(t)
        keys.add(
            recipe_key(
                recipe(cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens)
            )
        )
    assert len(keys) == 1


def _run(name: str, seed: int, strategy: str, metrics: dict, **params) -> RunData:
    return RunData(
        run_id=name,
        name=name,
        params={
            "experiment.seed": str(seed),
            "filter.strategy": strategy,
            **{k: str(v) for k, v in params.items()},
        },
        metrics=metrics,
    )


def test_spearman_by_run_bootstrap_matches_scipy_and_resamples_whole_runs():
    rng = np.random.default_rng(3)
    runs = []
    for k in range(5):
        steps = [1, 5, 10, 15]
        succ = {s: float(rng.uniform()) for s in steps}
        runs.append(
            _run(
                f"r{k}",
                k,
                "none",
                {
                    "rollout/success": succ,
                    MI: {s: succ[s] + float(rng.normal(0, 0.1)) for s in steps},
                    H: {s: float(rng.uniform()) for s in steps[:3]},  # one step fewer
                    "collapse/first_turn/mi_zscore": {s: 1.0 for s in steps},
                },
            )
        )  # constant
    res = stats.spearman_by_run_bootstrap(
        runs,
        "first_turn",
        ["mi_estimate", "conditional_entropy_est", "mi_zscore", "retrieval_acc"],
        resamples=300,
    )
    rows = {r["diagnostic"]: r for r in res.rows}
    # Paired on the points where MI, H and success all exist: 3 steps x 5 runs.
    x = [r.metrics[MI][s] for r in runs for s in (1, 5, 10)]
    h = [r.metrics[H][s] for r in runs for s in (1, 5, 10)]
    y = [r.metrics["rollout/success"][s] for r in runs for s in (1, 5, 10)]
    assert rows["mi_estimate"]["n"] == 15 and rows["mi_estimate"]["runs"] == 5
    rho, rho_h = scipy_stats.spearmanr(x, y).statistic, scipy_stats.spearmanr(h, y).statistic
    assert rows["mi_estimate"]["rho"] == pytest.approx(rho, abs=1e-12)
    assert rows["mi_estimate"]["diff"] == pytest.approx(rho - rho_h, abs=1e-12)
    assert rows["mi_estimate"]["ci_low"] < rho < rows["mi_estimate"]["ci_high"] <= 1
    assert rows["mi_estimate"]["diff_ci_low"] > 0  # MI tracks success, H is noise
    assert "diff" not in rows["conditional_entropy_est"]
    assert math.isnan(rows["mi_zscore"]["rho"]) and math.isnan(rows["mi_zscore"]["ci_low"])
    assert "retrieval_acc" not in rows and any("retrieval_acc" in n for n in res.notes)
    # Resampling whole runs: one run alone cannot give an interval.
    assert not stats.spearman_by_run_bootstrap(runs[:1], "first_turn", ["mi_estimate"]).rows


def _diag(mi: list[tuple], h: list[tuple], p_first: float, steps=(1, 30)) -> dict:
    out = {}
    for key, values in ((MI, mi), (H, h)):
        out[key] = {s: v[0] for s, v in zip(steps, values)}
        out[f"{key}_ci_low"] = {s: v[1] for s, v in zip(steps, values)}
        out[f"{key}_ci_high"] = {s: v[2] for s, v in zip(steps, values)}
    out["collapse/first_turn/p_grounded"] = {steps[0]: p_first, steps[1]: 0.5}
    return out


def test_collapse_rows_apply_the_stated_test():
    runs = [
        # MI falls beyond both intervals, by > 25 %, H(Z|X) rises: template collapse.
        _run(
            "a",
            0,
            "none",
            _diag([(0.3, 0.2, 0.4), (0.1, 0.05, 0.15)], [(1.0, 0.9, 1.1), (1.3, 1.2, 1.4)], 0.001),
        ),
        # Same fall, but H(Z|X) falls beyond its interval too: not template collapse.
        _run(
            "b",
            0,
            "top_p",
            _diag([(0.3, 0.2, 0.4), (0.1, 0.05, 0.15)], [(1.0, 0.9, 1.1), (0.5, 0.4, 0.6)], 0.001),
        ),
        # Intervals overlap: no significant fall.
        _run(
            "c",
            1,
            "none",
            _diag([(0.3, 0.2, 0.4), (0.2, 0.1, 0.3)], [(1.0, 0.9, 1.1), (1.0, 0.9, 1.1)], 0.001),
        ),
        # Never significantly grounded: nothing to collapse from.
        _run(
            "d",
            1,
            "top_p",
            _diag([(0.3, 0.2, 0.4), (0.1, 0.05, 0.15)], [(1.0, 0.9, 1.1), (1.0, 0.9, 1.1)], 0.2),
        ),
    ]
    rows = {r["run"]: r for r in paper.collapse_rows(runs)}
    assert [rows[k]["collapsed"] for k in "abcd"] == [True, False, False, False]
    assert rows["b"]["h_fell"] and not rows["c"]["mi_fell"] and not rows["d"]["first_grounded"]
    verdict = paper.collapse_verdict(list(rows.values()))
    assert verdict["counts"] == {
        "none": {"collapsed": 1, "seeds": 2},
        "top_p": {"collapsed": 0, "seeds": 2},
    }
    d = verdict["mi_change_top_p_minus_none"]
    assert d["differences"] == pytest.approx([0.0, -0.1]) and d["n"] == 2
    half = scipy_stats.t.ppf(0.975, 1) * np.std([0.0, -0.1], ddof=1) / math.sqrt(2)
    assert (d["ci_low"], d["ci_high"]) == pytest.approx((-0.05 - half, -0.05 + half))


def test_paired_gain_and_quartile_trend():
    runs = []
    for seed, level in itertools.product((0, 1, 2), (0.0, 0.2)):
        for strategy, bonus in (("top_p", 0.1 * (level > 0)), ("none", 0.0)):
            runs.append(
                _run(
                    f"{strategy}{seed}{level}",
                    seed,
                    strategy,
                    {"val/success": {0: 0.1, 20: 0.2 + bonus + 0.01 * seed}},
                    **{"env.stochasticity": level},
                )
            )
    gains = paper.paired_gain(runs, "top_p", "none", by=("env.stochasticity",))
    assert gains["env.stochasticity=0"]["mean"] == pytest.approx(0.0)
    assert gains["env.stochasticity=0.2"]["differences"] == pytest.approx([0.1] * 3)
    assert gains["env.stochasticity=0.2"]["seeds"] == ["0", "1", "2"]
    # RV quartiles: MI rises with reward std, success does not.
    rng = np.random.default_rng(0)
    rv = rng.uniform(0, 0.5, 40)
    runs = [
        _run(
            f"q{k}",
            k,
            "none",
            {
                "rollout/in_group_reward_std": {s: float(rv[4 * k + s]) for s in range(4)},
                "rollout/success": {s: 0.3 for s in range(4)},
                MI: {s: float(rv[4 * k + s]) for s in range(4)},
            },
        )
        for k in range(10)
    ]
    trend = paper.quartile_trend(runs, MI)
    assert trend["mi"]["monotone_increasing"] and not trend["success"]["monotone_increasing"]
    assert trend["mi"]["n"] == [10, 10, 10, 10] and trend["mi"]["q4_minus_q1"]["ci_low"] > 0


def test_warm_start_seed_replaces_the_run_seed_in_the_cache_key():
    """``model.warm_start.seed`` set to S gives the cache entry a run of experiment.seed S
    builds (caches built before the field existed stay valid); unset, the run seed counts."""
    from tether.platform.config import load_config
    from tether.policy.load import recipe, recipe_key

    def key(*overrides):
        cfg = load_config(PAPER.parent / "quickstart.yaml", list(overrides))
        return recipe_key(
            recipe(cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens)
        )

    assert key("experiment.seed=0") == key("model.warm_start.seed=0", "experiment.seed=5")
    assert key("experiment.seed=0") != key("experiment.seed=5")
    assert key("model.warm_start.seed=3") == key("experiment.seed=3")


def test_pooled_runs_report_settings_that_differ_beyond_the_compared_ones():
    def run(name, **params):
        return RunData(run_id=name, name=name, params=params)

    same = [
        run("a0", **{"filter.strategy": "none", "experiment.seed": "0", "algo.lr": "0.001"}),
        run("d0", **{"filter.strategy": "top_k", "experiment.seed": "1", "algo.lr": "0.001"}),
        # a setting added to Tether later is absent from older runs, not different
        run(
            "d1", **{"filter.strategy": "top_k", "algo.lr": "0.001", "ray.autoscaler_wait_s": "120"}
        ),
    ]
    assert paper.differing_settings(same) == {}
    other = [*same, run("x", **{"filter.strategy": "none", "algo.lr": "0.01"})]
    assert paper.differing_settings(other) == {"algo.lr": ["0.001", "0.01"]}
