"""Wires the pipeline together and owns its lifetime: one stop event, ordered start and shutdown.

Start: models (warm) → outputs → behaviour → cameras. Stop: cameras → workers → models (finish in-flight batches)
→ behaviour (drain) → outputs (flush). Every join has a timeout, so a wedged stage cannot hold the process.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

from pipeline.behavior import BehaviorMapper
from pipeline.camera_stats import CameraHealth, connection_quality
from pipeline.capture import CaptureThread
from pipeline.config import AppConfig, CameraConfig
from pipeline.events import camera_event, command_event, observation_event
from pipeline.perception import Perception
from pipeline.redact import mask_secrets
from pipeline.sinks.base import EventBus, Sink, create_sink
from pipeline.sources import configure_ffmpeg
from pipeline.track import IouTracker
from pipeline.types import CameraEvent, Observation
from pipeline.worker import CameraWorker

log = logging.getLogger(__name__)

OBSERVATION_QUEUE = 256
JOIN_TIMEOUT_S = 2.0
STATUS_LOG_S = 60.0


@dataclass
class Camera:
    """The two threads of one camera."""

    cfg: CameraConfig
    capture: CaptureThread
    worker: CameraWorker

    def health(self) -> CameraHealth:
        """The camera's figures right now (for status, metrics and health checks)."""
        now = time.monotonic()
        capture, analysed = self.capture, self.worker.stats.analysed
        age = None if capture.last_frame_mono is None else now - capture.last_frame_mono
        fps_analysed = analysed.rate(now)
        reconnects, stalls = capture.reconnects.count(now), capture.stalls.count(now)
        quality = connection_quality(capture.state, age, self.cfg.reconnect.stall_s, fps_analysed,
                                     min(self.cfg.fps, capture.frames_in.rate(now) or self.cfg.fps), reconnects, stalls)
        return CameraHealth(
            name=self.cfg.name, state=capture.state, source=mask_secrets(str(self.cfg.source)),
            fps_in=capture.frames_in.rate(now), fps_analysed=fps_analysed, frames_in=capture.frames_in.total,
            frames_analysed=analysed.total, frames_skipped=max(0, capture.frames_in.total - analysed.total),
            reconnects_1h=reconnects, stalls_1h=stalls, reconnects_total=capture.reconnects.total,
            last_frame_age_s=age, faces=self.worker.stats.faces, quality=quality)


@dataclass
class DropCounter:
    observations_dropped: int = 0
    started: float = field(default_factory=time.monotonic)


class ObservationQueue:
    """Bounded, drop-oldest: behaviour should act on what is happening now, not on a backlog."""

    def __init__(self, maxsize: int, counter: DropCounter) -> None:
        self._queue: queue.Queue[Observation] = queue.Queue(maxsize=maxsize)
        self._counter = counter

    def put(self, obs: Observation) -> None:
        while True:
            try:
                self._queue.put_nowait(obs)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()
                    self._counter.observations_dropped += 1
                except queue.Empty:
                    pass

    def get(self, timeout: float) -> Observation | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None


class Daemon:
    def __init__(self, cfg: AppConfig) -> None:
        self.cfg = cfg
        self.stop_event = threading.Event()
        self.counters = DropCounter()
        self.perception: Perception | None = None
        self.sinks: list[Sink] = []
        self.bus = EventBus([])
        self.cameras: dict[str, Camera] = {}
        self.observations = ObservationQueue(OBSERVATION_QUEUE, self.counters)
        self.mapper = BehaviorMapper(cfg.behavior)
        self._mapper_thread = threading.Thread(target=self._mapper_loop, name="behavior", daemon=True)

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        """Load and warm the models, open outputs, start behaviour and cameras. Raises on model problems."""
        self.perception = Perception.from_config(self.cfg)
        self.perception.warm_up()
        self.sinks = [create_sink(out) for out in self.cfg.outputs]
        for sink in self.sinks:
            sink.start()
        self.bus = EventBus(self.sinks)
        self._mapper_thread.start()
        transports = {c.rtsp_transport for c in self.cfg.cameras if str(c.source).startswith(("rtsp://", "rtsps://"))}
        configure_ffmpeg(transports.pop() if transports else "tcp")
        for cam_cfg in self.cfg.cameras:
            if cam_cfg.enabled:
                self._start_camera(cam_cfg)
        log.info("running: %d camera(s), outputs: %s", len(self.cameras),
                 ", ".join(s.type_name for s in self.sinks) or "none")

    def _start_camera(self, cam_cfg: CameraConfig) -> None:
        if self.perception is None:
            raise RuntimeError("start() loads the models before cameras")
        capture = CaptureThread(cam_cfg, self.stop_event, self._on_camera_event)
        tracking = self.cfg.tracking
        tracker = IouTracker(tracking.iou_threshold, tracking.max_age_s, tracking.smoothing_half_life_ms)
        worker = CameraWorker(capture, self.perception, tracker, cam_cfg.fps, self._on_observation, self.stop_event)
        self.cameras[cam_cfg.name] = Camera(cam_cfg, capture, worker)
        capture.start()
        worker.start()

    # ------------------------------------------------------------------ flow

    def _on_camera_event(self, event: CameraEvent) -> None:
        self.bus.publish(camera_event(event))

    def _on_observation(self, obs: Observation) -> None:
        self.bus.publish(observation_event(obs))
        self.observations.put(obs)

    def _mapper_loop(self) -> None:
        while True:
            obs = self.observations.get(timeout=0.25)
            if obs is None:
                if self.stop_event.is_set() and not self._workers_alive():
                    return
                continue
            for command in self.mapper.update(obs):
                self.bus.publish(command_event(command))

    def _workers_alive(self) -> bool:
        return any(cam.worker.is_alive() for cam in self.cameras.values())

    # ------------------------------------------------------------------ run and stop

    def run(self, duration: float | None = None) -> int:
        """Block until SIGINT/SIGTERM, `duration` seconds, or every camera ended; then stop in order."""
        self._install_signals()
        deadline = time.monotonic() + duration if duration else None
        next_status = time.monotonic() + STATUS_LOG_S
        while not self.stop_event.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                log.info("duration reached, stopping")
                break
            if self.cameras and not any(cam.capture.is_alive() for cam in self.cameras.values()):
                log.info("every camera has ended, stopping")
                break
            if now >= next_status:
                self.log_status()
                next_status = now + STATUS_LOG_S
            self.stop_event.wait(0.2)
        self.stop()
        return 0

    def log_status(self) -> None:
        """One line per camera, at most once a minute: what an operator tails the journal for."""
        for cam in self.cameras.values():
            h = cam.health()
            age = "-" if h.last_frame_age_s is None else f"{h.last_frame_age_s:.1f}s"
            log.info("camera %s: %s, %s, in %.1f fps, analysed %.1f fps, skipped %d, reconnects/h %d, stalls/h %d, "
                     "last frame %s ago", h.name, h.state, h.quality, h.fps_in, h.fps_analysed, h.frames_skipped,
                     h.reconnects_1h, h.stalls_1h, age)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def request_stop(signum: int, _frame: FrameType | None) -> None:
            log.info("%s received, stopping", signal.Signals(signum).name)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)

    def stop(self) -> None:
        self.stop_event.set()
        for cam in self.cameras.values():
            cam.capture.join(JOIN_TIMEOUT_S)
        for cam in self.cameras.values():
            cam.worker.join(JOIN_TIMEOUT_S)
        if self.perception is not None:
            self.perception.close()
        if self._mapper_thread.is_alive():
            self._mapper_thread.join(JOIN_TIMEOUT_S)
        for sink in self.sinks:
            sink.close()
        log.info("stopped (observations dropped before behaviour: %d)", self.counters.observations_dropped)
