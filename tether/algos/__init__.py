"""Pure tensor/numpy RL maths: advantage estimators, losses, the SNR filter, presets.

No Ray, no model code.  Everything selectable by name lives in a registry
(``ADVANTAGE_ESTIMATORS``, ``AGGREGATION_MODES``, ``KL_ESTIMATORS``,
``POLICY_LOSSES``, ``FILTER_STRATEGIES``, ``PRESETS``); an unknown name raises
ValueError listing the valid ones.
"""

from tether.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    compute_advantages,
    masked_mean,
    masked_whiten,
    outcome_token_rewards,
)
from tether.algos.filters import FILTER_STRATEGIES, FilterConfig, FilterResult, group_scores, snr_filter
from tether.algos.losses import (
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    entropy_from_logits,
    get_policy_loss,
    kl_penalty,
    policy_loss,
    ppo_objective,
    regularizer_loss,
    value_loss,
)
from tether.algos.presets import PRESETS, get_preset

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AdvantageInputs", "compute_advantages", "masked_mean", "masked_whiten",
    "outcome_token_rewards", "FILTER_STRATEGIES", "FilterConfig", "FilterResult", "group_scores",
    "snr_filter", "AGGREGATION_MODES", "KL_ESTIMATORS", "POLICY_LOSSES", "aggregate",
    "entropy_from_logits", "get_policy_loss", "kl_penalty", "policy_loss", "ppo_objective",
    "regularizer_loss", "value_loss", "PRESETS", "get_preset",
]
