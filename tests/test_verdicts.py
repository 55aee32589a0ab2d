"""The protocol of 2026-11-27's tests (tether.analysis.verdicts) on runs whose answers
are known by construction."""

import hashlib
import json
import subprocess
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tether.analysis.decide import NOT_REPRODUCED, REPRODUCED, UNDECIDED
from tether.analysis.runs import SUCCESS, VAL_SUCCESS, RunData, arm_of, collapse_key
from tether.analysis.verdicts import (
    PROBE_H,
    PROBE_MI,
    PROBE_Z,
    b_test,
    c_contrasts,
    family,
    loss_scales,
    noise,
    probe_mi_change,
    quartile_gap,
    seed,
)

STEPS = (1, 12, 24)


def run(seed, arm, *, level=0.0, mi=(0.34, 0.34), final=0.4, rng=None, z_tracks=True):
    """One trial: probe MI from mi[0] at iteration 1 to mi[1] at 24, final success
    ``final``, training success rising with the step, the probe's z-score following
    success (``z_tracks``) and its H(Z|X) not; prompt groups whose MI rises with RV."""
    rng = rng or np.random.default_rng(zlib.crc32(f"{seed} {arm} {level}".encode()))
    success = {s: 0.2 + 0.01 * s + rng.normal(0, 0.02) for s in STEPS}
    metrics = {
        PROBE_MI: {1: mi[0], 12: (mi[0] + mi[1]) / 2, 24: mi[1]},
        SUCCESS: success,
        VAL_SUCCESS: {0: 0.3, 24: final},
        PROBE_Z: {s: (success[s] if z_tracks else 0) + rng.normal(0, 0.01) for s in STEPS},
        PROBE_H: {s: rng.normal(1.0, 0.1) for s in STEPS},
    }
    prompt_mi = {}
    for s in STEPS:
        groups = []
        for g in range(16):
            wins = g % 9  # 0..8 successes of 8: RV from 0 up and down again
            rewards = [1.0] * min(wins, 8) + [0.0] * (8 - min(wins, 8))
            rv = float(np.var(rewards, ddof=1))
            groups.append(
                {
                    "group_id": g,
                    "rewards": rewards,
                    "success": [r > 0 for r in rewards],
                    "mi": 0.1 + rv + rng.normal(0, 0.02),
                }
            )
        prompt_mi[s] = groups
    params = {"experiment.seed": str(seed), "filter.strategy": arm, "env.stochasticity": str(level)}
    return RunData(
        f"{arm}-{seed}-{level}",
        f"{arm}-{seed}",
        params=params,
        metrics=metrics,
        prompt_mi=prompt_mi,
    )


def suite(seeds=range(10), c_gain=0.2):
    rng = np.random.default_rng(0)
    runs = []
    for s in seeds:
        runs.append(run(s, "none", mi=(0.34, 0.20 + rng.normal(0, 0.02)), final=0.40))
        runs.append(
            run(s, "top_p", mi=(0.34, 0.33 + rng.normal(0, 0.02)), final=0.40 + rng.normal(0, 0.01))
        )
        runs.append(run(s, "top_k", final=0.40 + rng.normal(0, 0.01)))
        for level, gain in ((0.2, c_gain), (1.0, 0.0)):
            runs.append(run(s, "none", level=level, final=0.3))
            runs.append(run(s, "top_p", level=level, final=0.3 + gain + rng.normal(0, 0.02)))
    return runs


def test_each_test_of_the_family_reads_the_effect_built_in():
    out = family(suite())
    assert out["a1"]["verdict"] == REPRODUCED and out["a1"]["mean"] == pytest.approx(
        -0.14, abs=0.02
    )
    assert out["a2"]["verdict"] == REPRODUCED and out["a2"]["mean"] == pytest.approx(0.13, abs=0.02)
    assert out["d1"]["verdict"] == NOT_REPRODUCED  # top-p = none to within 0.01
    assert out["d2"]["verdict"] == NOT_REPRODUCED
    assert out["d3"]["verdict"] == REPRODUCED
    assert out["b"]["verdict"] == REPRODUCED and out["b"]["n"] == 10
    # b's spread is its bootstrap standard error x sqrt(seeds): the interval is ~3.9 SE wide
    se = out["b"]["sd"] / np.sqrt(10)
    assert out["b"]["ci_high"] - out["b"]["ci_low"] == pytest.approx(3.92 * se, rel=0.3)
    assert 0 < out["b"]["power"] <= 1
    assert out["c"]["verdict"] == REPRODUCED and out["c"]["mean"] == pytest.approx(0.2, abs=0.02)
    assert {t["n"] for k, t in out.items() if k != "b"} == {10}


def test_no_effect_in_c_is_not_reproduced_and_b_without_tracking_is_not_either():
    runs = suite(c_gain=0.0)
    out = family(runs)
    assert out["c"]["verdict"] == NOT_REPRODUCED
    flat = [run(s, a, z_tracks=False) for s in range(10) for a in ("none", "top_p")]
    assert family(flat)["b"]["verdict"] != REPRODUCED


def test_noisy_runs_stay_out_of_a_b_and_d_and_c_pairs_by_seed():
    runs = suite(seeds=range(6))
    clean = family(runs)
    # Noisy runs whose probe z-score ignores success and whose MI change is wild: were
    # they read by a, b or d, those numbers would move.
    odd = [run(s, "top_p", level=0.5, mi=(0.3, 5.0), z_tracks=False) for s in range(6)]
    for r in odd:
        for groups in r.prompt_mi.values():
            for g in groups:
                g["mi"] = -g["mi"]
    mixed = family(runs + odd)
    for key in ("a1", "a2", "b", "d1", "d3"):
        assert mixed[key]["mean"] == pytest.approx(clean[key]["mean"]), key
    # a seed missing its 100 % level has no contrast
    partial = [
        r
        for r in runs
        if not (r.params["experiment.seed"] == "0" and r.params["env.stochasticity"] == "1.0")
    ]
    assert len(c_contrasts(partial)) == 5


def test_b_counts_a_point_the_arms_share_once_and_reads_both_ways():
    runs = [run(s, a) for s in range(8) for a in ("none", "top_p", "top_k")]
    for r in runs:  # iteration 1: the seed's three arms are one policy, one measurement
        first = runs[3 * int(r.params["experiment.seed"])]
        for key in (PROBE_Z, PROBE_H, SUCCESS):
            r.metrics[key][1] = first.metrics[key][1]
        r.metrics[PROBE_H] = {i: 2.0 - 3 * r.metrics[SUCCESS][i] for i in STEPS}
    out = b_test(runs, resamples=400)
    assert out["points"] == 8 * (3 * 3 - 2) and out["n"] == 8
    reading = out["readings"]
    z, h = reading["rho_mi_z"]["mean"], reading["rho_h"]["mean"]
    assert h < -0.9 < 0.9 < z  # z tracks success, H(Z|X) falls with it
    assert reading["signed"]["mean"] == pytest.approx(z - h) and reading["signed"]["mean"] > 1.8
    assert out["mean"] == reading["abs"]["mean"] == pytest.approx(z - abs(h))
    for r in reading.values():
        assert r["ci_low"] <= r["mean"] <= r["ci_high"]
    # arms that differ at iteration 1 are three measurements there, each counted
    apart = [run(s, a) for s in range(8) for a in ("none", "top_p", "top_k")]
    assert b_test(apart, resamples=50)["points"] == 8 * 3 * 3


def test_the_d_rows_arms_task_step_scales():
    runs = suite(seeds=range(4))
    kept = {"none": 1.0, "top_p": 0.6, "top_k": 0.5}
    for r in runs:
        r.params["filter.loss_scaling"] = "linear"
        base = kept[arm_of(r)] if noise(r) == 0.0 else 9.0  # noisy runs stay out
        r.metrics["filter/loss_scale"] = {i: base + 0.01 * (i % 2) for i in range(1, 5)}
    out = loss_scales(runs)
    assert set(out) == {"none", "top_p", "top_k"} and out["top_p"]["n"] == 4
    for arm, scale in kept.items():
        assert out[arm]["mean"] == pytest.approx(scale + 0.005) and out[arm]["scaling"] == "linear"
    assert loss_scales([run(0, "none")]) == {}  # a record without the metric: nothing


def test_the_measures_of_one_run():
    r = run(0, "none", mi=(0.34, 0.20))
    assert probe_mi_change(r) == pytest.approx(-0.14)
    assert probe_mi_change(RunData("x", "x")) is None
    assert quartile_gap([r]) > 0.15  # MI = 0.1 + RV: the top quartile 0.2-0.29 above the bottom


def store_of(tmp_path, runs) -> str:
    """The runs logged to a fresh SQLite MLflow store (experiment ``verdicts-test``)."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("verdicts-test", artifact_location=str(tmp_path / "art"))
    for r in runs:
        tags = {"tether.env": "lake", "env.tether_commit": "c0ffee"}
        rid = client.create_run(exp, run_name=r.name, tags=tags).info.run_id
        metrics = [
            Metric(key, value, 0, step)
            for key, points in r.metrics.items()
            for step, value in points.items()
        ]
        params = [Param(k, v) for k, v in r.params.items()]
        client.log_batch(rid, metrics=metrics, params=params)
        for it, groups in r.prompt_mi.items():
            client.log_dict(
                rid, {"iteration": it, "groups": groups}, f"prompt_mi/iter_{it:04d}.json"
            )
        client.set_terminated(rid, "FINISHED")
    return uri


def test_the_paper_command_prints_the_family_from_a_store(tmp_path, capsys):
    """``python -m tether.analysis.paper <experiment>`` (no --finding): the runs read back
    from MLflow, prompt records included, give the numbers computed on them directly."""
    import json

    from tether.analysis import paper

    runs = suite(seeds=range(4))
    uri = store_of(tmp_path, runs)
    assert paper.main(["verdicts-test", "--tracking-uri", uri]) == 0
    out = json.loads(capsys.readouterr().out)
    direct = family(runs)
    assert out["runs"] == len(runs)
    for key in ("a1", "a2", "b", "c", "d1", "d2", "d3"):
        assert out["tests"][key]["verdict"] == direct[key]["verdict"], key
        assert out["tests"][key]["mean"] == pytest.approx(direct[key]["mean"]), key
    with pytest.raises(SystemExit):
        paper.main(["verdicts-test", "--tracking-uri", uri, "--protocol", "2026-11-23"])
    capsys.readouterr()
    assert paper.main(["verdicts-test", "--tracking-uri", uri, "--table"]) == 0
    table = capsys.readouterr().out
    for key in ("a1.", "a2.", "b.", "c.", "d1.", "d2.", "d3."):
        assert key in table
    assert table.count(direct["a1"]["verdict"]) >= 1 and "differ: {}" in table
    assert "['c0ffee']" in table  # the commit the runs trained on


def test_record_files_carry_the_runs_to_the_analyses_without_the_store(tmp_path, capsys):
    """A sweep run in parts on machines that do not keep their stores: each part exported
    (``--export``) and the files pooled give what the pooled store gives; a record reads
    back equal to the runs the store gives; ``tether report`` builds from a record alone."""
    import json

    from typer.testing import CliRunner

    from tether.analysis import paper, records
    from tether.analysis.source import load_target
    from tether.platform.cli.main import app

    runs = suite(seeds=range(4))
    uri = store_of(tmp_path, runs)
    whole = tmp_path / "whole.json.gz"
    assert paper.main(["verdicts-test", "--tracking-uri", uri, "--export", str(whole)]) == 0
    from_store = json.loads(capsys.readouterr().out)
    stored = load_target(uri, "verdicts-test")[1]
    assert records.load(whole) == stored  # every field: params, tags, metrics, prompt records
    # the same runs give the same bytes (a part committed twice is no change)
    twice = [records.dump(stored, tmp_path / f"{k}.json.gz").read_bytes() for k in "ab"]
    assert twice[0] == twice[1]
    # two parts by seed, as two machines would have run them; the family reads them pooled
    first = [r for r in stored if int(r.params["experiment.seed"]) < 2]
    parts = [
        records.dump(first, tmp_path / "part1.json.gz"),
        records.dump([r for r in stored if r not in first], tmp_path / "part2.json"),
    ]
    assert paper.main([str(p) for p in parts]) == 0  # no --tracking-uri: no store needed
    pooled = json.loads(capsys.readouterr().out)
    assert pooled["runs"] == from_store["runs"] == len(runs) and pooled["commits"] == ["c0ffee"]
    assert pooled["tests"] == from_store["tests"]
    # half the seeds is not the whole: the pooling is what brings the rest in
    assert paper.main([str(parts[0])]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == len(first)
    # a part cut short: seed 0's top-k arm did not finish, seed 1's top-p never started
    cut = [
        replace(r, status="KILLED") if (seed(r), arm_of(r)) == ("0", "top_k") else r
        for r in stored
        if seed(r) in "012" and (seed(r), arm_of(r), noise(r)) != ("1", "top_p", 0.0)
    ]
    kept, left_out = records.complete_seeds(cut)
    assert left_out == ["0", "1"] and {seed(r) for r in kept} == {"2"}
    assert len(kept) == 7  # seed 2 whole: three arms at no noise, two at each other level
    with pytest.raises(ValueError, match="no seed finished every arm"):
        records.export([r for r in cut if seed(r) == "0"], tmp_path / "none.json.gz", {})
    assert not (tmp_path / "none.json.gz").exists()
    # a part given twice is one trial counted twice: refused, not silently deduplicated
    assert paper.main([str(parts[0]), str(parts[1]), str(parts[0])]) == 2
    assert "the same trial more than once" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert paper.main([str(bad)]) == 2 and "not a Tether run record" in capsys.readouterr().err
    assert paper.main(["verdicts-test"]) == 2  # a store's name without a store
    result = CliRunner().invoke(app, ["report", str(whole), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rep" / "report.html").is_file() and "logged as" not in result.output


def test_the_quartile_gap_is_defined_when_most_groups_share_the_top_rv():
    """Half the groups at the largest RV a group of 8 can have (4 of 8 succeed): an
    exclusive top quartile would be empty; the inclusive one holds them."""
    r = run(0, "none")
    for groups in r.prompt_mi.values():
        for g in groups[:10]:
            g["rewards"] = [1.0] * 4 + [0.0] * 4
            g["success"] = [True] * 4 + [False] * 4
            g["mi"] = 0.6
        for g in groups[10:]:
            g["rewards"], g["success"], g["mi"] = [0.0] * 8, [False] * 8, 0.1
    assert quartile_gap([r]) == pytest.approx(0.5)
    for groups in r.prompt_mi.values():
        for g in groups:
            g["rewards"], g["success"] = [0.0] * 8, [False] * 8
    assert quartile_gap([r]) is None  # one RV for every group: no quartiles


def sensitivity_grid(effect, noise=0.01, skip=()):
    """The sensitivity sweep's 27 trials: final success 0.5 plus ``effect[factor]`` times
    the level's rank (-1, 0, +1) for each factor, plus noise; probe MI logged with an
    interval at iterations 12 and 24."""
    from tether.analysis.verdicts import FACTORS

    levels = {
        "algo.entropy_coef": (0.0, 0.001, 0.01),
        "algo.kl_coef": (0.0, 0.1, 0.3),
        "filter.value": (0.5, 0.7, 0.9),
    }
    rng = np.random.default_rng(3)
    runs = []
    for i, e in enumerate(levels["algo.entropy_coef"]):
        for j, k in enumerate(levels["algo.kl_coef"]):
            for m, p in enumerate(levels["filter.value"]):
                if (i, j, m) in skip:
                    continue
                ranks = dict(zip(FACTORS, (i - 1, j - 1, m - 1)))
                final = 0.5 + sum(effect[f] * ranks[f] for f in FACTORS) + rng.normal(0, noise)
                mi = 0.3 + 0.01 * i
                metrics = {
                    VAL_SUCCESS: {0: 0.3, 24: final},
                    f"{VAL_SUCCESS}_ci_low": {0: 0.25, 24: final - 0.06},
                    f"{VAL_SUCCESS}_ci_high": {0: 0.35, 24: final + 0.06},
                    PROBE_MI: {12: 0.3, 24: mi},
                    f"{PROBE_MI}_ci_low": {12: 0.2, 24: mi - 0.05},
                    f"{PROBE_MI}_ci_high": {12: 0.4, 24: mi + 0.05},
                }
                params = {
                    "experiment.seed": "1000",
                    "algo.entropy_coef": str(e),
                    "algo.kl_coef": str(k),
                    "filter.strategy": "top_p",
                    "filter.value": str(p),
                }
                tags = {"tether.env": "lake", "env.tether_commit": "c0ffee"}
                name = f"sens-{e}-{k}-{p}"
                runs.append(RunData(name, name, params=params, tags=tags, metrics=metrics))
    return runs


def test_the_sensitivity_row_reads_which_factor_moves_success(tmp_path, capsys):
    """Success built to move 0.3 over the entropy and KL levels and 0.01 over the top-p
    ratio's: reproduced; the other way round: not reproduced; no factor moving it:
    undecided; a cell missing: no verdict. Pooled records of its parts give the same."""
    from tether.analysis import paper, records
    from tether.analysis.verdicts import sensitivity

    robust = {"algo.entropy_coef": 0.15, "algo.kl_coef": -0.15, "filter.value": 0.005}
    row = sensitivity(sensitivity_grid(robust))
    assert row["verdict"] == REPRODUCED, row["because"]
    assert row["spread"]["algo.entropy_coef"]["spread"] == pytest.approx(0.3, abs=0.02)
    assert row["spread"]["filter.value"]["spread"] == pytest.approx(0.01, abs=0.02)
    assert row["difference"]["algo.kl_coef"]["ci_high"] < 0
    first = row["cells"][0]
    assert first["success_ci"] == pytest.approx([first["success"] - 0.06, first["success"] + 0.06])
    assert first["probe_mi"] == pytest.approx(0.3) and first["probe_mi_ci"] == pytest.approx(
        [0.25, 0.35]
    )
    sensitive = {"algo.entropy_coef": 0.005, "algo.kl_coef": 0.005, "filter.value": 0.15}
    assert sensitivity(sensitivity_grid(sensitive))["verdict"] == NOT_REPRODUCED
    flat = {k: 0.0 for k in robust}
    assert sensitivity(sensitivity_grid(flat, noise=0.05))["verdict"] == UNDECIDED
    partial = sensitivity(sensitivity_grid(robust, skip={(2, 2, 2)}))
    assert partial["verdict"] is None and "26 cells" in partial["because"]
    # two of the three parts: a whole 18-cell grid of the levels present, not the protocol's
    first_two = [r for r in sensitivity_grid(robust) if r.params["algo.entropy_coef"] != "0.01"]
    early = sensitivity(first_two)
    assert early["verdict"] is None and "18 cells" in early["because"]
    grid = sensitivity_grid(robust)
    twice = sensitivity(grid + [replace(grid[0], run_id="again")])
    assert twice["verdict"] is None and "more than one run" in twice["because"]
    other_arm = replace(grid[0], params={**grid[0].params, "filter.strategy": "none"})
    assert sensitivity([other_arm])["cells"] == []  # an a_d arm's run is not a cell
    # parts by entropy coefficient, as run_part.sh runs them; pooled by the command
    runs = sensitivity_grid(robust)
    parts = []
    for e in ("0.0", "0.001", "0.01"):
        part = [r for r in runs if r.params["algo.entropy_coef"] == e]
        parts.append(str(records.dump(part, tmp_path / f"sens-{e}.json.gz")))
    # the parts pool only with one warm start beside each (run_part.sh's sidecars)
    assert paper.main([*parts, "--sensitivity"]) == 2
    assert "no warm-start hash beside sens-0.0.json.gz" in capsys.readouterr().err
    for e in ("0.0", "0.001", "0.01"):
        (tmp_path / f"sens-{e}.warmstart.sha256").write_text("abc123  tiny-1000\n")
    assert paper.main([*parts, "--sensitivity"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sensitivity"]["verdict"] == REPRODUCED and len(out["sensitivity"]["cells"]) == 27
    assert out["warm_starts"]["sens-0.01.json.gz"] == ["abc123  tiny-1000"]
    assert paper.main([*parts, "--sensitivity", "--table"]) == 0
    table = capsys.readouterr().out
    assert "top-p ratio" in table and f"verdict: {REPRODUCED}" in table
    (tmp_path / "sens-0.01.warmstart.sha256").write_text("def456  tiny-1000\n")
    assert paper.main([*parts, "--sensitivity"]) == 2
    assert "2 different warm starts" in capsys.readouterr().err


def test_the_sensitivity_rows_power_rises_with_the_spread():
    """The simulated power: no effect never says reproduced; an effect far above the
    noise always does (the simulation reads the same test as the row)."""
    from tether.analysis.verdicts import sensitivity_power

    assert sensitivity_power(0.0, 0.05, simulations=20, resamples=200) == 0.0
    assert sensitivity_power(0.3, 0.02, simulations=20, resamples=200) == 1.0


def test_records_restored_to_a_store_read_back_as_they_were(tmp_path, capsys):
    """``--restore``: records logged to a fresh store as one parent's children read back
    (as that parent's sweep) equal to the records, but for run ids and MLflow's tags."""
    from dataclasses import replace as with_

    from tether.analysis import paper, records
    from tether.analysis.source import load_target

    runs = [r for r in suite(seeds=[0]) if noise(r) == 0.0]  # one seed's three arms
    for r in runs:  # what training tags a run with
        r.tags = {"tether.env": "lake", "env.tether_commit": "c0ffee"}
    runs[0].alarms = [{"name": "template_collapse", "iteration": 12, "mode": "warn"}]
    runs[0].tags["alarm.template_collapse"] = "12"
    runs[1].prompts = {3: [{"group_id": 0, "rewards": [1.0, 0.0], "success": [True, False]}]}
    part = records.dump(runs, tmp_path / "part.json.gz")
    uri = f"sqlite:///{tmp_path}/ui.db"
    assert paper.main([str(part), "--restore", uri]) == 0
    parent = capsys.readouterr().err.split("parent run ")[1].split()[0]
    restored = load_target(uri, parent)[1]

    def comparable(r):
        kept = {k: v for k, v in r.tags.items() if not k.startswith(("mlflow.", "tether.restored"))}
        return with_(r, run_id="", tags=kept)

    assert sorted(map(comparable, restored), key=arm_of) == sorted(
        map(comparable, runs), key=arm_of
    )


def test_a_records_warm_starts_are_hashed_by_content_and_a_lost_one_is_said(tmp_path):
    """experiments/verdicts/warmstart_sha256.py: one line per distinct warm start of a
    record, its weights' sha256; a warm start no longer on the machine is an error."""
    script = Path(__file__).parents[1] / "experiments" / "verdicts" / "warmstart_sha256.py"
    models = {}
    for name, weights in (("tiny-a", b"first"), ("tiny-b", b"second")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(weights)
        models[name] = hashlib.sha256(weights).hexdigest()
    paths = [tmp_path / "tiny-b", tmp_path / "tiny-a", tmp_path / "tiny-b"]
    from tether.analysis import records

    runs = [
        RunData(f"r{i}", f"r{i}", tags={"tether.model_path": str(p)}) for i, p in enumerate(paths)
    ]
    record = records.dump(runs, tmp_path / "part.json.gz")
    out = subprocess.run([sys.executable, script, record], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{models['tiny-a']}  tiny-a", f"{models['tiny-b']}  tiny-b"]

    (tmp_path / "tiny-a" / "model.safetensors").unlink()
    out = subprocess.run([sys.executable, script, record], capture_output=True, text=True)
    assert out.returncode != 0 and "tiny-a" in out.stderr and "not on this machine" in out.stderr


def test_a_seeds_a_d_and_c_records_pool_only_from_one_warm_start(tmp_path, capsys):
    """c pairs its noisy arms with a_d's 0 % arms of the same seed, run in parts of their
    own: the family reads them only when both parts' sidecars name the same weights."""
    from tether.analysis import paper, records

    runs = suite(seeds=range(3))
    targets = []
    for spec, clean in (("a_d", True), ("c", False)):
        for s in ("0", "1", "2"):
            part = [r for r in runs if seed(r) == s and (noise(r) == 0.0) == clean]
            targets.append(str(records.dump(part, tmp_path / f"{spec}-{s}.json.gz")))
    a_d = [t for t in targets if "a_d-" in t]
    assert paper.main(a_d) == 0  # one record per seed: nothing to pair, no hash needed
    assert json.loads(capsys.readouterr().out)["tests"]["c"]["n"] == 0
    assert paper.main(targets) == 2
    assert "seed 0: no warm-start hash beside a_d-0.json.gz, c-0.json.gz" in capsys.readouterr().err
    for s in ("0", "1", "2"):
        for spec in ("a_d", "c"):
            (tmp_path / f"{spec}-{s}.warmstart.sha256").write_text(f"{s}{s}{s}  tiny-{s}\n")
    assert paper.main(targets) == 0
    assert json.loads(capsys.readouterr().out)["tests"]["c"]["n"] == 3
    (tmp_path / "c-2.warmstart.sha256").write_text("999  tiny-2\n")  # rebuilt elsewhere
    assert paper.main(targets) == 2
    assert "seed 2: 2 different warm starts across a_d-2.json.gz, c-2.json.gz" in (
        capsys.readouterr().err
    )


def test_c_reads_its_own_records_apart_from_the_family(tmp_path, capsys):
    """A seed run whole for c (every noise level in one part, from a warm start rebuilt on
    another machine) is read by c alone, with its own 0 % arms; a, b and d keep a_d's."""
    from tether.analysis import paper, records

    runs = suite(seeds=range(5))  # c's gain at 20 %: +0.2, none at 0 % and 100 %
    target = {}
    for s in map(str, range(5)):
        clean = [r for r in runs if seed(r) == s and noise(r) == 0.0]
        noisy = [r for r in runs if seed(r) == s and noise(r) > 0.0]
        target["a_d", s] = str(records.dump(clean, tmp_path / f"a_d-{s}.json.gz"))
        if s in ("0", "1"):  # c's noisy arms, paired with a_d's part on one machine
            target["c", s] = str(records.dump(noisy, tmp_path / f"c-{s}.json.gz"))
            for spec in ("a_d", "c"):
                (tmp_path / f"{spec}-{s}.warmstart.sha256").write_text(f"{s}{s}  tiny-{s}\n")
        else:  # whole: its own 0 % arms, where top-p gains 0.2 over none (a_d's: 0)
            own = [run(int(s), "none", final=0.4), run(int(s), "top_p", final=0.6)]
            target["c_whole", s] = str(records.dump(own + noisy, tmp_path / f"c_whole-{s}.json.gz"))
            (tmp_path / f"c_whole-{s}.warmstart.sha256").write_text(f"9{s}  tiny-{s}\n")
    a_d = [t for (spec, _), t in target.items() if spec == "a_d"]
    c_set = [target["a_d", "0"], target["a_d", "1"]]
    c_set += [t for (spec, _), t in target.items() if spec != "a_d"]

    assert paper.main(a_d) == 0
    alone = json.loads(capsys.readouterr().out)
    assert paper.main([*a_d, "--c-targets", *c_set]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["runs"], out["c_runs"]) == (15, 2 * (3 + 4) + 3 * (2 + 4))
    c = out["tests"]["c"]
    # seeds 0-1: 0.2 - 0; seeds 2-4: 0.2 - (0.2 + 0) / 2, from their own 0 % arms
    assert c["n"] == 5 and c["mean"] == pytest.approx((2 * 0.2 + 3 * 0.1) / 5, abs=0.02)
    for key in ("a1", "a2", "b", "d1", "d2", "d3"):  # a_d's alone, as before
        assert out["tests"][key]["mean"] == pytest.approx(alone["tests"][key]["mean"])
    assert alone["tests"]["c"]["n"] == 0 and alone["tests"]["c"]["verdict"] is None  # pending
    assert c["verdict"] == REPRODUCED

    # pooled as one set, a whole seed's 0 % arms are a_d's trials a second time
    assert paper.main(a_d + c_set[2:]) == 2
    assert "the same trial more than once" in capsys.readouterr().err
    # a seed's c records must still share one warm start within c's set
    (tmp_path / "c-1.warmstart.sha256").write_text("77  tiny-1\n")
    assert paper.main([*a_d, "--c-targets", *c_set]) == 2
    assert "seed 1: 2 different warm starts across a_d-1.json.gz, c-1.json.gz" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):  # the sensitivity row has no c
        paper.main([*a_d, "--sensitivity", "--c-targets", *c_set])


def avw_run(s: int, mode: str, mi: float, success: float, alarms=()) -> RunData:
    """One run of benchmarks/act_vs_warn.py: final probe MI and held-out success at 32, the
    alarms.json events (name, iteration) it raised."""
    params = {
        "experiment.seed": str(s),
        "alarms.template_collapse.mode": mode,
        "alarms.reading_drift.mode": mode,
        "experiment.run_name": f"{mode}-s{s}",
    }
    first_turn = {s: mi + 0.01 * (s - 30) for s in (28, 30, 32)}  # mean: mi
    metrics = {
        PROBE_MI: {1: 0.35, 24: mi},
        collapse_key("first_turn", "mi_estimate"): first_turn,
        VAL_SUCCESS: {0: 0.3, 32: success},
    }
    events = [{"name": n, "iteration": i, "mode": mode} for n, i in alarms]
    return RunData(f"{mode}-{s}", f"{mode}-s{s}", params=params, metrics=metrics, alarms=events)


def test_act_against_warn_reads_act_minus_warn_per_seed_and_counts_early_collapses(
    tmp_path, capsys
):
    """The act-against-warn row on runs whose answers are built in: acting that restores MI
    and success helps on both; acting that changes nothing is shown not to help by the
    SESOIs; warn's early collapses are counted from its alarms, by iteration 24 only."""
    from tether.analysis import paper, records
    from tether.analysis.verdicts import act_vs_warn

    rng = np.random.default_rng(3)
    helps, futile = [], []
    for s in range(12):
        late = s >= 9  # 3 seeds whose warn alarm comes after iteration 24, or never
        warned = [("template_collapse", 28)] if s == 9 else [] if late else [("reading_drift", 12)]
        warn = avw_run(s, "warn", 0.20 + rng.normal(0, 0.02), 0.02, warned)
        helps += [
            warn,
            avw_run(
                s,
                "act",
                0.33 + rng.normal(0, 0.02),
                0.30 + rng.normal(0, 0.03),
                [("reading_drift", 12), ("action:rollback", 12)],
            ),
        ]
        futile += [warn, avw_run(s, "act", warn.last(PROBE_MI) + rng.normal(0, 0.005), 0.02)]
    row = act_vs_warn(helps)
    assert {k: t["verdict"] for k, t in row["tests"].items()} == {
        "probe_mi": "acting helps",
        "success": "acting helps",
    }
    assert row["tests"]["success"]["n"] == 12 and row["tests"]["success"]["mean"] > 0.2
    assert row["first_turn_mi_last3"]["mean"] == pytest.approx(
        row["tests"]["probe_mi"]["mean"]
    )  # built equal to the probe's
    assert (row["warn_collapsed_early"], row["warn_runs"], row["meets_condition"]) == (9, 12, True)
    first = row["seeds"][0]
    assert first["warn"]["first_alarm"] == (12, "reading_drift")
    assert first["act"]["actions"] == [(12, "action:rollback")]
    assert {k: t["verdict"] for k, t in act_vs_warn(futile)["tests"].items()} == {
        "probe_mi": "acting does not help by the SESOI",
        "success": "acting does not help by the SESOI",
    }
    # From records, one per seed with its warm start beside it, as run_part.sh avw writes
    targets = []
    for s in range(12):
        record = records.dump([r for r in helps if seed(r) == str(s)], tmp_path / f"avw-{s}.json")
        (tmp_path / f"avw-{s}.warmstart.sha256").write_text(f"{s:03d}  tiny-{s}\n")
        targets.append(str(record))
    assert paper.main([*targets, "--act-vs-warn"]) == 0
    read = json.loads(capsys.readouterr().out)["act_vs_warn"]
    assert (
        read["tests"]["probe_mi"]["verdict"] == "acting helps" and read["warn_collapsed_early"] == 9
    )
    assert paper.main([*targets, "--act-vs-warn", "--table"]) == 0
    table = capsys.readouterr().out
    assert "rollback at 12" in table and "9 of 12 seeds" in table
    # a seed's two arms from two warm starts are not a pair
    (tmp_path / "avw-4.warmstart.sha256").write_text("004  tiny-4\n005  tiny-4b\n")
    assert paper.main([*targets, "--act-vs-warn"]) == 2
    assert "2 different warm starts across avw-4.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        paper.main([*targets, "--act-vs-warn", "--sensitivity"])
