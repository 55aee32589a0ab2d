"""Does a process's memory grow with the number of distinct shapes it runs in bfloat16?

The soak (RESULTS, "Soak") found the learner growing about 220 MB per 100 iterations with
the bfloat16 diagnostics and not with float32.  This isolates it: the tiny model's forward,
no gradients, one thread, on random shapes (batch 1-16, length 8-160), resident memory
read every 250 forwards.  Modes: ``bf16`` (autocast), ``fp32``, ``bucket`` (bfloat16 with
the length rounded up to a multiple of 32 and the batch to a multiple of 4: 20 shapes),
``bf16-nodnn`` (bfloat16 with oneDNN switched off).  Set
``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` in the environment to cap oneDNN's primitive cache.

    .venv/bin/python benchmarks/bf16_shape_memory.py bf16 1500
"""

import random
import sys
import time

import psutil
import torch

from tether.policy.tiny import build_tiny_model, tiny_config


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / (1 << 20)


def main(mode: str, calls: int) -> None:
    torch.set_num_threads(1)
    if mode == "bf16-nodnn":
        torch._C._set_mkldnn_enabled(False)
    random.seed(0)
    model = build_tiny_model(tiny_config("tiny", vocab_size=512)).eval()
    start, readings = time.time(), []
    for i in range(calls):
        b, t = random.randint(1, 16), random.randint(8, 160)
        if mode == "bucket":
            b, t = -(-b // 4) * 4, -(-t // 32) * 32
        ids = torch.randint(0, 512, (b, t))
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=mode != "fp32"):
            model(input_ids=ids)
        if i % 250 == 0 or i == calls - 1:
            readings.append((i, round(rss_mb())))
    print(mode, "forwards and RSS (MB):", readings, f"{time.time() - start:.1f} s")


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "bf16",
        int(sys.argv[2]) if len(sys.argv) > 2 else 1500,
    )
