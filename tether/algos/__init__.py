"""Pure tensor/numpy RL maths: advantage estimators, losses, the SNR filter, presets,
and the schemas of their settings (``settings``: the run config's ``algo`` and
``filter`` sections).

No Ray, and no model is built or loaded here: the helpers that work on a given Hugging
Face model (``vocab``: chunked log-probs over the vocabulary; ``attention``: switching a
model to a registered attention function) are shared by the learner, the cross-scoring
and the rollout engine, so they sit in this lowest layer (docs/architecture.md).
Everything selectable by name lives in a registry
(``ADVANTAGE_ESTIMATORS``, ``AGGREGATION_MODES``, ``KL_ESTIMATORS``,
``FILTER_STRATEGIES``, ``LOSS_SCALINGS``, ``PRESETS``) whose names are exactly the
values the config accepts; an unknown name raises ValueError listing the valid ones.

Names are imported on first use, so ``tether.algos.settings`` (and a config that
nests it) loads without torch.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_EXPORTS = {
    "advantages": (
        "ADVANTAGE_ESTIMATORS",
        "AdvantageInputs",
        "compute_advantages",
        "format_advantages",
        "masked_mean",
        "masked_whiten",
        "outcome_token_rewards",
    ),
    "filters": ("FILTER_STRATEGIES", "LOSS_SCALINGS", "FilterResult", "group_scores", "snr_filter"),
    "losses": (
        "AGGREGATION_MODES",
        "KL_ESTIMATORS",
        "aggregate",
        "entropy_from_logits",
        "kl_penalty",
        "policy_loss",
        "ppo_objective",
        "regularizer_loss",
        "value_loss",
    ),
    "presets": ("PRESETS",),
    "settings": ("AlgoConfig", "FilterConfig"),
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
