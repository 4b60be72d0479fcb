"""NVDEC through PyAV (FFmpeg's nvdec hwaccel, frames kept on the GPU) against PyNvVideoCodec, same load, same run.

Why (issue 25): PyNvVideoCodec's `Decode` keeps the GIL for the whole call (BENCHMARKS.md, "Who holds the GIL"), so
one process cannot decode much more than ~40 1080p cameras, and its CPU per frame (~1.7 ms measured with decoder
start-up inside the window) puts <= 8 cores at 150 cameras out of reach. PyAV's wheels (18.x) are built with
--enable-nvdec, decode with the GIL released (Cython `nogil` around avcodec_send_packet / receive_frame and
av_read_frame), and with `is_hw_owned` hand out NV12 frames that stay in GPU memory (DLPack export).

Per backend and decoder count, DECODERS threads each decode CLIP paced at 25 fps for SECONDS once every decoder exists
(start-up left out), while a canary thread sleeps 1 ms in a loop: how late it wakes is how long it waited for the
GIL. One JSON line per run: process CPU per frame (every thread: CUDA's and the driver's too), the decoding thread's
own CPU and wall time per call, frames out per second, the canary's lateness (p50 / p99 ms), and for PyAV where its
frames live (DLPack device: 2 = CUDA).

Run from the project root on a GPU machine with PyNvVideoCodec, cuda-python and av (PyAV) importable:
    python3 deploy/pyav_nvdec_probe.py .benchdata/video/group_1080p.mp4 [SECONDS] [DECODER_COUNTS]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

FPS = 25.0
BACKENDS = ("pynvvideocodec", "pyav")


class Pace:
    """Sleep to the next 1/FPS tick of this camera's own clock."""

    def __init__(self) -> None:
        self.due = time.monotonic()

    def wait(self) -> None:
        self.due += 1.0 / FPS
        time.sleep(max(0.0, self.due - time.monotonic()))


def pynvvideocodec_camera(path: str) -> Any:
    """A generator of decode calls: each step feeds one packet and yields the frames that came out."""
    import PyNvVideoCodec as nvc
    from cuda.bindings import runtime

    runtime.cudaSetDevice(0)
    stream = runtime.cudaStreamCreateWithFlags(runtime.cudaStreamNonBlocking)[1]
    demuxer = nvc.CreateDemuxer(filename=path)
    decoder = nvc.CreateDecoder(gpuid=0, codec=demuxer.GetNvCodecId(), usedevicememory=True, cudastream=int(stream),
                                outputColorType=nvc.OutputColorType.RGB, latency=nvc.DisplayDecodeLatencyType.LOW)
    yield None  # the decoder exists
    while True:
        for packet in demuxer:
            yield lambda packet=packet: decoder.Decode(packet)
        demuxer = nvc.CreateDemuxer(filename=path)


def pyav_camera(path: str) -> Any:
    import av
    from av.codec.hwaccel import HWAccel

    def open_stream() -> tuple[Any, Any]:
        container = av.open(path, hwaccel=HWAccel("cuda", allow_software_fallback=False, is_hw_owned=True))
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1  # NVDEC does the work; FFmpeg's default would start a thread per core
        return container, stream

    container, stream = open_stream()
    yield None
    while True:
        for packet in container.demux(stream):
            if packet.size:
                yield lambda packet=packet: stream.codec_context.decode(packet)
        container.close()
        container, stream = open_stream()


def camera(backend: str, path: str, seconds: float, ready: threading.Barrier, tally: list[float],
           where: list[object]) -> None:
    """One paced camera; `tally` gathers frames, calls, wall and thread CPU seconds inside the decode calls."""
    steps = (pyav_camera if backend == "pyav" else pynvvideocodec_camera)(path)
    try:
        next(steps)
    except Exception:
        ready.abort()  # the run fails at once instead of waiting for a decoder that will never exist
        raise
    ready.wait()
    pace, end = Pace(), time.monotonic() + seconds
    while time.monotonic() < end:
        call = next(steps)
        wall, cpu = time.perf_counter(), time.thread_time()
        frames = call()
        tally[2] += time.perf_counter() - wall
        tally[3] += time.thread_time() - cpu
        tally[0] += len(frames)
        tally[1] += 1
        if frames and not where and backend == "pyav":
            where.append(frames[0].planes[0].__dlpack_device__())
        pace.wait()


def canary(stop: threading.Event, late: list[float]) -> None:
    """Sleeps 1 ms at a time; how late each wake is (GIL wait and scheduling) in ms."""
    while not stop.is_set():
        start = time.perf_counter()
        time.sleep(0.001)
        late.append((time.perf_counter() - start) * 1e3 - 1.0)


def one_run(backend: str, path: str, decoders: int, seconds: float) -> dict[str, object]:
    from cuda.bindings import runtime

    runtime.cudaSetDevice(0)
    # FFmpeg takes the primary context only with its own flags (blocking sync); made first with others it refuses
    # ("Operation not supported"). Both backends get the same context.
    runtime.cudaSetDeviceFlags(int(runtime.cudaDeviceScheduleBlockingSync))
    runtime.cudaFree(0)
    ready = threading.Barrier(decoders + 1, timeout=120)
    tallies = [[0.0, 0, 0.0, 0.0] for _ in range(decoders)]
    where: list[object] = []
    threads = [threading.Thread(target=camera, args=(backend, path, seconds, ready, tallies[i], where))
               for i in range(decoders)]
    for thread in threads:
        thread.start()
    ready.wait()
    stop, late = threading.Event(), []
    watcher = threading.Thread(target=canary, args=(stop, late))
    start_cpu, start = os.times(), time.monotonic()
    watcher.start()
    for thread in threads:
        thread.join()
    end_cpu, wall = os.times(), time.monotonic() - start
    stop.set()
    watcher.join()
    cpu = (end_cpu.user - start_cpu.user) + (end_cpu.system - start_cpu.system)
    frames, calls = sum(t[0] for t in tallies), max(1, sum(t[1] for t in tallies))
    late.sort()
    return {"backend": backend, "decoders": decoders, "frames": int(frames), "frames_per_s": round(frames / wall, 1),
            "cpu_cores": round(cpu / wall, 2), "cpu_ms_per_frame": round(cpu * 1e3 / max(frames, 1), 3),
            "call_wall_ms": round(sum(t[2] for t in tallies) * 1e3 / calls, 3),
            "call_thread_cpu_ms": round(sum(t[3] for t in tallies) * 1e3 / calls, 3),
            "gil_canary_late_ms_p50": round(late[len(late) // 2], 3) if late else None,
            "gil_canary_late_ms_p99": round(late[int(len(late) * 0.99)], 3) if late else None,
            "frames_on": where[0] if where else None}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--run":
        print(json.dumps(one_run(argv[1], argv[2], int(argv[3]), float(argv[4]))), flush=True)
        return 0
    path = argv[0]
    seconds = float(argv[1]) if len(argv) > 1 else 8.0
    counts = [int(n) for n in (argv[2] if len(argv) > 2 else "8,64").split(",")]
    runs = [(backend, n) for n in counts for backend in BACKENDS]
    for backend, n in (*runs, *runs[::-1]):  # each twice, the second round reversed, so drift shows
        try:
            out = subprocess.run([sys.executable, __file__, "--run", backend, path, str(n), str(seconds)],
                                 capture_output=True, text=True, check=False, timeout=seconds + 150)
        except subprocess.TimeoutExpired:
            print(json.dumps({"backend": backend, "decoders": n, "error": "timed out"}), flush=True)
            continue
        lines = out.stdout.strip().splitlines()
        print(lines[-1] if out.returncode == 0 and lines else
              json.dumps({"backend": backend, "decoders": n, "error": out.stderr[-800:]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
