"""One ONNX Runtime CUDA lane: its own CUDA stream, pinned host staging and a device input buffer.

ONNX Runtime is given the lane's stream (`user_compute_stream`), so the host→device copy of a batch, the model and the
copy of the outputs all run in order on one stream without a host synchronisation in between, and K lanes overlap
one batch's copies with another's compute. The batch is stacked by the batcher straight into pinned memory
(`staging`), so uint8 frames cross the PCIe bus once, at full speed.

CUDA is reached through the wing's one binding (pipeline/inference/gpu/cuda.py, cuda-python's runtime API): the
stream, the pinned staging and the device input buffer are its Stream, PinnedBuffer and DeviceBuffer, and every failed
call is a CudaError naming it.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.inference.backend import BackendError
from pipeline.inference.gpu.cuda import DeviceBuffer, PinnedBuffer, Stream

log = logging.getLogger(__name__)

_Item = tuple[tuple[int, ...], np.dtype[Any]]  # one batch item's shape and dtype

# The smallest padded runs by model role: fewer frames or faces run padded up to these instead of keeping sessions of
# their own. Each CUDA session keeps ~75 MB of host and ~19 MB of GPU memory (cuDNN's algorithm choice, BENCHMARKS
# round 14), while the detector takes 2.0 ms for 4 frames against 1.75 for one: the small sizes are not worth one.
SMALLEST_DETECT_RUN = 4
SMALLEST_CLASSIFY_RUN = 16
SMALLEST_RUN = {"detector": SMALLEST_DETECT_RUN, "emotion": SMALLEST_CLASSIFY_RUN}


class CudaLane:
    """One stream, with pinned/device buffers for `max_batch` items and one session per padded batch size.

    Measured on the H200 (onnxruntime-gpu 1.31.1): every change of input shape between two runs of one CUDA session
    costs 1.2-1.7 s, even for shapes it has run before (0.8-1.7 s without its memory pattern, round 21 of
    BENCHMARKS.md), while repeated runs of one shape take ~1 ms. A dynamic
    batcher changes shape constantly, so each lane keeps one session per bucket size (`bucket`), and each session
    only ever sees its own shape. The sessions are small (the models are a few MB) and share the lane's stream.

    One run at a time (a lock); close() takes the same lock, so it waits for a run in flight and later runs are
    refused, and no buffer is freed under a copy.
    """

    def __init__(self, session_factory: Callable[[int], Any], input_name: str, output_names: list[str],
                 max_batch: int, step: int = 4, what: str = "CUDA lane", smallest: int = 1) -> None:
        """`session_factory(stream_handle)` makes one ONNX Runtime CUDA session that runs on that stream; runs of
        fewer than `smallest` items are padded up to it (SMALLEST_RUN)."""
        self.what = what
        self._session_factory = session_factory
        self._input = input_name
        self._outputs = output_names
        self._max_batch = max_batch
        self._step = step
        self._smallest = smallest
        self._lock = threading.Lock()
        # Per item shape (cameras of different aspect ratios give the detector different input sizes, see
        # detector.input_size: auto): (bucket, item shape) -> (session, io binding), and the shape's staging buffers.
        self._sessions: dict[tuple[int, tuple[int, ...]], tuple[Any, Any]] = {}
        self._buffers: dict[_Item, tuple[PinnedBuffer, DeviceBuffer]] = {}
        self._stream: Stream | None = Stream(what)

    def _session_for(self, bucket: int, item_shape: tuple[int, ...], stream: Stream) -> tuple[Any, Any]:
        entry = self._sessions.get((bucket, item_shape))
        if entry is None:
            session = self._session_factory(stream.handle)
            entry = (session, session.io_binding())
            self._sessions[(bucket, item_shape)] = entry
        return entry

    def staging(self, batch: int, item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """Pinned host memory for `batch` items of this shape (allocated the first time the shape is met)."""
        with self._lock:
            return self._staging(batch, item_shape, np.dtype(dtype))

    def _staging(self, batch: int, item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        if self._stream is None:
            raise BackendError(f"{self.what} is closed")
        pinned, _ = self._buffers_for((tuple(item_shape), dtype))
        return pinned.view((self._max_batch, *item_shape), dtype)[:batch]

    def _buffers_for(self, item: _Item) -> tuple[PinnedBuffer, DeviceBuffer]:
        buffers = self._buffers.get(item)
        if buffers is None:
            item_shape, dtype = item
            nbytes = math.prod((self._max_batch, *item_shape)) * dtype.itemsize
            pinned = PinnedBuffer(f"{self.what} input staging {item_shape}", nbytes)
            try:
                device = DeviceBuffer(f"{self.what} input {item_shape}", nbytes)
            except BackendError:
                pinned.close()
                raise
            buffers = self._buffers[item] = (pinned, device)
            log.debug("%s buffers: %s x %s %s", self.what, self._max_batch, item_shape, dtype)
        return buffers

    def bucket(self, batch: int) -> int:
        return padded_size(batch, self._step, self._max_batch, self._smallest)

    def warm(self, item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        """Run every bucket once (largest first: preparation_order), so no first-time shape is met while cameras
        are running."""
        sizes = preparation_order(self._step, self._max_batch, self._smallest)
        staging = self.staging(self._max_batch, item_shape, dtype)
        staging[...] = 0
        for size in sizes:
            self.run(staging[:size])

    def run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Copy in → run → copy out, all on the lane's stream; rows past len(batch) are padding, dropped."""
        with self._lock:
            stream = self._stream
            if stream is None:
                raise BackendError(f"{self.what} is closed")
            count = len(batch)
            padded = self.bucket(count)
            item_shape = tuple(batch.shape[1:])
            staged = self._staging(padded, item_shape, batch.dtype)
            if staged.__array_interface__["data"][0] != batch.__array_interface__["data"][0]:
                staged[:count] = batch  # the batcher did not stack into our staging buffer
            _, device = self._buffers_for((item_shape, np.dtype(batch.dtype)))
            stream.copy_in(device, staged)
            session, binding = self._session_for(padded, item_shape, stream)
            binding.bind_input(self._input, "cuda", 0, batch.dtype, [padded, *batch.shape[1:]], device.ptr)
            binding.clear_binding_outputs()
            for name in self._outputs:
                binding.bind_output(name, "cpu")
            session.run_with_iobinding(binding)  # enqueued on the same stream; returns when outputs are on the host
            return {name: value[:count] for name, value in zip(self._outputs, binding.copy_outputs_to_cpu())}

    def _release(self) -> None:
        buffers, self._buffers = list(self._buffers.values()), {}
        for pinned, device in buffers:
            pinned.close()
            device.close()

    def close(self) -> None:
        """Wait for a run in flight, drain the stream, then free the buffers, the sessions and the stream."""
        with self._lock:
            stream, self._stream = self._stream, None
            if stream is None:
                return
            try:
                stream.synchronize()
                self._release()
                self._sessions.clear()  # the sessions run on the stream: they go before it
            finally:
                stream.close()


def padded_size(batch: int, step: int, max_batch: int, smallest: int = 1) -> int:
    """The batch size actually run for `batch` items: the next power of `step` that is at least `smallest`, capped
    at `max_batch`.

    A few fixed sizes (like TensorRT profiles or Triton's preferred batch sizes), each with its own session,
    all created and warmed before the cameras start; with step 4, padding wastes at most 3/4 of a small batch."""
    size = 1
    while size < max(batch, smallest):
        size *= step
    return min(size, max_batch)


def padded_sizes(step: int, max_batch: int, smallest: int = 1) -> list[int]:
    """Every size padded_size gives for 1..max_batch items: the sessions a lane prepares."""
    return sorted({padded_size(n, step, max_batch, smallest) for n in range(1, max_batch + 1)})


def preparation_order(step: int, max_batch: int, smallest: int = 1) -> list[int]:
    """padded_sizes in the order a lane prepares them: largest first. The shared CUDA arena grows by exactly what a
    run asks for and never gives a region back, so a small run first leaves regions too small for the next size's
    tensors, which then take new ones; after the largest run, every smaller run fits inside the regions it freed
    (124 MiB less GPU memory a camera group on an H100, the same frames analysed: BENCHMARKS.md, round 21)."""
    return padded_sizes(step, max_batch, smallest)[::-1]
