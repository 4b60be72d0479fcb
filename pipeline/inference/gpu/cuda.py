"""CUDA plumbing for the TensorRT backend: device and primary context, streams, events, pinned and device buffers.

Why pycuda (`pycuda.driver`) and not cuda-python: every failing pycuda driver call raises `pycuda.driver.Error`
(or a subclass) whose message already names the driver routine and its CUresult, e.g. ``cuMemAlloc failed: out of
memory``. So one helper, `cuda_call`, turns *every* CUDA error into a `CudaError` that also says what we were doing,
and no call can slip through unchecked. cuda-python returns an ``(error, value)`` tuple from each call instead, which
must be checked by hand at every call site (forgetting one is silent). pycuda also hands out page-locked memory as
numpy arrays (`pagelocked_empty`), which is exactly what the copy-in/copy-out path needs.

Context: TensorRT works through the CUDA runtime API, i.e. in the device's *primary* context. `CudaDevice` retains
that same primary context (`Device.retain_primary_context`) rather than creating a new one (`make_context`), so our
buffers and TensorRT's live in one context. A thread that makes CUDA calls makes it current for the duration
(``with device.active(): ...``); lanes run on different threads, so each run pushes and pops it.

Ownership: device and page-locked buffers are freed by `close()` of the object that allocated them, with the context
current, never by garbage collection. pycuda has no explicit destroy for streams and events, so their owners drop
the last reference inside `close()` (with the context current), which destroys them at that point in CPython.

`pycuda` is imported only inside functions: the module imports on machines without it, and a missing package is a
`BackendError` naming it, never an ImportError traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from pipeline.inference.backend import BackendError

if TYPE_CHECKING:
    from pycuda import driver as cuda

T = TypeVar("T")

GPU_REQUIREMENTS = "pip install -r requirements-gpu.txt"


class CudaError(BackendError):
    """A CUDA driver call failed; the message names the call and what it was for."""


def pycuda_problem() -> str | None:
    """Why `pycuda.driver` cannot be used here (None when it can)."""
    try:
        import pycuda.driver  # noqa: F401 - imported to check that it loads (it needs libcuda)
    except ImportError as exc:
        return f"pycuda cannot be imported ({exc})"
    return None


def require_pycuda() -> None:
    problem = pycuda_problem()
    if problem is not None:
        raise BackendError(f"the TensorRT backend needs pycuda: {problem}; {GPU_REQUIREMENTS}")


def cuda_call(what: str, fn: Callable[..., T], *args: Any) -> T:
    """Call a pycuda function; a CUDA error becomes CudaError("<what>: <routine> failed: <CUresult>")."""
    from pycuda import driver as cuda

    try:
        return fn(*args)
    except cuda.Error as exc:
        raise CudaError(f"{what}: {exc}") from exc


class CudaDevice:
    """One GPU and its retained primary context. `close()` releases the context; safe to call twice."""

    def __init__(self, ordinal: int = 0) -> None:
        require_pycuda()
        from pycuda import driver as cuda

        cuda_call("initialise CUDA", cuda.init)
        count = cuda_call("count CUDA devices", cuda.Device.count)
        if ordinal >= count:
            raise CudaError(f"CUDA device {ordinal} does not exist ({count} device(s) visible)")
        self.ordinal = ordinal
        self._device = cuda_call(f"open CUDA device {ordinal}", cuda.Device, ordinal)
        self.name: str = cuda_call("read the GPU name", self._device.name)
        major, minor = cuda_call("read the compute capability", self._device.compute_capability)
        self.compute_capability = f"{major}.{minor}"
        self._context: cuda.Context | None = cuda_call("retain the primary context",
                                                       self._device.retain_primary_context)
        self._lock = threading.Lock()

    @contextmanager
    def active(self) -> Iterator[None]:
        """Make the primary context current on this thread for the block."""
        from pycuda import driver as cuda

        context = self._context
        if context is None:
            raise CudaError(f"CUDA device {self.ordinal} was closed")
        cuda_call("make the CUDA context current (cuCtxPushCurrent)", context.push)
        try:
            yield
        finally:
            cuda_call("release the CUDA context (cuCtxPopCurrent)", cuda.Context.pop)

    def close(self) -> None:
        """Release the retained primary context. pycuda only releases it from the thread that retained it; from
        another thread the retain is left to process exit (the context stays usable by TensorRT either way)."""
        with self._lock:
            context, self._context = self._context, None
        if context is not None:
            cuda_call("release the primary context (cuDevicePrimaryCtxRelease)", context.detach)


class PinnedBuffer:
    """Page-locked host memory as a flat numpy array of `capacity` elements; views of it are copied in and out."""

    def __init__(self, what: str, capacity: int, dtype: np.dtype[Any]) -> None:
        from pycuda import driver as cuda

        self.what = what
        self.dtype = np.dtype(dtype)
        self.capacity = max(1, int(capacity))
        self._array: np.ndarray | None = cuda_call(f"allocate pinned host memory for {what} (cuMemHostAlloc)",
                                                   cuda.pagelocked_empty, (self.capacity,), self.dtype)

    def view(self, shape: tuple[int, ...]) -> np.ndarray:
        """A C-contiguous view of the first prod(shape) elements, shaped `shape`."""
        if self._array is None:
            raise CudaError(f"pinned buffer for {self.what} was freed")
        count = int(np.prod(shape, dtype=np.int64))
        if count > self.capacity:
            raise BackendError(f"{self.what}: {shape} needs {count} elements, the buffer holds {self.capacity}")
        return self._array[:count].reshape(shape)

    def close(self) -> None:
        array, self._array = self._array, None
        if array is None:
            return
        allocation: object = array.base  # pycuda's HostAllocation owns the memory
        free = getattr(allocation, "free", None)
        if callable(free):
            cuda_call(f"free pinned host memory for {self.what} (cuMemFreeHost)", free)


class DeviceBuffer:
    """Device memory of `nbytes`; `ptr` is its address for TensorRT."""

    def __init__(self, what: str, nbytes: int) -> None:
        from pycuda import driver as cuda

        self.what = what
        self.nbytes = max(1, int(nbytes))
        self._allocation: cuda.DeviceAllocation | None = cuda_call(
            f"allocate {self.nbytes} bytes of device memory for {what} (cuMemAlloc)", cuda.mem_alloc, self.nbytes)
        self.ptr = int(self._allocation)

    def close(self) -> None:
        allocation, self._allocation = self._allocation, None
        if allocation is not None:
            cuda_call(f"free device memory for {self.what} (cuMemFree)", allocation.free)


class StreamAndEvent:
    """A CUDA stream and the event that marks the end of a run's work on it."""

    def __init__(self, what: str) -> None:
        from pycuda import driver as cuda

        self.what = what
        self._stream: cuda.Stream | None = cuda_call(f"create the CUDA stream of {what} (cuStreamCreate)", cuda.Stream)
        self._event: cuda.Event | None = cuda_call(f"create the CUDA event of {what} (cuEventCreate)", cuda.Event)

    @property
    def stream(self) -> cuda.Stream:
        if self._stream is None:
            raise CudaError(f"the stream of {self.what} was closed")
        return self._stream

    @property
    def handle(self) -> int:
        return int(self.stream.handle)

    def copy_in(self, device: DeviceBuffer, host: np.ndarray) -> None:
        from pycuda import driver as cuda

        if host.nbytes > device.nbytes:
            raise BackendError(f"{device.what}: {host.nbytes} bytes do not fit in {device.nbytes}")
        cuda_call(f"{self.what}: copy {device.what} to the GPU (cuMemcpyHtoDAsync)", cuda.memcpy_htod_async,
                  device.ptr, host, self.stream)

    def copy_out(self, host: np.ndarray, device: DeviceBuffer) -> None:
        from pycuda import driver as cuda

        if host.nbytes > device.nbytes:
            raise BackendError(f"{device.what}: {host.nbytes} bytes requested, {device.nbytes} allocated")
        cuda_call(f"{self.what}: copy {device.what} from the GPU (cuMemcpyDtoHAsync)", cuda.memcpy_dtoh_async,
                  host, device.ptr, self.stream)

    def finish(self) -> None:
        """Record the event after everything queued on the stream and wait for it."""
        if self._event is None:
            raise CudaError(f"the event of {self.what} was closed")
        cuda_call(f"{self.what}: record the completion event (cuEventRecord)", self._event.record, self.stream)
        cuda_call(f"{self.what}: wait for the GPU (cuEventSynchronize)", self._event.synchronize)

    def synchronize(self) -> None:
        """Wait for everything queued on the stream (used after a failed run, before its buffers are reused)."""
        cuda_call(f"{self.what}: wait for the stream (cuStreamSynchronize)", self.stream.synchronize)

    def close(self) -> None:
        """Wait for outstanding work, then drop the stream and event (pycuda destroys them on the last reference)."""
        stream = self._stream
        if stream is not None:
            cuda_call(f"{self.what}: drain the stream before closing (cuStreamSynchronize)", stream.synchronize)
        self._event = None
        self._stream = None
