"""Sweep specs: a run config plus a ``sweep:`` section, validated before any trial starts.

    experiment: {name: tether-sensitivity}
    ...                                   # the run config every trial starts from
    sweep:
      search: grid                        # grid | random | optuna (TPE)
      space:
        algo.kl_coef: {grid: [0.0, 0.01, 0.1]}
        algo.lr: {loguniform: [1.0e-5, 1.0e-3]}
        filter: {grid: [{strategy: none}, {strategy: top_p, mode: softmax}]}
      metric: rollout/success             # reported by every iteration
      mode: max

A space key is a dotted path into the config tree (``tether config`` prints the tree);
a section path (``filter``) takes mappings that are merged into the section. Every
grid/choice value and every range endpoint is checked by building the config with it,
so a bad path or value fails at once with the field's path in the message.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from ...diagnostics.settings import ALARM_NAMES
from ...sections import StrictSection
from ..config import ConfigError, TetherConfig, build_config, parse_override, set_dotted


class Distribution(StrictSection):
    """Exactly one of the keys: how one config field is varied."""

    grid: list[Any] | None = Field(
        None,
        description="Every value, each in its own trial "
        "(times num_samples); search grid or random.",
    )
    choice: list[Any] | None = Field(None, description="One value drawn per trial.")
    uniform: tuple[float, float] | None = Field(None, description="[lo, hi] drawn uniformly.")
    loguniform: tuple[float, float] | None = Field(
        None, description="[lo, hi] drawn log-uniformly (lo > 0)."
    )
    randint: tuple[int, int] | None = Field(
        None, description="[lo, hi] integers, both ends included."
    )

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [
            k
            for k in ("grid", "choice", "uniform", "loguniform", "randint")
            if getattr(self, k) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of grid, choice, uniform, loguniform, randint"
                f" (got {', '.join(given) or 'none'})"
            )
        if self.values is not None and not self.values:
            raise ValueError(f"{self.kind} needs at least one value")
        if self.bounds is not None:
            lo, hi = self.bounds
            if not (lo <= hi if self.kind == "randint" else lo < hi):
                raise ValueError(f"{self.kind} needs lo < hi (got [{lo}, {hi}])")
            if self.kind == "loguniform" and lo <= 0:
                raise ValueError(f"loguniform needs lo > 0 (got {lo})")
        return self

    @property
    def kind(self) -> str:
        return next(
            k
            for k in ("grid", "choice", "uniform", "loguniform", "randint")
            if getattr(self, k) is not None
        )

    @property
    def values(self) -> list[Any] | None:
        return self.grid if self.grid is not None else self.choice

    @property
    def bounds(self) -> tuple[float, float] | None:
        return self.uniform or self.loguniform or self.randint

    def candidates(self) -> list[Any]:
        """The values validation tries: every listed value, or both range endpoints."""
        return list(self.values) if self.values is not None else list(self.bounds)


class AshaSpec(StrictSection):
    max_t: int | None = Field(
        None, ge=1, description="Iterations a trial may run (default: trainer.iterations)."
    )
    grace_period: int = Field(1, ge=1, description="Iterations before a trial can be stopped.")
    reduction_factor: float = Field(
        2.0, gt=1.0, description="Keep 1/reduction_factor of trials at each rung."
    )


class SchedulerSpec(StrictSection):
    asha: AshaSpec | None = Field(
        None, description="Async successive halving: stop weak trials early on the sweep metric."
    )


class CollapseStop(StrictSection):
    alarms: list[Literal[ALARM_NAMES]] = Field(
        default_factory=lambda: ["template_collapse", "low_entropy_collapse"],
        description="alarms that end a trial, by their own rules (alarms.*); default the MI alarms",
    )
    points: int = Field(
        3,
        ge=1,
        description=(
            "breaching observations before the trial ends: each listed alarm runs in stop mode "
            "with patience = points (MI alarms: diagnostic points at which MI lies significantly "
            "below its grounded reference, among the last max(points, within))"
        ),
    )


class TrialResources(StrictSection):
    cpu: float = Field(
        0.25,
        ge=0.0,
        description="CPUs of the trial's own process (the "
        "driver loop); its actors' CPUs come from rollout.* and algo.*.",
    )
    gpu: float = Field(0.0, ge=0.0, description="GPUs of the trial's own process.")


class SweepConfig(StrictSection):
    name: str | None = Field(
        None,
        description="Sweep name: the MLflow parent run and the "
        "Tune experiment directory (default: the spec file's stem).",
    )
    space: dict[str, Distribution] = Field(description="Dotted config path -> distribution.")
    design: Literal["product", "one_at_a_time"] = Field(
        "product",
        description="product: every combination; one_at_a_time: each grid "
        "varied alone, the other fields at their base values (sensitivity studies).",
    )
    search: Literal["grid", "random", "optuna"] = Field(
        "grid", description="grid/random: Tune's variant generator; optuna: TPE."
    )
    metric: str = Field(
        "rollout/success",
        description="Metric ranked and optimised; it must "
        "be reported by every iteration (val/* is only reported every "
        "trainer.val_every iterations).",
    )
    mode: Literal["max", "min"] = Field("max", description="Maximise or minimise the metric.")
    num_samples: int = Field(1, ge=1, description="Trials drawn (grid: repeats of the grid).")
    max_concurrent: int | None = Field(
        None,
        ge=1,
        description="Trials at once (default: as many as the cluster's resources allow).",
    )
    resources: TrialResources = Field(default_factory=TrialResources)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    seed: int | None = Field(None, description="Search seed (default: experiment.seed).")
    stop_collapsed: CollapseStop | None = Field(
        None,
        description=(
            "End a trial once its MI has collapsed significantly (it finishes cleanly with a "
            "checkpoint; tether.stop_reason names the alarm); the results table flags collapsed "
            "trials."
        ),
    )
    collapse_penalty: float | None = Field(
        None,
        ge=0,
        description=(
            "Rank trials by the metric minus this (mode min: plus) when the trial collapsed (an "
            "alarm of stop_collapsed, default the MI alarms, fired); the table shows this "
            "objective beside the metric."
        ),
    )

    def collapse_alarms(self) -> tuple[str, ...]:
        """The alarms whose firing marks a trial collapsed."""
        return (
            tuple(self.stop_collapsed.alarms)
            if self.stop_collapsed
            else ("template_collapse", "low_entropy_collapse")
        )

    storage_path: Path | None = Field(
        None,
        description="Where Tune keeps the sweep's state (default: <experiment.output_dir>/sweeps).",
    )
    checkpoint_every: int = Field(
        1,
        ge=0,
        description=(
            "Each trial's checkpoint cadence in iterations (in place of the base's "
            "trainer.checkpoint_every): a trial interrupted and continued with "
            "`tether sweep --resume` goes on from its last checkpoint, so 1 loses at most one "
            "iteration; 0 keeps the base's cadence."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self):
        if not self.space:
            raise ValueError("space is empty: name at least one config field to vary")
        kinds = {path: d.kind for path, d in self.space.items()}
        if self.search == "optuna":
            grids = [p for p, k in kinds.items() if k == "grid"]
            if grids:
                raise ValueError(
                    f"search optuna cannot enumerate grid ({', '.join(grids)}); "
                    "use choice, or search grid"
                )
        if self.design == "one_at_a_time":
            if self.search == "optuna":
                raise ValueError("design one_at_a_time needs search grid or random")
            ranges = [p for p, k in kinds.items() if k != "grid"]
            if ranges:
                raise ValueError(
                    f"design one_at_a_time varies grids only ({', '.join(ranges)} is not a grid)"
                )
        return self


def _field_kind(path: str) -> str:
    """'leaf', 'section' or 'dict' (a free-form mapping like env.kwargs) for a dotted path;
    raises ConfigError naming the first part that does not exist."""
    model: Any = TetherConfig
    parts = path.split(".")
    for i, part in enumerate(parts):
        fields = getattr(model, "model_fields", None)
        if fields is None:
            raise ConfigError(
                f"sweep.space.{path}: {'.'.join(parts[:i])} is not a section "
                "(it has no fields below it)"
            )
        if part not in fields:
            where = ".".join(parts[:i]) or "the config"
            valid = ", ".join(sorted(fields))
            raise ConfigError(f"sweep.space.{path}: no field {part!r} in {where} (valid: {valid})")
        annotation = fields[part].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            continue
        if getattr(annotation, "__origin__", None) is dict or annotation is dict:
            return "dict"  # env.kwargs.size: any key below a free-form mapping
        if i != len(parts) - 1:
            raise ConfigError(
                f"sweep.space.{path}: {'.'.join(parts[: i + 1])} is a value, not a section"
            )
        return "leaf"
    return "section"


def apply_values(tree: dict, values: dict[str, Any]) -> dict:
    """A copy of ``tree`` with each dotted path set; a mapping value is merged into the
    section (or free-form mapping) at its path."""
    out = copy.deepcopy(tree)
    for path, value in values.items():
        parts = path.split(".")
        if not isinstance(value, dict):
            set_dotted(out, parts, copy.deepcopy(value))
            continue
        node = out
        for part in parts:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node.update(copy.deepcopy(value))
    return out


class SweepSpec:
    """A validated sweep: the base run tree, its config, and the sweep section."""

    def __init__(self, base_tree: dict, sweep: SweepConfig, source: str = "<dict>") -> None:
        self.base_tree, self.sweep, self.source = base_tree, sweep, source
        self.base = build_config(copy.deepcopy(base_tree))
        self._check_space()
        asha = sweep.scheduler.asha
        if asha is not None and asha.grace_period > (asha.max_t or self.base.trainer.iterations):
            raise ConfigError(
                f"sweep.scheduler.asha.grace_period: {asha.grace_period} is more "
                f"than max_t ({asha.max_t or self.base.trainer.iterations}, "
                "default trainer.iterations)"
            )

    @property
    def name(self) -> str:
        return self.sweep.name or Path(self.source).stem

    def _check_space(self) -> None:
        for path, dist in self.sweep.space.items():
            kind = _field_kind(path)
            values = dist.candidates()
            if kind == "section" and not all(isinstance(v, dict) for v in values):
                raise ConfigError(
                    f"sweep.space.{path}: {path} is a section; its values must "
                    "be mappings of its fields"
                )
            if kind == "section" and dist.bounds is not None:
                raise ConfigError(f"sweep.space.{path}: a section takes grid or choice")
            for value in values:
                self.build({path: value}, context=f"sweep.space.{path}: value {value!r}")

    def build(self, values: dict[str, Any], context: str | None = None) -> TetherConfig:
        """The config of one trial: the base tree with ``values`` substituted."""
        try:
            return build_config(apply_values(self.base_tree, values))
        except ConfigError as exc:
            reason = str(exc).replace("<root>: ", "")  # cross-field rules name their fields
            raise ConfigError(f"{context or 'sweep values'} is refused: {reason}") from None

    def resource_cases(self) -> list[tuple[dict[str, Any], TetherConfig]]:
        """(values, config) for every combination of candidate values of the fields that
        decide a trial's resources (so the largest trial is checked against the cluster)."""
        prefixes = (
            "rollout",
            "rollout.num_workers",
            "rollout.num_cpus_per_worker",
            "rollout.num_gpus_per_worker",
            "algo",
            "algo.num_cpus",
            "algo.num_gpus",
        )
        return self.combinations([p for p in self.sweep.space if p in prefixes])

    def combinations(self, paths: list[str]) -> list[tuple[dict[str, Any], TetherConfig]]:
        """(values, config) for every combination of the candidate values of ``paths``."""
        combos = itertools.product(*(self.sweep.space[p].candidates() for p in paths))
        return [(values, self.build(values)) for values in (dict(zip(paths, c)) for c in combos)]

    def to_json(self) -> str:
        return json.dumps(
            {
                "source": self.source,
                "base_tree": self.base_tree,
                "sweep": self.sweep.model_dump(mode="json"),
            },
            indent=1,
            default=str,
        )

    @classmethod
    def from_json(cls, text: str) -> SweepSpec:
        data = json.loads(text)
        return cls(data["base_tree"], SweepConfig.model_validate(data["sweep"]), data["source"])


def _absolute_paths(tree: dict) -> None:
    """Make output and cache directories absolute: trials run in other processes (and,
    under ``ray job submit``, in another working directory), and must share them."""
    for section, key, default in (
        ("experiment", "output_dir", "tether_runs"),
        ("model", "cache_dir", None),
    ):
        node = tree.setdefault(section, {})
        value = node.get(key, default)
        if value is not None:
            node[key] = str(Path(value).expanduser().resolve())


def _sweep_error(error: dict) -> str:
    path = ".".join(["sweep", *(str(p) for p in error["loc"])])
    message = error["msg"].removeprefix("Value error, ")
    return f"{path}: {message}" + (" (unknown key)" if error["type"] == "extra_forbidden" else "")


def _space_keys(data: dict, keys: list[str], value) -> list[str]:
    """An override's path, with a dotted name under ``sweep.space`` kept whole: the space's
    keys are config paths (``experiment.seed``), so ``sweep.space.experiment.seed={grid:
    [1, 2]}`` sets that entry and ``sweep.space.experiment.seed.grid=[1, 2]`` its grid.
    The longest prefix that names an existing entry wins; a new entry is the whole
    remainder when the value is a mapping (an entry always is)."""
    if keys[:2] != ["sweep", "space"] or len(keys) < 4:
        return keys
    rest = keys[2:]
    space = (data.get("sweep") or {}).get("space") or {}
    for end in range(len(rest), 1, -1):
        if ".".join(rest[:end]) in space:
            return ["sweep", "space", ".".join(rest[:end]), *rest[end:]]
    return ["sweep", "space", ".".join(rest)] if isinstance(value, dict) else keys


def load_sweep_spec(path: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    """Read a sweep spec YAML plus dotted overrides (``sweep.num_samples=8`` works too)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sweep spec {str(p)!r} not found")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    for text in overrides or []:
        keys, value = parse_override(text)
        set_dotted(data, _space_keys(data, keys, value), value)
    raw_sweep = data.pop("sweep", None)
    if not isinstance(raw_sweep, dict):
        raise ConfigError(
            f"{p}: a sweep spec needs a 'sweep:' section (see experiments/sensitivity.yaml)"
        )
    try:
        sweep = SweepConfig.model_validate(raw_sweep)
    except ValidationError as err:
        raise ConfigError("; ".join(_sweep_error(e) for e in err.errors())) from None
    _absolute_paths(data)
    return SweepSpec(data, sweep, str(p))


def swept_fields(spec: SweepSpec) -> dict[str, Any]:
    """Every dotted leaf any trial varies (a section's mappings may name different fields),
    mapped to its base value; each child run is tagged with its own value of each."""
    base = spec.base.flat()
    paths = dict.fromkeys(
        k
        for path, d in spec.sweep.space.items()
        for v in d.candidates()
        for k in flat_values({path: v})
    )
    return {k: base.get(k) for k in paths}


def flat_values(values: dict[str, Any]) -> dict[str, Any]:
    """Swept values as dotted leaves (a section's mapping becomes one entry per field)."""
    out = {}
    for path, value in values.items():
        if isinstance(value, dict):
            out.update({f"{path}.{k}": v for k, v in flat_values(value).items()})
        else:
            out[path] = value
    return out
