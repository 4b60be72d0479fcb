"""CPU per decoded frame on NVDEC under each of CUDA's wait modes (issue 25: at 160 cameras on the H200,
PyNvVideoCodec's `Decode` was half of the camera groups' samples in py-spy, BENCHMARKS.md).

Why: under CUDA's default scheduling (auto) a thread that waits for the GPU spins a core whenever the process has
fewer CUDA contexts than cores. A decoder waits for NVDEC (mapping a decoded picture) and for its colour conversion
on every frame, and with the GPU busy with the models that wait is long. Each mode runs in a process of its own (the
flags must be set before the context exists): DECODERS threads, each decoding CLIP at 25 frames/s as a camera would,
for SECONDS; the process's CPU time (user + system) per decoded frame is printed as one JSON line per mode.
Modes: auto (CUDA's default), spin, sleep (cudaDeviceScheduleBlockingSync), and sleep+primary (the same, with the
primary context handed to PyNvVideoCodec explicitly, in case it would otherwise make a context of its own).

`--calls` times each `Decode` call (wall clock and the calling thread's own CPU time) at 1, 8 and 64 decoders, in
LOW latency (what NvdecSource uses) and NATIVE (NVIDIA's default, up to 4 frames held): if the CPU a call takes grows
with the load on NVDEC and tracks its wall time, the thread is busy-waiting for the engine; if it stays flat, it is
parsing work (BENCHMARKS.md, round 8, has what it found: `Decode` gives the GIL away while it waits).

`--parts` splits the same load by step instead (all under auto): demux (packets read, nothing decoded), nv12 (decoded,
NVDEC's own NV12 surface), rgb (decoded and converted to RGB, as NvdecSource does) and rgb+copy (each frame also copied
device to device, as keep_on_device does), so each step's CPU per frame is a difference of two lines.

Run from the project root on a GPU machine with PyNvVideoCodec and cuda-python:
    python3 deploy/nvdec_cpu_probe.py [--parts | --calls] .benchdata/video/group_1080p.mp4 [DECODERS] [SECONDS]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

FPS = 25.0
MODES = ("auto", "spin", "sleep", "sleep+primary")
PARTS = ("demux", "nv12", "rgb", "rgb+copy")
CALLS = ("low@1", "native@1", "low@8", "native@8", "low@64", "native@64")  # latency mode @ decoders


def decode_paced(path: str, seconds: float, context: int, counts: list[int], index: int,
                 part: str = "rgb", latency: str = "LOW", timing: list[list[float]] | None = None,
                 ready: threading.Barrier | None = None) -> None:
    """One camera: `path` decoded at 25 fps for `seconds`. `timing[index]` (when given) gathers the wall and thread
    CPU seconds spent inside `Decode` and the number of calls; `ready` (when given) is waited on once the decoder
    exists, so the measured window leaves out the decoders' start-up."""
    import PyNvVideoCodec as nvc
    from cuda.bindings import runtime

    runtime.cudaSetDevice(0)
    stream = runtime.cudaStreamCreateWithFlags(runtime.cudaStreamNonBlocking)[1]
    extra = {"cudacontext": context} if context else {}
    demuxer = nvc.CreateDemuxer(filename=path)
    colour = nvc.OutputColorType.NATIVE if part == "nv12" else nvc.OutputColorType.RGB
    decoder = nvc.CreateDecoder(gpuid=0, codec=demuxer.GetNvCodecId(), usedevicememory=True,
                                cudastream=int(stream), outputColorType=colour,
                                latency=getattr(nvc.DisplayDecodeLatencyType, latency), **extra)
    copy_to, copy_size = 0, 0  # rgb+copy: a device buffer of the frame's size, made for the first frame
    packets = iter(demuxer)
    if ready is not None:
        ready.wait()
    due = time.monotonic()
    end = due + seconds
    while time.monotonic() < end:
        try:
            packet = next(packets)
        except StopIteration:
            demuxer = nvc.CreateDemuxer(filename=path)
            packets = iter(demuxer)
            continue
        if part == "demux":
            counts[index] += 1
        else:
            wall, cpu = time.perf_counter(), time.thread_time()
            frames = decoder.Decode(packet)
            if timing is not None:
                timing[index][0] += time.perf_counter() - wall
                timing[index][1] += time.thread_time() - cpu
                timing[index][2] += 1
            counts[index] += len(frames)
            for frame in frames if part == "rgb+copy" else ():
                if int(frame.framesize()) > copy_size:
                    copy_size = int(frame.framesize())
                    copy_to = int(runtime.cudaMalloc(copy_size)[1])
                runtime.cudaMemcpyAsync(copy_to, int(frame.GetPtrToPlane(0)), int(frame.framesize()),
                                        runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream)
                runtime.cudaStreamSynchronize(stream)
        due += 1.0 / FPS
        time.sleep(max(0.0, due - time.monotonic()))


def one_mode(mode: str, path: str, decoders: int, seconds: float) -> dict[str, object]:
    from cuda.bindings import driver, runtime

    runtime.cudaSetDevice(0)
    part = mode if mode in PARTS else "rgb"
    mode = "auto" if mode in PARTS else mode
    flags = {"auto": runtime.cudaDeviceScheduleAuto, "spin": runtime.cudaDeviceScheduleSpin,
             "sleep": runtime.cudaDeviceScheduleBlockingSync}[mode.split("+")[0]]
    runtime.cudaSetDeviceFlags(int(flags))
    runtime.cudaFree(0)  # the primary context now exists, with these flags
    context = 0
    if mode.endswith("+primary"):
        driver.cuInit(0)
        context = int(driver.cuDevicePrimaryCtxRetain(driver.CUdevice(0))[1])
    counts = [0] * decoders
    threads = [threading.Thread(target=decode_paced, args=(path, seconds, context, counts, i, part))
               for i in range(decoders)]
    start_cpu, start = os.times(), time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    end_cpu, wall = os.times(), time.monotonic() - start
    cpu = (end_cpu.user - start_cpu.user) + (end_cpu.system - start_cpu.system)
    frames = sum(counts)
    return {"mode": mode, "part": part, "decoders": decoders, "frames": frames, "frames_per_s": round(frames / wall, 1),
            "cpu_cores": round(cpu / wall, 2), "cpu_ms_per_frame": round(cpu * 1e3 / max(frames, 1), 3),
            "flags_after": int(runtime.cudaGetDeviceFlags()[1])}


def one_call_mode(mode: str, path: str, seconds: float) -> dict[str, object]:
    """CALLS: `mode` is LATENCY@DECODERS; the time inside `Decode`, per call, wall and the thread's own CPU, and the
    whole process's CPU per frame (other threads included: CUDA's and the NVDEC driver's), start-up left out."""
    from cuda.bindings import runtime

    latency, decoders = mode.split("@")[0].upper(), int(mode.split("@")[1])
    runtime.cudaSetDevice(0)
    runtime.cudaFree(0)
    counts = [0] * decoders
    timing = [[0.0, 0.0, 0] for _ in range(decoders)]
    ready = threading.Barrier(decoders + 1)
    threads = [threading.Thread(target=decode_paced, args=(path, seconds, 0, counts, i, "rgb", latency, timing, ready))
               for i in range(decoders)]
    for thread in threads:
        thread.start()
    ready.wait()  # every decoder exists: the window starts here
    start_cpu, start = os.times(), time.monotonic()
    for thread in threads:
        thread.join()
    end_cpu, wall = os.times(), time.monotonic() - start
    cpu = (end_cpu.user - start_cpu.user) + (end_cpu.system - start_cpu.system)
    frames, calls = sum(counts), max(1, sum(int(t[2]) for t in timing))
    return {"mode": mode, "latency": latency, "decoders": decoders, "frames": frames,
            "frames_per_s": round(frames / wall, 1), "cpu_cores": round(cpu / wall, 2),
            "cpu_ms_per_frame": round(cpu * 1e3 / max(frames, 1), 3), "calls": calls,
            "decode_wall_ms_per_call": round(sum(t[0] for t in timing) * 1e3 / calls, 3),
            "decode_cpu_ms_per_call": round(sum(t[1] for t in timing) * 1e3 / calls, 3)}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--mode":
        mode, path, decoders, seconds = argv[1], argv[2], int(argv[3]), float(argv[4])
        result = one_call_mode(mode, path, seconds) if mode in CALLS else one_mode(mode, path, decoders, seconds)
        print(json.dumps(result), flush=True)
        return 0
    families = {"--parts": PARTS, "--calls": CALLS}
    modes = families.get(argv[0], MODES) if argv else MODES
    argv = argv[1:] if argv and argv[0] in families else argv
    path = argv[0]
    decoders = int(argv[1]) if len(argv) > 1 else 64
    seconds = float(argv[2]) if len(argv) > 2 else 10.0
    for mode in (*modes, *modes[::-1]):  # each mode twice, the second round reversed, so drift shows
        out = subprocess.run([sys.executable, __file__, "--mode", mode, path, str(decoders), str(seconds)],
                             capture_output=True, text=True, check=False)
        lines = out.stdout.strip().splitlines()
        print(lines[-1] if out.returncode == 0 and lines else json.dumps({"mode": mode, "error": out.stderr[-600:]}),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
