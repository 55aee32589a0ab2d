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
from tether.platform.sweep.runner import decode, param_space, trial_bundles
from tether.platform.sweep.spec import load_sweep_spec

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
    # The paper's loss rescaling after filtering (a protocol change, docs/reproduction.md):
    # every arm of a, c and d scales its advantages by the kept ratio.
    for s, ts in ((spec, a), (spec_c, c), (spec_d, d)):
        assert s.base.filter.loss_scaling == "linear"
        assert {s.build(t).filter.loss_scaling for t in ts} == {"linear"}
        assert {s.build(t).filter.metric for t in ts} == {"reward_std"}
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

    # RV quartiles over prompt groups (the paper's unit), known answer: 16 groups of two
    # rewards [0, k/10] (RV = (k/10)²/2, increasing in k), one success each (success 0.5
    # everywhere), pointwise MI 0.01·k.  Quartiles k 0-3, 4-7, 8-11, 12-15; MI means 0.015,
    # 0.055, 0.095, 0.135; Q4 - Q1 = 0.12, Welch se = √(2 · 0.01² · (5/3) / 4) = 0.009129,
    # 6 dof, half-width 2.4469 · 0.009129 = 0.02234.  Two runs of 8 groups each: the
    # quartiles pool the prompts of every run and iteration.
    def groups(ks):
        return [
            {"group_id": k, "rewards": [0.0, k / 10], "success": [0.0, 1.0], "mi": 0.01 * k}
            for k in ks
        ]

    runs = [_run("p0", 0, "none", {}), _run("p1", 1, "none", {})]
    runs[0].prompt_mi = {1: groups(range(0, 16, 2))}
    runs[1].prompt_mi = {5: groups(range(1, 16, 2))}
    trend = paper.quartile_trend(runs)
    assert trend["unit"] == "prompt groups" and trend["prompts"] == 16
    assert trend["mi"]["n"] == [4, 4, 4, 4]
    assert trend["mi"]["means"] == pytest.approx([0.015, 0.055, 0.095, 0.135])
    assert trend["mi"]["monotone_increasing"] and not trend["success"]["monotone_increasing"]
    diff = trend["mi"]["q4_minus_q1"]
    assert diff["mean"] == pytest.approx(0.12)
    half = scipy_stats.t.ppf(0.975, 6) * math.sqrt(2 * 0.01**2 * (5 / 3) / 4)
    assert (diff["ci_low"], diff["ci_high"]) == pytest.approx((0.12 - half, 0.12 + half))
    assert paper.verdict_d_quartiles(trend["mi"])["verdict"] == paper.REPRODUCED
    # The same prompts as (run, checkpoint) batch means would be 2 points: not quartiles.
    report_q = stats.rv_quartiles(runs)
    assert [r["n"] for r in report_q.rows] == [4, 4, 4, 4]
    assert [r["mi"] for r in report_q.rows] == pytest.approx([0.015, 0.055, 0.095, 0.135])
    assert report_q.extra["assignments"][("p1", 5, 15)] == 4
    # Ties: 10 of 16 prompts without reward spread share RV 0, all in Q1 (an edge value goes
    # to the lower quartile), so Q2 is empty and the trend has no verdict.
    tied = [
        {"group_id": k, "rewards": [1.0, 1.0], "success": [1.0, 1.0], "mi": 0.1} for k in range(10)
    ]
    runs[0].prompt_mi = {1: tied + groups(range(10, 16))}
    runs[1].prompt_mi = {}
    trend = paper.quartile_trend(runs)
    assert trend["mi"]["n"] == [10, 0, 2, 4]  # RV edges 0, 0, 0.634
    verdict = paper.verdict_d_quartiles(trend["mi"])
    assert verdict["verdict"] is None and "[2]" in verdict["because"]
    assert any("[2] empty" in n for n in stats.rv_quartiles(runs).notes)


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
    # each part writes to its own directory and store: not a difference of design
    for k, r in enumerate(same):
        r.params.update({"experiment.output_dir": f"/runs/{k}", "tracking.uri": f"sqlite:///{k}"})
    assert paper.differing_settings(same) == {}
    other = [*same, run("x", **{"filter.strategy": "none", "algo.lr": "0.01"})]
    assert paper.differing_settings(other) == {"algo.lr": ["0.001", "0.01"]}


def test_verdicts_follow_the_protocol_rules():
    """Each verdict rule of docs/reproduction.md on numbers with known answers, including
    the published rows' own numbers (2026-11-23/24, commits 74f7c56-1db5efb, all 'not at this scale')."""
    ci = lambda mean, lo, hi, n=3: {"n": n, "mean": mean, "ci_low": lo, "ci_high": hi}  # noqa: E731
    counts = lambda none, top_p: {  # noqa: E731
        "none": {"collapsed": none, "seeds": 3},
        "top_p": {"collapsed": top_p, "seeds": 3},
    }
    above, across = ci(0.2, 0.05, 0.35), ci(0.16, -0.40, 0.73)
    assert paper.verdict_a(counts(2, 1), above)["verdict"] == paper.REPRODUCED
    assert paper.verdict_a(counts(3, 1), across)["verdict"] == paper.PARTLY
    partly = paper.verdict_a(counts(3, 2), above)
    assert partly["verdict"] == paper.PARTLY and "more than a third" in partly["because"]
    assert paper.verdict_a(counts(1, 1), ci(-0.16, -1.05, 0.74))["verdict"] == (
        paper.NOT_AT_THIS_SCALE
    )
    assert paper.verdict_a({"none": {"collapsed": 2, "seeds": 2}}, above)["verdict"] is None

    row = lambda lo, diff_lo: {  # noqa: E731
        "diagnostic": "mi_zscore",
        "ci_low": lo,
        "diff_ci_low": diff_lo,
    }
    assert paper.verdict_b([row(0.01, 0.2)])["verdict"] == paper.REPRODUCED
    assert paper.verdict_b([row(-0.03, 0.26)])["verdict"] == paper.PARTLY
    assert paper.verdict_b([row(-0.09, -0.07)])["verdict"] == paper.NOT_AT_THIS_SCALE
    assert paper.verdict_b([row(math.nan, math.nan)])["verdict"] == paper.NOT_AT_THIS_SCALE
    assert paper.verdict_b([])["verdict"] is None

    assert paper.verdict_c(ci(0.1, 0.02, 0.2), ci(0.1, 0.01, 0.2))["verdict"] == paper.REPRODUCED
    assert paper.verdict_c(ci(0.1, 0.02, 0.2), ci(0.1, -0.1, 0.3))["verdict"] == paper.PARTLY
    assert paper.verdict_c(ci(-0.14, -0.47, 0.18), above)["verdict"] == paper.NOT_AT_THIS_SCALE
    assert paper.verdict_c(ci(0.1, 0.02, 0.2, n=2), above)["verdict"] is None

    assert paper.verdict_d_filters(above, ci(0.0, -0.1, 0.1))["verdict"] == paper.REPRODUCED
    assert paper.verdict_d_filters(across, ci(0.23, 0.08, 0.39))["verdict"] == paper.PARTLY
    assert paper.verdict_d_filters(ci(0.003, -0.49, 0.50), ci(-0.06, -0.49, 0.37))["verdict"] == (
        paper.NOT_AT_THIS_SCALE
    )

    trend = lambda means, lo: {  # noqa: E731
        "means": means,
        "monotone_increasing": bool(all(np.diff(means) > 0)),
        "q4_minus_q1": {"ci_low": lo},
    }
    assert paper.verdict_d_quartiles(trend([0.1, 0.2, 0.3, 0.4], 0.05))["verdict"] == (
        paper.REPRODUCED
    )
    for means, lo in (([0.1, 0.2, 0.3, 0.4], -0.01), ([0.30, 0.39, 0.40, 0.37], -0.07)):
        assert paper.verdict_d_quartiles(trend(means, lo))["verdict"] == paper.NOT_AT_THIS_SCALE
    assert paper.verdict_d_quartiles({})["verdict"] is None
    empty_q2 = {**trend([0.1, math.nan, 0.3, 0.4], 0.05), "n": [10, 0, 2, 4]}
    assert paper.verdict_d_quartiles(empty_q2)["verdict"] is None


def test_the_paper_command_prints_each_findings_verdict(tmp_path, capsys):
    """``python -m tether.analysis.paper`` on an MLflow store of finished runs: finding a's
    and d's numbers and verdicts from sweep-like runs, b's from the experiment."""
    import json

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("paper-test", artifact_location=str(tmp_path / "art"))
    rng = np.random.default_rng(0)
    for r, (seed, arm) in enumerate(itertools.product((0, 1, 2), ("none", "top_p", "top_k"))):
        run = client.create_run(exp, run_name=f"{arm}-{seed}", tags={"tether.env": "lake"})
        rid = run.info.run_id
        # Prompt-level diagnostics of iteration 1 (what platform/run/diagnosis.py logs): four
        # groups per run with rewards [0, k/10], k = 4r..4r+3, so RV rises with k over the
        # 36 prompts; pointwise MI 0.5 for every prompt.
        groups = [
            {"group_id": g, "rewards": [0.0, (4 * r + g) / 10], "success": [0.0, 1.0], "mi": 0.5}
            for g in range(4)
        ]
        client.log_dict(rid, {"iteration": 1, "groups": groups}, "prompt_mi/iter_0001.json")
        for key, value in (("filter.strategy", arm), ("experiment.seed", seed), ("algo.lr", 1)):
            client.log_param(rid, key, value)
        # No filter collapses (MI 0.5 -> 0.1, H(Z|X) rises); top-p and top-k keep MI.
        last_mi = 0.1 if arm == "none" else 0.5
        diag = _diag(
            [(0.5, 0.4, 0.6), (last_mi, last_mi - 0.05, last_mi + 0.05)],
            [(1.0, 0.9, 1.1), (1.5, 1.4, 1.6)],
            0.001,
        )
        success = {"none": 0.1, "top_k": 0.2, "top_p": 0.3 + 0.01 * seed}[arm]
        diag["val/success"] = {0: 0.2, 30: success}
        steps = (1, 10, 20, 30)
        diag["rollout/in_group_reward_std"] = {s: float(rng.uniform(0, 0.5)) for s in steps}
        # Training success falls from iteration 1 to 30 while H(Z|X) rises (1.0 -> 1.5),
        # and the MI z-score is the success itself: b is reproduced by construction.
        diag["rollout/success"] = {s: float(rng.uniform(0.5 - s / 75, 0.6 - s / 75)) for s in steps}
        diag["collapse/first_turn/mi_zscore"] = dict(diag["rollout/success"])
        for key, points in diag.items():
            for step, value in points.items():
                client.log_metric(rid, key, value, step=step)
        client.set_terminated(rid, "FINISHED")

    def verdicts(finding: str) -> dict:
        assert paper.main(["paper-test", "--tracking-uri", uri, "--finding", finding]) == 0
        return json.loads(capsys.readouterr().out)

    a = verdicts("a")
    assert a["runs"] == 9 and a["settings_that_differ"] == {}
    assert a["counts"]["none"] == {"collapsed": 3, "seeds": 3}
    assert a["counts"]["top_p"] == {"collapsed": 0, "seeds": 3}
    assert a["verdict"] == paper.REPRODUCED, a["because"]
    d = verdicts("d")
    assert d["top_p_minus_none"]["all"]["mean"] == pytest.approx(0.21)
    assert d["verdict_filters"]["verdict"] == paper.REPRODUCED
    # Quartiles of the 36 prompts (not of the runs' batch means): 9 each, MI 0.5 in every
    # one, so MI does not rise from Q1 to Q4.
    mi_q = d["rv_quartiles"]["mi"]
    assert d["rv_quartiles"]["prompts"] == 36 and mi_q["n"] == [9, 9, 9, 9]
    assert mi_q["means"] == pytest.approx([0.5] * 4)
    assert not mi_q["monotone_increasing"] and mi_q["q4_minus_q1"]["mean"] == pytest.approx(0.0)
    assert d["verdict_quartiles"]["verdict"] == paper.NOT_AT_THIS_SCALE, d["verdict_quartiles"]
    b = verdicts("b")
    assert {r["diagnostic"] for r in b["spearman_by_run"]} >= {"mi_zscore", "mi_estimate"}
    mi_z = next(r for r in b["spearman_by_run"] if r["diagnostic"] == "mi_zscore")
    assert mi_z["rho"] == pytest.approx(1.0) and mi_z["runs"] == 9
    assert b["verdict"] == paper.REPRODUCED, b["because"]
    # A target that is not in the store: one line on stderr, exit 2.
    assert paper.main(["no-such", "--tracking-uri", uri, "--finding", "a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paper: 'no-such' is not a run id") and err.count("\n") == 1


VERDICTS = PAPER.parent / "verdicts"
SEEDS_2026_11_27 = set(range(1000, 1016))


def _verdict_trials(name: str):
    spec = load_sweep_spec(VERDICTS / f"{name}.yaml")
    grids = {k: v["grid_search"] for k, v in param_space(spec).items()}
    return spec, [
        decode(spec, dict(zip(grids, combo))) for combo in itertools.product(*grids.values())
    ]


def test_the_verdict_specs_are_the_protocol_of_2026_11_27():
    """docs/reproduction.md, "The protocol of 2026-11-27": the arms, seeds and levels, and
    the recipe is the quickstart's but for the paper's filter definitions."""
    from tether.platform.config import load_config

    quickstart = load_config(PAPER.parents[0] / "quickstart.yaml")
    spec_ad, ad = _verdict_trials("a_d")
    assert len(ad) == 48 and {t["experiment.seed"] for t in ad} == SEEDS_2026_11_27
    assert _filters(ad) == ["none", "top_k:0.5", "top_p:0.9"]
    spec_c, c = _verdict_trials("c")
    assert len(c) == 64 and {t["experiment.seed"] for t in c} == SEEDS_2026_11_27
    assert sorted({t["env.stochasticity"] for t in c}) == [0.2, 1.0]
    assert _filters(c) == ["none", "top_p:0.9"]
    spec_s, s = _verdict_trials("sensitivity")
    assert len(s) == 27 and spec_s.base.experiment.seed == 1000
    assert {t["algo.entropy_coef"] for t in s} == {0.0, 0.001, 0.01}
    assert {t["algo.kl_coef"] for t in s} == {0.0, 0.1, 0.3}
    assert _filters(s) == ["top_p:0.5", "top_p:0.7", "top_p:0.9"]
    for spec, ts in ((spec_ad, ad), (spec_c, c), (spec_s, s)):
        cfg = spec.base
        # The quickstart's recipe; only Ray's CPU shares differ (scheduling, not compute:
        # the torch threads are the same), so that a trial fits this 2-core machine.
        shares = {"rollout": {"num_cpus_per_worker"}, "algo": {"num_cpus"}}
        for section in ("model", "rollout", "algo", "trainer", "diagnostics"):
            ours, theirs = (
                getattr(c, section).model_dump(exclude=shares.get(section))
                for c in (cfg, quickstart)
            )
            assert ours == theirs, section
        cpus = sum(b.get("CPU", 0) for b in trial_bundles(cfg, spec.sweep.resources))
        assert cpus <= 2.0
        assert cfg.env.kwargs == quickstart.env.kwargs and cfg.env.id == quickstart.env.id
        assert cfg.model.warm_start.seed is None  # each RL seed its own warm start
        assert cfg.experiment.name == "tether-verdicts" and spec.sweep.max_concurrent == 1
        built = [spec.build(t).filter for t in ts]
        assert {(f.metric, f.loss_scaling) for f in built} == {("reward_variance", "linear")}


def test_a_dotted_space_entry_can_be_overridden_on_the_command_line():
    """``sweep.space.experiment.seed=...`` sets the ``experiment.seed`` entry (as the c
    spec's half-run command does), not a nested ``experiment: {seed: ...}``."""
    spec = load_sweep_spec(
        VERDICTS / "a_d.yaml", ["sweep.space.experiment.seed={grid: [1000, 1001]}"]
    )
    assert param_space(spec)["experiment.seed"]["grid_search"] == [1000, 1001]
    spec = load_sweep_spec(VERDICTS / "a_d.yaml", ["sweep.space.experiment.seed.grid=[7]"])
    assert param_space(spec)["experiment.seed"]["grid_search"] == [7]
    spec = load_sweep_spec(VERDICTS / "c.yaml", ["sweep.space.env.stochasticity={grid: [0.5]}"])
    grids = {k: v["grid_search"] for k, v in param_space(spec).items()}
    assert grids["env.stochasticity"] == [0.5] and len(grids["experiment.seed"]) == 16
