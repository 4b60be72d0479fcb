#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md, run on the lent H200 (deploy/gpu-stage.sh packs the wheels, the prepared
# models and the test clips for it, ../shared/tools/gpu-machine.md says how calls carry them). Usage there, from the
# project root, once the stage is assembled:  bash deploy/gpu-bench.sh STEP   (STEP: check | probe | session-probe | engine | emotion-own | pipeline | profile | nvdec-capture | nvdec-pipeline | trt-standin |
#  frames-check | frames-probe | frames-pipeline | inflight | inflight-32 | processes | groups |
#  groups-sweep | groups-ab | provider-ab | step-ab | fif-ab | graphs-ab | follow-ab | trim-ab | face-ab | split-probe | nvdec-latency | nvdec-memory | nvdec-cpu | nvdec-pyav | ab | memory | interval-sweep | waits | multi-gpu |
#  cuda-handles | stack | small)
# pipeline/profile read CAMS, MODE, DURATION, PRECISION and EXTRA (more bench pipeline options) from the environment;
# profile needs py-spy installed under $HOME/tools (a wheel carried in .whl/tools).
set -uo pipefail
export PYTHONPATH="$HOME/site:$PWD" PYTHONUNBUFFERED=1 EMOTION_TEST_DATA="$PWD/.benchdata"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" .benchdata/video
cp -n .benchdata/*.mp4 .benchdata/video/ 2>/dev/null
video=.benchdata/video/woman2.mp4
alternated() {  # alternated LABEL FLAG "A B": the groups step at CAMS (64) cameras in groups of <= PER (32), INTERVAL
  # (3), MODEL (the student), with FLAG A then B in each round of ROUNDS (1 2), every other round in the other order;
  # a FLAG ending in = takes its value without a space (--set inference.key=)
  local label=$1 flag=$2 order=$3 cams=${CAMS:-64} round value gap=" "
  [ "${flag: -1}" = "=" ] && gap=""
  for round in ${ROUNDS:-1 2}; do
    for value in $order; do
      CAMS=$cams PROCS=$(( (cams + ${PER:-32} - 1) / ${PER:-32} )) INTERVAL=${INTERVAL:-3} TAG="_${label}${value}_r$round" \
        EXTRA="--set emotion.model=${MODEL:-dlibface_student64} $flag$gap$value ${EXTRA:-}" bash "$0" groups
    done
    order=$(echo "$order" | awk '{for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "")}')
  done
}
case "${1:-check}" in
  check)
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$OUT/gpu.txt"
    python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())" | tee -a "$OUT/gpu.txt"
    python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/test_gpu.txt" | tail -15
    ;;
  probe)  # PROBE_VARIANTS: only these of deploy/ort_cuda_probe.py's VARIANTS, each in a process of its own
    if [ -n "${PROBE_VARIANTS:-}" ]; then
      for variant in $PROBE_VARIANTS; do
        echo "{\"variant\": \"$variant\", \"result\": $(python3 deploy/ort_cuda_probe.py models/retinaface_mnet025.fp16.onnx "$variant" | tail -1)}"
      done | tee "$OUT/probe${TAG:-}.jsonl"
    else
      python3 deploy/ort_cuda_probe.py models/retinaface_mnet025.fp16.onnx | tee "$OUT/probe.jsonl"
    fi
    ;;
  split-probe)  # issue 25 (cores): the frame detector graph split at the network's outputs, its body captured as a CUDA
    # graph (deploy/split_detector_probe.py): wall and CPU ms per run against the whole graph, per batch of BATCHES;
    # then the crop + emotion graph plain and captured, per face count of FACES
    python3 deploy/split_detector_probe.py --device cuda --batches "${BATCHES:-4,8,16}" --faces "${FACES:-16,64,256}" \
      | tee "$OUT/split_probe${TAG:-}.jsonl"
    ;;
  session-probe)  # issue 25 item 3: what each further CUDA session costs with the shared arena, per option
    python3 deploy/ort_cuda_probe.py models/retinaface_mnet025.fp16.onnx --sessions ${SESSION_VARIANTS:-} \
      | tee "$OUT/session_probe${TAG:-}.jsonl"
    ;;
  cuda-handles)  # issue 25: host memory (VmRSS) of each cuDNN / cuBLAS / cuBLASLt handle and of each further CUDA session
    python3 deploy/cuda_handle_probe.py models/retinaface_mnet025.fp16.onnx 3 3 | tee "$OUT/cuda_handles${TAG:-}.jsonl"
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
        --mode "${MODE:-both}" --log-level warning --json "$OUT/pipeline_${cams}${TAG:-}.json" ${EXTRA:-}
    done
    ;;
  trt-standin)  # the TensorRT backend's CUDA plumbing around a stand-in engine (TensorRT cannot be installed here)
    python3 deploy/trt_standin.py > /dev/null
    ;;
  nvdec-capture)  # capture alone: CPU per camera decoding 1080p on the CPU (FFmpeg) vs on NVDEC (PyNvVideoCodec)
    for cams in ${CAMS:-16 64}; do
      for decode in cpu gpu; do
        python3 run_pipeline.py bench capture --video .benchdata/video/group_1080p.mp4 --cameras "$cams" --seconds 10 \
          --decode "$decode" --log-level warning --json "$OUT/capture_${cams}_${decode}.json"
      done
    done
    ;;
  nvdec-pipeline)  # the whole pipeline on group_1080p.mp4 at 25 fps, batched, decode cpu vs gpu in one session
    for cams in ${CAMS:-16 32 64}; do
      for decode in ${DECODES:-cpu gpu}; do
        python3 run_pipeline.py bench pipeline --video .benchdata/video/group_1080p.mp4 --cameras "$cams" --fps 25 \
          --device cuda --precision fp16 --detector-input 640x352 --max-batch 64 --lanes 2 --batch-step 2 \
          --duration "${DURATION:-15}" --mode batched --decode "$decode" --log-level warning \
          --json "$OUT/pipeline_1080p_${cams}_${decode}.json" | tail -3
      done
    done
    ;;
  frames-check)  # the frame graphs path on CUDA against the OpenCV path, with host frames and NVDEC frames
    python3 -m pytest -q tests/test_frames_path.py tests/test_nvdec.py -p no:cacheprovider 2>&1 \
      | tee "$OUT/test_frames_gpu.txt" | tail -15
    ;;
  emotion-own)  # issue 13's GPU target: the project's own emotion model vs mini-Xception, whole engine, best batch
    sed 's/model: mini_xception_fer2013/model: fer2013_resnet_t64/' config/default.yaml > "$OUT/own.yaml"
    for cfg in config/default.yaml "$OUT/own.yaml"; do
      python3 run_pipeline.py bench engine --model emotion --device cuda --precision fp32,fp16 \
        --batch 64,256,1024,4096 --video "$video" --seconds 2 --config "$cfg" --log-level warning \
        --json "$OUT/engine_$(basename "$cfg" .yaml).json"
    done
    ;;
  frames-probe)  # node placement of the frame graphs, and one batch's cost with frames already on the GPU
    python3 deploy/frame_graphs_probe.py .benchdata/video/group_1080p.mp4 2> "$OUT/frames_probe.err" \
      | tee "$OUT/frames_probe.jsonl"
    tail -5 "$OUT/frames_probe.err"
    ;;
  frames-pipeline)  # group_1080p.mp4 at 25 fps, NVDEC, batched: frame_path opencv vs graph in one session (lanes 1, step 2 since the GIL fix of 2026-12-01; EXTRA="--lanes 2 --batch-step 4" for the earlier runs)
    for cams in ${CAMS:-16 32 64}; do
      for path in ${PATHS:-opencv graph}; do
        python3 run_pipeline.py bench pipeline --video .benchdata/video/group_1080p.mp4 --cameras "$cams" --fps 25 \
          --device cuda --precision fp16 --detector-input 640x352 --max-batch 64 --lanes 1 --batch-step 2 \
          --duration "${DURATION:-15}" --mode "${MODE:-batched}" --decode gpu --frame-path "$path" \
          --log-level warning --json "$OUT/frames_1080p_${cams}_${path}${TAG:-}.json" ${EXTRA:-} | tail -4
      done
    done
    ;;
  inflight)  # issue 11 (2026-12-01 evening): 64 cameras with 2 and 1 frames in flight, 48 and 80 cameras, woman2 x 64 at
    # 30 fps; BASE=DIR (a copy of an older commit, e.g. git archive f1934d8) runs the same 64-camera command there
    common="--fps 25 --device cuda --precision fp16 --detector-input 640x352 --max-batch 64 --lanes 1 --batch-step 2 \
      --mode batched --decode gpu --frame-path graph --duration ${DURATION:-15} --log-level warning ${EXTRA:-}"
    group="$PWD/.benchdata/video/group_1080p.mp4"
    python3 run_pipeline.py bench pipeline --video "$group" --cameras 64 $common --json "$OUT/new_64.json" | tail -3
    if [ -n "${BASE:-}" ]; then
      cp -n models/*.onnx models/*.json "$BASE/models/" 2>/dev/null
      (cd "$BASE" && PYTHONPATH="$HOME/site:$PWD" python3 run_pipeline.py bench pipeline --video "$group" --cameras 64 \
        $common --json "$OUT/base_64.json" | tail -3)
    fi
    python3 run_pipeline.py bench pipeline --video "$group" --cameras 64 $common --frames-in-flight 1 \
      --json "$OUT/new_64_inflight1.json" | tail -3
    for cams in ${MORE_CAMS:-48 80}; do
      python3 run_pipeline.py bench pipeline --video "$group" --cameras "$cams" $common --json "$OUT/new_$cams.json" | tail -3
    done
    python3 run_pipeline.py bench pipeline --video "$PWD/$video" --cameras 64 ${common/--fps 25/--fps 30} \
      --json "$OUT/new_woman2_64.json" | tail -3
    ;;
  inflight-32)  # batched vs naive at 32 cameras of 1080p (naive: one perception and lane per camera; slow to prepare)
    python3 run_pipeline.py bench pipeline --video "$PWD/.benchdata/video/group_1080p.mp4" --cameras 32 --fps 25 \
      --device cuda --precision fp16 --detector-input 640x352 --max-batch 64 --lanes 1 --batch-step 2 --mode both \
      --decode gpu --frame-path graph --duration "${DURATION:-15}" --log-level warning --json "$OUT/new_32_both.json" \
      | tail -5
    ;;
  processes)  # issue 11 item 5's premise: 64 cameras as P processes of 64/P cameras each, run at the same time (each
    # its own engine and GIL; the GPU shared by P CUDA contexts), against 1 x 64 in the same session. MPS=1 runs them
    # as clients of NVIDIA's Multi-Process Service (one daemon started here and stopped after; no device setting changed)
    if [ -n "${MPS:-}" ]; then
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && nvidia-cuda-mps-control -d && echo "MPS daemon up"
      trap 'echo quit | nvidia-cuda-mps-control; cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$OUT/" 2>/dev/null' EXIT
    fi
    for procs in ${PROCS:-1 2 4}; do
      cams=$(( ${TOTAL:-64} / procs ))
      for i in $(seq 1 "$procs"); do
        python3 run_pipeline.py bench pipeline --video "$PWD/.benchdata/video/group_1080p.mp4" --cameras "$cams" \
          --fps 25 --device cuda --precision fp16 --detector-input 640x352 --max-batch 64 --lanes 1 --batch-step 2 \
          --mode batched --decode gpu --frame-path graph --duration "${DURATION:-20}" --log-level warning \
          --json "$OUT/procs${procs}_${i}.json" > "$OUT/procs${procs}_${i}.txt" 2>&1 &
      done
      wait
      tail -n 2 "$OUT"/procs"${procs}"_*.txt
    done
    ;;
  groups)  # the daemon's own camera groups (bench pipeline --processes P, observations back through the queue) under
    # MPS, against one process, CAMS cameras of CLIP (default group_1080p.mp4) at FPS (25), in one session
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && nvidia-cuda-mps-control -d && echo "MPS daemon up"
    trap 'echo quit | nvidia-cuda-mps-control' EXIT
    clip=${CLIP:-group_1080p.mp4}
    for procs in ${PROCS:-4 2 1}; do  # PROFILER: a command prefix, e.g. "py-spy record --subprocesses ... --"
      ${PROFILER:-} python3 run_pipeline.py bench pipeline --video "$PWD/.benchdata/video/$clip" --cameras "${CAMS:-64}" \
        --fps "${FPS:-25}" --device cuda --precision fp16 --detector-input 640x352 --max-batch 64 --lanes 1 \
        --batch-step 2 --mode batched --decode gpu --frame-path graph --duration "${DURATION:-20}" --processes "$procs" \
        --interval "${INTERVAL:-1}" --log-level warning ${EXTRA:-} \
        --json "$OUT/groups_${clip%.mp4}_${CAMS:-64}cams_${procs}${TAG:-}.json" | tail -3
    done
    ;;
  groups-sweep)  # the most cameras that hold p99 <= 100 ms: each count of CAMS_LIST as groups of PER cameras (32)
    per=${PER:-32}
    for cams in ${CAMS_LIST:-64 96 128 160}; do
      CAMS=$cams PROCS=$(( (cams + per - 1) / per )) bash "$0" groups
    done
    ;;
  memory)  # issue 25 item 3: one camera group's GPU and host memory step by step (bench memory), one process per
    # variant, CLIP (group_1080p.mp4) at 25 fps through NVDEC on the frame graphs path; VARIANTS picks among the names
    # below. CLIP=group_1080p_ipp.mp4 (as IP cameras send: no B-frames; NVDEC then needs half the surfaces) and
    # CLIP=group_1080p_live.mp4 are made by deploy/make-clips.sh (CLIPS=1 bash deploy/gpu-stage.sh packs them).
    # EXTRA="--arena-log $OUT/arena_log.txt" adds what ONNX Runtime's arenas grew by at each step (round 22).
    # group_1080p_live.mp4: B-frames as one long stream, no loop within a run (a live camera's stand-in, round 23);
    # `groups` takes CLIP the same way.
    # Since round 11 bench memory sizes its one process as the daemon does: cams8 (auto frames in flight) runs 1 frame
    # in flight and max_batch 8, as the daemon's 8 cameras do; an explicit --frames-in-flight is kept.
    common="--video $PWD/.benchdata/video/${CLIP:-group_1080p.mp4} --fps 25 --device cuda --precision fp16 --detector-input 640x352 \
      --lanes 1 --mode batched --decode gpu --frame-path graph --duration ${DURATION:-10} --settle-s 4 --log-level warning"
    for variant in ${VARIANTS:-base nocudnnws step4 student cams8}; do
      case $variant in
        base) opts="--cameras 32 --max-batch 64 --batch-step 2" ;;
        nocudnnws) opts="--cameras 32 --max-batch 64 --batch-step 2 --set inference.cudnn_max_workspace=false" ;;
        step4) opts="--cameras 32 --max-batch 64 --batch-step 4" ;;
        student) opts="--cameras 32 --max-batch 64 --batch-step 2 --set emotion.model=dlibface_student64" ;;
        minix) opts="--cameras 32 --max-batch 64 --batch-step 2 --set emotion.model=mini_xception_fer2013" ;;
        interval3) opts="--cameras 32 --max-batch 64 --batch-step 2 --interval 3" ;;
        cams8) opts="--cameras 8 --max-batch 16 --batch-step 2" ;;
        cams8step4) opts="--cameras 8 --max-batch 16 --batch-step 4" ;;
        mb32) opts="--cameras 32 --max-batch 32 --batch-step 2" ;;
        faces2048) opts="--cameras 32 --max-batch 64 --batch-step 2 --set inference.max_faces_per_run=2048" ;;
        cams8student) opts="--cameras 8 --max-batch 16 --batch-step 2 --set emotion.model=dlibface_student64" ;;
        nomp) opts="--cameras 32 --max-batch 64 --batch-step 2 --set inference.memory_pattern=false" ;;
        cams8nomp) opts="--cameras 8 --max-batch 16 --batch-step 2 --set inference.memory_pattern=false" ;;
        cams8studentnomp) opts="--cameras 8 --max-batch 16 --batch-step 2 --set emotion.model=dlibface_student64 --set inference.memory_pattern=false" ;;
        cams8lean) opts="--cameras 8 --max-batch 16 --batch-step 2 --set emotion.model=dlibface_student64 --set inference.max_faces_per_run=64" ;;
        cams8lean8) opts="--cameras 8 --max-batch 8 --batch-step 2 --set emotion.model=dlibface_student64 --set inference.max_faces_per_run=64" ;;
        cams8lean8nomp) opts="--cameras 8 --max-batch 8 --batch-step 2 --set emotion.model=dlibface_student64 --set inference.max_faces_per_run=64 --set inference.memory_pattern=false" ;;
        cams8lean8step4nomp) opts="--cameras 8 --max-batch 8 --batch-step 4 --set emotion.model=dlibface_student64 --set inference.max_faces_per_run=64 --set inference.memory_pattern=false" ;;
        cams8lean8step4) opts="--cameras 8 --max-batch 8 --batch-step 4 --set emotion.model=dlibface_student64 --set inference.max_faces_per_run=64" ;;
        cublasdefault) opts="--cameras 32 --max-batch 64 --batch-step 2 --set inference.cublas_workspace=''" ;;
        frames64) opts="--cameras 32 --max-batch 64 --batch-step 2 --set inference.max_frames_per_run=64" ;;
        frames32) opts="--cameras 32 --max-batch 64 --batch-step 2 --set inference.max_frames_per_run=32" ;;
        frames8) opts="--cameras 32 --max-batch 64 --batch-step 2 --set inference.max_frames_per_run=8" ;;
        frames16nomp) opts="--cameras 32 --max-batch 64 --batch-step 2 --set inference.memory_pattern=false" ;;
        cams8f4) opts="--cameras 8 --max-batch 16 --batch-step 2 --set inference.max_frames_per_run=4" ;;
        cams8mb8) opts="--cameras 8 --max-batch 8 --batch-step 2" ;;
        cams8faces128) opts="--cameras 8 --max-batch 16 --batch-step 2 --set inference.max_faces_per_run=128" ;;
        cams8faces64) opts="--cameras 8 --max-batch 16 --batch-step 2 --set inference.max_faces_per_run=64" ;;
        cams8faces64nomp) opts="--cameras 8 --max-batch 16 --batch-step 2 --set inference.max_faces_per_run=64 --set inference.memory_pattern=false" ;;
        cams8leanf4) opts="--cameras 8 --max-batch 8 --batch-step 4 --set emotion.model=dlibface_student64 --set inference.max_faces_per_run=64 --set inference.memory_pattern=false --set inference.max_frames_per_run=4" ;;
        *) echo "unknown variant $variant"; continue ;;
      esac
      echo "== memory $variant: $opts"
      python3 run_pipeline.py bench memory $common $opts ${EXTRA:-} --json "$OUT/memory_${variant}${TAG:-}.json" | tail -20
    done
    ;;
  stack)  # issue 25: the CUDA context's reservation of thread stacks (inference.gpu_stack_bytes): 8 cameras in one
    # process (bench memory, cams8: the daemon's defaults for 8) and CAMS (64) cameras in 2 groups (student, interval 3,
    # max_batch 32), CUDA's default ("default": null) against each size in SIZES, in that order
    for size in ${SIZES:-default 0}; do
      set="--set inference.gpu_stack_bytes=$size"; [ "$size" = default ] && set="--set inference.gpu_stack_bytes=null"
      VARIANTS=cams8 TAG="_stack_$size" EXTRA="$set" bash "$0" memory
    done
    for size in ${SIZES:-default 0}; do
      set="--set inference.gpu_stack_bytes=$size"; [ "$size" = default ] && set="--set inference.gpu_stack_bytes=null"
      CAMS=${CAMS:-64} PROCS=2 INTERVAL=3 DURATION=${DURATION:-15} TAG="_stack_$size" \
        EXTRA="--set emotion.model=dlibface_student64 --max-batch 32 $set" bash "$0" groups
    done
    ;;
  small)  # issue 25: 8 cameras in one process as the daemon sizes it (max_batch = cameras x frames in flight): GPU
    # memory (bench memory, memory pattern on and off) and frames, p99 and cores (bench pipeline, DURATION s), with 2
    # frames in flight per camera (max_batch 16, the default on this path) and with 1 (max_batch 8)
    for fif in 2 1; do
      mb=$((8 * fif))
      VARIANTS="cams8 cams8nomp" TAG="_fif$fif" EXTRA="--frames-in-flight $fif --max-batch $mb" bash "$0" memory
      python3 run_pipeline.py bench pipeline --video "$PWD/.benchdata/video/group_1080p.mp4" --cameras 8 --fps 25 \
        --device cuda --precision fp16 --detector-input 640x352 --max-batch $mb --frames-in-flight $fif --lanes 1 \
        --batch-step 2 --mode batched --decode gpu --frame-path graph --duration "${DURATION:-15}" --log-level warning \
        --json "$OUT/small_pipeline_fif$fif.json" | tail -3
    done
    ;;
  pool)  # issue 25 round 12: the frames a camera's pool holds. CAMS (64) cameras in 2 groups (student, interval 3,
    # max_batch 32): this tree against BASE=DIR (a copy of the commit before the previews let go of unwatched frames),
    # alternated ROUNDS (1) times, then this tree with one frame in flight; then BIG (150) cameras in groups of <= 32
    # with frames in flight FIFS (2 1), max_batch as the daemon sizes it (cameras x frames in flight); BIG=0 skips them
    cp -n models/*.onnx models/*.json "$BASE/models/" 2>/dev/null; ln -sfn "$PWD/.benchdata" "$BASE/.benchdata"
    student="--set emotion.model=dlibface_student64"
    for round in ${ROUNDS:-1}; do
      CAMS=${CAMS:-64} PROCS=2 INTERVAL=3 TAG="_new_$round" EXTRA="$student --max-batch 32" bash "$0" groups
      (cd "$BASE" && PYTHONPATH="$HOME/site:$BASE" CAMS=${CAMS:-64} PROCS=2 INTERVAL=3 TAG="_base_$round" \
        EXTRA="$student --max-batch 32" bash deploy/gpu-bench.sh groups)
    done
    CAMS=${CAMS:-64} PROCS=2 INTERVAL=3 TAG="_fif1" EXTRA="$student --max-batch 32 --frames-in-flight 1" bash "$0" groups
    big=${BIG:-150}
    [ "$big" = 0 ] || for fif in ${FIFS:-2 1}; do
      CAMS=$big PROCS=$(( (big + 31) / 32 )) INTERVAL=3 TAG="_fif$fif" EXTRA="$student --frames-in-flight $fif" \
        bash "$0" groups
    done
    ;;
  parts)  # issue 25 round 12: a lane holds max_frames_per_run frames (a batch runs in parts): each count of CAMS_LIST
    # (64 150) in groups of <= 32 (student, interval 3, max_batch as the daemon sizes it) at each batch step of STEPS
    for cams in ${CAMS_LIST:-64 150}; do
      for step in ${STEPS:-2 4}; do
        CAMS=$cams PROCS=$(( (cams + 31) / 32 )) INTERVAL=3 TAG="_parts_step$step" \
          EXTRA="--set emotion.model=dlibface_student64 --batch-step $step ${EXTRA:-}" bash "$0" groups
      done
    done
    ;;
  groups-ab)  # this tree against BASE=DIR (a copy of an older commit) as the daemon's camera groups: CAMS (150) cameras
    # in groups of <= PER (32), INTERVAL (3), EXTRA for both, alternated new, base for each round of ROUNDS (1 2).
    # WARMUP=1 first runs this tree once, kept apart (_warmup): a lease's first large runs were often its slowest
    # (round 13, lease 1: 92 % and 66 % analysed in the first two, 96-100 % in later runs of the same settings)
    cp -n models/*.onnx models/*.json "$BASE/models/" 2>/dev/null; ln -sfn "$PWD/.benchdata" "$BASE/.benchdata"
    cams=${CAMS:-150}; procs=$(( (cams + ${PER:-32} - 1) / ${PER:-32} ))
    [ "${WARMUP:-0}" = 1 ] && CAMS=$cams PROCS=$procs INTERVAL=${INTERVAL:-3} TAG="_warmup${TAG:-}" bash "$0" groups
    for round in ${ROUNDS:-1 2}; do
      CAMS=$cams PROCS=$procs INTERVAL=${INTERVAL:-3} TAG="_new_$round${TAG:-}" bash "$0" groups
      (cd "$BASE" && PYTHONPATH="$HOME/site:$BASE" CAMS=$cams PROCS=$procs INTERVAL=${INTERVAL:-3} \
        TAG="_base_$round${TAG:-}" bash deploy/gpu-bench.sh groups)
    done
    ;;
  provider-ab)  # issue 25 (host memory): ONNX Runtime's CUDA provider with OPTS added (e.g. '"fuse_conv_bias": "1",')
    # against as it is, as the daemon's camera groups: a copy of this tree under $HOME/provider-variant whose
    # cuda_provider_options carry OPTS too; CAMS (64) cameras in groups of <= PER (32), INTERVAL (3), the student,
    # EXTRA for both; for each round of ROUNDS (1 2) as-is then variant, every other round the other way round
    variant=$HOME/provider-variant opts=${OPTS:?"provider-ab adds OPTS, e.g. OPTS='\"fuse_conv_bias\": \"1\",'"}
    rm -rf "$variant" && mkdir -p "$variant" && cp -r pipeline run_pipeline.py config deploy "$variant/"
    ln -sfn "$PWD/models" "$variant/models"; ln -sfn "$PWD/.benchdata" "$variant/.benchdata"
    sed -i "s/\"cudnn_conv_algo_search\": \"HEURISTIC\",\$/\"cudnn_conv_algo_search\": \"HEURISTIC\", $opts/" \
      "$variant/pipeline/inference/onnxruntime.py"
    grep -qF "\"HEURISTIC\", $opts" "$variant/pipeline/inference/onnxruntime.py" \
      || { echo "provider-ab: cuda_provider_options not found in pipeline/inference/onnxruntime.py" >&2; exit 1; }
    cams=${CAMS:-64}; procs=$(( (cams + ${PER:-32} - 1) / ${PER:-32} )); order="asis variant"
    for round in ${ROUNDS:-1 2}; do
      for which in $order; do
        tree=$PWD; [ "$which" = variant ] && tree=$variant
        (cd "$tree" && PYTHONPATH="$HOME/site:$tree" CAMS=$cams PROCS=$procs INTERVAL=${INTERVAL:-3} \
          TAG="_${which}_r$round${TAG:-}" EXTRA="--set emotion.model=dlibface_student64 ${EXTRA:-}" \
          bash "$tree/deploy/gpu-bench.sh" groups)
      done
      order=$(echo "$order" | awk '{print $2, $1}')
    done
    ;;
  step-ab)  # issue 25 (2026-12-03): inference.batch_step 2 against 4 as the daemon sizes its groups, CAMS (64) cameras in
    # groups of <= PER (32), INTERVAL (3), MODEL (the student), EXTRA for both (_step$S_r$ROUND)
    alternated step --batch-step "2 4"
    ;;
  graphs-ab)  # issue 25 (cores at 150 cameras): inference.cuda_graphs off against on (the frame graphs' runs replayed
    # as CUDA graphs), CAMS (150) cameras in groups of <= PER (30), as step-ab otherwise (_graphs$V_r$ROUND)
    CAMS=${CAMS:-150} PER=${PER:-30} alternated graphs "--set inference.cuda_graphs=" "false true"
    ;;
  follow-ab)  # issue 25 (the crowd on NVDEC frames): tracking.follow_by motion (faces on GPU frames moved by their
    # motion alone) against look (found by their look inside the lanes' batches, inference/batch_search.py: what auto
    # does on the CUDA frame graphs path), CAMS (150) cameras in groups of <= PER (30), as step-ab otherwise
    # (_follow$V_r$ROUND); EXTRA="--set inference.cuda_graphs=true" as the 150-camera example config. (Round 17's
    # pair was "auto look", look then copying windows down; round 18's "motion look", look a follow-graph run a frame.)
    CAMS=${CAMS:-150} PER=${PER:-30} alternated follow "--set tracking.follow_by=" "motion look"
    ;;
  fif-ab)  # issue 25 (6 GB at 64 cameras with the defaults): frames in flight 2 (the default for groups) against 1 as
    # the daemon sizes its groups (max_batch = cameras x frames in flight), as step-ab, DURATION (45) s so that a pool's
    # idle buffers (freed after 30 s) are gone by the end (_fif$F_r$ROUND)
    DURATION=${DURATION:-45} alternated fif --frames-in-flight "2 1"
    ;;
  trim-ab)  # issue 25 (host memory): inference.trim_heap_s 0 (glibc keeps what the process freed) against 30 (the
    # default: the freed heap given back once a frame size is prepared, then every 30 s), CAMS (64) cameras in groups
    # of <= PER (32), as step-ab otherwise (_trim$V_r$ROUND)
    alternated trim "--set inference.trim_heap_s=" "0 30"
    ;;
  face-ab)  # issue 25 (GPU memory at 64 cameras): inference.face_batch_step 2 (face runs of 16, 32, 64, 128, 256: a
    # session each) against 4 (16, 64, 256), CAMS (64) cameras in groups of <= PER (32), as step-ab (_face$V_r$ROUND)
    alternated face "--set inference.face_batch_step=" "2 4"
    ;;
  interval-sweep)  # issue 25: the most cameras at detector.interval INTERVAL (3) with MODEL (the default), groups of
    # PER (32) cameras under MPS, each count of CAMS_LIST
    for cams in ${CAMS_LIST:-128 160}; do
      CAMS=$cams PROCS=$(( (cams + ${PER:-32} - 1) / ${PER:-32} )) INTERVAL=${INTERVAL:-3} TAG="_n${INTERVAL:-3}${MODEL:+_$MODEL}" \
        EXTRA="${MODEL:+--set emotion.model=$MODEL} ${EXTRA:-}" bash "$0" groups
    done
    ;;
  waits)  # issue 25 round 9: how threads wait for the GPU (inference.gpu_wait), tracking.pose_every and (round 10)
    # emotion.flip_followed, at CAMS (150) cameras in groups of PER (30), interval 3, MODEL (the student), one run per
    # variant in VARIANTS, in that order
    cams=${CAMS:-150}
    for variant in ${VARIANTS:-spin block pose2}; do
      case $variant in
        spin|block|auto) set="--set inference.gpu_wait=$variant" ;;
        pose2|pose3) set="--set inference.gpu_wait=block --set tracking.pose_every=${variant#pose}" ;;
        both|once|alternate)  # emotion.flip_followed true / false / alternate (the default since 2026-12-03)
          value=$variant; [ "$variant" = both ] && value=true; [ "$variant" = once ] && value=false
          set="--set emotion.flip_followed=$value" ;;
        *) echo "unknown variant $variant"; continue ;;
      esac
      echo "== waits $variant: $set"
      run=$(( ${run:-0} + 1 ))  # each run's JSON kept apart: a variant may be run again in the same VARIANTS
      CAMS=$cams PROCS=$(( (cams + ${PER:-30} - 1) / ${PER:-30} )) INTERVAL=3 TAG="_${variant}_r${ROUND:-1}_$run" \
        EXTRA="--set emotion.model=${MODEL:-dlibface_student64} $set ${EXTRA:-}" bash "$0" groups
    done
    ;;
  multi-gpu)  # issue 28 (a machine with several GPUs: nvidia-h200-x2 or larger): groups of PER (32) cameras spread
    # over every GPU (inference.devices left to its default), one MPS control daemon serving them all, then the same
    # cameras on GPU 0 alone (DEVICES=0): the ratio of what each analysed. Per-GPU busy, NVDEC and memory in the JSON.
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && nvidia-cuda-mps-control -d && echo "MPS daemon up"
    trap 'echo quit | nvidia-cuda-mps-control' EXIT
    gpus=$(nvidia-smi -L | grep -c '^GPU ')
    for cams in ${CAMS_LIST:-150 200 300}; do
      for devices in "all" "0"; do
        set_devices=""; [ "$devices" = "0" ] && set_devices="--set inference.devices=[0]"
        python3 run_pipeline.py bench pipeline --video "$PWD/.benchdata/video/group_1080p.mp4" --cameras "$cams" \
          --fps 25 --device cuda --precision fp16 --detector-input 640x352 --max-batch 64 --lanes 1 --batch-step 2 \
          --mode batched --decode gpu --frame-path graph --duration "${DURATION:-20}" \
          --processes $(( (cams + ${PER:-32} - 1) / ${PER:-32} )) --interval "${INTERVAL:-3}" \
          --set emotion.model=${MODEL:-dlibface_student64} $set_devices --log-level warning \
          --json "$OUT/multigpu_${cams}cams_${devices}of${gpus}.json" | tail -8
      done
    done
    ;;
  nvdec-latency)  # NVDEC's display latency per mode (frames held back), memory per decoder, and NvdecSource's choice
    python3 deploy/nvdec_latency_probe.py .benchdata/video/group_1080p.mp4 .benchdata/video/group_1080p_ipp.mp4 \
      .benchdata/video/woman2.mp4 2> "$OUT/nvdec_latency.err" | tee "$OUT/nvdec_latency.jsonl"
    tail -3 "$OUT/nvdec_latency.err"
    ;;
  nvdec-cpu)  # CPU per decoded 1080p frame, DECODERS (64) threads paced at 25 fps, SECONDS_EACH (10) a mode: by CUDA
    # wait mode, with PARTS=1 by step (demux / nv12 / rgb / rgb+copy: differences are each step's cost), with CALLS=1
    # the time inside each Decode call (wall and CPU) at 1, 8 and 64 decoders, LOW and NATIVE latency; PROFILER
    # (a py-spy command prefix with --native) then records the rgb step alone
    python3 deploy/nvdec_cpu_probe.py ${PARTS:+--parts} ${CALLS:+--calls} ".benchdata/video/${CLIP:-group_1080p.mp4}" "${DECODERS:-64}" \
      "${SECONDS_EACH:-10}" | tee "$OUT/nvdec_cpu${TAG:-}.jsonl"
    if [ -n "${PROFILER:-}" ]; then
      $PROFILER python3 deploy/nvdec_cpu_probe.py --mode rgb ".benchdata/video/${CLIP:-group_1080p.mp4}" \
        "${DECODERS:-64}" "${SECONDS_EACH:-10}"
    fi
    ;;
  nvdec-pyav)  # NVDEC through PyAV (FFmpeg's nvdec hwaccel, GIL released, NV12 kept on the GPU) against PyNvVideoCodec:
    # CPU per frame, CPU and wall per decode call, GIL wait of a canary thread; DECODER_COUNTS (8,64) paced cameras
    python3 deploy/pyav_nvdec_probe.py ".benchdata/video/${CLIP:-group_1080p.mp4}" "${SECONDS_EACH:-6}" \
      "${DECODER_COUNTS:-8,64}" | tee "$OUT/nvdec_pyav${TAG:-}.jsonl"
    ;;
  nvdec-memory)  # GPU memory per decoder by latency mode and output colour (RGB / NV12), and a decoded frame's members
    python3 deploy/nvdec_latency_probe.py --memory .benchdata/video/group_1080p.mp4 .benchdata/video/group_1080p_ipp.mp4 \
      2> "$OUT/nvdec_memory.err" | tee "$OUT/nvdec_memory${TAG:-}.jsonl"
    tail -3 "$OUT/nvdec_memory.err"
    ;;
  ab)  # this tree against BASE=DIR (a copy of an older commit), 64 cameras of 1080p on the frame graphs path, run
    # alternately (new, base, new, base) in one session so drift shows; EXTRA: more bench pipeline options for both
    common="--fps 25 --device cuda --precision fp16 --detector-input 640x352 --max-batch 64 --lanes 1 --batch-step 2 \
      --mode batched --decode gpu --frame-path graph --duration ${DURATION:-15} --log-level warning ${EXTRA:-}"
    group="$PWD/.benchdata/video/group_1080p.mp4"
    cp -n models/*.onnx models/*.json "$BASE/models/" 2>/dev/null
    for round in ${ROUNDS:-1 2}; do
      python3 run_pipeline.py bench pipeline --video "$group" --cameras "${CAMS:-64}" $common \
        --json "$OUT/ab_new_$round.json" | tail -2
      (cd "$BASE" && PYTHONPATH="$HOME/site:$PWD" python3 run_pipeline.py bench pipeline --video "$group" \
        --cameras "${CAMS:-64}" $common --json "$OUT/ab_base_$round.json" | tail -2)
    done
    ;;
  profile)  # which Python holds the GIL at CAMS cameras of 1080p on the frame graphs path (py-spy --gil, raw stacks)
    cams=${CAMS:-64}
    "$HOME/tools/bin/py-spy" record --gil --nonblocking --rate 50 --format raw --output "$OUT/gil_${cams}${TAG:-}.txt" \
      -- python3 run_pipeline.py bench pipeline --video "$PWD/.benchdata/video/group_1080p.mp4" --cameras "$cams" \
      --fps 25 --device cuda --precision "${PRECISION:-fp16}" --detector-input 640x352 --max-batch 64 --lanes 1 \
      --batch-step 2 --duration "${DURATION:-15}" --mode batched --decode gpu --frame-path graph --log-level warning \
      --json "$OUT/profile_${cams}${TAG:-}.json" ${EXTRA:-}
    ;;
  *)
    echo "gpu-bench: no step '$1' (the steps are listed at the top of deploy/gpu-bench.sh)" >&2
    exit 2
    ;;
esac
