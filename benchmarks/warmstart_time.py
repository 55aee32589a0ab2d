"""Time one grounded warm start from an empty model cache, and name its weights:
python benchmarks/warmstart_time.py <spec> <empty cache dir> [key=value overrides...]
[--threads N].  ``--threads`` sets the process's torch threads first (default: torch's
own), as a run's own process (the machine's count) or a sweep's trial (one) has them;
the weights' sha256 shows whether two counts built the same model."""

import argparse
import json
import os
import time

import torch

from tether.platform.config import ConfigError, load_config
from tether.policy.load import resolve_policy, weights_sha256

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("spec")
parser.add_argument("cache", help="an empty model cache directory")
parser.add_argument("overrides", nargs="*", help="key=value config overrides")
parser.add_argument("--threads", type=int, default=None, help="torch threads (>= 1)")
args = parser.parse_args()
if args.threads is not None:
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: give a count of at least 1")
    torch.set_num_threads(args.threads)
try:
    cfg = load_config(args.spec, [f"model.cache_dir={args.cache}", *args.overrides])
except ConfigError as e:
    parser.error(str(e))
t0, c0 = time.perf_counter(), time.process_time()
path = resolve_policy(cfg.model, cfg.env, cfg.experiment.seed, cfg.rollout.max_reply_tokens, None)
print(
    json.dumps(
        {
            "spec": args.spec,
            "overrides": args.overrides,
            "threads": torch.get_num_threads(),
            "wall_s": round(time.perf_counter() - t0, 1),
            "cpu_s": round(time.process_time() - c0, 1),
            "load_after": os.getloadavg(),
            "weights_sha256": weights_sha256(path),
            "path": str(path),
        }
    ),
    flush=True,
)
