"""The daemon's per-camera parts: a camera's two threads, the previewing worker, and the bounded observation queue.

Kept apart from pipeline.service.daemon so that file stays about wiring and lifetime; nothing here knows the daemon.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pipeline.capture.stats import CameraHealth, connection_quality
from pipeline.capture.thread import CaptureThread
from pipeline.core.redact import mask_secrets
from pipeline.service.lifecycle import join_all
from pipeline.service.snapshot import CameraView
from pipeline.service.worker import CameraWorker
from pipeline.vision.follow import BatchLook

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline.capture.source_base import VideoSource
    from pipeline.config.app import CameraConfig
    from pipeline.core.types import (
        CameraEvent,
        Detection,
        EmotionScores,
        Frame,
        Observation,
    )

# The capture's reconnecting detail is "REASON; retry in 2.0 s": the delay is stale a moment later, the reason is not.
_RETRY_SUFFIX = re.compile(r";\s*retry in [0-9.]+ s$")


class PreviewingWorker(CameraWorker):
    """A CameraWorker that remembers which frame its latest observation describes (for the annotated preview)."""

    last_frame: Frame | None = None

    def observe(self, frame: Frame, faces: list[Detection], scores: list[EmotionScores],
                timings: dict[str, float], tracked: list[int] | None = None,
                look: BatchLook | None = None) -> Observation:
        self.last_frame = frame
        return super().observe(frame, faces, scores, timings, tracked, look)


@dataclass
class Camera:
    """The two threads of one camera, each with its own stop event (a reload may restart one without the other)."""

    cfg: CameraConfig
    capture: CaptureThread
    worker: CameraWorker
    capture_stop: threading.Event = field(default_factory=threading.Event)
    worker_stop: threading.Event = field(default_factory=threading.Event)
    started_mono: float = field(default_factory=time.monotonic)
    last_failure: str | None = None  # why the camera last failed (masked), for status; kept after a recovery
    last_failure_ts: float | None = None

    def note_event(self, event: CameraEvent) -> None:
        """Remember why the camera failed, from its capture's reconnecting or stalled event (otherwise only logged).

        A stall is followed by a `reconnecting` event whose reason is just "stalled": the stall's own detail says
        more, so that one is kept."""
        if event.state not in ("reconnecting", "stalled"):
            return
        reason = _RETRY_SUFFIX.sub("", mask_secrets(event.detail)).strip() or event.state
        if event.state == "stalled":
            reason = f"stalled: {reason}"
        elif reason == "stalled" and self.last_failure and self.last_failure.startswith("stalled"):
            return
        self.last_failure, self.last_failure_ts = reason, event.ts

    def start(self) -> None:
        self.capture.start()
        self.worker.start()

    def signal_stop(self) -> None:
        self.worker_stop.set()
        self.capture_stop.set()

    def analysed_frame(self, obs: Observation) -> Frame | None:
        """The frame `obs` describes, when this camera's worker still holds it (for the annotated preview), taken:
        the worker lets go of it, so the preview store alone decides whether its pixels stay (a frame on the GPU
        holds one of the camera's pool buffers). Called from the worker's own publish, once per observation."""
        worker = self.worker
        frame = getattr(worker, "last_frame", None)
        if isinstance(worker, PreviewingWorker):
            worker.last_frame = None
        return frame if frame is not None and frame.index == obs.frame_index else None

    def with_worker(self, worker: CameraWorker, stop: threading.Event) -> Camera:
        """The same camera (same capture, same start time) analysed by a new worker; a reload swaps it in."""
        return replace(self, worker=worker, worker_stop=stop)

    def health(self, now: float | None = None) -> CameraHealth:
        """The camera's figures right now (for status, metrics and health checks)."""
        now = time.monotonic() if now is None else now
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

    def view(self, now: float) -> CameraView:
        """This camera as the snapshot shows it: copied figures, no reference to a thread."""
        capture, worker = self.capture, self.worker
        stats = worker.stats
        return CameraView(
            name=self.cfg.name, stall_s=self.cfg.reconnect.stall_s, fps_max=self.cfg.fps, health=self.health(now),
            capture_alive=capture.is_alive(), state=capture.state, last_frame_mono=capture.last_frame_mono,
            started_mono=self.started_mono, slot_closed=capture.slot.closed, worker_alive=worker.is_alive(),
            worker_heartbeat=stats.heartbeat, latency_ms=stats.last_latency_ms, stalls_total=capture.stalls.total,
            busy_skips=stats.skipped_busy, errors=stats.errors, last_failure=self.last_failure,
            last_failure_ts=self.last_failure_ts)


def new_camera(cam_cfg: CameraConfig, on_event: Callable[[CameraEvent], None],
               open_source: Callable[[CameraConfig], VideoSource],
               new_worker: Callable[[CaptureThread, threading.Event], CameraWorker]) -> Camera:
    """A camera's capture thread and worker (not started), each with its own stop event."""
    capture_stop, worker_stop = threading.Event(), threading.Event()
    capture = CaptureThread(cam_cfg, capture_stop, on_event, open_source)
    return Camera(cam_cfg, capture, new_worker(capture, worker_stop), capture_stop, worker_stop)


def stop_cameras(cams: list[Camera], captures_s: float, workers_s: float) -> None:
    """Signal every camera at once, then join the captures, then the workers, each set within its budget."""
    for cam in cams:
        cam.signal_stop()
    join_all([cam.capture for cam in cams], captures_s)
    join_all([cam.worker for cam in cams], workers_s)


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
                except queue.Empty:  # the consumer took one meanwhile: there is room now
                    pass

    def get(self, timeout: float) -> Observation | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
