#!/usr/bin/env bash
# One part of the collapse pilot (docs/collapse.md): one candidate at one seed, run from the
# pinned clone named in the protocol, in a store of the attempt's own, and its finished run
# exported (every metric's history, params and tags) to
# experiments/collapse_pilot/records/<candidate>-<seed>.json.gz as soon as it ends, so a
# sitting that stops mid-part loses only that part; run again, a part with a checkpoint
# continues from it (`tether run --resume`).  Commit the record.
#
#   bash experiments/collapse_pilot/run_part.sh p1_drgrpo_entropy 2000 2001 2002
#   tether analyze pilot experiments/collapse_pilot/records/*.json.gz
#
# TETHER_PIN_DIR: where the pinned clone lives (made, with its own .venv, if missing).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PIN=${TETHER_COLLAPSE_PIN:?set TETHER_COLLAPSE_PIN to the pinned commit of the protocol (docs/collapse.md)}
PIN_DIR=${TETHER_PIN_DIR:-$HOME/tether_pin_$PIN}
CANDIDATE=${1:?usage: run_part.sh <candidate> <seed>...}
shift
[ -f "$REPO/experiments/collapse_pilot/$CANDIDATE.yaml" ] ||
  { echo "run_part.sh: no candidate $CANDIDATE (experiments/collapse_pilot/*.yaml)" >&2; exit 2; }
[ $# -gt 0 ] || { echo "run_part.sh: name at least one seed" >&2; exit 2; }
if [ ! -d "$PIN_DIR" ]; then
  git -C "$REPO" worktree add --detach "$PIN_DIR" "$PIN"
  (cd "$PIN_DIR" && bash scripts/setup.sh)
fi
if [ "$(git -C "$PIN_DIR" rev-parse HEAD)" != "$(git -C "$REPO" rev-parse "$PIN^{commit}")" ] ||
  [ -n "$(git -C "$PIN_DIR" status --porcelain --untracked-files=no)" ]; then
  echo "run_part.sh: $PIN_DIR is not a clean checkout of $PIN" >&2
  exit 2
fi
RECORDS="$REPO/experiments/collapse_pilot/records"
LOGS="$HOME/tether_runs/collapse_pilot"
mkdir -p "$RECORDS" "$LOGS"
for seed in "$@"; do
  record="$RECORDS/$CANDIDATE-$seed.json.gz"
  [ -e "$record" ] && { echo "run_part.sh: $record exists: ran already" >&2; continue; }
  # A part cut short (the sitting ended, the machine went away) left its store with a
  # checkpoint: continue that MLflow run from it instead of starting the part again.
  store=$(ls -d "$LOGS/$CANDIDATE-$seed-"*/ 2>/dev/null | tail -1 || true)
  store=${store%/}
  resume=()
  if [ -n "$store" ] && [ -n "$(find "$store" -path '*checkpoints*' -name '*.pt' -print -quit)" ]; then
    resume=(--resume "$store")
    log="$store.log"
    echo "$(date -u +%FT%TZ) $CANDIDATE seed $seed at $PIN resumed from $store: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
  else
    store="$LOGS/$CANDIDATE-$seed-$(date -u +%Y%m%dT%H%M%S)"
    log="$store.log"
    mkdir -p "$store"
    echo "$(date -u +%FT%TZ) $CANDIDATE seed $seed at $PIN: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$log"
  fi
  start=$(date +%s)
  rc=0
  (cd "$PIN_DIR" && .venv/bin/tether run "experiments/collapse_pilot/$CANDIDATE.yaml" \
    "experiment.seed=$seed" "experiment.output_dir=$store" \
    "tracking.uri=sqlite:///$store/mlflow.db" ${resume[@]+"${resume[@]}"}) >>"$log" 2>&1 || rc=$?
  echo "$(date -u +%FT%TZ) exit $rc, wall $(($(date +%s) - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
  [ "$rc" = 0 ] || { echo "run_part.sh: $CANDIDATE $seed did not end cleanly ($log)" >&2; exit 1; }
  "$PIN_DIR/.venv/bin/python" - "$store/mlflow.db" "$record" <<'PY'
import gzip, json, sys
from mlflow.tracking import MlflowClient
from tether.store import metric_history  # the last value per step: a resumed run logs some twice

db, out = sys.argv[1:]
client = MlflowClient(f"sqlite:///{db}")
runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
(run,) = [r for r in runs if r.info.status == "FINISHED"]
history = {
    key: {str(step): value for step, value in metric_history(client, run.info.run_id, key).items()}
    for key in run.data.metrics
    if not key.startswith(("timing/", "system/"))
}
record = {"run_id": run.info.run_id, "params": run.data.params, "tags": run.data.tags,
          "metrics": history}
with gzip.open(out, "wt") as f:
    json.dump(record, f)
print(f"exported {len(history)} metrics of {run.info.run_id} to {out}")
PY
done
