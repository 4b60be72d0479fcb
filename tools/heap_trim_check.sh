#!/usr/bin/env bash
# The daemon itself (`run_pipeline.py run`) on CAMS (4) file cameras of VIDEO (woman2.mp4) at FPS (15), interval 3,
# CPU, with inference.trim_heap_s 0 (glibc keeps what the process freed) and 30 (the default), alternated ROUNDS
# (2) times: resident memory after SECONDS_EACH (80) of running. BENCHMARKS.md, round 20.
# Usage: bash tools/heap_trim_check.sh   (from the project root, the venv's python as PYTHON)
set -euo pipefail
python=${PYTHON:-.venv/bin/python}
video=$(realpath "${VIDEO:-../shared/data/video/woman2.mp4}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for round in $(seq "${ROUNDS:-2}"); do
  for trim in 0 30; do
    config=$work/trim_$trim.yaml
    {
      echo "cameras:"
      for i in $(seq "${CAMS:-4}"); do echo "  - {name: cam$i, source: '$video', fps: ${FPS:-15}, loop: true}"; done
      echo "detector: {interval: 3}"
      echo "inference: {trim_heap_s: $trim}"
      echo "server: {enabled: false}"
      echo "outputs: []"
    } > "$config"
    "$python" run_pipeline.py run --config "$config" --log-level warning > "$work/log_${trim}_${round}.txt" 2>&1 &
    pid=$!
    sleep "${SECONDS_EACH:-80}"
    rss=$(awk '/^VmRSS|^RssAnon/ {printf "%s %.0f MB  ", $1, $2 / 1024}' "/proc/$pid/status")
    kill -TERM "$pid"; wait "$pid" || true
    echo "round $round, trim_heap_s $trim: $rss"
  done
done
