"""The collapse diagnostics of a run, at their cadences: cross-score MI proxies with the
pre-update policy (docs/methods.md, section 2), their heatmaps, and gradient SNR
(section 10).  The learner computes; this part decides when, keeps the MI running
averages between iterations and logs the heatmaps."""

from __future__ import annotations

import time

from .. import seeds
from .cadence import due
from .config import DiagnosticsConfig
from .tracking import Tracker


class Diagnosis:
    def __init__(self, cfg: DiagnosticsConfig, seed: int) -> None:
        self.cfg, self.seed = cfg, seed
        #: the MI diagnostics' running averages (a checkpoint keeps them)
        self.ema_state: dict = {}

    def grad_snr_due(self, it: int) -> bool:
        return self.cfg.enabled and due(it, self.cfg.grad_snr_every)

    def run(self, it: int, collected, learner, tracker: Tracker) -> dict[str, float]:
        """The MI proxies of ``collected`` (``collapse/…``) when diagnostics are due."""
        d = self.cfg
        if not d.enabled or not due(it, d.every, first=True):
            return {}
        result = learner.diagnose(
            collected,
            d,
            self.ema_state,
            seeds.diagnostics(self.seed, it),
            due(it, d.heatmap_every, first=True),
            d.information_chain and due(it, d.chain_every, first=True),
        )
        self.ema_state = result.ema_state
        started = time.perf_counter()
        for sampling, (scores, column) in result.matrices.items():
            from ..diagnostics.plots import cross_score_heatmap

            figure = cross_score_heatmap(scores, column, f"{sampling} cross-scores, iteration {it}")
            tracker.log_figure(figure, f"diagnostics/cross_scores_{sampling}_{it:04d}.png")
            import matplotlib.pyplot as plt

            plt.close(figure)
        if result.matrices:
            result.metrics["timing/diagnose/heatmaps"] = time.perf_counter() - started
        return result.metrics
