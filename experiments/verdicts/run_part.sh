#!/usr/bin/env bash
# One part of a verdict spec, run the way docs/reproduction.md's amendment of 2026-11-27
# ("runs in parts") states: the spec as pinned at 560433b, one seed at a time (every arm of
# the seed, one MLflow parent per seed), each seed's finished runs exported to
# experiments/verdicts/records/<spec>-<seed>.json.gz as soon as the seed ends, so a machine
# that stops mid-part loses only the seed it was on.  Commit the records it writes.
#
#   bash experiments/verdicts/run_part.sh a_d 1002 1003      # seeds 1002 and 1003 of a_d
#   python -m tether.analysis.paper experiments/verdicts/records/*.json.gz --table
#
# For specs whose parts are seeds (a_d, c); the sensitivity sweep has one seed.
# TETHER_PIN_DIR: where the pinned clone lives (made, with its own .venv, if missing).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PIN=560433b
PIN_DIR=${TETHER_PIN_DIR:-$HOME/tether_pin_$PIN}
SPEC=${1:?usage: run_part.sh <a_d|c> <seed>...}
shift
[ $# -gt 0 ] || { echo "run_part.sh: name at least one seed" >&2; exit 2; }
case "$SPEC" in a_d | c) ;; *) echo "run_part.sh: $SPEC: parts are seeds of a_d or c" >&2; exit 2 ;; esac

if [ ! -d "$PIN_DIR" ]; then
  git -C "$REPO" worktree add --detach "$PIN_DIR" "$PIN"
  (cd "$PIN_DIR" && bash scripts/setup.sh)
fi
want=$(git -C "$REPO" rev-parse "$PIN^{commit}")
if [ "$(git -C "$PIN_DIR" rev-parse HEAD)" != "$want" ] ||
  [ -n "$(git -C "$PIN_DIR" status --porcelain --untracked-files=no)" ]; then
  echo "run_part.sh: $PIN_DIR is not a clean checkout of $PIN" >&2
  exit 2
fi

RECORDS="$REPO/experiments/verdicts/records"
LOGS="$HOME/tether_runs/verdicts/parts"
mkdir -p "$RECORDS" "$LOGS"
for seed in "$@"; do
  record="$RECORDS/$SPEC-$seed.json.gz"
  if [ -e "$record" ]; then
    echo "run_part.sh: $record exists: seed $seed of $SPEC has run" >&2
    continue
  fi
  part="$LOGS/$SPEC-$seed.yaml"
  # The pinned spec with its seed grid narrowed to this seed, nothing else changed.
  "$PIN_DIR/.venv/bin/python" - "$PIN_DIR/experiments/verdicts/$SPEC.yaml" "$seed" "$part" <<'EOF'
import sys

import yaml

source, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = yaml.safe_load(open(source))
space = spec["sweep"]["space"]
if seed not in space["experiment.seed"]["grid"]:
    sys.exit(f"run_part.sh: seed {seed} is not in {source}'s grid")
space["experiment.seed"] = {"grid": [seed]}
yaml.safe_dump(spec, open(out, "w"), sort_keys=False)
EOF
  log="$LOGS/$SPEC-$seed.log"
  echo "$(date -u +%FT%TZ) $SPEC seed $seed: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$log"
  start=$(date +%s)
  rc=0
  (cd "$PIN_DIR" && .venv/bin/tether sweep "$part") >>"$log" 2>&1 || rc=$?
  echo "$(date -u +%FT%TZ) exit $rc, wall $(($(date +%s) - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg)" |
    tee -a "$log"
  if [ "$rc" != 0 ]; then # a trial failed or the sweep was stopped: rerun the seed whole
    echo "run_part.sh: seed $seed of $SPEC did not end cleanly ($log); nothing exported" >&2
    exit 1
  fi
  parent=$(grep -o "MLflow parent run [0-9a-f]\{32\}" "$log" | head -1 | awk '{print $4}')
  if [ -z "$parent" ]; then
    echo "run_part.sh: no MLflow parent in $log" >&2
    exit 1
  fi
  (cd "$REPO" && .venv/bin/python -m tether.analysis.paper "$parent" \
    --tracking-uri "sqlite:///$HOME/tether_runs/verdicts/mlflow.db" --export "$record" >/dev/null) ||
    { echo "run_part.sh: seed $seed of $SPEC did not finish every arm ($log)" >&2; exit 1; }
done
