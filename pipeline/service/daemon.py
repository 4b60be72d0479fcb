"""Wires the pipeline together and owns its lifetime: one stop event, ordered start, reload and shutdown.

Start: status server (fails fast on a taken port) → models (warm) → outputs → behaviour → cameras → READY=1.
Stop (SIGTERM/SIGINT): STOPPING=1 → cameras → workers → models (finish in-flight batches) → behaviour (drain)
→ outputs (flush) → server. Every join has a share of a ~3 s budget, so a wedged stage cannot hold the process.
Reload (SIGHUP): the signal handler only raises a flag; the main loop re-reads the file, pipeline.service.reload
decides what to restart, and the daemon applies that plan itself (no other module assigns the daemon's fields).
The main loop also feeds the systemd watchdog, only while every stage beats (pipeline.service.status).
Everything that reports on the daemon (status, metrics, the status server) reads a `snapshot()`, never the daemon.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from pipeline.behavior.avatar_mapper import BehaviorRouter
from pipeline.behavior.lookat import LookAt, LookTarget
from pipeline.behavior.presence import Greeter, Presence, PresenceChange, VisitorTally
from pipeline.capture.source_base import VideoSource
from pipeline.capture.thread import CaptureThread
from pipeline.config.app import AppConfig, CameraConfig, ConfigError, load_config
from pipeline.core.heap import HeapTrimmer
from pipeline.core.redact import mask_secrets
from pipeline.core.types import CameraEvent, Command, Frame, Observation
from pipeline.inference.backend import BackendError
from pipeline.inference.perception import Analyzer
from pipeline.modelprep.manifest import ManifestError, ModelError
from pipeline.outputs.base import EventBus, Sink
from pipeline.outputs.events import (
    Event,
    camera_event,
    command_event,
    config_event,
    current_json,
    lookat_event,
    observation_event,
    presence_event,
    snapshot_event,
)
from pipeline.outputs.history import EventHistory
from pipeline.outputs.websocket import EventHub
from pipeline.service.cameras import (
    Camera,
    DropCounter,
    ObservationQueue,
    PreviewingWorker,
    new_camera,
    stop_cameras,
)
from pipeline.service.config_editor import ConfigEditor
from pipeline.service.groups import (
    CameraGroup,
    GroupHandlers,
    start_groups,
    stop_groups,
)
from pipeline.service.lifecycle import close_sinks, join_all, run_bounded
from pipeline.service.logs import setup_logging
from pipeline.service.metrics import PipelineMetrics
from pipeline.service.notify import Notifier
from pipeline.service.parts import (
    configure_hub,
    label_sinks,
    limit_opencv_threads,
    load_perception,
    new_tracker,
    open_all_sinks,
    open_camera_source,
    set_rtsp_transport,
    warn_if_events_unseen,
)
from pipeline.service.preview import PreviewStore, RenderedPreview
from pipeline.service.procs import ProcessView, process_view
from pipeline.service.reload import ReloadPlan, enabled_cameras, plan_reload
from pipeline.service.server import ServerStartError, StatusServer
from pipeline.service.snapshot import DaemonSnapshot, ModelView, OutputView, model_view
from pipeline.service.status import stage_problems, status_line
from pipeline.service.trial import send_trial, streams, trial_command
from pipeline.service.worker import CameraWorker

if TYPE_CHECKING:
    from pipeline.vision.track import IouTracker

log = logging.getLogger(__name__)
reload_log = logging.getLogger("pipeline.service.reload")  # reload lines keep the logger name they always had

OBSERVATION_QUEUE = 256
MAPPER_WAKE_S = 0.25  # behaviour wakes at least this often without observations (idle is a matter of time)
LEFT_STREAMING = frozenset({"ended", "stalled", "reconnecting", "stopped"})  # a camera's faces are gone
TICK_S = 0.2
STATUS_LOG_S = 60.0
STATUS_NOTIFY_S = 5.0
RECENT_COMMANDS = 20
# Shares of the shutdown budget (seconds); the sum stays under 3 s even when every stage is wedged.
STOP_BUDGET = {"cameras": 1.0, "workers": 0.5, "models": 0.4, "behavior": 0.3, "outputs": 0.4, "server": 0.4}
JOIN_TIMEOUT_S = 2.0  # a camera or worker stopped by a reload
CLOSE_TIMEOUT_S = 2.0  # models and outputs replaced by a reload
# What a reload may fail with and still leave the running configuration in force, reported as one line each.
RELOAD_ERRORS = (ModelError, BackendError, ManifestError, ServerStartError, ValueError, OSError)


def _startup_signals(replaced: Iterable[object]) -> list[int]:
    """The signals a replaced start-up handler (run_pipeline.StartupSignals) recorded, taken over by the caller."""
    for handler in replaced:
        take = getattr(handler, "take_pending", None)
        if callable(take):
            return list(take())
    return []


class Daemon:
    def __init__(self, cfg: AppConfig, config_path: str | Path | None = None, log_level: str | None = None,
                 notifier: Notifier | None = None) -> None:
        self.cfg = cfg
        self.config_path = Path(config_path) if config_path is not None else None
        self.config_loaded_at = time.time()
        self.stop_event = threading.Event()
        self.counters = DropCounter()
        self.perception: Analyzer | None = None
        self.sinks: list[Sink] = []
        self.history = EventHistory()  # the commands, camera changes and reloads the page's history shows
        self.bus = EventBus([], self.history)
        self.cameras: dict[str, Camera] = {}  # replaced, never mutated: other threads iterate it
        self.groups: list[CameraGroup] = []  # inference.processes > 1: the cameras run in these processes instead
        self.observations = ObservationQueue(OBSERVATION_QUEUE, self.counters)
        self._cameras_left: queue.SimpleQueue[str] = queue.SimpleQueue()  # camera events → the behaviour thread
        self.mapper = BehaviorRouter(cfg.behavior, cfg.avatars)
        self.lookat = LookAt(self.mapper, {c.name: c.placement for c in cfg.cameras})
        self.presence = Presence(cfg.behavior.presence)
        self.tally = VisitorTally()  # visitors per hour, dwell and looked-at share, for the status page
        self.greeter = Greeter()
        self.current: dict[str, Event] = {}  # avatar (else camera) → its last command, for late joiners
        self.looks: dict[str, Event] = {}  # avatar (else camera) → its last lookat event, for late joiners
        self.mapper_heartbeat = time.monotonic()
        self.mapper_thread = threading.Thread(target=self._mapper_loop, name="behavior", daemon=True)
        self.notifier = notifier or Notifier()
        self.hub = EventHub()
        self.hub.snapshot = self.ws_snapshot
        self.previews = PreviewStore(cfg.server.preview_fps, self._raw_frame, self._group_preview, self._looked_at)
        self.metrics = PipelineMetrics(self.snapshot)
        self.server: StatusServer | None = None
        self.recent_commands: deque[Event] = deque(maxlen=RECENT_COMMANDS)
        self.commands_sent = 0
        self.reloads: Counter[str] = Counter(applied=0, rejected=0)
        self.last_reload: dict[str, Any] | None = None  # the newest reload's outcome, whatever asked for it
        self._reload_waiters: list[tuple[str, Future[dict[str, Any]]]] = []  # (trigger, outcome), under the lock
        self._reload_lock = threading.Lock()
        self._reload_trigger = "signal"  # what asked for the reload running now
        self.started_mono = time.monotonic()
        self.started = False
        self.ready = False
        self.log_level = log_level  # --log-level, which wins over logging.level on reload too
        self._reload_requested = threading.Event()
        self._stopped = False
        self._withheld: frozenset[str] = frozenset()
        self.heap = HeapTrimmer("daemon")  # freed heap back to the system every inference.trim_heap_s

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        """Serve status, load and warm the models, open outputs, start behaviour and cameras; then READY=1.

        Raises ServerStartError (port in use) or a model error; the caller then calls stop().
        """
        self._install_signals()
        if self.stop_event.is_set():  # SIGTERM/SIGINT while the process started: start nothing, run() stops at once
            return
        warn_if_events_unseen(self.cfg, self.config_path)
        if self.cfg.server.enabled:
            self.server = self.new_server(self.cfg)
            self.server.start()
        grouped = self.cfg.inference.processes > 1
        groups = self.new_groups(self.cfg) if grouped else []
        self.groups = groups  # stopped by stop() whatever fails next
        if not grouped:
            self.perception = load_perception(self.cfg)
        self.sinks = open_all_sinks(self.cfg, self.hub, STOP_BUDGET["outputs"])
        self.bus = EventBus(self.sinks, self.history)
        configure_hub(self.hub, self.cfg)
        self.mapper_thread.start()
        self.started = True
        set_rtsp_transport(self.cfg)
        limit_opencv_threads(self.cfg)
        if grouped:
            for group in groups:
                group.go()
        else:
            for cam_cfg in enabled_cameras(self.cfg).values():
                self.start_camera(cam_cfg)
        self.ready = True
        self.notifier.ready(status_line(self.snapshot()))
        log.info("running: %d camera(s), outputs: %s", len(enabled_cameras(self.cfg)),
                 ", ".join(label for label, _ in label_sinks(self.sinks)) or "none")

    def new_server(self, cfg: AppConfig) -> StatusServer:
        """A status server (not started) for `cfg.server`, given only what it serves, never the daemon."""
        return StatusServer(cfg.server, self.snapshot, self.metrics.render, self.hub, self.previews,
                            self.config_editor(), self.send_trial, self.history)

    def new_groups(self, cfg: AppConfig) -> list[CameraGroup]:
        """The camera group processes of `cfg` with their models loaded, cameras not yet started (each group's go())."""
        handlers = GroupHandlers(self._on_observation, self._publish_camera_event)
        return start_groups(cfg, list(enabled_cameras(cfg).values()), handlers, self.stop_event, self.log_level)

    def new_worker(self, capture: CaptureThread, tracker: IouTracker, stop: threading.Event) -> CameraWorker:
        if self.perception is None:
            raise RuntimeError("start() loads the models before cameras")
        return PreviewingWorker(capture, self.perception, tracker, self._on_observation, stop)

    def _open_source(self, cam_cfg: CameraConfig) -> VideoSource:
        """Open a camera's source; `decode: auto` decodes on the GPU while the models run on one (read at each
        open, so a reload that moves the models takes effect at each camera's next reconnect or restart)."""
        return open_camera_source(self.cfg.inference, cam_cfg)

    def start_camera(self, cam_cfg: CameraConfig) -> None:
        cam = new_camera(cam_cfg, self._on_camera_event, self._open_source,
                         lambda capture, stop: self.new_worker(capture, new_tracker(self.cfg), stop))
        self.cameras = {**self.cameras, cam_cfg.name: cam}
        cam.start()

    def stop_camera(self, name: str) -> None:
        cam = self.cameras[name]
        cam.signal_stop()
        join_all([cam.capture, cam.worker], JOIN_TIMEOUT_S)
        self.cameras = {k: v for k, v in self.cameras.items() if k != name}
        self.previews.forget(name)
        self.metrics.forget_camera(name)
        self.tally.forget(name)

    # ------------------------------------------------------------------ flow

    def _on_camera_event(self, event: CameraEvent) -> None:
        cam = self.cameras.get(event.camera)
        if cam is not None:
            cam.note_event(event)  # keeps the failure reason for the camera's view (status page, /api/status)
        self._publish_camera_event(event)

    def _publish_camera_event(self, event: CameraEvent) -> None:
        """A camera's event to the outputs and behaviour (a group process noted its failure reason itself)."""
        self.bus.publish(camera_event(event))
        if event.state in LEFT_STREAMING:
            self._cameras_left.put(event.camera)  # the mapper is the behaviour thread's: it reads this queue

    def _on_observation(self, obs: Observation) -> None:
        event = observation_event(obs)
        self.bus.publish(event)
        self.observations.put(obs)
        self.metrics.observe(obs, event["latency_ms"]["total"] / 1000.0)
        cam = self.cameras.get(obs.camera)
        frame = cam.analysed_frame(obs) if cam is not None else None
        if frame is not None:
            self.previews.update(frame, obs)

    def _looked_at(self, camera: str) -> int | None:
        """The track the avatar looks at on `camera` now (its stream's last look target there), for the tile."""
        for look in self.looks.values():
            if look["camera"] == camera and look["target"] is not None:
                return int(look["target"])
        return None

    def _group_preview(self, camera: str) -> RenderedPreview | None:
        """A camera group's camera: its preview as the group renders it (frames never leave the group)."""
        for group in self.groups:
            if any(cam.name == camera for cam in group.cameras):
                return group.preview(camera)
        return None

    def _raw_frame(self, camera: str) -> Frame | None:
        cam = self.cameras.get(camera)
        return cam.capture.slot.latest if cam is not None else None

    def _mapper_loop(self) -> None:
        """Behaviour advances on observations and on time: it wakes at least every MAPPER_WAKE_S, so a camera that
        ended, stalled or dropped out (and sends no observation) still has its avatar return to neutral."""
        while True:
            self.mapper_heartbeat = time.monotonic()
            obs = self.observations.get(timeout=MAPPER_WAKE_S)
            while not self._cameras_left.empty():
                camera = self._cameras_left.get_nowait()
                self.mapper.camera_left(camera)
                self._publish_presence(self.presence.camera_left(camera))
            if obs is not None:
                self._publish_commands(self.mapper.update(obs))
                self._publish_looks([self.lookat.observe(obs)])
                self._publish_presence(self.presence.update(obs))
            self._publish_commands(self.mapper.tick(time.monotonic(), time.time()))
            self._publish_looks(self.lookat.tick(self.mapper.cameras()))
            self._publish_presence(self.presence.tick(time.monotonic()))
            self.metrics.looked_at_seconds(self.tally.advance(time.monotonic(), self.presence.looking_cameras(),
                                                              self.presence.cameras()))
            if obs is None and self.stop_event.is_set() and not self._workers_alive():
                return

    def _publish_commands(self, commands: list[Command]) -> None:
        for command in commands:
            event = command_event(command)
            self.current = {**self.current, command.avatar or command.camera: current_json(event)}
            self.recent_commands.append(event)
            self.commands_sent += 1
            self.bus.publish(event)

    def _publish_presence(self, changes: list[PresenceChange]) -> None:
        """Each visitor's arrival, departure and looks as events, and the greeting an arrival may bring."""
        for change in changes:
            stream, avatar, behavior = self.mapper.stream_of(change.camera)
            self.bus.publish(presence_event(change.kind, change.camera, avatar, change.track_id, change.t_wall,
                                            change.dwell_s))
            self.metrics.presence(change)
            self.tally.record(change, time.monotonic())
            greeting = self.greeter.greet(change, stream, avatar, behavior, time.monotonic())
            if greeting is not None:
                self._publish_commands([greeting])

    def _publish_looks(self, targets: Iterable[LookTarget | None]) -> None:
        for t in targets:
            if t is not None:
                event = lookat_event(t.stream, t.avatar, t.camera, t.track_id, t.yaw_deg, t.pitch_deg, t.point_m)
                self.looks = {**self.looks, t.stream: event}  # one assignment: the server's loop reads it
                self.bus.publish(event)

    def _neutral_at_stop(self) -> None:
        """Every stream whose avatar was last told something else gets its neutral rule (reason "stop") before the
        outputs close, so an avatar does not keep its last face after the daemon has gone."""
        if not self.started:
            return
        known = set(streams(self.cfg))
        commands = [replace(trial_command(self.cfg, stream, "neutral"), reason="stop")
                    for stream, last in self.current.items()
                    if last and last.get("emotion") != "neutral" and stream in known]
        self._publish_commands(commands)

    def send_trial(self, stream: str, expression: str, weight: float | None = None) -> Event:
        """The status page's "send test expression": the rules' command for `expression` to `stream`'s outputs now,
        neutral again after a few seconds (pipeline.service.trial). UnknownStream for a name that is not there."""
        command = send_trial(self.cfg, lambda c: self._publish_commands([c]), stream, expression, weight)
        log.info("test expression %s sent to %s", expression, stream)
        return command_event(command)

    def ws_snapshot(self) -> Event:
        """What a /ws client gets first (on the server's loop, so only plain reads): every camera's state and each
        stream's (avatar's, or a camera's in no avatar) current command and look target, None before the first."""
        cameras = {name: str(cam.capture.state) for name, cam in self.cameras.items()}
        current, looks, mapper = self.current, self.looks, self.mapper
        streams = mapper.names(c.name for c in self.cfg.cameras if c.enabled)
        return snapshot_event(cameras, {name: current.get(name) for name in streams},
                              {name: looks.get(name) for name in streams})

    def _workers_alive(self) -> bool:
        return any(cam.worker.is_alive() for cam in self.cameras.values()) or any(g.alive() for g in self.groups)

    # ------------------------------------------------------------------ snapshot

    def snapshot(self) -> DaemonSnapshot:
        """The read-only picture status, metrics, the server and the watchdog read; built per request, so cheap."""
        now = time.monotonic()
        cfg, server = self.cfg, self.server
        return DaemonSnapshot(
            taken_mono=now, cfg=cfg, ready=self.ready, started=self.started, started_mono=self.started_mono,
            config_path=str(self.config_path) if self.config_path else None,
            config_loaded_at=self.config_loaded_at, reloads=dict(self.reloads), commands_sent=self.commands_sent,
            last_reload=dict(self.last_reload) if self.last_reload else None,
            streams=tuple(streams(cfg)), current=dict(self.current),
            recent_commands=tuple(self.recent_commands),
            observations_dropped=self.counters.observations_dropped + sum(g.observations_dropped for g in self.groups),
            preview_fps=cfg.server.preview_fps, preview_renders=self.previews.renders, ws_enabled=self.hub.enabled,
            ws_clients=self.hub.client_count, ws_clients_dropped=self.hub.clients_dropped,
            mapper_alive=self.mapper_thread.is_alive(), mapper_heartbeat=self.mapper_heartbeat,
            server_present=server is not None, server_alive=server is not None and server.is_alive(),
            cameras=tuple(cam.view(now) for cam in list(self.cameras.values()))
            + tuple(view for group in self.groups for view in group.view_cameras()),
            models=self._model_views(), outputs=self._output_views(), visitors=self.tally.summary(now),
            processes=self._process_views())

    def _process_views(self) -> tuple[ProcessView, ...]:
        own = process_view("daemon", os.getpid())
        return (own, *(process_view(group.name, pid) for group in self.groups if (pid := group.pid) is not None))

    def _model_views(self) -> tuple[ModelView, ...]:
        remote = tuple(model for group in self.groups for model in group.models)
        perception = self.perception
        if perception is None:
            return remote
        return tuple(model_view(role, model) for role, model in perception.models()) + remote

    def _output_views(self) -> tuple[OutputView, ...]:
        return tuple(OutputView(label, sink.type_name, sink.sent, sink.dropped, sink.failed, sink.is_alive(),
                                sink.delivery, sink.target, sink.messages, sink.messages_failed,
                                sink.streamed_weights())
                     for label, sink in label_sinks(self.sinks))

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
                self._reload_for_waiters()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                log.info("duration reached, stopping")
                break
            if self._every_camera_ended():
                log.info("every camera has ended, stopping")
                break
            snapshot = self.snapshot()
            next_watchdog = self._feed_watchdog(snapshot, now, next_watchdog)
            if now >= next_status:
                self.notifier.status(status_line(snapshot))
                next_status = now + STATUS_NOTIFY_S
            if now >= next_log:
                self.log_status()
                next_log = now + STATUS_LOG_S
            self.metrics.pull_batches(snapshot.models)
            self.heap.tick(self.cfg.inference.trim_heap_s)
            self.stop_event.wait(TICK_S)
        self.stop()
        return 0

    def _every_camera_ended(self) -> bool:
        if self.groups:
            return all(group.ended for group in self.groups)
        return bool(self.cameras) and not any(cam.capture.is_alive() for cam in self.cameras.values())

    def _feed_watchdog(self, snapshot: DaemonSnapshot, now: float, due: float) -> float:
        """WATCHDOG=1 when due and every stage beats; a wedged stage withholds it (systemd then restarts us)."""
        problems = stage_problems(snapshot, now)
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

        previous = [signal.signal(signal.SIGTERM, request_stop), signal.signal(signal.SIGINT, request_stop),
                    signal.signal(signal.SIGHUP, request_reload)]
        # run_pipeline.py's StartupSignals remembered what came before the daemon existed; honour it now
        for signum in _startup_signals(previous):
            if signum == signal.SIGHUP:
                log.info("SIGHUP received before the daemon started: nothing to reload yet, ignored")
            else:
                request_stop(signum, None)

    # ------------------------------------------------------------------ reload

    def request_reload(self, trigger: str = "signal") -> Future[dict[str, Any]]:
        """Ask the main loop to reload (from any thread: SIGHUP, or a save on the status page); the future gets the
        reload's outcome (`last_reload`). Requests made while one waits are served by the same reload."""
        outcome: Future[dict[str, Any]] = Future()
        with self._reload_lock:
            self._reload_waiters.append((trigger, outcome))
        self._reload_requested.set()
        return outcome

    def _reload_for_waiters(self) -> None:
        with self._reload_lock:
            waiters, self._reload_waiters = self._reload_waiters, []
        triggers = sorted({trigger for trigger, _ in waiters}) or ["signal"]
        self.reload(trigger="+".join(triggers))
        for _, outcome in waiters:
            outcome.set_result(dict(self.last_reload or {}))

    def config_editor(self) -> ConfigEditor | None:
        """What the status page edits: the file this daemon was started with (none for a config object)."""
        if self.config_path is None:
            return None
        return ConfigEditor(Path(self.config_path), self.request_reload, lambda: self.cfg.server.config_editor)

    def reload(self, trigger: str = "signal") -> bool:
        """Re-read and validate the config file; apply it, or keep the running one and say why. True if applied.
        The outcome is kept in `last_reload` (and /api/status's config.last_reload)."""
        self._reload_trigger = trigger
        if self.config_path is None:
            reload_log.warning("SIGHUP: no configuration file to reload (the daemon was given a config object)")
            return False
        reload_log.info("SIGHUP: reloading %s", self.config_path)
        self.notifier.reloading()
        try:
            new = load_config(self.config_path)
            plan = plan_reload(self.cfg, new)
            self._apply(new, plan)
        except ConfigError as exc:
            self._reject([issue.format() for issue in exc.issues])
            return False
        except RELOAD_ERRORS as exc:
            self._reject([mask_secrets(str(exc))])
            return False
        except Exception as exc:  # noqa: BLE001 - a failed reload must never end a running daemon
            reload_log.error("reload failed unexpectedly: %s", exc, exc_info=reload_log.isEnabledFor(logging.DEBUG))
            self._reject([mask_secrets(f"{type(exc).__name__}: {exc}")])
            return False
        finally:
            self.notifier.ready(status_line(self.snapshot()))
        self.reloads["applied"] += 1
        self.config_loaded_at = time.time()
        changes = plan.describe()
        self.last_reload = {"result": "applied", "at": round(time.time(), 3), "trigger": trigger,
                            "changes": changes, "errors": []}
        reload_log.info("configuration %s applied: %s", self.config_path, "; ".join(changes))
        self.bus.publish(config_event("applied", self.config_path, changes=changes))
        return True

    def _reject(self, errors: list[str]) -> None:
        self.reloads["rejected"] += 1
        self.last_reload = {"result": "rejected", "at": round(time.time(), 3),
                            "trigger": self._reload_trigger, "changes": [], "errors": errors}
        reload_log.error("configuration %s rejected, the running configuration stays in force:", self.config_path)
        for line in errors:
            reload_log.error("%s", line)
        self.bus.publish(config_event("rejected", self.config_path, errors=errors))

    def _apply(self, new: AppConfig, plan: ReloadPlan) -> None:
        """Prepare what can fail (models, outputs, server) first; only then swap, so a failure changes nothing.
        With camera groups, new group processes load their models beside the running ones (which keep analysing
        until the swap)."""
        grouped, regroup = new.inference.processes > 1, self._regroups(new, plan)
        perception = load_perception(new) if plan.models and not grouped else None
        sinks: list[Sink] | None = None
        groups: list[CameraGroup] | None = None
        try:
            if regroup and grouped:
                groups = self.new_groups(new)
            if plan.outputs:
                sinks = open_all_sinks(new, self.hub, STOP_BUDGET["outputs"])
            if plan.server == "restart":
                self._restart_server(new)
        except BaseException:
            if perception is not None:
                perception.close()
            if sinks:
                close_sinks(sinks, CLOSE_TIMEOUT_S)
            if groups:
                stop_groups(groups, CLOSE_TIMEOUT_S)
            raise
        self._swap(new, plan, perception, sinks, regroup, groups)

    def _regroups(self, new: AppConfig, plan: ReloadPlan) -> bool:
        """Whether the reload moves cameras into new group processes or back into this one: with groups before or
        after it, any change of cameras, models or tracking starts the camera side over."""
        touched = plan.models or plan.tracking or plan.added or plan.removed or plan.changed
        return bool(touched) and (bool(self.groups) or new.inference.processes > 1)

    def _swap(self, new: AppConfig, plan: ReloadPlan, perception: Analyzer | None, sinks: list[Sink] | None,
              regroup: bool = False, groups: list[CameraGroup] | None = None) -> None:
        """The part of a reload that cannot fail: settings, outputs, behaviour, then cameras and workers."""
        if plan.server == "live" and self.server is not None:
            self.server.update(new.server)
        self.previews.fps = new.server.preview_fps
        if sinks is not None:
            old_sinks, self.sinks = self.sinks, sinks
            self.bus.sinks = sinks
            configure_hub(self.hub, new)
            close_sinks(old_sinks, CLOSE_TIMEOUT_S)
        if plan.logging:
            setup_logging(self.log_level or new.logging.level, new.logging.format)
        if plan.behavior:
            self.mapper = BehaviorRouter(new.behavior, new.avatars)
            self.presence = Presence(new.behavior.presence)  # visitors in view arrive again (once)
            self.current = {}
        self.lookat = LookAt(self.mapper, {c.name: c.placement for c in new.cameras})  # placements may have changed
        self.cfg = new
        if regroup:
            self._regroup(new, perception, groups)
            return
        for name in plan.removed + plan.changed:
            self.stop_camera(name)
        if perception is not None or plan.tracking:
            self._restart_workers(perception, fresh_trackers=plan.tracking)
        set_rtsp_transport(new)
        cams = enabled_cameras(new)
        for name in plan.changed + plan.added:
            self.start_camera(cams[name])

    def _regroup(self, new: AppConfig, perception: Analyzer | None, groups: list[CameraGroup] | None) -> None:
        """Stop the cameras wherever they run (group processes or this one), then start them as `new` says: in the
        new groups (prepared by _apply), or here on `perception`."""
        stop_groups(self.groups, JOIN_TIMEOUT_S)
        kept = enabled_cameras(new)
        for cam_cfg in [c for group in self.groups for c in group.cameras if c.name not in kept]:
            self.previews.forget(cam_cfg.name)  # a camera gone from the config: its series and preview go too
            self.metrics.forget_camera(cam_cfg.name)
            self.tally.forget(cam_cfg.name)
        self.groups = []
        for name in list(self.cameras):
            self.stop_camera(name)
        old, self.perception = self.perception, perception  # None when the groups hold the models
        if old is not None:
            run_bounded(old.close, CLOSE_TIMEOUT_S, "previous models")
        if groups is not None:
            self.groups = groups
            for group in groups:
                group.go()
            return
        set_rtsp_transport(new)
        for cam_cfg in enabled_cameras(new).values():
            self.start_camera(cam_cfg)

    def _restart_server(self, new: AppConfig) -> None:
        """Host, port or enabled changed: rebind. If the new address fails, the old server comes back."""
        old = self.server
        if old is not None:
            old.stop()
            self.server = None
        if not new.server.enabled:
            return
        try:
            server = self.new_server(new)
            server.start()
        except ServerStartError:
            if old is not None:
                revived = self.new_server(self.cfg)
                try:
                    revived.start()
                    self.server = revived
                except ServerStartError as exc:
                    reload_log.error("the previous status server could not be restarted either: %s", exc)
            raise
        self.server = server

    def _restart_workers(self, perception: Analyzer | None, fresh_trackers: bool) -> None:
        """New workers for every running camera (new models and/or trackers); captures keep running."""
        cams = list(self.cameras.values())
        for cam in cams:
            cam.worker_stop.set()
        join_all([cam.worker for cam in cams], JOIN_TIMEOUT_S)
        if perception is not None:
            old, self.perception = self.perception, perception
            if old is not None:
                run_bounded(old.close, CLOSE_TIMEOUT_S, "previous models")
        replaced = {}
        for cam in cams:
            tracker = new_tracker(self.cfg) if fresh_trackers else cam.worker.tracker
            stop = threading.Event()
            worker = self.new_worker(cam.capture, tracker, stop)
            replaced[cam.cfg.name] = cam.with_worker(worker, stop)
            worker.start()
        self.cameras = {**self.cameras, **replaced}

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Ordered shutdown within ~3 s; safe to call twice and after a failed start()."""
        if self._stopped:
            return
        self._stopped = True
        began = time.monotonic()
        self.notifier.stopping()
        self.stop_event.set()
        stop_cameras(list(self.cameras.values()), STOP_BUDGET["cameras"], STOP_BUDGET["workers"])
        stop_groups(self.groups, STOP_BUDGET["cameras"] + STOP_BUDGET["workers"] + STOP_BUDGET["models"])
        if self.perception is not None:
            run_bounded(self.perception.close, STOP_BUDGET["models"], "models")
        if self.mapper_thread.is_alive():
            join_all([self.mapper_thread], STOP_BUDGET["behavior"])
        self._neutral_at_stop()
        close_sinks(self.sinks, STOP_BUDGET["outputs"])
        if self.server is not None:
            self.server.stop(STOP_BUDGET["server"])
        self.notifier.close()
        log.info("stopped in %.2f s (observations dropped before behaviour: %d)", time.monotonic() - began,
                 self.counters.observations_dropped)
