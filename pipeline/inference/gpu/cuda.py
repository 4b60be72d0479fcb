"""CUDA for every GPU path through one binding: cuda-python's runtime API (`cuda.bindings.runtime`).

Why cuda-python, and only it: it is NVIDIA's official binding and installs from wheels (pycuda, used before by the
TensorRT backend, compiled itself against a local CUDA toolkit and gave the wing two bindings to keep in step).
Why the *runtime* API: it is what ONNX Runtime and TensorRT use, so every buffer, stream and event here lives in the
device's primary context, the one they use. No context is created, pushed or popped; a thread that makes CUDA calls
selects its device with `CudaDevice.use()` (cudaSetDevice), which is cheap when it is already selected.

Errors: every cuda-python call returns its status first, and `check` is the one place a status is read. Any status
but success becomes a `CudaError` (a BackendError) naming the call, what it was for, and CUDA's error name, e.g.
``CUDA cudaMalloc (4096 bytes of device memory for emotion lane 0 input 'image') failed: cudaErrorMemoryAllocation``.

Ownership: each buffer, stream and event is freed by `close()` of the object that created it (safe twice), never by
garbage collection: a finaliser runs on whatever thread the collector picks, possibly while a stream still copies
into the memory it frees. `live_allocations()` counts what is held, so a leak shows (deploy/trt_standin.py reads it).

One exception to "one binding": `Stream.copy_within_many` queues a batch's frame copies through the driver's
cuMemcpyDtoDAsync called with ctypes.PyDLL, i.e. *holding* the GIL. Every cuda-python call releases the GIL, and
getting it back waits for whichever camera thread took it: 27 copies of one batch spent 12.5 ms (p50) getting the GIL
back at 64 cameras on the H200, where the copies themselves take microseconds to queue (BENCHMARKS.md).

`set_gpu_wait` (inference.gpu_wait, default block) makes the libraries' own waits (ONNX Runtime's, NVDEC's) sleep
too: CUDA's default spins on any machine with more cores than contexts. `set_gpu_stack` (inference.gpu_stack_bytes)
sizes the context's reservation of its threads' local memory.

Events are created with cudaEventBlockingSync: a thread waiting for its batch sleeps in the driver instead of
spinning a CPU core, which with K lanes per model would be K cores taken from video decoding.

cuda-python is imported only inside functions, so this module imports on machines without it; its absence is a
BackendError naming the package and requirements-gpu.txt, never an ImportError traceback.
"""

from __future__ import annotations

import ctypes
import importlib
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.inference.backend import BackendError

GPU_REQUIREMENTS = "pip install -r requirements-gpu.txt"
# cuda-python's runtime module; before cuda-python 12.6 it was `cuda.cudart`.
_RUNTIME_MODULES = ("cuda.bindings.runtime", "cuda.cudart")

_runtime: Any = None
_driver: Any = None
_context_ready = threading.local()  # threads on which the runtime has made the primary context current
_capture_relaxed = threading.local()  # threads that relax_capture_mode has set
_ledger_lock = threading.Lock()
_ledger = {"pinned_bytes": 0, "pinned_buffers": 0, "device_bytes": 0, "device_buffers": 0}


class CudaError(BackendError):
    """A CUDA call failed; the message names the call, what it was for, and CUDA's error name."""


def _import_runtime() -> tuple[Any, str | None]:
    """cuda-python's runtime module, or None and why each import path failed."""
    errors: list[str] = []
    for name in _RUNTIME_MODULES:
        try:
            return importlib.import_module(name), None
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    return None, "; ".join(errors)


def cuda_python_problem() -> str | None:
    """Why cuda-python's runtime API cannot be used here (None when it can)."""
    if _runtime is not None:
        return None
    problem = _import_runtime()[1]
    return None if problem is None else f"cuda-python cannot be imported ({problem})"


def load_runtime() -> Any:
    """cuda-python's runtime module; BackendError naming the package when it is not installed."""
    global _runtime
    if _runtime is None:
        module, problem = _import_runtime()
        if problem is not None:
            raise BackendError(f"CUDA on the GPU needs cuda-python, which cannot be imported ({problem}); "
                               f"{GPU_REQUIREMENTS}")
        _runtime = module
    return _runtime


def _load_driver() -> Any:
    """libcuda through ctypes.PyDLL (calls keep the GIL), with the signatures of the functions used."""
    global _driver
    if _driver is None:
        try:
            driver = ctypes.PyDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaError(f"cannot load the CUDA driver library libcuda.so.1: {exc}") from exc
        driver.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        driver.cuMemcpyDtoDAsync_v2.restype = ctypes.c_int
        driver.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        driver.cuGetErrorName.restype = ctypes.c_int
        driver.cuInit.argtypes = [ctypes.c_uint]
        driver.cuDeviceGetCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
        driver.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        driver.cuDevicePrimaryCtxSetFlags_v2.argtypes = [ctypes.c_int, ctypes.c_uint]
        driver.cuDevicePrimaryCtxGetState.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint),
                                                      ctypes.POINTER(ctypes.c_int)]
        for name in ("cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxSetFlags_v2",
                     "cuDevicePrimaryCtxGetState"):
            getattr(driver, name).restype = ctypes.c_int
        _driver = driver
    return _driver


def _driver_error(driver: Any, status: int) -> str:
    name = ctypes.c_char_p()
    if driver.cuGetErrorName(status, ctypes.byref(name)) != 0 or not name.value:
        return f"CUDA driver error {status}"
    return name.value.decode()


# How a thread waiting for the GPU behaves (CUDA's CU_CTX_SCHED_* flags of a context): inference.gpu_wait.
GPU_WAIT_FLAGS = {"auto": 0, "spin": 1, "yield": 2, "block": 4}
_SCHED_MASK = 0x7


def _driver_call(driver: Any, status: int, call: str) -> None:
    if status != 0:
        raise CudaError(f"CUDA {call} failed: {_driver_error(driver, status)}")


def set_gpu_wait(mode: str) -> list[int]:
    """Make every visible GPU's primary context wait for the GPU as `mode` says (GPU_WAIT_FLAGS); the ordinals set.

    Why: ONNX Runtime and NVDEC wait for the GPU through the primary context's scheduling flags, and CUDA's default
    (auto) spins whenever a process has fewer contexts than the machine has cores, i.e. always here: each thread
    waiting for a run or a decoded frame then burns a core for as long as the GPU works. Our own waits use
    blocking-sync events already; this covers the libraries'. Call it before the models load: the driver lets a
    live context's flags change, but they are meant to be set before the context is made."""
    if mode not in GPU_WAIT_FLAGS:
        raise CudaError(f"unknown GPU wait mode {mode!r}: one of {', '.join(GPU_WAIT_FLAGS)}")
    driver = _load_driver()
    _driver_call(driver, driver.cuInit(0), "cuInit (start the driver)")
    count = ctypes.c_int()
    _driver_call(driver, driver.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount (count the GPUs)")
    ordinals = list(range(count.value))
    for ordinal in ordinals:
        device = ctypes.c_int()
        _driver_call(driver, driver.cuDeviceGet(ctypes.byref(device), ordinal), f"cuDeviceGet({ordinal})")
        _driver_call(driver, driver.cuDevicePrimaryCtxSetFlags_v2(device, GPU_WAIT_FLAGS[mode]),
                     f"cuDevicePrimaryCtxSetFlags (GPU {ordinal} waits: {mode})")
    return ordinals


def gpu_wait_of(ordinal: int = 0) -> str:
    """How GPU `ordinal`'s primary context waits now (a GPU_WAIT_FLAGS key), as the driver reports it."""
    driver = _load_driver()
    _driver_call(driver, driver.cuInit(0), "cuInit (start the driver)")
    device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    _driver_call(driver, driver.cuDeviceGet(ctypes.byref(device), ordinal), f"cuDeviceGet({ordinal})")
    _driver_call(driver, driver.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)),
                 f"cuDevicePrimaryCtxGetState({ordinal})")
    by_flag = {flag: mode for mode, flag in GPU_WAIT_FLAGS.items()}
    return by_flag.get(flags.value & _SCHED_MASK, f"flags {flags.value:#x}")


# CUDA's default stack per GPU thread: what a context reserves local memory for, times every thread the GPU holds.
CUDA_DEFAULT_STACK_BYTES = 1024
_stack_asked: dict[int, int] = {}  # GPU ordinal -> the stack size this process last set there (set_gpu_stack)


def set_gpu_stack(nbytes: int, ordinal: int = 0) -> int:
    """Ask GPU `ordinal`'s primary context for `nbytes` of stack per GPU thread; the size the context reports back.

    Why (inference.gpu_stack_bytes): a context reserves its threads' local memory up front, the stack size times
    every thread the GPU can hold at once (an H200: 132 SMs x 2,048 threads, 264 MiB at CUDA's 1,024 bytes), and
    CUDA grows the stack by itself for any kernel launched that needs more, never shrinking it back. So a small
    setting costs no kernel anything and leaves the reservation at what the kernels actually run need. This makes
    the primary context live: call it after set_gpu_wait, and only for the GPU the process uses (a context on
    every visible GPU would cost each its fixed memory). Asked again for the same size (a reload), it leaves the
    stack as the kernels grew it: setting it would shrink it, stall the GPU, and grow it again at the next launch."""
    runtime = load_runtime()
    limit = runtime.cudaLimit.cudaLimitStackSize
    previous = int(check(runtime.cudaGetDevice(), "cudaGetDevice (the calling thread's GPU)"))
    try:
        check(runtime.cudaSetDevice(ordinal), f"cudaSetDevice({ordinal})")
        if _stack_asked.get(ordinal) != nbytes:
            check(runtime.cudaDeviceSetLimit(limit, nbytes),
                  f"cudaDeviceSetLimit (GPU {ordinal}: {nbytes} bytes of stack per thread)")
            _stack_asked[ordinal] = nbytes
        return int(check(runtime.cudaDeviceGetLimit(limit), f"cudaDeviceGetLimit (GPU {ordinal} thread stack)"))
    finally:
        check(runtime.cudaSetDevice(previous), f"cudaSetDevice({previous}) (the thread's GPU as it was)")


def gpu_stack_of(ordinal: int = 0) -> int:
    """GPU `ordinal`'s stack per thread now, in bytes (makes its primary context live)."""
    runtime = load_runtime()
    CudaDevice.open(ordinal)
    return int(check(runtime.cudaDeviceGetLimit(runtime.cudaLimit.cudaLimitStackSize),
                     f"cudaDeviceGetLimit (GPU {ordinal} thread stack)"))


def relax_capture_mode() -> None:
    """Let the calling thread call CUDA while another thread records a CUDA graph (once per thread).

    Why: ONNX Runtime records a captured session's run (inference.cuda_graphs) in CUDA's global capture mode, which
    forbids every other thread calls that may synchronise, cudaMalloc among them, while the recording lasts; the
    lanes prepare their sizes on their own threads at once, and another lane's arena growing then would fail its run
    or break the recording. The relaxed mode lifts that ban for this thread only (the camera readers set it too,
    capture/nvdec.py)."""
    if getattr(_capture_relaxed, "done", False):
        return
    runtime = load_runtime()
    check(runtime.cudaThreadExchangeStreamCaptureMode(runtime.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed),
          "cudaThreadExchangeStreamCaptureMode (relaxed)")
    _capture_relaxed.done = True


def error_name(status: Any) -> str:
    """CUDA's name for a status (`cudaErrorMemoryAllocation`), whichever form cuda-python returned it in."""
    name = getattr(status, "name", None)  # cudaError_t is an enum
    if isinstance(name, str) and name:
        return name
    try:
        found = load_runtime().cudaGetErrorName(status)[1]
    except (BackendError, TypeError, ValueError, IndexError):
        return f"CUDA error {int(status)}"
    return found.decode() if isinstance(found, bytes) else str(found)


def check(result: Any, call: str) -> Any:
    """The value(s) of a cuda-python call; CudaError naming `call` unless its status is success.

    cuda-python returns ``(status,)``, ``(status, value)`` or ``(status, value, ...)``; this returns None, the value,
    or the tuple of values."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise CudaError(f"CUDA {call} failed: {error_name(status)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _account(kind: str, nbytes: int) -> None:
    with _ledger_lock:
        _ledger[f"{kind}_bytes"] += nbytes
        _ledger[f"{kind}_buffers"] += 1 if nbytes > 0 else -1


def live_allocations() -> dict[str, int]:
    """Pinned host and device memory allocated here and not yet closed: bytes and buffer counts."""
    with _ledger_lock:
        return dict(_ledger)


def memory_info() -> tuple[int, int]:
    """(free, total) bytes of the current device's memory, as CUDA reports them (cudaMemGetInfo)."""
    free, total = check(load_runtime().cudaMemGetInfo(), "cudaMemGetInfo (read free GPU memory)")
    return int(free), int(total)


@dataclass(frozen=True)
class CudaDevice:
    """One GPU: its ordinal, name and compute capability ("9.0"), read once at open."""

    ordinal: int
    name: str
    compute_capability: str

    @classmethod
    def open(cls, ordinal: int = 0) -> CudaDevice:
        """Select GPU `ordinal` on this thread and read its properties; CudaError when there is none."""
        runtime = load_runtime()
        count = int(check(runtime.cudaGetDeviceCount(), "cudaGetDeviceCount (count the GPUs)"))
        if not 0 <= ordinal < count:
            raise CudaError(f"CUDA device {ordinal} does not exist ({count} device(s) visible)")
        check(runtime.cudaSetDevice(ordinal), f"cudaSetDevice({ordinal})")
        props = check(runtime.cudaGetDeviceProperties(ordinal), f"cudaGetDeviceProperties({ordinal})")
        raw = props.name
        name = raw.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        return cls(ordinal, name.strip(), f"{int(props.major)}.{int(props.minor)}")

    def use(self) -> None:
        """Make this GPU current on the calling thread (the runtime API keeps the current device per thread)."""
        check(load_runtime().cudaSetDevice(self.ordinal), f"cudaSetDevice({self.ordinal})")


class _Owned:
    """A CUDA handle or address that close() releases exactly once, whichever thread calls it."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._lock = threading.Lock()
        self._handle: Any = None

    def _live(self) -> Any:
        handle = self._handle
        if handle is None:
            raise CudaError(f"{self.what} was closed")
        return handle

    def _take(self) -> Any:
        with self._lock:
            handle, self._handle = self._handle, None
        return handle


class PinnedBuffer(_Owned):
    """`nbytes` of page-locked host memory (cudaMallocHost), seen through numpy views.

    Page-locked memory is what lets a host-to-device copy run asynchronously at full PCIe speed. A view points into
    this memory and must not be used after close(); the owner (a lane) closes only after its last run."""

    def __init__(self, what: str, nbytes: int) -> None:
        super().__init__(what)
        self.nbytes = max(1, int(nbytes))
        self._handle = int(check(load_runtime().cudaMallocHost(self.nbytes),
                                 f"cudaMallocHost ({self.nbytes} bytes of pinned host memory for {what})"))
        _account("pinned", self.nbytes)

    @property
    def ptr(self) -> int:
        return int(self._live())

    def view(self, shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> np.ndarray:
        """A C-contiguous array of `shape` and `dtype` over the start of the buffer."""
        dtype = np.dtype(dtype)
        count = math.prod(int(d) for d in shape)
        needed = count * dtype.itemsize
        if needed > self.nbytes:
            raise BackendError(f"{self.what}: {shape} {dtype} needs {needed} bytes, the buffer holds {self.nbytes}")
        raw = (ctypes.c_uint8 * max(needed, 1)).from_address(self.ptr)
        return np.frombuffer(memoryview(raw), dtype=np.uint8, count=needed).view(dtype).reshape(shape)

    def close(self) -> None:
        ptr = self._take()
        if ptr is not None:
            _account("pinned", -self.nbytes)
            check(load_runtime().cudaFreeHost(ptr), f"cudaFreeHost (pinned host memory for {self.what})")


class DeviceBuffer(_Owned):
    """`nbytes` of device memory (cudaMalloc); `ptr` is its address, for TensorRT and ONNX Runtime bindings."""

    def __init__(self, what: str, nbytes: int) -> None:
        super().__init__(what)
        self.nbytes = max(1, int(nbytes))
        self._handle = int(check(load_runtime().cudaMalloc(self.nbytes),
                                 f"cudaMalloc ({self.nbytes} bytes of device memory for {what})"))
        _account("device", self.nbytes)

    @property
    def ptr(self) -> int:
        return int(self._live())

    def close(self) -> None:
        ptr = self._take()
        if ptr is not None:
            _account("device", -self.nbytes)
            check(load_runtime().cudaFree(ptr), f"cudaFree (device memory for {self.what})")


class Stream(_Owned):
    """A non-blocking CUDA stream: it never waits for the legacy default stream other libraries may use.

    Copies are queued asynchronously; the host arrays must stay untouched until the work is known to be done (an
    Event recorded after it, or synchronize())."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        runtime = load_runtime()
        self._handle = check(runtime.cudaStreamCreateWithFlags(runtime.cudaStreamNonBlocking),
                             f"cudaStreamCreateWithFlags (the stream of {what})")

    @property
    def handle(self) -> int:
        """The stream's address, as TensorRT's execute_async_v3 and ONNX Runtime's user_compute_stream take it."""
        return int(self._live())

    @property
    def raw(self) -> Any:
        """cuda-python's own stream object, for other cuda-python calls."""
        return self._live()

    def copy_in(self, device: DeviceBuffer, host: np.ndarray) -> None:
        """Queue host → device (cudaMemcpyAsync) of all of `host` to the start of `device`."""
        runtime = load_runtime()
        self._copy(device.ptr, _host_address(host, device), host.nbytes, runtime.cudaMemcpyKind.cudaMemcpyHostToDevice,
                   f"{self.what}: copy {device.what} to the GPU")

    def copy_out(self, host: np.ndarray, device: DeviceBuffer) -> None:
        """Queue device → host (cudaMemcpyAsync) of the start of `device` into all of `host`."""
        runtime = load_runtime()
        self._copy(_host_address(host, device), device.ptr, host.nbytes, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                   f"{self.what}: copy {device.what} from the GPU")

    def copy_within(self, dst: int, src: int, nbytes: int, what: str) -> None:
        """Queue device → device (cudaMemcpyAsync) of `nbytes` between raw device addresses."""
        runtime = load_runtime()
        self._copy(dst, src, nbytes, runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice, what)

    def copy_within_many(self, pairs: list[tuple[int, int]], nbytes: int, what: str) -> None:
        """Queue device → device copies of `nbytes` each, (dst, src) per pair, without releasing the GIL (see the
        module docstring: a batch's copies then cost microseconds instead of a GIL hand-off each)."""
        if not getattr(_context_ready, "done", False):
            # The driver call needs a current context on this thread: the runtime makes its primary context current.
            check(load_runtime().cudaFree(0), "cudaFree(0) (make the primary context current on this thread)")
            _context_ready.done = True
        driver, stream = _load_driver(), int(self._live())
        for row, (dst, src) in enumerate(pairs):
            status = driver.cuMemcpyDtoDAsync_v2(dst, src, nbytes, stream)
            if status != 0:
                raise CudaError(f"CUDA cuMemcpyDtoDAsync ({what}, copy {row}) failed: {_driver_error(driver, status)}")

    def copy_host_to(self, dst: int, host: np.ndarray, what: str) -> None:
        """Queue host → device of a C-contiguous array to a raw device address (pageable memory: staged by CUDA,
        so `host` may change as soon as this returns)."""
        if not host.flags.c_contiguous:
            raise BackendError(f"{what}: host array {host.shape} is not C-contiguous")
        runtime = load_runtime()
        self._copy(dst, int(host.ctypes.data), host.nbytes, runtime.cudaMemcpyKind.cudaMemcpyHostToDevice, what)

    def _copy(self, dst: int, src: int, nbytes: int, kind: Any, what: str) -> None:
        check(load_runtime().cudaMemcpyAsync(dst, src, nbytes, kind, self._live()), f"cudaMemcpyAsync ({what})")

    def synchronize(self) -> None:
        """Wait for everything queued on the stream."""
        check(load_runtime().cudaStreamSynchronize(self._live()), f"cudaStreamSynchronize ({self.what})")

    def close(self) -> None:
        """Wait for the stream's work, then destroy it (also when the wait fails, e.g. after a GPU fault)."""
        stream = self._take()
        if stream is None:
            return
        runtime = load_runtime()
        try:
            check(runtime.cudaStreamSynchronize(stream), f"cudaStreamSynchronize (drain {self.what} before closing)")
        finally:
            check(runtime.cudaStreamDestroy(stream), f"cudaStreamDestroy ({self.what})")


class Event(_Owned):
    """A completion marker: record() after a run's work, synchronize() sleeps until the GPU has reached it.

    Blocking-sync (the waiting thread sleeps, no CPU spin) and no timing (recording one is cheaper)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        runtime = load_runtime()
        flags = int(runtime.cudaEventBlockingSync) | int(runtime.cudaEventDisableTiming)
        self._handle = check(runtime.cudaEventCreateWithFlags(flags), f"cudaEventCreateWithFlags (the event of {what})")

    def record(self, stream: Stream) -> None:
        check(load_runtime().cudaEventRecord(self._live(), stream.raw), f"cudaEventRecord ({self.what})")

    def synchronize(self) -> None:
        check(load_runtime().cudaEventSynchronize(self._live()), f"cudaEventSynchronize ({self.what})")

    def close(self) -> None:
        event = self._take()
        if event is not None:
            check(load_runtime().cudaEventDestroy(event), f"cudaEventDestroy ({self.what})")


def _host_address(host: np.ndarray, device: DeviceBuffer) -> int:
    """The address of a host array that may be copied to or from `device` as one block."""
    if not host.flags.c_contiguous:
        raise BackendError(f"{device.what}: host array {host.shape} is not C-contiguous")
    if host.nbytes > device.nbytes:
        raise BackendError(f"{device.what}: a copy of {host.nbytes} bytes does not fit in {device.nbytes}")
    return int(host.ctypes.data)
