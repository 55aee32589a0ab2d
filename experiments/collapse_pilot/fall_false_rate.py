"""The false rate of the confirmation's fall rule (docs/collapse.md, amendment of
2026-12-07, night): how often a run whose held-out success does not move is read as
fallen, by the number of probe points and the number of consecutive points required.

    .venv/bin/python experiments/collapse_pilot/fall_false_rate.py

Binomial success at each point (256 episodes: 64 probe levels played 4 times; a fixed
level set varies less than this, so the rates are upper bounds), every point compared
with the run's first, 200,000 simulated runs per row.
"""

import numpy as np

EPISODES, FALL, RUNS = 256, 0.10, 200_000


def false_rate(success: float, points: int, hold: int, rng: np.random.Generator) -> float:
    x = rng.binomial(EPISODES, success, size=(RUNS, points + 1)) / EPISODES
    below = (x[:, 1:] - x[:, [0]]) <= -FALL
    held = np.lib.stride_tricks.sliding_window_view(below, hold, axis=1).all(axis=-1)
    return float(held.any(axis=1).mean())


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    print("success  8 points  40 points  40 points, 2 in a row")
    for p in (0.10, 0.20, 0.30, 0.45):
        rates = [false_rate(p, 8, 1, rng), false_rate(p, 40, 1, rng), false_rate(p, 40, 2, rng)]
        print(f"{p:.2f}     " + "  ".join(f"{r:.3f}" for r in rates))
