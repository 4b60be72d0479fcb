"""Cameras: video sources, and the capture thread that keeps one camera's newest frame in a one-slot box.

Capture never waits for analysis: it overwrites the slot, and the worker takes the newest frame when it is ready.
A source that fails to open, stops delivering (stall) or errors is released and reopened with exponential backoff and
jitter, while every other camera keeps running.
"""

from __future__ import annotations

import logging
import re
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.capture.sources import (
    OPEN_TIMEOUT_MS,
    READ_TIMEOUT_MARGIN_S,
    SourceEnded,
    SourceError,
    VideoSource,
    open_source,
)
from pipeline.capture.stats import RateMeter, RecentEvents
from pipeline.core.redact import mask_secrets
from pipeline.core.threads import name_native_thread
from pipeline.core.types import CameraEvent, CameraState, Frame, FrameImage

if TYPE_CHECKING:
    from pipeline.capture.settings import CameraConfig

log = logging.getLogger(__name__)

READER_JOIN_S = 1.0
# A frame arriving this fraction of a period early still counts as due (frame timing jitters).
DUE_TOLERANCE = 0.25
# How long an opened-but-silent source may take to deliver its first frame, beyond stall_s.
OPEN_GRACE_S = OPEN_TIMEOUT_MS / 1000.0
# How long the reader may stay in the blocking call of a session that ended (a stalled read gives up
# READ_TIMEOUT_MARGIN_S after the stall, an open after OPEN_TIMEOUT_MS) before the camera starts a new reader thread.
READER_RETURN_S = OPEN_GRACE_S + READ_TIMEOUT_MARGIN_S

# The lifecycle, written down once: state -> states it may move to.
TRANSITIONS: dict[str, frozenset[str]] = {
    "starting": frozenset({"streaming", "reconnecting", "stopped", "ended"}),
    "streaming": frozenset({"stalled", "reconnecting", "stopped", "ended"}),
    "stalled": frozenset({"reconnecting", "stopped"}),
    "reconnecting": frozenset({"streaming", "reconnecting", "stopped", "ended"}),
    "stopped": frozenset(),
    "ended": frozenset(),
}
FAILING_STATES = frozenset({"stalled", "reconnecting"})
_RETRY_IN = re.compile(r";?\s*retry in [0-9.]+ ?s$")


def _reason(detail: str) -> str:
    """A failure's reason without its backoff ("...; retry in 0.4 s"): retries for one reason are one reason."""
    return _RETRY_IN.sub("", detail)


class FrameSlot:
    """A one-frame mailbox: `put` overwrites, `take_newer` waits for a frame newer than the one last taken."""

    def __init__(self) -> None:
        self._frame: Frame | None = None
        self._taken_index = -1  # the index of the frame a worker took last
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

    def drop_untaken(self) -> None:
        """Let go of the newest frame if no worker has taken it: a newer one is about to replace it anyway.

        Why: a source that fills its frames from a few buffers of its own (NVDEC frames kept on the GPU, 6.2 MB a
        1080p frame) would otherwise need a buffer for the frame being filled while the slot still holds the one
        it replaces; dropping that first lets the source refill the same buffer, a buffer less per camera. A frame
        a worker took stays: the worker holds it anyway, and `latest` keeps showing it."""
        with self._cond:
            if self._frame is not None and self._frame.index > self._taken_index:
                self._frame = None

    def wake(self) -> None:
        """Make a waiting take_newer look at its `unless` again (something other than a frame has happened)."""
        with self._cond:
            self._cond.notify_all()

    def take_newer(self, after_index: int, timeout: float, unless: Callable[[], bool] | None = None) -> Frame | None:
        """The newest frame with index > after_index, waiting up to `timeout`; None on timeout, on close, or as
        soon as `unless()` is true (checked at each put or wake: a worker also waits for its oldest result)."""
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self.closed or (self._frame is not None and self._frame.index > after_index)
                or (unless is not None and unless()), timeout)
            if not ready or self._frame is None or self._frame.index <= after_index:
                return None
            self.taken += 1
            self._taken_index = self._frame.index
            return self._frame

    @property
    def latest(self) -> Frame | None:
        """The newest frame; None before the first and, for a moment, while a pooled source refills it."""
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


@dataclass
class ReadSession:
    """One open → read → close of a camera's source, run by the camera's reader thread.

    The capture thread watches a session through these fields; `cancel` ends it (the reader returns from its current
    blocking call first), `done` says the source was closed and `outcome` is why the session ended."""

    started_mono: float = field(default_factory=time.monotonic)
    frames: int = 0
    description: str = ""
    source_kind: str = ""  # the VideoSource.kind opened (e.g. nvdec when decoding on the GPU)
    outcome: SourceError | SourceEnded | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class SourceReader(threading.Thread):
    """The one thread that opens and reads a camera's source, session after session, for the camera's whole life.

    All blocking I/O (FFmpeg opens and reads) happens here, never on the CaptureThread, so the camera's lifecycle
    and shutdown never wait for a dead host. The thread survives reconnects: a thread per reconnect made glibc hand
    each new thread a different malloc arena for FFmpeg's packet and frame buffers, and every arena a camera passed
    through kept its freed buffers cached, so resident memory rose at each reconnect (issue 12, item 9;
    BENCHMARKS.md, "Memory at reconnects"). A retired reader finishes its current blocking call (bounded by the
    source's own timeouts), then releases the source itself and ends.
    """

    def __init__(self, cfg: CameraConfig, factory: Callable[[CameraConfig], VideoSource],
                 publish: Callable[[FrameImage], None], arrived: Callable[[], object],
                 make_room: Callable[[], None]) -> None:
        """`make_room` runs before a pooled source (VideoSource.frames_pooled) fills its next frame."""
        super().__init__(name=f"reader-{cfg.name}", daemon=True)
        self.cfg = cfg
        self._make_room = make_room
        self.session = ReadSession()  # the current or last session; a finished placeholder until the first
        self.session.done.set()
        self._factory = factory
        self._publish = publish
        self._arrived = arrived
        self._pending: ReadSession | None = None
        self._retired = False
        self._wake = threading.Condition()

    @property
    def frames(self) -> int:
        """Frames read in the current session."""
        return self.session.frames

    @property
    def description(self) -> str:
        """The current session's source, as logs and status show it."""
        return self.session.description

    @property
    def source_kind(self) -> str:
        """What decodes the current session (`bench pipeline` reports it)."""
        return self.session.source_kind

    @property
    def idle(self) -> bool:
        """No session is running or waiting: a new one starts at once."""
        with self._wake:
            return self._pending is None and self.session.done.is_set()

    def begin(self) -> ReadSession:
        """Start a new session (the reader must be idle: the capture thread waits for that first)."""
        session = ReadSession()
        with self._wake:
            if self._retired or self._pending is not None or not self.session.done.is_set():
                raise RuntimeError(f"camera {self.cfg.name}: reader busy, cannot begin a session")
            self._pending = session
            self._wake.notify()
        return session

    def retire(self) -> None:
        """End the current session and the thread, once its blocking call returns."""
        with self._wake:
            self._retired = True
            self.session.cancel.set()
            self._wake.notify()

    def run(self) -> None:
        name_native_thread()
        lower_thread_priority(self.cfg.nice)  # before any source starts its decoder threads: they inherit it
        while (session := self._next_session()) is not None:
            self._serve(session)

    def _next_session(self) -> ReadSession | None:
        with self._wake:
            self._wake.wait_for(lambda: self._retired or self._pending is not None)
            session, self._pending = self._pending, None
            if self._retired or session is None:
                return None
            self.session = session
            return session

    def _serve(self, session: ReadSession) -> None:
        """Open the source, read it until the session fails, ends or is cancelled; always close it."""
        source: VideoSource | None = None
        try:
            source = self._factory(self.cfg)
            session.description, session.source_kind = source.describe(), source.kind
            self._read_loop(source, session)
        except (SourceError, SourceEnded) as exc:
            session.outcome = exc
        except Exception as exc:  # noqa: BLE001 - a decoder surprise must become a retry, not a dead camera
            log.exception("camera %s: unexpected capture error", self.cfg.name)
            session.outcome = SourceError(f"unexpected capture error: {exc}")
        finally:
            if source is not None:
                source.close()
            session.done.set()

    def _read_loop(self, source: VideoSource, session: ReadSession) -> None:
        """Grab every frame; convert and publish only those due under the camera's fps cap."""
        period = 1.0 / self.cfg.fps
        next_due = 0.0
        while not session.cancel.is_set():
            if not source.grab(timeout=self.cfg.reconnect.stall_s):
                raise SourceError("no frame within the read timeout")
            if session.cancel.is_set():
                return
            now = time.monotonic()
            if now < next_due - period * DUE_TOLERANCE:
                self._arrived()  # counted as read (and skipped); keeps the stall watch fed
            else:
                if source.frames_pooled:
                    self._make_room()
                self._publish(source.retrieve())
                next_due = max(next_due + period, now - period)
            session.frames += 1  # after publishing: the watcher reads `frames > 0` as "last_frame_mono is ours"


class CaptureThread(threading.Thread):
    """One camera's lifecycle: start a reader → watch it → on failure, end or stall, retry with backoff."""

    POLL_S = 0.05
    STREAMING_POLL_S = 0.25

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
        self.readers_started = 0  # reader threads this camera started: 1, unless a reader stayed blocked
        self._stop_event = stop
        self._on_event = on_event
        self._source_factory = source_factory
        self._backoff = Backoff(cfg.reconnect.initial_s, cfg.reconnect.max_s)
        self._index = 0
        self._session_ended_mono = 0.0
        self._last_detail = ""

    def set_state(self, state: CameraState, detail: str = "") -> None:
        if state == self.state and state != "reconnecting":
            return
        if state not in TRANSITIONS[self.state]:
            log.warning("camera %s: unexpected transition %s -> %s", self.cfg.name, self.state, state)
        detail = mask_secrets(detail)
        level = self._log_level(state, detail)
        self.state, self._last_detail = state, detail
        log.log(level, "camera %s: %s%s", self.cfg.name, state, f" ({detail})" if detail else "")
        self._on_event(CameraEvent(self.cfg.name, time.time(), state, detail))

    def _log_level(self, state: CameraState, detail: str) -> int:
        """What an operator at logging.level warning must see: a camera going down (once per reason, not per retry:
        a retry for the same reason is DEBUG) and coming back; the rest of a camera's life is INFO."""
        if state in FAILING_STATES:
            repeat = state == self.state and _reason(detail) == _reason(self._last_detail)
            return logging.DEBUG if repeat else logging.WARNING
        if state == "streaming" and self.state in FAILING_STATES:
            return logging.WARNING  # back after a failure: the line that closes the one above
        return logging.INFO

    def run(self) -> None:
        name_native_thread()
        try:
            while not self._stop_event.is_set() and self.state != "ended":
                self._session()
        finally:
            if self.reader is not None:
                self.reader.retire()
                self.reader.join(READER_JOIN_S)  # files and the demo finish at once; a hung stream is left to time out
            if self.state != "ended":
                self.set_state("stopped")
            self.slot.close()

    def _session(self) -> None:
        """Have the reader open the source again, and watch it until it fails, ends, stalls, or the pipeline stops."""
        reader = self._idle_reader()
        if reader is None:
            return
        session = reader.begin()
        failure = self._watch(session)
        session.cancel.set()
        self._session_ended_mono = time.monotonic()
        if failure is None:
            return
        if isinstance(failure, SourceEnded):
            self.set_state("ended", "end of file")
            return
        self._retry_later(str(failure))

    def _idle_reader(self) -> SourceReader | None:
        """The camera's reader thread, once it has left the session that ended; None if the pipeline stops meanwhile.

        The same thread serves every reconnect (see SourceReader for why). A new one is started for the first
        session, and only otherwise when the old one is still blocked READER_RETURN_S after its session ended, longer
        than the source's own timeouts allow: it is retired (it ends once its call returns) so the camera recovers."""
        reader = self.reader
        if reader is not None and reader.is_alive():
            if self._wait_idle(reader):
                return reader
            if self._stop_event.is_set():
                return None
            log.warning("camera %s: the reader is still blocked in its source %.0f s after the session ended; "
                        "starting a new reader thread", self.cfg.name, time.monotonic() - self._session_ended_mono)
            reader.retire()
        reader = SourceReader(self.cfg, self._source_factory, self._publish, self._arrived, self.slot.drop_untaken)
        self.reader = reader
        self.readers_started += 1
        reader.start()
        return reader

    def _wait_idle(self, reader: SourceReader) -> bool:
        """Wait until `reader` is idle: False past READER_RETURN_S after the last session ended, or on stop."""
        deadline = self._session_ended_mono + READER_RETURN_S
        while not reader.idle:
            if time.monotonic() >= deadline or self._stop_event.wait(self.POLL_S):
                return False
        return True

    def _watch(self, session: ReadSession) -> SourceError | SourceEnded | None:
        """Until the session ends, stalls or the camera stops. It looks every POLL_S until the first frame, then
        every STREAMING_POLL_S or at the stall deadline, whichever is sooner: a 50 ms poll on every camera was
        ~11 % of the GIL's busy time in a 24-camera run (py-spy), and the stop event ends the wait at once anyway."""
        stall_s = self.cfg.reconnect.stall_s
        wait_s = self.POLL_S
        while not self._stop_event.wait(wait_s):
            if session.frames and self.state != "streaming":  # before the liveness check: a short session counts
                self.set_state("streaming", session.description)
                self._backoff.reset()
            if session.done.is_set():
                return session.outcome or SourceError("source closed")
            wait_s = self.POLL_S
            if session.frames:
                silent = time.monotonic() - (self.last_frame_mono or session.started_mono)
                if silent > stall_s:
                    self.stalls.mark()
                    self.set_state("stalled", f"no frame for {stall_s:g} s")
                    return SourceError("stalled")
                wait_s = min(self.STREAMING_POLL_S, max(self.POLL_S, stall_s - silent))
            elif time.monotonic() - session.started_mono > OPEN_GRACE_S + stall_s:
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
