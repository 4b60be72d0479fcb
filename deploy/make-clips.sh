#!/usr/bin/env bash
# The two clips made from group_1080p.mp4 that the GPU benchmarks use beside it (BENCHMARKS.md, rounds 22-23), with
# FFmpeg (Debian's `ffmpeg` package), into OUT_DIR (default .whl/clips: git-ignored, never committed):
#   group_1080p_ipp.mp4   re-encoded without B-frames, an IDR every 2 s: how most IP cameras send (3 MB)
#   group_1080p_live.mp4  looped 15 times and encoded once as one 63 s stream with B-frames (x264's pyramid, an IDR
#                         every 2 s): a live B-frame camera's stand-in, no loop within a benchmark run (27 MB)
# Usage, from the project root: bash deploy/make-clips.sh [DATA_DIR (../shared/data)]
# gpu-bench.sh reads them from .benchdata/video (CLIP=...); `CLIPS=1 bash deploy/gpu-stage.sh` packs them.
set -euo pipefail
data=${1:-../shared/data}
out=${OUT_DIR:-.whl/clips}
source_clip="$data/video/group_1080p.mp4"
[ -f "$source_clip" ] || { echo "make-clips: $source_clip not found (pass the data folder)" >&2; exit 2; }
command -v ffmpeg >/dev/null || { echo "make-clips: ffmpeg not found (apt-get install ffmpeg)" >&2; exit 2; }
mkdir -p "$out"
echo "make-clips: $out/group_1080p_ipp.mp4"
ffmpeg -v error -y -i "$source_clip" -an -c:v libx264 -preset medium -crf 20 -bf 0 -g 50 "$out/group_1080p_ipp.mp4"
echo "make-clips: $out/group_1080p_live.mp4 (about a minute on 2 cores)"
ffmpeg -v error -y -stream_loop 14 -i "$source_clip" -an -c:v libx264 -preset veryfast -crf 23 -bf 3 -g 50 \
  -keyint_min 50 -sc_threshold 0 "$out/group_1080p_live.mp4"
ls -l "$out"
