"""The Backend role: something that runs one model on a batch, on one of several lanes.

Backends are looked up by the YAML's `inference.backend` through a registry of *module paths* (pipeline.core.registry),
so an optional runtime (TensorRT, onnxruntime-gpu, cuda-python) is imported only when it is configured, and its
absence is a clear error. Each backend module declares `PLUGIN = Plugin(name, settings, backend class)`.

A backend is told everything it needs in a `ModelRuntime` (built by Perception from the configuration): it never
guesses, e.g. the detector's input size, which a TensorRT engine fixes at build time, is in the spec.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel

from pipeline.core.registry import PluginError, Registry

if TYPE_CHECKING:
    from pipeline.modelprep.manifest import ModelManifest


class BackendError(RuntimeError):
    """A model cannot be loaded or run; the message says which model and what to do."""


# ONNX tensor types as ONNX Runtime names them (NodeArg.type) -> numpy: the ONNX Runtime backend's specs and the
# captured frame graphs' buffers (gpu/captured.py) read the same names.
ONNX_NUMPY_TYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
}


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output; -1 marks a dynamic dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class BackendHealth:
    """Whether a backend can run batches now: an in-process one always can; a remote one (Triton) is down while
    its server cannot be reached. `problem` says why, for /healthz; `reconnects` counts the times the backend
    found its server again after losing it (a metric)."""

    up: bool = True
    problem: str | None = None
    reconnects: int = 0
    remote: bool = False


class InferenceSettings(Protocol):
    """What `ModelRuntime.from_config` reads; the `inference:` section (InferenceConfig) is one."""

    @property
    def backend(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def precision(self) -> str: ...

    @property
    def max_batch(self) -> int: ...

    @property
    def lanes(self) -> int: ...

    @property
    def threads(self) -> int: ...

    @property
    def batch_step(self) -> int: ...

    @property
    def cudnn_max_workspace(self) -> bool: ...

    @property
    def gpu_memory_limit_mb(self) -> int: ...

    @property
    def cublas_workspace(self) -> str: ...

    @property
    def memory_pattern(self) -> bool: ...


@dataclass(frozen=True)
class ModelRuntime:
    """How one model is to run: everything a backend's `create` may read, decided by the caller.

    input_size: (width, height) of the model's input when the configuration sets it (the detector:
    detector.input_size); None when the model's manifest fixes it. options: the backend's own settings model (the
    `settings` of its PLUGIN, e.g. TensorRTSettings), or None for a backend without settings.
    """

    backend: str
    device: str
    precision: str
    max_batch: int
    lanes: int = 1
    threads: int = 0
    batch_step: int = 2
    input_size: tuple[int, int] | None = None
    options: BaseModel | None = None
    cudnn_max_workspace: bool = True
    gpu_memory_limit_mb: int = 0
    cublas_workspace: str = ":16:8"
    memory_pattern: bool = True

    @classmethod
    def from_config(cls, cfg: InferenceSettings, *, precision: str | None = None,
                    input_size: tuple[int, int] | Literal["auto"] | None = None) -> ModelRuntime:
        """The spec for one model from the `inference:` section.

        precision: the one this model actually runs in, when it differs from the configured one (a refused int8).
        input_size: detector.input_size; `auto` (a size per camera shape) fixes none, so the spec carries None.
        A backend's own settings are the `inference:` key named after it (`inference.tensorrt`), so they are passed
        only to the backend that is configured."""
        options = getattr(cfg, cfg.backend, None)
        size = None if input_size is None or isinstance(input_size, str) else (int(input_size[0]), int(input_size[1]))
        return cls(backend=cfg.backend, device=cfg.device, precision=precision or cfg.precision,
                   max_batch=cfg.max_batch, lanes=cfg.lanes, threads=cfg.threads, batch_step=cfg.batch_step,
                   input_size=size, options=options if isinstance(options, BaseModel) else None,
                   cudnn_max_workspace=cfg.cudnn_max_workspace, gpu_memory_limit_mb=cfg.gpu_memory_limit_mb,
                   cublas_workspace=cfg.cublas_workspace, memory_pattern=cfg.memory_pattern)


class Backend(ABC):
    """Runs one model. `run` may be called from `lanes` threads at once, each with its own lane index."""

    name: str = "abstract"

    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec], max_batch: int, lanes: int) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.max_batch = max_batch
        self.lanes = lanes

    @classmethod
    @abstractmethod
    def create(cls, spec: ModelRuntime, model: ModelManifest, model_path: Path) -> Backend:
        """Load `model_path` as `spec` says; raise BackendError with a fix when that is impossible."""

    @abstractmethod
    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        """Run one batch (leading dimension = batch size) and return every output by name."""

    def run_items(self, items: Sequence[Any], lane: int = 0) -> list[dict[str, np.ndarray]]:
        """Run a batch given as its items (arrays without the batch dimension); one output dict per item, in order.

        The batcher calls this. Items of different shapes (the detector with `input_size: auto` and cameras of
        different shapes) cannot be stacked: each shape runs as its own batch, one after the other on this lane."""
        groups: dict[tuple[tuple[int, ...], np.dtype], list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault((item.shape, item.dtype), []).append(index)
        if len(groups) == 1:
            return self._run_stacked(items, lane)
        results: list[dict[str, np.ndarray]] = [{} for _ in items]
        for indices in groups.values():
            for index, result in zip(indices, self._run_stacked([items[i] for i in indices], lane)):
                results[index] = result
        return results

    def _run_stacked(self, items: Sequence[Any], lane: int) -> list[dict[str, np.ndarray]]:
        """Items of one shape stacked into `staging` (pinned memory on GPU backends) when there is one, and run."""
        first = items[0]
        buffer = self.staging(lane, len(items), first.shape, first.dtype)
        stacked = np.stack(items, out=buffer)
        outputs = self.run({self.inputs[0].name: stacked}, lane)
        return [{name: value[index] for name, value in outputs.items()} for index in range(len(items))]

    def staging(self, lane: int, batch: int, item_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """A host buffer the batcher may stack `batch` items into (pinned memory on GPU backends), or None.

        It stays valid until the lane's next run or close(): one thread per lane (the batcher's runner) may use it."""
        return None

    def warm_up(self, item_shape: tuple[int, ...], dtype: np.dtype, lane: int = 0) -> None:
        """Pay one lane's one-time costs (kernel selection, buffers) for every batch shape it will run.

        Called by BatchedModel.warm_up on the thread that runs `lane`."""

    def health(self) -> BackendHealth:
        """Whether batches can run now (see BackendHealth); an in-process backend is always up."""
        return BackendHealth()

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """What runs where, for the status page: backend, device, precision, providers."""

    def close(self) -> None:
        """Release sessions, contexts and buffers. Safe to call twice."""


BACKENDS: Registry[type[Backend]] = Registry("inference.backend", {
    "onnxruntime": "pipeline.inference.onnxruntime",
    "tensorrt": "pipeline.inference.gpu.tensorrt",
    "triton": "pipeline.inference.triton",
})


def runner_health(runner: object) -> BackendHealth:
    """The health of whatever runs a BatchedModel's batches: a Backend's own, else (the frame graphs' engine, which
    runs in-process) always up."""
    return runner.health() if isinstance(runner, Backend) else BackendHealth()


def backend_names() -> list[str]:
    return BACKENDS.names()


def create_backend(spec: ModelRuntime, model: ModelManifest, model_path: Path) -> Backend:
    """Instantiate the backend `spec.backend` names for `model_path` (an ONNX file of `spec.precision`).

    Options left out get the backend's defaults; options of another backend's type are refused."""
    try:
        plugin = BACKENDS.get(spec.backend)
    except PluginError as exc:
        raise BackendError(str(exc)) from exc
    if spec.options is None and plugin.settings is not None:
        spec = replace(spec, options=plugin.settings())
    elif spec.options is not None and (plugin.settings is None or not isinstance(spec.options, plugin.settings)):
        raise BackendError(f"inference.backend {spec.backend} does not take {type(spec.options).__name__} options")
    return plugin.implementation.create(spec, model, model_path)
