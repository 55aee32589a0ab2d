"""Ray Tune sweeps: every trial is a full training run, nested under one MLflow parent.

    tether sweep experiments/filters_smoke.yaml
    tether sweep experiments/sensitivity.yaml --resume
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
        tether sweep experiments/sensitivity.yaml

The driver validates the spec, takes the start-up path a run takes once for all the
trials (``preflight``: refusals, Ray joined or started, one trial fits the cluster, the
policy warm-started), creates the MLflow parent run and hands Tune a function
trainable (the search itself: ``search.py``). Each trial builds its config (base + sampled values), runs
``Trainer`` inside its placement group (one bundle for the trial loop, one for its
rollout workers + learner) and reports every iteration's metrics to Tune. The parent
run id lives in the Tune experiment directory, so ``--resume`` continues the same
parent, and each trial that had not finished goes on from its last checkpoint in its
own MLflow run (``trial.continued_from``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .. import preflight
from .progress import SweepProgress, showing
from .results import (
    close_stale_children,
    end_of_sweep,
    results_rows,
    results_table,
    write_results_csv,
)
from .search import decode, expected_trials, param_space, reporter, tune_config
from .spec import SweepSpec, swept_fields
from .trial import run_trial

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
        from ..tracking.tracker import ui_command

        return ui_command(self.tracking_uri, self.experiment_id)


# -- resources ----------------------------------------------------------------------------
def trial_bundles(cfg, head) -> list[dict[str, float]]:
    """Placement-group bundles of one trial: its own loop, then all its actors together
    (one bundle, so Ray never puts a worker where the learner should go): the run's
    ``actor_resources``, the sum a single run starts its local Ray with."""

    def bundle(cpu: float, gpu: float) -> dict[str, float]:
        return {k: v for k, v in (("CPU", cpu), ("GPU", gpu)) if v > 0}

    need = cfg.actor_resources()
    actors = bundle(need["CPU"], need["GPU"])
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


# -- the driver: start, parent run, Tune, results -----------------------------------------
@dataclass
class _Place:
    """Where a sweep keeps its state: Tune's storage, the experiment, the state file."""

    storage: Path
    experiment: Path

    @property
    def state_file(self) -> Path:
        return self.experiment / STATE_FILE


def run_sweep(
    spec: SweepSpec,
    resume: bool = False,
    address: str | None = None,
    echo: Callable[[str], None] = print,
    display=None,
) -> SweepOutcome:
    """Run (or resume) a sweep.  ``display`` (a ``progress.SweepDisplay``, started by the
    caller) shows the warm start and the trials as bars in a terminal or as lines."""
    started = time.perf_counter()
    place = _place(spec)
    spec, state = _saved_state(spec, place, echo) if resume else (spec, _no_state(spec, place))
    _start(spec, address, echo, display)
    parent = _resumed_parent(spec, place, state, echo) if state else _new_parent(spec, place, echo)
    parent.set_tags({"sweep.experiment_path": str(place.experiment)})
    echo(f"MLflow parent run {parent.run_id}  (Tune state: {place.experiment})")
    ids = (parent.uri, parent.experiment_id, parent.run_id)
    close_stale_children(*ids)  # trials killed with an earlier, interrupted attempt
    tuner = _tuner(spec, place, ids, resume)
    with _graceful_sigterm(), showing(display):
        tuner.fit()
    return _finish(spec, place, parent, echo, time.perf_counter() - started)


def _place(spec: SweepSpec) -> _Place:
    base = spec.base
    storage = spec.sweep.storage_path or Path(base.experiment.output_dir) / "sweeps"
    storage = Path(storage).resolve()
    return _Place(storage, storage / spec.name)


def _saved_state(spec: SweepSpec, place: _Place, echo) -> tuple[SweepSpec, dict]:
    """``--resume``: the spec the sweep started with and its state (parent run id,
    tracking URI)."""
    from ray import tune

    if not place.state_file.is_file() or not tune.Tuner.can_restore(str(place.experiment)):
        raise SweepError(
            f"nothing to resume at {place.experiment} (no saved sweep state); run "
            f"without --resume to start it"
        )
    state = json.loads(place.state_file.read_text())
    if json.loads(state["spec"]) != json.loads(spec.to_json()):
        echo(
            "note: the spec differs from the one the sweep started with; resuming with the original"
        )
    return SweepSpec.from_json(state["spec"]), state


def _no_state(spec: SweepSpec, place: _Place) -> None:
    """A new sweep: refused where one of the same name has state already."""
    from ray import tune

    if place.state_file.exists() or tune.Tuner.can_restore(str(place.experiment)):
        raise SweepError(
            f"sweep {spec.name!r} already has state at {place.experiment}; continue it "
            f"with --resume, or start a new one with sweep.name=<another name>"
        )
    return None


def _start(spec: SweepSpec, address: str | None, echo, display) -> None:
    """The start-up path of a run (``preflight``), once for every trial: refusals, Ray,
    one trial fits the cluster, the policy warm-started (cached for the trials)."""
    import ray

    from ..session import cluster_capacity

    base, resources = spec.base, spec.sweep.resources
    # Under `ray job submit` the entry point gets RAY_ADDRESS: join that cluster.
    address = address or base.ray.address or os.environ.get("RAY_ADDRESS")
    preflight.refuse_early(base, address)
    started_local = preflight.connect(base, address) and not address
    preflight.wait_until_fits(
        lambda: check_trials_fit(spec, *cluster_capacity()),
        base,
        joined=not started_local,
        refusals=(SweepError,),
    )
    echo(
        f"Ray cluster: {ray.cluster_resources().get('CPU', 0):g} CPUs, "
        f"{ray.cluster_resources().get('GPU', 0):g} GPUs; one trial: "
        f"{trial_bundles(base, resources)}"
    )
    shared = shared_warm_start(spec)
    if shared is not None and shared.model.path is None:  # once here, not in every trial
        echo(f"warm start, seed {shared.experiment.seed} (cached after the first time) ...")
        preflight.resolve_model(shared, display.warm_start if display is not None else None)
    elif shared is None and base.model.path is None:  # a user's model has no warm start
        echo("warm starts: each trial builds its own (cached after the first time)")


#: The sections whose fields can change the policy a trial warm-starts (its recipe).
RECIPE_SECTIONS = ("experiment", "model", "env", "rollout")


def shared_warm_start(spec: SweepSpec):
    """The config whose warm start every trial uses, or None when the trials' differ (a
    grid over seeds) or a range over a field of the recipe leaves them unknown.  The
    base config's own warm start is not always one of them: a grid of one seed, as a
    sweep run in parts has, replaces the base's seed."""
    from ...policy.load import recipe, recipe_key

    paths = [p for p in spec.sweep.space if p.split(".")[0] in RECIPE_SECTIONS]
    if any(spec.sweep.space[p].values is None for p in paths):
        return None
    cases = {}
    for _, cfg in spec.combinations(paths):
        cases.setdefault(
            recipe_key(
                recipe(cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens)
            ),
            cfg,
        )
    return next(iter(cases.values())) if len(cases) == 1 else None


def _parent_options(spec: SweepSpec, place: _Place, echo) -> dict:
    """The parent Tracker's experiment, artifact root and spool.  Its writes the server
    does not take wait in the sweep's directory (the children spool into their own output
    directories, as any run does)."""
    from ..tracking.tracker import SPOOL_DIRNAME

    base = spec.base
    return {
        "experiment": base.experiment.name,
        "artifact_root": Path(base.experiment.output_dir) / "artifacts",
        "spool_root": place.experiment / SPOOL_DIRNAME,
        "settings": base.tracking,
        "notify": echo,
    }


def _resumed_parent(spec: SweepSpec, place: _Place, state: dict, echo):
    from ..tracking.tracker import Tracker

    return Tracker(
        state["tracking_uri"], run_id=state["parent_run_id"], **_parent_options(spec, place, echo)
    )


def _new_parent(spec: SweepSpec, place: _Place, echo):
    """The sweep's MLflow parent run: its tags, params (the sweep section), the spec as
    artifacts, and the state file ``--resume`` reads."""
    from ..environment import environment_tags
    from ..tracking.tracker import Tracker

    sweep, uri = spec.sweep, spec.base.tracking_uri()
    tags = {
        "sweep.name": spec.name,
        "sweep.search": sweep.search,
        "sweep.metric": sweep.metric,
        "sweep.fields": ",".join(sweep.space),
        "tether.kind": "sweep",
        **environment_tags(),
    }
    parent = Tracker(uri, run_name=spec.name, tags=tags, **_parent_options(spec, place, echo))
    parent.log_params(
        {f"sweep.{k}": v for k, v in sweep.model_dump(mode="json").items() if k != "space"}
        | {
            f"sweep.space.{p}": json.dumps(d.model_dump(exclude_none=True))
            for p, d in sweep.space.items()
        }
    )
    source = Path(spec.source)
    parent.log_text(source.read_text() if source.is_file() else "", "sweep_spec.yaml")
    parent.log_text(spec.to_json(), "sweep_spec_resolved.json")
    base = swept_fields(spec) if spec.sweep.design == "one_at_a_time" else None
    parent.log_text(json.dumps(base), "sweep_base.json")  # read by analysis/source.py
    place.experiment.mkdir(parents=True, exist_ok=True)
    state = {"parent_run_id": parent.run_id, "tracking_uri": uri, "spec": spec.to_json()}
    place.state_file.write_text(json.dumps(state, indent=1))
    return parent


def _tuner(spec: SweepSpec, place: _Place, ids: tuple, resume: bool):
    """Tune's tuner over ``run_trial`` (each trial in its placement group), new or
    restored (unfinished and errored trials run again)."""
    from ray import tune
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    spec_json = spec.to_json()
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec_json=spec_json, parent_run_id=ids[2]),
        lambda config: PlacementGroupFactory(
            trial_bundles(spec.build(decode(spec, config)), spec.sweep.resources)
        ),
    )
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")  # state saved often: resumable
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the compact table of reporter()
    if resume:
        return tune.Tuner.restore(
            str(place.experiment), trainable, resume_unfinished=True, restart_errored=True
        )
    run_config = tune.RunConfig(
        name=spec.name,
        storage_path=str(place.storage),
        verbose=1,
        callbacks=[SweepProgress(*ids, spec_json)],
        progress_reporter=reporter(spec),
        failure_config=tune.FailureConfig(max_failures=0),
        # each report's pointer to the trial's run (trial.py): the newest two kept
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
    )
    return tune.Tuner(
        trainable,
        param_space=param_space(spec),
        tune_config=tune_config(spec),
        run_config=run_config,
    )


def _finish(spec: SweepSpec, place: _Place, parent, echo, seconds: float) -> SweepOutcome:
    """The results table (CSV, and an artifact of the parent), the parent's last tags and
    status.  The saved experiment state is the truth: an interrupted run leaves trials
    unfinished (in memory Tune marks them TERMINATED while shutting down).  MLflow is
    read and written the spool's way (``end_of_sweep``): a server that is away is waited
    for, and the parent's writes spool."""
    from ray import tune

    from ..tracking.tracker import SPOOL_DIRNAME

    sweep = spec.sweep
    trials = tune.ExperimentAnalysis(str(place.experiment)).trials
    errored = sum(t.status == "ERROR" for t in trials)
    interrupted = len(trials) < expected_trials(spec) or any(
        t.status not in ("TERMINATED", "ERROR") for t in trials
    )
    rows = end_of_sweep(
        parent,
        Path(spec.base.experiment.output_dir) / SPOOL_DIRNAME,  # where trials spool
        echo,
        sweep.metric,
        sweep.mode,
        sweep.collapse_penalty,
        sweep.collapse_alarms(),
    )
    if rows is not None:
        write_results_csv(rows, sweep.metric, place.experiment / RESULTS_FILE)
        parent.log_artifact(place.experiment / RESULTS_FILE)
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
        place.experiment,
        rows or [],
        len(trials),
        seconds,
        parent.experiment_id,
    )
