"""ONNX Runtime CUDA provider options, measured: GPU memory per session and the cost of a change of batch size.

Runs on the GPU machine (see deploy/gpu-bench.sh probe). Each option set runs in its own process, so nvidia-smi's
per-process memory is that set's alone. Prints one JSON line per option set.

Why: the pipeline keeps one CUDA session per lane and padded batch size (pipeline/inference/gpu/cuda_lane.py) because a
change of input shape cost 1.2-1.7 s per run; the sessions' memory (3.7 GB at 16 sessions) is the price measured here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

VARIANTS = {
    "heuristic": {"cudnn_conv_algo_search": "HEURISTIC"},
    "heuristic+small_ws": {"cudnn_conv_algo_search": "HEURISTIC", "cudnn_conv_use_max_workspace": "0",
                           "arena_extend_strategy": "kSameAsRequested"},
    "heuristic+shared_arena": {"cudnn_conv_algo_search": "HEURISTIC"},
    "default_algo+small_ws": {"cudnn_conv_algo_search": "DEFAULT", "cudnn_conv_use_max_workspace": "0",
                              "arena_extend_strategy": "kSameAsRequested"},
}
SIZES = (1, 4, 16, 64)


def gpu_mb() -> float:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False).stdout
    return sum(float(line.split(",")[1]) for line in out.splitlines() if line.split(",")[0].strip() == str(os.getpid()))


def timed(session: object, batch: np.ndarray) -> float:
    start = time.perf_counter()
    session.run(None, {"image": batch})  # type: ignore[attr-defined]
    return (time.perf_counter() - start) * 1e3


def probe(model: str, options: dict[str, str], shared_arena: bool) -> dict[str, object]:
    import onnxruntime as ort

    from pipeline.inference.onnxruntime import share_cuda_arena

    so = ort.SessionOptions()
    if shared_arena and share_cuda_arena(ort):
        so.add_session_config_entry("session.use_env_allocators", "1")
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    frames = {n: np.random.default_rng(0).integers(0, 256, (n, 352, 640, 3), dtype=np.uint8) for n in SIZES}
    one = ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider", options)])
    first = {n: round(timed(one, frames[n]), 1) for n in SIZES}
    again = {n: round(timed(one, frames[n]), 1) for n in SIZES}  # each size seen before, but the last was another
    steady = {n: round(float(np.median([timed(one, frames[n]) for _ in range(5)])), 2) for n in SIZES}
    mb_one = gpu_mb()
    more = [ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider", options)]) for _ in SIZES[1:]]
    for session, n in zip(more, SIZES[1:]):
        timed(session, frames[n])
    return {"first_run_ms": first, "shape_change_ms": again, "steady_ms": steady,
            "gpu_mb_1_session": mb_one, "gpu_mb_4_sessions": gpu_mb()}


def main() -> None:
    model = sys.argv[1]
    if len(sys.argv) > 2:
        print(json.dumps(probe(model, VARIANTS[sys.argv[2]], sys.argv[2].endswith("shared_arena"))))
        return
    for name, options in VARIANTS.items():
        out = subprocess.run([sys.executable, __file__, model, name], capture_output=True, text=True, check=False)
        result = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-800:]}
        print(json.dumps({"variant": name, "options": options, **result}), flush=True)


if __name__ == "__main__":
    main()
