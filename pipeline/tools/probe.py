"""What `check-config` finds out about *this machine*: a valid file that still cannot start here.

Two depths, because the quick check runs before every start under systemd (the unit's ExecStartPre) and must stay
fast and must not take a camera away from a daemon that is running:

- quick (`check-config PATH`, the default) looks without opening anything: a video file or a /dev/videoN (a USB
  camera index N) that does not exist, `inference.device: cuda|tensorrt` when this onnxruntime lacks the provider
  (or `backend: tensorrt` without its packages), camera groups on a GPU without NVIDIA's MPS running, more cameras
  on a process or a GPU than it keeps up with (advice: camera groups, `detector.interval: 3`,
  `inference.cuda_graphs`, `tracking.follow_by: auto` for large processes following by look on GPU frames), a
  model without a manifest, and an int8 model file that was never prepared (the daemon cannot make one at start:
  int8 needs calibration images). These are *warnings*, the exit stays 0: the file is
  valid, a camera may be plugged in or a file mounted after the check (the daemon keeps retrying cameras), and a
  file is often checked on another machine than the one that runs it.
- probe (`check-config --probe PATH`) opens each enabled camera once, as the daemon would (`open_source`, one frame
  read, closed; all cameras at once, bounded by one time-out) and loads each model's prepared file in the configured
  backend, device and precision (ONNX Runtime with the configured provider; nothing is prepared or downloaded, and a
  TensorRT engine is not built). Every failure is an error naming the key to look at.
"""

from __future__ import annotations

import errno
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipeline.core.redact import mask_secrets

if TYPE_CHECKING:
    from pipeline.capture.settings import CameraConfig
    from pipeline.config.app import AppConfig
    from pipeline.inference.settings import InferenceConfig
    from pipeline.modelprep.manifest import ModelManifest

# The execution provider each non-CPU inference.device needs from onnxruntime.
PROVIDERS = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
GPU_INSTALL = "install onnxruntime-gpu and the CUDA libraries: pip install -r requirements-gpu.txt"
DetectorSize = tuple[int, int] | Literal["auto"] | None  # detector.input_size; None: the model's own size


@dataclass(frozen=True)
class Finding:
    """One thing found about a config key, e.g. `cameras[1].source`: a problem, or (in `passed`) what worked."""

    key: str
    message: str

    def format(self, path: object, label: str = "") -> str:
        """`FILE: key: message`, or `FILE: label: key: message` (label e.g. `warning`)."""
        return f"{path}: {label + ': ' if label else ''}{self.key}: {mask_secrets(self.message)}"


@dataclass
class ProbeReport:
    """What --probe found: the failures (each makes the exit 2) and what opened or loaded fine. `retried` are the
    failures the daemon lives with (a camera it cannot open: it starts anyway and keeps retrying it); the others would
    stop it (a model that does not load, a port in use)."""

    failures: list[Finding]
    passed: list[Finding]
    retried: list[Finding] = field(default_factory=list)

    @property
    def fatal(self) -> list[Finding]:
        return [finding for finding in self.failures if finding not in self.retried]


# ------------------------------------------------------------------------------------------------ quick


def quick_findings(cfg: AppConfig) -> list[Finding]:
    """What can be seen without opening a camera or loading a model (warnings: see the module docstring)."""
    findings: list[Finding] = []
    for index, cam in enumerate(cfg.cameras):
        problem = source_absence(cam) if cam.enabled else None
        if problem:
            findings.append(Finding(f"cameras[{index}].source", f"{problem}; the daemon would keep retrying it"))
    findings += device_findings(cfg.inference)
    # imported here: the quick check runs before every start, and needs no camera or model code otherwise
    from pipeline.service.groups import crowded_process, mps_problem

    for problem in (mps_problem(cfg.inference), crowded_process(cfg.cameras, cfg.inference)):
        if problem:
            findings.append(Finding("inference.processes", problem))
    findings += gpu_load_advice(cfg)
    findings += model_file_findings(cfg)
    return findings


def gpu_load_advice(cfg: AppConfig) -> list[Finding]:
    """Advice for many cameras a GPU: the detector on every frame, the frame graphs launched node by node, faces
    followed by their look on GPU frames in large camera processes."""
    from pipeline.service.groups import (cuda_graphs_advice, detector_interval_advice, follow_look_advice,
                                         gpus_in_use, visible_gpus)

    inference = cfg.inference
    if inference.device == "cpu":
        return []  # no advice applies: skip asking nvidia-smi for the GPUs
    gpus = gpus_in_use(inference, visible_gpus() if inference.processes > 1 else [])
    advice = [("detector.interval", detector_interval_advice(cfg.cameras, cfg.detector.interval, inference, gpus)),
              ("inference.cuda_graphs", cuda_graphs_advice(cfg.cameras, inference, gpus)),
              ("tracking.follow_by", follow_look_advice(cfg.cameras, cfg.detector.interval, cfg.tracking.follow_by,
                                                        inference))]
    return [Finding(key, text) for key, text in advice if text]


def source_absence(cam: CameraConfig) -> str | None:
    """Why the camera's source cannot be there now (a missing file or device node), or None when it may be."""
    kind = cam.source_kind
    if kind == "index" and Path("/dev").is_dir():
        node = Path(f"/dev/video{cam.source}")
        return None if node.exists() else f"USB camera {cam.source}: {node} does not exist (not connected?)"
    if kind == "device":
        return None if Path(str(cam.source)).exists() else f"{cam.source} does not exist (camera unplugged?)"
    if kind == "file":
        path = Path(str(cam.source)).expanduser()
        if not path.is_file():
            where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
            return f"video file {path} not found{where}"
    return None


def device_findings(inference: InferenceConfig) -> list[Finding]:
    """The configured device or backend that this Python environment cannot provide."""
    from pipeline.inference.backend import BackendError

    if inference.backend == "tensorrt":
        from pipeline.inference.gpu.engine_build import require_gpu_packages

        try:
            require_gpu_packages()
        except BackendError as exc:
            return [Finding("inference.backend", str(exc))]
        return []
    if inference.device not in PROVIDERS:
        return []
    from pipeline.inference.onnxruntime import import_ort

    try:
        ort = import_ort()
    except BackendError as exc:
        return [Finding("inference.backend", str(exc))]
    provider, available = PROVIDERS[inference.device], ort.get_available_providers()
    if provider in available:
        return []
    return [Finding("inference.device", f"{inference.device} needs {provider}, which this onnxruntime "
                                        f"({ort.__version__}) lacks (it has {', '.join(available)}); {GPU_INSTALL}")]


def model_file_findings(cfg: AppConfig) -> list[Finding]:
    """Models the daemon could not load or make at start: an unknown name, an int8 file never prepared."""
    from pipeline.modelprep.manifest import ManifestError, load_manifest

    findings: list[Finding] = []
    for role, name in (("detector", cfg.detector.model), ("emotion", cfg.emotion.model)):
        try:
            manifest = load_manifest(name)
        except ManifestError as exc:
            findings.append(Finding(f"{role}.model", str(exc)))
            continue
        precision = manifest.effective_precision(cfg.inference.precision)
        target = manifest.file_for(precision)
        if precision == "int8" and not target.exists():
            findings.append(Finding("inference.precision", f"{target} does not exist, and the daemon cannot make "
                                    f"it at start (int8 needs calibration images); {_prepare_hint(precision)}"))
    return findings


def _prepare_hint(precision: str) -> str:
    calib = " --calib DIR" if precision == "int8" else ""
    return f"run: python run_pipeline.py prepare-models --precision {precision}{calib}"


# ------------------------------------------------------------------------------------------------ probe


def probe_config(cfg: AppConfig, timeout_s: float) -> ProbeReport:
    """Open every enabled camera (at once, within `timeout_s`) and load every model; see the module docstring."""
    report = ProbeReport([], [])
    for finding, ok in probe_cameras(cfg, timeout_s):
        (report.passed if ok else report.failures).append(finding)
        if not ok:
            report.retried.append(finding)
    for finding, ok in probe_server(cfg) + probe_models(cfg):
        (report.passed if ok else report.failures).append(finding)
    return report


def probe_server(cfg: AppConfig) -> list[tuple[Finding, bool]]:
    """The status server's address bound once, as the daemon binds it (a port in use makes the daemon exit 1)."""
    import socket

    server = cfg.server
    if not server.enabled:
        return []
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp's server does
            probe.bind((server.host, server.port))
            probe.listen(1)
    except OSError as exc:
        reason = "in use (another instance running? change server.port)" if exc.errno == errno.EADDRINUSE else \
            (exc.strerror or str(exc))
        return [(Finding("server.port", f"cannot listen on {server.host}:{server.port}: {reason}; the daemon "
                                        f"would exit 1"), False)]
    return [(Finding("server.port", f"{server.host}:{server.port} is free"), True)]


class _CameraProbe(threading.Thread):
    """Opens one camera and reads one frame on its own thread, so a source that hangs costs only the time-out.

    A daemon thread on purpose: an open stuck inside FFmpeg cannot be interrupted, and must not hold the command."""

    def __init__(self, key: str, cam: CameraConfig, deadline: float, gpu_active: bool, device_frames: bool) -> None:
        super().__init__(name=f"probe-{cam.name}", daemon=True)
        self.key, self.cam, self.deadline = key, cam, deadline
        self.gpu_active, self.device_frames = gpu_active, device_frames
        self.outcome: tuple[bool, str] | None = None  # (opened and read a frame, detail or reason)

    def run(self) -> None:
        from pipeline.capture.source_base import SourceEnded, SourceError
        from pipeline.capture.sources import open_source

        try:
            source = open_source(self.cam, gpu_active=self.gpu_active, device_frames=self.device_frames)
        except SourceError as exc:
            self.outcome = (False, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - reported as this camera's failure, never a traceback
            self.outcome = (False, f"cannot open: {type(exc).__name__}: {exc}")
            return
        try:
            wait = max(0.5, self.deadline - time.monotonic())
            got = source.grab(wait)
            self.outcome = (True, f"opened, read a frame: {source.describe()}") if got else \
                (False, f"opened ({source.describe()}), but no frame came within {wait:.1f} s")
        except SourceEnded:
            self.outcome = (False, "opened, but it ended before its first frame")
        except Exception as exc:  # noqa: BLE001 - SourceError or a decoder's own error: this camera's failure
            self.outcome = (False, str(exc) or type(exc).__name__)
        finally:
            source.close()


def probe_cameras(cfg: AppConfig, timeout_s: float) -> list[tuple[Finding, bool]]:
    """Each enabled camera opened as the daemon opens it (same decode choice); (finding, worked) per camera."""
    from pipeline.service.parts import set_rtsp_transport

    set_rtsp_transport(cfg)  # FFmpeg's RTSP transport is process-wide: set before any stream opens, as the daemon does
    inference = cfg.inference
    gpu_active = inference.device != "cpu"
    device_frames = inference.graph_frames and inference.device == "cuda"
    deadline = time.monotonic() + timeout_s
    probes = [_CameraProbe(f"cameras[{index}].source", cam, deadline, gpu_active, device_frames)
              for index, cam in enumerate(cfg.cameras) if cam.enabled]
    for probe in probes:
        probe.start()
    for probe in probes:
        probe.join(max(0.0, deadline - time.monotonic()))
    silent = [p for p in probes if p.outcome is None]
    # OpenCV opens FFmpeg streams one at a time (a process-wide lock), so one that hangs holds up those after it.
    queued = " (or waiting behind another stream that hangs: OpenCV opens one stream at a time)" \
        if sum(p.cam.source_kind in ("rtsp", "http") for p in silent) > 1 else ""
    results: list[tuple[Finding, bool]] = []
    for probe in probes:
        ok, text = probe.outcome or (False, f"no answer within {timeout_s:g} s (neither refused nor delivering a "
                                            f"frame){queued}")
        results.append((Finding(probe.key, text), ok))
    return results


def probe_models(cfg: AppConfig) -> list[tuple[Finding, bool]]:
    """The detector and the emotion model loaded as configured; a device this onnxruntime lacks is said once."""
    missing_device = device_findings(cfg.inference)
    results: list[tuple[Finding, bool]] = [(finding, False) for finding in missing_device]
    for role, name, size in (("detector", cfg.detector.model, cfg.detector.input_size),
                             ("emotion", cfg.emotion.model, None)):
        found = _probe_model(role, name, cfg.inference, size, load=not missing_device)
        if found is not None:
            results.append(found)
    return results


def _probe_model(role: str, name: str, inference: InferenceConfig, size: DetectorSize,
                 load: bool) -> tuple[Finding, bool] | None:
    """The model's prepared file checked (exists, matches its sidecar) and, when `load`, loaded and released."""
    from pipeline.modelprep.manifest import ManifestError, ModelError, load_manifest
    from pipeline.modelprep.prepare import check_prepared

    try:
        manifest = load_manifest(name)
        precision = manifest.effective_precision(inference.precision)
        path = check_prepared(manifest, precision)
    except (ManifestError, ModelError) as exc:
        return Finding(f"{role}.model", str(exc)), False
    if path is None:
        target = manifest.file_for(precision)
        state = "was made by an older prepare-models" if target.exists() else "does not exist"
        key = "inference.precision" if precision != "fp32" else f"{role}.model"
        return Finding(key, f"{target} {state}; {_prepare_hint(precision)}"), False
    if not load:
        return None
    return _load_model(role, manifest, path, precision, inference, size)


def _load_model(role: str, manifest: ModelManifest, path: Path, precision: str, inference: InferenceConfig,
                size: DetectorSize) -> tuple[Finding, bool]:
    """Create the configured backend for one model (one lane; a missing TensorRT engine is reported, not built)."""
    from pipeline.inference.backend import BackendError, ModelRuntime, create_backend
    from pipeline.modelprep.manifest import ModelError

    spec = ModelRuntime.from_config(inference, precision=precision,
                                    input_size=None if manifest.input.size is not None else size)
    options: Any = spec.options
    if options is not None and "build_missing" in type(options).model_fields:
        options = options.model_copy(update={"build_missing": False})
    spec = replace(spec, lanes=1, options=options)
    key = f"{role}.model" if inference.device == "cpu" else \
        ("inference.backend" if inference.backend == "tensorrt" else "inference.device")
    try:
        backend = create_backend(spec, manifest, path)
    except (BackendError, ModelError, OSError) as exc:
        return Finding(key, str(exc)), False
    try:
        described = dict(backend.describe())
        health = backend.health()
    finally:
        backend.close()
    if not health.up:  # a remote backend (triton) whose server does not answer: the daemon would start degraded
        return Finding("inference.triton.url", f"{manifest.name}: {health.problem}"), False
    wanted = PROVIDERS.get(inference.device) if inference.backend == "onnxruntime" else None
    providers = described.get("providers", "")
    if wanted and wanted not in providers.split(","):
        return Finding(key, f"{manifest.name}: {wanted} did not start (ONNX Runtime fell back to {providers}); "
                            f"{GPU_INSTALL}"), False
    shown = ", ".join(f"{k} {described[k]}" for k in ("backend", "device", "precision", "providers", "file")
                      if k in described)
    return Finding(f"{role}.model", f"{manifest.name} loads: {shown}"), True
