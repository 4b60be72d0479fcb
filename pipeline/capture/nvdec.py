"""Video decoding on the GPU's NVDEC engines through PyNvVideoCodec, for files and RTSP/HTTP streams.

Why: on the GPU machine the CPU decoding every frame of every camera is what limits the number of cameras (16 cores
decoded ~976 1080p frames/s with FFmpeg, while NVDEC decoded 4,310/s on 1.7 cores: ../shared/tools/gpu-machine.md).
Demuxing stays on the CPU (PyNvVideoCodec's bundled FFmpeg), every frame is decoded on NVDEC into GPU memory and
converted to RGB there, and only the frames the camera's fps cap lets through are copied to the host (into pinned
memory) and reordered to BGR (`retrieve`), so the rest of the pipeline is unchanged. Measured on the H200 for one
1080p frame, one thread: 1.73 ms of CPU this way, 2.67 ms copying NV12 and converting it with OpenCV
(docs/bench/h200-2026-12-01/nvdec_probe.json). One decoder per source, kept across the loops of a file: re-creating it on
every loop cut NVDEC throughput to a quarter in the probe.

With `keep_on_device` (the GPU frame path: inference.frame_path graph on cuda) `retrieve` does not copy to the host
at all: the decoded RGB frame is copied once, device to device, into a buffer of the source's `DevicePool`, and
handed over as an `NvdecImage` (core.types.DeviceImage); the letterbox, detector, NMS, crops and classifier then
read it where it is. The copy is needed because NVDEC's output surface is reused by the next `Decode`.

PyNvVideoCodec and cuda-python are imported only when a GPU source is opened; `nvdec_problem()` says why GPU
decoding is unavailable (no package, no GPU), so `open_source` can fall back to the CPU with a log line.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import cv2
import numpy as np

from pipeline.capture.nv12 import ConverterError, Nv12ToRgb, converter_for
from pipeline.capture.source_base import (
    SourceEnded,
    SourceError,
    VideoSource,
    pacer_for,
)
from pipeline.core.types import ChannelOrder, FrameImage

log = logging.getLogger(__name__)

PACKAGE = "PyNvVideoCodec"
GPU_REQUIREMENTS = "pip install -r requirements-gpu.txt"
PEEK_PACKETS = 8  # enough for a B-frame reorder to show in the presentation times

_pools_lock = threading.Lock()
_outputs_lock = threading.Lock()
_not_nv12: set[str] = set()  # locations whose frames came out of NVDEC other than NV12: decoded to RGB from then on
# every DevicePool of this process: buffers allocated (in use or idle), and of them in use (an image holds it)
_pools = {"buffers": 0, "bytes": 0, "peak_buffers": 0, "peak_bytes": 0, "in_use": 0, "peak_in_use": 0}
# every open NvdecSource of this process: the most frames one `Decode` call of each has returned, summed (frames and
# bytes), and how many calls returned more than one, of them within the first packets after a file's loop
_outputs = {"decoders": 0, "frames": 0, "bytes": 0, "calls_with_several": 0, "several_at_loop": 0}


def frame_pool_allocations() -> dict[str, int]:
    """GPU frame buffers that every NVDEC source's pool holds in this process (in use or idle), now and at most:
    `bench memory` tells them apart from NVDEC's own surfaces, which are allocated inside PyNvVideoCodec. `in_use`
    and `peak_in_use` count those an image held at once, across all pools: the most the cameras needed together,
    against the sum of what each pool grew to."""
    with _pools_lock:
        return dict(_pools)


def decoder_output_frames() -> dict[str, int]:
    """The most frames each open decoder has returned from one `Decode` call, summed over this process's decoders,
    and their bytes (RGB, or NV12 where capture.nv12 converts them).

    Why: PyNvVideoCodec allocates its output frames inside the library (not in our pools) and keeps as many as one
    call has returned together: a stream with B-frames returns two or three now and then, so its decoder keeps 12-18
    MB of RGB frames at 1080p from then on, half that as NV12 (BENCHMARKS.md, round 23). `bench memory` prints this
    beside its GPU split, so a growth of NVDEC's share can be told from the frame pools' and the arena's.
    `calls_with_several` counts the calls that returned more than one frame; `several_at_loop` those within the first
    packets after a file looped."""
    with _outputs_lock:
        return dict(_outputs)


def _account_output(frames: int, nbytes: int, several: bool = False, at_loop: bool = False,
                    decoders: int = 0) -> None:
    """A decoder's most frames at once grew by `frames` (negative: it closed, `decoders` -1); one call returned
    several; a decoder opened (`decoders` +1)."""
    with _outputs_lock:
        _outputs["decoders"] += decoders
        _outputs["frames"] += frames
        _outputs["bytes"] += nbytes
        _outputs["calls_with_several"] += int(several)
        _outputs["several_at_loop"] += int(several and at_loop)


def _account_in_use(change: int) -> None:
    """A pool's buffer handed to an image (+1) or back from one (-1)."""
    with _pools_lock:
        _pools["in_use"] += change
        _pools["peak_in_use"] = max(_pools["peak_in_use"], _pools["in_use"])


def _account_pool_buffer(nbytes: int) -> None:
    """A pool's buffer allocated (`nbytes` > 0) or freed (< 0)."""
    with _pools_lock:
        _pools["buffers"] += 1 if nbytes > 0 else -1
        _pools["bytes"] += nbytes
        _pools["peak_buffers"] = max(_pools["peak_buffers"], _pools["buffers"])
        _pools["peak_bytes"] = max(_pools["peak_bytes"], _pools["bytes"])


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


def reorders_frames(stamps: list[int]) -> bool:
    """Whether packets in decoding order show B-frames: their presentation times do not strictly rise. Too few
    packets to tell, or missing/repeated times, count as reordering (the decoder then keeps display order)."""
    return len(stamps) < 2 or any(later <= earlier for earlier, later in zip(stamps, stamps[1:]))


class NvdecSource(VideoSource):
    """A file or stream decoded on NVDEC. `grab` decodes the next frame on the GPU; `retrieve` brings it to the host.

    Frames from one `Decode` call stay valid until the next call, which `grab` makes only once they are consumed."""

    kind = "nvdec"

    def __init__(self, location: str, label: str, loop: bool = False, paced: bool = False, gpu: int = 0,
                 keep_on_device: bool = False) -> None:
        problem = nvdec_problem()
        if problem is not None:
            raise SourceError(f"{label}: GPU decoding unavailable: {problem}")
        self._nvc: Any = importlib.import_module(PACKAGE)
        self._runtime: Any = importlib.import_module("cuda.bindings.runtime")
        self._location, self._label, self._loop, self._gpu = location, label, loop, gpu
        self._demuxer: Any  # set by _open_demuxer
        self._decoder: Any = None
        self._packets: Iterator[Any] = iter(())
        self._pending: deque[Any] = deque()
        self._current: Any = None
        self._frames = 0
        self._pinned = 0  # page-locked host buffer for one frame (cudaMallocHost), freed by close()
        self._pinned_bytes = 0
        self._pool: DevicePool | None = None
        self._keep_on_device = keep_on_device
        self._looped = False
        self._end_of_picture = not self._has_b_frames()
        self._open_demuxer()
        relax_capture_mode(self._runtime, self._label)  # this thread (the camera's reader) decodes beside recordings
        codec = self._demuxer.GetNvCodecId()
        # The decoder's own non-blocking stream: its conversion kernels and our copies of its frames are ordered on
        # it, and never wait for (or hold up) the inference lanes, as work on the legacy default stream would.
        self._stream: Any = self._cuda("cudaStreamCreateWithFlags (decoder stream)",
                                       self._runtime.cudaStreamCreateWithFlags(self._runtime.cudaStreamNonBlocking))
        self._size = (int(self._demuxer.Width()), int(self._demuxer.Height()))
        self._nv12 = self._nv12_converter()
        width, height = self._size
        self._frame_bytes = width * height * 3 // 2 if self._nv12 is not None else width * height * 3
        self._create_decoder(codec)
        self._most_at_once = 0  # the most frames one Decode call has returned (decoder_output_frames)
        _account_output(0, 0, decoders=1)
        fps = float(self._demuxer.FrameRate() or 0.0)
        self._pacer = pacer_for(fps) if paced else None

    def _create_decoder(self, codec: Any) -> None:
        colour = self._nvc.OutputColorType.NATIVE if self._nv12 is not None else self._nvc.OutputColorType.RGB
        try:
            self._decoder = self._nvc.CreateDecoder(gpuid=self._gpu, codec=codec, usedevicememory=True,
                                                    cudastream=int(self._stream), outputColorType=colour,
                                                    latency=self._nvc.DisplayDecodeLatencyType.LOW)
        except Exception as exc:  # noqa: BLE001 - PyNvVideoCodec raises its own types for unsupported codecs
            self._destroy_stream()
            raise SourceError(f"{self._label}: NVDEC cannot decode this stream ({type(exc).__name__}: {exc})") from exc

    def _nv12_converter(self) -> Nv12ToRgb | None:
        """Our NV12 kernel where frames stay on the GPU and the stream is 8-bit limited range (capture.nv12: the
        decoder then keeps NV12 output frames, half RGB's bytes); None where PyNvVideoCodec converts to RGB itself:
        frames for the host, 10-bit or full-range streams, a stream whose frames were not NV12 before, no NVRTC."""
        if not self._keep_on_device or self._location in _not_nv12:
            return None
        full_range = getattr(self._nvc.ColorRange, "JPEG", None)
        if int(self._demuxer.BitDepth()) != 8 or (full_range is not None and self._demuxer.ColorRange() == full_range):
            return None
        return converter_for(self._gpu)

    def _open_demuxer(self) -> None:
        self._demuxer = self._new_demuxer()
        self._packets = iter(self._demuxer)
        self._packets_since_open = 0

    def _new_demuxer(self) -> Any:
        try:
            return self._nvc.CreateDemuxer(filename=self._location)
        except Exception as exc:  # noqa: BLE001 - FFmpeg open errors arrive as several exception types
            raise SourceError(f"cannot open {self._label} for GPU decoding ({type(exc).__name__}: {exc})") from exc

    def _has_b_frames(self) -> bool:
        """Whether the stream reorders frames (B-frames): its first packets' presentation times do not rise.

        Why: every stream is decoded in PyNvVideoCodec's LOW latency mode (no display delay beyond what the stream's
        own reordering needs; its default, NATIVE, holds up to 4 frames back, each 40 ms of a 25 fps camera's delay
        that no later clock sees, and takes 17 MB more GPU memory per 1080p decoder: BENCHMARKS.md). Without
        B-frames (most IP cameras) each packet is also marked end-of-picture, so its frame comes out at once; a
        stream with B-frames must not be marked (a frame's successors in display order arrive after it), and keeps
        the display order either way (measured on two B-frame clips; tests/test_nvdec.py compares with FFmpeg's
        frames). Missing or repeated timestamps, or packets that cannot be read, count as reordering (the safe side).
        The peek has a demuxer of its own, dropped before the stream is opened for decoding (a camera may allow one
        session at a time): a demuxer hands out the same packet object each time, so kept packets decode to nothing
        (measured). A stream that cannot be opened fails here, once, as it would at the real open."""
        peek = self._new_demuxer()
        try:
            stamps = [int(packet.pts) for packet in itertools.islice(peek, PEEK_PACKETS)]
        except Exception as exc:  # noqa: BLE001 - a read error of FFmpeg's; the stream's own reads report theirs
            log.debug("%s: could not read the first packets' timestamps (%s): decoding in display order",
                      self._label, exc)
            return True
        finally:
            del peek
        return reorders_frames(stamps)

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
        if self._end_of_picture:  # decode this picture now rather than on the next packet's arrival
            packet.decode_flag = self._nvc.VideoPacketFlag.ENDOFPICTURE
        self._packets_since_open += 1
        try:
            frames = self._decoder.Decode(packet)
        except Exception as exc:  # noqa: BLE001 - a corrupt packet or a lost device: the capture thread retries
            raise SourceError(f"{self._label}: NVDEC decoding failed ({type(exc).__name__}: {exc})") from exc
        if len(frames) > 1 or len(frames) > self._most_at_once:
            self._note_output(len(frames))
        self._pending.extend(frames)

    def _note_output(self, count: int) -> None:
        """Account a call's frames in decoder_output_frames: its most at once, and a call that returned several."""
        grown = max(0, count - self._most_at_once)
        at_loop = self._loop and self._looped and self._packets_since_open <= PEEK_PACKETS
        _account_output(grown, grown * self._frame_bytes, several=count > 1, at_loop=at_loop)
        if grown and count > 1:
            log.debug("%s: NVDEC returned %d frames from one packet%s", self._label, count,
                      " after the file looped" if at_loop else "")
        self._most_at_once = max(self._most_at_once, count)

    def _end_of_stream(self) -> None:
        if self._frames == 0:
            raise SourceError(f"{self._label}: no frame could be decoded (corrupt, truncated or not video)")
        if not self._loop:
            raise SourceEnded(self._label)
        self._open_demuxer()  # a new demuxer from the start; the decoder (and its NVDEC session) is kept
        self._looped = True
        self._frames = 0

    @property
    def frames_pooled(self) -> bool:
        return self._keep_on_device

    def retrieve(self) -> FrameImage:
        """The frame last grabbed: an NvdecImage that stays on the GPU (keep_on_device), else BGR on the host (its RGB
        pixels copied into pinned memory and reordered on the CPU). Only frames due under the fps cap get here."""
        frame = self._current
        if frame is None:
            raise SourceError(f"{self._label}: retrieve() before grab()")
        width, height = self._size
        size = int(frame.framesize())
        if size != self._frame_bytes:
            raise self._unexpected_frame(size)
        if self._keep_on_device:
            return self._device_copy(int(frame.GetPtrToPlane(0)))
        rgb = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(self._host_buffer(size)))
        self._cuda("cudaMemcpyAsync (decoded frame to the host)", self._runtime.cudaMemcpyAsync(
            rgb.ctypes.data, int(frame.GetPtrToPlane(0)), size, self._runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost,
            self._stream))
        self._cuda("cudaStreamSynchronize (decoded frame to the host)",
                   self._runtime.cudaStreamSynchronize(self._stream))
        return cv2.cvtColor(rgb.reshape(height, width, 3), cv2.COLOR_RGB2BGR)

    def _unexpected_frame(self, size: int) -> SourceError:
        width, height = self._size
        if self._nv12 is None:
            return SourceError(f"{self._label}: decoded frame of {size} bytes is not RGB {width}x{height}")
        _not_nv12.add(self._location)  # the capture thread's retry opens it again with RGB output
        return SourceError(f"{self._label}: decoded frame of {size} bytes is not NV12 {width}x{height} (not 8-bit "
                           "4:2:0): opening it again with PyNvVideoCodec's RGB conversion")

    def _convert(self, converter: Nv12ToRgb, src: int, buffer: int) -> None:
        """NVDEC's NV12 frame into the pool buffer as RGB, on the decoder's stream (ordered after the decoder's copy
        of the frame, as the plain copy is), finished before returning (the next Decode may reuse `src`)."""
        width, height = self._size
        try:
            converter.convert(src, width, height, buffer, self._stream)
        except ConverterError as exc:
            raise SourceError(f"{self._label}: {exc}") from exc
        self._cuda("cudaStreamSynchronize (NV12 to RGB)", self._runtime.cudaStreamSynchronize(self._stream))

    def _device_copy(self, src: int) -> NvdecImage:
        """Copy NVDEC's output frame into a pool buffer of our own (the decoder reuses its frame at the next Decode),
        as RGB: converted from NV12 by our kernel (capture.nv12), or copied where PyNvVideoCodec made it RGB."""
        width, height = self._size
        if self._pool is None:
            self._pool = DevicePool(self._label, width * height * 3, self._runtime, self._stream, gpu=self._gpu)
        buffer = self._pool.acquire()
        try:
            if self._nv12 is not None:
                self._convert(self._nv12, src, buffer)
            else:
                self._pool.copy(buffer, src)
        except SourceError:
            self._pool.release(buffer)
            raise
        return NvdecImage(self._pool, buffer, (height, width, 3))

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
        order = "no B-frames: no frame held" if self._end_of_picture else "B-frames: held for display order"
        colour = "NV12 to RGB by our kernel" if self._nv12 is not None else "RGB by PyNvVideoCodec"
        return f"{self._label} {width}x{height} (NVDEC on GPU {self._gpu}, {order}, {colour})"

    def close(self) -> None:
        self._pending.clear()
        self._current = None
        self._free_host_buffer()
        if self._pool is not None:
            self._pool.close()  # frees idle buffers now, and each buffer still in use when its image goes
            self._pool = None
        if self._decoder is not None:
            _account_output(-self._most_at_once, -self._most_at_once * self._frame_bytes, decoders=-1)
        self._decoder = None  # PyNvVideoCodec frees its session when the last reference goes
        self._demuxer = None
        self._destroy_stream()

    def _destroy_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            self._cuda("cudaStreamDestroy (decoder stream)", self._runtime.cudaStreamDestroy(stream))


_capture_relaxed = threading.local()  # threads that relax_capture_mode has set


def relax_capture_mode(runtime: Any, label: str) -> None:
    """Let the calling thread call CUDA while another thread records a CUDA graph (once per thread).

    Why: inference.cuda_graphs records the frame graphs' runs, and CUDA's default (global) capture mode forbids every
    other thread calls that may synchronise, cudaMalloc and synchronous copies among them, for the recording's
    duration: a camera whose frame pool grew at that moment, or a worker copying a face's window down
    (`tracking.follow_by: look`), would fail its frame, or break the recording. The relaxed mode only lifts that ban
    for this thread; nothing these threads do is ever recorded. It matters only beside a recording, so a failure is
    logged and the work goes on."""
    if getattr(_capture_relaxed, "done", False):
        return
    mode = runtime.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed
    status, *_ = runtime.cudaThreadExchangeStreamCaptureMode(mode)
    if int(status) != 0:
        log.warning("%s: CUDA cudaThreadExchangeStreamCaptureMode (relaxed) failed: %s (with inference.cuda_graphs "
                    "this thread may fail a frame while a lane records)", label, getattr(status, "name", status))
    _capture_relaxed.done = True


class _IdleBuffers:
    """The idle GPU frame buffers of one size on one GPU, shared by every source's DevicePool of that size.

    Why shared: a camera needs a third buffer only for moments (its frames in flight and the one being filled), and
    the cameras' moments rarely all coincide; pools of their own each kept their largest count, 2.0-3.4 buffers a
    1080p camera in a group of 32, while at most 1.3-3.1 a camera were held at once (bench memory's pool line,
    BENCHMARKS.md round 22).
    Buffers are reused last-in first-out, so the ones at the bottom are those no camera needed lately."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buffers: list[tuple[int, float]] = []  # (buffer, when it came back), the most recent last
        self.users = 0
        self.closed = False

    def take(self) -> int | None:
        with self.lock:
            return self.buffers.pop()[0] if self.buffers else None

    def give(self, buffer: int, when: float) -> bool:
        """Keep a buffer for reuse; False once the last pool of this size has closed (the caller frees it)."""
        with self.lock:
            if self.closed:
                return False
            self.buffers.append((buffer, when))
            return True

    def oldest_idle_since(self, cutoff: float) -> int | None:
        """Take the longest-idle buffer if it came back before `cutoff` (one a call)."""
        with self.lock:
            if not self.buffers or self.buffers[0][1] >= cutoff:
                return None
            return self.buffers.pop(0)[0]


_idle_sets: dict[tuple[int, int, int], _IdleBuffers] = {}  # by (id of the CUDA runtime, GPU, buffer bytes)
_idle_sets_lock = threading.Lock()


def _join_idle(runtime: Any, gpu: int, nbytes: int) -> tuple[tuple[int, int, int], _IdleBuffers]:
    key = (id(runtime), gpu, nbytes)
    with _idle_sets_lock:
        idle = _idle_sets.get(key)
        if idle is None:
            idle = _idle_sets[key] = _IdleBuffers()
        idle.users += 1
    return key, idle


def _leave_idle(key: tuple[int, int, int], idle: _IdleBuffers) -> list[int]:
    """One pool of this size fewer; the last one out takes every idle buffer (to free) and closes the set."""
    with _idle_sets_lock:
        idle.users -= 1
        if idle.users > 0:
            return []
        _idle_sets.pop(key, None)
    with idle.lock:
        idle.closed = True
        buffers, idle.buffers = [buffer for buffer, _ in idle.buffers], []
    return buffers


class DevicePool:
    """One source's GPU frame buffers: a frame's buffer goes back when its image is dropped, to be reused.

    Why a pool: cudaMalloc/cudaFree on every frame would serialise with all GPU work (both synchronise the device).
    A source holds what it uses at once (the frames in flight and the one being filled: the capture reader lets go
    of the slot's frame before filling the next unless a worker took it; BENCHMARKS.md round 13 measured 4.0 buffers
    a camera at two frames in flight before that) and never more than `MAX_BUFFERS`: a camera whose frames are all
    held (analysis stuck) fails its grab with a SourceError, so the capture thread's retry logic handles it like any
    broken source. Its idle buffers go to the set every source of the same frame size on the same GPU shares
    (`_IdleBuffers`), so one camera's burst reuses a buffer another has just let go.

    The copy runs on the decoder's stream (`stream`, owned by the source), so it is ordered after NVDEC's colour
    conversion of the frame; the lanes' streams are non-blocking and neither wait for it nor hold it up. A buffer
    another camera let go is safe to fill: its image was dropped only once the GPU had finished reading it.

    The shared set also shrinks: a spell of slow analysis (frames held longer) grows it, and a daemon that runs for
    weeks should not keep that peak for good. A buffer idle for `IDLE_S` is freed at the next acquire of any source
    of its size (one a call: cudaFree waits for the device, and this runs on a camera's reader thread)."""

    MAX_BUFFERS = 8
    IDLE_S = 30.0

    def __init__(self, label: str, nbytes: int, runtime: Any, stream: Any,
                 clock: Callable[[], float] = time.monotonic, gpu: int = 0) -> None:
        self.label, self.nbytes = label, nbytes
        self._runtime = runtime
        self._clock = clock
        self._lock = threading.Lock()
        self._held = 0  # buffers this source's images hold now
        self._closed = False
        self._stream = stream
        self._idle_key, self._idle = _join_idle(runtime, gpu, nbytes)
        self.runtime, self.gpu = runtime, gpu  # for the window copies of this pool's frames (WindowCopier)

    def acquire(self) -> int:
        self._trim_idle()
        with self._lock:
            if self._closed:
                raise SourceError(f"{self.label}: the frame pool is closed")
            if self._held >= self.MAX_BUFFERS:
                raise SourceError(f"{self.label}: all {self.MAX_BUFFERS} GPU frame buffers are still held "
                                  f"(analysis is not keeping up or is stuck)")
            self._held += 1
        reused = self._idle.take()
        if reused is not None:
            _account_in_use(1)
            return reused
        try:
            buffer = int(self._cuda(f"cudaMalloc ({self.nbytes} bytes for a frame)",
                                    self._runtime.cudaMalloc(self.nbytes)))
        except SourceError:
            with self._lock:
                self._held -= 1
            raise
        _account_pool_buffer(self.nbytes)
        _account_in_use(1)
        return buffer

    def copy(self, dst: int, src: int) -> None:
        """Device-to-device copy of one frame, finished before returning (the next Decode may reuse `src`)."""
        runtime = self._runtime
        self._cuda("cudaMemcpyAsync (decoded frame, device to device)", runtime.cudaMemcpyAsync(
            dst, src, self.nbytes, runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice, self._stream))
        self._cuda("cudaStreamSynchronize (frame copy)", runtime.cudaStreamSynchronize(self._stream))

    def download(self, buffer: int, host: np.ndarray) -> None:
        """Synchronous copy of one frame buffer into a host array of the frame's size."""
        runtime = self._runtime
        relax_capture_mode(runtime, self.label)  # the calling thread is the preview's, not the camera's reader
        self._cuda("cudaMemcpy (frame to the host)", runtime.cudaMemcpy(
            host.ctypes.data, buffer, min(host.nbytes, self.nbytes), runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost))

    def release(self, buffer: int) -> None:
        """Take a buffer back (an image was dropped) into the shared idle set; freed once every pool of its size
        has closed."""
        _account_in_use(-1)
        with self._lock:
            self._held -= 1
        if not self._idle.give(buffer, self._clock()):
            self._free_device(buffer)

    @property
    def buffers(self) -> int:
        """Buffers this source's images hold, and the idle ones it shares with the other sources of its size."""
        with self._lock:
            held = self._held
        with self._idle.lock:
            return held + len(self._idle.buffers)

    def _trim_idle(self) -> None:
        """Free the longest-idle shared buffer if it has been idle for IDLE_S (the bottom of the stack)."""
        buffer = self._idle.oldest_idle_since(self._clock() - self.IDLE_S)
        if buffer is not None:
            self._free_device(buffer)

    def close(self) -> None:
        """No more frames from this source; the last pool of its size frees the idle buffers now, and the buffers
        still held are freed when their images go."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for buffer in _leave_idle(self._idle_key, self._idle):
            self._free_device(buffer)

    def _free_device(self, buffer: int) -> None:
        try:
            self._cuda("cudaFree (frame buffer)", self._runtime.cudaFree(buffer))
        except SourceError as exc:  # on a GPU that has failed; nothing else can be done with the memory
            log.warning("%s", exc)
            return
        _account_pool_buffer(-self.nbytes)

    def _cuda(self, call: str, result: Any) -> Any:
        status, *values = result if isinstance(result, tuple) else (result,)
        if int(status) != 0:
            raise SourceError(f"{self.label}: CUDA {call} failed: {getattr(status, 'name', status)}")
        return values[0] if values else None


class WindowCopier:
    """A thread's own non-blocking stream and page-locked staging buffer, for copying windows of frames down.

    Why not a plain cudaMemcpy2D: on the legacy default stream, into pageable memory, each window's copy waited for
    other work of the process and was staged row by row; at 150 cameras on an H100 following by look that way left
    the cameras 29 % of their frames (BENCHMARKS.md, "Following by look or by motion"). Here every window of a frame
    is queued on this thread's stream into pinned memory and waited for once. One per thread and GPU (a camera's
    worker serves one camera); its stream and buffer are released when the thread ends."""

    _local = threading.local()

    def __init__(self, runtime: Any, gpu: int, label: str) -> None:
        self._runtime, self.label = runtime, label
        self._cuda(f"cudaSetDevice({gpu}) (window copies)", runtime.cudaSetDevice(gpu))
        relax_capture_mode(runtime, label)
        self._stream = self._cuda("cudaStreamCreateWithFlags (window copies)",
                                  runtime.cudaStreamCreateWithFlags(runtime.cudaStreamNonBlocking))
        self._held = [0, 0]  # the pinned buffer's address and size: shared with the finaliser
        weakref.finalize(self, _release_copier, runtime, self._stream, self._held)

    @classmethod
    def for_this_thread(cls, pool: DevicePool) -> WindowCopier:
        """The calling thread's copier for the pool's GPU, made on first use."""
        copiers: dict[int, WindowCopier] = cls._local.__dict__.setdefault("by_gpu", {})
        if pool.gpu not in copiers:
            copiers[pool.gpu] = cls(pool.runtime, pool.gpu, pool.label)
        return copiers[pool.gpu]

    def copy(self, buffer: int, row_bytes: int, boxes: Sequence[tuple[int, int, int, int]]) -> list[np.ndarray]:
        """The RGB windows of a frame buffer (rows of `row_bytes`, 3 bytes a pixel), as fresh host arrays."""
        runtime = self._runtime
        sizes = [(y2 - y1, x2 - x1) for x1, y1, x2, y2 in boxes]
        staging = self._staging(sum(h * w * 3 for h, w in sizes))
        offset = 0
        for (x1, y1, _, _), (h, w) in zip(boxes, sizes):
            self._cuda("cudaMemcpy2DAsync (frame window to the host)", runtime.cudaMemcpy2DAsync(
                staging + offset, w * 3, buffer + y1 * row_bytes + x1 * 3, row_bytes, w * 3, h,
                runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost, self._stream))
            offset += h * w * 3
        self._cuda("cudaStreamSynchronize (frame windows)", runtime.cudaStreamSynchronize(self._stream))
        flat = np.ctypeslib.as_array((ctypes.c_uint8 * max(offset, 1)).from_address(staging))
        windows, offset = [], 0
        for h, w in sizes:
            windows.append(flat[offset:offset + h * w * 3].reshape(h, w, 3).copy())
            offset += h * w * 3
        return windows

    def _staging(self, nbytes: int) -> int:
        """The pinned buffer, grown (to the next power of two, 64 KB at least) when `nbytes` does not fit."""
        if self._held[1] < nbytes:
            if self._held[0]:
                self._cuda("cudaFreeHost (window staging)", self._runtime.cudaFreeHost(self._held[0]))
                self._held[:] = [0, 0]
            size = 1 << max(16, (nbytes - 1).bit_length())
            address = int(self._cuda("cudaMallocHost (window staging)", self._runtime.cudaMallocHost(size)))
            self._held[:] = [address, size]
        return self._held[0]

    def _cuda(self, call: str, result: Any) -> Any:
        status, *values = result if isinstance(result, tuple) else (result,)
        if int(status) != 0:
            raise SourceError(f"{self.label}: CUDA {call} failed: {getattr(status, 'name', status)}")
        return values[0] if values else None


def _release_copier(runtime: Any, stream: Any, held: list[int]) -> None:
    """A WindowCopier's stream and staging buffer back to CUDA (its thread has ended); a failure is only logged."""
    results = [("cudaStreamDestroy", runtime.cudaStreamDestroy(stream))]
    if held[0]:
        results.append(("cudaFreeHost", runtime.cudaFreeHost(held[0])))
    for call, result in results:
        status = result[0] if isinstance(result, tuple) else result
        if int(status) != 0:
            log.debug("window copies: %s failed: %s", call, getattr(status, "name", status))


class NvdecImage:
    """One decoded RGB frame in a DevicePool buffer (a core.types.DeviceImage); the buffer returns to the pool when
    the last reference to the image goes (a weakref finaliser: CPython runs it at once, on the dropping thread).

    Safe because whoever reads the pixels on the GPU (a lane copying them into its batch) holds the image until its
    stream has finished with them."""

    def __init__(self, pool: DevicePool, buffer: int, shape: tuple[int, int, int]) -> None:
        self._pool, self._buffer, self._shape = pool, buffer, shape
        weakref.finalize(self, pool.release, buffer)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self._shape

    @property
    def order(self) -> ChannelOrder:
        return "rgb"

    @property
    def ptr(self) -> int:
        return self._buffer

    def to_host(self) -> np.ndarray:
        """BGR pixels on the host (for the preview): a synchronous copy down and a reorder."""
        height, width, _ = self._shape
        rgb = np.empty((height, width, 3), np.uint8)
        self._pool.download(self._buffer, rgb)
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)

    def windows(self, boxes: Sequence[tuple[int, int, int, int]]) -> list[np.ndarray]:
        """BGR pixels of each window on the host (faces followed by their look, `tracking.follow_by`): 2D copies of
        the windows alone, ~0.1-0.2 MB for a face's search area against 6 MB for a 1080p frame, all in one round
        trip on the calling thread's own stream (`WindowCopier`)."""
        height, width, _ = self._shape
        for x1, y1, x2, y2 in boxes:
            if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
                raise ValueError(f"window ({x1}, {y1})-({x2}, {y2}) is not inside the {width}x{height} frame")
        rgb = WindowCopier.for_this_thread(self._pool).copy(self._buffer, width * 3, boxes)
        return [cv2.cvtColor(window, cv2.COLOR_RGB2BGR) for window in rgb]
