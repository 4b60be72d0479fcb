#!/usr/bin/env bash
# Runs a lease's plan of deploy/gpu-bench.sh steps inside one `run` call's time limit, and packs every result into one
# file. Why: a call may run 10 minutes and bring back 8 files, while a plan of groups runs writes dozens of JSON
# files and each step's length varies by host; a step started too late is killed with nothing to show.
# Usage, on the GPU machine from the project root once the stage is assembled (deploy/gpu-stage.sh):
#   END=540 bash deploy/gpu-plan.sh deploy/plans/NAME.sh
# A plan is a bash file of `step NEED_S STEP [VAR=VALUE ...]` lines: gpu-bench.sh STEP with those variables, started
# only if more than NEED_S seconds of END (seconds from the start; default 540) are left, and stopped at END less
# MARGIN_S (10), kept for packing the results.
# Results go to $OUT/plan_<plan name>.tgz (every step's files and the log; the log also to stdout, each step's last
# lines). BENCH names the script to run (default: deploy/gpu-bench.sh beside this one).
set -uo pipefail
plan=${1:?"usage: END=540 bash deploy/gpu-plan.sh deploy/plans/NAME.sh"}
[ -f "$plan" ] || { echo "gpu-plan: no plan file $plan" >&2; exit 2; }
final_out=${OUT:?"gpu-plan: OUT must name the folder whose files come back"}
bench=${BENCH:-$(dirname "$0")/gpu-bench.sh}
name=$(basename "$plan" .sh)
end=${END:-540}
started=$SECONDS
results=$(mktemp -d)
log=$results/log_$name.txt

left() { echo $(( end - (SECONDS - started) )); }

step() {  # step NEED_S STEP [VAR=VALUE ...]; the last MARGIN_S seconds (10) are kept for packing the results
  local need=$1 which=$2 budget
  shift 2
  budget=$(( $(left) - ${MARGIN_S:-10} ))
  if [ "$budget" -le "$need" ] || [ "$budget" -le 0 ]; then
    echo "gpu-plan: skipped $which $* ($budget s left, $need needed)" | tee -a "$log"
    return 0
  fi
  echo "gpu-plan: $which $* ($budget s left, $(date -u +%H:%M:%S) UTC)" | tee -a "$log"
  OUT=$results timeout --kill-after=5 "$budget" env "$@" bash "$bench" "$which" >>"$log" 2>&1
  local status=$?
  [ "$status" -eq 0 ] || echo "gpu-plan: $which ended with status $status" | tee -a "$log"
  tail -n 4 "$log" | grep -v '^gpu-plan:'
  return 0
}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >>"$log" 2>&1
else
  echo "gpu-plan: no nvidia-smi here" >>"$log"
fi
# shellcheck source=/dev/null
source "$plan"
echo "gpu-plan: done in $(( SECONDS - started )) s" | tee -a "$log"
mkdir -p "$final_out" && tar -czf "$final_out/plan_$name.tgz" -C "$results" . && rm -rf "$results"
