"""Sweeps: specs, the search, Tune trials, progress and results."""
