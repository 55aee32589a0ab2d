"""Collapse diagnostics, pure and Ray-free: MI proxies from in-batch cross-scoring,
gradient SNR by reward-variance bucket, and collapse alarms (SPEC §2, §3, §8).

``mi``, ``alarms`` and ``grad_snr`` need only numpy/pydantic (grad_snr: torch);
``crossscore`` needs torch + transformers and is imported lazily by name.
"""

from tether.diagnostics.alarms import AlarmEvent, AlarmMonitor, AlarmsConfig
from tether.diagnostics.grad_snr import bucket_grad_norms, grad_snr_metrics, rv_buckets
from tether.diagnostics.mi import mi_proxies, prefixed, prompt_columns, valid_reasoning_rate

__all__ = [
    "AlarmEvent", "AlarmMonitor", "AlarmsConfig",
    "bucket_grad_norms", "grad_snr_metrics", "rv_buckets",
    "mi_proxies", "prefixed", "prompt_columns", "valid_reasoning_rate",
    "ScoringPair", "CrossScores", "ChainResult", "cross_score_pairs", "information_chain", "sample_pairs",
]

_CROSSSCORE = {"ScoringPair", "CrossScores", "ChainResult", "cross_score_pairs", "information_chain",
               "sample_pairs"}


def __getattr__(name: str):
    # crossscore imports transformers (slow); load it only when asked for.
    if name in _CROSSSCORE:
        from tether.diagnostics import crossscore
        return getattr(crossscore, name)
    raise AttributeError(f"module 'tether.diagnostics' has no attribute {name!r}")
