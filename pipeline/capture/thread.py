"""Cameras: video sources, and the capture thread that keeps one camera's newest frame in a one-slot box.

Capture never waits for analysis: it overwrites the slot, and the worker takes the newest frame when it is ready.
A source that fails to open, stops delivering (stall) or errors is released and reopened with exponential backoff and
jitter, while every other camera keeps running.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.capture.sources import (
    OPEN_TIMEOUT_MS,
    SourceEnded,
    SourceError,
    VideoSource,
    open_source,
)
from pipeline.capture.stats import RateMeter, RecentEvents
from pipeline.core.redact import mask_secrets
from pipeline.core.types import CameraEvent, CameraState, Frame, FrameImage

if TYPE_CHECKING:
    from pipeline.capture.settings import CameraConfig

log = logging.getLogger(__name__)

READER_JOIN_S = 1.0
# A frame arriving this fraction of a period early still counts as due (frame timing jitters).
DUE_TOLERANCE = 0.25
# How long an opened-but-silent source may take to deliver its first frame, beyond stall_s.
OPEN_GRACE_S = OPEN_TIMEOUT_MS / 1000.0

# The lifecycle, written down once: state -> states it may move to.
TRANSITIONS: dict[str, frozenset[str]] = {
    "starting": frozenset({"streaming", "reconnecting", "stopped", "ended"}),
    "streaming": frozenset({"stalled", "reconnecting", "stopped", "ended"}),
    "stalled": frozenset({"reconnecting", "stopped"}),
    "reconnecting": frozenset({"streaming", "reconnecting", "stopped", "ended"}),
    "stopped": frozenset(),
    "ended": frozenset(),
}


class FrameSlot:
    """A one-frame mailbox: `put` overwrites, `take_newer` waits for a frame newer than the one last taken."""

    def __init__(self) -> None:
        self._frame: Frame | None = None
        self._cond = threading.Condition()
        self.published = 0
        self.taken = 0
        self.closed = False

    def put(self, frame: Frame) -> None:
        with self._cond:
            self._frame = frame
            self.published += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def take_newer(self, after_index: int, timeout: float) -> Frame | None:
        """The newest frame with index > after_index, waiting up to `timeout`; None on timeout or close."""
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self.closed or (self._frame is not None and self._frame.index > after_index), timeout)
            if not ready or self._frame is None or self._frame.index <= after_index:
                return None
            self.taken += 1
            return self._frame

    @property
    def latest(self) -> Frame | None:
        return self._frame


class Backoff:
    """Exponential backoff with full jitter between `initial_s` and `max_s`."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s, self.max_s = initial_s, max_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.max_s, self.initial_s * (2 ** min(self.attempt, 60)))
        if ceiling < self.max_s:  # stop growing at the cap: a camera may stay down for days
            self.attempt += 1
        return max(self.initial_s / 2, self._rng.uniform(ceiling / 2, ceiling))

    def reset(self) -> None:
        self.attempt = 0


def lower_thread_priority(increment: int) -> None:
    """Raise the calling thread's nice value by `increment` (Linux: nice is per thread, inherited by the threads
    it starts, such as FFmpeg's decoders). Lowering priority needs no privilege."""
    if increment <= 0:
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
    except OSError as exc:
        log.warning("cannot lower the capture thread's CPU priority: %s", exc)


class SourceReader(threading.Thread):
    """Opens one source and reads it into the camera's slot until it fails, ends, or is abandoned.

    All blocking I/O (FFmpeg opens and reads) happens here, never on the CaptureThread, so the camera's lifecycle
    and shutdown never wait for a dead host. An abandoned reader finishes its current blocking call (bounded by
    the source's own timeouts), then releases the source itself.
    """

    def __init__(self, cfg: CameraConfig, factory: Callable[[CameraConfig], VideoSource],
                 publish: Callable[[FrameImage], None], arrived: Callable[[], None]) -> None:
        super().__init__(name=f"reader-{cfg.name}", daemon=True)
        self.cfg = cfg
        self.outcome: SourceError | SourceEnded | None = None
        self.description = ""
        self.source_kind = ""  # the VideoSource.kind opened (e.g. nvdec when decoding on the GPU)
        self.started_mono = time.monotonic()
        self.frames = 0
        self._factory = factory
        self._publish = publish
        self._arrived = arrived
        self._abandoned = threading.Event()

    def abandon(self) -> None:
        self._abandoned.set()

    def run(self) -> None:
        source: VideoSource | None = None
        lower_thread_priority(self.cfg.nice)  # before the source starts its decoder threads: they inherit it
        try:
            source = self._factory(self.cfg)
            self.description = source.describe()
            self.source_kind = source.kind
            self._read_loop(source)
        except (SourceError, SourceEnded) as exc:
            self.outcome = exc
        except Exception as exc:  # noqa: BLE001 - a decoder surprise must become a retry, not a dead camera
            log.exception("camera %s: unexpected capture error", self.cfg.name)
            self.outcome = SourceError(f"unexpected capture error: {exc}")
        finally:
            if source is not None:
                source.close()

    def _read_loop(self, source: VideoSource) -> None:
        """Grab every frame; convert and publish only those due under the camera's fps cap."""
        period = 1.0 / self.cfg.fps
        next_due = 0.0
        while not self._abandoned.is_set():
            if not source.grab(timeout=self.cfg.reconnect.stall_s):
                raise SourceError("no frame within the read timeout")
            if self._abandoned.is_set():
                return
            now = time.monotonic()
            if now < next_due - period * DUE_TOLERANCE:
                self._arrived()  # counted as read (and skipped); keeps the stall watch fed
            else:
                self._publish(source.retrieve())
                next_due = max(next_due + period, now - period)
            self.frames += 1  # after publishing: the watcher reads `frames > 0` as "last_frame_mono is ours"


class CaptureThread(threading.Thread):
    """One camera's lifecycle: start a reader → watch it → on failure, end or stall, retry with backoff."""

    POLL_S = 0.05

    def __init__(self, cfg: CameraConfig, stop: threading.Event, on_event: Callable[[CameraEvent], None],
                 source_factory: Callable[[CameraConfig], VideoSource] = open_source) -> None:
        super().__init__(name=f"capture-{cfg.name}", daemon=True)
        self.cfg = cfg
        self.slot = FrameSlot()
        self.state: CameraState = "starting"
        self.frames_in = RateMeter()
        self.reconnects = RecentEvents()
        self.stalls = RecentEvents()
        self.last_frame_mono: float | None = None
        self.reader: SourceReader | None = None
        self._stop_event = stop
        self._on_event = on_event
        self._source_factory = source_factory
        self._backoff = Backoff(cfg.reconnect.initial_s, cfg.reconnect.max_s)
        self._index = 0

    def set_state(self, state: CameraState, detail: str = "") -> None:
        if state == self.state and state != "reconnecting":
            return
        if state not in TRANSITIONS[self.state]:
            log.warning("camera %s: unexpected transition %s -> %s", self.cfg.name, self.state, state)
        self.state = state
        detail = mask_secrets(detail)
        log.info("camera %s: %s%s", self.cfg.name, state, f" ({detail})" if detail else "")
        self._on_event(CameraEvent(self.cfg.name, time.time(), state, detail))

    def run(self) -> None:
        try:
            while not self._stop_event.is_set() and self.state != "ended":
                self._session()
        finally:
            if self.reader is not None:
                self.reader.abandon()
                self.reader.join(READER_JOIN_S)  # files and the demo finish at once; a hung stream is left to time out
            if self.state != "ended":
                self.set_state("stopped")
            self.slot.close()

    def _session(self) -> None:
        """Watch one reader until it fails, ends, stalls, or the pipeline stops."""
        reader = SourceReader(self.cfg, self._source_factory, self._publish, self._arrived)
        self.reader = reader
        reader.start()
        failure = self._watch(reader)
        reader.abandon()
        if failure is None:
            return
        if isinstance(failure, SourceEnded):
            self.set_state("ended", "end of file")
            return
        self._retry_later(str(failure))

    def _watch(self, reader: SourceReader) -> SourceError | SourceEnded | None:
        stall_s = self.cfg.reconnect.stall_s
        while not self._stop_event.wait(self.POLL_S):
            if reader.frames and self.state != "streaming":  # before the liveness check: a short session counts
                self.set_state("streaming", reader.description)
                self._backoff.reset()
            if not reader.is_alive():
                return reader.outcome or SourceError("source closed")
            if reader.frames:
                silent = time.monotonic() - (self.last_frame_mono or reader.started_mono)
                if silent > stall_s:
                    self.stalls.mark()
                    self.set_state("stalled", f"no frame for {stall_s:g} s")
                    return SourceError("stalled")
            elif time.monotonic() - reader.started_mono > OPEN_GRACE_S + stall_s:
                return SourceError("no frame after opening")
        return None

    def _arrived(self) -> float:
        now = time.monotonic()
        self.last_frame_mono = now
        self.frames_in.mark(now)
        return now

    def _publish(self, image: FrameImage) -> None:
        self._index += 1
        now = self._arrived()
        self.slot.put(Frame(self.cfg.name, self._index, image, now, time.time()))

    def _retry_later(self, reason: str) -> None:
        delay = self._backoff.next_delay()
        self.reconnects.mark()
        self.set_state("reconnecting", f"{reason}; retry in {delay:.1f} s")
        self._stop_event.wait(delay)
