"""Native TensorRT backend: engines built by `build-engine` (gpu/engine_build.py), run on cuda-python (gpu/cuda.py).

Each lane owns one execution context, one CUDA stream with its blocking-sync completion event, and page-locked host and
device buffers sized for the engine's largest batch. A run copies the batch in, calls `execute_async_v3`, copies the
outputs out and waits on the event, all on the lane's stream, so K lanes are K batches in flight. TensorRT works in the
device's primary context (the runtime API's), as do our buffers, so no CUDA context is pushed or popped.

Errors: every CUDA error is a CudaError naming the call; every TensorRT failure is a BackendError quoting what TensorRT
logged on the failing call's own thread since that call began (never another lane's messages).

Engines: the backend is told the input size (`ModelRuntime.input_size`, from detector.input_size) and never guesses
it. Loading checks the engine's sidecar against the running GPU, TensorRT, ONNX file, precision, max batch and input
size; a mismatch rebuilds the engine (logging why), or with `inference.tensorrt.build_missing: false` raises a
BackendError that gives the exact `python run_pipeline.py build-engine ...` command.

Concurrency: `run` may be called for different lanes at once; a lane runs one batch at a time (its lock). `close()`
refuses new runs and takes each lane's lock in turn, so it waits for the batch in flight on that lane: no buffer is
freed under a running batch.

TensorRT cannot be installed on the machines this was written on, so it is written against the API documented for
both TensorRT 10.x and 11.x, checked with mypy against tensorrt-stubs, and its tests skip without TensorRT and a GPU.
The CUDA side (lanes, buffers, streams, events, close while busy, errors) runs on a GPU without TensorRT through a
stand-in engine: deploy/trt_standin.py, which builds this backend with `TensorRTBackend.assemble`. `tensorrt` and
cuda-python are imported only inside functions; when either is missing, `create` raises a BackendError naming it and
`pip install -r requirements-gpu.txt`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from pydantic import Field

from pipeline.core.registry import Plugin
from pipeline.core.settings import StrictModel
from pipeline.inference.backend import Backend, BackendError, ModelRuntime, TensorSpec
from pipeline.inference.gpu.cuda import (
    CudaDevice,
    CudaError,
    DeviceBuffer,
    Event,
    PinnedBuffer,
    Stream,
)
from pipeline.inference.gpu.engine_build import (
    BuildResult,
    TrtMessages,
    dims_tuple,
    engine_key,
    ensure_engine,
    make_logger,
    numpy_dtype,
    require_gpu_packages,
)
from pipeline.inference.gpu.engine_key import (
    ENGINES_DIR,
    EngineKey,
    build_command,
    input_channels,
)

if TYPE_CHECKING:
    import tensorrt as trt

    from pipeline.modelprep.manifest import ModelManifest

log = logging.getLogger(__name__)


class TensorRTSettings(StrictModel):
    """`inference.tensorrt`: how the native TensorRT backend obtains its engines (read only with backend tensorrt)."""

    build_missing: bool = Field(
        default=True, description="Build a missing or outdated TensorRT engine when the models load, which takes "
                                  "minutes (once per GPU, TensorRT version, model file, precision, max batch and "
                                  "input size). false = refuse to start, printing the exact build-engine command "
                                  "to run first.")
    workspace_mb: int = Field(
        default=1024, ge=16, le=1_048_576, description="GPU scratch memory TensorRT's builder may use while "
                                                       "building an engine, in MiB (its WORKSPACE memory pool "
                                                       "limit).")


@dataclass(frozen=True)
class IoTensor:
    """One engine input or output, as the lanes size their buffers for it."""

    name: str
    is_input: bool
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # as the engine declares it; -1 = dynamic
    max_shape: tuple[int, ...]  # inputs: the profile's max; outputs: resolved at the max input shapes

    @property
    def nbytes(self) -> int:
        return math.prod(self.max_shape) * self.dtype.itemsize


class _Closeable(Protocol):
    def close(self) -> None: ...


def _close_all(owners: Iterable[_Closeable | None]) -> None:
    """Close each; the first CudaError is raised once every one was tried (one failed free must not leak the rest)."""
    first: CudaError | None = None
    for owner in owners:
        if owner is None:
            continue
        try:
            owner.close()
        except CudaError as exc:
            log.error("%s", exc)
            first = first or exc
    if first is not None:
        raise first


class _Lane:
    """One execution context with its stream, completion event and buffers; one run at a time (its lock).

    `close()` takes the same lock, so it waits for a run in flight, and every later run is refused."""

    def __init__(self, index: int, engine: trt.ICudaEngine, tensors: list[IoTensor], messages: TrtMessages,
                 model: str, device: CudaDevice) -> None:
        self.index = index
        self.what = f"{model} lane {index}"
        self._gpu = device
        self._messages = messages
        self._tensors = tensors
        self._lock = threading.Lock()
        self._host: dict[str, PinnedBuffer] = {}
        self._device: dict[str, DeviceBuffer] = {}
        self._stream: Stream | None = None
        self._event: Event | None = None
        mark = messages.mark()
        context = engine.create_execution_context()
        if context is None:
            raise BackendError(f"{self.what}: TensorRT could not create an execution context: "
                               f"{messages.tail(since=mark)}")
        self._context: trt.IExecutionContext | None = context
        try:
            self._stream = Stream(self.what)
            self._event = Event(self.what)
            for tensor in tensors:
                self._bind(context, tensor, mark)
        except BaseException:
            self.close()
            raise

    def _bind(self, context: trt.IExecutionContext, tensor: IoTensor, mark: int) -> None:
        """Allocate the tensor's pinned and device buffers and give TensorRT the device address."""
        what = f"{self.what} {'input' if tensor.is_input else 'output'} {tensor.name!r}"
        self._host[tensor.name] = PinnedBuffer(what, tensor.nbytes)
        device = self._device[tensor.name] = DeviceBuffer(what, tensor.nbytes)
        if not context.set_tensor_address(tensor.name, device.ptr):
            raise BackendError(f"{what}: set_tensor_address failed: {self._messages.tail(since=mark)}")

    def staging(self, batch: int, item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None:
        """The pinned input buffer shaped for `batch` items, when the engine has one input that takes them."""
        inputs = [t for t in self._tensors if t.is_input]
        if len(inputs) != 1:
            return None
        tensor = inputs[0]
        shape = (int(batch), *(int(d) for d in item_shape))
        if np.dtype(dtype) != tensor.dtype or not _fits(shape, tensor):
            return None
        with self._lock:
            if self._context is None:
                return None
            return self._host[tensor.name].view(shape, tensor.dtype)

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            context, stream, event = self._context, self._stream, self._event
            if context is None or stream is None or event is None:
                raise BackendError(f"{self.what} is closed")
            self._gpu.use()  # the runtime API's current device is per thread
            mark = self._messages.mark()
            try:
                views = self._enqueue(context, stream, batch, mark)
                event.record(stream)
                event.synchronize()  # blocking-sync: this thread sleeps until the GPU is done
            except BaseException:
                self._drain(stream)
                raise
            return {name: view.copy() for name, view in views.items()}  # the pinned buffers are reused

    def _drain(self, stream: Stream) -> None:
        """After a failed run: wait until nothing copies from or into the buffers the next run reuses."""
        try:
            stream.synchronize()
        except CudaError as exc:
            log.error("%s: the stream did not drain after a failed run: %s", self.what, exc)

    def _enqueue(self, context: trt.IExecutionContext, stream: Stream, batch: dict[str, np.ndarray],
                 mark: int) -> dict[str, np.ndarray]:
        """Copy in, execute_async_v3, copy out, all queued on the lane's stream; returns the output views."""
        for tensor in self._tensors:
            if tensor.is_input:
                self._copy_in(context, stream, tensor, batch, mark)
        if not context.execute_async_v3(stream.handle):
            raise BackendError(f"{self.what}: execute_async_v3 failed: {self._messages.tail(since=mark)}")
        views: dict[str, np.ndarray] = {}
        for tensor in self._tensors:
            if not tensor.is_input:
                shape = dims_tuple(context.get_tensor_shape(tensor.name))
                if any(d < 0 for d in shape):
                    raise BackendError(f"{self.what}: output {tensor.name!r} has unresolved shape {shape}")
                views[tensor.name] = self._host[tensor.name].view(shape, tensor.dtype)
                stream.copy_out(views[tensor.name], self._device[tensor.name])
        return views

    def _copy_in(self, context: trt.IExecutionContext, stream: Stream, tensor: IoTensor,
                 batch: dict[str, np.ndarray], mark: int) -> None:
        if tensor.name not in batch:
            raise BackendError(f"{self.what}: the batch has no input {tensor.name!r} (got {', '.join(batch)})")
        array = np.asarray(batch[tensor.name])
        if array.dtype != tensor.dtype:
            raise BackendError(f"{self.what}: input {tensor.name!r} must be {tensor.dtype}, got {array.dtype}")
        if not _fits(array.shape, tensor):
            raise BackendError(f"{self.what}: input {tensor.name!r} has shape {array.shape}; the engine takes "
                               f"{tensor.shape} with at most {tensor.max_shape}")
        if not context.set_input_shape(tensor.name, tuple(int(d) for d in array.shape)):
            raise BackendError(f"{self.what}: set_input_shape({tensor.name!r}, {array.shape}) failed: "
                               f"{self._messages.tail(since=mark)}")
        view = self._host[tensor.name].view(array.shape, tensor.dtype)
        if view.__array_interface__["data"][0] != array.__array_interface__["data"][0]:
            np.copyto(view, array)  # the batcher did not stack into our pinned buffer (see staging)
        stream.copy_in(self._device[tensor.name], view)

    def close(self) -> None:
        """Wait for the run in flight (the lane's lock), drain the stream, then free the event, buffers and context."""
        with self._lock:
            stream, event, self._stream, self._event = self._stream, self._event, None, None
            buffers: list[_Closeable] = [*self._host.values(), *self._device.values()]
            self._host, self._device = {}, {}
            try:
                self._gpu.use()
                _close_all([stream])  # waits for the GPU before the buffers go
            finally:
                self._context = None
                _close_all([event, *buffers])


def _fits(shape: tuple[int, ...], tensor: IoTensor) -> bool:
    """A batch of `shape` can run: same rank, batch 1..max, fixed dims equal, dynamic dims within the profile."""
    return (len(shape) == len(tensor.max_shape) and 1 <= shape[0] <= tensor.max_shape[0]
            and all(want in (-1, have) for want, have in zip(tensor.shape[1:], shape[1:]))
            and all(0 < have <= most for have, most in zip(shape, tensor.max_shape)))


class TensorRTBackend(Backend):
    name = "tensorrt"

    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec], max_batch: int, lanes: int) -> None:
        super().__init__(inputs, outputs, max_batch=max_batch, lanes=lanes)
        self._runtime: trt.Runtime | None = None
        self._engine: trt.ICudaEngine | None = None
        self._logger: trt.ILogger | None = None
        self._messages = TrtMessages()
        self._lanes: list[_Lane] = []
        self._lanes_lock = threading.Lock()  # run and staging read the list, close swaps it
        self._close_lock = threading.Lock()  # a second close() waits for the first
        self._info: dict[str, str] = {}

    @classmethod
    def create(cls, spec: ModelRuntime, model: ModelManifest, model_path: Path, *,
               engines_dir: Path | None = None) -> TensorRTBackend:
        """Load (building first when allowed and needed) the engine for `model_path` as `spec` describes it.

        spec.input_size is required for a model whose input size the config sets (the detector)."""
        settings = _settings(spec)
        version = require_gpu_packages()
        device = CudaDevice.open(0)
        key = engine_key(model, model_path, spec.precision, spec.max_batch, spec.input_size, device, version)
        result = ensure_engine(key, model_path, input_channels(model), fixed_size=model.input.size is not None,
                               no_build=not settings.build_missing,
                               engines_dir=ENGINES_DIR if engines_dir is None else engines_dir,
                               workspace_bytes=settings.workspace_mb << 20)
        return cls._load(spec, model, key, result, device)

    @classmethod
    def _load(cls, spec: ModelRuntime, model: ModelManifest, key: EngineKey, result: BuildResult,
              device: CudaDevice) -> TensorRTBackend:
        import tensorrt as trt

        messages = TrtMessages()
        logger = make_logger(messages)
        runtime = trt.Runtime(logger)
        engine = _deserialise(runtime, result.engine, model, key, messages)
        tensors = _io_tensors(engine, model, key, messages)
        where = f"cuda:{device.ordinal} ({device.name}, compute capability {key.compute_capability})"
        info = {"backend": cls.name, "device": where, "precision": key.precision, "tensorrt": key.tensorrt,
                "engine": result.engine.name,
                "built": "now" if result.built else str(result.sidecar.get("built_at", "earlier")),
                "lanes": str(spec.lanes)}
        backend = cls.assemble(engine, tensors, messages, device, model=model.name, max_batch=key.max_batch,
                               lanes=spec.lanes, info=info)
        backend._runtime, backend._logger = runtime, logger  # the runtime outlives the engine (released in close)
        log.info("%s: TensorRT engine %s loaded (%d lane(s))", model.name, result.engine.name, spec.lanes)
        return backend

    @classmethod
    def assemble(cls, engine: trt.ICudaEngine, tensors: list[IoTensor], messages: TrtMessages, device: CudaDevice,
                 *, model: str, max_batch: int, lanes: int, info: dict[str, str]) -> TensorRTBackend:
        """The backend of `lanes` lanes over an engine TensorRT has already deserialised.

        Apart from `_load` so that the CUDA side runs without TensorRT: deploy/trt_standin.py passes a stand-in
        engine whose execute_async_v3 queues real CUDA work."""
        specs = [TensorSpec(t.name, t.shape, t.dtype) for t in tensors]
        backend = cls([s for s, t in zip(specs, tensors) if t.is_input],
                      [s for s, t in zip(specs, tensors) if not t.is_input], max_batch=max_batch, lanes=lanes)
        backend._engine, backend._messages, backend._info = engine, messages, dict(info)
        try:
            for index in range(lanes):
                backend._lanes.append(_Lane(index, engine, tensors, messages, model, device))
        except BaseException:
            backend.close()
            raise
        return backend

    def _lane(self, index: int) -> _Lane:
        with self._lanes_lock:
            lanes = self._lanes
        if not lanes:
            raise BackendError("the TensorRT backend is closed")
        if not 0 <= index < len(lanes):
            raise BackendError(f"lane {index} does not exist (this backend has {len(lanes)})")
        return lanes[index]

    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        return self._lane(lane).run(batch)  # a lane closed meanwhile refuses with a BackendError

    def staging(self, lane: int, batch: int, item_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """The lane's pinned input buffer, so the batcher stacks a batch straight into page-locked memory."""
        with self._lanes_lock:
            lanes = self._lanes
        if not 0 <= lane < len(lanes):
            return None
        return lanes[lane].staging(batch, item_shape, dtype)

    def warm_up(self, item_shape: tuple[int, ...], dtype: np.dtype, lane: int = 0) -> None:
        """One run of `lane` at batch 1 and at the largest batch, on the lane's own thread: the first enqueue on a
        context pays for lazy setup. An engine has one profile with its kernels chosen at build time, so no other
        shapes need a run."""
        if len(self.inputs) != 1:
            return
        name = self.inputs[0].name
        for batch in sorted({1, self.max_batch}):
            self.run({name: np.zeros((batch, *item_shape), dtype=dtype)}, lane)

    def describe(self) -> dict[str, str]:
        return dict(self._info) if self._info else {"backend": self.name, "state": "closed"}

    def close(self) -> None:
        """Refuse new runs, wait for each lane's run in flight, then free the lanes, the engine and the runtime, in
        that order. Safe to call twice and from any thread."""
        with self._close_lock:
            with self._lanes_lock:
                lanes, self._lanes = self._lanes, []
            try:
                _close_all(lanes)
            finally:
                self._engine = None  # contexts first (in the lanes), then the engine, then the runtime
                self._runtime = None
                self._logger = None
                self._info = {}


def _settings(spec: ModelRuntime) -> TensorRTSettings:
    if spec.options is None:
        return TensorRTSettings()
    if not isinstance(spec.options, TensorRTSettings):
        raise BackendError(f"the tensorrt backend takes TensorRTSettings options, got {type(spec.options).__name__}")
    return spec.options


def _deserialise(runtime: trt.Runtime, path: Path, model: ModelManifest, key: EngineKey,
                 messages: TrtMessages) -> trt.ICudaEngine:
    """The engine in `path`; a BackendError quoting TensorRT and giving the rebuild command when it cannot load."""
    rebuild = f"delete it and rebuild with: {build_command(key, model.input.size is not None)}"
    mark = messages.mark()
    try:
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
    except (OSError, RuntimeError, TypeError) as exc:
        raise BackendError(f"{model.name}: cannot load {path}: {exc} ({messages.tail(since=mark)}); {rebuild}") from exc
    if engine is None:
        raise BackendError(f"{model.name}: TensorRT cannot deserialise {path.name}: {messages.tail(since=mark)}; "
                           f"{rebuild}")
    return engine


def _io_tensors(engine: trt.ICudaEngine, model: ModelManifest, key: EngineKey,
                messages: TrtMessages) -> list[IoTensor]:
    """The engine's inputs and outputs with their largest shapes, checked against the manifest."""
    import tensorrt as trt

    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    missing = [n for n in model.prepared_outputs if n not in outputs]
    if missing:
        raise BackendError(f"{model.name}: engine lacks output(s) {', '.join(missing)} named by the manifest")
    mark = messages.mark()
    probe = engine.create_execution_context()  # resolves output shapes at the largest input shapes
    if probe is None:
        raise BackendError(f"{model.name}: TensorRT could not create an execution context: {messages.tail(since=mark)}")
    tensors: list[IoTensor] = []
    for name in inputs:
        largest = dims_tuple(engine.get_tensor_profile_shape(name, 0)[2])
        if not probe.set_input_shape(name, largest):
            raise BackendError(f"{model.name}: set_input_shape({name!r}, {largest}) failed: "
                               f"{messages.tail(since=mark)}")
        if largest[0] != key.max_batch:
            raise BackendError(f"{model.name}: engine's max batch is {largest[0]}, its sidecar says {key.max_batch}")
        tensors.append(IoTensor(name, True, numpy_dtype(engine.get_tensor_dtype(name)),
                                dims_tuple(engine.get_tensor_shape(name)), largest))
    for name in outputs:
        largest = dims_tuple(probe.get_tensor_shape(name))
        if any(d < 0 for d in largest):
            raise BackendError(f"{model.name}: output {name!r} has no fixed size at the largest batch ({largest})")
        tensors.append(IoTensor(name, False, numpy_dtype(engine.get_tensor_dtype(name)),
                                dims_tuple(engine.get_tensor_shape(name)), largest))
    del probe
    return tensors


PLUGIN = Plugin("tensorrt", TensorRTSettings, TensorRTBackend)
