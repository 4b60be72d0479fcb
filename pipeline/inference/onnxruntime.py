"""ONNX Runtime backend: CPU everywhere, CUDA or ONNX Runtime's TensorRT provider where those runtimes exist.

Each lane has its own session(s), so K lanes are K batches in flight: on the CPU one session per lane (lanes sharing
one session would queue on its intra-op thread pool); on CUDA a lane (gpu/cuda_lane.py) has its own stream and one
session per padded batch size. Registered as the `onnxruntime` backend; it has no settings of its own.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core.registry import Plugin
from pipeline.inference.backend import ONNX_NUMPY_TYPES, Backend, BackendError, ModelRuntime, TensorSpec

if TYPE_CHECKING:
    from pipeline.inference.gpu.cuda_lane import CudaLane
    from pipeline.modelprep.manifest import ModelManifest

log = logging.getLogger(__name__)

ENGINES_DIR = Path(__file__).resolve().parents[2] / "engines"

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
    """CPU: one session per lane. CUDA: one stream per lane, with a session per batch bucket (see cuda_lane)."""

    name = "onnxruntime"

    def __init__(self, sessions: list[Any], spec: ModelRuntime, model_path: Path,
                 lanes: list[CudaLane] | None = None) -> None:
        first = sessions[0]
        inputs = [_spec(i) for i in first.get_inputs()]
        outputs = [_spec(o) for o in first.get_outputs()]
        super().__init__(inputs, outputs, max_batch=spec.max_batch, lanes=spec.lanes)
        self._sessions = sessions
        self._cuda_lanes = lanes or []
        self._output_names = [o.name for o in outputs]
        self._device = spec.device
        self._precision = spec.precision
        self._model_path = model_path

    @classmethod
    def create(cls, spec: ModelRuntime, model: ModelManifest, model_path: Path) -> OnnxRuntimeBackend:
        ort = import_ort()
        if spec.device in _NEEDS:
            provider, package = _NEEDS[spec.device]
            if provider not in ort.get_available_providers():
                raise BackendError(f"inference.device {spec.device} needs {provider}, which this onnxruntime "
                                   f"({ort.__version__}) lacks; install {package}")
        if spec.device != "cuda":
            # One session per lane: concurrent runs of one session share its intra-op thread pool, so lanes
            # would queue on it instead of running side by side (measured with bench pipeline on 2 cores).
            providers = _providers(spec.device, model.name, spec.precision)
            sessions = [_session(ort, spec.threads, model, model_path, providers) for _ in range(spec.lanes)]
            return cls(sessions, spec, model_path)
        return cls._create_cuda(ort, spec, model, model_path)

    @classmethod
    def _create_cuda(cls, ort: Any, spec: ModelRuntime, model: ModelManifest, model_path: Path) -> OnnxRuntimeBackend:
        """`spec.lanes` CUDA lanes, each with its stream and a session per padded batch size (see cuda_lane)."""
        from pipeline.inference.gpu.cuda import load_runtime
        from pipeline.inference.gpu.cuda_lane import SMALLEST_RUN, CudaLane

        load_runtime()  # a missing cuda-python is a BackendError naming it, before any session is made
        # Names come from a CPU session: the CUDA sessions are made per lane and batch size (see cuda_lane).
        probe = _session(ort, spec.threads, model, model_path, ["CPUExecutionProvider"])
        input_name, outputs = probe.get_inputs()[0].name, [o.name for o in probe.get_outputs()]

        # The CUDA provider barely uses CPU threads; the library default is one per core for every session
        # (16 on the H200 machine), times lanes and padded sizes.
        threads = spec.threads or 1
        limit_cublas_workspace(spec.cublas_workspace)
        shared_arena = share_cuda_arena(ort, limit_mb=spec.gpu_memory_limit_mb)

        def cuda_session(stream: int) -> Any:
            options = cuda_provider_options(stream, spec.cudnn_max_workspace)
            return _session(ort, threads, model, model_path, [("CUDAExecutionProvider", options)], shared_arena,
                            spec.memory_pattern)

        lanes: list[CudaLane] = []
        try:
            for index in range(spec.lanes):
                lanes.append(CudaLane(cuda_session, input_name, outputs, spec.max_batch, spec.batch_step,
                                      what=f"{model.name} lane {index}", smallest=SMALLEST_RUN[model.role]))
        except BaseException:
            for lane in lanes:
                lane.close()
            raise
        return cls([probe], spec, model_path, lanes)

    def staging(self, lane: int, batch: int, item_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        lanes = self._cuda_lanes  # read once: close() swaps the list
        if not lanes:
            return None
        return lanes[lane].staging(batch, item_shape, dtype)

    def warm_up(self, item_shape: tuple[int, ...], dtype: np.dtype, lane: int = 0) -> None:
        lanes = self._cuda_lanes
        if lanes:
            lanes[lane].warm(item_shape, dtype)

    def run(self, batch: dict[str, np.ndarray], lane: int = 0) -> dict[str, np.ndarray]:
        lanes = self._cuda_lanes
        if lanes:
            return lanes[lane].run(batch[self.inputs[0].name])  # a closed lane refuses with a BackendError
        values = self._sessions[lane].run(self._output_names, batch)
        return dict(zip(self._output_names, values))

    def describe(self) -> dict[str, str]:
        providers = ["CUDAExecutionProvider"] if self._cuda_lanes else self._sessions[0].get_providers()
        return {"backend": self.name, "device": self._device, "precision": self._precision,
                "providers": ",".join(providers), "lanes": str(self.lanes), "file": self._model_path.name}

    def close(self) -> None:
        """Each CUDA lane waits for its run in flight before its buffers and stream go."""
        lanes, self._cuda_lanes = self._cuda_lanes, []
        for lane in lanes:
            lane.close()
        self._sessions = []


def import_ort() -> Any:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise BackendError("onnxruntime is not installed: pip install -r requirements.txt") from exc
    return ort


_SHARED_ARENAS: set[int] = set()  # CUDA devices whose arena is registered in ONNX Runtime's environment
CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
_CUBLAS_FROM_OPERATOR = CUBLAS_ENV in os.environ  # set before the daemon started: the operator's choice, kept


def limit_cublas_workspace(config: str) -> None:
    """Give cuBLAS `config` (inference.cublas_workspace) as its CUBLAS_WORKSPACE_CONFIG, before any CUDA session.

    Why: ONNX Runtime's CUDA provider makes a cuBLAS handle per session, and cuBLAS reserves its default workspace
    per handle: on the H200 each further session cost 147 MB, 19 MB with ":16:8" (deploy/ort_cuda_probe.py
    --sessions), at the same speed; a camera group on the frame graphs path has 8 sessions. cuBLAS reads the
    variable when a handle is made, so it is set in this process's environment (camera group processes inherit it).
    A value the operator set in the daemon's environment is left as it is; "" leaves cuBLAS's default."""
    if config and not _CUBLAS_FROM_OPERATOR:
        os.environ[CUBLAS_ENV] = config


def share_cuda_arena(ort: Any, device_id: int = 0, limit_mb: int = 0) -> bool:
    """Register one CUDA memory arena in ONNX Runtime's process-wide environment, for every CUDA session to share.

    Each lane keeps a session per padded batch size (see cuda_lane.py), and each session's own arena holds the
    activations of its largest run for good. Measured on the H200 (BENCHMARKS.md, ort_cuda_probe): each extra
    detector session took ~400 MB with its own arena, ~150 MB with the shared one. Where this ONNX Runtime cannot
    share (an old build), sessions keep their own arenas: more memory, same results. `limit_mb`
    (inference.gpu_memory_limit_mb) caps it; the first call in a process decides."""
    if device_id in _SHARED_ARENAS:
        return True
    try:
        memory = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, device_id, ort.OrtMemType.DEFAULT)
        arena = ort.OrtArenaCfg(limit_mb * 2**20, 1, -1, -1)  # cap (0: none), grow by what is asked (kSameAsRequested)
        ort.create_and_register_allocator_v2("CUDAExecutionProvider", memory, {"device_id": str(device_id)}, arena)
    except Exception as exc:  # noqa: BLE001 - pybind raises RuntimeError, TypeError or its own Fail types
        log.warning("cannot share one CUDA memory arena between sessions (%s); each keeps its own", exc)
        return False
    _SHARED_ARENAS.add(device_id)
    return True


def cuda_provider_options(stream: int, cudnn_max_workspace: bool) -> dict[str, str]:
    """The CUDA provider's options for a session on `stream` (inference.cudnn_max_workspace says how much scratch
    memory cuDNN's convolutions may take)."""
    return {"user_compute_stream": str(stream), "cudnn_conv_algo_search": "HEURISTIC",
            "cudnn_conv_use_max_workspace": "1" if cudnn_max_workspace else "0"}


def captured_provider_options(stream: int, cudnn_max_workspace: bool) -> dict[str, str]:
    """cuda_provider_options for a session whose runs ONNX Runtime records once and replays as a CUDA graph
    (inference.cuda_graphs). Such a session must keep an arena of its own (make_session with shared_arena False):
    a replay writes its activations where the recorded run put them, memory the run gave back to its arena, which a
    shared arena would hand to another session's weights or activations in the meantime. Its arena grows by what is
    asked (as the shared one does) and stays outside inference.gpu_memory_limit_mb, which caps the shared one."""
    return {**cuda_provider_options(stream, cudnn_max_workspace), "enable_cuda_graph": "1",
            "arena_extend_strategy": "kSameAsRequested"}


def _session(ort: Any, threads: int, model: ModelManifest, model_path: Path,
             providers: list[Any], shared_arena: bool = False, memory_pattern: bool = True) -> Any:
    """One InferenceSession; `threads` intra-op threads (0 = the library default)."""
    return make_session(ort, model_path, f"{model.name}: ONNX Runtime cannot load {model_path}", threads, providers,
                        shared_arena, memory_pattern)


def make_session(ort: Any, source: Path | bytes, failure: str, threads: int, providers: list[Any],
                 shared_arena: bool = False, memory_pattern: bool = True) -> Any:
    """One InferenceSession of a model file or serialised graph, with the options every session here shares.

    `failure` begins the BackendError raised when ONNX Runtime refuses the model; `memory_pattern`:
    inference.memory_pattern (CUDA sessions)."""
    options = ort.SessionOptions()
    options.enable_mem_pattern = memory_pattern
    if shared_arena:
        options.add_session_config_entry("session.use_env_allocators", "1")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    # Idle intra-op threads would otherwise spin for a while after each run, burning the cores that capture and
    # the other model need (measured: see BENCHMARKS.md, bench pipeline on 2 cores).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(source if isinstance(source, bytes) else str(source), options, providers=providers)
    except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated types for an unloadable model
        raise BackendError(f"{failure}: {exc}") from exc


def _spec(arg: object) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)  # type: ignore[attr-defined]
    dtype = ONNX_NUMPY_TYPES.get(arg.type, np.dtype(np.float32))  # type: ignore[attr-defined]
    return TensorSpec(arg.name, shape, dtype)  # type: ignore[attr-defined]


PLUGIN = Plugin("onnxruntime", None, OnnxRuntimeBackend)
