"""What the analyses read: one training run's params, tags, metric histories and alarms.

Pure data (no MLflow): ``tether.analysis.source`` fills it from a tracking store, tests
may build it by hand. Metric names are the MLflow keys the driver logs (the paper's names with
``@`` spelled ``_at_``): ``rollout/success``, ``filter/kept_ratio``,
``collapse/<sampling>/mi_estimate``, ``val/success``, ...
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..diagnostics.proxies import CI_KEYS

SUCCESS = "rollout/success"
VAL_SUCCESS = "val/success"
REWARD_STD = "rollout/in_group_reward_std"
KEPT_RATIO = "filter/kept_ratio"
ZERO_VARIANCE = "filter/zero_variance_groups"
REASONING_LENGTH = "rollout/reasoning_length"
SAMPLINGS = ("first_turn", "trajectory")

#: The diagnostics the paper correlates with success (per sampling, under ``collapse/<s>/``).
#: The entropies here are estimated from the same cross-score matrix as the MI proxies
#: (H(Z|X) = −mean(matched), H(Z) = −mean(marginal)), so they share its sampling noise.
DIAGNOSTICS = CI_KEYS

#: Reading accuracy on the probe set (docs/methods.md, section 2): every fact of the input
#: stated right, the share of probe levels; ``grounding/defined`` 0 when the env has none.
READING_ACC = "grounding/reading_acc"
READING_DEFINED = "grounding/defined"

#: The curves each alarm concerns (metric-name prefixes); its evidence keys are added.
ALARM_CURVES = {
    "template_collapse": ("collapse/",),
    "low_entropy_collapse": ("collapse/",),
    "reward_variance_collapse": (REWARD_STD,),
    "output_length_collapse": (REASONING_LENGTH,),
    "empty_after_filter": (KEPT_RATIO, "filter/kept_groups"),
    "format_collapse": ("rollout/valid_reasoning_rate", "rollout/action_valid_rate"),
    "reading_drift": (READING_ACC, "grounding/"),
}


#: Diagnostics logged once per iteration rather than per sampling: name -> metric key.
#: ``reasoning_token_entropy`` is the policy's token entropy on the reasoning tokens of the
#: update's batch (algos/update.py), the entropy the paper's Spearman table compares, and
#: it comes from the update's forward pass, not from the cross-score matrix.
UNSAMPLED_DIAGNOSTICS = {"reasoning_token_entropy": "collapse/reasoning_token_entropy"}

#: What finding b correlates with success: the per-sampling diagnostics and the rest.
COMPARED_DIAGNOSTICS = DIAGNOSTICS + tuple(UNSAMPLED_DIAGNOSTICS)


def collapse_key(sampling: str, name: str) -> str:
    return f"collapse/{sampling}/{name}"


def diagnostic_key(sampling: str, name: str) -> str:
    """The metric key of a diagnostic: ``collapse/<sampling>/<name>``, or the key of one
    logged once per iteration (``UNSAMPLED_DIAGNOSTICS``)."""
    return UNSAMPLED_DIAGNOSTICS.get(name) or collapse_key(sampling, name)


@dataclass
class RunData:
    run_id: str
    name: str
    status: str = "FINISHED"
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    #: metric key -> {step: value}, one value per step (the last one logged)
    metrics: dict[str, dict[int, float]] = field(default_factory=dict)
    #: alarm events (``alarms.json``): name, iteration, mode, message, evidence
    alarms: list[dict] = field(default_factory=list)
    #: iteration -> groups [{group_id, env_seed, rewards, success}] (``prompts/iter_N.json``)
    prompts: dict[int, list[dict]] = field(default_factory=dict)
    #: diagnosed iteration -> groups [{group_id, env_seed, rewards, success, mi, pairs}]
    #: (``prompt_mi/iter_N.json``: each group's first-turn pointwise MI)
    prompt_mi: dict[int, list[dict]] = field(default_factory=dict)

    def has(self, key: str) -> bool:
        return bool(self.metrics.get(key))

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Steps and values of a metric, by step (empty arrays when never logged)."""
        points = sorted(self.metrics.get(key, {}).items())
        return (
            np.array([s for s, _ in points], dtype=np.int64),
            np.array([v for _, v in points], dtype=np.float64),
        )

    def last(self, key: str) -> float | None:
        points = self.metrics.get(key)
        return points[max(points)] if points else None

    @property
    def latest_iteration(self) -> int:
        """The last training iteration logged (step 0 is the pre-training validation)."""
        steps = [s for points in self.metrics.values() for s in points]
        return max(steps, default=0)

    def _final_success_at(self) -> tuple[str, int | None]:
        """The metric and step ``final_success`` reads."""
        trained = [s for s in self.metrics.get(VAL_SUCCESS, {}) if s > 0]
        if trained:
            return VAL_SUCCESS, max(trained)
        return SUCCESS, max(self.metrics.get(SUCCESS) or {}, default=None)

    def final_success(self) -> float | None:
        """Validation success after training when logged, else the last rollout success."""
        key, step = self._final_success_at()
        return self.metrics.get(key, {}).get(step)

    def interval_at(self, key: str, step: int | None) -> list[float | None]:
        """The 95 % interval logged with ``key`` at ``step`` (``<key>_ci_low``/``_high``;
        None where not logged)."""
        return [self.metrics.get(f"{key}_ci_{end}", {}).get(step) for end in ("low", "high")]

    def final_success_interval(self) -> list[float | None]:
        """The interval logged with ``final_success`` (validation's Wilson interval)."""
        return self.interval_at(*self._final_success_at())

    def last_interval(self, key: str) -> list[float | None]:
        """The interval logged with ``key``'s last value."""
        return self.interval_at(key, max(self.metrics.get(key) or {}, default=None))

    def param(self, path: str) -> str | None:
        """A config value: the sweep tag of a swept field wins over the logged param."""
        return self.tags.get(f"sweep.param.{path}", self.params.get(path))

    def alarm_steps(self) -> list[tuple[int, str]]:
        """(iteration, name) of every alarm: the alarms.json events, else the tags."""
        if self.alarms:
            return sorted((int(a["iteration"]), str(a["name"])) for a in self.alarms)
        return sorted(
            (int(float(v)), k.split(".", 1)[1])
            for k, v in self.tags.items()
            if k.startswith("alarm.")
        )

    def alarms_for(self, key: str) -> list[tuple[int, str]]:
        """The alarms that concern the curve of ``key`` (by name, or by their evidence)."""
        out = []
        evidence = {a["name"]: set(a.get("evidence", {})) for a in self.alarms}
        for step, name in self.alarm_steps():
            prefixes = ALARM_CURVES.get(name, ())
            if key.startswith(prefixes) or key in evidence.get(name, ()):
                out.append((step, name))
        return out


def arm_of(run: RunData) -> str:
    """The filter arm of a run: ``none``, ``top_p`` or ``top_k``."""
    return run.param("filter.strategy") or "none"
