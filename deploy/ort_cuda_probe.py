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
    # Issue 25 (2026-12-07): the pipeline's sessions run without ONNX Runtime's memory pattern since round 11. Does a
    # change of size still cost seconds without it? If not, one session could serve every padded size of a lane.
    "heuristic+shared_arena+no_mem_pattern": {"cudnn_conv_algo_search": "HEURISTIC"},
}
# Issue 25 item 3: what each further session costs with the shared arena (~150 MB in the pipeline: 16 sessions per
# camera group). Each variant changes one thing: cuBLAS's per-handle workspace (an environment variable cuBLAS reads
# when a handle is made), ONNX Runtime's memory pattern, cuDNN's workspace, initializers through the device allocator.
SHARED = {"cudnn_conv_algo_search": "HEURISTIC"}
SESSION_VARIANTS: dict[str, tuple[dict[str, str], dict[str, str], dict[str, str]]] = {
    # name: (provider options, session config entries, environment)
    "shared": (SHARED, {}, {}),
    "shared+cublas_ws_small": (SHARED, {}, {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
    "shared+no_mem_pattern": (SHARED, {"no_mem_pattern": "1"}, {}),
    "shared+cudnn_small_ws": ({**SHARED, "cudnn_conv_use_max_workspace": "0"}, {}, {}),
    "shared+init_device_alloc": (SHARED, {"session.use_device_allocator_for_initializers": "1"}, {}),
    # Issue 25, host memory (75 MB of RSS per further session): the sessions' CPU arenas, and CUDA's module loading.
    "shared+cublas_ws_small+no_cpu_arena": (SHARED, {"no_cpu_arena": "1"}, {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
    "shared+cublas_ws_small+lazy": (SHARED, {}, {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUDA_MODULE_LOADING": "LAZY"}),
    "shared+cublas_ws_small+eager": (SHARED, {}, {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUDA_MODULE_LOADING": "EAGER"}),
    # Round 13's question (the 75 MB is spent by a session's first run): cuDNN's convolution plans, chosen per
    # session and shape, or ONNX Runtime's prepacked weights? No algorithm search, and no prepacking.
    "shared+cublas_ws_small+default_algo": ({"cudnn_conv_algo_search": "DEFAULT"}, {},
                                            {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
    "shared+cublas_ws_small+no_prepack": (SHARED, {"session.disable_prepacking": "1"},
                                         {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
    # cuDNN's measured search (cudnnFind, ONNX Runtime's own default) instead of its heuristics: whether the
    # per-session host memory is the heuristics' state, and what the search does to steady speed.
    "shared+cublas_ws_small+exhaustive": ({"cudnn_conv_algo_search": "EXHAUSTIVE"}, {},
                                          {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
    # The per-session cost is the convolutions' cuDNN frontend plans (round 11). Do other plans cost less? Channels-last
    # convolutions (ONNX Runtime rewrites the graph to NHWC and its weights once), and the bias added inside the plan.
    # (prefer_nhwc ran the frame detector graph 2.5x slower at 32 frames on the H200: BENCHMARKS.md, "The letterbox as
    # a strided Conv"; so only a large host saving would make it worth a second look.)
    "shared+cublas_ws_small+nhwc": ({**SHARED, "prefer_nhwc": "1"}, {}, {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
    "shared+cublas_ws_small+fuse_bias": ({**SHARED, "fuse_conv_bias": "1"}, {}, {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
    "shared+cublas_ws_small+nhwc+fuse_bias": ({**SHARED, "prefer_nhwc": "1", "fuse_conv_bias": "1"}, {},
                                              {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
    "shared+all": ({**SHARED, "cudnn_conv_use_max_workspace": "0"},
                   {"no_mem_pattern": "1", "session.use_device_allocator_for_initializers": "1"},
                   {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
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


def probe(model: str, options: dict[str, str], shared_arena: bool, no_mem_pattern: bool = False) -> dict[str, object]:
    import onnxruntime as ort

    from pipeline.inference.onnxruntime import share_cuda_arena

    so = ort.SessionOptions()
    if shared_arena and share_cuda_arena(ort):
        so.add_session_config_entry("session.use_env_allocators", "1")
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.enable_mem_pattern = not no_mem_pattern
    frames = {n: np.random.default_rng(0).integers(0, 256, (n, 352, 640, 3), dtype=np.uint8) for n in SIZES}
    host_before = rss_mb()
    one = ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider", options)])
    first = {n: round(timed(one, frames[n]), 1) for n in SIZES}
    again = {n: round(timed(one, frames[n]), 1) for n in SIZES}  # each size seen before, but the last was another
    third = {n: round(timed(one, frames[n]), 1) for n in SIZES}
    steady = {n: round(float(np.median([timed(one, frames[n]) for _ in range(5)])), 2) for n in SIZES}
    mixed = [timed(one, frames[n]) for _ in range(5) for n in SIZES]  # a change of size at every run
    mb_one, host_one = gpu_mb(), rss_mb()
    more = [ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider", options)]) for _ in SIZES[1:]]
    for session, n in zip(more, SIZES[1:]):
        timed(session, frames[n])
    return {"first_run_ms": first, "shape_change_ms": again, "shape_change_again_ms": third, "steady_ms": steady,
            "mixed_sizes_ms_median_max": [round(float(np.median(mixed)), 2), round(max(mixed), 1)],
            "gpu_mb_1_session": mb_one, "gpu_mb_4_sessions": gpu_mb(),
            "host_mb_1_session": round(host_one - host_before), "host_mb_4_sessions": round(rss_mb() - host_before)}


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident host memory (VmRSS; RssAnon: its own, RssFile: mapped files), MB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def host_split() -> dict[str, int]:
    return {field: round(rss_mb(field)) for field in ("RssAnon", "RssFile")}


def session_probe(model: str, name: str) -> dict[str, object]:
    """GPU and host memory after one session (run at every size), then after 7 more sessions each run at batch 1
    only: the slope is what a further session costs beyond the activations the shared arena already holds."""
    import onnxruntime as ort

    from pipeline.inference.onnxruntime import share_cuda_arena

    provider, entries, _ = SESSION_VARIANTS[name]
    so = ort.SessionOptions()
    if share_cuda_arena(ort):
        so.add_session_config_entry("session.use_env_allocators", "1")
    for key, value in entries.items():
        if key == "no_mem_pattern":
            so.enable_mem_pattern = False
        elif key == "no_cpu_arena":
            so.enable_cpu_mem_arena = False
        else:
            so.add_session_config_entry(key, value)
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    frames = {n: np.random.default_rng(0).integers(0, 256, (n, 352, 640, 3), dtype=np.uint8) for n in SIZES}
    baseline, host_baseline = gpu_mb(), rss_mb()
    first = ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider", provider)])
    for n in SIZES:
        timed(first, frames[n])
    steady = {n: round(float(np.median([timed(first, frames[n]) for _ in range(5)])), 2) for n in SIZES}
    one, host_one, split_one = gpu_mb(), rss_mb(), host_split()
    more = [ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider", provider)]) for _ in range(7)]
    for session in more:
        timed(session, frames[1])
    eight, host_eight, split_eight = gpu_mb(), rss_mb(), host_split()
    return {"gpu_mb_before": baseline, "gpu_mb_1_session": one, "gpu_mb_8_sessions": eight,
            "mb_per_further_session": round((eight - one) / 7, 1), "steady_ms": steady,
            "host_mb_before": round(host_baseline), "host_mb_1_session": round(host_one),
            "host_mb_8_sessions": round(host_eight), "host_mb_per_further_session": round((host_eight - host_one) / 7, 1),
            "host_split_1_session": split_one, "host_split_8_sessions": split_eight,
            "nvrtc_loaded": nvrtc_loaded()}


def nvrtc_loaded() -> bool:
    """Whether NVRTC is mapped into this process: cuDNN compiles a plan's kernels at run time with it (its runtime
    fusion engines), and such kernels are kept per plan."""
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        return any("libnvrtc" in line for line in maps)


def main() -> None:
    model = sys.argv[1]
    if len(sys.argv) > 3 and sys.argv[2] == "--session":
        print(json.dumps(session_probe(model, sys.argv[3])))
        return
    if len(sys.argv) > 2 and sys.argv[2] == "--sessions":  # issue 25: the per-session variants, one process each
        chosen = sys.argv[3:] or list(SESSION_VARIANTS)  # optional: only these variants
        for name, (_, _, env) in ((name, SESSION_VARIANTS[name]) for name in chosen):
            out = subprocess.run([sys.executable, __file__, model, "--session", name], capture_output=True, text=True,
                                 check=False, env={**os.environ, **env})
            failed = {"error": out.stderr[-800:]}
            result = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else failed
            print(json.dumps({"variant": name, **result}), flush=True)
        return
    if len(sys.argv) > 2:
        name = sys.argv[2]
        print(json.dumps(probe(model, VARIANTS[name], "shared_arena" in name, name.endswith("no_mem_pattern"))))
        return
    for name, options in VARIANTS.items():
        out = subprocess.run([sys.executable, __file__, model, name], capture_output=True, text=True, check=False)
        result = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-800:]}
        print(json.dumps({"variant": name, "options": options, **result}), flush=True)


if __name__ == "__main__":
    main()
