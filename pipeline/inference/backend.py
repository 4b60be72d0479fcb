"""The Backend role: something that runs one model on a batch, on one of several lanes.

Backends are looked up by the YAML's `inference.backend` through a registry of *module paths*, so an optional runtime
(TensorRT, pycuda, onnxruntime-gpu) is imported only when it is configured, and its absence is a clear error.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipeline.config.app import InferenceConfig
    from pipeline.modelprep.manifest import ModelManifest


class BackendError(RuntimeError):
    """A model cannot be loaded or run; the message says which model and what to do."""


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output; -1 marks a dynamic dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


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
    def create(cls, cfg: InferenceConfig, model: ModelManifest, model_path: Path) -> Backend:
        """Load `model_path` as configured; raise BackendError with a fix when that is impossible."""

    @abstractmethod
    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        """Run one batch (leading dimension = batch size) and return every output by name."""

    def staging(self, lane: int, batch: int, item_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """A host buffer the batcher may stack `batch` items into (pinned memory on GPU backends), or None."""
        return None

    def warm_up(self, item_shape: tuple[int, ...], dtype: np.dtype, lane: int = 0) -> None:
        """Pay one lane's one-time costs (kernel selection, buffers) for every batch shape it will run.

        Called by BatchedModel.warm_up on the thread that runs `lane`."""

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """What runs where, for the status page: backend, device, precision, providers."""

    def close(self) -> None:
        """Release sessions, contexts and buffers. Safe to call twice."""


# name in YAML -> "module:Class"; modules are imported only when chosen.
_REGISTRY: dict[str, str] = {
    "onnxruntime": "pipeline.inference.onnxruntime:OnnxRuntimeBackend",
    "tensorrt": "pipeline.inference.gpu.tensorrt:TensorRTBackend",
}


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def create_backend(cfg: InferenceConfig, model: ModelManifest, model_path: Path) -> Backend:
    """Instantiate the backend named by `cfg.backend` for `model_path` (an ONNX file of the configured precision)."""
    target = _REGISTRY.get(cfg.backend)
    if target is None:
        raise BackendError(f"unknown inference.backend {cfg.backend!r} (available: {', '.join(backend_names())})")
    module_name, class_name = target.split(":")
    module = importlib.import_module(module_name)
    backend_class: type[Backend] = getattr(module, class_name)
    return backend_class.create(cfg, model, model_path)
