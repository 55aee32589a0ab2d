"""Ray Tune sweeps: every trial is a full training run, nested under one MLflow parent.

    tether sweep experiments/filters_smoke.yaml
    tether sweep experiments/sensitivity.yaml --resume
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
        tether sweep experiments/sensitivity.yaml

The driver validates the spec, joins (or starts) Ray, checks that one trial fits the
cluster, warm-starts the policy once, creates the MLflow parent run and hands Tune a
function trainable. Each trial builds its config (base + sampled values), runs
``Trainer`` inside its placement group (one bundle for the trial loop, one for its
rollout workers + learner) and reports every iteration's metrics to Tune. The parent
run id lives in the Tune experiment directory, so ``--resume`` continues the same
parent and re-runs only the trials that had not finished.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune import Callback

from .sweep_results import (
    SUCCESS,
    close_stale_children,
    finalize_child,
    results_rows,
    results_table,
    write_results_csv,
)
from .sweep_spec import SweepSpec, flat_values, swept_fields

__all__ = [
    "SweepError",
    "SweepOutcome",
    "check_trials_fit",
    "decode",
    "param_space",
    "results_rows",
    "results_table",
    "run_sweep",
    "swept_fields",
    "trial_bundles",
    "write_results_csv",
]

STATE_FILE = "tether_sweep.json"
RESULTS_FILE = "sweep_results.csv"


class SweepError(RuntimeError):
    """A sweep that cannot start or resume (the message says what to do)."""


@dataclass
class SweepOutcome:
    name: str
    status: str  # FINISHED, KILLED (interrupted: resume it) or FAILED
    parent_run_id: str
    tracking_uri: str
    experiment_path: Path
    rows: list[dict] = field(default_factory=list)
    trials: int = 0
    seconds: float = 0.0
    experiment_id: str = ""

    @property
    def ui_command(self) -> str:
        from .tracking import ui_command

        return ui_command(self.tracking_uri, self.experiment_id)


# -- search space and resources ---------------------------------------------------------
def label(value: Any) -> Any:
    """How a value shows in Tune's tables and configs: scalars as they are, a section's
    mapping as ``k=v, k=v`` (Optuna takes scalars only; decode() maps labels back)."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={label(v)}" for k, v in value.items())
    return json.dumps(value) if isinstance(value, list) else value


def _case_label(path: str, value: Any) -> str:
    return (
        f"{path}={label(value)}"
        if not isinstance(value, dict)
        else ", ".join(f"{path}.{k}={label(v)}" for k, v in value.items())
    )


def param_space(spec: SweepSpec) -> dict[str, Any]:
    from ray import tune

    sweep = spec.sweep
    if sweep.design == "one_at_a_time":
        return {
            "case": tune.grid_search(
                [_case_label(path, v) for path, d in sweep.space.items() for v in d.grid]
            )
        }
    space = {}
    for path, d in sweep.space.items():
        if d.kind == "grid":
            space[path] = tune.grid_search([label(v) for v in d.grid])
        elif d.kind == "choice":
            space[path] = tune.choice([label(v) for v in d.choice])
        elif d.kind == "uniform":
            space[path] = tune.uniform(*d.uniform)
        elif d.kind == "loguniform":
            space[path] = tune.loguniform(*d.loguniform)
        else:
            space[path] = tune.randint(d.randint[0], d.randint[1] + 1)  # Tune: upper excluded
    return space


def decode(spec: SweepSpec, config: dict[str, Any]) -> dict[str, Any]:
    """A trial's Tune config back to ``{dotted path: value}``."""
    sweep = spec.sweep
    if "case" in config:
        cases = {_case_label(path, v): {path: v} for path, d in sweep.space.items() for v in d.grid}
        return dict(cases[config["case"]])
    out = {}
    for path, value in config.items():
        d = sweep.space[path]
        if d.values is not None:
            value = next((v for v in d.values if label(v) == value), value)
        out[path] = value.item() if hasattr(value, "item") else value  # numpy scalars
    return out


def trial_bundles(cfg, head) -> list[dict[str, float]]:
    """Placement-group bundles of one trial: its own loop, then all its actors together
    (one bundle, so Ray never puts a worker where the learner should go)."""

    def bundle(cpu: float, gpu: float) -> dict[str, float]:
        return {k: v for k, v in (("CPU", cpu), ("GPU", gpu)) if v > 0}

    r, a = cfg.rollout, cfg.algo
    actors = bundle(
        r.num_workers * r.num_cpus_per_worker + a.learner_world_size * a.num_cpus,
        r.num_workers * r.num_gpus_per_worker + a.learner_world_size * a.num_gpus,
    )
    return [bundle(head.cpu, head.gpu)] + ([actors] if actors else [])


def check_trials_fit(spec: SweepSpec, totals: dict[str, float], largest_node: dict[str, float]):
    """Fail with one line if a trial can never be placed on this cluster."""
    fields = {
        "CPU": "rollout.num_workers x rollout.num_cpus_per_worker + "
        "algo.learner_world_size x algo.num_cpus + sweep.resources.cpu",
        "GPU": "rollout.num_workers x rollout.num_gpus_per_worker + "
        "algo.learner_world_size x algo.num_gpus + sweep.resources.gpu",
    }
    for values, cfg in spec.resource_cases():
        bundles = trial_bundles(cfg, spec.sweep.resources)
        for kind in ("CPU", "GPU"):
            need = sum(b.get(kind, 0.0) for b in bundles)
            biggest = max(b.get(kind, 0.0) for b in bundles)
            have, node = totals.get(kind, 0.0), largest_node.get(kind, 0.0)
            if need <= have + 1e-9 and biggest <= node + 1e-9:
                continue
            where = (
                f"the cluster has {have:g} {kind}"
                if need > have + 1e-9
                else f"its actors need {biggest:g} {kind} on one node and the largest node "
                f"has {node:g}"
            )
            case = "".join(f" with sweep.space.{k}={v}" for k, v in values.items())
            parts = " + ".join(f"{b.get(kind, 0.0):g}" for b in bundles)
            raise SweepError(
                f"sweep.resources: a trial{case} needs {need:g} {kind} "
                f"({fields[kind]} = {parts}) but {where}; lower those fields "
                f"or use a bigger cluster"
            )


# -- the trial ----------------------------------------------------------------------------
def run_trial(config: dict[str, Any], spec_json: str, parent_run_id: str) -> None:
    """Tune's function trainable: one full training run, metrics reported per iteration."""
    from ray import tune

    from .actor_pool import process_pool
    from .trainer import Trainer

    spec = SweepSpec.from_json(spec_json)
    values = decode(spec, config)
    trial_id = tune.get_context().get_trial_id()
    cfg = stop_when_collapsed(spec.build(values), spec.sweep.stop_collapsed)
    cfg.experiment.run_name = f"{spec.name}-{trial_id}"
    resolved = cfg.flat()
    tags = {
        "sweep.name": spec.name,
        "sweep.trial_id": trial_id,
        **{f"sweep.param.{k}": resolved.get(k, v) for k, v in swept_fields(spec).items()},
        **{f"sweep.param.{k}": v for k, v in flat_values(values).items()},
    }

    def on_event(kind: str, data: dict) -> None:
        if kind == "tracking":  # the spool's start and drain lines, into the trial's log
            print(data["message"], flush=True)
        elif kind == "iteration":
            tune.report(
                {
                    k: float(v)
                    for k, v in data.items()
                    if k != "total" and isinstance(v, (int, float)) and math.isfinite(float(v))
                }
            )

    # Tune reuses this process (and its placement group) for the next trial with the same
    # resources; the process's pool keeps a finished trial's rollout workers and learner
    # for it, and ends them if that trial's constructor arguments differ (actor_pool.py).
    summary = Trainer(
        cfg, on_event, parent_run_id=parent_run_id, run_tags=tags, actor_pool=process_pool()
    ).run()
    if summary.status != "FINISHED":
        raise RuntimeError(f"trial {trial_id} ended {summary.status}")


def stop_when_collapsed(cfg, stop):
    """The trial's config with the listed MI alarms in stop mode after ``stop.points``
    collapsed diagnostic points (unchanged when ``stop`` is None)."""
    if stop is None:
        return cfg
    for name in stop.alarms:
        alarm = getattr(cfg.alarms, name)
        update = {"mode": "stop", "patience": stop.points}
        if hasattr(alarm, "within"):
            update["within"] = max(alarm.within, stop.points)
        setattr(cfg.alarms, name, alarm.model_copy(update=update))
    return cfg


# -- the driver ---------------------------------------------------------------------------
class SweepProgress(Callback):
    """Tune callback: one plain line per trial event (readable in `ray job logs`) or, in a
    terminal, rich bars (trials done / running / left with an ETA, one bar per running
    trial); and the MLflow runs of trials that Tune ended (early stop, error) closed.
    Tune pickles its callbacks with the experiment for ``--resume``, so this holds plain
    data only: the bars belong to the driver process (``showing``)."""

    def __init__(
        self, tracking_uri: str, experiment_id: str, parent_run_id: str, spec_json: str
    ) -> None:
        self.tracking_uri, self.experiment_id = tracking_uri, experiment_id
        self.parent_run_id, self.spec_json = parent_run_id, spec_json

    def __getstate__(self):  # plain data only, whatever a later version caches here
        return {
            k: self.__dict__[k]
            for k in ("tracking_uri", "experiment_id", "parent_run_id", "spec_json")
        }

    def _spec(self) -> SweepSpec:
        spec = self.__dict__.get("_spec_cache")
        if spec is None:
            spec = self.__dict__["_spec_cache"] = SweepSpec.from_json(self.spec_json)
        return spec

    def _draw(self, trials, latest: dict | None = None, ended: str | None = None) -> None:
        if _display is not None and not _display.plain:
            spec = self._spec()
            _display.trials(
                trials,
                _expected_trials(spec),
                lambda t: spec.build(decode(spec, t.config)).trainer.iterations,
                spec.base.trainer.iterations,
                spec.sweep.metric,
                latest,
                ended,
            )

    def on_step_end(self, iteration, trials, **info):
        if _display is not None and not _display.plain and _display.throttled():
            self._draw(trials)

    def on_trial_start(self, iteration, trials, trial, **info):
        values = ", ".join(
            f"{k}={v}" for k, v in flat_values(decode(self._spec(), trial.config)).items()
        )
        _say(f"trial {trial.trial_id} started: {values}")
        self._draw(trials)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if _display is not None and not _display.plain:  # the bars show it
            self._draw(trials, {trial.trial_id: result})
            return
        done = sum(t.status in ("TERMINATED", "ERROR") for t in trials)
        _say(
            f"trial {trial.trial_id} iteration {int(result.get('iteration', 0))}  "
            f"success {result.get(SUCCESS, float('nan')):.3f}  "
            f"[{done}/{max(len(trials), _expected_trials(self._spec()))} trials done]"
        )

    def on_trial_complete(self, iteration, trials, trial, **info):
        finalize_child(
            self.tracking_uri, self.experiment_id, self.parent_run_id, trial.trial_id, "FINISHED"
        )
        _say(f"trial {trial.trial_id} finished")
        self._draw(trials, ended=trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info):
        finalize_child(
            self.tracking_uri, self.experiment_id, self.parent_run_id, trial.trial_id, "FAILED"
        )
        _say(f"trial {trial.trial_id} FAILED (error log: {trial.local_path})")
        self._draw(trials, ended=trial.trial_id)


_display = None  # the driver's SweepDisplay while Tune runs (never pickled)


@contextmanager
def showing(display):
    """Let the Tune callbacks of this process draw on ``display`` (None: plain prints)."""
    global _display
    previous, _display = _display, display
    try:
        yield
    finally:
        _display = previous


def _say(line: str) -> None:
    if _display is not None:
        _display.line(line)
    else:
        print(line, flush=True)


@contextmanager
def _graceful_sigterm():
    """`ray job stop` sends SIGTERM: turn it into Tune's graceful stop (SIGUSR1), which
    ends the trials and saves the experiment state so ``--resume`` can continue."""
    if not hasattr(signal, "SIGUSR1"):
        yield
        return

    def stop(*_):
        # Trials Tune shuts down fail their pending train() calls: expected, not news.
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        os.kill(os.getpid(), signal.SIGUSR1)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _connect(spec: SweepSpec, address: str | None) -> bool:
    """Join the cluster (or start a local Ray); True when this started a local one."""
    import ray

    from .session import start_ray

    if ray.is_initialized():
        return False
    # Under `ray job submit` the entry point gets RAY_ADDRESS: join that cluster.
    address = address or spec.base.ray.address or os.environ.get("RAY_ADDRESS")
    return start_ray(address, spec.base.ray.num_cpus, 0) and not address


def run_sweep(
    spec: SweepSpec,
    resume: bool = False,
    address: str | None = None,
    echo: Callable[[str], None] = print,
    display=None,
) -> SweepOutcome:
    """Run (or resume) a sweep.  ``display`` (a ``progress.SweepDisplay``, started by the
    caller) shows the warm start and the trials as bars in a terminal or as lines."""
    import ray
    from ray import tune
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    from ..policy.load import resolve_policy
    from .environment import environment_tags
    from .session import cluster_capacity, wait_for_autoscaler
    from .tracking import SPOOL_DIRNAME, Tracker

    started = time.perf_counter()
    sweep, base = spec.sweep, spec.base
    storage = Path(sweep.storage_path or Path(base.experiment.output_dir) / "sweeps").resolve()
    exp_path = storage / spec.name
    state_file = exp_path / STATE_FILE
    if resume:
        if not state_file.is_file() or not tune.Tuner.can_restore(str(exp_path)):
            raise SweepError(
                f"nothing to resume at {exp_path} (no saved sweep state); run "
                f"without --resume to start it"
            )
        state = json.loads(state_file.read_text())
        if json.loads(state["spec"]) != json.loads(spec.to_json()):
            echo(
                "note: the spec differs from the one the sweep started with; resuming with "
                "the original"
            )
        spec = SweepSpec.from_json(state["spec"])
        sweep, base = spec.sweep, spec.base
    elif state_file.exists() or tune.Tuner.can_restore(str(exp_path)):
        raise SweepError(
            f"sweep {spec.name!r} already has state at {exp_path}; continue it "
            f"with --resume, or start a new one with sweep.name=<another name>"
        )

    started_local = _connect(spec, address)
    wait_for_autoscaler(
        lambda: check_trials_fit(spec, *cluster_capacity()),
        0.0 if started_local else base.ray.autoscaler_wait_s,
        (SweepError,),
    )
    echo(
        f"Ray cluster: {ray.cluster_resources().get('CPU', 0):g} CPUs, "
        f"{ray.cluster_resources().get('GPU', 0):g} GPUs; one trial: "
        f"{trial_bundles(base, sweep.resources)}"
    )
    from ..envs import runs_untrusted_code
    from ..envs.sandbox import resolve_isolation

    if runs_untrusted_code(base.env.id):  # refuse before any trial starts (one line)
        resolve_isolation(base.sandbox.isolation)
    if base.model.path is None:  # warm-start once here, not in every trial at once
        echo("warm start (cached after the first time) ...")
        resolve_policy(
            base.model,
            base.env,
            base.experiment.seed,
            base.rollout.max_reply_tokens,
            progress=display.warm_start if display is not None else None,
            isolation=base.sandbox.isolation,
        )

    uri = base.tracking_uri()
    artifacts = Path(base.experiment.output_dir) / "artifacts"
    # The parent's writes the server does not take wait in the sweep's directory (the
    # children spool into their own output directories, as any run does).
    spooled = {"spool_root": exp_path / SPOOL_DIRNAME, "settings": base.tracking, "notify": echo}
    if resume:
        parent = Tracker(
            state["tracking_uri"],
            base.experiment.name,
            artifacts,
            run_id=state["parent_run_id"],
            **spooled,
        )
    else:
        parent = Tracker(
            uri,
            base.experiment.name,
            artifacts,
            run_name=spec.name,
            **spooled,
            tags={
                "sweep.name": spec.name,
                "sweep.search": sweep.search,
                "sweep.metric": sweep.metric,
                "sweep.fields": ",".join(sweep.space),
                "tether.kind": "sweep",
                **environment_tags(),
            },
        )
        parent.log_params(
            {f"sweep.{k}": v for k, v in sweep.model_dump(mode="json").items() if k != "space"}
            | {
                f"sweep.space.{p}": json.dumps(d.model_dump(exclude_none=True))
                for p, d in sweep.space.items()
            }
        )
        parent.log_text(
            Path(spec.source).read_text() if Path(spec.source).is_file() else "", "sweep_spec.yaml"
        )
        parent.log_text(spec.to_json(), "sweep_spec_resolved.json")
        exp_path.mkdir(parents=True, exist_ok=True)
        state_file.write_text(
            json.dumps(
                {"parent_run_id": parent.run_id, "tracking_uri": uri, "spec": spec.to_json()},
                indent=1,
            )
        )
    parent.set_tags({"sweep.experiment_path": str(exp_path)})
    echo(f"MLflow parent run {parent.run_id}  (Tune state: {exp_path})")
    ids = (parent.uri, parent.experiment_id, parent.run_id)
    close_stale_children(*ids)  # trials killed with an earlier, interrupted attempt

    spec_json = spec.to_json()
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec_json=spec_json, parent_run_id=parent.run_id),
        lambda config: PlacementGroupFactory(
            trial_bundles(spec.build(decode(spec, config)), sweep.resources)
        ),
    )
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")  # state saved often: resumable
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the compact table of _reporter()
    if resume:
        tuner = tune.Tuner.restore(
            str(exp_path), trainable, resume_unfinished=True, restart_errored=True
        )
    else:
        run_config = tune.RunConfig(
            name=spec.name,
            storage_path=str(storage),
            verbose=1,
            callbacks=[SweepProgress(*ids, spec_json)],
            progress_reporter=_reporter(spec),
            failure_config=tune.FailureConfig(max_failures=0),
        )
        tuner = tune.Tuner(
            trainable,
            param_space=param_space(spec),
            tune_config=_tune_config(spec),
            run_config=run_config,
        )
    with _graceful_sigterm(), showing(display):
        tuner.fit()

    # The saved experiment state is the truth: an interrupted run leaves trials unfinished
    # (in memory Tune marks them TERMINATED while shutting down).
    trials = tune.ExperimentAnalysis(str(exp_path)).trials
    errored = sum(t.status == "ERROR" for t in trials)
    interrupted = len(trials) < _expected_trials(spec) or any(
        t.status not in ("TERMINATED", "ERROR") for t in trials
    )
    close_stale_children(*ids)
    rows = results_rows(
        *ids, sweep.metric, sweep.mode, sweep.collapse_penalty, sweep.collapse_alarms()
    )
    write_results_csv(rows, sweep.metric, exp_path / RESULTS_FILE)
    parent.log_artifact(exp_path / RESULTS_FILE)
    status = "KILLED" if interrupted else ("FAILED" if errored == len(trials) else "FINISHED")
    parent.set_tags(
        {
            "sweep.status": "interrupted" if interrupted else "completed",
            "sweep.trials": len(trials),
            "sweep.trials_errored": errored,
        }
    )
    parent.finish(status)
    return SweepOutcome(
        spec.name,
        status,
        parent.run_id,
        parent.uri,
        exp_path,
        rows,
        len(trials),
        time.perf_counter() - started,
        parent.experiment_id,
    )


def _expected_trials(spec: SweepSpec) -> int:
    sweep = spec.sweep
    if sweep.design == "one_at_a_time":
        return sum(len(d.grid) for d in sweep.space.values()) * sweep.num_samples
    grid = math.prod(len(d.grid) for d in sweep.space.values() if d.kind == "grid")
    return grid * sweep.num_samples


def _tune_config(spec: SweepSpec):
    from ray import tune

    sweep = spec.sweep
    seed = sweep.seed if sweep.seed is not None else spec.base.experiment.seed
    if sweep.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(seed=seed)
    else:
        from ray.tune.search.basic_variant import BasicVariantGenerator

        search_alg = BasicVariantGenerator(
            random_state=seed, max_concurrent=sweep.max_concurrent or 0
        )
    scheduler = None
    if sweep.scheduler.asha is not None:
        from ray.tune.schedulers import ASHAScheduler

        a = sweep.scheduler.asha
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=a.max_t or spec.base.trainer.iterations,
            grace_period=a.grace_period,
            reduction_factor=a.reduction_factor,
        )
    # reuse_actors: a trial's process is kept for the next trial, which skips importing
    # torch and tether again (seconds of CPU per trial on a small machine), and so are its
    # rollout workers and learner when the next trial's are the same (run_trial).
    return tune.TuneConfig(
        metric=sweep.metric,
        mode=sweep.mode,
        search_alg=search_alg,
        scheduler=scheduler,
        num_samples=sweep.num_samples,
        reuse_actors=True,
        max_concurrent_trials=sweep.max_concurrent if sweep.search == "optuna" else None,
    )


def _reporter(spec: SweepSpec):
    """The progress table (every 30 s and at the end): trials, swept values, metric."""
    from ray.tune import CLIReporter

    metrics = {
        "iteration": "iter",
        spec.sweep.metric: spec.sweep.metric.split("/")[-1],
        SUCCESS: "success",
    }
    return CLIReporter(
        parameter_columns=list(param_space(spec)),
        metric_columns=metrics,
        max_report_frequency=30,
        sort_by_metric=True,
        max_column_length=48,
    )
