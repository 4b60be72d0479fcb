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


class CudaLane:
    """One stream, with pinned/device buffers for `max_batch` items and one session per padded batch size.

    Measured on the H200 (onnxruntime-gpu 1.31.1): every change of input shape between two runs of one CUDA session
    costs 1.2-1.7 s, even for shapes it has run before, while repeated runs of one shape take ~1 ms. A dynamic
    batcher changes shape constantly, so each lane keeps one session per bucket size (`bucket`), and each session
    only ever sees its own shape. The sessions are small (the models are a few MB) and share the lane's stream.

    One run at a time (a lock); close() takes the same lock, so it waits for a run in flight and later runs are
    refused, and no buffer is freed under a copy.
    """

    def __init__(self, session_factory: Callable[[int], Any], input_name: str, output_names: list[str],
                 max_batch: int, step: int = 4, what: str = "CUDA lane") -> None:
        """`session_factory(stream_handle)` makes one ONNX Runtime CUDA session that runs on that stream."""
        self.what = what
        self._session_factory = session_factory
        self._input = input_name
        self._outputs = output_names
        self._max_batch = max_batch
        self._step = step
        self._lock = threading.Lock()
        self._sessions: dict[int, tuple[Any, Any]] = {}  # bucket -> (session, io binding)
        self._pinned: PinnedBuffer | None = None
        self._device: DeviceBuffer | None = None
        self._item: tuple[tuple[int, ...], np.dtype[Any]] | None = None
        self._stream: Stream | None = Stream(what)

    def _session_for(self, bucket: int, stream: Stream) -> tuple[Any, Any]:
        entry = self._sessions.get(bucket)
        if entry is None:
            session = self._session_factory(stream.handle)
            entry = (session, session.io_binding())
            self._sessions[bucket] = entry
        return entry

    def staging(self, batch: int, item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """Pinned host memory for `batch` items; (re)allocated when the item shape changes."""
        with self._lock:
            return self._staging(batch, item_shape, np.dtype(dtype))

    def _staging(self, batch: int, item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        if self._stream is None:
            raise BackendError(f"{self.what} is closed")
        pinned = self._pinned
        if pinned is None or self._item != (item_shape, dtype):
            pinned = self._allocate(item_shape, dtype)
        return pinned.view((self._max_batch, *item_shape), dtype)[:batch]

    def _allocate(self, item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> PinnedBuffer:
        self._release()
        nbytes = math.prod((self._max_batch, *item_shape)) * dtype.itemsize
        self._pinned = PinnedBuffer(f"{self.what} input staging", nbytes)
        self._device = DeviceBuffer(f"{self.what} input", nbytes)
        self._item = (item_shape, dtype)
        log.debug("%s buffers: %s x %s %s", self.what, self._max_batch, item_shape, dtype)
        return self._pinned

    def bucket(self, batch: int) -> int:
        return padded_size(batch, self._step, self._max_batch)

    def warm(self, item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        """Run every bucket once, so no first-time shape is met while cameras are running."""
        sizes = sorted({self.bucket(b) for b in range(1, self._max_batch + 1)})
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
            staged = self._staging(padded, batch.shape[1:], batch.dtype)
            if staged.__array_interface__["data"][0] != batch.__array_interface__["data"][0]:
                staged[:count] = batch  # the batcher did not stack into our staging buffer
            device = self._device
            if device is None:
                raise BackendError(f"{self.what}: no device input buffer")
            stream.copy_in(device, staged)
            session, binding = self._session_for(padded, stream)
            binding.bind_input(self._input, "cuda", 0, batch.dtype, [padded, *batch.shape[1:]], device.ptr)
            binding.clear_binding_outputs()
            for name in self._outputs:
                binding.bind_output(name, "cpu")
            session.run_with_iobinding(binding)  # enqueued on the same stream; returns when outputs are on the host
            return {name: value[:count] for name, value in zip(self._outputs, binding.copy_outputs_to_cpu())}

    def _release(self) -> None:
        pinned, device = self._pinned, self._device
        self._pinned, self._device, self._item = None, None, None
        if pinned is not None:
            pinned.close()
        if device is not None:
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


def padded_size(batch: int, step: int, max_batch: int) -> int:
    """The batch size actually run for `batch` items: the next power of `step`, capped at `max_batch`.

    A few fixed sizes (like TensorRT profiles or Triton's preferred batch sizes), each with its own session,
    all created and warmed before the cameras start; with step 4, padding wastes at most 3/4 of a small batch."""
    size = 1
    while size < batch:
        size *= step
    return min(size, max_batch)
