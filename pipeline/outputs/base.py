"""The Sink role: one output of events, isolated behind its own bounded queue and thread.

A sink that is slow or broken drops (and counts) its own events; it can never stall perception or the other sinks.

Each sink also remembers how its deliveries are going (`Delivery`): failures in a row, since when, and the last
error (secrets masked). The status documents read it, so a webhook that cannot be reached or an OSC receiver that is
gone shows up in /healthz and on the status page instead of only as a counter. Logging follows the same runs of
failures: the first failure of a run is a WARNING, further ones at most one WARNING a minute (a dead receiver behind
a stream of observations would otherwise write one line per event), and the recovery one INFO line.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pipeline.core.redact import mask_secrets
from pipeline.core.settings import StrictModel
from pipeline.outputs.events import Event
from pipeline.outputs.history import EventHistory

log = logging.getLogger(__name__)

EventName = Literal["observation", "command", "camera", "presence", "lookat"]
ALL_EVENTS: tuple[EventName, ...] = ("observation", "command", "camera", "presence")  # lookat: asked for by name
FAILURE_LOG_EVERY_S = 60.0  # while a sink keeps failing, at most one WARNING per this many seconds


@dataclass(frozen=True)
class Delivery:
    """How a sink's deliveries are going, copied in one piece for the status documents.

    failures_in_row: events given up on since the last delivered one; failing_since_mono: when that run of failures
    began (time.monotonic), None while the last attempt succeeded; last_error / last_error_ts: the most recent
    failure (masked) and its wall-clock time, kept after a recovery so an operator can see what happened."""

    failures_in_row: int = 0
    failing_since_mono: float | None = None
    last_error: str | None = None
    last_error_ts: float | None = None
    last_sent_ts: float | None = None


@dataclass(frozen=True)
class AvatarRoute:
    """What an avatar's own output receives: that avatar's commands and the observation and camera events of its
    cameras (config events too: they concern the whole daemon). Top-level outputs have no route: they get all."""

    avatar: str
    cameras: frozenset[str]

    def accepts(self, event: Event) -> bool:
        kind = event.get("type")
        if kind in ("command", "lookat"):
            return event.get("avatar") == self.avatar
        if kind == "presence":
            return event.get("camera") in self.cameras
        if kind in ("observation", "camera"):
            return event.get("camera") in self.cameras
        return True


class OutputSettings(StrictModel):
    """Base of every output's settings. Each subclass declares `type` (a Literal: the registry key) and `events` (the
    event types it receives) in its own field order: validators may read fields declared before them."""

    if TYPE_CHECKING:  # for type checkers only: at run time each subclass's own Literal field is the one
        type: str

    def describe(self) -> str:
        """One line for `check-config`; outputs with an address override it (credentials masked)."""
        return f"{getattr(self, 'type', '?')} [{', '.join(getattr(self, 'events', None) or ())}]"


class Sink(ABC):
    """Receives events on its own thread. Subclasses implement `write` (and may override `open`/`flush_close`).

    Two kinds of counters: events (`sent`, `failed`: what `write` delivered or gave up on) and messages (`messages`,
    `messages_failed`: what went over the wire). They differ where one event is several messages or where a sink
    sends on its own (a VMC stream's bundles, `rate_hz` a second): such a sink sets `counts_messages` and calls
    `_count_messages`; for the others each delivered event is one message."""

    type_name = "abstract"
    counts_messages = False

    def __init__(self, cfg: Any, queue_size: int = 256) -> None:
        self.cfg = cfg
        self.events: frozenset[str] = frozenset(getattr(cfg, "events", ("observation", "command", "camera")))
        self.route: AvatarRoute | None = None  # set for an avatar's own output (see AvatarRoute)
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self.messages = 0
        self.messages_failed = 0
        self._delivery = Delivery()
        self._next_failure_log = 0.0
        self._queue: queue.Queue[Event | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._loop, name=f"sink-{self.type_name}", daemon=True)

    @classmethod
    def from_settings(cls, cfg: Any, **context: Any) -> Sink:
        """The sink for `cfg`; outputs that use daemon-wide context (e.g. the rules' presets) override this."""
        return cls(cfg, getattr(cfg, "queue_size", 1024))

    def start(self) -> None:
        self.open()
        self._thread.start()

    def is_alive(self) -> bool:
        """True while the sink's delivery thread runs (for health checks)."""
        return self._thread.is_alive()

    def offer(self, event: Event) -> None:
        """Queue an event if this sink wants its type; drop and count it when the queue is full."""
        if event["type"] not in self.events or (self.route is not None and not self.route.accepts(event)):
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def _loop(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                break
            try:
                self.write(event)
            except Exception as exc:  # noqa: BLE001 - an output failure must never stop the pipeline
                self.failed += 1
                if not self.counts_messages:
                    self.messages_failed += 1
                self._failed(exc)
            else:
                self.sent += 1
                if not self.counts_messages:
                    self.messages += 1
                self._delivered()
        self.flush_close()

    def _count_messages(self, sent: int = 0, failed: int = 0) -> None:
        """A sink that counts its own messages (`counts_messages`) adds what went out, or failed to."""
        self.messages += sent
        self.messages_failed += failed

    def streamed_weights(self) -> dict[str, float] | None:
        """The expression weights this output streams right now (a VMC stream), None for an output that does not
        stream; for the status page's view of the avatar."""
        return None

    @property
    def target(self) -> str:
        """Where this output sends, for the status page: its settings' one-line description (credentials masked)."""
        describe = getattr(self.cfg, "describe", None)
        return mask_secrets(describe()) if callable(describe) else self.type_name

    @property
    def delivery(self) -> Delivery:
        """The current delivery state (one immutable value: readers never see half an update)."""
        return self._delivery

    def _delivered(self) -> None:
        before = self._delivery
        if before.failures_in_row:
            log.info("output %s: delivering again after %d failed event(s)", self.type_name, before.failures_in_row)
        self._delivery = Delivery(last_error=before.last_error, last_error_ts=before.last_error_ts,
                                  last_sent_ts=time.time())

    def _failed(self, exc: Exception) -> None:
        """Record a failed event; log the first of a run at once, then at most once per FAILURE_LOG_EVERY_S."""
        before, now = self._delivery, time.monotonic()
        text = mask_secrets(str(exc) or type(exc).__name__)
        self._delivery = Delivery(failures_in_row=before.failures_in_row + 1,
                                  failing_since_mono=before.failing_since_mono or now, last_error=text,
                                  last_error_ts=time.time(), last_sent_ts=before.last_sent_ts)
        if not before.failures_in_row:
            log.warning("output %s: %s", self.type_name, text)
            self._next_failure_log = now + FAILURE_LOG_EVERY_S
        elif now >= self._next_failure_log:
            log.warning("output %s: still failing, %d event(s) in a row: %s", self.type_name,
                        before.failures_in_row + 1, text)
            self._next_failure_log = now + FAILURE_LOG_EVERY_S
        else:
            log.debug("output %s: %s", self.type_name, text)

    def open(self) -> None:
        """Acquire sockets, files, clients. Runs before the thread starts."""

    @abstractmethod
    def write(self, event: Event) -> None:
        """Deliver one event (on the sink's own thread)."""

    def flush_close(self) -> None:
        """Flush and release; runs on the sink's thread after the last event."""

    def close(self, timeout: float = 2.0) -> None:
        """Deliver what is queued, then stop."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("output %s: queue still full at shutdown, %d events dropped", self.type_name,
                        self._queue.qsize())
        self._thread.join(timeout)


class EventBus:
    """Fans every event out to every sink (each filters by type), and records it in `history` when given."""

    def __init__(self, sinks: list[Sink], history: EventHistory | None = None) -> None:
        self.sinks = sinks
        self.history = history

    def publish(self, event: Event) -> None:
        if self.history is not None:
            self.history.record(event)
        for sink in self.sinks:
            sink.offer(event)
