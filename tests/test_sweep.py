"""Sweeps: spec validation (before any trial starts), search spaces, resources, the
results table, and a smoke sweep of 4 Optuna trials through Ray Tune checked in MLflow."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import MICRO_PROBE
from tests.processes import assert_actor_processes_ended
from tether.platform.config import ConfigError
from tether.platform.sweep.runner import (
    SweepError,
    check_trials_fit,
    decode,
    param_space,
    results_rows,
    run_sweep,
    swept_fields,
    trial_bundles,
    write_results_csv,
)
from tether.platform.sweep.search import expected_trials as _expected_trials
from tether.platform.sweep.search import tune_config as _tune_config
from tether.platform.sweep.spec import apply_values, load_sweep_spec

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"


def write_spec(tmp_path: Path, sweep: dict, base: str = "filters_smoke.yaml", **sections) -> Path:
    data = yaml.safe_load((EXPERIMENTS / base).read_text())
    data["sweep"] = sweep
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def micro_sweep_sections(
    tmp_path: Path, models_dir: Path, name: str, iterations: int, diagnostics: dict | None = None
) -> dict:
    """A seconds-scale trial: the tests' micro model, 2 groups x 4, one rollout worker, the
    tests' probe set; ``diagnostics`` adds to that section."""
    return {
        "experiment": {"output_dir": str(tmp_path / "out"), "name": name},
        "model": {
            "size": "micro",
            "cache_dir": str(models_dir),
            "warm_start": {"episodes": 192, "epochs": 3, "batch_size": 8, "lr": 1e-2},
        },
        "rollout": {
            "num_workers": 1,
            "groups": 2,
            "group_size": 4,
            "max_reply_tokens": 48,
            "num_cpus_per_worker": 0.5,
        },
        "trainer": {
            "iterations": iterations,
            "val_every": iterations,
            "val_episodes": 4,
            "samples_every": 1,
        },
        "diagnostics": {"probe": dict(MICRO_PROBE), **(diagnostics or {})},
    }


# -- shipped specs --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, trials",
    [
        ("sensitivity", 14),
        ("stochasticity", 16),
        ("filters", 12),
        ("sensitivity_smoke", 4),
        ("stochasticity_smoke", 4),
        ("filters_smoke", 4),
    ],
)
def test_shipped_specs_validate(name, trials):
    spec = load_sweep_spec(EXPERIMENTS / f"{name}.yaml")
    assert spec.name == name and _expected_trials(spec) == trials
    assert Path(spec.base.experiment.output_dir).is_absolute()
    if name.endswith("_smoke"):
        # 2 trials at once on 2 cores: each trial (loop + actors) takes exactly 1 CPU.
        cpus = sum(b.get("CPU", 0) for b in trial_bundles(spec.base, spec.sweep.resources))
        assert cpus == pytest.approx(1.0)
        # A few minutes on 2 cores, the trials long enough that training, not start-up,
        # is what the sweep spends its time on (benchmarks/RESULTS.md, issue 5).
        assert spec.base.trainer.iterations == 24 and spec.base.model.size == "micro"
        assert (spec.base.rollout.groups, spec.base.rollout.group_size) == (8, 4)
        assert spec.sweep.max_concurrent == 2


def test_sensitivity_varies_one_field_at_a_time():
    spec = load_sweep_spec(EXPERIMENTS / "sensitivity.yaml")
    cases = param_space(spec)["case"]["grid_search"]
    decoded = [decode(spec, {"case": c}) for c in cases]
    assert all(len(d) == 1 for d in decoded)
    assert [v for d in decoded for k, v in d.items() if k == "algo.kl_coef"] == [
        0.001,
        0.01,
        0.05,
        0.1,
    ]
    base = spec.base
    cfg = spec.build(decoded[0])  # entropy varied, KL and top-p at base values
    assert cfg.algo.kl_coef == base.algo.kl_coef and cfg.filter.value == base.filter.value


def test_section_grid_merges_into_the_section_and_round_trips_through_labels():
    spec = load_sweep_spec(EXPERIMENTS / "stochasticity_smoke.yaml")
    labels = param_space(spec)["filter"]["grid_search"]
    assert labels == ["strategy=top_p, value=0.9", "strategy=none"]
    values = decode(spec, {"env.stochasticity": 0.2, "filter": labels[1]})
    assert values == {"env.stochasticity": 0.2, "filter": {"strategy": "none"}}
    cfg = spec.build(values)
    assert cfg.filter.strategy == "none" and cfg.env.stochasticity == 0.2
    assert cfg.filter.mode == spec.base.filter.mode  # untouched fields keep their values
    assert swept_fields(spec) == {
        "env.stochasticity": 0.0,
        "filter.strategy": "top_p",
        "filter.value": 0.9,
    }
    tree = {"filter": {"strategy": "top_p", "value": 0.5}}
    assert apply_values(tree, {"filter": {"value": 0.7}}) == {
        "filter": {"strategy": "top_p", "value": 0.7}
    }
    assert tree["filter"]["value"] == 0.5  # the base tree is not mutated


def test_ranges_become_tune_domains(tmp_path):
    spec = load_sweep_spec(
        write_spec(
            tmp_path,
            {
                "search": "optuna",
                "num_samples": 3,
                "space": {
                    "algo.lr": {"loguniform": [1e-5, 1e-3]},
                    "filter.value": {"uniform": [0.5, 1.0]},
                    "rollout.group_size": {"randint": [2, 4]},
                    "algo.kl_coef": {"choice": [0.0, 0.1]},
                },
            },
        )
    )
    space = param_space(spec)
    assert (space["algo.lr"].lower, space["algo.lr"].upper) == (1e-5, 1e-3)
    assert (space["rollout.group_size"].lower, space["rollout.group_size"].upper) == (2, 5)
    assert space["algo.kl_coef"].categories == [0.0, 0.1]
    assert _expected_trials(spec) == 3


def test_the_driver_warm_starts_the_policy_its_trials_use(tmp_path):
    """A sweep warm-starts once before its trials only the policy they all share: a grid
    of one seed (a sweep run in parts) replaces the base's seed, so the base's own warm
    start would be built for nothing; several seeds, or a range over a field of the
    recipe, leave each trial to build its own."""
    from tether.platform.sweep.runner import shared_warm_start

    def shared(space):
        spec = load_sweep_spec(write_spec(tmp_path, {"search": "grid", "space": space}))
        return spec.base.experiment.seed, shared_warm_start(spec)

    filters = {"grid": [{"strategy": "none"}, {"strategy": "top_p", "value": 0.9}]}
    base_seed, cfg = shared({"filter": filters, "experiment.seed": {"grid": [1004]}})
    assert base_seed != 1004 and cfg.experiment.seed == 1004
    assert shared({"experiment.seed": {"grid": [1004, 1005]}})[1] is None
    # the noise level and the algorithm do not enter the warm start: one, the base's
    base_seed, cfg = shared(
        {"env.stochasticity": {"grid": [0.0, 1.0]}, "algo.kl_coef": {"grid": [0.0, 0.1]}}
    )
    assert cfg.experiment.seed == base_seed
    assert shared({"algo.kl_coef": {"grid": [0.0, 0.1]}})[1].experiment.seed == base_seed
    assert shared({"model.warm_start.lr": {"grid": [1e-3, 2e-3]}})[1] is None
    spec = load_sweep_spec(
        write_spec(
            tmp_path,
            {
                "search": "random",
                "num_samples": 2,
                "space": {"experiment.seed": {"randint": [0, 9]}},
            },
        )
    )
    assert shared_warm_start(spec) is None


def test_tune_config_search_scheduler_and_concurrency(tmp_path):
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.optuna import OptunaSearch

    spec = load_sweep_spec(
        write_spec(
            tmp_path,
            {
                "search": "optuna",
                "num_samples": 6,
                "max_concurrent": 2,
                "mode": "min",
                "metric": "actor/entropy",
                "scheduler": {"asha": {"grace_period": 1}},
                "space": {"algo.kl_coef": {"choice": [0.0, 0.1]}},
            },
        )
    )
    config = _tune_config(spec)
    assert isinstance(config.search_alg, OptunaSearch) and config.max_concurrent_trials == 2
    assert (config.metric, config.mode, config.num_samples) == ("actor/entropy", "min", 6)
    assert isinstance(config.scheduler, ASHAScheduler)
    assert config.scheduler._max_t == spec.base.trainer.iterations and config.reuse_actors
    grid = _tune_config(load_sweep_spec(EXPERIMENTS / "filters_smoke.yaml"))
    # The variant generator limits concurrency itself (Tune ignores max_concurrent_trials).
    assert isinstance(grid.search_alg, BasicVariantGenerator) and grid.scheduler is None
    assert grid.search_alg.max_concurrent == 2 and grid.max_concurrent_trials is None
    with pytest.raises(
        ConfigError,
        match=r"sweep.scheduler.asha.grace_period: 30 is more than "
        r"max_t \(24",
    ):
        load_sweep_spec(
            EXPERIMENTS / "filters_smoke.yaml", ["sweep.scheduler={asha: {grace_period: 30}}"]
        )


# -- bad input fails before anything starts, naming the field -------------------------------
@pytest.mark.parametrize(
    "space, search, expected",
    [
        ({"algo.klcoef": {"grid": [0.1]}}, "grid", "sweep.space.algo.klcoef: no field 'klcoef'"),
        ({"algo.kl_coef.x": {"grid": [0.1]}}, "grid", "algo.kl_coef is a value"),
        (
            {"algo.kl_coef": {"grid": [0.1, -1]}},
            "grid",
            "sweep.space.algo.kl_coef: value -1 is refused: algo.kl_coef: Input should be greater",
        ),
        (
            {"filter.value": {"uniform": [0.5, 1.5]}},
            "random",
            "sweep.space.filter.value: value 1.5 is refused: filter: value must be in [0, 1]",
        ),
        (
            {"rollout.group_size": {"randint": [1, 4]}},
            "random",
            "sweep.space.rollout.group_size: value 1 is refused: rollout.group_size must be ≥ 2",
        ),
        (
            {"filter": {"grid": [{"strategy": "bogus"}]}},
            "grid",
            "sweep.space.filter: value {'strategy': 'bogus'} is refused: filter.strategy",
        ),
        ({"filter": {"grid": [0.5]}}, "grid", "filter is a section; its values must be mappings"),
        (
            {"algo.lr": {"loguniform": [0, 1e-3]}},
            "random",
            "sweep.space.algo.lr: loguniform needs lo > 0",
        ),
        ({"algo.lr": {"uniform": [1e-3, 1e-4]}}, "random", "uniform needs lo < hi"),
        ({"algo.lr": {"grid": [1e-3], "choice": [1e-4]}}, "grid", "give exactly one of"),
        ({"algo.lr": {"grid": [1e-3]}}, "optuna", "search optuna cannot enumerate grid (algo.lr)"),
        ({}, "grid", "space is empty"),
    ],
)
def test_bad_space_is_refused_with_the_field_path(tmp_path, space, search, expected):
    with pytest.raises(ConfigError) as err:
        load_sweep_spec(write_spec(tmp_path, {"search": search, "space": space}))
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_sweep_key_and_base_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"sweep.serach: .*\(unknown key\)"):
        load_sweep_spec(
            write_spec(tmp_path, {"serach": "grid", "space": {"algo.lr": {"grid": [1e-3]}}})
        )
    with pytest.raises(ConfigError, match=r"algo.kl_coef: Input should be greater"):
        load_sweep_spec(EXPERIMENTS / "filters_smoke.yaml", ["algo.kl_coef=-1"])
    with pytest.raises(ConfigError, match="needs a 'sweep:' section"):
        load_sweep_spec(EXPERIMENTS / "micro.yaml")


def test_impossible_resources_name_the_fields_and_the_case():
    spec = load_sweep_spec(
        EXPERIMENTS / "filters_smoke.yaml", ["sweep.space={rollout.num_workers: {grid: [2, 8]}}"]
    )
    check_trials_fit(
        load_sweep_spec(EXPERIMENTS / "filters_smoke.yaml"), {"CPU": 2.0}, {"CPU": 2.0}
    )  # the smoke trial fits
    with pytest.raises(SweepError) as err:
        check_trials_fit(spec, {"CPU": 2.0}, {"CPU": 2.0})
    message = str(err.value)
    assert message.startswith(
        "sweep.resources: a trial with sweep.space.rollout.num_workers=8 needs 4.5 CPU"
    )
    assert "rollout.num_cpus_per_worker" in message and "the cluster has 2 CPU" in message
    gpu = load_sweep_spec(EXPERIMENTS / "filters_smoke.yaml", ["algo.num_gpus=1"])
    with pytest.raises(SweepError, match="needs 1 GPU .* the cluster has 0 GPU"):
        check_trials_fit(gpu, {"CPU": 2.0}, {"CPU": 2.0})
    two_nodes = load_sweep_spec(
        EXPERIMENTS / "filters_smoke.yaml", ["rollout.num_cpus_per_worker=2.5"]
    )
    with pytest.raises(SweepError, match="on one node and the largest node has 2"):
        check_trials_fit(two_nodes, {"CPU": 8.0}, {"CPU": 2.0})


def test_cli_refuses_impossible_resources_before_any_trial(tmp_path):
    """Through the CLI with a real local Ray: one error line, exit code 2, no trial ran."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.platform.cli",
            "sweep",
            str(EXPERIMENTS / "filters_smoke.yaml"),
            f"experiment.output_dir={out}",
            "rollout.num_cpus_per_worker=4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: sweep.resources: a trial needs 4.5 CPU" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
    assert not (out / "sweeps").exists() and not (out / "mlflow.db").exists()


# -- results table ----------------------------------------------------------------------------
def test_results_rows_rank_trials_and_keep_the_finished_attempt(tmp_path):
    from tether.platform.tracking.tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = Tracker(uri, "rank-test", tmp_path / "artifacts", run_name="sweep")
    histories = {"t0": [0.1, 0.5, 0.3], "t1": [0.2, 0.9], "t2": [0.0, 0.4]}
    for trial, success in histories.items():
        child = Tracker(
            uri,
            "rank-test",
            run_name=trial,
            parent_run_id=parent.run_id,
            tags={"sweep.trial_id": trial, "sweep.param.algo.kl_coef": trial[-1]},
        )
        for step, value in enumerate(success, 1):
            child.log_metrics({"rollout/success": value}, step)
        child.log_metrics({"collapse/first_turn/mi_zscore_ema": 1.5}, step=len(success))
        if trial == "t2":
            child.set_tags({"alarm.low_entropy_collapse": 2})
        child.finish("FINISHED")
    killed = Tracker(
        uri,
        "rank-test",
        run_name="t1-old",
        parent_run_id=parent.run_id,
        tags={"sweep.trial_id": "t1"},
    )  # an interrupted earlier attempt
    killed.log_metrics({"rollout/success": 1.0}, 1)
    killed.finish("KILLED")
    rows = results_rows(uri, parent.experiment_id, parent.run_id, "rollout/success", "max")
    assert [r["trial"] for r in rows] == ["t1", "t2", "t0"]  # final success 0.9, 0.4, 0.3
    assert [r["rank"] for r in rows] == [1, 2, 3]
    t0 = rows[2]
    assert (t0["success_peak"], t0["success_final"], t0["iterations"]) == (0.5, 0.3, 3)
    assert rows[0]["status"] == "FINISHED" and rows[0]["algo.kl_coef"] == "1"
    assert rows[1]["alarms"] == "low_entropy_collapse" and t0["alarms"] == ""
    assert t0["mi_zscore_ema_final"] == 1.5
    assert [
        r["trial"]
        for r in results_rows(uri, parent.experiment_id, parent.run_id, "rollout/success", "min")
    ] == ["t0", "t2", "t1"]
    write_results_csv(rows, "rollout/success", tmp_path / "r.csv")
    with (tmp_path / "r.csv").open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0])[:4] == ["rank", "trial", "algo.kl_coef", "rollout/success"]
    assert [row["trial"] for row in table] == ["t1", "t2", "t0"]
    # t2's MI collapsed (an MI alarm fired): flagged, and last once penalised by 0.2.
    assert [r["collapsed"] for r in rows] == [False, True, False]
    penalised = results_rows(
        uri, parent.experiment_id, parent.run_id, "rollout/success", "max", collapse_penalty=0.2
    )
    assert [(r["trial"], round(r["objective"], 6)) for r in penalised] == [
        ("t1", 0.9),
        ("t0", 0.3),
        ("t2", 0.2),
    ]


# -- a real sweep ---------------------------------------------------------------------------
def test_a_collapsing_trial_is_stopped_early_and_flagged(
    micro_policy, models_dir, ray_local, tmp_path
):
    """A grid of 2 trials with sweep.stop_collapsed: the trial whose alarm holds ends after
    `points` iterations (cleanly: FINISHED, checkpoint, stop reason), the other runs on;
    the results table flags the stopped one and ranks it last under the penalty.

    The trigger is synthetic but real: format_collapse reads rollout/worker_failures (0 in a
    healthy run) as its valid-reasoning rate, so min_rate 0.5 breaches at every iteration and
    min_rate 0 never does; the swept min_rate picks which trial collapses."""
    from tether.platform.sweep.results import results_table

    path = write_spec(
        tmp_path,
        {
            "name": "stop-collapsed",
            "search": "grid",
            "space": {"alarms.format_collapse.min_rate": {"grid": [0.0, 0.5]}},
            "resources": {"cpu": 0.2},
            "max_concurrent": 1,
            "stop_collapsed": {"alarms": ["format_collapse"], "points": 2},
            "collapse_penalty": 10.0,
        },
        **micro_sweep_sections(
            tmp_path, models_dir, "stop-test", iterations=4, diagnostics={"enabled": False}
        ),
        alarms={"format_collapse": {"reasoning_metric": "rollout/worker_failures"}},
    )
    outcome = run_sweep(load_sweep_spec(path), echo=lambda line: None)
    assert outcome.status == "FINISHED" and outcome.trials == 2
    by_rate = {r["alarms.format_collapse.min_rate"]: r for r in outcome.rows}
    stopped, healthy_trial = by_rate["0.5"], by_rate["0.0"]
    assert stopped["iterations"] == 2 and healthy_trial["iterations"] == 4
    assert stopped["status"] == healthy_trial["status"] == "FINISHED"
    assert stopped["collapsed"] and not healthy_trial["collapsed"]
    assert stopped["stop_reason"] == "alarm format_collapse at iteration 2"
    assert [r["trial"] for r in outcome.rows] == [healthy_trial["trial"], stopped["trial"]]
    assert stopped["objective"] == pytest.approx(stopped["rollout/success"] - 10.0)
    client = MlflowClient(outcome.tracking_uri)
    run = client.get_run(stopped["run_id"])
    assert run.data.tags["tether.stop_reason"] == "alarm format_collapse at iteration 2"
    assert run.data.tags["tether.last_checkpoint"].endswith("iter_000002.pt")
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(results_table(outcome.rows, "rollout/success", "stop-collapsed"))
    text = console.export_text()
    assert "COLLAPSED, stopped" in text and "objective" in text


def test_optuna_smoke_sweep_through_tune_is_tracked_in_mlflow(
    micro_policy, models_dir, ray_local, tmp_path
):
    """4 Optuna (TPE) trials on local Ray: one MLflow parent, 4 nested children with their
    params, sweep tags and metric histories, and the results CSV on the parent."""
    space = {
        "algo.entropy_coef": {"loguniform": [1e-4, 1e-2]},
        "filter.value": {"uniform": [0.5, 1.0]},
        "algo.kl_coef": {"choice": [0.0, 0.01]},
    }
    path = write_spec(
        tmp_path,
        {
            "name": "optuna-smoke",
            "search": "optuna",
            "space": space,
            "num_samples": 4,
            "max_concurrent": 2,
            "resources": {"cpu": 0.2},
            "metric": "rollout/success",
            "mode": "max",
        },
        **micro_sweep_sections(
            tmp_path, models_dir, "sweep-test", iterations=2, diagnostics={"every": 2}
        ),
    )
    lines: list[str] = []
    outcome = run_sweep(load_sweep_spec(path), echo=lines.append)
    assert outcome.status == "FINISHED" and outcome.trials == 4
    client = MlflowClient(outcome.tracking_uri)
    parent = client.get_run(outcome.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep.search"] == "optuna"
    experiment = parent.info.experiment_id
    assert len(client.search_runs([experiment], "tags.`tether.kind` = 'sweep'")) == 1
    children = client.search_runs(
        [experiment], f"tags.`mlflow.parentRunId` = '{outcome.parent_run_id}'"
    )
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    sampled = []
    for child in children:
        params, tags = child.data.params, child.data.tags
        entropy, value = float(params["algo.entropy_coef"]), float(params["filter.value"])
        assert 1e-4 <= entropy <= 1e-2 and 0.5 <= value <= 1.0
        assert float(params["algo.kl_coef"]) in (0.0, 0.01)
        for field in space:  # tags name the swept fields, with this trial's values
            assert float(tags[f"sweep.param.{field}"]) == pytest.approx(float(params[field]))
        assert params["rollout.group_size"] == "4" and params["trainer.iterations"] == "2"
        success = client.get_metric_history(child.info.run_id, "rollout/success")
        assert sorted(m.step for m in success) == [1, 2]
        assert all(0.0 <= m.value <= 1.0 for m in success)
        assert sorted(
            m.step for m in client.get_metric_history(child.info.run_id, "val/success")
        ) == [0, 2]
        sampled.append((entropy, value))
    assert len(set(sampled)) == 4  # TPE drew 4 different points
    # Tune ran later trials in the processes of earlier ones (reuse_actors), whose actor
    # pools handed them the rollout workers (the same for every trial here); the learner
    # only where algo.kl_coef > 0 matched (a reference model or not).
    reused = [c.data.tags["tether.actors_reused"] for c in children]
    assert set(reused) <= {"none", "rollout_workers", "rollout_workers,learner"}
    assert reused.count("none") >= 1 and any(r.startswith("rollout_workers") for r in reused)
    # No rollout worker, environment pool or learner outlives the sweep: Tune removed the
    # trial processes' placement groups, and the pools' actors went with them.
    assert_actor_processes_ended()
    # Tune ran the Optuna searcher (its state is saved beside the trials for --resume).
    assert any(p.name.startswith("searcher-state") for p in outcome.experiment_path.iterdir())
    artifacts = {a.path for a in client.list_artifacts(outcome.parent_run_id)}
    assert {"sweep_results.csv", "sweep_spec.yaml"} <= artifacts
    local = Path(
        client.download_artifacts(outcome.parent_run_id, "sweep_results.csv", str(tmp_path))
    )
    with local.open() as f:
        table = list(csv.DictReader(f))
    assert sorted(r["run_id"] for r in table) == sorted(c.info.run_id for c in children)
    assert [int(r["rank"]) for r in table] == [1, 2, 3, 4]
    finals = [float(r["rollout/success"]) for r in table]
    assert finals == sorted(finals, reverse=True)
    assert {
        "algo.entropy_coef",
        "filter.value",
        "algo.kl_coef",
        "success_peak",
        "success_final",
        "mi_zscore_ema_final",
        "alarms",
    } <= set(table[0])
    assert any(line.startswith(f"MLflow parent run {outcome.parent_run_id}") for line in lines)
    state = json.loads((outcome.experiment_path / "tether_sweep.json").read_text())
    assert state["parent_run_id"] == outcome.parent_run_id
    assert not math.isnan(outcome.rows[0]["rollout/success"])


@pytest.mark.slow  # nightly; CONTRIBUTING.md, "Tests", Nightly
def test_the_sweep_end_waits_for_a_tracking_server_that_went_away(
    micro_policy, models_dir, ray_local, tmp_path, monkeypatch
):
    """The server goes away as the last trial ends, before the sweep closes its children
    and ranks them: the sweep's end says so once, waits for it (tracking.drain_timeout_s)
    instead of failing at its first read, and writes the results table when it is back."""
    import threading

    from tests.mlflow_server import MlflowServer
    from tether.platform.sweep import runner as sweep_module

    for name, value in (("MAX_RETRIES", "1"), ("TIMEOUT", "30"), ("BACKOFF_FACTOR", "1")):
        monkeypatch.setenv(f"MLFLOW_HTTP_REQUEST_{name}", value)  # a failed read: seconds
    sections = micro_sweep_sections(tmp_path, models_dir, "end-test", iterations=1)
    with MlflowServer(tmp_path / "mlflow_server") as server:
        sections["tracking"] = {"uri": server.uri, "probe_every_s": 1.0, "drain_timeout_s": 300}
        path = write_spec(
            tmp_path,
            {
                "name": "end-outage",
                "search": "grid",
                "space": {"algo.kl_coef": {"grid": [0.0]}},
                "resources": {"cpu": 0.2},
            },
            **sections,
        )
        finish = sweep_module._finish

        def server_gone_at_the_end(*args, **kwargs):
            server.kill()
            return finish(*args, **kwargs)

        monkeypatch.setattr(sweep_module, "_finish", server_gone_at_the_end)
        lines, restart = [], []

        def echo(line):
            lines.append(line)
            if "is away" in line:  # back once the sweep has said it waits
                restart.append(threading.Thread(target=server.start))
                restart[-1].start()

        outcome = run_sweep(load_sweep_spec(path), echo=echo)
        for thread in restart:
            thread.join()
        away = [line for line in lines if "is away" in line]
        assert len(away) == 1 and len(restart) == 1, lines
        assert outcome.status == "FINISHED" and outcome.trials == 1
        assert [(r["status"], r["iterations"]) for r in outcome.rows] == [("FINISHED", 1)]
        client = MlflowClient(server.uri)
        parent = client.get_run(outcome.parent_run_id)
        assert parent.info.status == "FINISHED"
        assert parent.data.tags["sweep.status"] == "completed"
        assert "sweep_results.csv" in {a.path for a in client.list_artifacts(parent.info.run_id)}
        with (outcome.experiment_path / "sweep_results.csv").open() as f:
            assert [r["run_id"] for r in csv.DictReader(f)] == [outcome.rows[0]["run_id"]]


def test_a_sweep_can_stop_trials_on_any_alarm_the_run_has():
    from tether.diagnostics.settings import ALARM_NAMES
    from tether.platform.sweep.spec import CollapseStop

    assert CollapseStop(alarms=list(ALARM_NAMES)).alarms == list(ALARM_NAMES)
    with pytest.raises(ValueError):
        CollapseStop(alarms=["no_such_alarm"])
