#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md, run on the lent H200 (see ../shared/tools/gpu-machine.md for getting
# onnxruntime-gpu there). Usage there, from the project root, with the prepared models/ and a copy of the test
# videos in .benchdata/ carried along:  bash deploy/gpu-bench.sh STEP   (STEP: check | engine | pipeline)
set -uo pipefail
export PYTHONPATH="$HOME/site:$PWD" PYTHONUNBUFFERED=1 EMOTION_TEST_DATA="$PWD/.benchdata"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" .benchdata/video
cp -n .benchdata/*.mp4 .benchdata/video/ 2>/dev/null
video=.benchdata/video/woman2.mp4
case "${1:-check}" in
  check)
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$OUT/gpu.txt"
    python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())" | tee -a "$OUT/gpu.txt"
    python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/test_gpu.txt" | tail -15
    ;;
  engine)
    python3 run_pipeline.py bench engine --model emotion --device cuda --precision fp32,fp16,int8 \
      --batch 1,64,256,1024,4096 --video "$video" --seconds 2 --log-level warning --json "$OUT/engine_emotion.json"
    python3 run_pipeline.py bench engine --model detector --device cuda --precision fp32,fp16,int8 \
      --batch 1,8,32,64 --detector-input 640x352 --video "$video" --seconds 2 --log-level warning \
      --json "$OUT/engine_detector.json"
    ;;
  pipeline)
    for cams in ${CAMS:-64}; do
      python3 run_pipeline.py bench pipeline --video "$video" --cameras "$cams" --fps 30 --device cuda \
        --precision "${PRECISION:-fp16}" --detector-input 640x352 --max-batch 64 --lanes 2 --duration "${DURATION:-15}" \
        --mode "${MODE:-both}" --log-level warning --json "$OUT/pipeline_${cams}.json"
    done
    ;;
esac
