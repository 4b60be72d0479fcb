"""`bench memory`: where one camera group's memory goes, step by step (issue 25 item 3).

One process does, in order, what a camera group does when it starts, and after each step reads the GPU memory in use
(the whole device, as CUDA reports it: run it on an otherwise idle GPU) and its own resident host memory:

  1. start            — Python, numpy, OpenCV and the project imported;
  2. CUDA context     — the runtime initialised on the device (what every process pays once);
  3. models loaded    — ONNX Runtime and its CUDA libraries, the models read (sessions of the OpenCV path made);
  4. frames prepared  — the frame graphs' sessions of every padded batch size built and run once (frame graphs path);
     heap trimmed     — what the daemon's periodic malloc_trim (inference.trim_heap_s) then gives back (again after 6);
  5. cameras decoding — every camera's decoder open and its frame pool filled, nothing analysed yet;
  6. analysing        — the cameras analysed for `--duration` seconds (the peak over that time is reported).

The deltas are the breakdown: context, model sessions with their arena, decoder surfaces with the frame pools, and
what analysis adds on top (the arena grown to the largest batches). Host memory is shown as resident (RSS),
anonymous (the process's own heap: RSS less the pages of the libraries' files, which processes share) and shared
memory (RssShmem), and resident memory by what is mapped (`resident_by_mapping`: anonymous heap, the NVIDIA driver's
device files, shared memory, library and other files), which splits what round 14 could not: a camera's 17 MB of
non-anonymous RSS on NVDEC. The project's own CUDA buffers (frame pools, lane batch buffers, pinned
staging) are counted by pipeline.inference.gpu.cuda's ledger and reported apart.
Options are bench pipeline's (cameras, video, fps, batch sizes, interval, ...), so one change can be measured per run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import threading
import time
from typing import Any

from pipeline.capture.nvdec import decoder_output_frames, frame_pool_allocations
from pipeline.capture.sources import open_source
from pipeline.capture.thread import CaptureThread
from pipeline.core.heap import can_trim, trim_heap
from pipeline.inference.frames import FramePerception
from pipeline.inference.perception import load_perception
from pipeline.service.parts import limit_opencv_threads, new_tracker, prepare_gpu
from pipeline.service.worker import CameraWorker
from pipeline.tools.arena_log import ArenaLog, attach_arena_growth
from pipeline.tools.bench_groups import host_memory_mb
from pipeline.tools.bench_pipeline import bench_config, decoder_kind, parse_intervals, video_format

SAMPLE_S = 0.5
MAPPING_KINDS = ("anonymous", "nvidia driver", "shared memory", "libraries", "other files")


def mapping_kind(name: str) -> str:
    """Which of MAPPING_KINDS a mapping of /proc/PID/smaps is, by its path: pages mapped from /dev/nvidia* are memory
    the driver maps for the device (pinned host buffers, the context's host side), not the process's heap."""
    if name.startswith("/dev/nvidia"):
        return "nvidia driver"
    if name.startswith(("/dev/shm", "/memfd:", "/SYSV", "/dev/zero")):
        return "shared memory"
    if not name or name.startswith("["):
        return "anonymous"
    return "libraries" if ".so" in name.rsplit("/", 1)[-1] else "other files"


def resident_by_mapping(pid: int | str = "self") -> dict[str, float]:
    """A process's resident memory (MB) by MAPPING_KINDS, summed over /proc/PID/smaps; empty where it cannot be read."""
    sums = dict.fromkeys(MAPPING_KINDS, 0.0)
    try:
        with open(f"/proc/{pid}/smaps") as handle:
            kind = "anonymous"
            for line in handle:
                head, _, rest = line.partition(" ")
                if head == "Rss:":
                    sums[kind] += float(rest.split()[0]) / 1024
                elif "-" in head and not head.endswith(":"):  # a mapping's header: range perms offset dev inode path
                    fields = line.split(None, 5)
                    kind = mapping_kind(fields[5].strip() if len(fields) > 5 else "")
    except OSError:
        return {}
    return {key: round(value, 1) for key, value in sums.items()}


def device_used_mb() -> float | None:
    """GPU memory in use on device 0 (every process), from nvidia-smi; None without an NVIDIA GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        return float(out.splitlines()[0]) if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


class Steps:
    """The readings after each step, and their differences; with `arena_log`, where its log stood at each."""

    def __init__(self, arena_log: ArenaLog | None = None) -> None:
        self.rows: list[dict[str, Any]] = []
        self.arena_log = arena_log

    def mark(self, step: str, gpu_mb: float | None = None, note: str = "", peak: bool = False) -> None:
        """Read the GPU (or take `gpu_mb`, a peak read meanwhile) and this process; `peak`: the project's own GPU
        buffers at their largest so far, to set against a peak reading."""
        gpu = device_used_mb() if gpu_mb is None else gpu_mb
        host = host_memory_mb([])
        rss = host["rss_mb"]
        last = self.rows[-1] if self.rows else None
        self.rows.append({
            "step": step, "gpu_mb": gpu, "rss_mb": rss, "anon_mb": host["anon_mb"], "shmem_mb": host["shmem_mb"],
            "note": note, "by_mapping_mb": resident_by_mapping(), "ours_mib": ours_on_gpu(peak=peak),
            "gpu_delta_mb": None if gpu is None or last is None or last["gpu_mb"] is None else gpu - last["gpu_mb"],
            "rss_delta_mb": None if last is None else round(rss - last["rss_mb"], 1)})
        if self.arena_log is not None:
            self.rows[-1]["log_offset"] = self.arena_log.offset()


def _ledger() -> dict[str, int]:
    try:
        from pipeline.inference.gpu.cuda import live_allocations
    except ImportError:
        return {}
    return live_allocations()


def _frame_pools(cameras: int) -> dict[str, float]:
    """The NVDEC sources' GPU frame pools (capture.nvdec), now and at their largest, in MiB and buffers a camera:
    the part of the "cameras decoding" step that is ours, the rest being NVDEC's own surfaces."""
    pools = frame_pool_allocations()
    per = max(1, cameras)
    return {"buffers": pools["buffers"], "mib": round(pools["bytes"] / 2**20, 1),
            "peak_buffers": pools["peak_buffers"], "peak_mib": round(pools["peak_bytes"] / 2**20, 1),
            "buffers_per_camera": round(pools["buffers"] / per, 2),
            "peak_buffers_per_camera": round(pools["peak_buffers"] / per, 2),
            "peak_in_use": pools["peak_in_use"], "peak_in_use_per_camera": round(pools["peak_in_use"] / per, 2)}


def ours_on_gpu(peak: bool = False) -> dict[str, float]:
    """The project's own GPU buffers (MiB) now, or at their largest with `peak`: the NVDEC frame pools and the lanes'
    batch buffers (the ledger of pipeline.inference.gpu.cuda). What a step adds on the GPU beyond these is the
    libraries' (ONNX Runtime's arena, cuDNN and cuBLAS, NVDEC's own surfaces, CUDA's per-thread state)."""
    pools = frame_pool_allocations()
    pool_bytes = pools["peak_bytes"] if peak else pools["bytes"]
    lanes = _ledger().get("device_bytes", 0)
    return {"frame_pools": round(pool_bytes / 2**20, 1), "lane_buffers": round(lanes / 2**20, 1),
            "nvdec_output_est": round(decoder_output_frames()["bytes"] / 2**20, 1)}


def _cuda_context(device: str) -> str:
    if device != "cuda":
        return "cpu: no CUDA context"
    from pipeline.inference.gpu.cuda import CudaDevice, check, gpu_stack_of, load_runtime

    opened = CudaDevice.open(0)
    check(load_runtime().cudaFree(0), "cudaFree(0) (create the context)")
    return f"{opened.name}, thread stack {gpu_stack_of(0)} bytes"


def _peak_while(seconds: float) -> float | None:
    """The most GPU memory in use seen over `seconds`."""
    peak: float | None = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        used = device_used_mb()
        if used is not None:
            peak = used if peak is None else max(peak, used)
        time.sleep(SAMPLE_S)
    return peak


def _trim(steps: Steps, period_s: float) -> None:
    """What the daemon's periodic heap trim (inference.trim_heap_s; 0 = never) gives back at this point."""
    if period_s > 0 and can_trim():
        released = trim_heap() or 0
        steps.mark("heap trimmed", note=f"{released / 2**20:.0f} MB of freed heap given back (malloc_trim)")


def bench_memory(args: argparse.Namespace) -> dict[str, Any]:
    """The readings step by step; with `--arena-log FILE`, also what ONNX Runtime's arenas added at each step."""
    arena_log = ArenaLog(args.arena_log) if args.arena_log else None
    try:
        result = _measure(args, Steps(arena_log))
    finally:
        if arena_log is not None:
            arena_log.close()
    if arena_log is not None:
        attach_arena_growth(result["steps"], arena_log.path)
    return result


def _measure(args: argparse.Namespace, steps: Steps) -> dict[str, Any]:
    interval = parse_intervals(args.interval)[0]
    cfg = bench_config(args, naive=False, interval=interval)
    steps.mark("start")
    prepare_gpu(cfg)  # as the daemon does, before the context is made
    steps.mark("CUDA context", note=_cuda_context(cfg.inference.device))
    perception = load_perception(cfg)
    steps.mark("models loaded", note=cfg.emotion.model)
    device_frames = cfg.inference.graph_frames and cfg.inference.device == "cuda"
    fmt = video_format(args.video, device_frames and cfg.cameras[0].decode != "cpu")
    if isinstance(perception, FramePerception) and fmt is not None:
        perception.prepare(fmt)
        steps.mark("frames prepared", note=f"{fmt.width}x{fmt.height} {fmt.order}")
    else:
        perception.warm_up()
        steps.mark("models warmed")
    _trim(steps, cfg.inference.trim_heap_s)
    stop = threading.Event()
    limit_opencv_threads(cfg)
    gpu_active = cfg.inference.device != "cpu"
    captures = [CaptureThread(cam, stop, lambda _e: None,
                              lambda c: open_source(c, gpu_active=gpu_active, device_frames=device_frames))
                for cam in cfg.cameras]
    workers = [CameraWorker(capture, perception, new_tracker(cfg), lambda _obs: None, stop)  # type: ignore[arg-type]
               for capture in captures]
    try:
        for capture in captures:
            capture.start()
        time.sleep(args.settle_s)
        steps.mark("cameras decoding", note=f"{len(captures)} cameras, decoded by {decoder_kind(captures)}")
        for worker in workers:
            worker.start()
        peak = _peak_while(args.duration)
        analysed = sum(worker.stats.analysed.total for worker in workers)
        steps.mark("analysing (peak)", gpu_mb=peak, note=f"{analysed} frames analysed in {args.duration:.0f} s",
                   peak=True)
        _trim(steps, cfg.inference.trim_heap_s)
        ledger = _ledger()
        pools = _frame_pools(len(captures))
        outputs = decoder_output_frames()
    finally:
        stop.set()
        for thread in [*captures, *workers]:
            thread.join(5)
        perception.close()
    return {"mode": "memory", "video": str(args.video), "cameras": args.cameras, "device": cfg.inference.device,
            "frame_path": "graph" if cfg.inference.graph_frames else "opencv", "max_batch": cfg.inference.max_batch,
            "batch_step": cfg.inference.batch_step, "interval": cfg.detector.interval,
            "emotion_model": cfg.emotion.model, "precision": cfg.inference.precision,
            "cudnn_max_workspace": cfg.inference.cudnn_max_workspace,
            "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""),
            "memory_pattern": cfg.inference.memory_pattern, "gpu_stack_bytes": cfg.inference.gpu_stack_bytes,
            "steps": steps.rows,
            "project_buffers": {key: (round(value / 2**20, 1) if key.endswith("bytes") else value)
                                for key, value in ledger.items()},
            "frame_pools": pools, "decoder_outputs": outputs}


def print_memory_table(result: dict[str, Any]) -> None:
    print(f"{result['cameras']} cameras of {result['video']} on {result['device']} ({result['frame_path']} path, "
          f"max_batch {result['max_batch']}, batch_step {result['batch_step']}, interval {result['interval']}, "
          f"{result['emotion_model']} {result['precision']}, cudnn_max_workspace {result['cudnn_max_workspace']}, "
          f"cuBLAS workspace {result['cublas_workspace'] or 'default'}, memory pattern {result['memory_pattern']})")
    print(f"{'step':18} {'GPU MB':>8} {'+GPU':>8} {'RSS MB':>8} {'+RSS':>8} {'anon MB':>8} {'shmem MB':>8}  note")
    for row in result["steps"]:
        gpu = "-" if row["gpu_mb"] is None else f"{row['gpu_mb']:.0f}"
        gpu_delta = "" if row["gpu_delta_mb"] is None else f"{row['gpu_delta_mb']:+.0f}"
        rss_delta = "" if row["rss_delta_mb"] is None else f"{row['rss_delta_mb']:+.0f}"
        print(f"{row['step']:18} {gpu:>8} {gpu_delta:>8} {row['rss_mb']:>8.0f} {rss_delta:>8} {row['anon_mb']:>8.0f} "
              f"{row['shmem_mb']:>8.0f}  {row['note']}")
    _print_mapping_table(result["steps"])
    _print_gpu_split(result["steps"])
    _print_arena_growth(result["steps"])
    if result["project_buffers"]:
        print("the project's own CUDA buffers (MB, count): " + ", ".join(
            f"{key} {value}" for key, value in result["project_buffers"].items()))
    pools = result.get("frame_pools") or {}
    if pools.get("peak_buffers"):
        print(f"NVDEC frame pools: {pools['buffers']} buffers, {pools['mib']} MiB ({pools['buffers_per_camera']} a "
              f"camera); at most {pools['peak_buffers']} ({pools['peak_mib']} MiB, "
              f"{pools['peak_buffers_per_camera']} a camera); at most {pools.get('peak_in_use')} held by frames "
              f"at once ({pools.get('peak_in_use_per_camera')} a camera)")
    outputs = result.get("decoder_outputs") or {}
    if outputs.get("decoders"):
        print(f"NVDEC decoders: {outputs['decoders']}; the most frames one Decode call returned, summed over them: "
              f"{outputs['frames']} ({outputs['bytes'] / 2**20:.0f} MiB of output frames PyNvVideoCodec keeps); "
              f"{outputs['calls_with_several']} calls returned several, {outputs['several_at_loop']} of them as a "
              "file looped")


def _print_mapping_table(rows: list[dict[str, Any]]) -> None:
    """Resident MB by what is mapped after each step (resident_by_mapping), with the change from the step before."""
    if not rows or not rows[0].get("by_mapping_mb"):
        return
    print("resident MB by mapping (change from the step before): " + ", ".join(MAPPING_KINDS))
    last: dict[str, float] = {}
    for row in rows:
        now = row["by_mapping_mb"]
        cells = [f"{now.get(kind, 0.0):.0f} ({now.get(kind, 0.0) - last.get(kind, 0.0):+.0f})"
                 for kind in MAPPING_KINDS]
        print(f"  {row['step']:18} " + "  ".join(f"{cell:>14}" for cell in cells))
        last = now


def _print_gpu_split(rows: list[dict[str, Any]]) -> None:
    """Each step's GPU growth split into the project's own buffers (frame pools, lane buffers) and the libraries'."""
    if not rows or rows[0].get("gpu_mb") is None or "ours_mib" not in rows[0]:
        return
    print("GPU MiB a step adds: the frame pools, the lanes' buffers, the rest (libraries: arena, cuDNN, NVDEC, CUDA), "
          "and of the rest NVDEC's output frames (the most one Decode call returned, a decoder keeps that many)")
    last = rows[0]
    for row in rows[1:]:
        if row["gpu_mb"] is None or last["gpu_mb"] is None:
            continue
        pools = row["ours_mib"]["frame_pools"] - last["ours_mib"]["frame_pools"]
        lanes = row["ours_mib"]["lane_buffers"] - last["ours_mib"]["lane_buffers"]
        outputs = row["ours_mib"].get("nvdec_output_est", 0.0) - last["ours_mib"].get("nvdec_output_est", 0.0)
        rest = row["gpu_mb"] - last["gpu_mb"] - pools - lanes
        print(f"  {row['step']:18} {pools:+8.0f} {lanes:+8.0f} {rest:+8.0f} {outputs:+8.0f}")
        last = row


def _print_arena_growth(rows: list[dict[str, Any]]) -> None:
    """What ONNX Runtime's arenas grew by at each step (--arena-log), with the largest requests behind it."""
    if not any(row.get("arena") for row in rows):
        return
    print("ONNX Runtime's arenas grown (MiB, extensions; largest requests MiB):")
    for row in rows:
        cells = [f"{name} +{entry['extended_mib']:.0f} in {entry['extensions']} ({entry['largest_requests_mib']})"
                 for name, entry in (row.get("arena") or {}).items()]
        if cells:
            print(f"  {row['step']:18} " + "; ".join(cells))

