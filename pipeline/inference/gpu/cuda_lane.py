"""One ONNX Runtime CUDA lane: its own CUDA stream, pinned host staging and a device input buffer.

ONNX Runtime is given the lane's stream (`user_compute_stream`), so the host→device copy of a batch, the model and the
copy of the outputs all run in order on one stream without a host synchronisation in between, and K lanes overlap
one batch's copies with another's compute. The batch is stacked by the batcher straight into pinned memory
(`staging`), so uint8 frames cross the PCIe bus once, at full speed.

CUDA is reached through cuda-python (`cuda.bindings.runtime`), NVIDIA's official bindings: every call returns an error
code, which `_check` turns into an exception naming the call.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.inference.backend import BackendError

log = logging.getLogger(__name__)


def load_cudart() -> Any:
    """cuda-python's runtime module (its import path changed in cuda-python 12.6)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[no-redef]
        except ImportError as exc:
            raise BackendError("inference.device cuda with onnxruntime needs cuda-python: "
                               "pip install -r requirements-gpu.txt") from exc
    return runtime


def _check(cudart: Any, result: Any, call: str) -> Any:
    """Raise BackendError naming `call` unless CUDA returned success; return the call's value, if any."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = cudart.cudaGetErrorName(err)[1]
        raise BackendError(f"CUDA {call} failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else tuple(values)


class PinnedBuffer:
    """Page-locked host memory owned by this object; freed by close(), not by garbage collection."""

    def __init__(self, cudart: Any, nbytes: int) -> None:
        self._cudart = cudart
        self.nbytes = nbytes
        self.ptr: int = int(_check(cudart, cudart.cudaMallocHost(nbytes), "cudaMallocHost"))

    def view(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.ptr)
        return np.frombuffer(raw, dtype=dtype, count=math.prod(shape)).reshape(shape)

    def close(self) -> None:
        if self.ptr:
            _check(self._cudart, self._cudart.cudaFreeHost(self.ptr), "cudaFreeHost")
            self.ptr = 0


class CudaLane:
    """One stream, with pinned/device buffers for `max_batch` items and one session per padded batch size.

    Measured on the H200 (onnxruntime-gpu 1.31.1): every change of input shape between two runs of one CUDA session
    costs 1.2-1.7 s, even for shapes it has run before, while repeated runs of one shape take ~1 ms. A dynamic
    batcher changes shape constantly, so each lane keeps one session per bucket size (`bucket`), and each session
    only ever sees its own shape. The sessions are small (the models are a few MB) and share the lane's stream.
    """

    def __init__(self, cudart: Any, session_factory: Callable[[int], Any], stream: int, input_name: str,
                 output_names: list[str], max_batch: int, step: int = 4) -> None:
        self._cudart = cudart
        self._session_factory = session_factory
        self._stream = stream
        self._input = input_name
        self._outputs = output_names
        self._max_batch = max_batch
        self._step = step
        self._sessions: dict[int, tuple[Any, Any]] = {}  # bucket -> (session, io binding)
        self._pinned: PinnedBuffer | None = None
        self._device: Any = None  # OrtValue on the GPU, max_batch items
        self._item: tuple[tuple[int, ...], np.dtype] | None = None

    def _session_for(self, bucket: int) -> tuple[Any, Any]:
        entry = self._sessions.get(bucket)
        if entry is None:
            session = self._session_factory(self._stream)
            entry = (session, session.io_binding())
            self._sessions[bucket] = entry
        return entry

    def staging(self, batch: int, item_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Pinned host memory for `batch` items; (re)allocated when the item shape changes."""
        pinned = self._pinned
        if pinned is None or self._item != (item_shape, np.dtype(dtype)):
            pinned = self._allocate(item_shape, np.dtype(dtype))
        return pinned.view((self._max_batch, *item_shape), np.dtype(dtype))[:batch]

    def _allocate(self, item_shape: tuple[int, ...], dtype: np.dtype) -> PinnedBuffer:
        import onnxruntime as ort

        self._release()
        shape = (self._max_batch, *item_shape)
        pinned = PinnedBuffer(self._cudart, math.prod(shape) * dtype.itemsize)
        self._pinned = pinned
        self._device = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, "cuda", 0)
        self._item = (item_shape, dtype)
        log.debug("lane buffers: %s x %s %s", self._max_batch, item_shape, dtype)
        return pinned

    def bucket(self, batch: int) -> int:
        return padded_size(batch, self._step, self._max_batch)

    def warm(self, item_shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Run every bucket once, so no first-time shape is met while cameras are running."""
        sizes = sorted({self.bucket(b) for b in range(1, self._max_batch + 1)})
        staging = self.staging(self._max_batch, item_shape, dtype)
        staging[...] = 0
        for size in sizes:
            self.run(staging[:size])

    def run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Copy in → run → copy out, all on the lane's stream; rows past len(batch) are padding, dropped."""
        count = len(batch)
        padded = self.bucket(count)
        staged = self.staging(padded, batch.shape[1:], batch.dtype)
        if staged.__array_interface__["data"][0] != batch.__array_interface__["data"][0]:
            staged[:count] = batch  # the batcher did not stack into our staging buffer
        cudart = self._cudart
        _check(cudart, cudart.cudaMemcpyAsync(self._device.data_ptr(), staged.ctypes.data, staged.nbytes,
                                              cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self._stream),
               "cudaMemcpyAsync(host to device)")
        session, binding = self._session_for(padded)
        binding.bind_input(self._input, "cuda", 0, batch.dtype, [padded, *batch.shape[1:]], self._device.data_ptr())
        binding.clear_binding_outputs()
        for name in self._outputs:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)  # enqueued on the same stream; returns when outputs are on the host
        return {name: value[:count] for name, value in zip(self._outputs, binding.copy_outputs_to_cpu())}

    def _release(self) -> None:
        if self._pinned is not None:
            self._pinned.close()
        self._pinned, self._device, self._item = None, None, None

    def close(self) -> None:
        self._release()
        self._sessions.clear()
        if self._stream:
            _check(self._cudart, self._cudart.cudaStreamDestroy(self._stream), "cudaStreamDestroy")
            self._stream = 0


def padded_size(batch: int, step: int, max_batch: int) -> int:
    """The batch size actually run for `batch` items: the next power of `step`, capped at `max_batch`.

    A few fixed sizes (like TensorRT profiles or Triton's preferred batch sizes), each with its own session,
    all created and warmed before the cameras start; with step 4, padding wastes at most 3/4 of a small batch."""
    size = 1
    while size < batch:
        size *= step
    return min(size, max_batch)


def create_stream(cudart: Any) -> int:
    stream = _check(cudart, cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "cudaStreamCreate")
    return int(stream)
