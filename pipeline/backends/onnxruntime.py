"""ONNX Runtime backend: CPU everywhere, CUDA or ONNX Runtime's TensorRT provider where those runtimes exist.

One InferenceSession serves every lane: `InferenceSession.run` is thread-safe, so K lanes are K batches in flight.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from pipeline.backends.base import Backend, BackendError, TensorSpec
from pipeline.config import InferenceConfig
from pipeline.manifest import ModelManifest

log = logging.getLogger(__name__)

ENGINES_DIR = Path(__file__).resolve().parents[2] / "engines"

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


def _providers(device: str, model_name: str, precision: str) -> list[str | tuple[str, dict[str, str]]]:
    """The provider list for `inference.device`; each asks for the runtime it needs by package name."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda":
        return [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"}), "CPUExecutionProvider"]
    cache = ENGINES_DIR / "ort-trt" / f"{model_name}.{precision}"
    cache.mkdir(parents=True, exist_ok=True)
    options = {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(cache),
               "trt_timing_cache_enable": "True", "trt_timing_cache_path": str(cache)}
    return [("TensorrtExecutionProvider", options), "CUDAExecutionProvider", "CPUExecutionProvider"]


_NEEDS = {
    "cuda": ("CUDAExecutionProvider", "onnxruntime-gpu (pip install -r requirements-gpu.txt) and the CUDA libraries"),
    "tensorrt": ("TensorrtExecutionProvider", "onnxruntime-gpu and the TensorRT libraries (pip install tensorrt)"),
}


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, session: object, cfg: InferenceConfig, model_path: Path) -> None:
        inputs = [_spec(i) for i in session.get_inputs()]  # type: ignore[attr-defined]
        outputs = [_spec(o) for o in session.get_outputs()]  # type: ignore[attr-defined]
        super().__init__(inputs, outputs, max_batch=cfg.max_batch, lanes=cfg.lanes)
        self._session = session
        self._output_names = [o.name for o in outputs]
        self._device = cfg.device
        self._precision = cfg.precision
        self._model_path = model_path

    @classmethod
    def create(cls, cfg: InferenceConfig, model: ModelManifest, model_path: Path) -> OnnxRuntimeBackend:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BackendError("onnxruntime is not installed: pip install -r requirements.txt") from exc
        if cfg.device in _NEEDS:
            provider, package = _NEEDS[cfg.device]
            if provider not in ort.get_available_providers():
                raise BackendError(f"inference.device {cfg.device} needs {provider}, which this onnxruntime "
                                   f"({ort.__version__}) lacks; install {package}")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if cfg.threads:
            options.intra_op_num_threads = cfg.threads
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(str(model_path), options,
                                           providers=_providers(cfg.device, model.name, cfg.precision))
        except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated types for an unloadable model
            raise BackendError(f"{model.name}: ONNX Runtime cannot load {model_path}: {exc}") from exc
        return cls(session, cfg, model_path)

    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        values = self._session.run(self._output_names, batch)  # type: ignore[attr-defined]
        return dict(zip(self._output_names, values))

    def describe(self) -> dict[str, str]:
        providers = self._session.get_providers()  # type: ignore[attr-defined]
        return {"backend": self.name, "device": self._device, "precision": self._precision,
                "providers": ",".join(providers), "file": self._model_path.name}

    def close(self) -> None:
        self._session = None


def _spec(arg: object) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)  # type: ignore[attr-defined]
    dtype = np.dtype(_ORT_TYPES.get(arg.type, np.float32))  # type: ignore[attr-defined]
    return TensorSpec(arg.name, shape, dtype)  # type: ignore[attr-defined]
