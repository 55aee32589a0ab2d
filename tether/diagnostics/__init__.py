"""Collapse diagnostics, pure and Ray-free: MI proxies from in-batch cross-scoring,
gradient SNR by reward-variance bucket, and collapse alarms (docs/methods.md).

Names are imported on first use (``tether.lazy``): ``mi``, ``alarms`` and ``settings``
need only numpy/pydantic (so the run config can nest ``settings.AlarmsConfig`` without
torch); ``grad_snr`` needs torch, ``crossscore`` torch and transformers.
"""

from __future__ import annotations

from ..lazy import lazy_exports

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
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
