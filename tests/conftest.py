"""Shared fixtures: a micro warm-started model (built once per session) and local Ray."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# Local Ray instances of the tests bind 127.0.0.1 (read when Ray is imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


#: The tests' probe set: 16 levels, not the shipped 64. The probe is sampled and
#: cross-scored at iteration 1 of every run with diagnostics on (16 x 16 cells against
#: 64 x 64); tests/test_e2e.py's run keeps the shipped 64.
MICRO_PROBE = {"levels": 16}


def micro_config_dict(tmp_dir, **sections) -> dict:
    """A seconds-scale config: micro model, small batches, local outputs."""
    base = {
        "experiment": {"name": "tether-tests", "output_dir": str(tmp_dir / "runs"), "seed": 0},
        "env": {"id": "tether/FrozenLake-v0"},
        "model": {
            "size": "micro",
            "cache_dir": str(tmp_dir / "models"),
            "warm_start": {"episodes": 192, "epochs": 3, "batch_size": 8, "lr": 1e-2},
        },
        "rollout": {"num_workers": 2, "groups": 2, "group_size": 4, "max_reply_tokens": 48},
        "algo": {"preset": "grpo", "kl_coef": 0.01, "micro_batch_size": 4},
        "diagnostics": {"probe": dict(MICRO_PROBE)},
        "trainer": {
            "iterations": 2,
            "val_every": 2,
            "val_episodes": 4,
            "checkpoint_every": 1,
            "samples_every": 1,
        },
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return base


def checkpointed_run_config(
    tmp_dir, models_dir, iterations: int, trainer=None, tracking=None, rollout=None
):
    """A validated config for a short run with no diagnostics and a checkpoint every
    iteration (one worker, 2 groups of 4, GRPO without KL), the warm start read from
    ``models_dir``; ``trainer``/``tracking``/``rollout`` add to or replace those sections'
    values."""
    from tether.platform.config import build_config

    cfg = build_config(
        micro_config_dict(
            tmp_dir,
            rollout={"num_workers": 1, "groups": 2, "group_size": 4, **(rollout or {})},
            algo={"preset": "grpo", "kl_coef": 0.0, "micro_batch_size": 8},
            trainer={
                "iterations": iterations,
                "val_every": iterations,
                "val_episodes": 2,
                "checkpoint_every": 1,
                **(trainer or {}),
            },
            diagnostics={"enabled": False},
            tracking={"log_model": False, **(tracking or {})},
        )
    )
    cfg.model.cache_dir = models_dir
    return cfg


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    """Fresh per session; TETHER_TEST_MODELS_DIR keeps the warm-started models between
    sessions (the cache is keyed by the recipe, so a changed recipe is rebuilt)."""
    if os.environ.get("TETHER_TEST_MODELS_DIR"):
        path = Path(os.environ["TETHER_TEST_MODELS_DIR"])
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def micro_policy(models_dir):
    """Path of a warm-started micro model + tokenizer (built once)."""
    from tether.platform.config import build_config
    from tether.policy.load import resolve_policy

    cfg = build_config(micro_config_dict(models_dir.parent))
    cfg.model.cache_dir = models_dir
    return resolve_policy(cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens)


@pytest.fixture(scope="session")
def ray_local():
    import ray

    from tether.platform.session import start_ray

    started = start_ray(None, 4, 4)
    yield ray
    if started:
        ray.shutdown()
