"""Collapse diagnostics, pure and Ray-free: MI proxies from in-batch cross-scoring,
gradient SNR by reward-variance bucket, and collapse alarms (docs/methods.md).

Names are imported on first use: ``mi`` and ``alarms`` need only numpy/pydantic (so
the run config can nest ``AlarmsConfig`` without torch); ``grad_snr`` needs torch,
``crossscore`` torch and transformers.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "alarms": ("AlarmEvent", "AlarmMonitor", "AlarmsConfig"),
    "grad_snr": ("bucket_grad_norms", "grad_snr_metrics", "rv_buckets"),
    "mi": ("mi_proxies", "prefixed", "prompt_columns", "valid_reasoning_rate"),
    "crossscore": (
        "ScoringPair",
        "CrossScores",
        "ChainResult",
        "cross_score_pairs",
        "information_chain",
        "sample_pairs",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name in _MODULE_OF:
        return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
