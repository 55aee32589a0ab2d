"""One config tree for a Tether run, validated before anything starts.

Loaded from YAML with dotted command-line overrides::

    tether run experiments/quickstart.yaml algo.kl_coef=0.01 rollout.group_size=8

Every field has a default and a description (the CLI's help); a wrong key or value
fails at once with the field's dotted path in the message.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from ..algos.settings import AlgoConfig, FilterConfig
from ..diagnostics.settings import AlarmsConfig, DiagnosticsConfig
from ..envs.sandbox.isolation import SandboxConfig
from ..envs.settings import EnvConfig
from ..policy.settings import ModelConfig, WarmStartConfig
from ..rollout.settings import RolloutConfig
from ..sections import StrictSection
from .tracking.retention import RetentionConfig

__all__ = [
    "ConfigError",
    "DiagnosticsConfig",
    "EnvConfig",
    "ModelConfig",
    "TetherConfig",
    "WarmStartConfig",
    "build_config",
    "default_tracking_uri",
    "describe_fields",
    "load_config",
    "tracking_uri",
]


class ExperimentConfig(StrictSection):
    name: str = Field("tether", description="MLflow experiment name.")
    run_name: str | None = Field(None, description="MLflow run name (default: env-algo-seed).")
    seed: int = Field(0, description="Global seed: env levels, sampling and init derive from it.")
    output_dir: Path = Field(
        Path("tether_runs"),
        description="Where checkpoints, the default MLflow database and artifacts are written.",
    )


class TrainerConfig(StrictSection):
    iterations: int = Field(30, ge=1, description="Training iterations.")
    val_every: int = Field(
        10,
        ge=1,
        description="Validate on held-out seeds every N iterations (and at the start and end).",
    )
    val_episodes: int = Field(128, ge=1, description="Held-out episodes per validation.")
    val_temperature: float | None = Field(
        None, ge=0.0, description="Validation temperature (default: the rollout temperature)."
    )
    checkpoint_every: int = Field(
        10,
        ge=0,
        description="Checkpoint every N iterations and at the end, and at iteration 1 when "
        "an alarm acts (a rollback target from the start) (0 = never: no resume, "
        "learner restart or rollback; for measurement runs, whose learner state passes "
        "through the driver: 6 GB for a 0.5 B model with AdamW in float32).",
    )
    checkpoint_errors: Literal["warn", "stop"] = Field(
        "warn",
        description="A checkpoint that cannot be written (disk full, any OS error): "
        "'warn' keeps training (the last good checkpoint stays, named in the warning); "
        "'stop' ends the run cleanly (status FAILED, stop reason names the error and the "
        "last good checkpoint). The partial file is removed either way.",
    )
    max_learner_restarts: int = Field(
        3,
        ge=0,
        description="A learner rank that dies is "
        "rebuilt from the last checkpoint and the lost "
        "iterations re-run, up to N times per run (0: a dead "
        "learner ends the run).",
    )
    learner_restart_backoff_s: float = Field(
        2.0, ge=0, description="Wait before the k-th learner rebuild: N * 2^(k-1) seconds."
    )
    samples_every: int = Field(
        5,
        ge=1,
        description="Log sample transcripts and the per-prompt rewards "
        "(prompts/iter_N.json, for the report's heatmaps) every N iterations and at "
        "iteration 1 (the per-prompt rewards also at the last).",
    )
    samples_per_log: int = Field(4, ge=0, description="Transcripts per sample artifact.")
    metrics_every: int = Field(
        1,
        ge=1,
        description="Log an iteration's metrics to MLflow every N iterations, at iteration "
        "1 and the last, and at every iteration that ran diagnostics, gradient SNR or a "
        "validation (the alarms, the checkpoints and the console see every iteration). "
        "The MLflow database grows about linearly with the iterations logged: 3.0 MB per "
        "40 iterations of the collapse pilot's runs (about 550 metrics), so N = 10 "
        "keeps a run of thousands of iterations to tens of MB (docs/configuration.md).",
    )


def default_tracking_uri(output_dir: Path) -> str:
    """The SQLite MLflow store of an output directory (absolute)."""
    return f"sqlite:///{(Path(output_dir).expanduser().resolve() / 'mlflow.db').as_posix()}"


def tracking_uri(uri: str | None, output_dir: Path | None = None) -> str:
    """The one default rule of the tracking URI: ``uri`` when given, else the SQLite store
    in ``output_dir`` (default: ``experiment.output_dir``'s default)."""
    if uri:
        return uri
    return default_tracking_uri(ExperimentConfig().output_dir if output_dir is None else output_dir)


class TrackingConfig(StrictSection):
    uri: str | None = Field(
        None, description="MLflow tracking URI (default: a SQLite file in experiment.output_dir)."
    )
    log_model: bool = Field(True, description="Log the final policy as an artifact.")
    spool: bool = Field(
        True,
        description="When the tracking server does not take a write "
        "(unreachable, 5xx), keep training and spool the run's writes to "
        "experiment.output_dir/tracking_spool/<run id>/ (JSONL + artifact "
        "copies); they are replayed in order when the server answers again, "
        "at the end of the run and on `tether run --resume`. False: such a "
        "write fails the run.",
    )
    probe_every_s: float = Field(
        10.0,
        gt=0,
        description="While spooling, probe the server's "
        "/health at most every N seconds (writes in between go "
        "straight to the spool).",
    )
    drain_timeout_s: float = Field(
        120.0,
        ge=0,
        description="At the end of a run, wait up to N "
        "seconds for the spool to drain before leaving it on disk "
        "(replay later with `tether sync-tracking DIR`); the run's "
        "final status is set only once it has drained.",
    )
    http_max_retries: int = Field(
        2,
        ge=0,
        le=10,
        description="Default for MLflow's "
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES with an HTTP tracking URI "
        "and the spool on (MLflow's own default, 7 with backoff "
        "factor 2, stalls a write for minutes; an environment "
        "variable the user set wins).",
    )
    http_timeout_s: int = Field(
        10,
        ge=1,
        description="Default for MLFLOW_HTTP_REQUEST_TIMEOUT "
        "(seconds per request; MLflow's default is 120).",
    )
    http_backoff_factor: int = Field(
        1,
        ge=0,
        description="Default for MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR (MLflow's default is 2).",
    )


class RayConfig(StrictSection):
    address: str | None = Field(
        None, description="Ray cluster address (None: start a local Ray on 127.0.0.1)."
    )
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs of a local Ray (default: enough for the actors asked for)."
    )
    task_events_in_gcs: int | None = Field(
        1000,
        ge=1,
        description="A local Ray's GCS keeps the status events of at most this many "
        "task attempts, and remembers as many evicted ones (every actor method call "
        "is one; Ray's default, 100000, is about 350 MB of the GCS server's memory, "
        "reached after thousands of iterations); None: Ray's defaults or their RAY_ "
        "variables. A cluster joined keeps its own.",
    )
    malloc_mmap_threshold: int | None = Field(
        None,
        ge=0,
        description="MALLOC_MMAP_THRESHOLD_ (bytes) in the environment of every Ray worker "
        "the run starts (its actors): glibc then serves larger allocations by mmap and "
        "hands them back when freed instead of keeping them in arenas (65536 held the "
        "learner's memory flat in the 2026-11-27 soak), at a cost: the micro config's "
        "iterations 1.29x slower with 65536 (benchmarks/RESULTS.md, 'Soak'). None (the "
        "default): the environment's own, or glibc's adaptive default.",
    )
    autoscaler_wait_s: float = Field(
        120.0,
        ge=0,
        description="Joining a cluster that cannot "
        "fit the run yet and whose autoscaler has not published its "
        "node types (it does so some time after the cluster starts): "
        "wait up to this long for them before refusing (0 = refuse "
        "at once).",
    )


class TetherConfig(StrictSection):
    experiment: ExperimentConfig = Field(default_factory=ExperimentConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    filter: FilterConfig = Field(default_factory=FilterConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    alarms: AlarmsConfig = Field(default_factory=AlarmsConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    @model_validator(mode="after")
    def _cross_field(self):
        if self.rollout.group_size < 2 and self.algo.advantage in ("grpo", "drgrpo", "rloo"):
            raise ValueError("rollout.group_size must be ≥ 2 for group-relative advantages")
        if self.rollout.engine == "vllm" and not self.algo.recompute_old_logprobs:
            raise ValueError(
                "rollout.engine vllm needs algo.recompute_old_logprobs: true (vLLM's "
                "log-probs differ numerically from the learner's)"
            )
        from ..envs import check_env

        check_env(self.env.id, self.env.kwargs)
        self._check_demonstration_options()
        return self

    def _check_demonstration_options(self) -> None:
        """A warm start's demonstration options (``restate``, ``weigh``) that the env's
        demonstrator does not take fail here, before Ray starts or the warm start runs."""
        from ..envs import require_demonstration_options

        ws = self.model.warm_start
        if self.model.path is None and ws.episodes > 0:
            require_demonstration_options(
                self.env.id, [o for o in ("restate", "weigh") if getattr(ws, o)]
            )

    def tracking_uri(self) -> str:
        """``tracking.uri``, else the SQLite store in ``experiment.output_dir``."""
        return tracking_uri(self.tracking.uri, self.experiment.output_dir)

    def actor_resources(self) -> dict[str, float]:
        """CPUs and GPUs of all the run's actors together (the sum of ``resource_demands``):
        what a local Ray must have, and a sweep trial's actor bundle."""
        demands = self.resource_demands()
        return {
            "CPU": sum(d.count * d.cpus for d in demands),
            "GPU": sum(d.count * d.gpus for d in demands),
        }

    def resource_demands(self) -> list:
        """The Ray actors the run starts and the CPUs/GPUs each asks for."""
        from .session import ResourceDemand

        r, a = self.rollout, self.algo
        return [
            ResourceDemand(
                "rollout worker",
                "rollout.num_workers",
                r.num_workers,
                "rollout.num_cpus_per_worker",
                r.num_cpus_per_worker,
                "rollout.num_gpus_per_worker",
                r.num_gpus_per_worker,
            ),
            ResourceDemand(
                "learner rank",
                "algo.learner_world_size",
                a.learner_world_size,
                "algo.num_cpus",
                a.num_cpus,
                "algo.num_gpus",
                a.num_gpus,
            ),
        ]

    def env_kwargs(self) -> dict[str, Any]:
        """The env's constructor arguments: stochasticity, format penalty, ``env.kwargs``,
        and ``isolation`` from ``sandbox`` for an env that runs model-written code."""
        from ..envs import runs_untrusted_code

        kwargs = {
            "stochasticity": self.env.stochasticity,
            "format_penalty": self.env.format_penalty,
            **self.env.kwargs,
        }
        if runs_untrusted_code(self.env.id):
            kwargs["isolation"] = self.sandbox.isolation
        return kwargs

    def flat(self) -> dict[str, Any]:
        """The resolved config as dotted keys (MLflow params, sweep spaces)."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if (
                isinstance(value, dict)
                and value
                and prefix not in ("env.kwargs", "rollout.engine_kwargs")
            ):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                out[prefix] = value

        walk("", self.model_dump(mode="json"))
        return out


class ConfigError(ValueError):
    """A config that cannot run; the message names the field's dotted path."""


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(
            f"{path}: {msg}" + (" (unknown key)" if e["type"] == "extra_forbidden" else "")
        )
    return "; ".join(lines)


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return path, value


def set_dotted(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


def build_config(data: dict | None = None, overrides: list[str] | None = None) -> TetherConfig:
    """Validate a config tree plus dotted overrides; raise ConfigError with field paths.
    ``data`` is not changed (the overrides go into a deep copy)."""
    tree = copy.deepcopy(data or {})
    for text in overrides or []:
        path, value = parse_override(text)
        set_dotted(tree, path, value)
    try:
        return TetherConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TetherConfig:
    """Read a YAML experiment file (or none: the embedded defaults) plus overrides."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML ({exc})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        data = loaded or {}
        data.pop("sweep", None)  # a sweep spec is a run config plus a sweep section
    return build_config(data, overrides)


def describe_fields(config: BaseModel | None = None, prefix: str = ""):
    """(dotted path, default, description) of every leaf field: the config's help.

    The defaults are those of ``config`` (default: ``TetherConfig()``), i.e. after the
    default preset has filled the ``algo`` fields it sets: what a run really uses."""
    config = TetherConfig() if config is None else config
    rows = []
    for name, field in type(config).model_fields.items():
        path, value = f"{prefix}{name}", getattr(config, name)
        if isinstance(value, BaseModel):
            rows += describe_fields(value, path + ".")
        else:
            if isinstance(value, list) and any(isinstance(v, BaseModel) for v in value):
                value = [v.model_dump() if isinstance(v, BaseModel) else v for v in value]
            rows.append((path, value, field.description or ""))
            section = _optional_section(field.annotation) if value is None else None
            if section is not None:  # an optional section that is off: its fields, if set
                rows += [
                    (sub, default, f"{text} (when {path} is set)")
                    for sub, default, text in describe_fields(section(), path + ".")
                ]
    return rows


def _optional_section(annotation) -> type[BaseModel] | None:
    """The section class of a ``Section | None`` field (e.g. ``model.lora``), else None."""
    import typing

    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None
