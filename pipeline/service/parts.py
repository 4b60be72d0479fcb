"""Builders for the parts of the daemon that a reload may replace: models, outputs, trackers, FFmpeg's RTSP option;
and the start-time check that the configured outputs reach anyone at all.

Each builder takes explicit settings and returns a new object (or raises, having closed whatever it had opened), so
the daemon can prepare everything that may fail before it swaps anything in. None of them knows the daemon.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import cv2

from pipeline.capture.sources import configure_ffmpeg, open_source
from pipeline.inference.backend import BackendError
from pipeline.inference.gpu.cuda import CudaError, set_gpu_stack, set_gpu_wait
from pipeline.inference.perception import Analyzer
from pipeline.inference.perception import load_perception as build_perception
from pipeline.outputs.base import AvatarRoute
from pipeline.outputs.registry import create_sink
from pipeline.outputs.websocket import WebsocketSink
from pipeline.service.lifecycle import close_sinks
from pipeline.service.reload import enabled_cameras
from pipeline.vision.track import IouTracker

if TYPE_CHECKING:
    from pipeline.capture.source_base import VideoSource
    from pipeline.config.app import AppConfig, CameraConfig, TrackingConfig
    from pipeline.inference.settings import InferenceConfig
    from pipeline.outputs.base import Sink
    from pipeline.outputs.websocket import EventHub

log = logging.getLogger(__name__)

CONFIG_EVENT_OUTPUTS = frozenset({"stdout", "websocket"})  # the JSON outputs also carry `config` events
# Set (non-empty) in the environment of a process systemd started: INVOCATION_ID for every unit (systemd >= 232),
# NOTIFY_SOCKET for Type=notify (ours), JOURNAL_STREAM when its stdout or stderr goes to the journal.
SYSTEMD_VARIABLES = ("INVOCATION_ID", "NOTIFY_SOCKET", "JOURNAL_STREAM")


def load_perception(cfg: AppConfig) -> Analyzer:
    """The shared models for the configured frame path, sized for the enabled cameras (`sized_for_cameras`), loaded
    and warmed (a first frame then costs no lazy initialisation; the frame graphs path prepares each camera size when
    first met); closed on failure. The GPU is prepared first (`prepare_gpu`), at start and at each reload."""
    prepare_gpu(cfg)
    perception = build_perception(sized_for_cameras(cfg, len(enabled_cameras(cfg)), "daemon"))
    try:
        perception.warm_up()
    except BaseException:
        perception.close()
        raise
    return perception


def sized_for_cameras(cfg: AppConfig, cameras: int, what: str) -> AppConfig:
    """`cfg` with its inference settings for a process of `cameras` cameras (InferenceConfig.for_cameras: max_batch
    capped at what they can fill on the frame graphs path, one frame in flight each for a few cameras); logged when
    that changes anything."""
    inference = cfg.inference.for_cameras(cameras)
    if inference is cfg.inference:
        return cfg
    log.info("%s of %d camera(s): max_batch %d (of %d), %d frame(s) in flight per camera", what, cameras,
             inference.max_batch, cfg.inference.max_batch, inference.frames_in_flight_for(True))
    return cfg.model_copy(update={"inference": inference})


def open_camera_source(inference: InferenceConfig, cam_cfg: CameraConfig) -> VideoSource:
    """Open a camera's source; `decode: auto` decodes on the GPU while the models run on one, and NVDEC frames stay on
    the device when the frame graphs read them there."""
    return open_source(cam_cfg, gpu_active=inference.device != "cpu",
                       device_frames=inference.graph_frames and inference.device == "cuda")


def open_sinks(outputs: list[Any], hub: EventHub, close_timeout_s: float, presets: Sequence[str] = (),
               route: AvatarRoute | None = None) -> list[Sink]:
    """Every output started; if one fails, the ones already started are closed again and the error raised.

    `presets`: the expression names the behaviour rules use (`BehaviorConfig.rule_presets`), for outputs that reset
    every expression they may have set (VMC). `route`: an avatar's outputs receive only what that avatar concerns."""
    sinks: list[Sink] = []
    try:
        for out in outputs:
            sink = create_sink(out, presets=presets)
            if isinstance(sink, WebsocketSink):
                sink.bind(hub)
            if sink.type_name in CONFIG_EVENT_OUTPUTS:
                sink.events = sink.events | {"config"}
            sink.route = route
            sink.start()
            sinks.append(sink)
    except BaseException:
        close_sinks(sinks, close_timeout_s)
        raise
    return sinks


def open_all_sinks(cfg: AppConfig, hub: EventHub, close_timeout_s: float) -> list[Sink]:
    """The top-level outputs (every event), then each avatar's own outputs (routed: that avatar's commands and its
    cameras' events, `AvatarRoute`); if one fails, those already started are closed again and the error raised."""
    sinks = open_sinks(cfg.outputs, hub, close_timeout_s, cfg.behavior.rule_presets())
    try:
        for avatar in cfg.avatars:
            route = AvatarRoute(avatar.name, frozenset(avatar.cameras))
            own = open_sinks(avatar.outputs, hub, close_timeout_s, avatar.behavior.rule_presets(), route)
            sinks.extend(own)
    except BaseException:
        close_sinks(sinks, close_timeout_s)
        raise
    return sinks


def configure_hub(hub: EventHub, cfg: AppConfig) -> None:
    """The /ws hub follows the `websocket` output (disabled without one)."""
    hub.configure(next((o for o in cfg.outputs if o.type == "websocket"), None))


def set_rtsp_transport(cfg: AppConfig) -> None:
    """FFmpeg's RTSP options are process-wide: set them before any stream opens."""
    transports = {c.rtsp_transport for c in cfg.cameras if c.enabled and c.source_kind == "rtsp"}
    configure_ffmpeg(transports.pop() if transports else "tcp")


def limit_opencv_threads(cfg: AppConfig) -> None:
    """With the models on a GPU, run each OpenCV call on its caller's thread (no OpenCV thread pool).

    Many cameras then share the CPU, each with its own threads; OpenCV's pool would split every small conversion
    and resize across all cores and spin while waiting. Measured on the H200 (16 cores), one 1080p frame through
    NVDEC: 12.81 ms of CPU with OpenCV's default pool, 1.73 ms with one thread, same wall time
    (docs/bench/h200-2026-12-01/nvdec_probe.json). On the CPU path the pool is left as it is."""
    if cfg.inference.device != "cpu":
        cv2.setNumThreads(1)
        log.info("inference on %s: OpenCV runs single-threaded per call (the cameras' threads share the CPU)",
                 cfg.inference.device)


def prepare_gpu(cfg: AppConfig) -> None:
    """With a GPU in use (inference.device, which also sends `decode: auto` cameras to NVDEC), tell CUDA how the
    libraries' threads wait for it (inference.gpu_wait), then size this process's context's thread stacks
    (inference.gpu_stack_bytes), before any model loads. A machine whose driver cannot be reached keeps CUDA's
    defaults: loading the models then says why."""
    if cfg.inference.device == "cpu":
        return
    try:
        ordinals = set_gpu_wait(cfg.inference.gpu_wait)
    except CudaError as exc:
        log.warning("GPU waits left to CUDA's default (auto: a waiting thread spins): %s", exc)
        return
    log.info("GPU waits: %s on %d GPU(s)", cfg.inference.gpu_wait, len(ordinals))
    stack = cfg.inference.gpu_stack_bytes
    if stack is None or not ordinals:
        return
    try:
        granted = set_gpu_stack(stack)
    except BackendError as exc:  # a CudaError, or cuda-python missing (a BackendError naming it)
        log.warning("GPU thread stack left to CUDA's default: %s", exc)
        return
    log.info("GPU thread stack: %d bytes (asked %d)", granted, stack)


def new_tracker(cfg: AppConfig) -> IouTracker:
    """A camera's tracker; it follows faces between detections when the detector skips frames (detector.interval,
    on both frame paths; by their look too as tracking.follow_by says)."""
    return tracker_for(cfg.tracking, follow=cfg.detector.interval > 1)


def tracker_for(tracking: TrackingConfig, follow: bool) -> IouTracker:
    """A tracker with the config's `tracking` section; `follow`: between detections (see new_tracker)."""
    return IouTracker(tracking.iou_threshold, tracking.max_age_s, tracking.smoothing_half_life_ms, follow=follow,
                      pose_every=tracking.pose_every, follow_by=tracking.follow_by)


def label_sinks(sinks: list[Sink]) -> list[tuple[str, Sink]]:
    """Each output with a unique label for metrics and status: its type, then type-2, type-3 … for repeats; an
    avatar's own outputs are prefixed with the avatar's name (`hall.osc`, `hall.osc-2`)."""
    seen: Counter[str] = Counter()
    labels = []
    for sink in list(sinks):
        route = getattr(sink, "route", None)
        base = f"{route.avatar}.{sink.type_name}" if route is not None else sink.type_name
        seen[base] += 1
        n = seen[base]
        labels.append((base if n == 1 else f"{base}-{n}", sink))
    return labels


def warn_if_events_unseen(cfg: AppConfig, config_path: Path | None, environ: Mapping[str, str] = os.environ,
                          stdout: TextIO | None = None) -> bool:
    """One WARNING when the only output is stdout and the daemon runs under systemd, whose unit discards stdout
    (`StandardOutput=null`): the status page then shows commands while the avatar gets nothing. Returns whether
    it warned.

    "Under systemd": one of SYSTEMD_VARIABLES is set and stdout is not a terminal. The terminal test keeps a person
    quiet whose shell inherited INVOCATION_ID (a desktop terminal that is itself a systemd user service)."""
    if not cfg.outputs or any(output.type != "stdout" for output in cfg.outputs):
        return False
    stream = stdout if stdout is not None else sys.stdout
    try:
        terminal = bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        terminal = False
    found = next((name for name in SYSTEMD_VARIABLES if environ.get(name)), None)
    if terminal or found is None:
        return False
    where = f"outputs: in {config_path}" if config_path is not None else "outputs: in the config"
    log.warning("the only output is stdout, and this runs under systemd (%s is set, stdout is not a terminal), "
                "whose unit discards stdout: no event reaches an avatar. Add a websocket, osc or webhook output to "
                "%s and reload", found, where)
    return True
