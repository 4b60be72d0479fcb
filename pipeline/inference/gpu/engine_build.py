"""build-engine: turn a prepared ONNX file into a TensorRT engine, cached in `engines/` with a JSON sidecar.

Written against the TensorRT Python API that exists in both TensorRT 10.x and 11.x, and checked with mypy against
tensorrt-stubs (tests/mypy-tensorrt.ini); it could not be run on the machines it was written on (no TensorRT there).

Precision is a property of the ONNX file (prepare-models writes fp32, fp16 and int8-QDQ variants), so the network is
parsed *strongly typed* and no precision builder flag is set: TensorRT 11 removed `BuilderFlag.FP16/INT8`,
`int8_calibrator`, `max_workspace_size` and `platform_has_fast_fp16`, and networks are always explicit-batch since 10
(`EXPLICIT_BATCH` is ignored in 10 and gone from the 11 bindings, so it is not passed).

What an engine is built for (its key, file name and sidecar) and whether the one on disk fits is decided in
`engine_key` (pure); a mismatch means rebuild, or, when building is not allowed, a BackendError that prints the exact
build-engine command.

The timing cache (kernel timings reused by later builds) is kept per TensorRT version,
`engines/timing-trt<version>.cache`: a cache from another version is useless to the builder, and one that TensorRT
cannot read or refuses is treated as absent (logged), never as a failed build.

TensorRT's log messages are collected by `TrtMessages`, tagged with the thread that logged them and a sequence number,
so an error quotes only what TensorRT said on the failing call's own thread since that call began, never another
lane's messages.

`tensorrt` is imported only inside functions: this module imports (and its pure parts are tested) without it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pipeline.inference.backend import BackendError
from pipeline.inference.gpu.cuda import (
    GPU_REQUIREMENTS,
    CudaDevice,
    cuda_python_problem,
)
from pipeline.inference.gpu.engine_key import (
    ENGINES_DIR,
    SIDECAR_FORMAT,
    EngineKey,
    build_command,
    check_engine,
    engine_path,
    input_channels,
    profile_shapes,
    read_sidecar,
    sidecar_path,
    timing_cache_path,
)

if TYPE_CHECKING:
    import tensorrt as trt

    from pipeline.modelprep.manifest import ModelManifest

log = logging.getLogger(__name__)

DEFAULT_WORKSPACE_BYTES = 1 << 30  # builder scratch memory; these models need far less, big tactics may want it


# ---------------------------------------------------------------- TensorRT: availability, logger, progress


def tensorrt_problem() -> str | None:
    """Why the `tensorrt` package cannot be used here (None when it can).

    `tensorrt-stubs` alone installs a `tensorrt/` folder of .pyi files that imports as an empty namespace package,
    so a successful import is not enough: the real module has `__version__` and `Builder`.
    """
    try:
        import tensorrt
    except (ImportError, OSError) as exc:
        return f"tensorrt cannot be imported ({exc})"
    if not isinstance(getattr(tensorrt, "__version__", None), str) or not hasattr(tensorrt, "Builder"):
        return "tensorrt is not installed (only its type stubs are)"
    return None


def require_gpu_packages() -> str:
    """TensorRT's version, or BackendError naming each missing package and how to install it."""
    problems = [p for p in (tensorrt_problem(), cuda_python_problem()) if p is not None]
    if problems:
        raise BackendError(f"the TensorRT backend and build-engine need tensorrt and cuda-python: "
                           f"{'; '.join(problems)}; {GPU_REQUIREMENTS}")
    import tensorrt as trt

    return trt.__version__


@dataclass(frozen=True)
class _Message:
    seq: int  # position in the log, see TrtMessages.mark
    thread: int  # threading.get_ident() of the thread TensorRT logged it on
    text: str


class TrtMessages:
    """TensorRT's log messages (WARNING and worse), kept so they can be quoted in errors, and forwarded to logging.

    One logger serves a runtime and every lane made from it, and the lanes run on their own threads. TensorRT logs an
    API call's errors on the thread that made the call, so each message is tagged with its thread and a sequence
    number: take `mark()` before a call, and `tail(since=mark)` quotes only what that call's thread logged since."""

    def __init__(self, limit: int = 200) -> None:
        self._messages: deque[_Message] = deque(maxlen=limit)
        self._seq = 0
        self._lock = threading.Lock()

    def add(self, level: int, label: str, msg: str) -> None:
        """`level` uses TensorRT's order: 0 internal error, 1 error, 2 warning, 3 info, 4 verbose."""
        if level <= 2:
            with self._lock:
                self._seq += 1
                self._messages.append(_Message(self._seq, threading.get_ident(), f"[{label}] {msg}"))
        if level <= 1:
            log.error("TensorRT: %s", msg)
        elif level == 2:
            log.warning("TensorRT: %s", msg)
        elif level == 3:
            log.debug("TensorRT: %s", msg)

    def mark(self) -> int:
        """A point in the log; messages logged after it have a higher sequence number."""
        with self._lock:
            return self._seq

    def messages(self, since: int | None = None) -> list[str]:
        """Every kept message (since=None), or those logged on the calling thread after the mark `since`."""
        me = threading.get_ident()
        with self._lock:
            return [m.text for m in self._messages if since is None or (m.seq > since and m.thread == me)]

    def clear(self) -> None:
        with self._lock:
            self._messages.clear()

    def tail(self, count: int = 6, since: int | None = None) -> str:
        """The last `count` messages of `messages(since)`, joined for an error message."""
        recent = self.messages(since)[-count:]
        if recent:
            return " | ".join(recent)
        return "TensorRT logged nothing" if since is None else "TensorRT logged nothing for this call"


def make_logger(messages: TrtMessages) -> trt.ILogger:
    """A `trt.ILogger` that hands every message to `messages` (TensorRT calls it from its own threads)."""
    import tensorrt as trt

    severity = trt.ILogger.Severity
    labels = {int(severity.INTERNAL_ERROR): "internal error", int(severity.ERROR): "error",
              int(severity.WARNING): "warning", int(severity.INFO): "info", int(severity.VERBOSE): "verbose"}

    class CollectingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)  # the documented way to subclass the pybind11 interface

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            level = int(severity)
            messages.add(level, labels.get(level, str(level)), msg)

    return CollectingLogger()


def make_progress_monitor(title: str) -> trt.IProgressMonitor:
    """A `trt.IProgressMonitor` (TensorRT 10.0+ and 11) that logs build phases and, for top phases, every 25%."""
    import tensorrt as trt

    class BuildProgress(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._lock = threading.Lock()
            self._depth: dict[str, int] = {}
            self._steps: dict[str, int] = {}
            self._reported: dict[str, int] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            try:
                with self._lock:
                    depth = self._depth.get(parent_phase, -1) + 1 if parent_phase else 0
                    self._depth[phase_name] = depth
                    self._steps[phase_name] = max(1, int(num_steps))
                    self._reported[phase_name] = 0
                level = logging.INFO if depth <= 1 else logging.DEBUG
                log.log(level, "%s: %s%s (%d step%s)", title, "  " * depth, phase_name, num_steps,
                        "" if num_steps == 1 else "s")
            except Exception:  # noqa: BLE001 - an exception must not propagate into TensorRT's build thread
                log.debug("build progress report failed", exc_info=True)

        def step_complete(self, phase_name: str, step: int) -> bool:
            try:
                with self._lock:
                    depth, steps = self._depth.get(phase_name, 9), self._steps.get(phase_name, 1)
                    quarter = (step + 1) * 4 // steps
                    report = depth == 0 and steps >= 4 and quarter > self._reported.get(phase_name, 0)
                    if report:
                        self._reported[phase_name] = quarter
                if report:
                    log.info("%s: %s %d%%", title, phase_name, min(100, quarter * 25))
            except Exception:  # noqa: BLE001 - as in phase_start
                log.debug("build progress report failed", exc_info=True)
            return True  # False would cancel the build

        def phase_finish(self, phase_name: str) -> None:
            try:
                with self._lock:
                    depth = self._depth.pop(phase_name, 9)
                    self._steps.pop(phase_name, None)
                    self._reported.pop(phase_name, None)
                if depth == 0:
                    log.info("%s: %s done", title, phase_name)
            except Exception:  # noqa: BLE001 - as in phase_start
                log.debug("build progress report failed", exc_info=True)

    return BuildProgress()


def dims_tuple(dims: trt.Dims) -> tuple[int, ...]:
    return tuple(int(dims[i]) for i in range(len(dims)))


def numpy_dtype(dtype: trt.DataType) -> np.dtype[Any]:
    """numpy's dtype for a TensorRT I/O data type (the types prepared models use)."""
    import tensorrt as trt

    table = {trt.DataType.FLOAT: np.float32, trt.DataType.HALF: np.float16, trt.DataType.INT8: np.int8,
             trt.DataType.INT32: np.int32, trt.DataType.INT64: np.int64, trt.DataType.UINT8: np.uint8,
             trt.DataType.BOOL: np.bool_}
    if dtype not in table:
        raise BackendError(f"TensorRT data type {dtype} has no numpy equivalent for I/O")
    return np.dtype(table[dtype])


# ---------------------------------------------------------------- building


def _write_atomically(path: Path, data: bytes | memoryview) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _timing_cache(config: trt.IBuilderConfig, path: Path) -> trt.ITimingCache:
    """Attach this TensorRT version's persistent timing cache, or a fresh one when that file is missing or unusable.

    A cache TensorRT cannot read (create_timing_cache gives nothing) or refuses (set_timing_cache: another GPU) only
    costs build time, so it is logged and replaced, never a failed build."""
    data = b""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot read timing cache %s (%s); starting a new one", path, exc)
    if data:
        cache = _usable_timing_cache(config, data, path)
        if cache is not None:
            log.info("using timing cache %s (%d KB)", path.name, len(data) // 1024)
            return cache
    fresh: trt.ITimingCache | None = config.create_timing_cache(b"")
    if fresh is None or not config.set_timing_cache(fresh, ignore_mismatch=False):
        raise BackendError("TensorRT could not create an empty timing cache")
    return fresh


def _usable_timing_cache(config: trt.IBuilderConfig, data: bytes, path: Path) -> trt.ITimingCache | None:
    """The cache read from `path` and attached to `config`, or None (logged) when TensorRT cannot use it."""
    try:
        cache: trt.ITimingCache | None = config.create_timing_cache(data)
    except (RuntimeError, TypeError, ValueError) as exc:
        log.warning("timing cache %s cannot be read by this TensorRT (%s); starting a new one", path.name, exc)
        return None
    if cache is None:
        log.warning("timing cache %s cannot be read by this TensorRT; starting a new one", path.name)
        return None
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        log.warning("timing cache %s was made on another GPU or TensorRT build; starting a new one", path.name)
        return None
    return cache


@dataclass
class BuildResult:
    engine: Path
    sidecar: dict[str, object]
    built: bool  # False: a matching engine existed already


def build_engine(key: EngineKey, onnx_path: Path, channels: int, *, engines_dir: Path = ENGINES_DIR,
                 workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, opt_batch: int | None = None) -> BuildResult:
    """Parse `onnx_path` strongly typed, build with one optimisation profile, write engine + sidecar."""
    import tensorrt as trt

    if trt.__version__ != key.tensorrt:
        raise BackendError(f"key names TensorRT {key.tensorrt}, running {trt.__version__}")
    engines_dir.mkdir(parents=True, exist_ok=True)
    target = engine_path(key, engines_dir)
    title = f"build {key.model} {key.precision}"
    messages = TrtMessages()
    logger = make_logger(messages)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        details = " | ".join(errors) or messages.tail()
        raise BackendError(f"{key.model}: TensorRT cannot parse {onnx_path.name}: {details}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_bytes))
    profile = builder.create_optimization_profile()
    shapes: dict[str, list[list[int]]] = {}
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        low, opt, high = profile_shapes(tensor.name, dims_tuple(tensor.shape), key.input_size, channels,
                                        key.max_batch, opt_batch)
        profile.set_shape(tensor.name, trt.Dims(list(low)), trt.Dims(list(opt)), trt.Dims(list(high)))
        shapes[tensor.name] = [list(low), list(opt), list(high)]
    if config.add_optimization_profile(profile) < 0:
        raise BackendError(f"{key.model}: TensorRT rejected the optimisation profile {shapes}: {messages.tail()}")

    cache_path = timing_cache_path(engines_dir, key.tensorrt)
    _timing_cache(config, cache_path)
    monitor = make_progress_monitor(title)  # must outlive the build: keep the reference until it returns
    config.progress_monitor = monitor

    log.info("%s: building %s for %s (TensorRT %s, batch 1..%d, input %dx%d); this takes a while",
             title, onnx_path.name, key.gpu, key.tensorrt, key.max_batch, *key.input_size)
    started = time.monotonic()
    serialized = builder.build_serialized_network(network, config)
    seconds = time.monotonic() - started
    if serialized is None or serialized.nbytes == 0:
        raise BackendError(f"{key.model}: TensorRT could not build an engine from {onnx_path.name}: {messages.tail()}")
    _write_atomically(target, memoryview(serialized))
    _save_timing_cache(config, cache_path)
    del monitor

    sidecar: dict[str, object] = {"format": SIDECAR_FORMAT, **key.to_dict(), "onnx_file": onnx_path.name,
                                  "profile": shapes, "workspace_bytes": int(workspace_bytes),
                                  "engine_bytes": int(serialized.nbytes),
                                  "built_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                  "build_seconds": round(seconds, 1)}
    _write_atomically(sidecar_path(target), (json.dumps(sidecar, indent=2) + "\n").encode())
    log.info("%s: wrote %s (%.1f MB) in %.0f s", title, target.name, serialized.nbytes / 1e6, seconds)
    return BuildResult(target, sidecar, built=True)


def _save_timing_cache(config: trt.IBuilderConfig, path: Path) -> None:
    """Keep the build's timing cache for the next build; the engine is fine without it, so failures are logged."""
    cache: trt.ITimingCache | None = config.get_timing_cache()
    if cache is None:
        log.warning("TensorRT returned no timing cache to save in %s", path.name)
        return
    try:
        _write_atomically(path, memoryview(cache.serialize()))
    except OSError as exc:
        log.warning("could not save the timing cache %s: %s", path, exc)


def ensure_engine(key: EngineKey, onnx_path: Path, channels: int, *, fixed_size: bool, no_build: bool = False,
                  force: bool = False, engines_dir: Path = ENGINES_DIR,
                  workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> BuildResult:
    """A matching engine for `key`: the cached one, or a fresh build (logging why), or BackendError if no_build."""
    target, problem = check_engine(key, engines_dir)
    if problem is None and not force:
        return BuildResult(target, read_sidecar(sidecar_path(target)) or {}, built=False)
    reason = "rebuild requested (--force)" if problem is None else problem
    if no_build:
        raise BackendError(f"{key.model}: TensorRT engine not usable: {reason}. It is not built at start "
                           f"(inference.tensorrt.build_missing: false). Build it with: "
                           f"{build_command(key, fixed_size)}")
    log.info("%s %s: building a TensorRT engine: %s", key.model, key.precision, reason)
    return build_engine(key, onnx_path, channels, engines_dir=engines_dir, workspace_bytes=workspace_bytes)


def engine_key(manifest: ModelManifest, onnx_path: Path, precision: str, max_batch: int,
               input_size: tuple[int, int] | Literal["auto"] | None, device: CudaDevice,
               tensorrt_version: str) -> EngineKey:
    """The key for this model on this GPU; the input size is the manifest's when fixed, else `input_size`
    (detector.input_size: `auto`, a size per camera shape, names none, and an engine is built for one)."""
    from pipeline.modelprep.prepare import (
        sha256_of,  # here, not above: it loads onnx, and the settings import us
    )

    size = manifest.input.size or input_size
    if size is None or isinstance(size, str):
        raise BackendError(f"{manifest.name}: its input size is set by the config (detector.input_size), and "
                           f"{'it is auto' if size else 'none was given'}: a TensorRT engine is built for one "
                           "size: set detector.input_size (e.g. [640, 352] for 16:9 cameras) or give build-engine "
                           "--input-size WxH")
    return EngineKey(manifest.name, sha256_of(onnx_path), precision, int(max_batch),
                     (int(size[0]), int(size[1])), device.name, device.compute_capability, tensorrt_version)


def build_for_cli(manifest: ModelManifest, onnx_path: Path, precision: str, max_batch: int,
                  input_size: tuple[int, int] | Literal["auto"] | None, *, force: bool = False,
                  engines_dir: Path = ENGINES_DIR,
                  workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> BuildResult:
    """What `run_pipeline.py build-engine` does for one model (on GPU 0, in its primary context)."""
    version = require_gpu_packages()
    device = CudaDevice.open(0)
    key = engine_key(manifest, onnx_path, precision, max_batch, input_size, device, version)
    return ensure_engine(key, onnx_path, input_channels(manifest), fixed_size=manifest.input.size is not None,
                         force=force, engines_dir=engines_dir, workspace_bytes=workspace_bytes)
