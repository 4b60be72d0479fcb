"""Wires the pipeline together and owns its lifetime: one stop event, ordered start, reload and shutdown.

Start: status server (fails fast on a taken port) → models (warm) → outputs → behaviour → cameras → READY=1.
Stop (SIGTERM/SIGINT): STOPPING=1 → cameras → workers → models (finish in-flight batches) → behaviour (drain)
→ outputs (flush) → server. Every join has a share of a ~3 s budget, so a wedged stage cannot hold the process.
Reload (SIGHUP): the signal handler only raises a flag; the main loop re-reads the file (pipeline.service.reload decides what
to restart). The main loop also feeds the systemd watchdog, only while every stage beats (pipeline.service.status).
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from pipeline.behavior.mapper import BehaviorMapper
from pipeline.capture.stats import CameraHealth, connection_quality
from pipeline.capture.thread import CaptureThread
from pipeline.config.app import AppConfig, CameraConfig
from pipeline.outputs.events import Event, camera_event, command_event, observation_event
from pipeline.service.metrics import PipelineMetrics
from pipeline.service.notify import Notifier
from pipeline.inference.perception import Perception
from pipeline.service.preview import PreviewStore
from pipeline.core.redact import mask_secrets
from pipeline.service.lifecycle import close_sinks, join_all, run_bounded
from pipeline.service.reload import ConfigReloader, enabled_cameras
from pipeline.service.server import StatusServer
from pipeline.outputs.base import EventBus, Sink, create_sink
from pipeline.outputs.websocket import EventHub, WebsocketSink
from pipeline.capture.sources import configure_ffmpeg
from pipeline.service.status import stage_problems, status_line
from pipeline.vision.track import IouTracker
from pipeline.core.types import CameraEvent, Detection, EmotionScores, Frame, Observation
from pipeline.service.worker import CameraWorker

log = logging.getLogger(__name__)

OBSERVATION_QUEUE = 256
TICK_S = 0.2
STATUS_LOG_S = 60.0
STATUS_NOTIFY_S = 5.0
RECENT_COMMANDS = 20
CONFIG_EVENT_OUTPUTS = frozenset({"stdout", "websocket"})  # the JSON outputs also carry `config` events
# Shares of the shutdown budget (seconds); the sum stays under 3 s even when every stage is wedged.
STOP_BUDGET = {"cameras": 1.0, "workers": 0.5, "models": 0.4, "behavior": 0.3, "outputs": 0.4, "server": 0.4}
JOIN_TIMEOUT_S = 2.0  # a camera stopped by a reload


class PreviewingWorker(CameraWorker):
    """A CameraWorker that remembers which frame its latest observation describes (for the annotated preview)."""

    last_frame: Frame | None = None

    def observe(self, frame: Frame, faces: list[Detection], scores: list[EmotionScores],
                timings: dict[str, float]) -> Observation:
        self.last_frame = frame
        return super().observe(frame, faces, scores, timings)


@dataclass
class Camera:
    """The two threads of one camera, each with its own stop event (a reload may restart one without the other)."""

    cfg: CameraConfig
    capture: CaptureThread
    worker: CameraWorker
    capture_stop: threading.Event = field(default_factory=threading.Event)
    worker_stop: threading.Event = field(default_factory=threading.Event)
    started_mono: float = field(default_factory=time.monotonic)

    def signal_stop(self) -> None:
        self.worker_stop.set()
        self.capture_stop.set()

    def health(self) -> CameraHealth:
        """The camera's figures right now (for status, metrics and health checks)."""
        now = time.monotonic()
        capture, analysed = self.capture, self.worker.stats.analysed
        age = None if capture.last_frame_mono is None else now - capture.last_frame_mono
        fps_analysed, fps_in = analysed.rate(now), capture.frames_in.rate(now)
        reconnects, stalls = capture.reconnects.count(now), capture.stalls.count(now)
        quality = connection_quality(capture.state, age, self.cfg.reconnect.stall_s, fps_analysed,
                                     min(self.cfg.fps, fps_in or self.cfg.fps), reconnects, stalls)
        return CameraHealth(
            name=self.cfg.name, state=capture.state, source=mask_secrets(str(self.cfg.source)),
            fps_in=fps_in, fps_analysed=fps_analysed, frames_in=capture.frames_in.total,
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
    def __init__(self, cfg: AppConfig, config_path: str | Path | None = None, log_level: str | None = None,
                 notifier: Notifier | None = None) -> None:
        self.cfg = cfg
        self.config_path = Path(config_path) if config_path is not None else None
        self.config_loaded_at = time.time()
        self.stop_event = threading.Event()
        self.counters = DropCounter()
        self.perception: Perception | None = None
        self.sinks: list[Sink] = []
        self.bus = EventBus([])
        self.cameras: dict[str, Camera] = {}  # replaced, never mutated: other threads iterate it
        self.observations = ObservationQueue(OBSERVATION_QUEUE, self.counters)
        self.mapper = BehaviorMapper(cfg.behavior)
        self.mapper_heartbeat = time.monotonic()
        self.mapper_thread = threading.Thread(target=self._mapper_loop, name="behavior", daemon=True)
        self.notifier = notifier or Notifier()
        self.hub = EventHub()
        self.previews = PreviewStore(cfg.server.preview_fps, self._raw_frame)
        self.metrics = PipelineMetrics(self)
        self.server: StatusServer | None = None
        self.recent_commands: deque[Event] = deque(maxlen=RECENT_COMMANDS)
        self.commands_sent = 0
        self.reloads: Counter[str] = Counter(applied=0, rejected=0)
        self.started_mono = time.monotonic()
        self.started = False
        self.ready = False
        self.log_level = log_level  # --log-level, which wins over logging.level on reload too
        self._reload_requested = threading.Event()
        self._stopped = False
        self._withheld: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        """Serve status, load and warm the models, open outputs, start behaviour and cameras; then READY=1.

        Raises ServerStartError (port in use) or a model error; the caller then calls stop().
        """
        self._install_signals()
        if self.cfg.server.enabled:
            self.server = StatusServer(self.cfg.server, self)
            self.server.start()
        self.perception = self.load_perception(self.cfg)
        self.sinks = self.open_sinks(self.cfg.outputs)
        self.bus = EventBus(self.sinks)
        self.configure_hub(self.cfg)
        self.mapper_thread.start()
        self.started = True
        self.set_rtsp_transport(self.cfg)
        for cam_cfg in enabled_cameras(self.cfg).values():
            self.start_camera(cam_cfg)
        self.ready = True
        self.notifier.ready(status_line(self))
        log.info("running: %d camera(s), outputs: %s", len(self.cameras),
                 ", ".join(label for label, _ in self.sink_labels()) or "none")

    @staticmethod
    def load_perception(cfg: AppConfig) -> Perception:
        perception = Perception.from_config(cfg)
        try:
            perception.warm_up()
        except BaseException:
            perception.close()
            raise
        return perception

    def open_sinks(self, outputs: list[Any]) -> list[Sink]:
        sinks: list[Sink] = []
        try:
            for out in outputs:
                sink = create_sink(out)
                if isinstance(sink, WebsocketSink):
                    sink.bind(self.hub)
                if sink.type_name in CONFIG_EVENT_OUTPUTS:
                    sink.events = sink.events | {"config"}
                sink.start()
                sinks.append(sink)
        except BaseException:
            close_sinks(sinks, STOP_BUDGET["outputs"])
            raise
        return sinks

    def configure_hub(self, cfg: AppConfig) -> None:
        self.hub.configure(next((o for o in cfg.outputs if o.type == "websocket"), None))

    @staticmethod
    def set_rtsp_transport(cfg: AppConfig) -> None:
        """FFmpeg's RTSP options are process-wide: set them before any stream opens."""
        transports = {c.rtsp_transport for c in cfg.cameras if c.enabled and c.source_kind == "rtsp"}
        configure_ffmpeg(transports.pop() if transports else "tcp")

    def new_tracker(self) -> IouTracker:
        t = self.cfg.tracking
        return IouTracker(t.iou_threshold, t.max_age_s, t.smoothing_half_life_ms)

    def new_worker(self, capture: CaptureThread, tracker: IouTracker, stop: threading.Event) -> CameraWorker:
        if self.perception is None:
            raise RuntimeError("start() loads the models before cameras")
        return PreviewingWorker(capture, self.perception, tracker, self._on_observation, stop)

    def start_camera(self, cam_cfg: CameraConfig) -> None:
        capture_stop, worker_stop = threading.Event(), threading.Event()
        capture = CaptureThread(cam_cfg, capture_stop, self._on_camera_event)
        worker = self.new_worker(capture, self.new_tracker(), worker_stop)
        self.cameras = {**self.cameras, cam_cfg.name: Camera(cam_cfg, capture, worker, capture_stop, worker_stop)}
        capture.start()
        worker.start()

    def stop_camera(self, name: str) -> None:
        cam = self.cameras[name]
        cam.signal_stop()
        join_all([cam.capture, cam.worker], JOIN_TIMEOUT_S)
        self.cameras = {k: v for k, v in self.cameras.items() if k != name}
        self.previews.forget(name)
        self.metrics.forget_camera(name)

    # ------------------------------------------------------------------ flow

    def _on_camera_event(self, event: CameraEvent) -> None:
        self.bus.publish(camera_event(event))

    def _on_observation(self, obs: Observation) -> None:
        event = observation_event(obs)
        self.bus.publish(event)
        self.observations.put(obs)
        self.metrics.observe(obs, event["latency_ms"]["total"] / 1000.0)
        cam = self.cameras.get(obs.camera)
        frame = getattr(cam.worker, "last_frame", None) if cam is not None else None
        if frame is not None and frame.index == obs.frame_index:
            self.previews.update(frame, obs)

    def _raw_frame(self, camera: str) -> Frame | None:
        cam = self.cameras.get(camera)
        return cam.capture.slot.latest if cam is not None else None

    def _mapper_loop(self) -> None:
        while True:
            self.mapper_heartbeat = time.monotonic()
            obs = self.observations.get(timeout=0.25)
            if obs is None:
                if self.stop_event.is_set() and not self._workers_alive():
                    return
                continue
            for command in self.mapper.update(obs):
                event = command_event(command)
                self.recent_commands.append(event)
                self.commands_sent += 1
                self.bus.publish(event)

    def _workers_alive(self) -> bool:
        return any(cam.worker.is_alive() for cam in self.cameras.values())

    def sink_labels(self) -> list[tuple[str, Sink]]:
        """Each output with a unique label for metrics and status: its type, then type-2, type-3 … for repeats."""
        seen: Counter[str] = Counter()
        labels = []
        for sink in list(self.sinks):
            seen[sink.type_name] += 1
            n = seen[sink.type_name]
            labels.append((sink.type_name if n == 1 else f"{sink.type_name}-{n}", sink))
        return labels

    # ------------------------------------------------------------------ run

    def run(self, duration: float | None = None) -> int:
        """Block until SIGINT/SIGTERM, `duration` seconds, or every camera ended; then stop in order."""
        self._install_signals()
        now = time.monotonic()
        deadline = now + duration if duration else None
        next_log, next_status, next_watchdog = now + STATUS_LOG_S, now + STATUS_NOTIFY_S, now
        while not self.stop_event.is_set():
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self.reload()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                log.info("duration reached, stopping")
                break
            if self.cameras and not any(cam.capture.is_alive() for cam in self.cameras.values()):
                log.info("every camera has ended, stopping")
                break
            next_watchdog = self._feed_watchdog(now, next_watchdog)
            if now >= next_status:
                self.notifier.status(status_line(self))
                next_status = now + STATUS_NOTIFY_S
            if now >= next_log:
                self.log_status()
                next_log = now + STATUS_LOG_S
            self.metrics.pull_batches()
            self.stop_event.wait(TICK_S)
        self.stop()
        return 0

    def _feed_watchdog(self, now: float, due: float) -> float:
        """WATCHDOG=1 when due and every stage beats; a wedged stage withholds it (systemd then restarts us)."""
        problems = stage_problems(self, now)
        keys = frozenset(problems)
        if keys != self._withheld:
            if keys:
                log.error("stage(s) not responding: %s%s", "; ".join(f"{k}: {v}" for k, v in problems.items()),
                          " (withholding the systemd watchdog)" if self.notifier.watchdog_interval_s else "")
            else:
                log.info("every stage responds again")
            self._withheld = keys
        interval = self.notifier.watchdog_interval_s
        if interval is None or now < due or problems:
            return due
        self.notifier.watchdog()
        return now + interval

    def log_status(self) -> None:
        """One line per camera, at most once a minute: what an operator tails the journal for."""
        for cam in list(self.cameras.values()):
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

        def request_reload(_signum: int, _frame: FrameType | None) -> None:
            self._reload_requested.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGHUP, request_reload)

    # ------------------------------------------------------------------ reload

    def request_reload(self) -> None:
        """What SIGHUP does: ask the main loop to reload (from any thread)."""
        self._reload_requested.set()

    def reload(self) -> bool:
        """Re-read and validate the config file; apply it, or keep the running one and say why. True if applied."""
        return ConfigReloader(self).reload()

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Ordered shutdown within ~3 s; safe to call twice and after a failed start()."""
        if self._stopped:
            return
        self._stopped = True
        began = time.monotonic()
        self.notifier.stopping()
        self.stop_event.set()
        cams = list(self.cameras.values())
        for cam in cams:
            cam.signal_stop()
        join_all([cam.capture for cam in cams], STOP_BUDGET["cameras"])
        join_all([cam.worker for cam in cams], STOP_BUDGET["workers"])
        if self.perception is not None:
            run_bounded(self.perception.close, STOP_BUDGET["models"], "models")
        if self.mapper_thread.is_alive():
            join_all([self.mapper_thread], STOP_BUDGET["behavior"])
        close_sinks(self.sinks, STOP_BUDGET["outputs"])
        if self.server is not None:
            self.server.stop(STOP_BUDGET["server"])
        self.notifier.close()
        log.info("stopped in %.2f s (observations dropped before behaviour: %d)", time.monotonic() - began,
                 self.counters.observations_dropped)

