"""``model.dtype: bfloat16`` end to end, the per-iteration peak RSS metrics, and the
Qwen2.5-0.5B-shaped size (its config and its padded tokenizer; the 0.5 B iteration
itself is a measurement, benchmarks/RESULTS.md)."""

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.conftest import micro_config_dict
from tether.actors.memory import peak_rss_gb, release_free_memory
from tether.platform.config import build_config
from tether.platform.run.trainer import Trainer


def test_peak_rss_rises_with_an_allocation_and_resets():
    peak_rss_gb(reset=True)
    before = peak_rss_gb(reset=True)
    block = np.ones((1 << 28) // 8)  # 256 MiB, touched
    during = peak_rss_gb()
    del block
    assert during - before > 0.2
    after_reset = peak_rss_gb(reset=True)  # the peak still includes the block
    assert after_reset >= during - 1e-3
    assert peak_rss_gb() < during - 0.2  # reset to what is resident now


def test_qwen05b_shape_is_qwen25_05b():
    from transformers import Qwen2ForCausalLM

    from tether.policy.tiny import tiny_config

    config = tiny_config("qwen05b-shape", vocab_size=600)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert config.vocab_size == 151_936 and config.tie_word_embeddings
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (
        896,
        24,
        4864,
    )
    assert (config.num_attention_heads, config.num_key_value_heads) == (14, 2)
    assert sum(p.numel() for p in model.parameters()) == 494_032_768  # Qwen2.5-0.5B: 494 M
    with pytest.raises(ValueError, match="151936 token ids"):
        tiny_config("qwen05b-shape", vocab_size=200_000)


def test_padded_tokenizer_encodes_as_before_and_decodes_every_id(tmp_path):
    from tether.policy.load import load_tokenizer
    from tether.policy.tokenizer import pad_vocabulary
    from tether.policy.warmstart import build_tokenizer, demonstration_episodes

    episodes = demonstration_episodes(
        "tether/FrozenLake-v0", {}, 16, 0.3, seed=0, max_reply_tokens=48
    )
    tokenizer = build_tokenizer(episodes, 400, "coordinates")
    padded = pad_vocabulary(tokenizer, 5000)
    padded.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert len(loaded) == 5000
    for episode in episodes[:4]:
        assert loaded.encode(episode.text()) == tokenizer.encode(episode.text())
    assert loaded.eos_token_id == tokenizer.eos_token_id
    assert loaded.pad_token_id == tokenizer.pad_token_id
    last = loaded.decode([4999])
    assert last == f"<|filler_{4999 - len(tokenizer)}|>"
    assert loaded.encode(last) != [4999]  # no merge produces a filler


@pytest.fixture(scope="module")
def bf16_run(micro_policy, models_dir, ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16")
    cfg = build_config(
        micro_config_dict(
            out,
            model={"dtype": "bfloat16"},
            trainer={"iterations": 1, "val_every": 1, "checkpoint_every": 1},
            diagnostics={"grad_snr_every": 1, "grad_snr_buckets": 2},
            algo={"logprob_chunk_tokens": 16},
        )
    )
    cfg.model.cache_dir = models_dir
    return cfg, Trainer(cfg).run()


def test_a_bfloat16_run_completes_an_iteration_and_says_so(bf16_run):
    cfg, summary = bf16_run
    assert summary.status == "FINISHED" and summary.iterations == 1
    client = MlflowClient(summary.tracking_uri)
    run = client.get_run(summary.run_id)
    assert run.data.params["model.dtype"] == "bfloat16"
    assert run.data.tags["model.dtype_effective"] == "bfloat16"
    assert run.data.tags["model.logprob_dtype"] == "float32"
    metrics = run.data.metrics
    for key in ("actor/pg_loss", "actor/entropy", "collapse/first_turn/mi_estimate"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert any(k.startswith("grad_snr/") for k in metrics)
    # The weights the run saved are bfloat16 too (the learner trained bf16 parameters).
    from pathlib import Path

    from safetensors.torch import load_file

    final = Path(cfg.experiment.output_dir).expanduser() / "models" / summary.run_id
    weights = load_file(str(final / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}


def test_peak_rss_of_every_model_holding_process_is_logged(bf16_run):
    cfg, summary = bf16_run
    metrics = MlflowClient(summary.tracking_uri).get_run(summary.run_id).data.metrics
    names = ["driver", "learner"] + [f"rollout_worker{k}" for k in range(cfg.rollout.num_workers)]
    peaks = [metrics[f"system/peak_rss_gb/{name}"] for name in names]
    # Each such process holds torch and a model: more than 100 MiB, less than the machine.
    assert all(0.1 < p < 64 for p in peaks), dict(zip(names, peaks))
    assert metrics["system/peak_rss_gb"] == pytest.approx(sum(peaks))


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc_trim, /proc")
def test_free_heap_pages_go_back_to_the_system():
    """Blocks of varying size below mmap's threshold, most freed, leave their pages in
    glibc's heap until ``release_free_memory`` trims it (the learner does after every
    update)."""

    def rss_mb() -> float:
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024

    blocks = [np.ones(8_000 + (i % 7) * 1_000) for i in range(3_000)]  # 64-120 kB each
    kept = blocks[::20]  # every 20th stays: the freed ones sit between live blocks
    del blocks
    before = rss_mb()
    assert release_free_memory()
    assert rss_mb() < before - 100, (before, rss_mb())  # ~230 MB of the ~270 MB freed
    assert sum(len(b) for b in kept) > 0
