"""Known-answer RL through the real loop (local Ray: rollout worker, env pool, learner,
filter, update): the loop must reach each task's optimum from a weak start, and must not
when the advantage sign, a turn's token mask, the old-policy log-probs, the filter's loss
scale or the learning rate the learner is started with are broken
(`tether.testing.learning`; the whole matrix of algorithms and seeds is
`benchmarks/known_answer.py`, its results in benchmarks/RESULTS.md)."""

from __future__ import annotations

import pytest

from tether.testing.learning import (
    BREAKAGES,
    LEARNING_RATES,
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
# the learning, misaligned old log-probs break the on-policy ratio, a zero loss scale
# leaves the policy where it started, and the learning rate the config does not deliver
# (the default 1e-4 instead of 1e-3) learns too slowly (the first three's numbers:
# benchmarks/RESULTS.md; the last two's: CONTRIBUTING.md).  The three wiring defects of
# the driver (sign, loss scale, learning rate) run by default, ~12 s each on a quiet
# machine (CONTRIBUTING.md).
BREAKAGE_CASES = [
    ("choice", "advantage_sign"),
    ("choice", "loss_scale"),
    ("choice", "lr_not_applied"),
    pytest.param("doors", "turn_mask", marks=pytest.mark.slow),
    pytest.param("choice", "old_logprobs", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("task,breakage", BREAKAGE_CASES)
def test_a_broken_loop_fails_the_test(task, breakage, tmp_path, models_dir, ray_local):
    result = _run(task, "grpo", 0, tmp_path, models_dir, breakage)
    assert result.status == "FINISHED"
    ok, why = passes(result, task)
    assert not ok, why
    print(f"{task} with {breakage}: {why}")  # the numbers, with -rP


# Every algorithm on both tasks but PPO on Doors, each at its known-answer settings
# (`tether.testing.learning.RECIPES`: on Doors, Dr.GRPO and DAPO take a KL anchor, chosen
# on seeds 0-2 and confirmed on seeds 3-5; benchmarks/history/doors-recipe.md).  PPO on
# Doors passed 1 of 3 seeds at the shared settings and under no recipe screened on every
# seed (its policy runs away to unparseable replies after learning partway): recorded
# in benchmarks/RESULTS.md ("Known-answer RL") as open, not encoded as an expected failure.
MATRIX = [
    (task, preset)
    for task in ("choice", "doors")
    for preset in ("grpo", "drgrpo", "dapo", "ppo")
    if (task, preset) != ("doors", "ppo")
]


@pytest.mark.slow
@pytest.mark.parametrize("task,preset", MATRIX)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_algorithm_learns_on_every_seed(task, preset, seed, tmp_path, models_dir, ray_local):
    ok, why = passes(_run(task, preset, seed, tmp_path, models_dir), task)
    assert ok, why


def test_breakages_are_undone(tmp_path):
    """A breakage lasts only inside its block (the tests above share one process), and
    each one changes what it names."""
    from tether.actors.learner_group import LearnerGroup
    from tether.algos import advantages, filters
    from tether.platform.trainer import Trainer

    def state():
        return (
            dict(advantages.ADVANTAGE_ESTIMATORS),
            dict(filters.LOSS_SCALINGS),
            Trainer.collect,
            LearnerGroup.start_run,
        )

    before = state()
    changes = {
        "advantage_sign": 0,
        "loss_scale": 1,
        "turn_mask": 2,
        "old_logprobs": 2,
        "lr_not_applied": 3,
    }
    assert set(changes) == set(BREAKAGES)
    for kind, changed in changes.items():
        with broken(kind):
            during = state()
            assert [during[i] != before[i] for i in range(4)] == [i == changed for i in range(4)]
            if kind == "loss_scale":
                assert {fn(0.5) for fn in filters.LOSS_SCALINGS.values()} == {0.0}
        assert state() == before
    with pytest.raises(ValueError, match="unknown breakage"):
        with broken("nothing"):
            pass


def test_lr_not_applied_starts_the_learner_at_the_default_rates(monkeypatch):
    """What the ``lr_not_applied`` breakage sends to the learner group: the config
    field's default rates, not the run's (the cases above need the two to differ)."""
    from tether.actors.learner_group import LearnerGroup
    from tether.algos.settings import AlgoConfig

    calls = []
    monkeypatch.setattr(LearnerGroup, "_all", lambda self, method, *args: calls.append(args))
    with broken("lr_not_applied"):
        LearnerGroup([]).start_run("settings", lr=1e-3, critic_lr=2e-3, seed=7)
    defaults = AlgoConfig.model_fields
    assert calls == [("settings", defaults["lr"].default, defaults["critic_lr"].default, 7)]
    assert LEARNING_RATES["grpo"] != defaults["lr"].default


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo", "reinforce_pp"])
def test_negated_scores_are_the_advantage_sign_breakage(estimator):
    """Negating the scores (rewards) gives exactly the negated advantages for these
    estimators, so the ``advantage_sign`` case also stands for a wiring that negates them."""
    import torch

    from tether.algos.advantages import AdvantageInputs, compute_advantages

    gen = torch.Generator().manual_seed(0)
    scores = torch.rand(12, generator=gen)
    mask = (torch.rand(12, 9, generator=gen) > 0.3).float()
    mask[:, 0] = 1.0
    groups = torch.arange(12) // 4

    def adv(s):
        return compute_advantages(estimator, AdvantageInputs(s, groups, mask))[0]

    assert adv(scores).abs().sum() > 0
    torch.testing.assert_close(adv(-scores), -adv(scores))
