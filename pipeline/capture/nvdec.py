"""Video decoding on the GPU's NVDEC engines through PyNvVideoCodec, for files and RTSP/HTTP streams.

Why: on the GPU machine the CPU decoding every frame of every camera is what limits the number of cameras (16 cores
decoded ~976 1080p frames/s with FFmpeg, while NVDEC decoded 4,310/s on 1.7 cores: ../shared/tools/gpu-machine.md).
Demuxing stays on the CPU (PyNvVideoCodec's bundled FFmpeg), every frame is decoded on NVDEC into GPU memory and
converted to RGB there, and only the frames the camera's fps cap lets through are copied to the host (into pinned
memory) and reordered to BGR (`retrieve`), so the rest of the pipeline is unchanged. Measured on the H200 for one
1080p frame, one thread: 1.73 ms of CPU this way, 2.67 ms copying NV12 and converting it with OpenCV
(docs/bench/h200-2026-12-01/nvdec_probe.json). One decoder per source, kept across the loops of a file: re-creating it on
every loop cut NVDEC throughput to a quarter in the probe.

Not yet done here (issue 11, items 2-3): keeping the frame on the GPU through letterbox and crops.

PyNvVideoCodec and cuda-python are imported only when a GPU source is opened; `nvdec_problem()` says why GPU
decoding is unavailable (no package, no GPU), so `open_source` can fall back to the CPU with a log line.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import logging
from collections import deque
from collections.abc import Iterator
from typing import Any

import cv2
import numpy as np

from pipeline.capture.source_base import (
    SourceEnded,
    SourceError,
    VideoSource,
    pacer_for,
)

log = logging.getLogger(__name__)

PACKAGE = "PyNvVideoCodec"
GPU_REQUIREMENTS = "pip install -r requirements-gpu.txt"


@functools.cache
def nvdec_problem() -> str | None:
    """Why NVDEC decoding cannot be used in this process (None when it can); checked once."""
    problem: str | None = None
    try:
        importlib.import_module(PACKAGE)
        runtime = importlib.import_module("cuda.bindings.runtime")
        status, count = runtime.cudaGetDeviceCount()
        if int(status) != 0 or count < 1:
            problem = "no CUDA device is visible"
    except ImportError as exc:
        problem = f"{exc.name or PACKAGE} is not installed ({GPU_REQUIREMENTS})"
    except OSError as exc:  # the package imports its native library, which needs the NVIDIA driver
        problem = f"{PACKAGE} cannot load: {exc}"
    return problem


class NvdecSource(VideoSource):
    """A file or stream decoded on NVDEC. `grab` decodes the next frame on the GPU; `retrieve` brings it to the host.

    Frames from one `Decode` call stay valid until the next call, which `grab` makes only once they are consumed."""

    kind = "nvdec"

    def __init__(self, location: str, label: str, loop: bool = False, paced: bool = False, gpu: int = 0) -> None:
        problem = nvdec_problem()
        if problem is not None:
            raise SourceError(f"{label}: GPU decoding unavailable: {problem}")
        self._nvc: Any = importlib.import_module(PACKAGE)
        self._runtime: Any = importlib.import_module("cuda.bindings.runtime")
        self._location, self._label, self._loop, self._gpu = location, label, loop, gpu
        self._demuxer: Any = None
        self._decoder: Any = None
        self._packets: Iterator[Any] = iter(())
        self._pending: deque[Any] = deque()
        self._current: Any = None
        self._frames = 0
        self._pinned = 0  # page-locked host buffer for one frame (cudaMallocHost), freed by close()
        self._pinned_bytes = 0
        self._open_demuxer()
        codec = self._demuxer.GetNvCodecId()
        try:
            self._decoder = self._nvc.CreateDecoder(gpuid=gpu, codec=codec, usedevicememory=True,
                                                    outputColorType=self._nvc.OutputColorType.RGB)
        except Exception as exc:  # noqa: BLE001 - PyNvVideoCodec raises its own types for unsupported codecs
            raise SourceError(f"{label}: NVDEC cannot decode this stream ({type(exc).__name__}: {exc})") from exc
        self._size = (int(self._demuxer.Width()), int(self._demuxer.Height()))
        fps = float(self._demuxer.FrameRate() or 0.0)
        self._pacer = pacer_for(fps) if paced else None

    def _open_demuxer(self) -> None:
        try:
            self._demuxer = self._nvc.CreateDemuxer(filename=self._location)
        except Exception as exc:  # noqa: BLE001 - FFmpeg open errors arrive as several exception types
            raise SourceError(f"cannot open {self._label} for GPU decoding ({type(exc).__name__}: {exc})") from exc
        self._packets = iter(self._demuxer)

    def grab(self, timeout: float) -> bool:
        if self._pacer is not None:
            self._pacer.wait()
        while not self._pending:
            self._decode_next_packet()
        self._current = self._pending.popleft()
        self._frames += 1
        return True

    def _decode_next_packet(self) -> None:
        """Feed one packet to NVDEC (0..n frames come out); at the end of a file, loop or end."""
        try:
            packet = next(self._packets)
        except StopIteration:
            self._end_of_stream()
            return
        try:
            self._pending.extend(self._decoder.Decode(packet))
        except Exception as exc:  # noqa: BLE001 - a corrupt packet or a lost device: the capture thread retries
            raise SourceError(f"{self._label}: NVDEC decoding failed ({type(exc).__name__}: {exc})") from exc

    def _end_of_stream(self) -> None:
        if self._frames == 0:
            raise SourceError(f"{self._label}: no frame could be decoded (corrupt, truncated or not video)")
        if not self._loop:
            raise SourceEnded(self._label)
        self._open_demuxer()  # a new demuxer from the start; the decoder (and its NVDEC session) is kept
        self._frames = 0

    def retrieve(self) -> np.ndarray:
        """The frame last grabbed as BGR: its RGB pixels copied from the GPU into pinned memory, reordered on the CPU.
        Only frames due under the fps cap get here."""
        frame = self._current
        if frame is None:
            raise SourceError(f"{self._label}: retrieve() before grab()")
        width, height = self._size
        size = int(frame.framesize())
        if size != width * height * 3:
            raise SourceError(f"{self._label}: decoded frame of {size} bytes is not RGB {width}x{height}")
        rgb = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(self._host_buffer(size)))
        self._cuda("cudaMemcpy (decoded frame to the host)", self._runtime.cudaMemcpy(
            rgb.ctypes.data, int(frame.GetPtrToPlane(0)), size, self._runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        return cv2.cvtColor(rgb.reshape(height, width, 3), cv2.COLOR_RGB2BGR)

    def _host_buffer(self, size: int) -> int:
        if self._pinned_bytes < size:
            self._free_host_buffer()
            self._pinned = int(self._cuda("cudaMallocHost (frame buffer)", self._runtime.cudaMallocHost(size)))
            self._pinned_bytes = size
        return self._pinned

    def _free_host_buffer(self) -> None:
        if self._pinned:
            self._cuda("cudaFreeHost (frame buffer)", self._runtime.cudaFreeHost(self._pinned))
            self._pinned, self._pinned_bytes = 0, 0

    def _cuda(self, call: str, result: Any) -> Any:
        """cuda-python returns (status, value...): a status other than success is a SourceError naming the call."""
        status, *values = result if isinstance(result, tuple) else (result,)
        if int(status) != 0:
            raise SourceError(f"{self._label}: CUDA {call} failed: {getattr(status, 'name', status)}")
        return values[0] if values else None

    def describe(self) -> str:
        width, height = self._size
        return f"{self._label} {width}x{height} (NVDEC on GPU {self._gpu})"

    def close(self) -> None:
        self._pending.clear()
        self._current = None
        self._free_host_buffer()
        self._decoder = None  # PyNvVideoCodec frees its session when the last reference goes
        self._demuxer = None
