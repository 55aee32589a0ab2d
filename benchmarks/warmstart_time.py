"""Time one grounded warm start from an empty model cache:
python benchmarks/warmstart_time.py <spec> <empty cache dir> [key=value overrides...]."""

import json
import os
import sys
import time

from tether.platform.config import load_config
from tether.policy.load import resolve_policy

spec, cache, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
cfg = load_config(spec, [f"model.cache_dir={cache}", *overrides])
t0, c0 = time.perf_counter(), time.process_time()
path = resolve_policy(cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens, None)
print(
    json.dumps(
        {
            "spec": spec,
            "overrides": overrides,
            "wall_s": round(time.perf_counter() - t0, 1),
            "cpu_s": round(time.process_time() - c0, 1),
            "load_after": os.getloadavg(),
            "path": str(path),
        }
    ),
    flush=True,
)
