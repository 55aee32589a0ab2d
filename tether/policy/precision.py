"""Mixed precision: whether bfloat16 autocast is worth it on a device.

``autocast: auto`` (``algo.autocast``, ``model.warm_start.autocast``) takes bfloat16
where the hardware runs it natively (a CUDA GPU that supports it; a CPU with
AVX512-BF16 or AMX, read from ``/proc/cpuinfo``) and float32 elsewhere, where
emulated bfloat16 would be slower than float32, not faster.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

#: CPU flags (``/proc/cpuinfo``) of native bfloat16 matrix arithmetic.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@cache
def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (Linux; elsewhere False)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return any(flag in flags for flag in CPU_BF16_FLAGS)


def resolve_autocast(setting: str, device_type: str) -> str:
    """The precision ``setting`` (none, bfloat16 or auto) means on ``device_type``:
    none or bfloat16."""
    if setting != "auto":
        return setting
    if device_type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "none"
    return "bfloat16" if device_type == "cpu" and cpu_has_bf16() else "none"
