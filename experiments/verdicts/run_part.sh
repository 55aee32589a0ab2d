#!/usr/bin/env bash
# One part of a verdict spec, run the way docs/reproduction.md's amendments of 2026-11-27
# ("runs in parts") state: the spec as pinned at 560433b, one part at a time (a_d and c: a
# seed, every arm of it; sensitivity: an entropy coefficient, every KL x top-p cell of it;
# one MLflow parent per part), each part's finished runs exported to
# experiments/verdicts/records/<spec>-<part>.json.gz as soon as the part ends, so a machine
# that stops mid-part loses only the part it was on, with the sha256 of each warm start
# its runs began from beside it (<spec>-<part>.warmstart.sha256).  Commit both.
#
# c_whole (the amendment of 2026-11-29, noon): the pinned c.yaml with its noise grid
# widened to 0 %, 20 % and 100 %, so that a seed's six arms (a_d's 0 % none and top-p arms
# among them) run in one part from one warm start, on whatever machine runs the part.
#
# avw (the amendment of 2026-11-29, night): act against warn, one seed a part: the pinned
# benchmarks/act_vs_warn.py in pilot C's setting, warn then act (act also on reading_drift),
# both from the seed's one warm start, exported by their run ids.
#
#   bash experiments/verdicts/run_part.sh a_d 1002 1003      # seeds 1002 and 1003 of a_d
#   bash experiments/verdicts/run_part.sh c_whole 1004       # seed 1004 at every noise level
#   bash experiments/verdicts/run_part.sh sensitivity 0.001  # the 9 cells at entropy 0.001
#   bash experiments/verdicts/run_part.sh avw 1000           # act against warn, seed 1000
#   python -m tether.analysis.paper experiments/verdicts/records/{a_d,c}-*.json.gz --table
#   python -m tether.analysis.paper experiments/verdicts/records/sensitivity-*.json.gz \
#       --sensitivity --table
#
# TETHER_PIN_DIR: where the pinned clone lives (made, with its own .venv, if missing).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PIN=560433b
PIN_DIR=${TETHER_PIN_DIR:-$HOME/tether_pin_$PIN}
SPEC=${1:?usage: run_part.sh <a_d|c|c_whole|avw> <seed>... | run_part.sh sensitivity <entropy coef>...}
shift
SOURCE=$SPEC # the pinned spec a part narrows
NOISE=""     # c_whole: c.yaml with env.stochasticity's grid widened to these levels
case "$SPEC" in
  a_d | c) KEY=experiment.seed ;;
  c_whole) KEY=experiment.seed SOURCE=c NOISE="[0.0, 0.2, 1.0]" ;;
  avw) KEY=experiment.seed SOURCE=a_d ;; # a_d's seeds; the part runs the benchmark, not a sweep
  sensitivity) KEY=algo.entropy_coef ;;
  *)
    echo "run_part.sh: $SPEC: the specs are a_d, c, c_whole and avw (parts: seeds), sensitivity (parts: entropy coefficients)" >&2
    exit 2
    ;;
esac
[ $# -gt 0 ] || { echo "run_part.sh: name at least one part (a value of $KEY)" >&2; exit 2; }

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

# avw: pilot C's push (the injection from iteration 2, 32 iterations, the learning rate held,
# no KL term); the act run also acts on reading_drift (its default response: one rollback).
AVW_SETTING="--iterations 32 --inject-from 2 algo.lr_schedule=constant algo.kl_coef=0"
RECORDS="$REPO/experiments/verdicts/records"
LOGS="$HOME/tether_runs/verdicts/parts"
mkdir -p "$RECORDS" "$LOGS"
for value in "$@"; do
  record="$RECORDS/$SPEC-$value.json.gz"
  if [ -e "$record" ]; then
    echo "run_part.sh: $record exists: $KEY $value of $SPEC has run" >&2
    continue
  fi
  part="$LOGS/$SPEC-$value.yaml"
  # The pinned spec with one grid narrowed to this part's value (and c_whole's noise grid
  # widened), nothing else changed.
  "$PIN_DIR/.venv/bin/python" - "$PIN_DIR/experiments/verdicts/$SOURCE.yaml" "$KEY" "$value" "$part" "$NOISE" <<'EOF'
import sys

import yaml

source, key, text, out, noise = sys.argv[1:]
value = yaml.safe_load(text)
spec = yaml.safe_load(open(source))
space = spec["sweep"]["space"]
grid = space[key]["grid"]
if isinstance(value, bool) or value not in grid:
    sys.exit(f"run_part.sh: {key} {text} is not in {source}'s grid {grid}")
if text not in map(str, grid):  # one name per part: the record's file name
    sys.exit(f"run_part.sh: name {key} {text} as the grid does: {[str(g) for g in grid]}")
space[key] = {"grid": [value]}
if noise:
    space["env.stochasticity"] = {"grid": yaml.safe_load(noise)}
yaml.safe_dump(spec, open(out, "w"), sort_keys=False)
EOF
  log="$LOGS/$SPEC-$value.log"
  echo "$(date -u +%FT%TZ) $SPEC $KEY $value: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$log"
  start=$(date +%s)
  rc=0
  # A sweep name of its own per attempt: a part cut short left its state under the last one
  # (its runs stay in the store, under their own parent, and are never exported).
  name="$SPEC-$value-$(date -u +%Y%m%dT%H%M%S)"
  if [ "$SPEC" = avw ]; then # two runs, each in a store of the attempt's own
    store="$LOGS/$name"
    tracking="sqlite:///$store/mlflow.db"
    for mode in warn act; do
      extra=""
      [ "$mode" = act ] && extra="alarms.reading_drift.mode=act"
      (cd "$PIN_DIR" && .venv/bin/python benchmarks/act_vs_warn.py --seeds "$value" \
        --modes "$mode" --out "$store" $AVW_SETTING $extra) >>"$log" 2>&1 || rc=$?
      [ "$rc" = 0 ] || break
    done
    targets=$(grep -o '"run_id": "[0-9a-f]\{32\}"' "$log" | awk -F'"' '{print $4}' | tr '\n' ' ')
  else
    tracking="sqlite:///$HOME/tether_runs/verdicts/mlflow.db"
    (cd "$PIN_DIR" && .venv/bin/tether sweep "$part" "sweep.name=$name") >>"$log" 2>&1 || rc=$?
  fi
  echo "$(date -u +%FT%TZ) exit $rc, wall $(($(date +%s) - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg)" |
    tee -a "$log"
  if [ "$rc" != 0 ]; then # a trial failed or the sweep was stopped: rerun the part whole
    echo "run_part.sh: $KEY $value of $SPEC did not end cleanly ($log); nothing exported" >&2
    exit 1
  fi
  if [ "$SPEC" != avw ]; then
    targets=$(grep -o "MLflow parent run [0-9a-f]\{32\}" "$log" | head -1 | awk '{print $4}')
  fi
  if [ -z "$targets" ]; then
    echo "run_part.sh: no MLflow run ids in $log" >&2
    exit 1
  fi
  # shellcheck disable=SC2086 # avw: the two run ids
  (cd "$REPO" && .venv/bin/python -m tether.analysis.paper $targets \
    --tracking-uri "$tracking" --export "$record" >/dev/null) ||
    { echo "run_part.sh: $KEY $value of $SPEC did not finish every arm ($log)" >&2; exit 1; }
  # The warm start each run began from, by content: the same seed rebuilt on another machine
  # need not give the same weights, and pairs across parts assume it does.
  warm="$RECORDS/$SPEC-$value.warmstart.sha256"
  "$REPO/.venv/bin/python" "$REPO/experiments/verdicts/warmstart_sha256.py" "$record" >"$warm" || { rm -f "$warm"; exit 1; }
  echo "$(date -u +%FT%TZ) warm start: $(cat "$warm")" | tee -a "$log"
done
