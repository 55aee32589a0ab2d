"""Known-answer RL through the real loop (local Ray: rollout worker, env pool, learner,
filter, update): the loop must reach each task's optimum from a weak start, and must not
when the advantage sign, a turn's token mask or the old-policy log-probs are broken
(`tether.testing.learning`; the whole matrix of algorithms and seeds is
`benchmarks/known_answer.py`, its results in benchmarks/RESULTS.md)."""

from __future__ import annotations

import pytest

from tether.testing.learning import (
    TASKS,
    broken,
    known_answer_config,
    passes,
    run_known_answer,
)


def _run(task, preset, seed, tmp_path, models_dir, breakage=None):
    cfg = known_answer_config(task, preset, seed, tmp_path / "runs", models_dir)
    if breakage is None:
        return run_known_answer(cfg)
    with broken(breakage):
        return run_known_answer(cfg)


@pytest.mark.parametrize("task", ["choice", "doors"])
def test_grpo_learns_the_known_answer(task, tmp_path, models_dir, ray_local):
    result = _run(task, "grpo", 0, tmp_path, models_dir)
    assert len(result.success) == TASKS[task].iterations
    ok, why = passes(result, task)
    assert ok, why


# Each breakage makes the test above fail: the advantage sign and a later turn's mask stop
# the learning, misaligned old log-probs break the on-policy ratio (benchmarks/RESULTS.md).
BREAKAGE_CASES = [
    ("choice", "advantage_sign"),
    pytest.param("doors", "turn_mask", marks=pytest.mark.slow),
    pytest.param("choice", "old_logprobs", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("task,breakage", BREAKAGE_CASES)
def test_a_broken_loop_fails_the_test(task, breakage, tmp_path, models_dir, ray_local):
    result = _run(task, "grpo", 0, tmp_path, models_dir, breakage)
    assert result.status == "FINISHED"
    ok, why = passes(result, task)
    assert not ok, why


# The algorithms that reached the target on seed 0 (benchmarks/RESULTS.md, "Known-answer
# RL"); Dr.GRPO (both tasks) and PPO on Doors did not at the shared lr 1e-3 (Dr.GRPO
# slower, PPO's policy collapsed to unparseable replies after reaching 0.59): recorded
# there as open, not encoded as expected failures.
MATRIX = [
    (task, preset)
    for task in ("choice", "doors")
    for preset in ("grpo", "dapo", "ppo")
    if (task, preset) != ("doors", "ppo")
]


@pytest.mark.slow
@pytest.mark.parametrize("task,preset", MATRIX)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_algorithm_learns_on_every_seed(task, preset, seed, tmp_path, models_dir, ray_local):
    ok, why = passes(_run(task, preset, seed, tmp_path, models_dir), task)
    assert ok, why


def test_breakages_are_undone(tmp_path):
    """A breakage lasts only inside its block (the tests above share one process)."""
    from tether.algos import advantages
    from tether.platform.trainer import Trainer

    estimators, collect = dict(advantages.ADVANTAGE_ESTIMATORS), Trainer.collect
    for kind in ("advantage_sign", "turn_mask", "old_logprobs"):
        with broken(kind):
            assert advantages.ADVANTAGE_ESTIMATORS != estimators or Trainer.collect is not collect
        assert advantages.ADVANTAGE_ESTIMATORS == estimators and Trainer.collect is collect
    with pytest.raises(ValueError, match="unknown breakage"):
        with broken("nothing"):
            pass
