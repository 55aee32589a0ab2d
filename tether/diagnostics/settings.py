"""The diagnostics' settings: the ``diagnostics`` and ``alarms`` sections of the run
config, and the act-mode responses an alarm may take, as ``algos/settings.py`` holds the
``algo`` and ``filter`` sections.

One pydantic model per group, nested into the run config (``tether.platform.config``).
``Knobs`` is the controller's view of the settings a response changes (the filter's
strategy and value, the KL and entropy coefficients, the learning rate: the driver's
``LiveSettings``); each response's ``apply`` returns new knobs.  The controller that
takes the responses is ``control.py`` (``Controller.from_config(alarms)``).
This module imports neither torch nor Ray (the uncertainty settings' object is imported
when asked for), so a config is validated without either.

See docs/methods.md, sections 2 (diagnostics) and 4 (alarms and responses).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal, Protocol

from pydantic import Field, create_model, model_validator

from ..algos.filters import FILTER_STRATEGIES
from ..sections import StrictSection

if TYPE_CHECKING:
    from .uncertainty import Uncertainty


# ------------------------------------------------------------------ diagnostics


class ProbeConfig(StrictSection):
    """The diagnostic probe set: fixed held-out levels whose first turns the current
    policy samples at a diagnostic point, cross-scored like a sampling of the batch."""

    enabled: bool = Field(
        True,
        description="Sample and cross-score the probe set at its cadence (collapse/probe/...) "
        "and score its reading accuracy (grounding/...); docs/methods.md, section 2.",
    )
    levels: int = Field(
        64,
        ge=2,
        le=256,
        description="Probe levels: held-out seeds drawn once from env.val_seed_offset "
        "(tether.seeds.probe_levels), the same for every run, arm and seed of an env. "
        "One first turn each, all cross-scored (levels x levels cells), so I(X;Z) "
        "is bounded by log(levels) instead of log(batch prompts).",
    )
    every: int = Field(
        10,
        ge=1,
        description="Probe every N iterations (and at iteration 1), on diagnostic "
        "iterations (so it takes effect on multiples of diagnostics.every).",
    )
    outcome_samples: int = Field(
        0,
        ge=0,
        le=16,
        description="With k > 0, each probe level is also played to the end k times by the "
        "current policy at every probe point (k x levels full episodes; the first turn of "
        "the first is the one cross-scored): held-out success on the probe levels and where "
        "the probe's MI goes by each level's reward variance (mechanism/probe..., "
        "docs/methods.md, 'The mechanism, measured'). 0: first turns only.",
    )
    interval: Literal["same", "bootstrap", "jackknife", "log_jackknife"] = Field(
        "log_jackknife",
        description="The probe's interval: log_jackknife (leave one level out, the interval "
        "on each proxy's log scale, docs/methods.md section 3; at the probe's shape it held "
        "the median of each MI proxy in 0.93-0.97 of 1,000 known-answer batches: "
        "benchmarks/RESULTS.md, 'Interval coverage'), jackknife (the same on the linear "
        "scale; sequence MI 0.88), bootstrap, or same (diagnostics.interval's). The batch's "
        "proxies keep diagnostics.interval.",
    )


class DiagnosticsConfig(StrictSection):
    every: int = Field(
        10,
        ge=1,
        description="Cross-score MI diagnostics every N iterations "
        "(and at iteration 1); docs/methods.md, section 2. The default cadence (10; chain and "
        "heatmaps 20, gradient SNR 40) adds +8 % to the quickstart's iteration time "
        "(benchmarks/RESULTS.md, 'Collapse diagnostics overhead').",
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
        20,
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
    autocast: Literal["none", "bfloat16", "auto"] = Field(
        "auto",
        description="Precision of the cross-scoring forwards (batch proxies, probe set, "
        "information chain): bfloat16 autocast for the body, the vocabulary head and the "
        "log-softmax in float32; auto = bfloat16 where the device runs it natively (a CPU "
        "with AVX512-BF16 or AMX, a GPU that supports it), float32 elsewhere. On the "
        "quickstart's probe set the scoring ran 1.8-2.0x faster and I(X;Z) moved by at most "
        "4e-4 nats/token (benchmarks/RESULTS.md, 'Collapse diagnostics overhead').",
    )
    heatmap_every: int = Field(
        20,
        ge=1,
        description="Log the cross-score matrix as a heatmap every N iterations (and at "
        "iteration 1), on diagnostic iterations.",
    )
    grad_snr_every: int = Field(
        40,
        ge=0,
        description="Gradient SNR by reward-variance bucket "
        "every N iterations, not at iteration 1 (0 = off; docs/methods.md, section 10): "
        "one forward and two "
        "gradient passes over every collected trajectory (before "
        "filtering), about 1-2 updates' worth of compute; every 40 gives "
        "a 400-iteration run 10 analyses.",
    )
    grad_snr_buckets: int = Field(
        6, ge=1, description="RV quantile buckets of the gradient-SNR analysis."
    )
    enabled: bool = Field(
        True,
        description="Run the collapse diagnostics at all (cross-scoring, "
        "heatmaps and gradient SNR).",
    )
    interval: Literal["bootstrap", "jackknife", "log_jackknife"] = Field(
        "log_jackknife",
        description="Interval logged beside every MI proxy (<proxy>_ci_low / _ci_high), from "
        "the cross-score matrix (no model calls): log_jackknife (leave one prompt out, the "
        "Student-t interval on log(log N - MI), log H and, for the z-scores, their "
        "numerator's and denominator's log scales; retrieval keeps the bootstrap's), "
        "jackknife (the same on the linear scale) or bootstrap (percentile by prompt, biased "
        "low for MI and widened to hold the estimate; the default before 2026-11-28). "
        "Coverage of each and the alarms' quality with each: benchmarks/RESULTS.md, "
        "'Interval coverage' and 'Alarm quality'; docs/methods.md section 3.",
    )
    bootstrap: int = Field(
        1000,
        ge=0,
        description="Bootstrap resamples (by prompt) behind the bootstrap intervals (retrieval "
        "accuracy's under every interval). 0 = no bootstrap intervals (with interval: "
        "bootstrap, the template_collapse alarm then cannot judge).",
    )
    permutations: int = Field(
        1000,
        ge=0,
        description="Permutations of the test 'reasoning "
        "depends on the input' (which prompt each reasoning belongs to is "
        "shuffled): p_grounded, <proxy>_null_q95. 0 = no test.",
    )
    confidence: float = Field(
        0.95, gt=0.5, lt=1.0, description="Nominal coverage of the intervals."
    )
    alpha: float = Field(
        0.05,
        gt=0.0,
        lt=0.5,
        description="Significance level of the input-"
        "dependence test: 'grounded' = 1 when p_grounded < alpha.",
    )
    probe: ProbeConfig = Field(
        default_factory=ProbeConfig,
        description="The fixed held-out probe set, cross-scored beside the batch samplings.",
    )

    def uncertainty(self) -> Uncertainty:
        from dataclasses import fields

        from .uncertainty import Uncertainty

        return Uncertainty(**{f.name: getattr(self, f.name) for f in fields(Uncertainty)})

    def probe_uncertainty(self) -> Uncertainty:
        """The probe set's: the diagnostics' but for its own ``probe.interval``."""
        from dataclasses import replace

        own = self.probe.interval
        return replace(self.uncertainty(), interval=self.interval if own == "same" else own)


# ------------------------------------------------------------------ responses


@dataclass(frozen=True)
class Knobs:
    """The settings a response may change, as the run uses them now."""

    filter_strategy: str
    filter_value: float
    kl_coef: float
    entropy_coef: float
    lr: float

    def metrics(self) -> dict[str, float]:
        """``control/…`` metrics: the settings in force this iteration."""
        return {
            "control/filter_value": self.filter_value,
            "control/kl_coef": self.kl_coef,
            "control/entropy_coef": self.entropy_coef,
            "control/lr": self.lr,
        }


@dataclass(frozen=True)
class GroundedCheckpoint:
    """A checkpoint saved while MI was significantly above its null."""

    iteration: int
    path: str


class RunEffects(Protocol):
    """What a response may do to the run besides changing its knobs (the run's responder
    implements it: ``platform/run/alarm_responder.py``)."""

    def restore(self, path: str) -> None:
        """Load a checkpoint's weights and optimiser state and send the weights to the
        rollout workers."""


class _Response(StrictSection):
    times: int = Field(1, ge=1, description="how many times this response may be taken in a run")

    def effect(self, target: GroundedCheckpoint | None, run: RunEffects) -> None:
        """What taking this response does to the run besides its new knobs (``apply``'s):
        nothing, unless the response says otherwise (a rollback restores ``target``)."""

    @abc.abstractmethod
    def apply(
        self, knobs: Knobs, checkpoints: Sequence[GroundedCheckpoint], reference: int | None
    ) -> tuple[Knobs, GroundedCheckpoint | None] | None:
        """The new knobs (and a checkpoint to load), or None when this response has no effect."""

    @abc.abstractmethod
    def passed_over(self, knobs: Knobs, reference: int | None) -> str:
        """Why ``apply`` had no effect (said when the controller passes this response over)."""


class TightenFilter(_Response):
    """Train on fewer, higher-signal groups: top_p / top_k / top_k_abs value times ``factor``
    (not below ``floor``); min_p ratio divided by ``factor`` (not above 1); no filter becomes
    top_p at ``start``."""

    kind: Literal["tighten_filter"] = "tighten_filter"
    factor: float = Field(0.8, gt=0, lt=1)
    floor: float = Field(
        0.3, gt=0, description="lowest top_p ratio / top_k fraction (top_k_abs: 1 group)"
    )
    start: float = Field(0.9, gt=0, le=1, description="top_p ratio when the run had no filter")

    def apply(self, knobs, checkpoints, reference):
        strategy, value = knobs.filter_strategy, knobs.filter_value
        # each strategy says how it tightens (algos/filters.py)
        new = FILTER_STRATEGIES[strategy].tighten(value, self.factor, self.floor, self.start)
        if new is None or new == (strategy, value):
            return None
        return dataclasses.replace(knobs, filter_strategy=new[0], filter_value=new[1]), None

    def passed_over(self, knobs, reference):
        return f"the filter is at its bound ({knobs.filter_strategy} {knobs.filter_value:g})"


class _Raise(_Response):
    factor: float = Field(2.0, gt=1)
    initial: float = Field(0.001, gt=0, description="value taken when the coefficient is 0")
    ceiling: float = Field(0.1, gt=0)
    knob: ClassVar[str] = ""

    def apply(self, knobs, checkpoints, reference):
        value = getattr(knobs, self.knob)
        new = min(self.ceiling, value * self.factor if value > 0 else self.initial)
        if new <= value:
            return None
        return dataclasses.replace(knobs, **{self.knob: new}), None

    def passed_over(self, knobs, reference):
        return f"{self.knob} is at its ceiling {self.ceiling:g}"


class RaiseKl(_Raise):
    """Hold the policy nearer its initial (grounded) self: KL coefficient times ``factor``
    (``initial`` when it was 0: the learner then loads the reference policy)."""

    kind: Literal["raise_kl"] = "raise_kl"
    knob: ClassVar[str] = "kl_coef"


class RaiseEntropy(_Raise):
    """Entropy bonus times ``factor`` (``initial`` when it was 0)."""

    kind: Literal["raise_entropy"] = "raise_entropy"
    ceiling: float = Field(0.01, gt=0)
    knob: ClassVar[str] = "entropy_coef"


class Rollback(_Response):
    """Load the last checkpoint saved while MI was significantly above its null, at or before
    the alarm's reference point (weights and optimiser state), and multiply the learning
    rate by ``lr_factor``.  Uses the run's checkpoints (``trainer.checkpoint_every``)."""

    kind: Literal["rollback"] = "rollback"
    lr_factor: float = Field(0.5, gt=0, le=1)

    def apply(self, knobs, checkpoints, reference):
        eligible = [c for c in checkpoints if reference is None or c.iteration <= reference]
        if not eligible:
            return None
        target = max(eligible, key=lambda c: c.iteration)
        return dataclasses.replace(knobs, lr=knobs.lr * self.lr_factor), target

    def effect(self, target, run):
        run.restore(target.path)

    def passed_over(self, knobs, reference):
        where = "" if reference is None else f" at or before iteration {reference}"
        return f"no grounded checkpoint{where} to return to"


Response = Annotated[TightenFilter | RaiseKl | RaiseEntropy | Rollback, Field(discriminator="kind")]


class ControlConfig(StrictSection):
    cooldown: int = Field(
        3,
        ge=1,
        description=(
            "iterations after an action before the next (the diagnostics must see its effect: "
            "keep it at least diagnostics.every)"
        ),
    )
    max_actions: int = Field(4, ge=1, description="actions per run, over all alarms")


# ------------------------------------------------------------------ alarms


AlarmMode = Literal["off", "warn", "act", "stop"]
_MODE = (
    "off: not tracked; warn: record the event and continue; act: record it and, while it "
    "lasts, take the next of `actions` (tether.diagnostics.control); stop: record it, "
    "checkpoint and end the run"
)


class _OneAlarmConfig(StrictSection):
    #: The alarm's key under ``diagnostics.alarms`` and what it watches, in a line (the
    #: ``AlarmsConfig`` field's description): set by each alarm's settings class.
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    mode: AlarmMode = Field("warn", description=_MODE)
    actions: list[Response] = Field(
        default_factory=list,
        description=(
            "mode act: ordered responses (kind: tighten_filter | raise_kl | raise_entropy | "
            "rollback, each with its own bounds and `times`), taken one at a time while the "
            "alarm lasts; see alarms.control for the cooldown and the cap"
        ),
    )

    @model_validator(mode="after")
    def _act_needs_actions(self):
        if self.mode == "act" and not self.actions:
            raise ValueError(
                "mode 'act' needs at least one entry in `actions` (e.g. "
                "[{kind: tighten_filter}, {kind: rollback}])"
            )
        return self


class _MiEntropyConfig(_OneAlarmConfig):
    mi_metric: str = Field(
        "collapse/first_turn/mi_estimate",
        description=(
            "MI proxy watched for a fall; its interval is read from <mi_metric>_ci_low / _ci_high "
            "(the diagnostics' bootstrap). mi_estimate (nats/token, bounded by log N) by default: "
            "the z-scores divide by std(marginal), which is near zero for a near-deterministic "
            "policy, so they swing by orders of magnitude while nothing changes "
            "(benchmarks/alarm_quality.py)"
        ),
    )
    p_metric: str = Field(
        "collapse/first_turn/p_grounded",
        description=(
            "p-value of the input-dependence (permutation) test at the same diagnostic point"
        ),
    )
    entropy_metric: str = Field(
        "collapse/first_turn/conditional_entropy_est",
        description=(
            "within-input entropy H(Z|X), with its interval <entropy_metric>_ci_low / _ci_high"
        ),
    )
    window: int = Field(
        10,
        ge=2,
        description=(
            "diagnostic points kept; the reference (an earlier point where MI was significantly "
            "above its null) must lie within them"
        ),
    )
    alpha: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description=(
            "an earlier point is a reference only when MI was significantly above its permutation "
            "null there: p < alpha / window (Bonferroni over the points searched, so a point that "
            "is 'significant' by chance among the window's tests is not taken for grounding)"
        ),
    )
    min_references: int = Field(
        2,
        ge=1,
        description=(
            "earlier points in the window that must be significantly above the null before any is "
            "taken as a reference (2 = grounding replicated: one point significant by chance, "
            "as an input-blind policy shows at a rate of alpha / window, is not enough)"
        ),
    )
    patience: int = Field(
        2,
        ge=1,
        description=(
            "diagnostic points, among the last `within`, whose MI interval lies wholly below "
            "the reference's before the alarm fires (1 = the first separation)"
        ),
    )
    within: int = Field(
        3,
        ge=1,
        description=(
            "the last this many diagnostic points are searched for `patience` separated ones "
            "(= patience: consecutive points; at least patience).  2 of 3 catches a slow or "
            "partial collapse whose intervals separate at some points and touch at others "
            "(benchmarks/alarm_quality.py)"
        ),
    )
    min_drop_fraction: float = Field(
        0.25,
        ge=0,
        lt=1,
        description=(
            "the fall must also be at least this fraction of the reference value (a reference is "
            "significantly above its null, so never near zero): separated intervals alone would "
            "flag a fall of 1e-4 nats from a saturated MI of log N"
        ),
    )


class TemplateCollapseConfig(_MiEntropyConfig):
    """MI significantly above its null earlier, now fallen by more than the uncertainty of
    both estimates (the intervals separate), while H(Z|X) did not fall (its interval now is
    not wholly below the reference's)."""

    name: ClassVar[str] = "template_collapse"
    summary: ClassVar[str] = "MI falls while H(Z|X) stays flat or rises"

    actions: list[Response] = Field(
        default_factory=lambda: [TightenFilter(), Rollback()],
        description="mode act: train on higher-signal groups (the paper's remedy), then "
        "return to the last grounded checkpoint at a lower learning rate.  raise_kl / "
        "raise_entropy are options, not defaults: the paper (Theorem M.2) argues that KL "
        "and entropy regularisation do not prevent template collapse and can lower I(X;Z)",
    )


class LowEntropyCollapseConfig(_MiEntropyConfig):
    """As template_collapse, but H(Z|X) fell too (its interval now lies wholly below the
    reference's)."""

    name: ClassVar[str] = "low_entropy_collapse"
    summary: ClassVar[str] = "MI and H(Z|X) both fall"

    actions: list[Response] = Field(
        default_factory=lambda: [TightenFilter(), Rollback()],
        description="mode act: train on higher-signal groups, then the last grounded "
        "checkpoint (raise_entropy is an option: a larger bonus raises H(Z|X), but the "
        "paper's Theorem M.2 says it need not raise I(X;Z) and can lower it)",
    )


class RewardVarianceCollapseConfig(_OneAlarmConfig):
    name: ClassVar[str] = "reward_variance_collapse"
    summary: ClassVar[str] = "in-group reward std stays far below its baseline"

    actions: list[Response] = Field(
        default_factory=lambda: [TightenFilter(times=2)],
        description="mode act: train only on the groups whose reward spread carries signal",
    )
    metric: str = Field(
        "rollout/in_group_reward_std", description="mean in-group reward std of the batch"
    )
    baseline_iterations: int = Field(
        10, ge=1, description="first observations averaged into the baseline"
    )
    fraction: float = Field(
        0.1, gt=0, lt=1, description="breach when the metric is below this fraction of the baseline"
    )
    min_baseline: float = Field(
        0.05,
        ge=0,
        description=(
            "no verdict while the baseline is below this (reward std in reward units): a spread "
            "that was never there cannot collapse, and a fraction of noise is noise"
        ),
    )
    patience: int = Field(
        10, ge=1, description="consecutive breaching observations before the alarm fires"
    )


class OutputLengthCollapseConfig(_OneAlarmConfig):
    name: ClassVar[str] = "output_length_collapse"
    summary: ClassVar[str] = "mean reasoning length drops within a window"

    metric: str = Field(
        "rollout/reasoning_length",
        description=(
            "mean reasoning length in tokens, with its interval <metric>_ci_low / _ci_high"
        ),
    )
    window: int = Field(10, ge=2, description="observations in the running window")
    drop_fraction: float = Field(
        0.5,
        gt=0,
        lt=1,
        description=(
            "fall from the window's peak, as a fraction of the peak; counts only when the peak's "
            "interval lies wholly above the current one (a fall beyond noise)"
        ),
    )


class FormatCollapseConfig(_OneAlarmConfig):
    name: ClassVar[str] = "format_collapse"
    summary: ClassVar[str] = "valid reasoning or valid actions all but disappear from the rollouts"

    reasoning_metric: str = Field(
        "rollout/valid_reasoning_rate",
        description=("share of turns with non-empty reasoning inside <think>...</think>"),
    )
    action_metric: str = Field(
        "rollout/action_valid_rate",
        description=("share of turns whose action the environment accepted"),
    )
    min_rate: float = Field(
        0.05,
        ge=0,
        lt=1,
        description=(
            "breach when either rate is below this (reasoning or actions have all but vanished)"
        ),
    )
    patience: int = Field(
        2, ge=1, description="consecutive breaching iterations before the alarm fires"
    )


class EmptyAfterFilterConfig(_OneAlarmConfig):
    name: ClassVar[str] = "empty_after_filter"
    summary: ClassVar[str] = "the filter kept nothing several iterations running"

    metric: str = Field(
        "filter/empty", description="1 when the SNR filter kept no group this iteration, else 0"
    )
    patience: int = Field(
        5, ge=1, description="consecutive empty iterations before the alarm fires"
    )


class ReadingDriftConfig(_OneAlarmConfig):
    """Reading accuracy on the probe set fell beyond the uncertainty of both points from
    its best point in the window, while the input-dependence test still says grounded:
    the reasoning still depends on the input but states it less correctly."""

    name: ClassVar[str] = "reading_drift"
    summary: ClassVar[str] = "reading accuracy on the probe set falls while MI still says grounded"

    actions: list[Response] = Field(
        default_factory=lambda: [Rollback()],
        description="mode act: return to the last grounded checkpoint at or before the "
        "best reading point, at a lower learning rate",
    )
    metric: str = Field(
        "grounding/reading_acc",
        description="reading accuracy: the share of probe levels whose first-turn reasoning "
        "states every fact of the input right",
    )
    each_fact: bool = Field(
        True,
        description="also watch each fact of the reading on its own (every "
        "grounding/<fact>_right the point logs: the player, the goal, ...), so a fall of one "
        "fact that the others dilute in `metric` is seen; the intervals are then widened "
        "(Bonferroni over the rates watched) so the false-alarm rate stays that of one rate",
    )
    levels_metric: str = Field(
        "grounding/levels", description="the probe levels the share is over (its n)"
    )
    confidence: float = Field(
        0.99,
        gt=0.5,
        lt=1,
        description="coverage of the Wilson intervals the alarm compares (computed from the "
        "share and n, wider than the 95 % ones logged): the best of a window of noisy points "
        "is a lucky high, and at 0.95 a steady 64-level probe fired at ~16 per 1,000 points, "
        "at 0.99 at <= 1.3 (docs/methods.md, section 4)",
    )
    p_metric: str = Field(
        "collapse/probe/p_grounded",
        description="p-value of the input-dependence (permutation) test on the same probe: "
        "the alarm speaks only while it says grounded (p < alpha)",
    )
    alpha: float = Field(
        0.05, gt=0, lt=0.5, description="'grounded' when p_metric < alpha at the current point"
    )
    window: int = Field(
        10, ge=2, description="probe points kept; the best point is searched among them"
    )
    min_drop: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="the fall from the best point must also be at least this much "
        "(absolute share of levels), besides the intervals lying apart",
    )
    patience: int = Field(
        1,
        ge=1,
        description="consecutive probe points with the intervals apart (and grounded) "
        "before the alarm fires",
    )


#: The alarms, each declared once by its settings class (its ``name``, its ``summary`` and
#: its schema), in the order the monitor runs them and the controller asks them;
#: ``alarms.py`` gives each its statistic (``_Alarm.settings``). Everything else that
#: lists the alarms (``ALARM_NAMES``, the ``AlarmsConfig`` fields, ``alarms.ALARMS``, the
#: sweep spec's ``stop_on_collapse.alarms``) is derived from this tuple.
ALARM_SETTINGS: tuple[type[_OneAlarmConfig], ...] = (
    TemplateCollapseConfig,
    LowEntropyCollapseConfig,
    RewardVarianceCollapseConfig,
    OutputLengthCollapseConfig,
    EmptyAfterFilterConfig,
    FormatCollapseConfig,
    ReadingDriftConfig,
)
ALARM_NAMES = tuple(settings.name for settings in ALARM_SETTINGS)

AlarmsConfig = create_model(
    "AlarmsConfig",
    __base__=StrictSection,
    __doc__="Thresholds and modes of the collapse alarms (docs/methods.md, section 4).",
    __module__=__name__,
    **{
        settings.name: (settings, Field(default_factory=settings, description=settings.summary))
        for settings in ALARM_SETTINGS
    },
    control=(
        ControlConfig,
        Field(
            default_factory=ControlConfig, description="cooldown and cap of the act-mode responses"
        ),
    ),
)
