"""When an "every N iterations" thing happens: one rule for the whole run.

    due(it, every)                      multiples of ``every``
    due(it, every, first=True)          ... and iteration 1 (the run's starting point)
    due(it, every, last=iterations)     ... and the run's last iteration

``every = 0`` means never: neither the multiples nor ``first`` nor ``last``.  Each caller
names the ends it wants, so a reader sees them at the call, not in a hand-written test:

- validation, checkpoints: multiples and the last iteration (a run ends validated and
  resumable whatever its length);
- diagnostics, their heatmaps and information chain, sample transcripts: multiples and
  iteration 1 (the starting point every later value is compared with);
- the per-prompt rewards artifact: multiples, iteration 1 and the last;
- gradient SNR: multiples only.  It costs about two updates' worth of compute and its
  buckets describe a trained policy's gradient, so iteration 1 is not added.
"""

from __future__ import annotations


def due(it: int, every: int, *, first: bool = False, last: int | None = None) -> bool:
    """True when iteration ``it`` (1-based) is on the cadence ``every``: a multiple of
    it, or iteration 1 when ``first``, or iteration ``last`` when given; never when
    ``every`` is 0."""
    if every <= 0:
        return False
    return it % every == 0 or (first and it == 1) or (last is not None and it == last)
