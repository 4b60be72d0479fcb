"""Native TensorRT backend: engines built by `build-engine` (pipeline/inference/gpu/engine_build.py), run through pycuda.

Each lane owns one execution context, one CUDA stream with its completion event, and page-locked host and device
buffers sized for the engine's largest batch. A run copies the batch in, calls `execute_async_v3`, copies the outputs
out and waits on the event, all on the lane's stream, so K lanes are K batches in flight. Every CUDA error is a
`CudaError` naming the call (pipeline/inference/gpu/cuda.py); every TensorRT failure is a BackendError quoting TensorRT's log.

Loading checks the engine's sidecar against the running GPU, TensorRT, ONNX file, precision, max batch and input
size; a mismatch rebuilds the engine (logging why), or, with `no_build`, raises a BackendError that gives the exact
`python run_pipeline.py build-engine ...` command.

TensorRT cannot run on the machines this was written on, so it is written against the API documented for both
TensorRT 10.x and 11.x, checked with mypy against tensorrt-stubs, and its tests skip without TensorRT and a GPU.
`tensorrt` and `pycuda` are imported only inside functions; when either is missing, `create` raises a BackendError
naming it and `pip install -r requirements-gpu.txt`.
"""

from __future__ import annotations

import logging
import threading
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.inference.backend import Backend, BackendError, TensorSpec
from pipeline.config.app import InferenceConfig
from pipeline.inference.gpu.cuda import CudaDevice, DeviceBuffer, PinnedBuffer, StreamAndEvent
from pipeline.inference.gpu.engine_build import (
    ENGINES_DIR,
    BuildResult,
    EngineKey,
    TrtMessages,
    build_command,
    dims_tuple,
    engine_key,
    ensure_engine,
    input_channels,
    make_logger,
    numpy_dtype,
    read_sidecar,
    require_gpu_packages,
    sidecar_mismatches,
)
from pipeline.modelprep.manifest import ModelManifest

if TYPE_CHECKING:
    import tensorrt as trt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _IoTensor:
    name: str
    is_input: bool
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # as the engine declares it; -1 = dynamic
    max_shape: tuple[int, ...]  # inputs: the profile's max; outputs: resolved at the max input shapes


class _Lane:
    """One execution context with its stream, event and buffers. `run` is called by one thread at a time."""

    def __init__(self, index: int, engine: trt.ICudaEngine, tensors: list[_IoTensor], messages: TrtMessages,
                 model: str) -> None:
        self.index = index
        self.what = f"{model} lane {index}"
        self._messages = messages
        self._lock = threading.Lock()
        self._host: dict[str, PinnedBuffer] = {}
        self._device: dict[str, DeviceBuffer] = {}
        self._stream: StreamAndEvent | None = None
        context = engine.create_execution_context()
        if context is None:
            raise BackendError(f"{self.what}: TensorRT could not create an execution context: {messages.tail()}")
        self._context: trt.IExecutionContext | None = context
        try:
            self._stream = StreamAndEvent(self.what)
            for tensor in tensors:
                count = int(np.prod(tensor.max_shape, dtype=np.int64))
                what = f"{self.what} {'input' if tensor.is_input else 'output'} {tensor.name!r}"
                self._host[tensor.name] = PinnedBuffer(what, count, tensor.dtype)
                self._device[tensor.name] = DeviceBuffer(what, count * tensor.dtype.itemsize)
                if not context.set_tensor_address(tensor.name, self._device[tensor.name].ptr):
                    raise BackendError(f"{what}: set_tensor_address failed: {messages.tail()}")
        except BaseException:
            self.close()
            raise
        self._tensors = tensors

    def staging(self, batch: int, item_shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None:
        """The pinned input buffer shaped for `batch` items, when the engine has one input that takes them."""
        inputs = [t for t in self._tensors if t.is_input]
        if len(inputs) != 1 or self._context is None:
            return None
        tensor = inputs[0]
        shape = (int(batch), *(int(d) for d in item_shape))
        if np.dtype(dtype) != tensor.dtype or not _fits(shape, tensor):
            return None
        return self._host[tensor.name].view(shape)

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        context, stream = self._context, self._stream
        if context is None or stream is None:
            raise BackendError(f"{self.what} is closed")
        with self._lock:
            try:
                views = self._enqueue(context, stream, batch)
                stream.finish()
            except BaseException:
                with suppress(BackendError):
                    stream.synchronize()  # nothing may still be copying from or into the buffers we reuse
                raise
            return {name: view.copy() for name, view in views.items()}  # the pinned buffers are reused

    def _enqueue(self, context: trt.IExecutionContext, stream: StreamAndEvent,
                 batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Copy in, execute_async_v3, copy out, all queued on the lane's stream; returns the output views."""
        for tensor in self._tensors:
            if tensor.is_input:
                self._copy_in(context, stream, tensor, batch)
        if not context.execute_async_v3(stream.handle):
            raise BackendError(f"{self.what}: execute_async_v3 failed: {self._messages.tail()}")
        views: dict[str, np.ndarray] = {}
        for tensor in self._tensors:
            if not tensor.is_input:
                shape = dims_tuple(context.get_tensor_shape(tensor.name))
                if any(d < 0 for d in shape):
                    raise BackendError(f"{self.what}: output {tensor.name!r} has unresolved shape {shape}")
                views[tensor.name] = self._host[tensor.name].view(shape)
                stream.copy_out(views[tensor.name], self._device[tensor.name])
        return views

    def _copy_in(self, context: trt.IExecutionContext, stream: StreamAndEvent, tensor: _IoTensor,
                 batch: dict[str, np.ndarray]) -> None:
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
                               f"{self._messages.tail()}")
        view = self._host[tensor.name].view(array.shape)
        if view.__array_interface__["data"][0] != array.__array_interface__["data"][0]:
            np.copyto(view, array)  # the batcher did not stack into our pinned buffer (see staging)
        stream.copy_in(self._device[tensor.name], view)

    def close(self) -> None:
        """Free buffers and drop the context and stream; the caller makes the CUDA context current."""
        if self._stream is not None:
            self._stream.close()  # waits for work in flight before its buffers go
            self._stream = None
        for buffers in (self._host, self._device):
            for buffer in buffers.values():
                buffer.close()
            buffers.clear()
        self._context = None


def _fits(shape: tuple[int, ...], tensor: _IoTensor) -> bool:
    """A batch of `shape` can run: same rank, batch 1..max, fixed dims equal, dynamic dims within the profile."""
    return (len(shape) == len(tensor.max_shape) and 1 <= shape[0] <= tensor.max_shape[0]
            and all(want in (-1, have) for want, have in zip(tensor.shape[1:], shape[1:]))
            and all(0 < have <= most for have, most in zip(shape, tensor.max_shape)))


class TensorRTBackend(Backend):
    name = "tensorrt"

    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec], max_batch: int, lanes: int) -> None:
        super().__init__(inputs, outputs, max_batch=max_batch, lanes=lanes)
        self._device_gpu: CudaDevice | None = None
        self._runtime: trt.Runtime | None = None
        self._engine: trt.ICudaEngine | None = None
        self._lanes: list[_Lane] = []
        self._messages = TrtMessages()
        self._logger: trt.ILogger | None = None
        self._info: dict[str, str] = {}
        self._close_lock = threading.Lock()

    @classmethod
    def create(cls, cfg: InferenceConfig, model: ModelManifest, model_path: Path, *,
               input_size: tuple[int, int] | None = None, no_build: bool | None = None,
               engines_dir: Path | None = None) -> TensorRTBackend:
        """Load (building first if needed) the engine for `model_path`.

        input_size: (width, height) for models whose size the config sets (the detector: detector.input_size);
        without it, the single built engine for this model, precision, batch, GPU and TensorRT is used.
        no_build: refuse to build (default: `cfg.no_build` when the config has it, else False).
        """
        version = require_gpu_packages()
        engines = ENGINES_DIR if engines_dir is None else engines_dir
        refuse = bool(getattr(cfg, "no_build", False)) if no_build is None else no_build
        device = CudaDevice(0)
        try:
            with device.active():
                if model.input.size is None and input_size is None:
                    input_size = _only_built_size(model, model_path, cfg, device, version, engines)
                key = engine_key(model, model_path, cfg.precision, cfg.max_batch, input_size, device, version)
                result = ensure_engine(key, model_path, input_channels(model), fixed_size=model.input.size is not None,
                                       no_build=refuse, engines_dir=engines)
                return cls._load(cfg, model, key, result, device)
        except BaseException:
            device.close()
            raise

    @classmethod
    def _load(cls, cfg: InferenceConfig, model: ModelManifest, key: EngineKey, result: BuildResult,
              device: CudaDevice) -> TensorRTBackend:
        import tensorrt as trt

        messages = TrtMessages()
        logger = make_logger(messages)
        runtime = trt.Runtime(logger)
        fixed = model.input.size is not None
        try:
            engine = runtime.deserialize_cuda_engine(result.engine.read_bytes())
        except (OSError, RuntimeError, TypeError) as exc:
            raise BackendError(f"{model.name}: cannot load {result.engine}: {exc} ({messages.tail()}); delete it "
                               f"and rebuild with: {build_command(key, fixed)}") from exc
        if engine is None:
            raise BackendError(f"{model.name}: TensorRT cannot deserialise {result.engine.name}: {messages.tail()}; "
                               f"delete it and rebuild with: {build_command(key, fixed)}")
        tensors = _io_tensors(engine, model, key, messages)
        specs = [TensorSpec(t.name, t.shape, t.dtype) for t in tensors]
        backend = cls([s for s, t in zip(specs, tensors) if t.is_input],
                      [s for s, t in zip(specs, tensors) if not t.is_input], max_batch=key.max_batch, lanes=cfg.lanes)
        backend._device_gpu, backend._runtime, backend._engine = device, runtime, engine
        backend._messages, backend._logger = messages, logger
        where = f"cuda:{device.ordinal} ({device.name}, compute capability {key.compute_capability})"
        backend._info = {"backend": cls.name, "device": where,
                         "precision": key.precision, "tensorrt": key.tensorrt, "engine": result.engine.name,
                         "built": "now" if result.built else str(result.sidecar.get("built_at", "earlier")),
                         "lanes": str(cfg.lanes)}
        try:
            for index in range(cfg.lanes):
                backend._lanes.append(_Lane(index, engine, tensors, messages, model.name))
        except BaseException:
            backend._release(close_device=False)
            raise
        log.info("%s: TensorRT engine %s loaded (%d lane(s))", model.name, result.engine.name, cfg.lanes)
        return backend

    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        device = self._device_gpu
        if device is None or not self._lanes:
            raise BackendError("the TensorRT backend is closed")
        if not 0 <= lane < len(self._lanes):
            raise BackendError(f"lane {lane} does not exist (this backend has {len(self._lanes)})")
        with device.active():
            return self._lanes[lane].run(batch)

    def staging(self, lane: int, batch: int, item_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """The lane's pinned input buffer, so the batcher stacks a batch straight into page-locked memory."""
        if not 0 <= lane < len(self._lanes):
            return None
        return self._lanes[lane].staging(batch, item_shape, dtype)

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
        self._release(close_device=True)

    def _release(self, close_device: bool) -> None:
        with self._close_lock:
            lanes, self._lanes = self._lanes, []
            device = self._device_gpu
            if close_device:
                self._device_gpu = None
            if device is None:
                return
            with device.active():
                for lane in lanes:
                    lane.close()
                self._engine = None  # contexts first (in the lanes), then the engine, then the runtime
                self._runtime = None
            if close_device:
                self._info = {}
                device.close()


def _io_tensors(engine: trt.ICudaEngine, model: ModelManifest, key: EngineKey,
                messages: TrtMessages) -> list[_IoTensor]:
    """The engine's inputs and outputs with their largest shapes, checked against the manifest."""
    import tensorrt as trt

    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    missing = [n for n in model.prepared_outputs if n not in outputs]
    if missing:
        raise BackendError(f"{model.name}: engine lacks output(s) {', '.join(missing)} named by the manifest")
    probe = engine.create_execution_context()  # resolves output shapes at the largest input shapes
    if probe is None:
        raise BackendError(f"{model.name}: TensorRT could not create an execution context: {messages.tail()}")
    tensors: list[_IoTensor] = []
    for name in inputs:
        largest = dims_tuple(engine.get_tensor_profile_shape(name, 0)[2])
        if not probe.set_input_shape(name, largest):
            raise BackendError(f"{model.name}: set_input_shape({name!r}, {largest}) failed: {messages.tail()}")
        if largest[0] != key.max_batch:
            raise BackendError(f"{model.name}: engine's max batch is {largest[0]}, its sidecar says {key.max_batch}")
        tensors.append(_IoTensor(name, True, numpy_dtype(engine.get_tensor_dtype(name)),
                                 dims_tuple(engine.get_tensor_shape(name)), largest))
    for name in outputs:
        largest = dims_tuple(probe.get_tensor_shape(name))
        if any(d < 0 for d in largest):
            raise BackendError(f"{model.name}: output {name!r} has no fixed size at the largest batch ({largest})")
        tensors.append(_IoTensor(name, False, numpy_dtype(engine.get_tensor_dtype(name)),
                                 dims_tuple(engine.get_tensor_shape(name)), largest))
    del probe
    return tensors


def _only_built_size(model: ModelManifest, model_path: Path, cfg: InferenceConfig, device: CudaDevice,
                     version: str, engines_dir: Path) -> tuple[int, int]:
    """For a model whose input size the config sets, when the caller did not pass it: the one engine built for
    this model, file, precision, batch, GPU and TensorRT. Anything else is ambiguous and needs build-engine."""
    probe = engine_key(model, model_path, cfg.precision, cfg.max_batch, (0, 0), device, version).to_dict()
    del probe["input_size"]
    sizes: set[tuple[int, int]] = set()
    for candidate in engines_dir.glob("*.json"):
        data = read_sidecar(candidate)
        if data is None or not candidate.with_suffix(".engine").is_file():
            continue
        size = data.get("input_size")
        if not sidecar_mismatches(data, probe) and isinstance(size, list) and len(size) == 2:
            sizes.add((int(size[0]), int(size[1])))
    if len(sizes) == 1:
        return sizes.pop()
    found = ", ".join(f"{w}x{h}" for w, h in sorted(sizes)) or "none"
    raise BackendError(f"{model.name}: the engine is built for one input size (detector.input_size), and the backend "
                       f"was not told which (engines found: {found}). Build it with: python run_pipeline.py "
                       f"build-engine --model {model.name} --precision {cfg.precision} --max-batch {cfg.max_batch} "
                       f"--input-size WIDTHxHEIGHT")
