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
    cell_passes,
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


# The multi-turn task (doors) nightly, with its turn-mask breakage below (-m slow;
# CONTRIBUTING.md, "Tests", Nightly).
@pytest.mark.parametrize("task", ["choice", pytest.param("doors", marks=pytest.mark.slow)])
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
def test_every_algorithm_learns_over_three_seeds(task, preset, tmp_path, models_dir, ray_local):
    """Judged per cell, on the mean over seeds 0-2 (``cell_passes``): one seed's result
    is one draw of 128 episodes on one CPU's rounding."""
    results = [_run(task, preset, s, tmp_path / f"s{s}", models_dir) for s in (0, 1, 2)]
    ok, why = cell_passes(results, task)
    print(f"{task} {preset}: {why}")  # the numbers, with -rP
    assert ok, why


def test_the_cell_rule_reads_the_mean_and_every_run():
    """``cell_passes`` on hand-made results: one seed under the target does not fail a
    cell whose mean reaches it; a low mean, a small rise, one clipped update or one run
    that did not finish does."""
    from tether.testing.learning import KnownAnswerResult as R

    def run(before, after, clip=0.0, status="FINISHED"):
        return R(before, after, success=[after], clipfrac=[0.0, clip], status=status)

    target = TASKS["choice"].target  # 0.9
    good = [run(0.6, 0.96), run(0.6, 0.95), run(0.6, 0.87)]  # mean 0.927
    assert cell_passes(good, "choice")[0] and not passes(good[2], "choice")[0]
    assert not cell_passes([run(0.6, 0.93), run(0.6, 0.78), run(0.6, 0.94)], "choice")[0]
    assert "rose only" in cell_passes([run(0.75, 0.92)] * 3, "choice")[1]
    assert "clipped" in cell_passes(good[:2] + [run(0.6, 0.97, clip=0.05)], "choice")[1]
    assert "KILLED" in cell_passes(good[:2] + [run(0.6, 0.97, status="KILLED")], "choice")[1]
    assert not cell_passes([], "choice")[0] and target == 0.9


def test_breakages_are_undone(tmp_path):
    """A breakage lasts only inside its block (the tests above share one process), and
    each one changes what it names."""
    from tether.actors.learner_group import LearnerGroup
    from tether.algos import advantages, filters
    from tether.platform.run.trainer import Trainer

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
